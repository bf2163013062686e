//! The request-head timeout with an answer: a client that starts a request head and does
//! not finish it within `timeouts.client_header_ms` gets `408` with a JSON body, then the
//! connection closes. (hyper's own head timer closes silently; it is turned off for
//! HTTP/1.1 and this wrapper takes its place.) A kept-alive connection that stays idle
//! that long is closed without an answer, as before: it has no request to answer.
//!
//! The wrapper sits between the socket (or TLS stream) and hyper. It cannot see where a
//! head ends, so the service tells it: [`ConnActivity::begin`] when a request reaches the
//! handler, the guard's drop when its response is done. Between those the connection is
//! busy and reads pass straight through (the body has its own timeout).

use bytes::Bytes;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// What the handler tells the connection about its requests.
#[derive(Default)]
pub struct ConnActivity {
    busy: AtomicUsize,
    done: AtomicU64,
}

/// A request in progress on a connection; dropping it (response written, or the request
/// abandoned) makes the connection wait for the next head.
pub struct Busy(Arc<ConnActivity>);

impl ConnActivity {
    /// A request head was read whole and reached the handler.
    pub fn begin(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Relaxed);
        Busy(self.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.done.fetch_add(1, Relaxed);
        self.0.busy.fetch_sub(1, Relaxed);
    }
}

/// A response body that keeps its request's [`Busy`] until hyper is done with it.
pub struct Tracked<B> {
    inner: B,
    _busy: Busy,
}

impl<B> Tracked<B> {
    /// `inner`, counted as busy until dropped.
    pub fn new(inner: B, busy: Busy) -> Self {
        Tracked { inner, _busy: busy }
    }
}

impl<B: http_body::Body + Unpin> http_body::Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0";

/// The answer to a head that did not arrive in time.
fn timeout_response(ms: u128) -> Bytes {
    let body = serde_json::json!({"error": {
        "message": format!("timed out reading the request head ({ms} ms)"),
        "type": "invalid_request_error", "code": "request_timeout", "param": null}})
    .to_string();
    Bytes::from(format!(
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    ))
}

enum Phase {
    /// Reads pass through; the head timer runs while no request is in progress.
    Open,
    /// Writing the 408, then reads end.
    Answering(Bytes),
    /// Reads end (hyper then closes the connection).
    Closed,
}

/// A connection whose request heads must arrive within a deadline.
pub struct HeadTimeout<T> {
    inner: T,
    activity: Arc<ConnActivity>,
    timeout: Duration,
    /// Deadline of the head being waited for, and the `done` count it was armed at.
    armed: Option<(Instant, u64)>,
    sleep: Pin<Box<Sleep>>,
    /// Bytes read since the deadline was armed: a head has started.
    started: bool,
    /// HTTP/2 (by ALPN or preface): streams have their own limits; pass everything through.
    h2: bool,
    first_read: bool,
    phase: Phase,
}

