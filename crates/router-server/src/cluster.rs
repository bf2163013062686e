//! The replicated routing state: the request path reads views that the Raft apply task
//! publishes (plus an overlay of this peer's decisions the log has not applied yet), and
//! hands its decisions to a proposer that batches them into `RecordRoutes` entries.
//! Nothing on the request path waits for Raft or takes a lock.

use crate::admin::AdminService;
use crate::config::{ClusterConfig, Config};
use crate::metrics::{Histogram, Metrics};
use crate::state::{ChangeFuture, Changed, RoutingState, StatusFuture};
use crate::topology::Topology;
use arc_swap::{ArcSwap, Guard};
use router_cluster::node::{ClusterNode, NodeConfig};
use router_cluster::store::{OnApply, SmState};
use router_cluster::tls::PeerTls;
use router_core::machine::PeerLoad;
use router_core::{Command, IndexStats, IndexView, Outcome, RankLoad, Route};
use router_proto::v1::admin_server::AdminServer;
use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

/// A batch proposed but not yet applied locally.
struct Pending {
    seq: u64,
    routes: Vec<Route>,
    /// Log index, once the proposal returned.
    index: Option<u64>,
}

/// Views published for the request path.
struct Published {
    /// What the log applied.
    applied_view: ArcSwap<IndexView>,
    /// `applied_view` plus pending decisions: what the request path reads.
    view: ArcSwap<IndexView>,
    topology: ArcSwap<Topology>,
    stats: ArcSwap<IndexStats>,
    loads: ArcSwap<BTreeMap<u64, PeerLoad>>,
    applied: AtomicU64,
    /// Decisions proposed by this peer that the log has not applied here yet. Taken only
    /// by the proposer and the apply task.
    pending: Mutex<VecDeque<Pending>>,
    pending_routes: AtomicU64,
}

impl Published {
    fn lock_pending(&self) -> std::sync::MutexGuard<'_, VecDeque<Pending>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds decisions to batch `seq` and to the overlay view at once.
    fn add_pending(&self, seq: u64, routes: Vec<Route>) {
        let mut pending = self.lock_pending();
        let view = self.view.load_full().overlay(routes.iter());
        self.view.store(Arc::new(view));
        self.pending_routes.fetch_add(routes.len() as u64, Relaxed);
        match pending.iter_mut().find(|b| b.seq == seq) {
            Some(b) => b.routes.extend(routes),
            None => pending.push_back(Pending {
                seq,
                routes,
                index: None,
            }),
        }
    }

    fn pending_routes_of(&self, seq: u64) -> Vec<Route> {
        self.lock_pending()
            .iter()
            .find(|b| b.seq == seq)
            .map(|b| b.routes.clone())
            .unwrap_or_default()
    }

    /// Batch `seq` got log index `index` (None: dropped). Until the log applies it here it
    /// stays in the overlay; if it already was applied (or was dropped), it leaves now.
    fn settle(&self, seq: u64, index: Option<u64>) {
        let mut pending = self.lock_pending();
        let Some(k) = pending.iter().position(|b| b.seq == seq) else {
            return;
        };
        match index {
            Some(i) if i > self.applied.load(Relaxed) => pending[k].index = Some(i),
            _ => {
                pending.remove(k);
                self.republish(&pending);
            }
        }
    }

    /// Recomputes the overlay view from the applied view and the pending batches.
    fn republish(&self, pending: &VecDeque<Pending>) {
        let base = self.applied_view.load_full();
        let n: usize = pending.iter().map(|p| p.routes.len()).sum();
        self.pending_routes.store(n as u64, Relaxed);
        if n == 0 {
            self.view.store(base);
        } else {
            self.view.store(Arc::new(
                base.overlay(pending.iter().flat_map(|p| &p.routes)),
            ));
        }
    }
}

/// Raft-side counters for `/metrics`.
#[derive(Default)]
struct RaftCounters {
    proposals: AtomicU64,
    proposed_routes: AtomicU64,
    proposal_failures: AtomicU64,
    load_reports: AtomicU64,
    route_lag: Histogram,
}

/// Routing state replicated through Raft.
pub struct ClusterState {
    node: Arc<ClusterNode>,
    published: Arc<Published>,
    tx: mpsc::Sender<Route>,
    metrics: Arc<Metrics>,
    counters: Arc<RaftCounters>,
}

