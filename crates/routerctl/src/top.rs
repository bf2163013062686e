//! `routerctl top`: a live view of one peer's data plane (each rank's health, load,
//! traffic, cached share and modelled cache fill; routing decisions per second by reason)
//! and of every peer's Raft position. Rates come from two snapshots of cumulative counters.

use router_proto::v1::admin_client::AdminClient;
use router_proto::v1::{Empty, PeerInfo, PeerStatusRequest, RankTop, StatusReply, TopReply};
use serde_json::json;
use std::fmt::Write as _;
use tonic::transport::Channel;

/// One reading: the data plane's counters, this peer's status and every peer's.
pub struct Reading {
    pub top: TopReply,
    pub me: StatusReply,
    /// (node id, address, voter, its status or why it did not answer).
    pub peers: Vec<(u64, String, bool, Result<StatusReply, String>)>,
}

/// Reads everything once.
pub async fn read(c: &mut AdminClient<Channel>, conn: &crate::Conn) -> anyhow::Result<Reading> {
    let top = c.top(conn.req(Empty {})?).await?.into_inner();
    let me = c.status(conn.req(Empty {})?).await?.into_inner();
    let peers = peer_statuses(c, conn, &me)
        .await?
        .into_iter()
        .map(|(p, s)| (p.node_id, p.addr, p.voter, s))
        .collect();
    Ok(Reading { top, me, peers })
}

/// Every member's own status, asked through the peer that answered `me` (peer addresses
/// may resolve only on the peers' network); an unreachable one is reported as such.
pub async fn peer_statuses(
    c: &mut AdminClient<Channel>,
    conn: &crate::Conn,
    me: &StatusReply,
) -> anyhow::Result<Vec<(PeerInfo, Result<StatusReply, String>)>> {
    let mut out = Vec::new();
    for p in &me.peers {
        let s = if p.node_id == me.node_id {
            Ok(me.clone())
        } else {
            c.peer_status(conn.req(PeerStatusRequest { node_id: p.node_id })?)
                .await
                .map(|r| r.into_inner())
                .map_err(|e| e.message().to_owned())
        };
        out.push((p.clone(), s));
    }
    Ok(out)
}

/// Per-second rates of one rank between two readings.
struct RankRates {
    requests_per_s: f64,
    /// Cached share of prompt tokens in the interval (cumulative when nothing was served).
    cached_share: Option<f64>,
}

fn rates(prev: Option<&RankTop>, cur: &RankTop, secs: f64) -> RankRates {
    let d = |a: u64, b: u64| a.saturating_sub(b) as f64;
    match prev {
        Some(p) => {
            let prompt = d(cur.prompt_tokens, p.prompt_tokens);
            RankRates {
                requests_per_s: d(cur.requests, p.requests) / secs,
                cached_share: if prompt > 0.0 {
                    Some(d(cur.cached_tokens, p.cached_tokens) / prompt)
                } else {
                    share(cur)
                },
            }
        }
        None => RankRates {
            requests_per_s: 0.0,
            cached_share: share(cur),
        },
    }
}

fn share(r: &RankTop) -> Option<f64> {
    (r.prompt_tokens > 0).then(|| r.cached_tokens as f64 / r.prompt_tokens as f64)
}

fn fill(r: &RankTop) -> Option<f64> {
    (r.capacity_tokens > 0).then(|| r.model_tokens as f64 / r.capacity_tokens as f64)
}

fn interval(prev: &Reading, cur: &Reading) -> f64 {
    (cur.top.at_ms.saturating_sub(prev.top.at_ms) as f64 / 1e3).max(1e-3)
}

/// Decisions per second by reason, and their total.
fn decision_rates(prev: &Reading, cur: &Reading) -> (f64, Vec<(String, f64)>) {
    let secs = interval(prev, cur);
    let by: Vec<(String, f64)> = cur
        .top
        .decisions
        .iter()
        .map(|d| {
            let before = prev
                .top
                .decisions
                .iter()
                .find(|p| p.reason == d.reason)
                .map_or(0, |p| p.decisions);
            (
                d.reason.clone(),
                d.decisions.saturating_sub(before) as f64 / secs,
            )
        })
        .collect();
    (by.iter().map(|(_, r)| r).sum(), by)
}

/// Highest log position any peer reported: lag is measured from it.
fn head(cur: &Reading) -> u64 {
    cur.peers
        .iter()
        .filter_map(|(_, _, _, s)| s.as_ref().ok())
        .map(|s| s.commit_index.max(s.last_log_index))
        .max()
        .unwrap_or(cur.me.commit_index)
}