impl<T> HeadTimeout<T> {
    /// Wraps `inner`; `h2` when TLS negotiated HTTP/2.
    pub fn new(inner: T, activity: Arc<ConnActivity>, timeout: Duration, h2: bool) -> Self {
        HeadTimeout {
            inner,
            activity,
            timeout,
            armed: None,
            sleep: Box::pin(tokio::time::sleep(timeout)),
            started: false,
            h2,
            first_read: true,
            phase: Phase::Open,
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> HeadTimeout<T> {
    /// Writes what is left of the 408 and flushes it; then reads end.
    fn poll_answer(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Phase::Answering(b) = &mut self.phase {
            if b.is_empty() {
                // Best effort: a client that does not read its answer is not waited for.
                let _ = ready!(Pin::new(&mut self.inner).poll_flush(cx));
                self.phase = Phase::Closed;
                break;
            }
            match ready!(Pin::new(&mut self.inner).poll_write(cx, b)) {
                Ok(0) | Err(_) => self.phase = Phase::Closed,
                Ok(n) => {
                    let _ = b.split_to(n);
                }
            }
        }
        Poll::Ready(Ok(()))
    }

    fn expire(&mut self) {
        tracing::debug!(started = self.started, "request head timed out");
        self.phase = if self.started {
            Phase::Answering(timeout_response(self.timeout.as_millis()))
        } else {
            Phase::Closed
        };
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for HeadTimeout<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match this.phase {
            Phase::Open => {}
            Phase::Answering(_) => return this.poll_answer(cx),
            Phase::Closed => return Poll::Ready(Ok(())),
        }
        if this.h2 || this.activity.busy.load(Relaxed) > 0 {
            this.armed = None;
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        // Waiting for a head: arm the deadline once per request.
        let done = this.activity.done.load(Relaxed);
        let deadline = match this.armed {
            Some((d, at)) if at == done => d,
            _ => {
                let d = Instant::now() + this.timeout;
                this.armed = Some((d, done));
                this.started = false;
                this.sleep.as_mut().reset(d);
                d
            }
        };
        // A head dripped in byte by byte never leaves the inner read pending: check the
        // clock on every read, not only when waiting.
        if Instant::now() >= deadline {
            this.expire();
            return match this.phase {
                Phase::Answering(_) => this.poll_answer(cx),
                _ => Poll::Ready(Ok(())),
            };
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = &buf.filled()[before..];
                if this.first_read && !read.is_empty() {
                    this.first_read = false;
                    let n = read.len().min(H2_PREFACE.len());
                    this.h2 = read[..n] == H2_PREFACE[..n] && n == H2_PREFACE.len();
                }
                this.started |= !read.is_empty();
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match this.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.expire();
                    match this.phase {
                        Phase::Answering(_) => this.poll_answer(cx),
                        _ => Poll::Ready(Ok(())),
                    }
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for HeadTimeout<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn pair(
        timeout_ms: u64,
    ) -> (
        HeadTimeout<tokio::io::DuplexStream>,
        tokio::io::DuplexStream,
        Arc<ConnActivity>,
    ) {
        let (a, b) = tokio::io::duplex(4096);
        let act = Arc::new(ConnActivity::default());
        (
            HeadTimeout::new(a, act.clone(), Duration::from_millis(timeout_ms), false),
            b,
            act,
        )
    }

    #[tokio::test]
    async fn a_started_head_gets_408_and_the_read_ends() {
        let (mut server, mut client, _) = pair(100).await;
        client.write_all(b"GET / HTTP/1.1\r\nhost").await.unwrap();
        let mut buf = [0u8; 64];
        let n = server.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"GET / HTTP/1.1\r\nhost");
        let t = std::time::Instant::now();
        assert_eq!(server.read(&mut buf).await.unwrap(), 0, "read did not end");
        assert!(t.elapsed() >= Duration::from_millis(80));
        drop(server);
        let mut got = String::new();
        client.read_to_string(&mut got).await.unwrap();
        assert!(got.starts_with("HTTP/1.1 408 "), "{got}");
        assert!(got.contains("\"code\":\"request_timeout\""), "{got}");
    }

    #[tokio::test]
    async fn a_dripped_head_still_times_out() {
        let (mut server, mut client, _) = pair(150).await;
        let drip = tokio::spawn(async move {
            for _ in 0..20 {
                if client.write_all(b"x").await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            client
        });
        let mut buf = [0u8; 64];
        let t = std::time::Instant::now();
        while server.read(&mut buf).await.unwrap() > 0 {}
        assert!(
            t.elapsed() < Duration::from_millis(350),
            "{:?}",
            t.elapsed()
        );
        drop(server);
        let mut client = drip.await.unwrap();
        let mut got = Vec::new();
        let _ = client.read_to_end(&mut got).await;
        assert!(String::from_utf8_lossy(&got).contains("HTTP/1.1 408"));
    }

    #[tokio::test]
    async fn idle_connections_close_silently_and_busy_ones_are_not_timed() {
        let (mut server, mut client, act) = pair(80).await;
        // Busy: a request in progress is not subject to the head timer.
        let busy = act.begin();
        client.write_all(b"body").await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
        let mut buf = [0u8; 16];
        assert_eq!(server.read(&mut buf).await.unwrap(), 4);
        drop(busy);
        // Idle after the response: closed without an answer once the timer runs out.
        assert_eq!(server.read(&mut buf).await.unwrap(), 0);
        drop(server);
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert!(got.is_empty(), "an idle connection got {got:?}");
    }
}
