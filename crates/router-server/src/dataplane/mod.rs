//! The data plane: listeners and per-CPU worker threads, the front door that classifies
//! requests, the proxy (read, canonicalize, score, send with retries, relay), the
//! per-thread upstream connection pool, and the router's own endpoints.

mod ctx;
mod endpoints;
mod head_timeout;
mod listener;
mod proxy;
mod relay;
mod service;
mod upstream;

pub use ctx::Ctx;
pub use listener::{bind, serve};
pub use upstream::Pool;
