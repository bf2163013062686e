//! The single-node routing state: one task owns the [`Machine`] (the same state machine a
//! Raft log drives), applies decisions in batches as `RecordRoutes` commands and publishes
//! a fresh [`IndexView`] after each batch. The request path reads the published snapshot
//! and hands its decisions over without waiting.

use super::routing::{ChangeError, ChangeFuture, Changed, RoutingState};
use super::topology::Topology;
use crate::metrics::Metrics;
use arc_swap::{ArcSwap, Guard};
use router_core::{Command, IndexStats, IndexView, Machine, Outcome, Route};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

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
                .map_err(|_| ChangeError::Stopped)?;
            let outcome = rx.await.map_err(|_| ChangeError::Stopped)?;
            Ok(Changed {
                outcome,
                index: None,
                confirmed: Vec::new(),
                unconfirmed: Vec::new(),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::UpstreamConfig;
    use router_core::Rejection;
    use std::time::Duration;

    fn state(queue_metrics: &Arc<Metrics>) -> Arc<LocalState> {
        let ups = [
            UpstreamConfig::from_url("http://127.0.0.1:9001"),
            UpstreamConfig::from_url("http://127.0.0.1:9002"),
        ];
        LocalState::start(
            Topology::from_config(&ups, 1_000_000),
            100_000,
            1000,
            queue_metrics.clone(),
        )
    }

    fn route(rank: u32, base: u64) -> Route {
        Route {
            rank,
            hashes: (base..base + 4).collect(),
            chunk_tokens: vec![512; 4],
            session: Some(base),
        }
    }

    async fn until(what: &str, f: impl Fn() -> bool) {
        for _ in 0..200 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("{what}");
    }

    #[tokio::test]
    async fn recorded_decisions_reach_the_published_view() {
        let m = Arc::new(Metrics::default());
        let s = state(&m);
        assert_eq!(s.view().session(7), None);
        s.record(route(1, 7));
        until("the decision is visible", || s.view().session(7) == Some(1)).await;
        assert_eq!(s.index_stats().entries, 4);
        // Many at once: all applied, the published stats follow.
        for b in 0..100u64 {
            s.record(route((b % 2) as u32, 1000 + b * 10));
        }
        until("a burst is applied", || s.index_stats().entries == 404).await;
    }

    #[tokio::test]
    async fn changes_update_the_topology_and_rejections_are_typed() {
        let m = Arc::new(Metrics::default());
        let s = state(&m);
        let c = s
            .change(Command::JoinServer {
                url: "http://127.0.0.1:9003".into(),
                ranks: 2,
                capacity_tokens: 5000,
                weight: 1.0,
            })
            .await
            .unwrap();
        assert_eq!(c.outcome, Outcome::Joined(vec![2, 3]));
        assert_eq!(c.index, None);
        let t = s.topology();
        assert_eq!(t.upstreams.len(), 3);
        assert_eq!(t.ranks.len(), 4);
        assert_eq!(t.ranks[3].dp_rank, Some(1));
        drop(t);
        let c = s
            .change(Command::LeaveServer {
                url: "http://127.0.0.1:9999".into(),
            })
            .await
            .unwrap();
        assert_eq!(
            c.outcome,
            Outcome::Rejected(Rejection::UnknownServer("http://127.0.0.1:9999".into()))
        );
        s.change(Command::DrainServer {
            url: "http://127.0.0.1:9001".into(),
            draining: true,
        })
        .await
        .unwrap();
        assert!(!s.topology().ranks[0].eligible());
        assert!(s.topology().ranks[1].eligible());
    }
}
