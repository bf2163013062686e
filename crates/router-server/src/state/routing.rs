//! What the data plane and the admin endpoints need from the routing state, whichever
//! implementation holds it (one router, or a Raft peer).

use super::topology::Topology;
use arc_swap::Guard;
use router_cluster::NodeStatus;
use router_core::{Command, IndexStats, IndexView, Outcome, Route};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// An operator's change (join, leave, drain) on its way through the state.
pub type ChangeFuture<'a> = Pin<Box<dyn Future<Output = Result<Changed, ChangeError>> + Send + 'a>>;

/// The cluster's side of `/health` and `routerctl status` (None for a single router).
pub type StatusFuture<'a> = Pin<Box<dyn Future<Output = Option<ClusterView>> + Send + 'a>>;

/// A change the state machine decided on (applied, or rejected with a reason).
#[derive(Debug, Clone, PartialEq)]
pub struct Changed {
    /// What the state machine said.
    pub outcome: Outcome,
    /// Log index of the change (clustered).
    pub index: Option<u64>,
    /// Peers that had applied it when the call returned (clustered).
    pub confirmed: Vec<u64>,
    /// Members that had not confirmed it within the wait (down, partitioned or behind).
    pub unconfirmed: Vec<u64>,
}

impl Changed {
    /// Where the change is visible, in words.
    pub fn note(&self) -> String {
        match self.index {
            None => "applied on this router".into(),
            Some(i) if self.unconfirmed.is_empty() => {
                format!("applied at log index {i} on peers {:?}", self.confirmed)
            }
            Some(i) => format!(
                "applied at log index {i} on peers {:?}; not confirmed in time by peers {:?}",
                self.confirmed, self.unconfirmed
            ),
        }
    }
}

/// Why a change could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChangeError {
    /// The state's writer is gone (shutting down).
    #[error("the routing state stopped")]
    Stopped,
    /// No leader took the change (an election, or this peer is cut off from the majority).
    #[error("no leader took the change: {0}")]
    NoLeader(String),
}

/// One Raft peer's status with the digest of its applied state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    /// Raft role, term, log positions, membership.
    pub node: NodeStatus,
    /// Index the digest was taken at.
    pub applied_index: u64,
    /// Digest of the applied state: equal on two peers exactly when their states are.
    pub digest: u64,
    /// Snapshots this peer received and installed.
    pub snapshots_installed: u64,
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
    /// This peer's decisions in `view` that the replicated log has not applied yet (0: the
    /// view is the applied state alone).
    fn pending_routes(&self) -> u64 {
        0
    }
    /// Index counters for metrics.
    fn index_stats(&self) -> IndexStats;
    /// Raft status when clustered.
    fn cluster_status(&self) -> StatusFuture<'_> {
        Box::pin(async { None })
    }
    /// Applies an operator's command (join, leave, drain). Returns once this router routes
    /// by it (and, clustered, once every reachable peer does).
    fn change(&self, cmd: Command) -> ChangeFuture<'_>;
    /// Appends state-specific metrics (Raft).
    fn render_metrics(&self, _out: &mut promtext::Exposition) {}
}
