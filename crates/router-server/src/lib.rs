//! The router daemon as a library: build from a validated [`Config`], then run.
//!
//! The modules follow who talks to them:
//! - [`dataplane`]: clients (listeners, the proxy, the upstream pool, the router's own
//!   endpoints);
//! - [`state`]: the routing state the data plane reads and writes, single-node or Raft;
//! - [`admin`]: operators (the admin gRPC service and the vllm-router HTTP endpoints);
//! - [`health`], [`metrics`], [`config`], [`response`] (the one HTTP error map),
//!   [`tls`] (PEM files, checked by config validation) and [`client`] (the router's own
//!   calls to engines).
//!
//! This file is the one place that wires them together.

pub mod admin;
pub mod client;
pub mod config;
pub mod dataplane;
pub mod health;
pub mod identity;
pub mod metrics;
pub mod response;
pub mod state;
pub mod telemetry;
pub mod tls;

use config::Config;
use dataplane::{Ctx, Pool};
use identity::RouterId;
use metrics::Metrics;
use router_proto::v1::admin_server::AdminServer;
use state::{ClusterState, LocalState, RoutingState, Topology};
use std::sync::Arc;
use tokio::sync::watch;

/// How long a starting peer may wait to apply what the other peers have applied before it
/// serves clients anyway.
const STARTUP_CATCH_UP: std::time::Duration = std::time::Duration::from_secs(5);

/// Binds every listener, starts the state and health tasks and serves until `shutdown`.
pub async fn run(cfg: Config, shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
    let cfg = Arc::new(cfg);
    let listener = dataplane::bind(cfg.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", cfg.listen))?;
    let metrics_listener = match cfg.metrics_listen {
        Some(a) => Some(
            dataplane::bind(a)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {a}: {e}"))?,
        ),
        None => None,
    };
    let tls = match &cfg.tls {
        Some(t) => Some(tls::acceptor(&t.cert, &t.key)?),
        None => None,
    };
    let metrics = Arc::new(Metrics::default());
    let id = RouterId::new(
        cfg.cluster
            .as_ref()
            .map(|c| (c.cluster_id.as_str(), c.node_id)),
    );
    let client = client::upstream_client(&cfg);
    let mut startup_check = None;
    let state: Arc<dyn RoutingState> = match &cfg.cluster {
        Some(c) => {
            let cs = ClusterState::start(&cfg, c, metrics.clone()).await?;
            let admin = admin::AdminService::new(
                cs.clone(),
                cfg.clone(),
                cfg.admin_token.clone(),
                cfg.cache.default_capacity_tokens,
                client.clone(),
                id.clone(),
            );
            startup_check = Some(
                cs.serve(tonic::service::Routes::new(AdminServer::new(admin)))
                    .await?,
            );
            // A restarted peer first applies what the others applied while it was down
            // (bounded), so it never routes from a stale map; clients queue meanwhile.
            let t = std::time::Instant::now();
            let (target, applied, reached) = cs.node().catch_up_on_start(STARTUP_CATCH_UP).await;
            tracing::info!(
                target,
                applied,
                reached,
                waited_ms = t.elapsed().as_millis() as u64,
                "caught up with the other peers before routing"
            );
            cs
        }
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
    let health = health::spawn(
        cfg.health.clone(),
        state.clone(),
        client.clone(),
        cfg.upstream_token.clone(),
        id.clone(),
    );
    let ctx = Arc::new(Ctx::new(cfg.clone(), state, client, metrics, health, id));
    tokio::spawn(Pool::sweeper(Arc::downgrade(&ctx.pool)));
    tracing::info!(
        listen = %cfg.listen,
        tls = cfg.tls.is_some(),
        policy = ?cfg.policy,
        upstreams = cfg.upstreams.len(),
        "router listening"
    );
    let metrics_task = metrics_listener.map(|l| {
        tokio::spawn(dataplane::serve(
            l,
            ctx.clone(),
            None,
            true,
            shutdown.clone(),
        ))
    });
    let serving = dataplane::serve(listener, ctx, tls, false, shutdown);
    // A peer that finds it lost its data stops (the error says what to do).
    let lost = async {
        match startup_check {
            Some(check) => match check.await {
                Ok(Err(e)) => e,
                _ => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = serving => {}
        e = lost => return Err(e),
    }
    if let Some(t) = metrics_task {
        let _ = t.await;
    }
    Ok(())
}
