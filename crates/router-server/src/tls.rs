//! TLS material read from PEM files: the client listener's server config, and the check
//! that the peer port's CA, certificate and key parse and belong together. Config
//! validation calls both, so a bad file stops the router before anything binds.

use anyhow::Context;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;
use tokio_rustls::TlsAcceptor;

fn certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let certs: Vec<_> = rustls_pemfile::certs(&mut std::io::BufReader::new(f))
        .collect::<Result<_, _>>()
        .with_context(|| format!("reading certificates from {}", path.display()))?;
    if certs.is_empty() {
        anyhow::bail!("no PEM certificate in {}", path.display());
    }
    Ok(certs)
}

fn key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    rustls_pemfile::private_key(&mut std::io::BufReader::new(f))
        .with_context(|| format!("reading the key from {}", path.display()))?
        .ok_or_else(|| anyhow::anyhow!("no PEM private key in {}", path.display()))
}

/// A server config for `cert` and `key` (ALPN h2 and http/1.1); fails when either does not
/// parse or the key is not the certificate's.
fn server_config(cert: &Path, key_path: &Path) -> anyhow::Result<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs(cert)?, key(key_path)?)
        .with_context(|| {
            format!(
                "{} and {} do not make a usable certificate and key",
                cert.display(),
                key_path.display()
            )
        })?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

/// The client listener's TLS acceptor.
pub fn acceptor(cert: &Path, key: &Path) -> anyhow::Result<TlsAcceptor> {
    Ok(TlsAcceptor::from(Arc::new(server_config(cert, key)?)))
}

/// Checks a peer's mutual-TLS files: the CA holds a certificate, and the certificate and
/// key parse and match.
pub fn check_peer_files(ca: &Path, cert: &Path, key: &Path) -> anyhow::Result<()> {
    let roots = certs(ca)?;
    let mut store = rustls::RootCertStore::empty();
    for c in roots {
        store
            .add(c)
            .with_context(|| format!("{} holds a certificate that is not a CA", ca.display()))?;
    }
    server_config(cert, key).map(|_| ())
}
