//! The routing state behind a narrow interface: the request path reads an immutable
//! snapshot and hands its decision to a writer, never waiting for it.
//!
//! [`LocalState`] is the single-node implementation: one task owns the
//! [`Machine`] (the same state machine a Raft log drives), applies decisions in batches as
//! `RecordRoutes` commands and publishes a fresh [`IndexView`]
//! after each batch. A replicated implementation proposes the same records to a Raft log
//! instead and publishes what the log applies.

use crate::metrics::Metrics;
use crate::topology::Topology;
use arc_swap::{ArcSwap, Guard};
use router_core::{Command, IndexStats, IndexView, Machine, Outcome, Route};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// An operator's change (join, leave, drain) on its way through the state.
pub type ChangeFuture<'a> = Pin<Box<dyn Future<Output = Result<Changed, String>> + Send + 'a>>;

/// The cluster section of `/health` (None for a single router).
pub type StatusFuture<'a> = Pin<Box<dyn Future<Output = Option<serde_json::Value>> + Send + 'a>>;

/// A change that took effect.
#[derive(Debug, Clone, PartialEq)]
pub struct Changed {
    /// What the state machine said.
    pub outcome: Outcome,
    /// Where it is visible (e.g. which peers confirmed it).
    pub note: String,
}

/// What the data plane needs from the routing state.
pub trait RoutingState: Send + Sync + 'static {
    /// The current index snapshot (lock-free; the guard is cheapest when not held across
    /// an await).
    fn view(&self) -> Guard<Arc<IndexView>>;
    /// The current topology snapshot (lock-free).
    fn topology(&self) -> Guard<Arc<Topology>>;
    /// Remembers a decision; never blocks (a full queue drops and counts).
    fn record(&self, rec: Route);
    /// Index counters for metrics.
    fn index_stats(&self) -> IndexStats;
    /// Raft status when clustered.
    fn cluster_status(&self) -> StatusFuture<'_> {
        Box::pin(async { None })
    }
    /// Applies an operator's command (join, leave, drain). Returns once this router routes
    /// by it (and, clustered, once every reachable peer does).
    fn change(&self, cmd: Command) -> ChangeFuture<'_>;
    /// Appends state-specific metrics (Raft) in Prometheus text.
    fn render_metrics(&self, _out: &mut String) {}
}

type ChangeMsg = (Command, oneshot::Sender<Outcome>);

/// Records buffered between the request path and the writer.
const QUEUE: usize = 65_536;
/// Records applied before a new view is published.
const BATCH: usize = 4096;
/// A batch at least this large means concurrent traffic: wait [`PUBLISH_EVERY`] before the
/// next one. (With 16, the writer woke for nearly every request at 10k requests/s; each
/// wake is a cross-thread switch on a busy core, and `routerbench proxy` went from about
/// 0.7x to 0.8x nginx's throughput when batching started at 2.)
const BUSY: usize = 2;
/// Shortest interval between two published views under load.
const PUBLISH_EVERY: std::time::Duration = std::time::Duration::from_millis(1);

/// Single-node state.
pub struct LocalState {
    view: ArcSwap<IndexView>,
    topology: ArcSwap<Topology>,
    stats: ArcSwap<IndexStats>,
    tx: mpsc::Sender<Route>,
    changes: mpsc::Sender<ChangeMsg>,
    metrics: Arc<Metrics>,
}

impl LocalState {
    /// Builds the state and spawns its writer task on the current runtime.
    pub fn start(
        topology: Topology,
        max_entries: u64,
        max_sessions: u64,
        metrics: Arc<Metrics>,
    ) -> Arc<LocalState> {
        let mut model = Machine::new(max_entries, max_sessions);
        for up in &topology.upstreams {
            let ranks: Vec<_> = topology.ranks_of(up).collect();
            let outcome = model.apply(&Command::JoinServer {
                url: up.url.to_string(),
                ranks: ranks.len() as u32,
                capacity_tokens: ranks.first().map_or(1, |r| r.capacity()),
                weight: ranks.first().map_or(1.0, |r| r.weight()),
            });
            // Rank ids are handed out densely in join order, as Topology::from_config does.
            debug_assert_eq!(
                outcome,
                Outcome::Joined(ranks.iter().map(|r| r.id).collect())
            );
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        let (changes, crx) = mpsc::channel(16);
        let state = Arc::new(LocalState {
            view: ArcSwap::from_pointee(model.view()),
            topology: ArcSwap::from_pointee(topology),
            stats: ArcSwap::from_pointee(model.model().stats()),
            tx,
            changes,
            metrics,
        });
        tokio::spawn(writer(Arc::downgrade(&state), model, rx, crx));
        state
    }
}

async fn writer(
    state: std::sync::Weak<LocalState>,
    mut model: Machine,
    mut rx: mpsc::Receiver<Route>,
    mut changes: mpsc::Receiver<ChangeMsg>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut busy = false;
    loop {
        tokio::select! {
            n = rx.recv_many(&mut batch, BATCH) => {
                if n == 0 {
                    return;
                }
                let routes = std::mem::take(&mut batch);
                model.apply(&Command::RecordRoutes { peer: 0, at_ms: 0, routes });
                busy = n >= BUSY;
            }
            Some((cmd, reply)) = changes.recv() => {
                let out = model.apply(&cmd);
                if let Some(s) = state.upgrade() {
                    let prev = s.topology.load_full();
                    s.topology
                        .store(Arc::new(Topology::from_servers(model.servers(), &prev)));
                }
                let _ = reply.send(out);
            }
        }
        let Some(s) = state.upgrade() else { return };
        s.view.store(Arc::new(model.view()));
        s.stats.store(Arc::new(model.model().stats()));
        drop(s);
        // Under load, let records pile up for a moment: one wakeup and one published view
        // per millisecond instead of one per request. When quiet (one record per wake), a
        // decision is visible at once. Under load it is visible within a millisecond of the
        // upstream's response head, long before the conversation's next turn: that waits for
        // the whole response and the agent's next step.
        if busy {
            tokio::time::sleep(PUBLISH_EVERY).await;
        }
    }
}

impl RoutingState for LocalState {
    fn view(&self) -> Guard<Arc<IndexView>> {
        self.view.load()
    }

    fn topology(&self) -> Guard<Arc<Topology>> {
        self.topology.load()
    }

    fn record(&self, rec: Route) {
        if self.tx.try_send(rec).is_err() {
            self.metrics.record_dropped();
        }
    }

    fn index_stats(&self) -> IndexStats {
        **self.stats.load()
    }

    fn change(&self, cmd: Command) -> ChangeFuture<'_> {
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            self.changes
                .send((cmd, tx))
                .await
                .map_err(|_| "the routing state stopped".to_string())?;
            let outcome = rx
                .await
                .map_err(|_| "the routing state stopped".to_string())?;
            Ok(Changed {
                outcome,
                note: "applied on this router".into(),
            })
        })
    }
}
