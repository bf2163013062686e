//! This peer's decisions that the Raft log has not applied here yet, laid over the applied
//! index: a peer routes a conversation's next turn by its own last decision at once, not
//! after the round trip through the leader.
//!
//! Taken only by the proposer and the apply task (never by the request path, which reads
//! the published [`Overlay::view`]).

use arc_swap::{ArcSwap, Guard};
use router_core::{IndexView, Route};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

/// A batch proposed but not yet applied locally.
struct Pending {
    seq: u64,
    routes: Vec<Route>,
    /// Log index, once the proposal returned.
    index: Option<u64>,
}

/// The applied index view, the pending batches, and their union for readers.
pub struct Overlay {
    /// What the log applied.
    applied_view: ArcSwap<IndexView>,
    /// `applied_view` plus pending decisions: what the request path reads.
    view: ArcSwap<IndexView>,
    applied: AtomicU64,
    pending: Mutex<VecDeque<Pending>>,
    pending_routes: AtomicU64,
}

impl Default for Overlay {
    fn default() -> Self {
        Overlay {
            applied_view: ArcSwap::from_pointee(IndexView::default()),
            view: ArcSwap::from_pointee(IndexView::default()),
            applied: AtomicU64::new(0),
            pending: Mutex::new(VecDeque::new()),
            pending_routes: AtomicU64::new(0),
        }
    }
}

impl Overlay {
    fn lock(&self) -> MutexGuard<'_, VecDeque<Pending>> {
        // The queue holds no invariant a panic could break half way.
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the request path reads: applied state plus pending decisions (lock-free).
    pub fn view(&self) -> Guard<Arc<IndexView>> {
        self.view.load()
    }

    /// Log index applied here.
    pub fn applied(&self) -> u64 {
        self.applied.load(Relaxed)
    }

    /// Decisions in the overlay now.
    pub fn pending_routes(&self) -> u64 {
        self.pending_routes.load(Relaxed)
    }

    /// Adds decisions to batch `seq` and to the readers' view at once.
    pub fn add_pending(&self, seq: u64, routes: Vec<Route>) {
        let mut pending = self.lock();
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

    /// The decisions of batch `seq` (to propose them).
    pub fn routes_of(&self, seq: u64) -> Vec<Route> {
        self.lock()
            .iter()
            .find(|b| b.seq == seq)
            .map(|b| b.routes.clone())
            .unwrap_or_default()
    }

    /// Batch `seq` got log index `index` (None: dropped). Until the log applies it here it
    /// stays in the overlay; if it already was applied (or was dropped), it leaves now.
    pub fn settle(&self, seq: u64, index: Option<u64>) {
        let mut pending = self.lock();
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

    /// The log applied up to `index`, giving `view`: batches it covers leave the overlay.
    pub fn applied_up_to(&self, index: u64, view: IndexView) {
        self.applied_view.store(Arc::new(view));
        self.applied.store(index, Relaxed);
        let mut pending = self.lock();
        pending.retain(|b| b.index.is_none_or(|i| i > index));
        self.republish(&pending);
    }

    /// Recomputes the readers' view from the applied view and the pending batches.
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

#[cfg(test)]
mod tests {
    use super::*;
    use router_core::CacheModel;

    fn route(rank: u32, session: u64) -> Route {
        Route {
            rank,
            hashes: vec![session * 100, session * 100 + 1],
            chunk_tokens: vec![512, 512],
            session: Some(session),
        }
    }

    /// The view the log would produce after applying `routes`.
    fn applied(routes: &[Route]) -> IndexView {
        let mut m = CacheModel::new(10_000, 100);
        for r in routes {
            m.set_capacity(r.rank, 1_000_000);
            m.record(r.rank, &r.hashes, &r.chunk_tokens, r.session);
        }
        m.view()
    }

    #[test]
    fn pending_decisions_are_visible_at_once() {
        let o = Overlay::default();
        o.add_pending(0, vec![route(1, 7)]);
        o.add_pending(0, vec![route(2, 8)]);
        assert_eq!(o.view().session(7), Some(1));
        assert_eq!(o.view().session(8), Some(2));
        assert_eq!(o.pending_routes(), 2);
        assert_eq!(o.routes_of(0).len(), 2);
        assert!(o.routes_of(1).is_empty());
    }

    #[test]
    fn a_dropped_batch_leaves_the_view() {
        let o = Overlay::default();
        o.add_pending(0, vec![route(1, 7)]);
        o.add_pending(1, vec![route(2, 8)]);
        o.settle(0, None);
        assert_eq!(o.view().session(7), None, "a dropped decision stayed");
        assert_eq!(o.view().session(8), Some(2), "the other batch went too");
        assert_eq!(o.pending_routes(), 1);
    }

    #[test]
    fn a_batch_stays_until_the_log_applies_its_index() {
        let o = Overlay::default();
        o.add_pending(0, vec![route(1, 7)]);
        o.settle(0, Some(5));
        assert_eq!(o.view().session(7), Some(1));
        // Index 4 applied: not this batch yet, and the applied view does not hold it.
        o.applied_up_to(4, IndexView::default());
        assert_eq!(
            o.view().session(7),
            Some(1),
            "left before its index was applied"
        );
        assert_eq!(o.pending_routes(), 1);
        // Index 5 applied: the applied view holds it now, and the overlay is empty.
        o.applied_up_to(5, applied(&[route(1, 7)]));
        assert_eq!(o.pending_routes(), 0);
        assert_eq!(o.view().session(7), Some(1));
        assert_eq!(o.applied(), 5);
    }

    #[test]
    fn a_batch_applied_before_its_proposal_returned_leaves_on_settle() {
        let o = Overlay::default();
        o.add_pending(0, vec![route(1, 7)]);
        // The log applied index 3 (this batch) before propose() returned with index 3.
        o.applied_up_to(3, applied(&[route(1, 7)]));
        assert_eq!(o.pending_routes(), 1, "an unsettled batch has no index yet");
        o.settle(0, Some(3));
        assert_eq!(o.pending_routes(), 0);
        assert_eq!(o.view().session(7), Some(1));
    }
}