const QUEUE: usize = 65_536;
/// Proposals in flight at once from one peer.
const PIPELINE: usize = 4;
/// How long an admin change waits for every peer to apply it.
const CONFIRM: Duration = Duration::from_secs(3);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl ClusterState {
    /// Starts the peer, serves the peer and admin services, bootstraps membership and the
    /// configured servers, and spawns the proposer and the load reporter.
    pub async fn start(
        cfg: &Config,
        c: &ClusterConfig,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Arc<ClusterState>> {
        let published = Arc::new(Published {
            applied_view: ArcSwap::from_pointee(IndexView::default()),
            view: ArcSwap::from_pointee(IndexView::default()),
            topology: ArcSwap::from_pointee(Topology::default()),
            stats: ArcSwap::from_pointee(IndexStats::default()),
            loads: ArcSwap::from_pointee(BTreeMap::new()),
            applied: AtomicU64::new(0),
            pending: Mutex::new(VecDeque::new()),
            pending_routes: AtomicU64::new(0),
        });
        let counters = Arc::new(RaftCounters::default());
        let on_apply = on_apply(published.clone(), counters.clone(), c.node_id);
        let node = ClusterNode::open(
            NodeConfig {
                id: c.node_id,
                listen: c.listen,
                data_dir: c.data_dir.clone(),
                cluster_id: c.cluster_id.clone(),
                heartbeat_ms: c.heartbeat_ms,
                election_min_ms: c.election_min_ms,
                election_max_ms: c.election_max_ms,
                snapshot_every: c.snapshot_every,
                keep_logs: c.keep_logs,
                max_entries: cfg.cache.max_entries,
                max_sessions: cfg.cache.max_sessions,
                tls: c.tls.as_ref().map(|t| PeerTls {
                    ca: t.ca.clone(),
                    cert: t.cert.clone(),
                    key: t.key.clone(),
                }),
            },
            Some(on_apply),
        )
        .await?;
        let (tx, rx) = mpsc::channel(QUEUE);
        let state = Arc::new(ClusterState {
            node: node.clone(),
            published,
            tx,
            metrics,
            counters,
        });
        let admin = AdminService::new(
            state.clone(),
            cfg.admin_token.clone(),
            cfg.cache.default_capacity_tokens,
        );
        node.serve(Some(tonic::service::Routes::new(AdminServer::new(admin))))
            .await?;
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
        tokio::spawn(proposer(
            state.clone(),
            rx,
            c.batch_routes.max(1),
            Duration::from_millis(c.batch_ms),
        ));
        tokio::spawn(load_reporter(
            Arc::downgrade(&state),
            Duration::from_millis(c.load_report_ms),
            c.load_stale_ms,
        ));
        Ok(state)
    }

    /// The Raft peer.
    pub fn node(&self) -> &Arc<ClusterNode> {
        &self.node
    }

    /// Leader, term, indexes and state digest, for `/health` and tests. The digest walks
    /// the state under the state machine's read lock (apply waits meanwhile), so it is
    /// computed here, on request, and never per applied batch.
    pub async fn status(&self) -> serde_json::Value {
        let (applied, digest) = self.node.applied_digest().await;
        let m = self.node.raft.metrics().borrow().clone();
        serde_json::json!({
            "node_id": self.node.id,
            "leader": m.current_leader,
            "role": format!("{:?}", m.state),
            "term": m.current_term,
            "last_log_index": m.last_log_index,
            "commit_index": self.node.stats.committed.load(Relaxed),
            "applied_index": applied,
            "snapshot_index": m.snapshot.map(|s| s.index),
            "purged_index": m.purged.map(|s| s.index),
            "snapshots_installed": self.node.stats.snapshots_installed.load(Relaxed),
            "state_digest": format!("{digest:016x}"),
        })
    }
}

/// Publishes what each applied batch changed: views, topology, loads, and drops
/// pending overlay batches the log has now applied.
fn on_apply(p: Arc<Published>, counters: Arc<RaftCounters>, me: u64) -> OnApply {
    Arc::new(move |st: &SmState| {
        let applied = st.last_applied.map_or(0, |l| l.index);
        p.applied_view.store(Arc::new(st.machine.view()));
        p.stats.store(Arc::new(st.machine.model().stats()));
        p.applied.store(applied, Relaxed);
        if let Some((peer, at)) = st.last_routes {
            if peer != me && at > 0 {
                let lag = now_ms().saturating_sub(at);
                counters.route_lag.observe(Duration::from_millis(lag));
            }
        }
        if **p.loads.load() != *st.machine.loads() {
            p.loads.store(Arc::new(st.machine.loads().clone()));
        }
        {
            let mut pending = p.lock_pending();
            pending.retain(|b| b.index.is_none_or(|i| i > applied));
            p.republish(&pending);
        }
        let prev = p.topology.load();
        let same = prev.upstreams.len() == st.machine.servers().len()
            && st.machine.servers().values().all(|s| {
                prev.upstreams.iter().any(|u| {
                    &*u.url == s.url.as_str()
                        && u.accepting.load(Relaxed) != s.draining
                        && prev.ranks_of(u).map(|r| r.id).eq(s.ranks.iter().copied())
                        && prev.ranks_of(u).all(|r| r.matches(s))
                })
            });
        if !same {
            p.topology.store(Arc::new(Topology::from_servers(
                st.machine.servers(),
                &prev,
            )));
        }
    })
}

/// Batches decisions into `RecordRoutes` proposals: at most `max` routes or `wait` of
/// waiting each, with up to [`PIPELINE`] proposals in flight. Followers forward to the
/// leader. Each decision enters the overlay view as soon as it arrives here, so this peer
/// routes by it before the log applies it. Without a leader a batch is retried a few times,
/// then dropped and counted (the map is a cache; losing a batch costs hits, not
/// correctness).
async fn proposer(
    state: Arc<ClusterState>,
    mut rx: mpsc::Receiver<Route>,
    max: usize,
    wait: Duration,
) {
    let inflight = Arc::new(tokio::sync::Semaphore::new(PIPELINE));
    let mut first: Vec<Route> = Vec::with_capacity(max);
    let mut next_seq = 0u64;
    loop {
        if rx.recv_many(&mut first, max).await == 0 {
            return;
        }
        let seq = next_seq;
        next_seq += 1;
        let p = &state.published;
        let mut n = first.len();
        p.add_pending(seq, std::mem::take(&mut first));
        let deadline = tokio::time::Instant::now() + wait;
        while n < max {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(r)) => {
                    p.add_pending(seq, vec![r]);
                    n += 1;
                }
                _ => break,
            }
        }
        let Ok(permit) = inflight.clone().acquire_owned().await else {
            return;
        };
        let routes = p.pending_routes_of(seq);
        let st = state.clone();
        tokio::spawn(async move {
            let cmd = Command::RecordRoutes {
                peer: st.node.id,
                at_ms: now_ms(),
                routes,
            };
            st.counters.proposals.fetch_add(1, Relaxed);
            st.counters.proposed_routes.fetch_add(n as u64, Relaxed);
            let mut index = None;
            for attempt in 0..5u64 {
                match st.node.propose_at(cmd.clone()).await {
                    Ok((i, _)) => {
                        index = Some(i);
                        break;
                    }
                    Err(e) => {
                        st.counters.proposal_failures.fetch_add(1, Relaxed);
                        tracing::debug!(error = %e, attempt, "proposal failed");
                        tokio::time::sleep(Duration::from_millis(50 * (attempt + 1))).await;
                    }
                }
            }
            if index.is_none() {
                for _ in 0..n {
                    st.metrics.record_dropped();
                }
            }
            st.published.settle(seq, index);
            drop(permit);
        });
    }
}

