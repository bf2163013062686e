//! `routerctl explain` and `POST /admin/explain`: the decision this router would make for a
//! request body now, without sending it anywhere. Reads the same snapshots the data plane
//! reads and runs the same pure selection, so what it says is what a request would get
//! (load moves on, so a request a moment later may see other loads).

use super::error::AdminError;
use crate::config::Config;
use crate::state::RoutingState;
use router_core::{canonicalize_json, explain, select, Candidate, Endpoint, Policy, RouteInput};
use serde_json::{json, Value};
use xxhash_rust::xxh3::xxh3_64;

/// The endpoint a body is for, by name (`chat`, `completions`, `messages`, `responses`).
pub fn endpoint_named(name: &str) -> Result<Endpoint, AdminError> {
    match name {
        "" | "chat" | "/v1/chat/completions" => Ok(Endpoint::Chat),
        "completions" | "/v1/completions" => Ok(Endpoint::Completions),
        "messages" | "/v1/messages" => Ok(Endpoint::Messages),
        "responses" | "/v1/responses" => Ok(Endpoint::Responses),
        other => Err(AdminError::InvalidRequest(format!(
            "endpoint '{other}': one of chat, completions, messages, responses"
        ))),
    }
}

/// The decision for `body` as JSON. `session`: an `x-session-id` the request would carry.
pub fn decision(
    state: &dyn RoutingState,
    cfg: &Config,
    endpoint: Endpoint,
    body: &[u8],
    session: Option<&str>,
) -> Result<Value, AdminError> {
    let bad = |e: router_core::CanonError| AdminError::InvalidRequest(e.to_string());
    // One pass for both the canonical length and the fingerprints (what the data plane's
    // fingerprint_json computes without keeping the bytes).
    let canonical = canonicalize_json(endpoint, body).map_err(bad)?;
    let fps = cfg
        .fingerprint
        .fingerprint(&canonical.model, &canonical.bytes);
    let sid = session
        .filter(|s| !s.is_empty())
        .or(canonical.session_id.as_deref());
    let input = RouteInput {
        fps: &fps,
        session: sid.map(|s| xxh3_64(s.as_bytes())),
        tie: cfg.seed,
    };
    let topo = state.topology();
    let view = state.view();
    let eligible: Vec<_> = topo.ranks.iter().filter(|r| r.eligible()).collect();
    let cands: Vec<Candidate> = eligible.iter().map(|r| r.candidate()).collect();
    let ineligible: Vec<Value> = topo
        .ranks
        .iter()
        .filter(|r| !r.eligible())
        .map(|r| {
            let why = if !r.upstream.up.load(std::sync::atomic::Ordering::Relaxed) {
                "down"
            } else {
                "draining"
            };
            json!({"rank": r.id, "url": &*r.upstream.url, "why": why})
        })
        .collect();
    let head = json!({
        "model": canonical.model,
        "endpoint": format!("{endpoint:?}").to_ascii_lowercase(),
        "policy": format!("{:?}", cfg.policy).to_ascii_lowercase(),
        "canonical_bytes": canonical.bytes.len(),
        "prompt_tokens": fps.total_tokens,
        "chunks": fps.hashes.len(),
        "session": sid,
        "ineligible": ineligible,
    });
    if cands.is_empty() {
        let mut v = head;
        v["winner"] = Value::Null;
        v["why"] = json!("no server is up and accepting new requests");
        v["candidates"] = json!([]);
        return Ok(v);
    }
    let d = select(cfg.policy, &cfg.score, &input, &view, &cands);
    let scored = explain(&cfg.score, &input, &view, &cands);
    let cost_of = |i: usize| scored.iter().find(|s| s.index == i);
    let rows: Vec<Value> = d
        .order
        .iter()
        .enumerate()
        .map(|(place, &i)| {
            let r = eligible[i];
            let c = &cands[i];
            let s = cost_of(i);
            json!({
                "place": place + 1,
                "rank": r.id,
                "url": &*r.upstream.url,
                "dp_rank": r.dp_rank,
                "matched_chunks": s.map(|s| s.matched_chunks),
                "predicted_cached_tokens": s.map(|s| s.cached_tokens),
                "queued_prefill": c.queued_prefill,
                "decodes": c.decodes,
                "weight": c.weight,
                "load": s.map(|s| s.load),
                "excess_load": s.map(|s| s.excess_load),
                "cost": s.map(|s| s.cost),
                "session_hint": s.is_some_and(|s| s.hinted),
            })
        })
        .collect();
    let w = eligible[d.order[0]];
    let why = match d.reason {
        router_core::Reason::PrefixHit => format!(
            "it holds the longest cached prefix ({} of {} chunks) at an acceptable load",
            d.matched_chunks,
            fps.hashes.len()
        ),
        router_core::Reason::Cold => {
            "no rank holds any of the prompt: the least loaded one (ties rotate)".to_owned()
        }
        router_core::Reason::Load => {
            "another rank holds more of the prompt, but its load costs more than re-reading it here"
                .to_owned()
        }
        router_core::Reason::Session => "the session's rank (session hint)".to_owned(),
        router_core::Reason::Fallback => "no prefix or session to go on: by load".to_owned(),
        router_core::Reason::RoundRobin => "round robin".to_owned(),
    };
    let mut v = head;
    v["winner"] = json!({"rank": w.id, "url": &*w.upstream.url, "dp_rank": w.dp_rank,
        "reason": d.reason.label(), "predicted_cached_tokens": d.predicted_cached_tokens});
    v["why"] = json!(if cfg.policy == Policy::Prefix {
        why
    } else {
        format!("policy {:?}", cfg.policy).to_ascii_lowercase()
    });
    v["candidates"] = json!(rows);
    Ok(v)
}
