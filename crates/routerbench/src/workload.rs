//! The seeded coding-agent workload and its report.
//!
//! Structure (which harness, which repo, how many turns, tool result sizes, gaps) comes
//! from `--seed`; a fresh salt at the head of every harness prompt keeps a run from
//! inheriting another run's cache.

use crate::rng::{text, Rng};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Workload families (see README).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Coding agents: ~30-turn tasks, 2 s tool gaps, sub-agents, compaction.
    Agent,
    /// Long trajectories with long tool gaps.
    Long,
    /// Short rollouts of a few turns.
    Short,
    /// Single-turn pass@k batches sharing a prompt.
    Batch,
    /// Agents plus bulk batch traffic.
    Mixed,
}

/// Knobs of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// Router or engine base URLs; one is picked at random per turn.
    pub urls: Vec<String>,
    /// Concurrent developers.
    pub developers: usize,
    /// Wall-clock length of the run.
    pub duration: Duration,
    /// Multiplies every prompt size (fit runs to this machine).
    pub scale: f64,
    /// Divides every think/tool gap (match the engine's speed factor).
    pub time_scale: f64,
    /// Structure seed.
    pub seed: u64,
    /// Salt for this run (fresh by default).
    pub salt: u64,
    /// Send `X-Session-ID`.
    pub session_ids: bool,
    /// Family.
    pub kind: Kind,
    /// Model name.
    pub model: String,
    /// Print a progress line every few seconds.
    pub progress: bool,
    /// Bearer token for the router.
    pub api_key: Option<String>,
    /// Resolve each URL's host name on every turn and send to one of its addresses at
    /// random, as DNS round-robin clients do (a name with several A records).
    pub resolve: bool,
    /// Tries per turn: a turn that fails before it completes (connection refused or cut,
    /// no answer head, 408/429/5xx) is sent again whole to another router.
    pub attempts: u32,
    /// The fleet's KV capacity in tokens, for the pooled oracle (0: none).
    pub pool_tokens: u64,
}

/// How long one attempt may wait for the answer's head (a paused router accepts
/// connections and never answers).
const HEAD_TIMEOUT: Duration = Duration::from_secs(20);

/// One finished turn.
#[derive(Debug, Clone, Default)]
struct Turn {
    conv: u64,
    /// A developer's own conversation (not a sub-agent's or a batch sample).
    main: bool,
    /// Turn number within the conversation.
    index: u32,
    /// The first turn after the agent compacted its context: its prompt does not extend
    /// the previous one, so it is no follow-up for stickiness.
    fresh_context: bool,
    /// Seconds from the start of the run to the start of the turn.
    at: f64,
    /// The router (URL or resolved address) that answered, or the last one tried.
    router: String,
    /// Attempts beyond the first.
    retries: u32,
    ok: bool,
    err: Option<String>,
    ttft: Option<Duration>,
    itl: Option<Duration>,
    prompt_tokens: u64,
    cached_tokens: u64,
    oracle_tokens: u64,
    pooled_tokens: u64,
    rank: Option<String>,
    /// The router's `x-router-reason` (prefix_hit, load, cold, session, ...).
    reason: Option<String>,
}

