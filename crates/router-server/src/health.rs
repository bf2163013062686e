//! Drives each upstream's [`HealthMachine`] from active probes and passive results, and its
//! [`Outlier`] detector from the status of its answers, and publishes the verdict (healthy
//! and not ejected) as an atomic flag that the request path reads.

use crate::client::UpstreamClient;
use crate::config::HealthConfig;
use crate::identity::{self, RouterId};
use crate::state::{RoutingState, Upstream};
use bytes::Bytes;
use http_body_util::Full;
use router_core::{HealthMachine, HealthTransition, Outlier};
use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// What one probe or request saw of an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// It answered (a probe with 2xx, a request with anything but a 5xx).
    Ok,
    /// It could not be reached, or refused (connect error, reset, timeout, 502/503).
    Failed,
    /// It answered a request with a server error (a 5xx other than 502/503): reachable,
    /// but counted by the outlier detector.
    ServerError,
}

/// One observation.
#[derive(Debug)]
pub struct Observation {
    /// Upstream URL.
    pub url: Arc<str>,
    /// What was seen.
    pub seen: Seen,
}

/// Sender half used by the proxy.
#[derive(Clone)]
pub struct HealthReporter(mpsc::Sender<Observation>);

impl HealthReporter {
    /// Reports a result; drops it if the health task is behind (probes still run). A success
    /// on an upstream with no failure or 5xx streak changes nothing and is not sent.
    pub fn report(&self, up: &Upstream, seen: Seen) {
        if seen == Seen::Ok && !up.suspect.load(Relaxed) {
            return;
        }
        if seen != Seen::Ok {
            up.suspect.store(true, Relaxed);
        }
        let _ = self.0.try_send(Observation {
            url: up.url.clone(),
            seen,
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
        let started = std::time::Instant::now();
        let now_ms = || started.elapsed().as_millis() as u64;
        let mut machines: HashMap<Arc<str>, (HealthMachine, Outlier)> = HashMap::new();
        let mut tick = tokio::time::interval(Duration::from_millis(cfg.interval_ms));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (probe_tx, mut probe_rx) = mpsc::channel::<Observation>(1024);
        loop {
            let obs = tokio::select! {
                _ = tick.tick() => {
                    // Ejections that ran out: back in rotation if healthy.
                    let topo = state.topology();
                    for up in topo.upstreams.iter() {
                        if let Some((m, o)) = machines.get(&up.url) {
                            let verdict = m.is_up() && !o.is_ejected(now_ms());
                            if verdict && !up.up.swap(true, Relaxed) {
                                tracing::info!(upstream = %up.url, "upstream back after its ejection");
                            }
                        }
                    }
                    drop(topo);
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
                            let seen = if ok { Seen::Ok } else { Seen::Failed };
                            let _ = tx.send(Observation { url, seen }).await;
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
            let (m, o) = machines
                .entry(obs.url.clone())
                .or_insert_with(|| (HealthMachine::new_up(), Outlier::default()));
            let now = now_ms();
            let transition = match obs.seen {
                Seen::Ok => {
                    o.observe(false, now, cfg.outlier);
                    m.observe(true, cfg.thresholds)
                }
                Seen::Failed => m.observe(false, cfg.thresholds),
                Seen::ServerError => {
                    if let Some(until) = o.observe(true, now, cfg.outlier) {
                        up.ejections.fetch_add(1, Relaxed);
                        tracing::warn!(
                            upstream = %obs.url,
                            consecutive_5xx = cfg.outlier.consecutive_5xx,
                            for_ms = until - now,
                            "upstream ejected: its answers are server errors"
                        );
                    }
                    None
                }
            };
            match transition {
                Some(HealthTransition::Down) => {
                    tracing::warn!(upstream = %obs.url, "upstream marked down")
                }
                Some(HealthTransition::Up) => {
                    tracing::info!(upstream = %obs.url, "upstream marked up")
                }
                None => {}
            }
            up.up.store(m.is_up() && !o.is_ejected(now), Relaxed);
            if m.is_up() && m.failure_streak() == 0 && obs.seen == Seen::Ok {
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
