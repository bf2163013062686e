//! The request path: read and canonicalize the body, score, send with retries before the
//! first byte, relay the response.

use super::ctx::Ctx;
use super::relay::{LoadGuard, RelayBody, Spans};
use super::upstream::Lease;
use crate::config::Config;
use crate::health::Seen;
use crate::identity::{self, RouterId};
use crate::response::{ApiError, ErrorShape, RespBody};
use crate::state::{RankState, Upstream};
use crate::telemetry::Trace;
use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use opentelemetry::trace::SpanKind;
use opentelemetry::KeyValue;
use router_core::{
    fingerprint_json, select_top, Candidate, CanonError, Endpoint, Fingerprints, Reason, RouteInput,
};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use xxhash_rust::xxh3::xxh3_64;

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

/// Initial buffer for a body that does not declare its length.
const UNSIZED_BODY: usize = 16 << 10;
/// Bodies from this size on are read into their own anonymous memory mapping, unmapped
/// when the request ends: the allocator would keep the freed memory of a large body for
/// reuse, and the process would stay as large as its largest requests.
const MAPPED_BODY: usize = 1 << 20;

/// A body in its own mapping (`len` bytes of it used).
struct Mapped {
    map: memmap2::MmapMut,
    len: usize,
}

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        &self.map[..self.len]
    }
}

/// Where a body is read to.
enum BodyBuf {
    Heap(BytesMut),
    Mapped(Mapped),
}

impl BodyBuf {
    fn with_size(size: usize) -> std::io::Result<BodyBuf> {
        Ok(if size >= MAPPED_BODY {
            BodyBuf::Mapped(Mapped {
                map: memmap2::MmapMut::map_anon(size)?,
                len: 0,
            })
        } else {
            BodyBuf::Heap(BytesMut::with_capacity(size))
        })
    }

    fn len(&self) -> usize {
        match self {
            BodyBuf::Heap(b) => b.len(),
            BodyBuf::Mapped(m) => m.len,
        }
    }

    /// Appends `data`; the caller checked it fits within `limit`. A heap buffer that
    /// grows past [`MAPPED_BODY`] moves into a mapping of `limit` bytes (address space
    /// only: pages are backed as they are written).
    fn put(&mut self, data: &[u8], limit: usize) -> std::io::Result<()> {
        if let BodyBuf::Heap(b) = self {
            if b.len() + data.len() >= MAPPED_BODY {
                let mut m = Mapped {
                    map: memmap2::MmapMut::map_anon(limit)?,
                    len: b.len(),
                };
                m.map[..b.len()].copy_from_slice(b);
                *self = BodyBuf::Mapped(m);
            }
        }
        match self {
            BodyBuf::Heap(b) => b.extend_from_slice(data),
            BodyBuf::Mapped(m) => {
                m.map[m.len..m.len + data.len()].copy_from_slice(data);
                m.len += data.len();
            }
        }
        Ok(())
    }

    fn freeze(self) -> Bytes {
        match self {
            BodyBuf::Heap(b) => b.freeze(),
            BodyBuf::Mapped(m) => Bytes::from_owner(m),
        }
    }
}

/// Reads the whole body into one buffer: sized by `content-length` when the client gives
/// it (one allocation, no copy of copies), and never past `limits.max_body_bytes`.
pub(crate) async fn read_body(
    ctx: &Ctx,
    req: Request<Incoming>,
) -> Result<(http::request::Parts, Bytes), ApiError> {
    let limit = ctx.cfg.limits.max_body_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(ApiError::body_too_large(limit));
    }
    let (parts, mut body) = req.into_parts();
    let no_memory = |e: std::io::Error| {
        ApiError::bad_request("body_read_error", format!("cannot buffer the body: {e}"))
    };
    let size = declared
        .map_or(UNSIZED_BODY, |l| l as usize)
        .min(limit as usize);
    // Made at the first frame that must be copied: a body that arrives whole in one frame
    // is kept as it came (a slice of the connection's read buffer), with no buffer at all.
    let mut buf: Option<BodyBuf> = None;
    let mut whole: Option<Bytes> = None;
    let read = async {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                ApiError::bad_request(
                    "body_read_error",
                    format!("could not read the request body: {e}"),
                )
            })?;
            if let Ok(data) = frame.into_data() {
                let fits = declared.map_or(limit, |d| d.min(limit));
                let have =
                    buf.as_ref().map_or(0, BodyBuf::len) + whole.as_ref().map_or(0, Bytes::len);
                if (have + data.len()) as u64 > fits {
                    return Err(if (have + data.len()) as u64 > limit {
                        ApiError::body_too_large(limit)
                    } else {
                        ApiError::bad_request(
                            "body_read_error",
                            "the body is longer than its content-length",
                        )
                    });
                }
                if have == 0 && data.len() as u64 == fits && data.len() < MAPPED_BODY {
                    whole = Some(data);
                    continue;
                }
                let b = match &mut buf {
                    Some(b) => b,
                    None => buf.insert(BodyBuf::with_size(size).map_err(no_memory)?),
                };
                if let Some(w) = whole.take() {
                    b.put(&w, limit as usize).map_err(no_memory)?;
                }
                b.put(&data, limit as usize).map_err(no_memory)?;
            }
        }
        Ok(())
    };
    tokio::time::timeout(Duration::from_millis(ctx.cfg.timeouts.client_body_ms), read)
        .await
        .map_err(|_| ApiError::client_timeout())??;
    let body = match (whole, buf) {
        (Some(w), _) => w,
        (None, Some(b)) => b.freeze(),
        (None, None) => Bytes::new(),
    };
    Ok((parts, body))
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

