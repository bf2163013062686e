//! Mutual TLS between peers: every peer presents a certificate signed by the cluster CA and
//! checks the other side's against it.

use std::path::PathBuf;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// PEM files of one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerTls {
    /// The cluster CA (verifies peers and admin clients' certificates).
    pub ca: PathBuf,
    /// This peer's certificate (used as server and as client certificate).
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

/// Loaded TLS settings for both directions.
#[derive(Debug, Clone)]
pub struct LoadedTls {
    /// For the peer listener.
    pub server: ServerTlsConfig,
    /// For calls to other peers.
    pub client: ClientTlsConfig,
}

fn read(p: &PathBuf) -> anyhow::Result<Vec<u8>> {
    std::fs::read(p).map_err(|e| anyhow::anyhow!("reading {}: {e}", p.display()))
}

impl PeerTls {
    /// Reads the PEM files.
    pub fn load(&self) -> anyhow::Result<LoadedTls> {
        let ca = Certificate::from_pem(read(&self.ca)?);
        let id = Identity::from_pem(read(&self.cert)?, read(&self.key)?);
        // A client certificate is optional at the TLS layer so that `routerctl` can reach
        // the admin service with a token alone; the peer service refuses calls without one.
        let server = ServerTlsConfig::new()
            .identity(id.clone())
            .client_ca_root(ca.clone())
            .client_auth_optional(true);
        let client = ClientTlsConfig::new().ca_certificate(ca).identity(id);
        Ok(LoadedTls { server, client })
    }
}
