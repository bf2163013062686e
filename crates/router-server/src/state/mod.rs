//! The routing state: the index of which rank holds which prompt prefixes, and the server
//! topology, behind one interface ([`RoutingState`]) with two implementations: a single
//! router's own ([`LocalState`]) and a Raft peer's ([`ClusterState`]). The request path
//! reads immutable snapshots and hands its decisions over without waiting, in both.

mod local;
mod overlay;
mod replicated;
mod routing;
pub mod topology;

pub use local::LocalState;
pub use replicated::ClusterState;
pub use routing::{ChangeError, ChangeFuture, Changed, ClusterView, RoutingState, StatusFuture};
pub use topology::{RankState, Topology, Upstream};
