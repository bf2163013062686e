//! Operator calls: the admin gRPC service that `routerctl` talks to (on the peer port), and
//! the vllm-router-compatible HTTP endpoints and `POST /admin/explain` on the client port. Both need the admin token;
//! both fail with one typed [`AdminError`], mapped to gRPC and HTTP in one place each.

mod auth;
mod error;
mod explain;
mod grpc;
mod http_api;
mod self_check;
mod servers;

pub use auth::{admin_headers, is_admin};
pub use error::AdminError;
pub use explain::{decision as explain, endpoint_named};
pub use grpc::AdminService;
pub use http_api::{handle as handle_http, AdminHttp};
