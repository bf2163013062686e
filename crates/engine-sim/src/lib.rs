//! A simulated inference engine that behaves like vLLM or SGLang where it matters to a
//! router: each rank has a bounded prefix cache, prefill costs time per uncached token,
//! decode slows as the batch grows, and replies are deterministic so that a client's
//! re-sent assistant turn matches the cached prefix.

pub mod cache;
pub mod sched;

use bytes::Bytes;
use cache::PrefixCache;
use http::{Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use sched::{Job, Scheduler, TimeModel};
use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use xxhash_rust::xxh3::xxh3_64;

/// Engine settings.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Model name served.
    pub model: String,
    /// KV capacity per rank in tokens.
    pub capacity_tokens: usize,
    /// Block size in tokens.
    pub block_size: usize,
    /// Time model per rank.
    pub time: TimeModel,
    /// Simulated time runs this many times faster than wall time.
    pub speed: f64,
    /// Default `max_tokens`.
    pub default_max_tokens: u32,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            model: "sim-model".into(),
            capacity_tokens: 200_000,
            block_size: 16,
            time: TimeModel::default(),
            speed: 1.0,
            default_max_tokens: 16,
        }
    }
}

/// Counters of one rank, read by `/metrics`.
#[derive(Debug, Default)]
pub struct RankStats {
    /// Requests admitted.
    pub running: AtomicU64,
    /// Requests queued.
    pub waiting: AtomicU64,
    /// KV usage in parts per million.
    pub kv_usage_ppm: AtomicU64,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_queries: AtomicU64,
    /// Prompt tokens found.
    pub prefix_hits: AtomicU64,
    /// Prompt tokens received.
    pub prompt_tokens: AtomicU64,
    /// Tokens generated.
    pub generation_tokens: AtomicU64,
    /// Requests finished.
    pub finished: AtomicU64,
    /// Requests cancelled by their client.
    pub cancelled: AtomicU64,
}

enum Event {
    Start { cached: usize },
    Token,
    Done,
}

struct Admission {
    prompt: Vec<u32>,
    max_tokens: u32,
    events: mpsc::UnboundedSender<Event>,
}

/// One rank: a task owning its cache and scheduler.
pub struct Rank {
    /// Label reported in `x-engine-rank`.
    pub label: String,
    tx: mpsc::UnboundedSender<Admission>,
    /// Counters.
    pub stats: Arc<RankStats>,
}

impl Rank {
    /// Spawns the rank's task.
    pub fn spawn(label: String, cfg: &SimConfig) -> Rank {
        let (tx, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(RankStats::default());
        tokio::spawn(run_rank(cfg.clone(), rx, stats.clone()));
        Rank { label, tx, stats }
    }
}

async fn run_rank(
    cfg: SimConfig,
    mut rx: mpsc::UnboundedReceiver<Admission>,
    stats: Arc<RankStats>,
) {
    let mut cache = PrefixCache::new(cfg.capacity_tokens, cfg.block_size);
    let mut sched = Scheduler::new(cfg.time);
    let mut clients: HashMap<u64, mpsc::UnboundedSender<Event>> = HashMap::new();
    let mut next_id = 0u64;
    let speed = cfg.speed.max(0.001);
    // Sleeping to a virtual clock keeps the average step length exact even though each
    // timer only fires on a millisecond tick.
    let mut clock = tokio::time::Instant::now();
    let mut admit = |a: Admission,
                     sched: &mut Scheduler,
                     clients: &mut HashMap<u64, mpsc::UnboundedSender<Event>>| {
        let cached = cache.admit(&a.prompt);
        stats
            .prompt_tokens
            .fetch_add(a.prompt.len() as u64, Relaxed);
        stats.prefix_queries.store(cache.queries, Relaxed);
        stats.prefix_hits.store(cache.hits, Relaxed);
        stats
            .kv_usage_ppm
            .store((cache.usage() * 1e6) as u64, Relaxed);
        if a.events.send(Event::Start { cached }).is_err() {
            return;
        }
        next_id += 1;
        sched.add(Job {
            id: next_id,
            prefill_left: (a.prompt.len() - cached).max(1) as u32,
            decode_left: a.max_tokens.max(1),
        });
        clients.insert(next_id, a.events);
    };
    loop {
        if sched.idle() {
            match rx.recv().await {
                Some(a) => admit(a, &mut sched, &mut clients),
                None => return,
            }
            clock = tokio::time::Instant::now();
        }
        while let Ok(a) = rx.try_recv() {
            admit(a, &mut sched, &mut clients);
        }
        let step = sched.step();
        stats.running.store(sched.running() as u64, Relaxed);
        stats.waiting.store(sched.waiting() as u64, Relaxed);
        clock += step.duration.div_f64(speed);
        let now = tokio::time::Instant::now();
        if clock > now {
            tokio::time::sleep_until(clock).await;
        } else if now - clock > Duration::from_millis(200) {
            // Far behind (machine busy): do not try to catch up in a burst.
            clock = now;
        }
        for id in step.tokens {
            stats.generation_tokens.fetch_add(1, Relaxed);
            let gone = clients
                .get(&id)
                .is_none_or(|c| c.send(Event::Token).is_err());
            if gone {
                sched.cancel(id);
                clients.remove(&id);
                stats.cancelled.fetch_add(1, Relaxed);
            }
        }
        for id in step.finished {
            if let Some(c) = clients.remove(&id) {
                let _ = c.send(Event::Done);
            }
            stats.finished.fetch_add(1, Relaxed);
        }
    }
}

/// How a port maps to ranks.
pub enum PortRanks {
    /// The port is one rank.
    Single(Arc<Rank>),
    /// The port serves several data-parallel ranks chosen by `routed_dp_rank`.
    Dp(Vec<Arc<Rank>>, AtomicU64),
}

/// Everything one listening port needs.
pub struct PortState {
    /// Settings.
    pub cfg: SimConfig,
    /// Ranks behind this port.
    pub ranks: PortRanks,
}

type Body = BoxBody<Bytes, Infallible>;

fn error(status: StatusCode, msg: impl Into<String>) -> Response<Body> {
    let v = serde_json::json!({"object": "error", "message": msg.into(), "type": "BadRequestError", "param": null, "code": status.as_u16()});
    json(status, &v)
}

fn json(status: StatusCode, v: &serde_json::Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())).boxed())
        .unwrap_or_default()
}

