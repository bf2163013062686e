//! The router cluster: openraft over sled storage and tonic, replicating router-core's
//! [`Machine`]. Network, storage and a peer runtime live here; the router binary wires them
//! in.
//!
//! [`Machine`]: router_core::Machine

// openraft's StorageError is large by design and every storage method returns it.
#![allow(clippy::result_large_err)]

pub mod codec;
pub mod config;
pub mod network;
pub mod node;
pub mod snapfile;
pub mod span;
pub mod status;
pub mod store;
pub mod tls;

pub use config::RaftTunables;
pub use node::{ClusterNode, MembershipError, NodeConfig};
pub use span::SPAN_TARGET;
pub use status::{Member, NodeStatus, Role, SnapshotStats};
