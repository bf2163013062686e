//! The replicated routing state: the request path reads views that the Raft apply task
//! publishes (plus an overlay of this peer's decisions the log has not applied yet), and
//! hands its decisions to a proposer that batches them into `RecordRoutes` entries.
//! Nothing on the request path waits for Raft or takes a lock.

use super::overlay::Overlay;
use super::routing::{ChangeError, ChangeFuture, Changed, ClusterView, RoutingState, StatusFuture};
use super::topology::Topology;
use crate::config::{ClusterConfig, Config};
use crate::metrics::{Histogram, Metrics};
use crate::telemetry::SPAN_TARGET;
use arc_swap::{ArcSwap, Guard};
use router_cluster::store::{OnApply, SmState};
use router_cluster::tls::PeerTls;
use router_cluster::{ClusterNode, NodeConfig};
use router_core::machine::PeerLoad;
use router_core::{Command, IndexStats, IndexView, Outcome, RankLoad, Route};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tracing::field::Empty;
use tracing::Instrument;

/// Views published for the request path.
#[derive(Default)]
struct Published {
    overlay: Overlay,
    topology: ArcSwap<Topology>,
    stats: ArcSwap<IndexStats>,
    loads: ArcSwap<BTreeMap<u64, PeerLoad>>,
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
    /// The initial voters, for bootstrapping a new cluster in [`ClusterState::serve`].
    peers: BTreeMap<u64, String>,
    /// Servers from the config, joined through the log once there is a leader.
    configured: Vec<Command>,
}

