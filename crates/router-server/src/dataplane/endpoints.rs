//! The router's own endpoints: `/health`, `/metrics` and the `/v1/models` union.

use super::ctx::Ctx;
use crate::identity;
use crate::metrics::UpstreamSample;
use crate::response::{full, json_response, ApiError, RespBody};
use crate::state::ClusterView;
use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// `GET /health`: the verdict and counts for anyone (load balancers, probes); with
/// `detailed` (the admin token, or the metrics listener) also each upstream and the Raft
/// status. Carries this router's id, so a join of its own URL can be refused.
pub async fn health(ctx: &Ctx, detailed: bool) -> Response<RespBody> {
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
    let mut body =
        serde_json::json!({"status": status, "upstreams_up": up, "upstreams_total": total});
    if detailed {
        let ups: Vec<serde_json::Value> = topo
            .upstreams
            .iter()
            .map(|u| {
                let inflight: u64 = topo.ranks_of(u).map(|r| r.inflight.load(Relaxed)).sum();
                serde_json::json!({"url": &*u.url, "up": u.up.load(Relaxed), "accepting": u.accepting.load(Relaxed), "inflight": inflight})
            })
            .collect();
        body["upstreams"] = ups.into();
        drop(topo);
        if let Some(c) = ctx.state.cluster_status().await {
            body["cluster"] = cluster_json(&c);
        }
    }
    let mut r = json_response(code, &body);
    r.headers_mut()
        .insert(identity::HEADER, ctx.id.header().clone());
    r
}

pub fn metrics(ctx: &Ctx) -> Response<RespBody> {
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
                ejections: u.ejections.load(Relaxed),
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
    let mut text = promtext::Exposition::with_capacity(16 * 1024);
    ctx.metrics
        .render(&mut text, &samples, &ctx.state.index_stats());
    ctx.state.render_metrics(&mut text);
    crate::telemetry::render(&mut text);
    let mut r = Response::new(full(text.finish()));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

/// `GET /v1/models`: the union of every healthy upstream's list, by model id.
pub async fn models(ctx: &Arc<Ctx>) -> Result<Response<RespBody>, ApiError> {
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
        let uri = format!("http://{}/v1/models", u.authority);
        let client = ctx.client.clone();
        let token = ctx.cfg.upstream_token.clone();
        let id = ctx.id.header().clone();
        async move {
            let mut b = Request::get(uri).header(identity::HEADER, id);
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

/// The cluster section of `/health`.
fn cluster_json(v: &ClusterView) -> serde_json::Value {
    let n = &v.node;
    serde_json::json!({
        "node_id": n.id,
        "leader": n.leader,
        "role": n.role.as_str(),
        "term": n.term,
        "last_log_index": n.last_log_index,
        "commit_index": n.commit_index,
        "applied_index": v.applied_index,
        "snapshot_index": n.snapshot_index,
        "purged_index": n.purged_index,
        "snapshots_installed": v.snapshots_installed,
        "state_digest": format!("{:016x}", v.digest),
        "voters": n.members.iter().filter(|m| m.voter).map(|m| m.id).collect::<Vec<_>>(),
        "learners": n.members.iter().filter(|m| !m.voter).map(|m| m.id).collect::<Vec<_>>(),
    })
}