/// Shares this peer's in-flight load per rank through the log (when it changed, and at
/// least every second so readers can tell it is fresh), and folds the other peers' fresh
/// reports into each rank's remote counters.
async fn load_reporter(state: std::sync::Weak<ClusterState>, every: Duration, stale_ms: u64) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Vec<RankLoad> = Vec::new();
    let mut last_sent = 0u64;
    loop {
        tick.tick().await;
        let Some(s) = state.upgrade() else { return };
        let topo = s.published.topology.load_full();
        let mine: Vec<RankLoad> = topo
            .ranks
            .iter()
            .map(|r| RankLoad {
                rank: r.id,
                queued_prefill: r.queued_prefill.load(Relaxed),
                decodes: r.decodes.load(Relaxed),
            })
            .collect();
        let now = now_ms();
        let has_leader = s.node.raft.metrics().borrow().current_leader.is_some();
        if has_leader && (mine != last || now.saturating_sub(last_sent) >= 1000) {
            last_sent = now;
            last = mine.clone();
            let node = s.node.clone();
            let counters = s.counters.clone();
            tokio::spawn(async move {
                let cmd = Command::LoadSnapshot {
                    peer: node.id,
                    at_ms: now,
                    loads: mine,
                };
                if node.propose(cmd).await.is_ok() {
                    counters.load_reports.fetch_add(1, Relaxed);
                }
            });
        }
        let loads = s.published.loads.load_full();
        let mut sums: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for (peer, l) in loads.iter() {
            if *peer == s.node.id || now.saturating_sub(l.at_ms) > stale_ms {
                continue;
            }
            for x in &l.loads {
                let e = sums.entry(x.rank).or_default();
                e.0 += x.queued_prefill;
                e.1 += x.decodes;
            }
        }
        for r in &topo.ranks {
            let (p, d) = sums.get(&r.id).copied().unwrap_or_default();
            r.remote_prefill.store(p, Relaxed);
            r.remote_decodes.store(d, Relaxed);
        }
    }
}

