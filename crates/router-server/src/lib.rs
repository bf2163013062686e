//! The router daemon as a library: build from a validated [`Config`], then run.

pub mod admin;
pub mod body;
pub mod cluster;
pub mod config;
pub mod error;
pub mod health;
pub mod metrics;
pub mod proxy;
pub mod server;
pub mod state;
pub mod topology;
pub mod upstream;

use bytes::Bytes;
use config::Config;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use metrics::Metrics;
use proxy::Ctx;
use state::{LocalState, RoutingState};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use topology::Topology;

/// The pooled HTTP/1.1 client used for upstreams.
pub type UpstreamClient = Client<HttpConnector, Full<Bytes>>;

/// Builds the upstream client with the configured connect timeout.
pub fn upstream_client(cfg: &Config) -> UpstreamClient {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    conn.set_connect_timeout(Some(Duration::from_millis(cfg.timeouts.connect_ms)));
    conn.set_keepalive(Some(Duration::from_secs(30)));
    Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(1024)
        .http1_writev(true)
        .build(conn)
}

/// The data plane's upstream pool settings from config.
pub fn pool_config(cfg: &Config) -> upstream::PoolConfig {
    upstream::PoolConfig {
        connect_timeout: Duration::from_millis(cfg.timeouts.connect_ms),
        max_idle_per_upstream: 1024,
        idle_timeout: Duration::from_millis(cfg.timeouts.upstream_idle_ms),
    }
}

/// Binds every listener, starts the state and health tasks and serves until `shutdown`.
pub async fn run(cfg: Config, shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
    let cfg = Arc::new(cfg);
    let listener = server::bind(cfg.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", cfg.listen))?;
    let metrics_listener = match cfg.metrics_listen {
        Some(a) => Some(
            server::bind(a)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {a}: {e}"))?,
        ),
        None => None,
    };
    let tls = match &cfg.tls {
        Some(t) => Some(server::tls_acceptor(&t.cert, &t.key)?),
        None => None,
    };
    let metrics = Arc::new(Metrics::default());
    let state: Arc<dyn RoutingState> = match &cfg.cluster {
        Some(c) => cluster::ClusterState::start(&cfg, c, metrics.clone()).await?,
        None => {
            let topo = Topology::from_config(&cfg.upstreams, cfg.cache.default_capacity_tokens);
            LocalState::start(
                topo,
                cfg.cache.max_entries,
                cfg.cache.max_sessions,
                metrics.clone(),
            )
        }
    };
    let client = upstream_client(&cfg);
    let health = health::spawn(
        cfg.health.clone(),
        state.clone(),
        client.clone(),
        cfg.upstream_token.clone(),
    );
    let ctx = Arc::new(Ctx {
        cfg: cfg.clone(),
        state,
        client,
        pool: upstream::Pool::new(pool_config(&cfg)),
        metrics,
        health,
        tie: Arc::new(AtomicU64::new(0)),
    });
    tokio::spawn(upstream::Pool::sweeper(Arc::downgrade(&ctx.pool)));
    tracing::info!(
        listen = %cfg.listen,
        tls = cfg.tls.is_some(),
        policy = ?cfg.policy,
        upstreams = cfg.upstreams.len(),
        "router listening"
    );
    let metrics_task = metrics_listener
        .map(|l| tokio::spawn(server::serve(l, ctx.clone(), None, true, shutdown.clone())));
    server::serve(listener, ctx, tls, false, shutdown).await;
    if let Some(t) = metrics_task {
        let _ = t.await;
    }
    Ok(())
}
