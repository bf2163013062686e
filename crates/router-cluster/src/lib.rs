//! The router cluster: openraft over sled storage replicating router-core's [`Machine`].
//! (Network, membership and the admin service build on this; see issue 4.)
//!
//! [`Machine`]: router_core::Machine

// openraft's StorageError is large by design and every storage method returns it.
#![allow(clippy::result_large_err)]

pub mod store;
