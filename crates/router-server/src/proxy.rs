//! The request path: classify, authenticate, read and canonicalize the body, score, send
//! with retries before the first byte, relay the response.

use crate::body::{full, LoadGuard, RelayBody, RespBody};
use crate::config::Config;
use crate::error::ApiError;
use crate::health::HealthReporter;
use crate::metrics::{Metrics, Route, UpstreamSample};
use crate::state::RoutingState;
use crate::topology::{RankState, Upstream};
use crate::upstream::{Lease, Pool};
use crate::UpstreamClient;
use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use router_core::{
    ct_eq, fingerprint_json, select, Candidate, CanonError, Endpoint, Fingerprints, Reason,
    RouteInput,
};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use xxhash_rust::xxh3::xxh3_64;

/// Shared by every connection.
pub struct Ctx {
    /// Validated config.
    pub cfg: Arc<Config>,
    /// Routing state.
    pub state: Arc<dyn RoutingState>,
    /// Pooled upstream client (health probes, `/v1/models`).
    pub client: UpstreamClient,
    /// This thread's upstream connections for proxied requests.
    pub pool: Arc<Pool>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Passive health reports.
    pub health: HealthReporter,
    /// Tie-break rotation counter (shared by every data-plane thread).
    pub tie: Arc<AtomicU64>,
}

impl Ctx {
    /// The same context with its own upstream connection pool, for one data-plane thread
    /// (a pool's connections are driven by the runtime that opened them; the shared client
    /// serves only the main runtime's probes and `/v1/models`).
    pub fn for_worker(&self) -> Ctx {
        Ctx {
            cfg: self.cfg.clone(),
            state: self.state.clone(),
            client: self.client.clone(),
            pool: Pool::new(crate::pool_config(&self.cfg)),
            metrics: self.metrics.clone(),
            health: self.health.clone(),
            tie: self.tie.clone(),
        }
    }
}

/// Headers that describe one hop, never forwarded.
const HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

fn is_hop(name: &header::HeaderName) -> bool {
    HOP.contains(&name.as_str()) || name == header::TRANSFER_ENCODING
}

/// Entry point for every client request.
pub async fn handle(
    ctx: Arc<Ctx>,
    req: Request<Incoming>,
    metrics_only: bool,
) -> Response<RespBody> {
    let path = req.uri().path().to_owned();
    let route = match path.as_str() {
        "/v1/chat/completions" => Route::Chat,
        "/v1/completions" => Route::Completions,
        "/v1/responses" => Route::Responses,
        "/v1/messages" => Route::Messages,
        "/v1/models" => Route::Models,
        "/health" => Route::Health,
        "/metrics" => Route::Metrics,
        "/add_worker" | "/remove_worker" | "/list_workers" => Route::Admin,
        p if p.starts_with("/v1/") => Route::Passthrough,
        _ => Route::Other,
    };
    let resp = match dispatch(&ctx, req, route, &path, metrics_only).await {
        Ok(r) => r,
        Err(e) => {
            if e.status.is_server_error() {
                tracing::warn!(%path, status = e.status.as_u16(), message = %e.message, "request failed");
            } else {
                tracing::debug!(%path, status = e.status.as_u16(), message = %e.message, "request rejected");
            }
            e.into_response()
        }
    };
    ctx.metrics.request(route, resp.status().as_u16());
    resp
}

async fn dispatch(
    ctx: &Arc<Ctx>,
    req: Request<Incoming>,
    route: Route,
    path: &str,
    metrics_only: bool,
) -> Result<Response<RespBody>, ApiError> {
    check_header_size(req.headers(), req.uri(), ctx.cfg.limits.max_header_bytes)?;
    match route {
        Route::Health => return Ok(health(ctx).await),
        Route::Metrics => return Ok(metrics(ctx)),
        _ if metrics_only => return Err(ApiError::not_found(path)),
        Route::Admin => return crate::admin::http(ctx, req, path).await,
        _ => {}
    }
    authorize(ctx, req.headers())?;
    match route {
        Route::Chat | Route::Completions | Route::Responses | Route::Messages => {
            if req.method() != Method::POST {
                return Err(ApiError::method_not_allowed(req.method(), path));
            }
            let ep = Endpoint::from_path(path).ok_or_else(|| ApiError::not_found(path))?;
            inference(ctx, req, ep).await
        }
        Route::Models => {
            if req.method() != Method::GET {
                return Err(ApiError::method_not_allowed(req.method(), path));
            }
            models(ctx).await
        }
        Route::Passthrough => passthrough(ctx, req).await,
        _ => Err(ApiError::not_found(path)),
    }
}