pub async fn inference(
    ctx: &Arc<Ctx>,
    req: Request<Incoming>,
    ep: Endpoint,
    trace: &Trace,
) -> Result<Response<RespBody>, ApiError> {
    let started = Instant::now();
    let (parts, body) = read_body(ctx, req).await?;
    let t_body = started.elapsed();
    trace.set(|| vec![KeyValue::new("request.bytes", body.len() as i64)]);
    let canon = trace.child("canonicalize", SpanKind::Internal, || {
        vec![KeyValue::new("format", ep.label())]
    });
    let print = fingerprint_json(ep, &body, &ctx.cfg.fingerprint).map_err(|e| {
        canon.fail(&e.to_string());
        match e {
            CanonError::Json(_) => ApiError::bad_request("invalid_json", e.to_string()),
            CanonError::TooManyValues { .. } => ApiError::too_many_values(e.to_string()),
            _ => ApiError::bad_request("invalid_request", e.to_string()),
        }
    })?;
    let fps = print.fingerprints;
    canon.set(|| {
        vec![
            KeyValue::new("chunks", fps.hashes.len() as i64),
            KeyValue::new("prompt_tokens", fps.total_tokens as i64),
            KeyValue::new("session_id", print.session_id.is_some()),
        ]
    });
    canon.end();
    trace.set(|| vec![KeyValue::new("gen_ai.request.model", print.model.clone())]);
    let session = session_of(&parts.headers, print.session_id.as_deref());
    let route_trace = trace.child("route", SpanKind::Internal, Vec::new);
    // Snapshots are read and released before any await: their guards are per-thread slots.
    let (d, order, candidates) = {
        let topo = ctx.state.topology();
        let eligible: Vec<&Arc<RankState>> = topo.ranks.iter().filter(|r| r.eligible()).collect();
        if eligible.is_empty() {
            route_trace.fail("no eligible upstream");
            return Err(ApiError::no_upstream());
        }
        let cands: Vec<Candidate> = eligible.iter().map(|r| r.candidate()).collect();
        // The rotation advances only on decisions that were ties in practice (cold prompts,
        // round robin), so a fixed number of warm turns per conversation cannot alias it.
        let tie = ctx.tie.load(Relaxed).wrapping_add(ctx.cfg.seed);
        // Only the attempts this request may make are ordered.
        let d = select_top(
            ctx.cfg.policy,
            &ctx.cfg.score,
            &RouteInput {
                fps: &fps,
                session,
                tie,
            },
            &ctx.state.view(),
            &cands,
            ctx.cfg.max_attempts as usize,
        );
        let order: Vec<Arc<RankState>> = d.order.iter().map(|i| eligible[*i].clone()).collect();
        (d, order, cands.len())
    };
    route_trace.set(|| {
        let pending = ctx.state.pending_routes();
        let label = |r: &RankState| r.label.clone();
        let mut kv = vec![
            KeyValue::new(
                "policy",
                format!("{:?}", ctx.cfg.policy).to_ascii_lowercase(),
            ),
            KeyValue::new("candidates", candidates as i64),
            KeyValue::new("rank", label(&order[0])),
            KeyValue::new("reason", d.reason.label()),
            KeyValue::new("predicted_cached_tokens", d.predicted_cached_tokens as i64),
            KeyValue::new("session_hint", session.is_some()),
            // Whether this peer's own unapplied decisions were part of the view.
            KeyValue::new("view", if pending > 0 { "overlay" } else { "applied" }),
            KeyValue::new("overlay.pending_routes", pending as i64),
        ];
        if let Some((cost, runner_up)) = d.costs {
            kv.push(KeyValue::new("cost", cost));
            if let (Some(c), Some(r)) = (runner_up, order.get(1)) {
                kv.push(KeyValue::new("runner_up.rank", label(r)));
                kv.push(KeyValue::new("runner_up.cost", c));
            }
        }
        kv
    });
    route_trace.end();
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
    let shape = match ep {
        Endpoint::Messages => ErrorShape::Anthropic,
        _ => ErrorShape::OpenAi,
    };
    let mut first = true;
    send_with_retries(
        ctx,
        &parts,
        &body,
        &order,
        started,
        trace,
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
                shape,
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
    /// How an error after the first byte is spelled in the stream.
    shape: ErrorShape,
}

/// Sends to the ranks of `order` in turn until one answers. `record`: the prompt's
/// fingerprints and session, remembered for the rank that answers with a success.
#[allow(clippy::too_many_arguments)]
async fn send_with_retries(
    ctx: &Arc<Ctx>,
    parts: &http::request::Parts,
    body: &Bytes,
    order: &[Arc<RankState>],
    started: Instant,
    trace: &Trace,
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
        let attempt = trace.child("upstream", SpanKind::Client, || {
            vec![
                KeyValue::new("attempt", i as i64 + 1),
                KeyValue::new("rank", rank.label.clone()),
                KeyValue::new("server.address", up.url.clone()),
                KeyValue::new("reason", p.reason.label()),
                KeyValue::new("predicted_cached_tokens", p.predicted_cached as i64),
            ]
        });
        let mut req = upstream_request(cfg, &ctx.id, parts, up, body)?;
        // The engine's spans join this attempt's trace.
        attempt.inject(req.headers_mut());
        let failed = |outcome: &'static str| {
            attempt.set(|| vec![KeyValue::new("outcome", outcome)]);
            attempt.fail(outcome);
            attempt.end();
        };
        let guard = LoadGuard::new(rank.clone(), p.prefill);
        rank.requests.fetch_add(1, Relaxed);
        let more = i + 1 < attempts;
        let sent_at = Instant::now();
        let res = first_byte(
            ctx.pool.send(&up.authority, req),
            Duration::from_millis(cfg.timeouts.first_byte_ms),
            up,
            more,
        )
        .await;
        let (resp, lease) = match res {
            Wait::MarkedDown => {
                failed("marked_down");
                ctx.metrics.attempt_failed("marked_down", true);
                last_err = format!("{} was marked down while the request waited", up.url);
                tracing::info!(trace_id = attempt.trace_id().as_deref(), span_id = attempt.span_id().as_deref(), upstream = %up.url, "upstream marked down before the first byte; retrying elsewhere");
                continue;
            }
            Wait::TimedOut => {
                failed("timeout");
                ctx.metrics.attempt_failed("timeout", false);
                ctx.health.report(up, Seen::Failed);
                return Err(ApiError::upstream_timeout(format!(
                    "{} did not answer within {} ms",
                    up.url, cfg.timeouts.first_byte_ms
                )));
            }
            Wait::Answered(Err(e)) => {
                let kind = e.kind();
                failed(kind);
                ctx.metrics.attempt_failed(kind, more);
                ctx.health.report(up, Seen::Failed);
                last_err = format!("{}: {kind} error: {e}", up.url);
                tracing::info!(trace_id = attempt.trace_id().as_deref(), span_id = attempt.span_id().as_deref(), upstream = %up.url, kind, error = %e, retry = more, "upstream attempt failed");
                continue;
            }
            Wait::Answered(Ok(r)) => r,
        };
        let status = resp.status();
        attempt.set(|| {
            vec![
                KeyValue::new("http.response.status_code", i64::from(status.as_u16())),
                KeyValue::new("head_ms", sent_at.elapsed().as_secs_f64() * 1e3),
            ]
        });
        if status == StatusCode::BAD_GATEWAY || status == StatusCode::SERVICE_UNAVAILABLE {
            failed("status_502_503");
            ctx.metrics.attempt_failed("status_502_503", more);
            ctx.health.report(up, Seen::Failed);
            last_err = format!("{} answered {status}", up.url);
            tracing::info!(trace_id = attempt.trace_id().as_deref(), span_id = attempt.span_id().as_deref(), upstream = %up.url, %status, retry = more, "upstream refused");
            continue;
        }
        ctx.health.report(
            up,
            if status.is_server_error() {
                Seen::ServerError
            } else {
                Seen::Ok
            },
        );
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
        attempt.set(|| {
            vec![KeyValue::new(
                "outcome",
                if status.is_success() {
                    "ok"
                } else {
                    "answered"
                },
            )]
        });
        return Ok(relay(
            ctx,
            resp,
            lease,
            guard,
            started,
            rank,
            &p,
            Spans {
                request: trace.clone(),
                attempt,
            },
        ));
    }
    Err(ApiError::upstream_failed(format!(
        "all {attempts} upstream attempts failed; last: {last_err}"
    )))
}