/// The report.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Report {
    /// Label of the run (policy or router).
    pub label: String,
    /// Turns completed without error.
    pub turns: u64,
    /// Turns per minute.
    pub turns_per_min: f64,
    /// Errors by kind.
    pub errors: BTreeMap<String, u64>,
    /// TTFT percentiles, seconds.
    pub ttft_p50: f64,
    /// p90.
    pub ttft_p90: f64,
    /// p99.
    pub ttft_p99: f64,
    /// Median inter-token latency, seconds.
    pub itl_p50: f64,
    /// Cached prompt tokens / prompt tokens, from the engines' usage.
    pub cached_share: f64,
    /// What an ideal router with an unbounded cache would have served from cache.
    pub oracle_share: f64,
    /// What an ideal router could serve from cache if the fleet's KV were one LRU cache
    /// (the best any placement can do once the KV is full); 0 when not measured.
    pub pooled_oracle_share: f64,
    /// Turns on the same rank as their conversation's previous turn.
    pub stickiness: f64,
    /// The same, for developers' own conversations only: sub-agents, batch samples and
    /// the first turn after a compaction (a new prompt that shares only the system
    /// prompt) excluded.
    pub main_stickiness: f64,
    /// Follow-up turns of developers' own conversations.
    pub main_follow_ups: u64,
    /// Turns sent again to another router after a failed attempt.
    pub retries: u64,
    /// Answered turns per router (URL or resolved address).
    pub per_router: BTreeMap<String, u64>,
    /// Requests on the busiest rank / mean per rank.
    pub balance_max_over_mean: f64,
    /// Ranks that served at least one turn.
    pub ranks_used: usize,
    /// Prompt tokens sent.
    pub prompt_tokens: u64,
    /// Wall seconds.
    pub seconds: f64,
    /// When the run started, seconds since the Unix epoch (turn times are relative to it).
    pub started_unix: f64,
}

struct Shared {
    params: Params,
    client: Client<HttpConnector, Full<Bytes>>,
    harness: Vec<String>,
    repos: Vec<String>,
    deadline: Instant,
    turns: Mutex<Vec<Turn>>,
    oracle: Mutex<Oracle>,
    next_conv: AtomicU64,
    done: AtomicU64,
    started: Instant,
}

/// One turn's identity, for its record.
#[derive(Clone, Copy)]
struct TurnId {
    conv: u64,
    main: bool,
    index: u32,
    fresh_context: bool,
}

/// splitmix64: spreads a counter over u64 for picking routers.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `http://host:port` split into host and port.
fn host_port(url: &str) -> Option<(String, u16)> {
    let rest = url.strip_prefix("http://")?;
    let authority = rest.split('/').next()?;
    let (host, port) = authority.rsplit_once(':')?;
    Some((host.trim_matches(['[', ']']).to_owned(), port.parse().ok()?))
}

/// Runs the workload and returns its report.
pub async fn run(params: Params, label: &str) -> anyhow::Result<Report> {
    Ok(run_turns(params, label).await?.0)
}

