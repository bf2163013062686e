//! A small fake engine for router tests: real HTTP on a real socket, OpenAI-shaped replies,
//! behaviour steered per request by headers, and counters the tests assert on.
//! (The full simulator with a KV-cache and time model is `crates/engine-sim`.)

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;

type Body = BoxBody<Bytes, Infallible>;

/// Shared state of one fake engine.
#[derive(Default)]
pub struct EngineState {
    /// Name reported in replies (`x-engine`).
    pub name: String,
    /// Bodies of inference requests received, in order.
    pub bodies: Mutex<Vec<serde_json::Value>>,
    /// Streams the client dropped before they finished.
    pub cancelled: AtomicU64,
    /// Streams that finished.
    pub completed: AtomicU64,
    /// When non-zero, every inference request gets this status.
    pub force_status: AtomicU16,
    /// Health probes answered.
    pub probes: AtomicU64,
    /// When non-zero, health probes get this status.
    pub health_status: AtomicU16,
    /// When non-zero, every inference request waits this long (ms) before its answer.
    pub delay_ms: AtomicU64,
    /// TCP connections accepted.
    pub connections: AtomicU64,
}

/// A running fake engine.
pub struct FakeEngine {
    /// Its address.
    pub addr: SocketAddr,
    /// Its state.
    pub state: Arc<EngineState>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeEngine {
    /// Base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests received so far.
    pub fn count(&self) -> usize {
        self.state.bodies.lock().map(|b| b.len()).unwrap_or(0)
    }

    /// Starts one on a free port.
    pub async fn start(name: &str) -> FakeEngine {
        Self::start_with_idle_close(name, None).await
    }

    /// Starts one that closes a keep-alive connection idle for `idle` (as uvicorn does after
    /// its 5 s `timeout_keep_alive`).
    pub async fn start_with_idle_close(name: &str, idle: Option<Duration>) -> FakeEngine {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(EngineState {
            name: name.to_owned(),
            ..Default::default()
        });
        let st = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let st = st.clone();
                st.connections.fetch_add(1, Relaxed);
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let st = st.clone();
                        async move { Ok::<_, Infallible>(serve(st, req).await) }
                    });
                    let mut b = hyper::server::conn::http1::Builder::new();
                    if let Some(d) = idle {
                        // The head-read timer also runs while a kept-alive connection waits.
                        b.timer(hyper_util::rt::TokioTimer::new())
                            .header_read_timeout(d);
                    }
                    let _ = b.serve_connection(TokioIo::new(stream), svc).await;
                });
            }
        });
        FakeEngine { addr, state, task }
    }
}

impl Drop for FakeEngine {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn header_u64(req: &Request<Incoming>, k: &str) -> Option<u64> {
    req.headers()
        .get(k)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

fn json(status: StatusCode, v: serde_json::Value, name: &str) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("x-engine", name)
        .body(Full::new(Bytes::from(v.to_string())).boxed())
        .expect("response")
}

async fn serve(st: Arc<EngineState>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    if path == "/health" {
        st.probes.fetch_add(1, Relaxed);
        let status = match st.health_status.load(Relaxed) {
            0 => StatusCode::OK,
            s => StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        };
        return json(status, serde_json::json!({}), &st.name);
    }
    if path == "/v1/models" {
        return json(
            StatusCode::OK,
            serde_json::json!({"object":"list","data":[{"id": format!("model-{}", st.name), "object":"model"}, {"id":"shared","object":"model"}]}),
            &st.name,
        );
    }
    let close = req.headers().contains_key("x-fake-close");
    let delay = header_u64(&req, "x-fake-delay-ms").unwrap_or(st.delay_ms.load(Relaxed));
    let gap = header_u64(&req, "x-fake-gap-ms").unwrap_or(0);
    let chunks = header_u64(&req, "x-fake-chunks").unwrap_or(3);
    let break_after = header_u64(&req, "x-fake-break-after");
    let auth = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let raw = req
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let body: serde_json::Value = match serde_json::from_slice(&raw) {
        Ok(v) => v,
        Err(_) => {
            return json(
                StatusCode::BAD_REQUEST,
                serde_json::json!({"error":{"message":"bad json"}}),
                &st.name,
            );
        }
    };
    // The raw bytes' last key matters for routed_dp_rank tests; keep them visible.
    let mut recorded = body.clone();
    if let serde_json::Value::Object(o) = &mut recorded {
        o.insert(
            "_raw_tail".into(),
            serde_json::Value::String(
                String::from_utf8_lossy(&raw[raw.len().saturating_sub(40)..]).into_owned(),
            ),
        );
        o.insert("_path".into(), serde_json::Value::String(path.clone()));
        if let Some(a) = auth {
            o.insert("_auth".into(), serde_json::Value::String(a));
        }
    }
    if let Ok(mut b) = st.bodies.lock() {
        b.push(recorded);
    }
    let forced = st.force_status.load(Relaxed);
    if forced != 0 {
        return json(
            StatusCode::from_u16(forced).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
            serde_json::json!({"error":{"message":"forced"}}),
            &st.name,
        );
    }
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let prompt_tokens = (raw.len() / 4) as u64;
    let stream = body
        .get("stream")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    let dp = body.get("routed_dp_rank").and_then(|v| v.as_u64());
    let content = format!("reply from {} dp {:?}", st.name, dp);
    if !stream {
        st.completed.fetch_add(1, Relaxed);
        let mut r = json(
            StatusCode::OK,
            serde_json::json!({
                "id": "cmpl-1", "object": "chat.completion", "model": body.get("model"),
                "choices": [{"index":0, "message": {"role":"assistant","content": content}, "finish_reason":"stop"}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 3, "total_tokens": prompt_tokens + 3,
                          "prompt_tokens_details": {"cached_tokens": prompt_tokens / 2}}
            }),
            &st.name,
        );
        if close {
            r.headers_mut()
                .insert("connection", http::HeaderValue::from_static("close"));
        }
        return r;
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
    let st2 = st.clone();
    tokio::spawn(async move {
        for i in 0..chunks {
            if break_after == Some(i) {
                // Let the chunks sent so far reach the router, then end the body short of
                // its declared length: the router sees an incomplete stream.
                tokio::time::sleep(Duration::from_millis(200)).await;
                return;
            }
            let c = serde_json::json!({"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content": format!("{content} {i} ")}}]});
            if tx
                .send(Ok(Frame::data(Bytes::from(format!("data: {c}\n\n")))))
                .await
                .is_err()
            {
                st2.cancelled.fetch_add(1, Relaxed);
                return;
            }
            if gap > 0 {
                tokio::time::sleep(Duration::from_millis(gap)).await;
            }
        }
        let u = serde_json::json!({"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens": prompt_tokens, "completion_tokens": chunks, "prompt_tokens_details":{"cached_tokens": prompt_tokens / 2}}});
        let _ = tx
            .send(Ok(Frame::data(Bytes::from(format!(
                "data: {u}\n\ndata: [DONE]\n\n"
            )))))
            .await;
        st2.completed.fetch_add(1, Relaxed);
    });
    let mut resp = Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .header("x-engine", st.name.as_str());
    if break_after.is_some() {
        // A declared length that the stream never reaches: the router sees an error.
        resp = resp.header("content-length", "100000");
    }
    resp.body(StreamBody::new(tokio_stream_from(rx)).boxed())
        .expect("response")
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>,
) -> impl futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Starts `n` engines named `e0..`.
pub async fn fleet(n: usize) -> Vec<FakeEngine> {
    let mut v = Vec::new();
    for i in 0..n {
        v.push(FakeEngine::start(&format!("e{i}")).await);
    }
    v
}