/// How often a request waiting for its first byte checks whether its upstream was marked
/// down (by probes or by other requests' failures) meanwhile.
const DOWN_CHECK: Duration = Duration::from_millis(200);

/// How the wait for an upstream's response head ended.
enum Wait<T> {
    Answered(T),
    TimedOut,
    /// The upstream was marked down while waiting, and another candidate is left.
    MarkedDown,
}

/// Waits for `send` up to `limit`; when `can_retry`, gives up as soon as `up` is marked
/// down (checked every [`DOWN_CHECK`]: a timer tick on this thread, no lock or wakeup from
/// the health task).
async fn first_byte<T>(
    send: impl std::future::Future<Output = T>,
    limit: Duration,
    up: &Upstream,
    can_retry: bool,
) -> Wait<T> {
    let deadline = tokio::time::Instant::now() + limit;
    tokio::pin!(send);
    loop {
        let tick = deadline.min(tokio::time::Instant::now() + DOWN_CHECK);
        tokio::select! {
            r = &mut send => return Wait::Answered(r),
            _ = tokio::time::sleep_until(tick) => {
                if tokio::time::Instant::now() >= deadline {
                    return Wait::TimedOut;
                }
                if can_retry && !up.up.load(Relaxed) {
                    return Wait::MarkedDown;
                }
            }
        }
    }
}