async fn run_turns(params: Params, label: &str) -> anyhow::Result<(Report, Vec<Turn>)> {
    let mut rng = Rng::new(params.seed);
    let scale = params.scale;
    let sz = |rng: &mut Rng, base: f64, lo: f64, hi: f64| -> usize {
        ((base * (lo + (hi - lo) * rng.f64())) * scale).max(16.0) as usize
    };
    let salt = format!("[run {:016x}] ", params.salt);
    let harness: Vec<String> = (0..3)
        .map(|_| {
            let n = sz(&mut rng, 18_000.0, 0.7, 1.3);
            format!("{salt}{}", text(&mut rng, n))
        })
        .collect();
    let repos: Vec<String> = (0..6)
        .map(|_| {
            let n = sz(&mut rng, 6_000.0, 0.8, 1.2);
            text(&mut rng, n)
        })
        .collect();
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .build(conn);
    let started = Instant::now();
    let started_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let shared = Arc::new(Shared {
        started,
        deadline: started + params.duration,
        params: params.clone(),
        client,
        harness,
        repos,
        turns: Mutex::new(Vec::new()),
        oracle: Mutex::new(Oracle::new(params.pool_tokens / BLOCK as u64)),
        next_conv: AtomicU64::new(0),
        done: AtomicU64::new(0),
    });
    let progress = params.progress.then(|| {
        let s = shared.clone();
        let label = label.to_owned();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                let t = s.turns.lock().map(|t| t.len()).unwrap_or(0);
                eprintln!(
                    "  [{label}] {:>4.0}s  {t} turns",
                    started.elapsed().as_secs_f64()
                );
            }
        })
    });
    let mut tasks = Vec::new();
    for d in 0..params.developers {
        let s = shared.clone();
        let dev_seed = params
            .seed
            .wrapping_mul(1_000_003)
            .wrapping_add(d as u64 + 1);
        let batch = match params.kind {
            Kind::Batch => true,
            Kind::Mixed => d % 2 == 1,
            _ => false,
        };
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(dev_seed);
            // Stagger starts so developers do not move in lock step.
            tokio::time::sleep(Duration::from_secs_f64(
                rng.f64() * 2.0 / s.params.time_scale,
            ))
            .await;
            if batch {
                batch_developer(&s, &mut rng).await
            } else {
                agent_developer(&s, &mut rng).await
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    if let Some(p) = progress {
        p.abort();
    }
    let mut turns = shared.turns.lock().map(|t| t.clone()).unwrap_or_default();
    turns.sort_by(|a, b| a.at.total_cmp(&b.at));
    let mut r = report(label, &turns, started.elapsed());
    r.started_unix = started_unix;
    Ok((r, turns))
}

/// Runs the workload; returns its report and every turn as a JSON object (`--turns-log`).
pub async fn run_logged(
    params: Params,
    label: &str,
) -> anyhow::Result<(Report, Vec<serde_json::Value>)> {
    let (report, turns) = run_turns(params, label).await?;
    let log = turns
        .iter()
        .map(|t| {
            serde_json::json!({"conv": t.conv, "main": t.main, "index": t.index,
                "fresh_context": t.fresh_context, "at": t.at,
                "router": t.router, "retries": t.retries, "ok": t.ok, "err": t.err,
                "rank": t.rank, "reason": t.reason, "ttft": t.ttft.map(|d| d.as_secs_f64()),
                "prompt_tokens": t.prompt_tokens, "cached_tokens": t.cached_tokens})
        })
        .collect();
    Ok((report, log))
}

fn shape(kind: Kind) -> (u64, u64, f64, f64) {
    // (min turns, max turns, median gap s, long-pause probability)
    match kind {
        Kind::Long => (60, 100, 8.0, 0.03),
        Kind::Short => (2, 5, 1.0, 0.0),
        _ => (20, 40, 2.0, 0.01),
    }
}

async fn agent_developer(s: &Arc<Shared>, rng: &mut Rng) {
    let p = &s.params;
    let (tmin, tmax, gap, pause) = shape(p.kind);
    // Past this many tokens the agent compacts its context to a short summary.
    let compact_at = (120_000.0 * p.scale) as usize;
    while Instant::now() < s.deadline {
        let h = rng.zipf(s.harness.len());
        let r = rng.zipf(s.repos.len());
        let conv = s.next_conv.fetch_add(1, Relaxed);
        let task = text(rng, (200.0 * p.scale).max(8.0) as usize);
        let mut msgs = vec![
            serde_json::json!({"role": "system", "content": s.harness[h]}),
            serde_json::json!({"role": "user", "content": format!("{}\n\nTask {conv}: {task}", s.repos[r])}),
        ];
        let turns = rng.range(tmin, tmax);
        let mut ctx_tokens = (s.harness[h].len() + s.repos[r].len()) / 4;
        let mut compacted = false;
        for t in 0..turns {
            if Instant::now() >= s.deadline {
                return;
            }
            if t > 0 && rng.chance(0.04) {
                let n = rng.range(1, 3);
                let subs: Vec<_> = (0..n)
                    .map(|i| {
                        let s = s.clone();
                        let mut sub_rng = Rng::new(rng.next_u64() ^ i);
                        let harness = h;
                        tokio::spawn(async move { sub_agent(&s, &mut sub_rng, harness).await })
                    })
                    .collect();
                for sub in subs {
                    let _ = sub.await;
                }
            }
            let out = if rng.chance(0.15) {
                rng.lognormal(900.0, 0.3)
            } else {
                rng.lognormal(120.0, 0.5)
            };
            let out = out.clamp(8.0, 2000.0) as u32;
            let id = TurnId {
                conv,
                main: true,
                index: t as u32,
                fresh_context: compacted,
            };
            compacted = false;
            let Some(reply) = turn(s, id, &msgs, out).await else {
                // A failed turn ends the task, as an agent would give up and restart.
                break;
            };
            let call_id = format!("call_{conv}_{t}");
            msgs.push(serde_json::json!({"role": "assistant", "content": reply,
                "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "bash", "arguments": format!("{{\"cmd\":\"step {t}\"}}")}}]}));
            let tool = (rng.lognormal(1500.0, 0.9).min(16_000.0) * p.scale).max(8.0) as usize;
            msgs.push(serde_json::json!({"role": "tool", "tool_call_id": call_id, "content": text(rng, tool)}));
            ctx_tokens += tool + reply.len() / 4;
            if ctx_tokens > compact_at {
                let summary = text(rng, (2_000.0 * p.scale) as usize);
                msgs.truncate(1);
                msgs.push(serde_json::json!({"role": "user", "content": format!("Summary of the work so far: {summary}")}));
                ctx_tokens = (s.harness[h].len() + summary.len()) / 4;
                compacted = true;
            }
            let g = if rng.chance(pause) {
                rng.range(30, 120) as f64
            } else {
                rng.lognormal(gap, 0.7).min(60.0)
            };
            sleep_until_or_deadline(s, Duration::from_secs_f64(g / p.time_scale)).await;
        }
    }
}

