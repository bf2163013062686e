//! The replicated routing state: the request path reads views that the Raft apply task
//! publishes, and hands its decisions to a proposer that batches them into `RecordRoutes`
//! entries. Nothing on the request path waits for Raft.

use crate::config::{ClusterConfig, Config};
use crate::metrics::Metrics;
use crate::state::RoutingState;
use crate::topology::Topology;
use arc_swap::ArcSwap;
use router_cluster::node::{ClusterNode, NodeConfig};
use router_cluster::store::{OnApply, SmState};
use router_core::{Command, IndexStats, IndexView, Outcome, Route};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Views published by the apply task.
struct Published {
    view: ArcSwap<IndexView>,
    topology: ArcSwap<Topology>,
    stats: ArcSwap<IndexStats>,
    digest: AtomicU64,
    applied: AtomicU64,
}

/// Routing state replicated through Raft.
pub struct ClusterState {
    node: Arc<ClusterNode>,
    published: Arc<Published>,
    tx: mpsc::Sender<Route>,
    metrics: Arc<Metrics>,
}

const QUEUE: usize = 65_536;

impl ClusterState {
    /// Starts the peer, bootstraps membership and the configured servers, and spawns the
    /// proposer.
    pub async fn start(
        cfg: &Config,
        c: &ClusterConfig,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Arc<ClusterState>> {
        let published = Arc::new(Published {
            view: ArcSwap::from_pointee(IndexView::default()),
            topology: ArcSwap::from_pointee(Topology::default()),
            stats: ArcSwap::from_pointee(IndexStats::default()),
            digest: AtomicU64::new(0),
            applied: AtomicU64::new(0),
        });
        let p = published.clone();
        let on_apply: OnApply = Arc::new(move |st: &SmState| {
            p.view.store(Arc::new(st.machine.view()));
            p.stats.store(Arc::new(st.machine.model().stats()));
            p.digest.store(st.machine.digest(), Relaxed);
            p.applied
                .store(st.last_applied.map_or(0, |l| l.index), Relaxed);
            let prev = p.topology.load();
            let same = prev.upstreams.len() == st.machine.servers().len()
                && st.machine.servers().values().all(|s| {
                    prev.upstreams.iter().any(|u| {
                        &*u.url == s.url.as_str()
                            && u.accepting.load(Relaxed) != s.draining
                            && prev.ranks_of(u).map(|r| r.id).eq(s.ranks.iter().copied())
                    })
                });
            if !same {
                p.topology.store(Arc::new(Topology::from_servers(
                    st.machine.servers(),
                    &prev,
                )));
            }
        });
        let node = ClusterNode::start(
            NodeConfig {
                id: c.node_id,
                listen: c.listen,
                data_dir: c.data_dir.clone(),
                cluster_id: c.cluster_id.clone(),
                heartbeat_ms: c.heartbeat_ms,
                election_min_ms: c.election_min_ms,
                election_max_ms: c.election_max_ms,
                snapshot_every: c.snapshot_every,
                keep_logs: 1000,
                max_entries: cfg.cache.max_entries,
                max_sessions: cfg.cache.max_sessions,
            },
            Some(on_apply),
        )
        .await?;
        let node = Arc::new(node);
        // The lowest id makes the first membership of a new cluster; on a restarted or
        // already formed cluster this is refused and harmless.
        let lowest = c.peers.iter().map(|p| p.id).min().unwrap_or(c.node_id);
        if lowest == c.node_id {
            let members: BTreeMap<u64, openraft::BasicNode> = c
                .peers
                .iter()
                .map(|p| (p.id, openraft::BasicNode::new(p.addr.clone())))
                .collect();
            // Spawned: initializing waits for the other peers, which may start later.
            let n = node.clone();
            tokio::spawn(async move {
                if let Err(e) = n.initialize(members).await {
                    tracing::error!(error = %e, "cluster initialization failed");
                }
            });
        }
        // Servers from the config join through the log (idempotent: same URL and ranks keep
        // their ids), once there is a leader to take the write.
        let joins: Vec<Command> = cfg
            .upstreams
            .iter()
            .map(|u| Command::JoinServer {
                url: u.url.trim_end_matches('/').to_owned(),
                ranks: u.ranks,
                capacity_tokens: u
                    .capacity_tokens
                    .unwrap_or(cfg.cache.default_capacity_tokens),
                weight: u.weight,
            })
            .collect();
        let n2 = node.clone();
        tokio::spawn(async move {
            for j in joins {
                loop {
                    match n2.propose(j.clone()).await {
                        Ok(Outcome::Rejected(m)) => {
                            tracing::error!(message = %m, "configured upstream rejected");
                            break;
                        }
                        Ok(_) => break,
                        Err(e) => {
                            tracing::debug!(error = %e, "waiting for a leader to join configured upstreams");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
            }
        });
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(proposer(
            node.clone(),
            rx,
            c.batch_routes.max(1),
            Duration::from_millis(c.batch_ms),
            metrics.clone(),
        ));
        Ok(Arc::new(ClusterState {
            node,
            published,
            tx,
            metrics,
        }))
    }

    /// Leader, term, applied index and state digest, for `/health` and tests.
    pub fn status(&self) -> serde_json::Value {
        let m = self.node.raft.metrics().borrow().clone();
        serde_json::json!({
            "node_id": self.node.id,
            "leader": m.current_leader,
            "term": m.current_term,
            "last_log_index": m.last_log_index,
            "applied_index": self.published.applied.load(Relaxed),
            "state_digest": format!("{:016x}", self.published.digest.load(Relaxed)),
        })
    }
}

/// Batches decisions into `RecordRoutes` proposals: at most `max` routes or `wait` of
/// waiting each. Followers forward to the leader. Without a leader the batch is retried a
/// few times, then dropped and counted (the map is a cache; losing a batch costs hits, not
/// correctness).
async fn proposer(
    node: Arc<ClusterNode>,
    mut rx: mpsc::Receiver<Route>,
    max: usize,
    wait: Duration,
    metrics: Arc<Metrics>,
) {
    let mut batch: Vec<Route> = Vec::with_capacity(max);
    loop {
        if rx.recv_many(&mut batch, max).await == 0 {
            return;
        }
        let deadline = tokio::time::Instant::now() + wait;
        while batch.len() < max {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(r)) => batch.push(r),
                _ => break,
            }
        }
        let routes = std::mem::take(&mut batch);
        let n = routes.len();
        let cmd = Command::RecordRoutes {
            peer: node.id,
            routes,
        };
        let mut ok = false;
        for attempt in 0..5u64 {
            match node.propose(cmd.clone()).await {
                Ok(_) => {
                    ok = true;
                    break;
                }
                Err(e) => {
                    tracing::debug!(error = %e, attempt, "proposal failed");
                    tokio::time::sleep(Duration::from_millis(50 * (attempt + 1))).await;
                }
            }
        }
        if !ok {
            for _ in 0..n {
                metrics.record_dropped();
            }
        }
    }
}

impl RoutingState for ClusterState {
    fn view(&self) -> Arc<IndexView> {
        self.published.view.load_full()
    }

    fn topology(&self) -> Arc<Topology> {
        self.published.topology.load_full()
    }

    fn record(&self, rec: Route) {
        if self.tx.try_send(rec).is_err() {
            self.metrics.record_dropped();
        }
    }

    fn index_stats(&self) -> IndexStats {
        **self.published.stats.load()
    }

    fn cluster_status(&self) -> Option<serde_json::Value> {
        Some(self.status())
    }
}