fn upstream_request(
    cfg: &Config,
    ctx_id: &RouterId,
    parts: &http::request::Parts,
    up: &Upstream,
    body: Bytes,
) -> Result<Request<Full<Bytes>>, ApiError> {
    // Origin form: the engine serves at its root (upstream URLs carry no path).
    let uri = match parts.uri.path_and_query() {
        Some(pq) => http::Uri::from(pq.clone()),
        None => http::Uri::from_static("/"),
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
    h.append(identity::HEADER, ctx_id.header().clone());
    if let Some(peer) = ctx_id.peer() {
        h.insert(identity::PEER_HEADER, peer.clone());
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        h.insert(identity::ROUTED_AT_HEADER, HeaderValue::from(ms));
    }
    if let Some(t) = &cfg.upstream_token {
        if let Ok(v) = HeaderValue::from_str(&format!("Bearer {t}")) {
            h.insert(header::AUTHORIZATION, v);
        }
    }
    b.body(Full::new(body)).map_err(|e| {
        ApiError::bad_request("invalid_request", format!("cannot forward request: {e}"))
    })
}

#[allow(clippy::too_many_arguments)]
fn relay(
    ctx: &Arc<Ctx>,
    resp: Response<Incoming>,
    lease: Lease,
    guard: LoadGuard,
    started: Instant,
    rank: &RankState,
    plan: &Plan,
    spans: Spans,
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
    parts.headers.insert(
        "x-router-reason",
        HeaderValue::from_static(plan.reason.label()),
    );
    let relay = RelayBody::new(
        body,
        lease,
        sse,
        Duration::from_millis(ctx.cfg.timeouts.idle_stream_ms),
        guard,
        ctx.metrics.clone(),
        started,
        plan.shape,
        spans,
    );
    Response::from_parts(parts, http_body_util::BodyExt::boxed_unsync(relay))
}

/// Other `/v1/*`: to the least-loaded healthy upstream, with the same retry rules.
pub async fn passthrough(
    ctx: &Arc<Ctx>,
    req: Request<Incoming>,
    trace: &Trace,
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
    send_with_retries(ctx, &parts, &body, &order, started, trace, None, |_| Plan {
        prefill: 0,
        reason: Reason::Load,
        predicted_cached: 0,
        dp_rank: None,
        shape: ErrorShape::OpenAi,
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
