//! Listeners: accept with a connection limit, optional TLS, HTTP/1.1 and HTTP/2 with a
//! header-read timeout and a bounded header buffer, graceful drain on shutdown.

use crate::body::RespBody;
use crate::proxy::{handle, Ctx};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio_rustls::TlsAcceptor;

/// Serves `listener` until `shutdown` turns true, then waits (bounded) for open
/// connections to finish.
pub async fn serve(
    listener: TcpListener,
    ctx: Arc<Ctx>,
    tls: Option<TlsAcceptor>,
    metrics_only: bool,
    mut shutdown: watch::Receiver<bool>,
) {
    let limits = &ctx.cfg.limits;
    let permits = Arc::new(Semaphore::new(limits.max_connections as usize));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // hyper answers a head larger than its buffer with a bare 431; below that size our
    // handler answers with a JSON body. The buffer must be at least 8 KiB.
    let buf = (limits.max_header_bytes as usize * 2).max(16 << 10);
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(ctx.cfg.timeouts.client_header_ms))
        .max_buf_size(buf);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(buf as u32)
        .max_concurrent_streams(256);
    let graceful = GracefulShutdown::new();
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
        let _ = stream.set_nodelay(true);
        let ctx2 = ctx.clone();
        let svc = service_fn(move |req| {
            let ctx = ctx2.clone();
            async move { Ok::<_, Infallible>(handle(ctx, req, metrics_only).await) }
        });
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let tls = tls.clone();
        let header_timeout = Duration::from_millis(ctx.cfg.timeouts.client_header_ms);
        tokio::spawn(async move {
            let _permit = permit;
            match tls {
                None => {
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), svc);
                    if let Err(e) = watcher.watch(conn.into_owned()).await {
                        tracing::debug!(%peer, error = %e, "connection ended with error");
                    }
                }
                Some(acc) => {
                    let stream =
                        match tokio::time::timeout(header_timeout, acc.accept(stream)).await {
                            Ok(Ok(s)) => s,
                            Ok(Err(e)) => {
                                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                                return;
                            }
                            Err(_) => return,
                        };
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), svc);
                    if let Err(e) = watcher.watch(conn.into_owned()).await {
                        tracing::debug!(%peer, error = %e, "connection ended with error");
                    }
                }
            }
        });
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(Duration::from_secs(30)) => {
            tracing::warn!("drain timed out; closing remaining connections");
        }
    }
}

/// Binds without serving, so configuration and port errors surface before anything runs.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Loads a rustls server config from PEM files (ALPN h2 and http/1.1).
pub fn tls_acceptor(cert: &std::path::Path, key: &std::path::Path) -> anyhow::Result<TlsAcceptor> {
    use anyhow::Context;
    let certs: Vec<_> = rustls_pemfile::certs(&mut std::io::BufReader::new(
        std::fs::File::open(cert).with_context(|| format!("opening {}", cert.display()))?,
    ))
    .collect::<Result<_, _>>()
    .with_context(|| format!("reading certificates from {}", cert.display()))?;
    if certs.is_empty() {
        anyhow::bail!("no certificate in {}", cert.display());
    }
    let key = rustls_pemfile::private_key(&mut std::io::BufReader::new(
        std::fs::File::open(key).with_context(|| format!("opening {}", key.display()))?,
    ))
    .with_context(|| format!("reading the key from {}", key.display()))?
    .ok_or_else(|| anyhow::anyhow!("no private key in {}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(cfg)))
}

/// Unused marker to keep the body type in one place for listeners.
pub type Body = RespBody;