fn check_header_size(h: &HeaderMap, uri: &http::Uri, limit: u64) -> Result<(), ApiError> {
    // The request target as sent (origin form, or absolute form with scheme and authority).
    let target = uri.path_and_query().map_or(1, |p| p.as_str().len())
        + uri.authority().map_or(0, |a| a.as_str().len() + 3)
        + uri.scheme_str().map_or(0, str::len);
    let size: usize = target
        + h.iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 4)
            .sum::<usize>();
    if size as u64 > limit {
        return Err(ApiError::headers_too_large(limit));
    }
    Ok(())
}

fn authorize(ctx: &Ctx, h: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &ctx.cfg.api_key else {
        return Ok(());
    };
    let presented = h
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .or_else(|| h.get("x-api-key").and_then(|v| v.to_str().ok()))
        .map(str::trim);
    match presented {
        Some(p) if ct_eq(p.as_bytes(), key.as_bytes()) => Ok(()),
        _ => Err(ApiError::unauthorized()),
    }
}

async fn read_body(
    ctx: &Ctx,
    req: Request<Incoming>,
) -> Result<(http::request::Parts, Bytes), ApiError> {
    let limit = ctx.cfg.limits.max_body_bytes;
    if let Some(len) = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > limit {
            return Err(ApiError::body_too_large(limit));
        }
    }
    let (parts, body) = req.into_parts();
    let collected = tokio::time::timeout(
        Duration::from_millis(ctx.cfg.timeouts.client_body_ms),
        Limited::new(body, limit as usize).collect(),
    )
    .await
    .map_err(|_| ApiError::client_timeout())?;
    match collected {
        Ok(c) => Ok((parts, c.to_bytes())),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(ApiError::body_too_large(limit))
        }
        Err(e) => Err(ApiError::bad_request(
            "body_read_error",
            format!("could not read the request body: {e}"),
        )),
    }
}

/// Puts `"routed_dp_rank": dp` last in the top-level object, so it wins over any value the
/// client sent (JSON parsers keep the last duplicate).
pub fn with_dp_rank(body: &[u8], dp: u32) -> Bytes {
    let Some(end) = body.iter().rposition(|b| *b == b'}') else {
        return Bytes::copy_from_slice(body);
    };
    let before = &body[..end];
    let empty = before
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .is_some_and(|i| before[i] == b'{');
    let field = format!("{}\"routed_dp_rank\":{dp}", if empty { "" } else { "," });
    let mut out = Vec::with_capacity(body.len() + field.len());
    out.extend_from_slice(before);
    out.extend_from_slice(field.as_bytes());
    out.extend_from_slice(&body[end..]);
    Bytes::from(out)
}

fn session_of(h: &HeaderMap, body_sid: Option<&str>) -> Option<u64> {
    h.get("x-session-id")
        .and_then(|v| v.to_str().ok())
        .filter(|s| !s.is_empty())
        .or(body_sid)
        .map(|s| xxh3_64(s.as_bytes()))
}

async fn inference(
    ctx: &Arc<Ctx>,
    req: Request<Incoming>,
    ep: Endpoint,
) -> Result<Response<RespBody>, ApiError> {
    let started = Instant::now();
    let (parts, body) = read_body(ctx, req).await?;
    let t_body = started.elapsed();
    let print = fingerprint_json(ep, &body, &ctx.cfg.fingerprint).map_err(|e| match e {
        CanonError::Json(_) => ApiError::bad_request("invalid_json", e.to_string()),
        _ => ApiError::bad_request("invalid_request", e.to_string()),
    })?;
    let fps = print.fingerprints;
    let session = session_of(&parts.headers, print.session_id.as_deref());
    // Snapshots are read and released before any await: their guards are per-thread slots.
    let (d, order) = {
        let topo = ctx.state.topology();
        let eligible: Vec<&Arc<RankState>> = topo.ranks.iter().filter(|r| r.eligible()).collect();
        if eligible.is_empty() {
            return Err(ApiError::no_upstream());
        }
        let cands: Vec<Candidate> = eligible.iter().map(|r| r.candidate()).collect();
        // The rotation advances only on decisions that were ties in practice (cold prompts,
        // round robin), so a fixed number of warm turns per conversation cannot alias it.
        let tie = ctx.tie.load(Relaxed).wrapping_add(ctx.cfg.seed);
        let d = select(
            ctx.cfg.policy,
            &ctx.cfg.score,
            &RouteInput {
                fps: &fps,
                session,
                tie,
            },
            &ctx.state.view(),
            &cands,
        );
        let order: Vec<Arc<RankState>> = d.order.iter().map(|i| eligible[*i].clone()).collect();
        (d, order)
    };
    if matches!(
        d.reason,
        Reason::Cold | Reason::RoundRobin | Reason::Fallback | Reason::Load
    ) {
        ctx.tie.fetch_add(1, Relaxed);
    }
    tracing::trace!(
        body_us = t_body.as_micros() as u64,
        decide_us = (started.elapsed() - t_body).as_micros() as u64,
        bytes = body.len(),
        "routed"
    );
    let total = fps.total_tokens;
    let mut first = true;
    send_with_retries(
        ctx,
        &parts,
        &body,
        &order,
        started,
        Some((fps, session)),
        |rank| {
            let cached = if first { d.predicted_cached_tokens } else { 0 };
            let reason = if first { d.reason } else { Reason::Fallback };
            first = false;
            Plan {
                prefill: total.saturating_sub(cached),
                reason,
                predicted_cached: cached,
                dp_rank: rank.dp_rank,
            }
        },
    )
    .await
}

