//! Response bodies: small fixed ones, and the relay that streams an upstream response to
//! the client frame by frame, with an idle timeout, load accounting and usage scanning.

use super::upstream::Lease;
use crate::metrics::Metrics;
use crate::response::{error_json, BoxError, ErrorShape};
use crate::state::RankState;
use crate::telemetry::Trace;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use opentelemetry::KeyValue;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::time::Sleep;

/// One request's share of a rank's load: counted as queued prefill until the first byte,
/// then as a running decode, and released when dropped (completion, error or disconnect).
pub struct LoadGuard {
    rank: Arc<RankState>,
    prefill: u64,
    decoding: bool,
}

impl LoadGuard {
    /// Starts counting a request with `prefill` predicted uncached tokens on `rank`.
    pub fn new(rank: Arc<RankState>, prefill: u64) -> Self {
        rank.queued_prefill.fetch_add(prefill, Relaxed);
        rank.inflight.fetch_add(1, Relaxed);
        LoadGuard {
            rank,
            prefill,
            decoding: false,
        }
    }

    /// The first byte arrived: prefill is over.
    pub fn first_byte(&mut self) {
        if !self.decoding {
            self.decoding = true;
            self.rank.queued_prefill.fetch_sub(self.prefill, Relaxed);
            self.rank.decodes.fetch_add(1, Relaxed);
        }
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        if self.decoding {
            self.rank.decodes.fetch_sub(1, Relaxed);
        } else {
            self.rank.queued_prefill.fetch_sub(self.prefill, Relaxed);
        }
        self.rank.inflight.fetch_sub(1, Relaxed);
    }
}

/// The usage object of OpenAI, Responses and Anthropic responses. Only these fields are
/// read; serde skips the rest of the document without building it.
#[derive(serde::Deserialize)]
struct UsageDoc {
    usage: Option<UsageFields>,
}

#[derive(serde::Deserialize)]
struct UsageFields {
    prompt_tokens: Option<u64>,
    input_tokens: Option<u64>,
    prompt_tokens_details: Option<Details>,
    input_tokens_details: Option<Details>,
    cache_read_input_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    output_tokens: Option<u64>,
}

#[derive(serde::Deserialize)]
struct Details {
    cached_tokens: Option<u64>,
}

/// Token counts of one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt: u64,
    /// Of them, served from the engine's prefix cache.
    pub cached: u64,
    /// Generated tokens, when the engine says.
    pub completion: Option<u64>,
}

/// Pulls the token counts out of a whole response or one SSE event.
pub fn usage_of(json: &[u8]) -> Option<Usage> {
    let u = serde_json::from_slice::<UsageDoc>(json).ok()?.usage?;
    let prompt = u.prompt_tokens.or(u.input_tokens)?;
    let cached = u
        .prompt_tokens_details
        .and_then(|d| d.cached_tokens)
        .or_else(|| u.input_tokens_details.and_then(|d| d.cached_tokens))
        .or(u.cache_read_input_tokens)
        .unwrap_or(0);
    Some(Usage {
        prompt,
        cached,
        completion: u.completion_tokens.or(u.output_tokens),
    })
}

/// Finds the usage object in a streamed or whole response without holding the response.
#[derive(Default)]
struct UsageScanner {
    sse: bool,
    buf: Vec<u8>,
    found: Option<Usage>,
}

const MAX_SCAN: usize = 1 << 20;

impl UsageScanner {
    fn feed(&mut self, chunk: &[u8]) {
        if self.buf.len() + chunk.len() > MAX_SCAN {
            // A line or document too large to be worth parsing for usage.
            self.buf.clear();
            if !self.sse {
                return;
            }
        }
        self.buf.extend_from_slice(chunk);
        if !self.sse {
            return;
        }
        while let Some(nl) = self.buf.iter().position(|b| *b == b'\n') {
            let line = &self.buf[..nl];
            if let Some(data) = line.strip_prefix(b"data:") {
                if contains(data, b"\"usage\"") {
                    if let Some(u) = usage_of(trim(data)) {
                        self.found = Some(u);
                    }
                }
            }
            self.buf.drain(..=nl);
        }
    }