async fn sub_agent(s: &Arc<Shared>, rng: &mut Rng, harness: usize) {
    let p = &s.params;
    let conv = s.next_conv.fetch_add(1, Relaxed);
    let mut msgs = vec![
        serde_json::json!({"role": "system", "content": s.harness[harness]}),
        serde_json::json!({"role": "user", "content": format!("Sub-task {conv}: {}", text(rng, (300.0 * p.scale).max(8.0) as usize))}),
    ];
    for t in 0..rng.range(3, 8) {
        if Instant::now() >= s.deadline {
            return;
        }
        let id = TurnId {
            conv,
            main: false,
            index: t as u32,
            fresh_context: false,
        };
        let Some(reply) = turn(
            s,
            id,
            &msgs,
            rng.lognormal(80.0, 0.4).clamp(8.0, 400.0) as u32,
        )
        .await
        else {
            return;
        };
        msgs.push(serde_json::json!({"role": "assistant", "content": reply}));
        let tool = (rng.lognormal(800.0, 0.8).min(8_000.0) * p.scale).max(8.0) as usize;
        msgs.push(serde_json::json!({"role": "user", "content": format!("result {t}: {}", text(rng, tool))}));
        sleep_until_or_deadline(
            s,
            Duration::from_secs_f64(rng.lognormal(1.5, 0.6) / p.time_scale),
        )
        .await;
    }
}

/// pass@k: groups of k concurrent single-turn requests that share one prompt.
async fn batch_developer(s: &Arc<Shared>, rng: &mut Rng) {
    let p = &s.params;
    while Instant::now() < s.deadline {
        let h = rng.zipf(s.harness.len());
        let problem = text(rng, (1_500.0 * p.scale).max(8.0) as usize);
        let k = 8;
        let group: Vec<_> = (0..k)
            .map(|_| {
                let s = s.clone();
                let conv = s.next_conv.fetch_add(1, Relaxed);
                let msgs = vec![
                    serde_json::json!({"role": "system", "content": s.harness[h]}),
                    serde_json::json!({"role": "user", "content": problem.clone()}),
                ];
                let out = rng.lognormal(200.0, 0.5).clamp(8.0, 1000.0) as u32;
                let id = TurnId {
                    conv,
                    main: false,
                    index: 0,
                    fresh_context: false,
                };
                tokio::spawn(async move { turn(&s, id, &msgs, out).await })
            })
            .collect();
        for g in group {
            let _ = g.await;
        }
    }
}

async fn sleep_until_or_deadline(s: &Shared, d: Duration) {
    let until = (Instant::now() + d).min(s.deadline);
    tokio::time::sleep_until(until.into()).await;
}

/// Why an attempt failed, and whether another router may be tried.
struct Failed {
    kind: String,
    retry: bool,
}

