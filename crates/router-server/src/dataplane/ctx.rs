//! What every connection of the data plane shares.

use super::upstream::{Pool, PoolConfig};
use crate::client::UpstreamClient;
use crate::config::Config;
use crate::health::HealthReporter;
use crate::identity::RouterId;
use crate::metrics::Metrics;
use crate::state::RoutingState;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

/// Idle upstream connections a data-plane thread keeps per engine.
const MAX_IDLE_PER_UPSTREAM: usize = 1024;

/// Shared by every connection.
pub struct Ctx {
    /// Validated config.
    pub cfg: Arc<Config>,
    /// Routing state.
    pub state: Arc<dyn RoutingState>,
    /// Pooled upstream client (`/v1/models`).
    pub client: UpstreamClient,
    /// This thread's upstream connections for proxied requests.
    pub pool: Arc<Pool>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Passive health reports.
    pub health: HealthReporter,
    /// Tie-break rotation counter (shared by every data-plane thread).
    pub tie: Arc<AtomicU64>,
    /// This router on the wire (loop detection).
    pub id: RouterId,
}

/// The data plane's upstream pool settings from config.
pub fn pool_config(cfg: &Config) -> PoolConfig {
    PoolConfig {
        connect_timeout: Duration::from_millis(cfg.timeouts.connect_ms),
        max_idle_per_upstream: MAX_IDLE_PER_UPSTREAM,
        idle_timeout: Duration::from_millis(cfg.timeouts.upstream_idle_ms),
    }
}

impl Ctx {
    /// A context for the main runtime.
    pub fn new(
        cfg: Arc<Config>,
        state: Arc<dyn RoutingState>,
        client: UpstreamClient,
        metrics: Arc<Metrics>,
        health: HealthReporter,
        id: RouterId,
    ) -> Ctx {
        Ctx {
            pool: Pool::new(pool_config(&cfg)),
            cfg,
            state,
            client,
            metrics,
            health,
            tie: Arc::new(AtomicU64::new(0)),
            id,
        }
    }

    /// The same context with its own upstream connection pool, for one data-plane thread
    /// (a pool's connections are driven by the runtime that opened them; the shared client
    /// serves only the main runtime's probes and `/v1/models`).
    pub fn for_worker(&self) -> Ctx {
        Ctx {
            cfg: self.cfg.clone(),
            state: self.state.clone(),
            client: self.client.clone(),
            pool: Pool::new(pool_config(&self.cfg)),
            metrics: self.metrics.clone(),
            health: self.health.clone(),
            tie: self.tie.clone(),
            id: self.id.clone(),
        }
    }
}