    fn finish(&mut self) -> Option<Usage> {
        if !self.sse && !self.buf.is_empty() {
            self.found = usage_of(&self.buf);
        }
        self.found
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn trim(b: &[u8]) -> &[u8] {
    let s = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let e = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(s, |e| e + 1);
    &b[s..e]
}

enum State {
    Streaming,
    Done,
}

/// Streams an upstream body to the client. Dropping it (client gone) drops the upstream
/// body, which closes the upstream connection and so cancels the request there.
pub struct RelayBody {
    inner: hyper::body::Incoming,
    /// The upstream connection, back to its pool once the body ends cleanly.
    lease: Option<Lease>,
    idle: Duration,
    /// Armed on the first wait; re-armed on a wait that follows data.
    sleep: Option<Pin<Box<Sleep>>>,
    /// Data arrived since the timer was armed.
    active: bool,
    state: State,
    guard: Option<LoadGuard>,
    scan: UsageScanner,
    metrics: Arc<Metrics>,
    started: Instant,
    first_seen: bool,
    sse: bool,
    shape: ErrorShape,
    /// Trace spans ended with the stream (disabled spans when tracing is off).
    spans: Option<Spans>,
    bytes: u64,
}

/// The trace spans a relayed response ends: the request's and its upstream attempt's.
pub struct Spans {
    /// The client's request.
    pub request: Trace,
    /// The attempt that answered.
    pub attempt: Trace,
}

impl RelayBody {
    /// Wraps `inner`; `guard` is released when the body ends.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        inner: hyper::body::Incoming,
        lease: Lease,
        sse: bool,
        idle: Duration,
        guard: LoadGuard,
        metrics: Arc<Metrics>,
        started: Instant,
        shape: ErrorShape,
        spans: Spans,
    ) -> Self {
        RelayBody {
            inner,
            lease: Some(lease),
            idle,
            sleep: None,
            active: false,
            state: State::Streaming,
            guard: Some(guard),
            scan: UsageScanner {
                sse,
                ..Default::default()
            },
            metrics,
            started,
            first_seen: false,
            sse,
            shape,
            spans: spans.request.recording().then_some(spans),
            bytes: 0,
        }
    }

    fn end(&mut self, ok: bool) {
        self.state = State::Done;
        // Released when this returns.
        let guard = self.guard.take();
        if let Some(l) = self.lease.take() {
            if ok {
                l.release();
            }
        }
        self.metrics.observe_duration(self.started.elapsed());
        let usage = if ok { self.scan.finish() } else { None };
        if let Some(u) = usage {
            self.metrics.observe_usage(u.prompt, u.cached);
            if let Some(g) = &guard {
                g.rank.usage_prompt_tokens.fetch_add(u.prompt, Relaxed);
                g.rank.usage_cached_tokens.fetch_add(u.cached, Relaxed);
            }
        }
        // Dropping the spans ends them now rather than when hyper drops the body.
        if let Some(s) = self.spans.take() {
            let bytes = self.bytes;
            s.request.set(|| {
                let mut kv = vec![
                    KeyValue::new("response.bytes", bytes as i64),
                    KeyValue::new("stream.end", if ok { "complete" } else { "failed" }),
                ];
                if let Some(u) = usage {
                    kv.push(KeyValue::new("usage.prompt_tokens", u.prompt as i64));
                    kv.push(KeyValue::new("usage.cached_tokens", u.cached as i64));
                    if let Some(c) = u.completion {
                        kv.push(KeyValue::new("usage.completion_tokens", c as i64));
                    }
                }
                kv
            });
            s.attempt.end();
            s.request.end();
        }
    }

    /// After the first byte an error cannot be retried: tell the client. SSE clients get an
    /// `error` event; other bodies are aborted, which the client sees as a broken response.
    fn fail(
        &mut self,
        code: &'static str,
        message: String,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.metrics.stream_error(code);
        if let Some(s) = &self.spans {
            for t in [&s.request, &s.attempt] {
                t.set(|| vec![KeyValue::new("stream.error", code)]);
                t.fail(&message);
            }
        }
        let upstream = self.guard.as_ref().map(|g| g.rank.upstream.url.clone());
        let (trace_id, span_id) = self.spans.as_ref().map_or((None, None), |s| {
            (s.attempt.trace_id(), s.attempt.span_id())
        });
        tracing::warn!(
            upstream = upstream.as_deref().unwrap_or("?"),
            code,
            %message,
            trace_id,
            span_id,
            "upstream stream failed after first byte"
        );
        self.end(false);
        if self.sse {
            let err = error_json(self.shape, &message, "upstream_error", code, "api_error");
            let frame = format!("event: error\ndata: {err}\n\n");
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(frame)))))
        } else {
            Poll::Ready(Some(Err(message.into())))
        }
    }
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let State::Done = this.state {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    if !this.first_seen && !d.is_empty() {
                        this.first_seen = true;
                        if let Some(g) = this.guard.as_mut() {
                            g.first_byte();
                        }
                        let ttft = this.started.elapsed();
                        this.metrics.observe_ttft(ttft);
                        if let Some(s) = &this.spans {
                            let ms = ttft.as_secs_f64() * 1e3;
                            s.request.set(|| vec![KeyValue::new("ttft_ms", ms)]);
                            s.attempt.set(|| vec![KeyValue::new("ttft_ms", ms)]);
                            s.attempt.event("first_byte");
                        }
                    }
                    this.bytes += d.len() as u64;
                    this.scan.feed(d);
                }
                if this.inner.is_end_stream() {
                    // A body of known length ends with its last byte: hyper's server stops
                    // polling once it has written that many, so finish (and hand the
                    // connection back) now rather than waiting for a poll that never comes.
                    this.end(true);
                } else {
                    this.active = true;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => this.fail(
                "upstream_stream_error",
                format!("upstream stream broke: {e}"),
            ),
            Poll::Ready(None) => {
                this.end(true);
                Poll::Ready(None)
            }
            Poll::Pending => {
                // The idle clock starts when the upstream goes quiet: a response that is
                // already complete never touches the timer.
                let sleep = match &mut this.sleep {
                    Some(s) => {
                        if this.active {
                            s.as_mut().reset(tokio::time::Instant::now() + this.idle);
                        }
                        s
                    }
                    None => this.sleep.insert(Box::pin(tokio::time::sleep(this.idle))),
                };
                this.active = false;
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        let idle = this.idle;
                        this.fail(
                            "upstream_idle_timeout",
                            format!("upstream sent nothing for {} ms", idle.as_millis()),
                        )
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done)
    }

    fn size_hint(&self) -> SizeHint {
        match self.state {
            State::Done => SizeHint::with_exact(0),
            State::Streaming => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_from_sse_split_across_chunks() {
        let mut s = UsageScanner {
            sse: true,
            ..Default::default()
        };
        s.feed(b"data: {\"choices\":[]}\n\ndata: {\"choices\":[],\"usa");
        s.feed(b"ge\":{\"prompt_tokens\":100,\"prompt_tokens_details\":{\"cached_tokens\":64}}}\n\ndata: [DONE]\n\n");
        assert_eq!(
            s.finish(),
            Some(Usage {
                prompt: 100,
                cached: 64,
                completion: None
            })
        );
    }

    #[test]
    fn usage_from_json_and_anthropic() {
        let mut s = UsageScanner::default();
        s.feed(br#"{"id":"x","usage":{"input_tokens":10,"cache_read_input_tokens":7,"output_tokens":3}}"#);
        assert_eq!(
            s.finish(),
            Some(Usage {
                prompt: 10,
                cached: 7,
                completion: Some(3)
            })
        );
        let mut s = UsageScanner::default();
        s.feed(br#"{"id":"x"}"#);
        assert_eq!(s.finish(), None);
    }
}