/// A part of the answer the turn keeps.
#[derive(Default)]
struct Answer {
    reply: String,
    rank: Option<String>,
    reason: Option<String>,
    ttft: Option<Duration>,
    itl: Option<Duration>,
    prompt_tokens: u64,
    cached_tokens: u64,
}

/// The base URL (`http://addr:port`) for one attempt of a turn: one of the URLs, or with
/// `resolve` one of the addresses its name resolves to now; avoids the routers in `tried`
/// while others are left.
/// Also the Host header to send when the address was resolved from a name.
async fn pick(s: &Shared, seed: u64, tried: &[String]) -> Result<(String, Option<String>), Failed> {
    let p = &s.params;
    let fresh = |c: &Vec<String>| -> Vec<String> {
        let left: Vec<String> = c.iter().filter(|u| !tried.contains(u)).cloned().collect();
        if left.is_empty() {
            c.clone()
        } else {
            left
        }
    };
    let urls = fresh(&p.urls);
    let url = urls[(mix(seed) % urls.len() as u64) as usize].clone();
    if !p.resolve {
        return Ok((url, None));
    }
    let (host, port) = host_port(&url).ok_or_else(|| Failed {
        kind: "bad_url".into(),
        retry: false,
    })?;
    // Every turn asks the resolver again, as a client honouring a short DNS TTL would.
    let addrs: Vec<String> = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|_| Failed {
            kind: "dns".into(),
            retry: true,
        })?
        .map(|a| format!("http://{a}"))
        .collect();
    if addrs.is_empty() {
        return Err(Failed {
            kind: "dns".into(),
            retry: true,
        });
    }
    let addrs = fresh(&addrs);
    let a = addrs[(mix(seed ^ 0x5bd1_e995) % addrs.len() as u64) as usize].clone();
    Ok((a, Some(format!("{host}:{port}"))))
}

/// Sends one turn (again to another router when an attempt fails, up to `attempts`),
/// records it, returns the reply text.
async fn turn(
    s: &Shared,
    id: TurnId,
    msgs: &[serde_json::Value],
    max_tokens: u32,
) -> Option<String> {
    let p = &s.params;
    let body = serde_json::json!({"model": p.model, "messages": msgs, "stream": true,
        "stream_options": {"include_usage": true}, "max_tokens": max_tokens});
    let (oracle, pooled) = oracle_tokens(s, &body);
    let body = Bytes::from(serde_json::to_vec(&body).ok()?);
    let started = Instant::now();
    let mut rec = Turn {
        conv: id.conv,
        main: id.main,
        index: id.index,
        fresh_context: id.fresh_context,
        at: (started - s.started).as_secs_f64(),
        oracle_tokens: oracle,
        pooled_tokens: pooled,
        ..Default::default()
    };
    let seq = s.done.fetch_add(1, Relaxed);
    let mut tried: Vec<String> = Vec::new();
    let overall = started + Duration::from_secs(300);
    let mut outcome: Result<Answer, Failed> = Err(Failed {
        kind: "not_sent".into(),
        retry: false,
    });
    for n in 0..p.attempts.max(1) {
        if n > 0 {
            rec.retries += 1;
            // A short pause: a router that just died leaves DNS within a moment.
            tokio::time::sleep(Duration::from_millis(50 * u64::from(n))).await;
        }
        let seed = id.conv.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ seq.rotate_left(17) ^ u64::from(n);
        let (base, host) = match pick(s, seed, &tried).await {
            Ok(t) => t,
            Err(f) => {
                let retry = f.retry;
                outcome = Err(f);
                if retry {
                    continue;
                }
                break;
            }
        };
        rec.router = base.clone();
        tried.push(base.clone());
        let left = overall.saturating_duration_since(Instant::now());
        outcome = tokio::time::timeout(
            left,
            attempt(s, &base, host.as_deref(), id, body.clone(), started),
        )
        .await
        .unwrap_or_else(|_| {
            Err(Failed {
                kind: "timeout".into(),
                retry: false,
            })
        });
        match &outcome {
            Ok(_) => break,
            Err(f) if !f.retry => break,
            Err(_) => {}
        }
    }
    let out = match outcome {
        Ok(a) => {
            rec.ok = true;
            rec.rank = a.rank;
            rec.reason = a.reason;
            rec.ttft = a.ttft;
            rec.itl = a.itl;
            rec.prompt_tokens = a.prompt_tokens;
            rec.cached_tokens = a.cached_tokens;
            Some(a.reply)
        }
        Err(f) => {
            rec.err = Some(f.kind);
            None
        }
    };
    if let Ok(mut t) = s.turns.lock() {
        t.push(rec);
    }
    out
}

