//! The pooled HTTP/1.1 client for the router's own calls to engines, off the request path:
//! health probes and the `/v1/models` fan-out. (Proxied requests use the data plane's
//! per-thread connection pool instead.)

use crate::config::Config;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::time::Duration;

/// The client type.
pub type UpstreamClient = Client<HttpConnector, Full<Bytes>>;

/// Idle connections kept per engine.
const MAX_IDLE_PER_HOST: usize = 1024;

/// Builds the client with the configured connect timeout; idle connections close before
/// an engine's keep-alive timeout would close them.
pub fn upstream_client(cfg: &Config) -> UpstreamClient {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    conn.set_connect_timeout(Some(Duration::from_millis(cfg.timeouts.connect_ms)));
    conn.set_keepalive(Some(Duration::from_secs(30)));
    Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_millis(cfg.timeouts.upstream_idle_ms))
        .pool_max_idle_per_host(MAX_IDLE_PER_HOST)
        .http1_writev(true)
        .build(conn)
}
