//! Generated gRPC code for the peer (Raft) and admin services; see `proto/router.proto`.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// `router.v1`.
pub mod v1 {
    tonic::include_proto!("router.v1");
}