/// One metric with its HELP and TYPE lines.
fn sample(o: &mut String, name: &str, help: &str, kind: &str, v: impl std::fmt::Display) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
}

impl RoutingState for ClusterState {
    fn view(&self) -> Guard<Arc<IndexView>> {
        self.published.view.load()
    }

    fn topology(&self) -> Guard<Arc<Topology>> {
        self.published.topology.load()
    }

    fn record(&self, rec: Route) {
        if self.tx.try_send(rec).is_err() {
            self.metrics.record_dropped();
        }
    }

    fn index_stats(&self) -> IndexStats {
        **self.published.stats.load()
    }

    fn cluster_status(&self) -> StatusFuture<'_> {
        Box::pin(async move { Some(self.status().await) })
    }

    fn change(&self, cmd: Command) -> ChangeFuture<'_> {
        Box::pin(async move {
            let (index, outcome) = self.node.propose_at(cmd).await.map_err(|e| e.to_string())?;
            let (ok, missing) = self.node.wait_applied(index, CONFIRM).await;
            let mut note = format!("applied at log index {index} on peers {ok:?}");
            if !missing.is_empty() {
                let _ = write!(note, "; not confirmed within 3 s by peers {missing:?}");
            }
            Ok(Changed { outcome, note })
        })
    }

    fn render_metrics(&self, o: &mut String) {
        let m = self.node.raft.metrics().borrow().clone();
        let st = &self.node.stats;
        let commit = st.committed.load(Relaxed);
        let applied = self.published.applied.load(Relaxed);
        let c = &self.counters;
        let gauges: [(&str, &str, u64); 16] = [
            ("router_raft_term", "Current Raft term.", m.current_term),
            (
                "router_raft_leader",
                "Id of the leader this peer knows (0: none).",
                m.current_leader.unwrap_or(0),
            ),
            (
                "router_raft_is_leader",
                "1 when this peer leads.",
                u64::from(m.current_leader == Some(self.node.id)),
            ),
            (
                "router_raft_last_log_index",
                "Last log index on this peer.",
                m.last_log_index.unwrap_or(0),
            ),
            (
                "router_raft_commit_index",
                "Committed log index this peer knows.",
                commit,
            ),
            (
                "router_raft_applied_index",
                "Log index applied to the routing state.",
                applied,
            ),
            (
                "router_raft_apply_lag_entries",
                "Committed entries not applied yet.",
                commit.saturating_sub(applied),
            ),
            (
                "router_raft_snapshot_index",
                "Log index of the last snapshot.",
                m.snapshot.map_or(0, |s| s.index),
            ),
            (
                "router_raft_pending_routes",
                "This peer's decisions proposed but not applied here (the overlay).",
                self.published.pending_routes.load(Relaxed),
            ),
            (
                "router_raft_snapshot_bytes",
                "Size of the last snapshot built or installed.",
                st.snapshot_bytes.load(Relaxed),
            ),
            (
                "router_raft_snapshots_built_total",
                "Snapshots built.",
                st.snapshots_built.load(Relaxed),
            ),
            (
                "router_raft_snapshots_installed_total",
                "Snapshots received and installed.",
                st.snapshots_installed.load(Relaxed),
            ),
            (
                "router_raft_proposals_total",
                "RecordRoutes batches proposed.",
                c.proposals.load(Relaxed),
            ),
            (
                "router_raft_proposed_routes_total",
                "Routing decisions proposed (sum of batch sizes).",
                c.proposed_routes.load(Relaxed),
            ),
            (
                "router_raft_proposal_failures_total",
                "Proposal attempts that failed (no leader, timeouts).",
                c.proposal_failures.load(Relaxed),
            ),
            (
                "router_raft_load_reports_total",
                "Load snapshots this peer shared.",
                c.load_reports.load(Relaxed),
            ),
        ];
        for (name, help, v) in gauges {
            let kind = if name.ends_with("_total") {
                "counter"
            } else {
                "gauge"
            };
            sample(o, name, help, kind, v);
        }
        for (name, help, us) in [
            (
                "router_raft_snapshot_build_seconds",
                "Time the last snapshot build took.",
                st.snapshot_build_us.load(Relaxed),
            ),
            (
                "router_raft_snapshot_lock_seconds",
                "Time the last snapshot build held the state lock (apply waited that long).",
                st.snapshot_lock_us.load(Relaxed),
            ),
            (
                "router_raft_snapshot_install_seconds",
                "Time the last snapshot install took.",
                st.snapshot_install_us.load(Relaxed),
            ),
        ] {
            sample(o, name, help, "gauge", us as f64 / 1e6);
        }
        c.route_lag.render(
            o,
            "router_raft_route_lag_seconds",
            "From another peer closing a batch of decisions to this peer applying it.",
        );
    }
}