/// Renders a chat request with a fixed template.
pub fn render_chat(body: &serde_json::Value) -> Result<String, String> {
    let msgs = body
        .get("messages")
        .and_then(|m| m.as_array())
        .ok_or("'messages' must be an array")?;
    let mut out = String::new();
    if let Some(tools) = body.get("tools").filter(|t| !t.is_null()) {
        let _ = writeln!(out, "<|tools|>{tools}<|end|>");
    }
    for (i, m) in msgs.iter().enumerate() {
        let role = m
            .get("role")
            .and_then(|r| r.as_str())
            .ok_or_else(|| format!("messages[{i}].role must be a string"))?;
        let _ = write!(out, "<|{role}|>");
        match m.get("content") {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::String(s)) => out.push_str(s),
            Some(serde_json::Value::Array(parts)) => {
                for p in parts {
                    match p.get("text").and_then(|t| t.as_str()) {
                        Some(t) => out.push_str(t),
                        None => out.push_str(&p.to_string()),
                    }
                }
            }
            Some(_) => {
                return Err(format!(
                    "messages[{i}].content must be a string or an array"
                ))
            }
        }
        if let Some(tc) = m.get("tool_calls").filter(|t| !t.is_null()) {
            out.push_str(&tc.to_string());
        }
        out.push_str("<|end|>\n");
    }
    out.push_str("<|assistant|>");
    Ok(out)
}

/// Byte-level tokenizer: every 4 bytes are one token.
pub fn tokenize(text: &[u8]) -> Vec<u32> {
    text.chunks(4)
        .map(|c| {
            let mut b = [0u8; 4];
            b[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(b)
        })
        .collect()
}

const WORDS: [&str; 16] = [
    "the ", "code ", "fix ", "test ", "run ", "file ", "edit ", "step ", "next ", "done ", "read ",
    "call ", "tool ", "line ", "diff ", "ok. ",
];

/// The deterministic reply to a prompt, one word per token.
pub fn reply_words(prompt: &[u32], n: u32) -> Vec<&'static str> {
    let mut bytes = Vec::with_capacity(prompt.len() * 4);
    for t in prompt {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    let mut x = xxh3_64(&bytes) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            WORDS[(x % WORDS.len() as u64) as usize]
        })
        .collect()
}

