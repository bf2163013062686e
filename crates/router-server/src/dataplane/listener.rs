//! Listeners: accept with a connection limit, optional TLS, HTTP/1.1 and HTTP/2 with a
//! header-read timeout and a bounded header buffer, graceful drain on shutdown.

use super::ctx::Ctx;
use super::head_timeout::{ConnActivity, HeadTimeout, Tracked};
use super::service::handle;
use super::upstream::Pool;
use http_body_util::BodyExt;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

/// The connection settings shared by every listener and worker.
fn conn_builder(ctx: &Ctx) -> auto::Builder<TokioExecutor> {
    let limits = &ctx.cfg.limits;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // hyper answers a head larger than its buffer with a bare 431; below that size our
    // handler answers with a JSON body. The buffer must be at least 8 KiB.
    let buf = (limits.max_header_bytes as usize * 2).max(16 << 10);
    // The head timeout is HeadTimeout's, which answers 408 (hyper's closes silently).
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .max_buf_size(buf);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(buf as u32)
        .max_concurrent_streams(256);
    builder
}

/// Serves one accepted connection on the current runtime.
#[allow(clippy::too_many_arguments)]
fn spawn_conn(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    permit: OwnedSemaphorePermit,
    ctx: &Arc<Ctx>,
    builder: &auto::Builder<TokioExecutor>,
    graceful: &GracefulShutdown,
    tls: Option<TlsAcceptor>,
    metrics_only: bool,
) {
    let _ = stream.set_nodelay(true);
    let ctx2 = ctx.clone();
    let activity = Arc::new(ConnActivity::default());
    let act = activity.clone();
    let svc = service_fn(move |req| {
        let busy = act.begin();
        let ctx = ctx2.clone();
        async move {
            let resp = handle(ctx, req, metrics_only).await;
            Ok::<_, Infallible>(resp.map(|b| Tracked::new(b, busy).boxed_unsync()))
        }
    });
    let builder = builder.clone();
    let watcher = graceful.watcher();
    let header_timeout = Duration::from_millis(ctx.cfg.timeouts.client_header_ms);
    tokio::spawn(async move {
        let _permit = permit;
        match tls {
            None => {
                let io = HeadTimeout::new(stream, activity, header_timeout, false);
                let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), svc);
                if let Err(e) = watcher.watch(conn.into_owned()).await {
                    tracing::debug!(%peer, error = %e, "connection ended with error");
                }
            }
            Some(acc) => {
                let stream = match tokio::time::timeout(header_timeout, acc.accept(stream)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => return,
                };
                let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                let io = HeadTimeout::new(stream, activity, header_timeout, h2);
                let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), svc);
                if let Err(e) = watcher.watch(conn.into_owned()).await {
                    tracing::debug!(%peer, error = %e, "connection ended with error");
                }
            }
        }
    });
}

/// Waits (bounded) for a runtime's open connections to finish.
async fn drain(graceful: GracefulShutdown) {
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(Duration::from_secs(30)) => {
            tracing::warn!("drain timed out; closing remaining connections");
        }
    }
}

type Accepted = (std::net::TcpStream, SocketAddr, OwnedSemaphorePermit);
/// Where connections go, and a receiver per worker completing once it has drained.
type Workers = (
    Vec<mpsc::UnboundedSender<Accepted>>,
    Vec<oneshot::Receiver<()>>,
);

/// Starts `n` data-plane threads, each running its own single-threaded runtime with its own
/// upstream connection pool, like nginx's worker processes: a request, its upstream
/// connection and its relay stay on one thread, with no work stealing or cross-thread
/// wakeups between them.
fn start_workers(n: usize, ctx: &Arc<Ctx>, tls: &Option<TlsAcceptor>) -> std::io::Result<Workers> {
    let mut senders = Vec::with_capacity(n);
    let mut done = Vec::with_capacity(n);
    for i in 0..n {
        let (tx, mut rx) = mpsc::unbounded_channel::<Accepted>();
        let (done_tx, done_rx) = oneshot::channel();
        let ctx = Arc::new(ctx.for_worker());
        let tls = tls.clone();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name(format!("router-worker-{i}"))
            .spawn(move || {
                rt.block_on(async move {
                    tokio::spawn(Pool::sweeper(Arc::downgrade(&ctx.pool)));
                    let builder = conn_builder(&ctx);
                    let graceful = GracefulShutdown::new();
                    while let Some((stream, peer, permit)) = rx.recv().await {
                        let stream = match tokio::net::TcpStream::from_std(stream) {
                            Ok(s) => s,
                            Err(e) => {
                                tracing::warn!(%peer, error = %e, "cannot register connection");
                                continue;
                            }
                        };
                        spawn_conn(
                            stream,
                            peer,
                            permit,
                            &ctx,
                            &builder,
                            &graceful,
                            tls.clone(),
                            false,
                        );
                    }
                    drain(graceful).await;
                });
                let _ = done_tx.send(());
            })?;
        senders.push(tx);
        done.push(done_rx);
    }
    Ok((senders, done))
}

/// Serves `listener` until `shutdown` turns true, then waits (bounded) for open
/// connections to finish. Client traffic is served by `cfg.workers` data-plane threads;
/// the metrics listener stays on the main runtime.
pub async fn serve(
    listener: TcpListener,
    ctx: Arc<Ctx>,
    tls: Option<TlsAcceptor>,
    metrics_only: bool,
    mut shutdown: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(ctx.cfg.limits.max_connections as usize));
    let builder = conn_builder(&ctx);
    let graceful = GracefulShutdown::new();
    let n = match ctx.cfg.workers {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let (workers, done) = if metrics_only {
        (Vec::new(), Vec::new())
    } else {
        match start_workers(n, &ctx, &tls) {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(error = %e, "cannot start data-plane threads; serving on the main runtime");
                (Vec::new(), Vec::new())
            }
        }
    };
    let mut next = 0usize;
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = shutdown.changed() => break,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        if workers.is_empty() {
            spawn_conn(
                stream,
                peer,
                permit,
                &ctx,
                &builder,
                &graceful,
                tls.clone(),
                metrics_only,
            );
            continue;
        }
        // Round robin: keep-alive clients hold their connection, so accepts are rare.
        let w = &workers[next % workers.len()];
        next = next.wrapping_add(1);
        match stream.into_std() {
            Ok(s) => {
                if w.send((s, peer, permit)).is_err() {
                    tracing::warn!(%peer, "data-plane thread gone; connection dropped");
                }
            }
            Err(e) => tracing::warn!(%peer, error = %e, "cannot hand the connection over"),
        }
    }
    drop(listener);
    drop(workers);
    drain(graceful).await;
    for d in done {
        let _ = d.await;
    }
}

/// Binds without serving, so configuration and port errors surface before anything runs.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}