/// What to do with one attempt.
struct Plan {
    prefill: u64,
    reason: Reason,
    predicted_cached: u64,
    dp_rank: Option<u32>,
}

/// Sends to the ranks of `order` in turn until one answers. `record`: the prompt's
/// fingerprints and session, remembered for the rank that answers with a success.
async fn send_with_retries(
    ctx: &Arc<Ctx>,
    parts: &http::request::Parts,
    body: &Bytes,
    order: &[Arc<RankState>],
    started: Instant,
    mut record: Option<(Fingerprints, Option<u64>)>,
    mut plan: impl FnMut(&RankState) -> Plan,
) -> Result<Response<RespBody>, ApiError> {
    let cfg = &ctx.cfg;
    let attempts = order.len().min(cfg.max_attempts as usize);
    let mut last_err = String::from("no attempt made");
    for (i, rank) in order.iter().take(attempts).enumerate() {
        let p = plan(rank);
        let up = &rank.upstream;
        let body = match p.dp_rank {
            Some(dp) => with_dp_rank(body, dp),
            None => body.clone(),
        };
        let req = upstream_request(cfg, parts, up, body)?;
        let guard = LoadGuard::new(rank.clone(), p.prefill);
        rank.requests.fetch_add(1, Relaxed);
        let more = i + 1 < attempts;
        let res = tokio::time::timeout(
            Duration::from_millis(cfg.timeouts.first_byte_ms),
            ctx.pool.send(&up.authority, req),
        )
        .await;
        let (resp, lease) = match res {
            Err(_) => {
                ctx.metrics.attempt_failed("timeout", false);
                ctx.health.report(up, false);
                return Err(ApiError::upstream_timeout(format!(
                    "{} did not answer within {} ms",
                    up.url, cfg.timeouts.first_byte_ms
                )));
            }
            Ok(Err(e)) => {
                let kind = e.kind();
                ctx.metrics.attempt_failed(kind, more);
                ctx.health.report(up, false);
                last_err = format!("{}: {kind} error: {e}", up.url);
                tracing::info!(upstream = %up.url, kind, error = %e, retry = more, "upstream attempt failed");
                continue;
            }
            Ok(Ok(r)) => r,
        };
        let status = resp.status();
        if status == StatusCode::BAD_GATEWAY || status == StatusCode::SERVICE_UNAVAILABLE {
            ctx.metrics.attempt_failed("status_502_503", more);
            ctx.health.report(up, false);
            last_err = format!("{} answered {status}", up.url);
            tracing::info!(upstream = %up.url, %status, retry = more, "upstream refused");
            continue;
        }
        ctx.health.report(up, true);
        if status.is_success() {
            if let Some((fps, session)) = record.take() {
                ctx.metrics
                    .decision(p.reason, p.predicted_cached, fps.total_tokens);
                ctx.state.record(router_core::Route {
                    rank: rank.id,
                    hashes: fps.hashes,
                    chunk_tokens: fps.chunk_tokens,
                    session,
                });
            }
        }
        return Ok(relay(ctx, resp, lease, guard, started, rank, p.reason));
    }
    Err(ApiError::upstream_failed(format!(
        "all {attempts} upstream attempts failed; last: {last_err}"
    )))
}

