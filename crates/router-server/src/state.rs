//! The routing state behind a narrow interface: the request path reads an immutable
//! snapshot and hands its decision to a writer, never waiting for it.
//!
//! [`LocalState`] is the single-node implementation: one task owns the
//! [`CacheModel`], applies decisions in batches and publishes a fresh [`IndexView`]
//! after each batch. A replicated implementation proposes the same records to a Raft log
//! instead and publishes what the log applies.

use crate::metrics::Metrics;
use crate::topology::Topology;
use arc_swap::ArcSwap;
use router_core::{CacheModel, IndexStats, IndexView, RankId};
use std::sync::Arc;
use tokio::sync::mpsc;

/// One routing decision to remember.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteRecord {
    /// Rank that served the prompt.
    pub rank: RankId,
    /// The prompt's fingerprints.
    pub hashes: Vec<u64>,
    /// Tokens of each fingerprinted chunk.
    pub chunk_tokens: Vec<u32>,
    /// Session id hash, if any.
    pub session: Option<u64>,
}

/// What the data plane needs from the routing state.
pub trait RoutingState: Send + Sync + 'static {
    /// The current index snapshot (lock-free).
    fn view(&self) -> Arc<IndexView>;
    /// The current topology snapshot (lock-free).
    fn topology(&self) -> Arc<Topology>;
    /// Remembers a decision; never blocks (a full queue drops and counts).
    fn record(&self, rec: RouteRecord);
    /// Index counters for metrics.
    fn index_stats(&self) -> IndexStats;
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
    tx: mpsc::Sender<RouteRecord>,
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
        let mut model = CacheModel::new(max_entries, max_sessions);
        for r in &topology.ranks {
            model.set_capacity(r.id, r.capacity_tokens);
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        let state = Arc::new(LocalState {
            view: ArcSwap::from_pointee(model.view()),
            topology: ArcSwap::from_pointee(topology),
            stats: ArcSwap::from_pointee(model.stats()),
            tx,
            metrics,
        });
        tokio::spawn(writer(Arc::downgrade(&state), model, rx));
        state
    }
}

async fn writer(
    state: std::sync::Weak<LocalState>,
    mut model: CacheModel,
    mut rx: mpsc::Receiver<RouteRecord>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    while rx.recv_many(&mut batch, BATCH).await > 0 {
        for rec in batch.drain(..) {
            model.record(rec.rank, &rec.hashes, &rec.chunk_tokens, rec.session);
        }
        let Some(s) = state.upgrade() else { return };
        s.view.store(Arc::new(model.view()));
        s.stats.store(Arc::new(model.stats()));
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

    fn record(&self, rec: RouteRecord) {
        if self.tx.try_send(rec).is_err() {
            self.metrics.record_dropped();
        }
    }

    fn index_stats(&self) -> IndexStats {
        **self.stats.load()
    }
}
