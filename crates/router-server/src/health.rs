//! Drives each upstream's [`HealthMachine`] from active probes and passive results, and
//! publishes the verdict as an atomic flag that the request path reads.

use crate::client::UpstreamClient;
use crate::config::HealthConfig;
use crate::identity::{self, RouterId};
use crate::state::{RoutingState, Upstream};
use bytes::Bytes;
use http_body_util::Full;
use router_core::{HealthMachine, HealthTransition};
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// A passive observation from a real request.
#[derive(Debug)]
pub struct Observation {
    /// Upstream URL.
    pub url: Arc<str>,
    /// Whether the attempt worked.
    pub ok: bool,
}

/// Sender half used by the proxy.
#[derive(Clone)]
pub struct HealthReporter(mpsc::Sender<Observation>);

impl HealthReporter {
    /// Reports a result; drops it if the health task is behind (probes still run). A success
    /// on an upstream with no failure streak changes nothing and is not sent.
    pub fn report(&self, up: &Upstream, ok: bool) {
        if ok && !up.suspect.load(Relaxed) {
            return;
        }
        if !ok {
            up.suspect.store(true, Relaxed);
        }
        let _ = self.0.try_send(Observation {
            url: up.url.clone(),
            ok,
        });
    }
}

/// Spawns the health task.
pub fn spawn(
    cfg: HealthConfig,
    state: Arc<dyn RoutingState>,
    client: UpstreamClient,
    token: Option<String>,
    id: RouterId,
) -> HealthReporter {
    let (tx, mut rx) = mpsc::channel::<Observation>(4096);
    tokio::spawn(async move {
        let mut machines: HashMap<Arc<str>, HealthMachine> = HashMap::new();
        let mut tick = tokio::time::interval(Duration::from_millis(cfg.interval_ms));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (probe_tx, mut probe_rx) = mpsc::channel::<Observation>(1024);
        loop {
            let obs = tokio::select! {
                _ = tick.tick() => {
                    for up in state.topology().upstreams.iter() {
                        let url = up.url.clone();
                        let uri = format!("http://{}{}", up.authority, cfg.path);
                        let client = client.clone();
                        let tx = probe_tx.clone();
                        let timeout = Duration::from_millis(cfg.timeout_ms);
                        let token = token.clone();
                        let id = id.clone();
                        tokio::spawn(async move {
                            let ok = probe(&client, &uri, token.as_deref(), timeout, &id).await;
                            let _ = tx.send(Observation { url, ok }).await;
                        });
                    }
                    continue;
                }
                Some(o) = probe_rx.recv() => o,
                o = rx.recv() => match o { Some(o) => o, None => return },
            };
            let topo = state.topology();
            let Some(up) = topo.upstreams.iter().find(|u| u.url == obs.url) else {
                machines.remove(&obs.url);
                continue;
            };
            let m = machines
                .entry(obs.url.clone())
                .or_insert_with(HealthMachine::new_up);
            match m.observe(obs.ok, cfg.thresholds) {
                Some(HealthTransition::Down) => {
                    tracing::warn!(upstream = %obs.url, "upstream marked down");
                    up.up.store(false, Relaxed);
                }
                Some(HealthTransition::Up) => {
                    tracing::info!(upstream = %obs.url, "upstream marked up");
                    up.up.store(true, Relaxed);
                }
                None => {}
            }
            if m.is_up() && m.failure_streak() == 0 {
                up.suspect.store(false, Relaxed);
            }
        }
    });
    HealthReporter(tx)
}

/// One probe: healthy when the engine answers 2xx in time, and is not this router (a URL
/// that answers with this router's id is never healthy: sending it requests would loop).
async fn probe(
    client: &UpstreamClient,
    uri: &str,
    token: Option<&str>,
    timeout: Duration,
    me: &RouterId,
) -> bool {
    let mut b = http::Request::get(uri).header(identity::HEADER, me.header());
    if let Some(t) = token {
        b = b.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let Ok(req) = b.body(Full::new(Bytes::new())) else {
        return false;
    };
    match tokio::time::timeout(timeout, client.request(req)).await {
        Ok(Ok(resp)) if me.is_in(resp.headers()) => {
            tracing::warn!(%uri, "upstream is this router (or a peer of its cluster), not an engine");
            false
        }
        Ok(Ok(resp)) => resp.status().is_success(),
        _ => false,
    }
}