/// The frame as text.
pub fn text(prev: &Reading, cur: &Reading) -> String {
    let secs = interval(prev, cur);
    let mut o = String::new();
    let (total, by) = decision_rates(prev, cur);
    let _ = writeln!(
        o,
        "router peer {} (term {}, leader {}) over {:.1} s",
        cur.me.node_id,
        cur.me.term,
        if cur.me.leader == 0 {
            "none".to_owned()
        } else {
            cur.me.leader.to_string()
        },
        secs
    );
    let split: Vec<String> = by
        .iter()
        .filter(|(_, r)| *r > 0.0)
        .map(|(reason, r)| format!("{reason} {:.0}%", 100.0 * r / total.max(1e-9)))
        .collect();
    let _ = writeln!(
        o,
        "decisions {total:.1}/s{}{}\n",
        if split.is_empty() { "" } else { ": " },
        split.join(", ")
    );
    let _ = writeln!(
        o,
        "{:<32} {:<8} {:>5} {:>9} {:>8} {:>8} {:>7} {:>10}",
        "rank", "health", "infl", "prefill", "decodes", "req/s", "cached", "cache fill"
    );
    for r in &cur.top.ranks {
        let p = prev.top.ranks.iter().find(|p| p.label == r.label);
        let rr = rates(p, r, secs);
        let health = match (r.up, r.draining) {
            (false, _) => "down",
            (true, true) => "draining",
            (true, false) => "up",
        };
        let _ = writeln!(
            o,
            "{:<32} {:<8} {:>5} {:>9} {:>8} {:>8.1} {:>7} {:>10}",
            r.label,
            health,
            r.inflight,
            r.queued_prefill_tokens,
            r.decodes,
            rr.requests_per_s,
            rr.cached_share
                .map_or("-".to_owned(), |s| format!("{:.1}%", 100.0 * s)),
            fill(r).map_or("-".to_owned(), |f| format!("{:.1}%", 100.0 * f)),
        );
    }
    let head = head(cur);
    let _ = writeln!(
        o,
        "\n{:<6} {:<24} {:<6} {:<10} {:>6} {:>9} {:>9} {:>6}",
        "peer", "addr", "voter", "role", "term", "commit", "applied", "lag"
    );
    for (id, addr, voter, s) in &cur.peers {
        match s {
            Ok(s) => {
                let _ = writeln!(
                    o,
                    "{:<6} {:<24} {:<6} {:<10} {:>6} {:>9} {:>9} {:>6}",
                    id,
                    addr,
                    voter,
                    s.role,
                    s.term,
                    s.commit_index,
                    s.applied_index,
                    head.saturating_sub(s.applied_index)
                );
            }
            Err(e) => {
                let _ = writeln!(o, "{id:<6} {addr:<24} {voter:<6} unreachable: {e}");
            }
        }
    }
    o
}

/// The frame as JSON.
pub fn json(prev: &Reading, cur: &Reading) -> serde_json::Value {
    let secs = interval(prev, cur);
    let (total, by) = decision_rates(prev, cur);
    let head = head(cur);
    json!({
        "node_id": cur.me.node_id,
        "term": cur.me.term,
        "leader": cur.me.leader,
        "interval_secs": secs,
        "decisions_per_s": total,
        "decisions_by_reason_per_s": by.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "ranks": cur.top.ranks.iter().map(|r| {
            let rr = rates(prev.top.ranks.iter().find(|p| p.label == r.label), r, secs);
            json!({
                "label": r.label, "url": r.url, "rank_id": r.rank_id, "up": r.up,
                "draining": r.draining, "inflight": r.inflight,
                "queued_prefill_tokens": r.queued_prefill_tokens, "decodes": r.decodes,
                "requests": r.requests, "requests_per_s": rr.requests_per_s,
                "cached_share": rr.cached_share, "model_tokens": r.model_tokens,
                "capacity_tokens": r.capacity_tokens, "cache_fill": fill(r),
            })
        }).collect::<Vec<_>>(),
        "peers": cur.peers.iter().map(|(id, addr, voter, s)| match s {
            Ok(s) => json!({"node_id": id, "addr": addr, "voter": voter, "role": s.role,
                "term": s.term, "commit_index": s.commit_index,
                "applied_index": s.applied_index,
                "lag": head.saturating_sub(s.applied_index)}),
            Err(e) => json!({"node_id": id, "addr": addr, "voter": voter, "error": e}),
        }).collect::<Vec<_>>(),
    })
}