/// One try of a turn against `base`.
async fn attempt(
    s: &Shared,
    base: &str,
    host: Option<&str>,
    id: TurnId,
    body: Bytes,
    started: Instant,
) -> Result<Answer, Failed> {
    let p = &s.params;
    let fail = |kind: &str, retry: bool| Failed {
        kind: kind.to_owned(),
        retry,
    };
    let mut b = http::Request::post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json");
    if let Some(h) = host {
        // The name the client asked for, not the address it picked.
        b = b.header("host", h);
    }
    if p.session_ids {
        b = b.header("x-session-id", format!("conv-{:x}-{}", p.salt, id.conv));
    }
    if let Some(k) = &p.api_key {
        b = b.header("authorization", format!("Bearer {k}"));
    }
    let req = b
        .body(Full::new(body))
        .map_err(|_| fail("bad_request", false))?;
    let resp = match tokio::time::timeout(HEAD_TIMEOUT, s.client.request(req)).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => return Err(fail("transport", true)),
        Err(_) => return Err(fail("head_timeout", true)),
    };
    let code = resp.status().as_u16();
    if !resp.status().is_success() {
        let retry = code == 408 || code == 429 || code >= 500;
        return Err(fail(&format!("http_{code}"), retry));
    }
    let mut a = Answer {
        rank: resp
            .headers()
            .get("x-engine-rank")
            .or_else(|| resp.headers().get("x-router-rank"))
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        reason: resp
            .headers()
            .get("x-router-reason")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        ..Default::default()
    };
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    let mut first: Option<Instant> = None;
    let mut last = started;
    let mut tokens = 0u64;
    let mut done = false;
    while let Some(frame) = body.frame().await {
        // A cut stream is sent again whole, as agent SDKs retry a broken connection.
        let frame = frame.map_err(|_| fail("stream", true))?;
        let Some(d) = frame.data_ref() else { continue };
        buf.extend_from_slice(d);
        while let Some(nl) = buf.windows(2).position(|w| w == b"\n\n") {
            let ev: Vec<u8> = buf.drain(..nl + 2).collect();
            let ev = String::from_utf8_lossy(&ev);
            if ev.contains("event: error") {
                return Err(fail("stream_error_event", true));
            }
            for line in ev.lines() {
                let Some(data) = line.strip_prefix("data: ") else {
                    continue;
                };
                if data == "[DONE]" {
                    done = true;
                    continue;
                }
                let Ok(v) = serde_json::from_str::<serde_json::Value>(data) else {
                    continue;
                };
                if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
                    if !c.is_empty() {
                        let now = Instant::now();
                        first.get_or_insert(now);
                        last = now;
                        tokens += 1;
                        a.reply.push_str(c);
                    }
                }
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    a.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0);
                    a.cached_tokens = u["prompt_tokens_details"]["cached_tokens"]
                        .as_u64()
                        .unwrap_or(0);
                }
            }
        }
    }
    if !done {
        // The body ended without [DONE]: cut short.
        return Err(fail("truncated", true));
    }
    let first = first.ok_or_else(|| fail("empty_reply", false))?;
    a.ttft = Some(first - started);
    if tokens > 1 {
        a.itl = Some((last - first) / (tokens as u32 - 1));
    }
    Ok(a)
}

/// The engines' KV block size in tokens.
const BLOCK: usize = 16;

