//! Upstream HTTP/1.1 connections for the data plane: one pool per data-plane thread, so a
//! request, its upstream connection and the task driving that connection share a thread.
//!
//! A connection goes back to the pool only when its response body has been read to the end
//! ([`Lease::release`]); a relay dropped early (client gone, stream error) drops the
//! connection with it, which closes it and so cancels the request upstream. Nothing here
//! runs per request except a map lookup under an uncontended lock: no URI round trip, no
//! background task to wait for readiness, no timer.

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::{Builder, SendRequest};
use hyper::Response;
use hyper_util::rt::TokioIo;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

type Sender = SendRequest<Full<Bytes>>;

/// Why an attempt failed (before any response byte).
#[derive(Debug)]
pub enum SendError {
    /// No connection could be opened.
    Connect(String),
    /// The connection failed while sending or before the response head.
    Failed(hyper::Error),
}

impl SendError {
    /// Metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            SendError::Connect(_) => "connect",
            SendError::Failed(_) => "reset",
        }
    }
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Connect(e) => write!(f, "cannot connect: {e}"),
            SendError::Failed(e) => write!(f, "{e}"),
        }
    }
}

struct Idle {
    tx: Sender,
    since: Instant,
}

impl Idle {
    /// Still worth reusing at `now`: open, and idle for less than `timeout`.
    fn usable(&self, now: Instant, timeout: Duration) -> bool {
        !self.tx.is_closed() && now - self.since < timeout
    }
}

/// Settings of a pool.
#[derive(Debug, Clone, Copy)]
pub struct PoolConfig {
    /// Opening a connection (TCP connect and handshake).
    pub connect_timeout: Duration,
    /// Idle connections kept per upstream.
    pub max_idle_per_upstream: usize,
    /// An idle connection older than this is closed.
    pub idle_timeout: Duration,
}

/// Idle connections by upstream authority (`host:port`).
pub struct Pool {
    cfg: PoolConfig,
    idle: Mutex<HashMap<Arc<str>, VecDeque<Idle>>>,
}

/// A connection in use; hand it back with [`Lease::release`] once the response is complete.
pub struct Lease {
    pool: Arc<Pool>,
    authority: Arc<str>,
    tx: Sender,
}

impl Lease {
    /// The response was read to its end: the connection may serve another request.
    pub fn release(self) {
        self.pool.checkin(self.authority, self.tx);
    }
}

impl Pool {
    /// An empty pool.
    pub fn new(cfg: PoolConfig) -> Arc<Pool> {
        Arc::new(Pool {
            cfg,
            idle: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, VecDeque<Idle>>> {
        // The map holds no invariant a panic could break half way.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The most recently used idle connection to `authority` that is still open.
    fn checkout(&self, authority: &str) -> Option<Sender> {
        let mut map = self.lock();
        let q = map.get_mut(authority)?;
        let now = Instant::now();
        while let Some(i) = q.pop_back() {
            if i.usable(now, self.cfg.idle_timeout) {
                return Some(i.tx);
            }
        }
        None
    }

    fn checkin(&self, authority: Arc<str>, tx: Sender) {
        if tx.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut map = self.lock();
        let q = map.entry(authority).or_default();
        // The oldest sit at the front: expire a few on the way, so a pool that is always
        // busy never needs the sweeper.
        while q
            .front()
            .is_some_and(|i| !i.usable(now, self.cfg.idle_timeout))
        {
            q.pop_front();
        }
        if q.len() < self.cfg.max_idle_per_upstream {
            q.push_back(Idle { tx, since: now });
        }
    }

    /// Closes idle connections that expired or that their upstream closed; drops upstreams
    /// with none left. Run every few seconds by [`Pool::sweeper`].
    pub fn sweep(&self) {
        let now = Instant::now();
        let mut map = self.lock();
        for q in map.values_mut() {
            q.retain(|i| i.usable(now, self.cfg.idle_timeout));
        }
        map.retain(|_, q| !q.is_empty());
    }

    /// Sweeps until the pool is dropped; spawn it on the runtime that uses the pool.
    pub async fn sweeper(pool: std::sync::Weak<Pool>) {
        let every = match pool.upgrade() {
            Some(p) => (p.cfg.idle_timeout / 4).max(Duration::from_millis(100)),
            None => return,
        };
        loop {
            tokio::time::sleep(every).await;
            match pool.upgrade() {
                Some(p) => p.sweep(),
                None => return,
            }
        }
    }

    async fn connect(&self, authority: &str) -> Result<Sender, SendError> {
        let open = async {
            let stream = TcpStream::connect(authority)
                .await
                .map_err(|e| SendError::Connect(e.to_string()))?;
            let _ = stream.set_nodelay(true);
            let keepalive = socket2::TcpKeepalive::new().with_time(Duration::from_secs(30));
            let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive);
            let (tx, conn) = Builder::new()
                .writev(true)
                .handshake::<_, Full<Bytes>>(TokioIo::new(stream))
                .await
                .map_err(|e| SendError::Connect(e.to_string()))?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "upstream connection ended with error");
                }
            });
            Ok(tx)
        };
        tokio::time::timeout(self.cfg.connect_timeout, open)
            .await
            .map_err(|_| {
                SendError::Connect(format!(
                    "timed out after {} ms",
                    self.cfg.connect_timeout.as_millis()
                ))
            })?
    }

    /// Sends `req` (origin-form URI, `Host` set) to `authority` on an idle connection, or a
    /// new one. A request that a closing idle connection refused before writing it goes to
    /// the next one, so an upstream's keep-alive timeout never fails a request.
    pub async fn send(
        self: &Arc<Self>,
        authority: &Arc<str>,
        mut req: Request<Full<Bytes>>,
    ) -> Result<(Response<Incoming>, Lease), SendError> {
        while let Some(mut tx) = self.checkout(authority) {
            // Ready at once unless the connection is still finishing its last response.
            if tx.ready().await.is_err() {
                continue;
            }
            match tx.try_send_request(req).await {
                Ok(resp) => return Ok((resp, self.lease(authority, tx))),
                Err(mut e) => match e.take_message() {
                    Some(r) => req = r,
                    None => return Err(SendError::Failed(e.into_error())),
                },
            }
        }
        let mut tx = self.connect(authority).await?;
        match tx.try_send_request(req).await {
            Ok(resp) => Ok((resp, self.lease(authority, tx))),
            Err(e) => Err(SendError::Failed(e.into_error())),
        }
    }

    fn lease(self: &Arc<Self>, authority: &Arc<str>, tx: Sender) -> Lease {
        Lease {
            pool: self.clone(),
            authority: authority.clone(),
            tx,
        }
    }
}