/// Serves one HTTP request.
pub async fn serve(st: Arc<PortState>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    match path.as_str() {
        "/health" => return json(StatusCode::OK, &serde_json::json!({"status": "ok"})),
        "/v1/models" => {
            return json(
                StatusCode::OK,
                &serde_json::json!({"object": "list", "data": [{"id": st.cfg.model, "object": "model", "owned_by": "enginesim"}]}),
            )
        }
        "/metrics" => {
            return Response::builder()
                .header("content-type", "text/plain; version=0.0.4")
                .body(Full::new(Bytes::from(metrics(&st))).boxed())
                .unwrap_or_default()
        }
        "/v1/chat/completions" | "/v1/completions" => {}
        _ => return error(StatusCode::NOT_FOUND, format!("no route {path}")),
    }
    let chat = path == "/v1/chat/completions";
    let raw = match req.into_body().collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("cannot read body: {e}")),
    };
    let body: serde_json::Value = match serde_json::from_slice(&raw) {
        Ok(v @ serde_json::Value::Object(_)) => v,
        Ok(_) => return error(StatusCode::BAD_REQUEST, "body must be a JSON object"),
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid JSON: {e}")),
    };
    let prompt = if chat {
        match render_chat(&body) {
            Ok(t) => tokenize(t.as_bytes()),
            Err(e) => return error(StatusCode::BAD_REQUEST, e),
        }
    } else {
        match body.get("prompt") {
            Some(serde_json::Value::String(s)) => tokenize(s.as_bytes()),
            Some(serde_json::Value::Array(a))
                if !a.is_empty()
                    && a.iter()
                        .all(|t| t.as_u64().is_some_and(|t| t <= u64::from(u32::MAX))) =>
            {
                a.iter().map(|t| t.as_u64().unwrap_or(0) as u32).collect()
            }
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "'prompt' must be a string or a list of token ids",
                )
            }
        }
    };
    if prompt.is_empty() {
        return error(StatusCode::BAD_REQUEST, "empty prompt");
    }
    let max_tokens = match body
        .get("max_tokens")
        .or_else(|| body.get("max_completion_tokens"))
    {
        None | Some(serde_json::Value::Null) => st.cfg.default_max_tokens,
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => n.min(8192) as u32,
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "'max_tokens' must be a positive integer",
                )
            }
        },
    };
    let rank = match &st.ranks {
        PortRanks::Single(r) => r.clone(),
        PortRanks::Dp(ranks, rr) => match body.get("routed_dp_rank") {
            None | Some(serde_json::Value::Null) => {
                ranks[(rr.fetch_add(1, Relaxed) as usize) % ranks.len()].clone()
            }
            Some(v) => match v.as_u64() {
                Some(i) if (i as usize) < ranks.len() => ranks[i as usize].clone(),
                _ => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        format!("routed_dp_rank must be in 0..{}", ranks.len()),
                    )
                }
            },
        },
    };
    let stream = body
        .get("stream")
        .and_then(|s| s.as_bool())
        .unwrap_or(false);
    let include_usage = body
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(|u| u.as_bool())
        .unwrap_or(false);
    let words = reply_words(&prompt, max_tokens);
    let prompt_len = prompt.len();
    let (etx, mut erx) = mpsc::unbounded_channel();
    if rank
        .tx
        .send(Admission {
            prompt,
            max_tokens,
            events: etx,
        })
        .is_err()
    {
        return error(StatusCode::SERVICE_UNAVAILABLE, "rank stopped");
    }
    let cached = match erx.recv().await {
        Some(Event::Start { cached }) => cached,
        _ => return error(StatusCode::SERVICE_UNAVAILABLE, "rank stopped"),
    };
    let model = body
        .get("model")
        .and_then(|m| m.as_str())
        .unwrap_or(&st.cfg.model)
        .to_owned();
    let usage = move |completion: usize| {
        serde_json::json!({"prompt_tokens": prompt_len, "completion_tokens": completion,
            "total_tokens": prompt_len + completion, "prompt_tokens_details": {"cached_tokens": cached}})
    };
    let label = rank.label.clone();
    if !stream {
        let mut n = 0;
        while let Some(e) = erx.recv().await {
            match e {
                Event::Token => n += 1,
                Event::Done => break,
                Event::Start { .. } => {}
            }
        }
        let text: String = words[..n.min(words.len())].concat();
        let choice = if chat {
            serde_json::json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"})
        } else {
            serde_json::json!({"index": 0, "text": text, "finish_reason": "length"})
        };
        let v = serde_json::json!({"id": "sim-1", "object": if chat {"chat.completion"} else {"text_completion"},
            "model": model, "choices": [choice], "usage": usage(n)});
        let mut r = json(StatusCode::OK, &v);
        if let Ok(h) = http::HeaderValue::from_str(&label) {
            r.headers_mut().insert("x-engine-rank", h);
        }
        return r;
    }
    let mut i = 0usize;
    let mut done = false;
    let object = if chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let frames = futures_util::stream::poll_fn(move |cx| {
        if done {
            return std::task::Poll::Ready(None);
        }
        match erx.poll_recv(cx) {
            std::task::Poll::Pending => std::task::Poll::Pending,
            std::task::Poll::Ready(Some(Event::Token)) => {
                let w = words.get(i).copied().unwrap_or("");
                let choice = if chat {
                    let delta = if i == 0 {
                        serde_json::json!({"role": "assistant", "content": w})
                    } else {
                        serde_json::json!({"content": w})
                    };
                    serde_json::json!({"index": 0, "delta": delta, "finish_reason": null})
                } else {
                    serde_json::json!({"index": 0, "text": w, "finish_reason": null})
                };
                i += 1;
                let c = serde_json::json!({"id": "sim-1", "object": object, "model": model, "choices": [choice]});
                std::task::Poll::Ready(Some(Ok::<_, Infallible>(Frame::data(Bytes::from(
                    format!("data: {c}\n\n"),
                )))))
            }
            std::task::Poll::Ready(Some(Event::Start { .. })) => {
                std::task::Poll::Ready(Some(Ok(Frame::data(Bytes::new()))))
            }
            std::task::Poll::Ready(Some(Event::Done)) | std::task::Poll::Ready(None) => {
                done = true;
                let fin = if chat {
                    serde_json::json!({"index": 0, "delta": {}, "finish_reason": "length"})
                } else {
                    serde_json::json!({"index": 0, "text": "", "finish_reason": "length"})
                };
                let mut s = format!(
                    "data: {}\n\n",
                    serde_json::json!({"id": "sim-1", "object": object, "model": model, "choices": [fin]})
                );
                if include_usage {
                    let _ = write!(
                        s,
                        "data: {}\n\n",
                        serde_json::json!({"id": "sim-1", "object": object, "model": model, "choices": [], "usage": usage(i)})
                    );
                }
                s.push_str("data: [DONE]\n\n");
                std::task::Poll::Ready(Some(Ok(Frame::data(Bytes::from(s)))))
            }
        }
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("x-engine-rank", label)
        .body(StreamBody::new(frames).boxed())
        .unwrap_or_default()
}

/// A vLLM series: name, help, value of one rank.
type Series = (&'static str, &'static str, fn(&RankStats) -> f64);

fn metrics(st: &PortState) -> String {
    let ranks: Vec<&Arc<Rank>> = match &st.ranks {
        PortRanks::Single(r) => vec![r],
        PortRanks::Dp(rs, _) => rs.iter().collect(),
    };
    let mut o = promtext::Exposition::with_capacity(4096);
    let m = &st.cfg.model;
    let series: [Series; 9] = [
        (
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            |s| s.running.load(Relaxed) as f64,
        ),
        (
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            |s| s.waiting.load(Relaxed) as f64,
        ),
        (
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            |s| s.kv_usage_ppm.load(Relaxed) as f64 / 1e6,
        ),
        (
            "vllm:prefix_cache_queries_total",
            "Prefix cache queries, in terms of number of queried tokens.",
            |s| s.prefix_queries.load(Relaxed) as f64,
        ),
        (
            "vllm:prefix_cache_hits_total",
            "Prefix cache hits, in terms of number of cached tokens.",
            |s| s.prefix_hits.load(Relaxed) as f64,
        ),
        (
            "vllm:prompt_tokens_total",
            "Number of prefill tokens processed.",
            |s| s.prompt_tokens.load(Relaxed) as f64,
        ),
        (
            "vllm:generation_tokens_total",
            "Number of generation tokens processed.",
            |s| s.generation_tokens.load(Relaxed) as f64,
        ),
        (
            "vllm:request_success_total",
            "Count of successfully processed requests.",
            |s| s.finished.load(Relaxed) as f64,
        ),
        (
            "vllm:request_cancelled_total",
            "Count of requests cancelled by the client.",
            |s| s.cancelled.load(Relaxed) as f64,
        ),
    ];
    for (name, help, f) in series {
        o.family(name, help, promtext::Kind::by_name(name));
        for (i, r) in ranks.iter().enumerate() {
            o.sample(
                name,
                &[
                    ("model_name", m),
                    ("engine", &i.to_string()),
                    ("rank", &r.label),
                ],
                f(&r.stats),
            );
        }
    }
    o.finish()
}