fn upstream_request(
    cfg: &Config,
    parts: &http::request::Parts,
    up: &Upstream,
    body: Bytes,
) -> Result<Request<Full<Bytes>>, ApiError> {
    let uri = match (up.base.is_empty(), parts.uri.path_and_query()) {
        (true, Some(pq)) => http::Uri::from(pq.clone()),
        (_, pq) => format!("{}{}", up.base, pq.map_or("/", |p| p.as_str()))
            .parse()
            .map_err(|e| {
                ApiError::bad_request("invalid_request", format!("cannot forward request: {e}"))
            })?,
    };
    let mut b = Request::builder().method(parts.method.clone()).uri(uri);
    let h = b
        .headers_mut()
        .ok_or_else(|| ApiError::bad_request("invalid_request", "bad request line"))?;
    for (k, v) in parts.headers.iter() {
        if is_hop(k) || k == header::HOST || k == header::CONTENT_LENGTH {
            continue;
        }
        // The router's own key is not the engine's business.
        if cfg.api_key.is_some() && (k == header::AUTHORIZATION || k.as_str() == "x-api-key") {
            continue;
        }
        if cfg.upstream_token.is_some() && k == header::AUTHORIZATION {
            continue;
        }
        h.append(k.clone(), v.clone());
    }
    h.insert(header::HOST, up.host.clone());
    if let Some(t) = &cfg.upstream_token {
        if let Ok(v) = HeaderValue::from_str(&format!("Bearer {t}")) {
            h.insert(header::AUTHORIZATION, v);
        }
    }
    b.body(Full::new(body)).map_err(|e| {
        ApiError::bad_request("invalid_request", format!("cannot forward request: {e}"))
    })
}

fn relay(
    ctx: &Arc<Ctx>,
    resp: Response<Incoming>,
    lease: Lease,
    guard: LoadGuard,
    started: Instant,
    rank: &RankState,
    reason: Reason,
) -> Response<RespBody> {
    let (mut parts, body) = resp.into_parts();
    let sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let hop: Vec<header::HeaderName> = parts
        .headers
        .keys()
        .filter(|k| is_hop(k))
        .cloned()
        .collect();
    for k in hop {
        parts.headers.remove(k);
    }
    if sse {
        // The relay may append an error event: the upstream's length would then be wrong.
        parts.headers.remove(header::CONTENT_LENGTH);
    }
    parts
        .headers
        .insert("x-router-upstream", rank.upstream.url_header.clone());
    parts
        .headers
        .insert("x-router-rank", rank.label_header.clone());
    parts
        .headers
        .insert("x-router-reason", HeaderValue::from_static(reason.label()));
    let relay = RelayBody::new(
        body,
        lease,
        sse,
        Duration::from_millis(ctx.cfg.timeouts.idle_stream_ms),
        guard,
        ctx.metrics.clone(),
        started,
    );
    Response::from_parts(parts, http_body_util::BodyExt::boxed_unsync(relay))
}