const QUEUE: usize = 65_536;
/// Proposals in flight at once from one peer.
const PIPELINE: usize = 4;
/// How many times `max` routes one batch may grow to while no slot is free.
const HELD_BATCH: usize = 16;
/// How long an admin change waits for every peer to apply it.
const CONFIRM: Duration = Duration::from_secs(3);
/// How long a batch of decisions is retried while there is no leader (an election, a
/// partition, a lossy link) before it is dropped. Longer than an election, so records made
/// during a fault still reach the map; bounded so a peer cut off for good stops holding
/// them (the overlay keeps routing by them here until then).
const RECORD_RETRY: Duration = Duration::from_secs(15);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl ClusterState {
    /// Opens the peer (storage, Raft) and spawns the proposer and the load reporter.
    /// Nothing is served until [`ClusterState::serve`].
    pub async fn start(
        cfg: &Config,
        c: &ClusterConfig,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Arc<ClusterState>> {
        let published = Arc::new(Published::default());
        let counters = Arc::new(RaftCounters::default());
        let on_apply = on_apply(published.clone(), counters.clone(), c.node_id);
        let node = ClusterNode::open(
            NodeConfig {
                id: c.node_id,
                listen: c.listen,
                data_dir: c.data_dir.clone(),
                cluster_id: c.cluster_id.clone(),
                raft: c.raft,
                max_entries: cfg.cache.max_entries,
                max_sessions: cfg.cache.max_sessions,
                guard_lost_data: true,
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
            node,
            published,
            tx,
            metrics,
            counters,
            peers: c.peers.iter().map(|p| (p.id, p.addr.clone())).collect(),
            configured: cfg
                .upstreams
                .iter()
                .map(|u| Command::JoinServer {
                    url: u.url.clone(),
                    ranks: u.ranks,
                    capacity_tokens: u
                        .capacity_tokens
                        .unwrap_or(cfg.cache.default_capacity_tokens),
                    weight: u.weight,
                })
                .collect(),
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

    /// Serves the peer service plus `admin` on the peer port, then bootstraps: the lowest
    /// configured id makes the first membership of a new cluster, and the configured
    /// servers join through the log once there is a leader.
    /// Returns the start-up check: it ends with an error when this peer lost its data
    /// (the router must then stop), and runs in the background so that a peer waiting for
    /// the others to answer still routes.
    pub async fn serve(
        &self,
        admin: tonic::service::Routes,
    ) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<()>>> {
        self.node.serve(Some(admin)).await?;
        self.node.record_acks(Duration::from_millis(250));
        let lowest = self.peers.keys().min().copied().unwrap_or(self.node.id);
        if !self.peers.contains_key(&self.node.id) {
            tracing::info!(
                node = self.node.id,
                "not one of the initial voters in cluster.peers: a new peer, it takes part \
                 once a member adds it (`routerctl peers add {} ADDR`)",
                self.node.id
            );
        }
        let n = self.node.clone();
        let members = self.peers.clone();
        let check = tokio::spawn(async move {
            // Before this peer votes or acknowledges anything: if it has no state but the
            // others know it as a member, its data was lost and it must stop.
            n.check_not_lost(&members).await?;
            if lowest == n.id {
                // Initializing waits for the other peers, which may start later. On a
                // restarted or already formed cluster it does nothing.
                if let Err(e) = n.initialize(members).await {
                    tracing::error!(error = %e, "cluster initialization failed");
                }
            }
            Ok(())
        });
        // Idempotent: the same URL and ranks keep their ids.
        let n = self.node.clone();
        let joins = self.configured.clone();
        tokio::spawn(async move {
            for j in joins {
                loop {
                    match n.propose(j.clone()).await {
                        Ok(Outcome::Rejected(r)) => {
                            tracing::error!(reason = %r, "configured upstream rejected");
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
        Ok(check)
    }

    /// The Raft peer.
    pub fn node(&self) -> &Arc<ClusterNode> {
        &self.node
    }

    /// The data plane's counters.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Raft status with the state digest. The digest walks the state under the state
    /// machine's read lock (apply waits meanwhile), so it is computed here, on request,
    /// and never per applied batch.
    pub async fn status(&self) -> ClusterView {
        let (applied_index, digest) = self.node.applied_digest().await;
        ClusterView {
            node: self.node.status(),
            applied_index,
            digest,
            snapshots_installed: self.node.snapshot_stats().installed,
        }
    }
}

/// Publishes what each applied batch changed: views, topology, loads, and drops
/// pending overlay batches the log has now applied.
fn on_apply(p: Arc<Published>, counters: Arc<RaftCounters>, me: u64) -> OnApply {
    Arc::new(move |st: &SmState| {
        let applied = st.last_applied.map_or(0, |l| l.index);
        p.stats.store(Arc::new(st.machine.model().stats()));
        p.overlay.applied_up_to(applied, st.machine.view());
        if let Some((peer, at)) = st.last_routes {
            if peer != me && at > 0 {
                let lag = now_ms().saturating_sub(at);
                counters.route_lag.observe(Duration::from_millis(lag));
            }
        }
        if **p.loads.load() != *st.machine.loads() {
            p.loads.store(Arc::new(st.machine.loads().clone()));
        }
        let prev = p.topology.load();
        if !prev.describes(st.machine.servers()) {
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
/// routes by it before the log applies it. Without a leader a batch is retried for
/// [`RECORD_RETRY`], then dropped and counted (the map is a cache; losing a batch costs hits, not
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
        let p = &state.published.overlay;
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
        // While every slot is busy (no leader to take them), later decisions still join
        // this batch and so the overlay: this peer keeps routing by them. Bounded, beyond
        // that they wait in the channel.
        let permit = loop {
            tokio::select! {
                slot = inflight.clone().acquire_owned() => break slot,
                r = rx.recv(), if n < max * HELD_BATCH => match r {
                    Some(r) => {
                        p.add_pending(seq, vec![r]);
                        n += 1;
                    }
                    None => return,
                },
            }
        };
        let Ok(permit) = permit else {
            return;
        };
        let routes = p.routes_of(seq);
        let st = state.clone();
        let span = tracing::info_span!(target: SPAN_TARGET, "propose", routes = n as i64,
            tries = Empty, index = Empty, otel.status_code = Empty);
        let traced = span.clone();
        let batch = async move {
            let cmd = Command::RecordRoutes {
                peer: st.node.id,
                at_ms: now_ms(),
                routes,
            };
            st.counters.proposals.fetch_add(1, Relaxed);
            st.counters.proposed_routes.fetch_add(n as u64, Relaxed);
            let mut index = None;
            let give_up = tokio::time::Instant::now() + RECORD_RETRY;
            let mut pause = Duration::from_millis(50);
            let mut tries = 0u64;
            loop {
                tries += 1;
                match st.node.propose_at(cmd.clone()).await {
                    Ok((i, _)) => {
                        index = Some(i);
                        break;
                    }
                    Err(e) => {
                        st.counters.proposal_failures.fetch_add(1, Relaxed);
                        tracing::debug!(error = %e, "proposal failed");
                        if tokio::time::Instant::now() + pause >= give_up {
                            break;
                        }
                        // Retrying a batch that did apply is harmless: recording a route
                        // again only refreshes it.
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_millis(500));
                    }
                }
            }
            traced.record("tries", tries as i64);
            match index {
                Some(i) => {
                    traced.record("index", i as i64);
                }
                None => {
                    traced.record("otel.status_code", "error");
                    for _ in 0..n {
                        st.metrics.record_dropped();
                    }
                }
            }
            st.published.overlay.settle(seq, index);
            drop(permit);
        };
        tokio::spawn(batch.instrument(span));
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
        if s.node.has_leader() && (mine != last || now.saturating_sub(last_sent) >= 1000) {
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

impl RoutingState for ClusterState {
    fn view(&self) -> Guard<Arc<IndexView>> {
        self.published.overlay.view()
    }

    fn topology(&self) -> Guard<Arc<Topology>> {
        self.published.topology.load()
    }

    fn pending_routes(&self) -> u64 {
        self.published.overlay.pending_routes()
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
            let (index, outcome) = self
                .node
                .propose_at(cmd)
                .await
                .map_err(|e| ChangeError::NoLeader(format!("{e:#}")))?;
            let (confirmed, unconfirmed) = self.node.wait_applied(index, CONFIRM).await;
            Ok(Changed {
                outcome,
                index: Some(index),
                confirmed,
                unconfirmed,
            })
        })
    }

    fn render_metrics(&self, o: &mut promtext::Exposition) {
        let m = self.node.status();
        let snap = self.node.snapshot_stats();
        let commit = m.commit_index;
        let applied = self.published.overlay.applied();
        let c = &self.counters;
        let gauges: [(&str, &str, u64); 16] = [
            ("router_raft_term", "Current Raft term.", m.term),
            (
                "router_raft_leader",
                "Id of the leader this peer knows (0: none).",
                m.leader.unwrap_or(0),
            ),
            (
                "router_raft_is_leader",
                "1 when this peer leads.",
                u64::from(m.is_leader()),
            ),
            (
                "router_raft_last_log_index",
                "Last log index on this peer.",
                m.last_log_index,
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
                m.snapshot_index,
            ),
            (
                "router_raft_pending_routes",
                "This peer's decisions proposed but not applied here (the overlay).",
                self.published.overlay.pending_routes(),
            ),
            (
                "router_raft_snapshot_bytes",
                "Size of the last snapshot built or installed.",
                snap.bytes,
            ),
            (
                "router_raft_snapshots_built_total",
                "Snapshots built.",
                snap.built,
            ),
            (
                "router_raft_snapshots_installed_total",
                "Snapshots received and installed.",
                snap.installed,
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
            o.scalar(name, help, v);
        }
        for (name, help, us) in [
            (
                "router_raft_snapshot_build_seconds",
                "Time the last snapshot build took.",
                snap.build_us,
            ),
            (
                "router_raft_snapshot_lock_seconds",
                "Time the last snapshot build held the state lock (apply waited that long).",
                snap.lock_us,
            ),
            (
                "router_raft_snapshot_install_seconds",
                "Time the last snapshot install took.",
                snap.install_us,
            ),
        ] {
            o.scalar(name, help, us as f64 / 1e6);
        }
        c.route_lag.render(
            o,
            "router_raft_route_lag_seconds",
            "From another peer closing a batch of decisions to this peer applying it.",
        );
    }
}