/// Two ideal routers' caches. Unbounded: every block ever sent. Pooled: one LRU of the
/// fleet's whole KV capacity, as if all ranks were one engine with perfect routing.
struct Oracle {
    seen: HashSet<u64>,
    /// Capacity of the pool in blocks (0: no pool).
    pool_blocks: u64,
    /// Block -> its last use; last use -> block (the LRU order).
    pool: HashMap<u64, u64>,
    order: BTreeMap<u64, u64>,
    tick: u64,
}

impl Oracle {
    fn new(pool_blocks: u64) -> Oracle {
        Oracle {
            seen: HashSet::new(),
            pool_blocks,
            pool: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
        }
    }

    /// Blocks of this prompt's prefix each cache holds, then the prompt's blocks are used.
    fn turn(&mut self, hashes: &[u64]) -> (usize, usize) {
        let seen = hashes.iter().take_while(|h| self.seen.contains(h)).count();
        self.seen.extend(hashes.iter().copied());
        if self.pool_blocks == 0 {
            return (seen, 0);
        }
        let pooled = hashes
            .iter()
            .take_while(|h| self.pool.contains_key(h))
            .count();
        for h in hashes {
            self.tick += 1;
            if let Some(old) = self.pool.insert(*h, self.tick) {
                self.order.remove(&old);
            }
            self.order.insert(self.tick, *h);
        }
        while self.pool.len() as u64 > self.pool_blocks {
            let Some((_, h)) = self.order.pop_first() else {
                break;
            };
            self.pool.remove(&h);
        }
        (seen, pooled)
    }
}

/// Tokens the two ideal routers would serve from cache (unbounded, pooled): the longest
/// prefix of this prompt, in whole engine blocks, their caches hold.
fn oracle_tokens(s: &Shared, body: &serde_json::Value) -> (u64, u64) {
    let Ok(rendered) = engine_sim::render_chat(body) else {
        return (0, 0);
    };
    let tokens = engine_sim::tokenize(rendered.as_bytes());
    let hashes = engine_sim::cache::block_hashes(&tokens, BLOCK);
    let Ok(mut oracle) = s.oracle.lock() else {
        return (0, 0);
    };
    let (seen, pooled) = oracle.turn(&hashes);
    // An engine computes at least the last block again, as enginesim does.
    let cached = |blocks: usize| {
        let mut c = blocks * BLOCK;
        if c >= tokens.len() && c > 0 {
            c -= BLOCK;
        }
        c as u64
    };
    (cached(seen), cached(pooled))
}