/// A JSON response with `status`.
pub fn json_response(status: StatusCode, v: &serde_json::Value) -> Response<RespBody> {
    let mut r = Response::new(full(serde_json::to_vec(v).unwrap_or_default()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

async fn health(ctx: &Ctx) -> Response<RespBody> {
    let topo = ctx.state.topology();
    let total = topo.upstreams.len();
    let up = topo.upstreams.iter().filter(|u| u.up.load(Relaxed)).count();
    let (status, code) = if total > 0 && up == total {
        ("ok", StatusCode::OK)
    } else if up > 0 {
        ("degraded", StatusCode::OK)
    } else {
        ("unavailable", StatusCode::SERVICE_UNAVAILABLE)
    };
    let ups: Vec<serde_json::Value> = topo
        .upstreams
        .iter()
        .map(|u| {
            let inflight: u64 = topo.ranks_of(u).map(|r| r.inflight.load(Relaxed)).sum();
            serde_json::json!({"url": &*u.url, "up": u.up.load(Relaxed), "accepting": u.accepting.load(Relaxed), "inflight": inflight})
        })
        .collect();
    let mut body = serde_json::json!({"status": status, "upstreams_up": up, "upstreams_total": total, "upstreams": ups});
    if let Some(c) = ctx.state.cluster_status().await {
        body["cluster"] = c;
    }
    json_response(code, &body)
}

fn metrics(ctx: &Ctx) -> Response<RespBody> {
    let topo = ctx.state.topology();
    let samples: Vec<UpstreamSample> = topo
        .upstreams
        .iter()
        .map(|u| {
            let mut s = UpstreamSample {
                url: u.url.to_string(),
                up: u.up.load(Relaxed),
                inflight: 0,
                queued_prefill: 0,
                decodes: 0,
                requests: 0,
            };
            for r in topo.ranks_of(u) {
                s.inflight += r.inflight.load(Relaxed);
                s.queued_prefill += r.queued_prefill.load(Relaxed);
                s.decodes += r.decodes.load(Relaxed);
                s.requests += r.requests.load(Relaxed);
            }
            s
        })
        .collect();
    let mut extra = String::new();
    ctx.state.render_metrics(&mut extra);
    let text = ctx
        .metrics
        .render(&samples, &ctx.state.index_stats(), &extra);
    let mut r = Response::new(full(text));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

/// `GET /v1/models`: the union of every healthy upstream's list, by model id.
async fn models(ctx: &Arc<Ctx>) -> Result<Response<RespBody>, ApiError> {
    let topo = ctx.state.topology();
    let ups: Vec<_> = topo
        .upstreams
        .iter()
        .filter(|u| u.up.load(Relaxed))
        .cloned()
        .collect();
    if ups.is_empty() {
        return Err(ApiError::no_upstream());
    }
    let timeout = Duration::from_millis(ctx.cfg.health.timeout_ms.max(ctx.cfg.timeouts.connect_ms));
    let futs = ups.iter().map(|u| {
        let uri = format!("http://{}{}/v1/models", u.authority, u.base);
        let client = ctx.client.clone();
        let token = ctx.cfg.upstream_token.clone();
        async move {
            let mut b = Request::get(uri);
            if let Some(t) = token {
                b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
            }
            let req = b.body(Full::new(Bytes::new())).ok()?;
            let resp = tokio::time::timeout(timeout, client.request(req))
                .await
                .ok()?
                .ok()?;
            if !resp.status().is_success() {
                return None;
            }
            let bytes =
                tokio::time::timeout(timeout, Limited::new(resp.into_body(), 8 << 20).collect())
                    .await
                    .ok()?
                    .ok()?
                    .to_bytes();
            serde_json::from_slice::<serde_json::Value>(&bytes).ok()
        }
    });
    let lists = futures_util::future::join_all(futs).await;
    let mut seen = std::collections::BTreeMap::new();
    let mut answered = 0;
    for l in lists.into_iter().flatten() {
        answered += 1;
        if let Some(data) = l.get("data").and_then(|d| d.as_array()) {
            for m in data {
                if let Some(id) = m.get("id").and_then(|i| i.as_str()) {
                    seen.entry(id.to_owned()).or_insert_with(|| m.clone());
                }
            }
        }
    }
    if answered == 0 {
        return Err(ApiError::upstream_failed("no upstream answered /v1/models"));
    }
    let data: Vec<serde_json::Value> = seen.into_values().collect();
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({"object": "list", "data": data}),
    ))
}

/// Other `/v1/*`: to the least-loaded healthy upstream, with the same retry rules.
async fn passthrough(
    ctx: &Arc<Ctx>,
    req: Request<Incoming>,
) -> Result<Response<RespBody>, ApiError> {
    let started = Instant::now();
    let (parts, body) = read_body(ctx, req).await?;
    let topo = ctx.state.topology();
    let mut ups: Vec<(u64, Arc<RankState>)> = topo
        .upstreams
        .iter()
        .filter_map(|u| {
            let first = topo.ranks_of(u).next()?.clone();
            first.eligible().then(|| {
                (
                    topo.ranks_of(u).map(|r| r.inflight.load(Relaxed)).sum(),
                    first,
                )
            })
        })
        .collect();
    if ups.is_empty() {
        return Err(ApiError::no_upstream());
    }
    ups.sort_by_key(|(load, r)| (*load, r.id));
    let order: Vec<Arc<RankState>> = ups.into_iter().map(|(_, r)| r).collect();
    send_with_retries(ctx, &parts, &body, &order, started, None, |_| Plan {
        prefill: 0,
        reason: Reason::Load,
        predicted_cached: 0,
        dp_rank: None,
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dp_rank_goes_last() {
        assert_eq!(
            &with_dp_rank(br#"{"a":1}"#, 3)[..],
            br#"{"a":1,"routed_dp_rank":3}"#
        );
        assert_eq!(&with_dp_rank(b"{ }\n", 0)[..], b"{ \"routed_dp_rank\":0}\n");
        let v: serde_json::Value =
            serde_json::from_slice(&with_dp_rank(br#"{"routed_dp_rank":9,"x":{"y":2}}"#, 1))
                .unwrap();
        assert_eq!(v["routed_dp_rank"], 1);
    }
}
