//! Operator calls: the admin gRPC service that `routerctl` talks to (on the peer port), and
//! the vllm-router-compatible HTTP endpoints on the client port. Both need the admin token;
//! both fail with one typed [`AdminError`], mapped to gRPC and HTTP in one place each.

mod auth;
mod error;
mod grpc;
mod http_api;
mod self_check;
mod servers;

pub use auth::is_admin;
pub use error::AdminError;
pub use grpc::AdminService;
pub use http_api::{handle as handle_http, AdminHttp};