/// The `q` quantile of `v` (sorted in place); 0 for an empty slice.
pub fn pct(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn report(label: &str, turns: &[Turn], elapsed: Duration) -> Report {
    let ok: Vec<&Turn> = turns.iter().filter(|t| t.ok).collect();
    let mut errors = BTreeMap::new();
    for t in turns.iter().filter(|t| !t.ok) {
        *errors.entry(t.err.clone().unwrap_or_default()).or_insert(0) += 1;
    }
    let mut ttft: Vec<f64> = ok
        .iter()
        .filter_map(|t| t.ttft)
        .map(|d| d.as_secs_f64())
        .collect();
    let mut itl: Vec<f64> = ok
        .iter()
        .filter_map(|t| t.itl)
        .map(|d| d.as_secs_f64())
        .collect();
    let prompt: u64 = ok.iter().map(|t| t.prompt_tokens).sum();
    let cached: u64 = ok.iter().map(|t| t.cached_tokens).sum();
    let oracle: u64 = ok
        .iter()
        .map(|t| t.oracle_tokens.min(t.prompt_tokens))
        .sum();
    let pooled: u64 = ok
        .iter()
        .map(|t| t.pooled_tokens.min(t.prompt_tokens))
        .sum();
    let mut last: HashMap<u64, &str> = HashMap::new();
    let (mut same, mut follow) = (0u64, 0u64);
    let (mut main_same, mut main_follow) = (0u64, 0u64);
    let mut per_rank: HashMap<&str, u64> = HashMap::new();
    let mut per_router: BTreeMap<String, u64> = BTreeMap::new();
    for t in &ok {
        *per_router.entry(t.router.clone()).or_insert(0) += 1;
        let Some(r) = t.rank.as_deref() else { continue };
        *per_rank.entry(r).or_insert(0) += 1;
        if let Some(prev) = last.insert(t.conv, r) {
            follow += 1;
            let main = t.main && !t.fresh_context;
            main_follow += u64::from(main);
            if prev == r {
                same += 1;
                main_same += u64::from(main);
            }
        }
    }
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let mean = if per_rank.is_empty() {
        0.0
    } else {
        ok.len() as f64 / per_rank.len() as f64
    };
    let max = per_rank.values().copied().max().unwrap_or(0) as f64;
    let secs = elapsed.as_secs_f64();
    Report {
        label: label.to_owned(),
        turns: ok.len() as u64,
        turns_per_min: ok.len() as f64 / secs * 60.0,
        errors,
        ttft_p50: pct(&mut ttft, 0.5),
        ttft_p90: pct(&mut ttft, 0.9),
        ttft_p99: pct(&mut ttft, 0.99),
        itl_p50: pct(&mut itl, 0.5),
        cached_share: if prompt == 0 {
            0.0
        } else {
            cached as f64 / prompt as f64
        },
        oracle_share: if prompt == 0 {
            0.0
        } else {
            oracle as f64 / prompt as f64
        },
        pooled_oracle_share: ratio(pooled, prompt),
        stickiness: ratio(same, follow),
        main_stickiness: ratio(main_same, main_follow),
        main_follow_ups: main_follow,
        retries: turns.iter().map(|t| u64::from(t.retries)).sum(),
        per_router,
        balance_max_over_mean: if mean == 0.0 { 0.0 } else { max / mean },
        ranks_used: per_rank.len(),
        prompt_tokens: prompt,
        seconds: secs,
        started_unix: 0.0,
    }
}

/// A human table of several reports, with turns/min ratios against each baseline
/// (`(column header, label)`; a baseline not among the reports gives `-`).
pub fn table(reports: &[Report], baselines: &[(&str, &str)]) -> String {
    use std::fmt::Write;
    let pooled = reports.iter().any(|r| r.pooled_oracle_share > 0.0);
    let mut o = String::new();
    let _ = write!(
        o,
        "{:<24} {:>7} {:>9} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8}",
        "router", "turns", "turns/min", "ttft50", "ttft90", "ttft99", "itl50", "cached%", "oracle%"
    );
    if pooled {
        let _ = write!(o, " {:>8}", "pooled%");
    }
    let _ = write!(o, " {:>7} {:>7} {:>6}", "sticky%", "bal", "errors");
    for (head, _) in baselines {
        let _ = write!(o, " {head:>8}");
    }
    o.push('\n');
    for r in reports {
        let errs: u64 = r.errors.values().sum();
        let _ = write!(
            o,
            "{:<24} {:>7} {:>9.1} {:>7.3} {:>7.3} {:>7.3} {:>7.4} {:>8.1} {:>8.1}",
            r.label,
            r.turns,
            r.turns_per_min,
            r.ttft_p50,
            r.ttft_p90,
            r.ttft_p99,
            r.itl_p50,
            r.cached_share * 100.0,
            r.oracle_share * 100.0,
        );
        if pooled {
            let _ = write!(o, " {:>8.1}", r.pooled_oracle_share * 100.0);
        }
        let _ = write!(
            o,
            " {:>7.1} {:>7.2} {:>6}",
            r.stickiness * 100.0,
            r.balance_max_over_mean,
            errs
        );
        for (_, label) in baselines {
            let ratio = match reports.iter().find(|b| b.label == *label) {
                Some(b) if b.turns_per_min > 0.0 => {
                    format!("{:.2}x", r.turns_per_min / b.turns_per_min)
                }
                _ => "-".into(),
            };
            let _ = write!(o, " {ratio:>8}");
        }
        o.push('\n');
    }
    o
}
