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
use arc_swap::ArcSwap;
use router_core::{Command, IndexStats, IndexView, Machine, Outcome, Route};
use std::sync::Arc;
use tokio::sync::mpsc;

/// What the data plane needs from the routing state.
pub trait RoutingState: Send + Sync + 'static {
    /// The current index snapshot (lock-free).
    fn view(&self) -> Arc<IndexView>;
    /// The current topology snapshot (lock-free).
    fn topology(&self) -> Arc<Topology>;
    /// Remembers a decision; never blocks (a full queue drops and counts).
    fn record(&self, rec: Route);
    /// Index counters for metrics.
    fn index_stats(&self) -> IndexStats;
    /// Raft status when clustered.
    fn cluster_status(&self) -> Option<serde_json::Value> {
        None
    }
}

/// Records buffered between the request path and the writer.
const QUEUE: usize = 65_536;
/// Records applied before a new view is published.
const BATCH: usize = 4096;
/// Shortest interval between two published views.
const PUBLISH_EVERY: std::time::Duration = std::time::Duration::from_millis(1);

/// Single-node state.
pub struct LocalState {
    view: ArcSwap<IndexView>,
    topology: ArcSwap<Topology>,
    stats: ArcSwap<IndexStats>,
    tx: mpsc::Sender<Route>,
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
                capacity_tokens: ranks.first().map_or(1, |r| r.capacity_tokens),
                weight: ranks.first().map_or(1.0, |r| r.weight),
            });
            // Rank ids are handed out densely in join order, as Topology::from_config does.
            debug_assert_eq!(
                outcome,
                Outcome::Joined(ranks.iter().map(|r| r.id).collect())
            );
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        let state = Arc::new(LocalState {
            view: ArcSwap::from_pointee(model.view()),
            topology: ArcSwap::from_pointee(topology),
            stats: ArcSwap::from_pointee(model.model().stats()),
            tx,
            metrics,
        });
        tokio::spawn(writer(Arc::downgrade(&state), model, rx));
        state
    }
}

async fn writer(
    state: std::sync::Weak<LocalState>,
    mut model: Machine,
    mut rx: mpsc::Receiver<Route>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    while rx.recv_many(&mut batch, BATCH).await > 0 {
        let routes = std::mem::take(&mut batch);
        model.apply(&Command::RecordRoutes { peer: 0, routes });
        let Some(s) = state.upgrade() else { return };
        s.view.store(Arc::new(model.view()));
        s.stats.store(Arc::new(model.model().stats()));
        drop(s);
        // Under load, let records pile up for a moment: one wakeup and one published view
        // per millisecond instead of one per request. Follow-up turns come seconds later.
        tokio::time::sleep(PUBLISH_EVERY).await;
    }
}

impl RoutingState for LocalState {
    fn view(&self) -> Arc<IndexView> {
        self.view.load_full()
    }

    fn topology(&self) -> Arc<Topology> {
        self.topology.load_full()
    }

    fn record(&self, rec: Route) {
        if self.tx.try_send(rec).is_err() {
            self.metrics.record_dropped();
        }
    }

    fn index_stats(&self) -> IndexStats {
        **self.stats.load()
    }
}
