//! A cluster of real `router` processes for the integration tests: start, kill -9,
//! restart from the same data directory, read `/health`.

use crate::{client, free_addr, start_router, Proc, TempDir, ADMIN_TOKEN};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// PEM files of a test PKI: one CA and one certificate (valid for every loopback address
/// the tests use, as server and client) signed by it.
#[derive(Debug, Clone)]
pub struct Pki {
    /// CA certificate.
    pub ca: PathBuf,
    /// Leaf certificate.
    pub cert: PathBuf,
    /// Leaf key.
    pub key: PathBuf,
}

impl Pki {
    /// Generates a fresh CA and leaf under `dir` (files prefixed with `tag`).
    pub fn generate(dir: &TempDir, tag: &str, ips: &[SocketAddr]) -> Pki {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair,
        };
        let ca_key = KeyPair::generate().expect("ca key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, format!("router test CA {tag}"));
        let ca_cert = ca_params.self_signed(&ca_key).expect("ca cert");
        let issuer = Issuer::new(ca_params, ca_key);
        let mut names: Vec<String> = ips.iter().map(|a| a.ip().to_string()).collect();
        names.push("localhost".into());
        names.sort();
        names.dedup();
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(names).expect("params");
        params
            .distinguished_name
            .push(DnType::CommonName, format!("router peer {tag}"));
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &issuer).expect("leaf");
        let pki = Pki {
            ca: dir.path(&format!("{tag}-ca.pem")),
            cert: dir.path(&format!("{tag}-cert.pem")),
            key: dir.path(&format!("{tag}-key.pem")),
        };
        std::fs::write(&pki.ca, ca_cert.pem()).expect("write ca");
        std::fs::write(&pki.cert, cert.pem()).expect("write cert");
        std::fs::write(&pki.key, key.serialize_pem()).expect("write key");
        pki
    }
}

/// GET `/health` with the admin token (the detailed answer: upstreams and Raft status), as
/// JSON (None when the peer does not answer in 2 s).
pub async fn health(addr: SocketAddr) -> Option<serde_json::Value> {
    health_as(addr, ADMIN_TOKEN).await
}

/// [`health`] with another admin token.
pub async fn health_as(addr: SocketAddr, token: &str) -> Option<serde_json::Value> {
    let req = http::Request::get(format!("http://{addr}/health"))
        .header("authorization", format!("Bearer {token}"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .ok()?;
    let resp = tokio::time::timeout(Duration::from_secs(2), client().request(req))
        .await
        .ok()?
        .ok()?;
    let b = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .ok()?
        .to_bytes();
    serde_json::from_slice(&b).ok()
}

/// Polls `f` every 50 ms until it holds; panics after `secs`.
pub async fn wait_until(what: &str, secs: u64, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Several `router` peers.
pub struct Cluster {
    /// Client HTTP addresses.
    pub http: Vec<SocketAddr>,
    /// Peer (Raft + admin gRPC) addresses.
    pub raft: Vec<SocketAddr>,
    /// Running processes (None while a peer is down).
    pub procs: Vec<Option<Proc>>,
    dirs: Vec<TempDir>,
    tomls: Vec<String>,
    top: String,
    cluster: String,
    timing: (u64, u64, u64),
    data: TempDir,
}

impl Cluster {
    /// Addresses for `n` peers (to put in certificates before starting).
    pub fn addresses(n: usize) -> (Vec<SocketAddr>, Vec<SocketAddr>) {
        (
            (0..n).map(|_| free_addr()).collect(),
            (0..n).map(|_| free_addr()).collect(),
        )
    }

    /// Starts `http.len()` peers with `top` (top-level TOML, e.g. upstreams) and `cluster`
    /// (extra `[cluster]` keys and sub-tables), with fast Raft timings (heartbeat 50 ms,
    /// election 200-400 ms).
    pub async fn start(
        http: Vec<SocketAddr>,
        raft: Vec<SocketAddr>,
        top: &str,
        cluster: &str,
    ) -> Cluster {
        Self::start_timed(http, raft, top, cluster, (50, 200, 400)).await
    }

    /// Like [`Cluster::start`] with Raft timings `(heartbeat, election min, election max)` ms.
    pub async fn start_timed(
        http: Vec<SocketAddr>,
        raft: Vec<SocketAddr>,
        top: &str,
        cluster: &str,
        timing: (u64, u64, u64),
    ) -> Cluster {
        let mut c = Cluster {
            http: Vec::new(),
            raft: Vec::new(),
            procs: Vec::new(),
            dirs: Vec::new(),
            tomls: Vec::new(),
            top: top.to_owned(),
            cluster: cluster.to_owned(),
            timing,
            data: TempDir::new("cluster-data"),
        };
        for (h, r) in http.iter().zip(&raft) {
            c.add(*h, *r, &raft);
        }
        for i in 0..http.len() {
            c.spawn(i).await;
        }
        c
    }

    /// Registers peer `http.len() + 1` (not started) that knows `peers` as the voters.
    fn add(&mut self, http: SocketAddr, raft: SocketAddr, peers: &[SocketAddr]) -> usize {
        let i = self.http.len();
        let (hb, emin, emax) = self.timing;
        let peers_toml: String = peers
            .iter()
            .enumerate()
            .map(|(k, a)| format!("[[cluster.peers]]\nid = {}\naddr = \"{a}\"\n", k + 1))
            .collect();
        let toml = format!(
            "listen = \"{http}\"\n{}\n[cluster]\nnode_id = {}\nlisten = \"{raft}\"\ndata_dir = \"{}\"\ncluster_id = \"test\"\nheartbeat_ms = {hb}\nelection_min_ms = {emin}\nelection_max_ms = {emax}\n{}\n{peers_toml}",
            self.top,
            i + 1,
            self.data.path(&format!("peer{i}")).display(),
            self.cluster,
        );
        self.http.push(http);
        self.raft.push(raft);
        self.tomls.push(toml);
        self.dirs.push(TempDir::new(&format!("peer{i}")));
        self.procs.push(None);
        i
    }

    /// Starts one more router process, node id = its index + 1, with the same settings. It
    /// is not the lowest id, so it initializes nothing: it waits for `routerctl peers add`.
    pub async fn spawn_new_peer(&mut self, http: SocketAddr, raft: SocketAddr) -> usize {
        let mut peers = self.raft.clone();
        peers.push(raft);
        let i = self.add(http, raft, &peers);
        self.spawn(i).await;
        i
    }

    /// (Re)starts peer `i` with its config and data directory.
    pub async fn spawn(&mut self, i: usize) {
        let p = start_router(
            &self.dirs[i],
            &self.tomls[i],
            &[("ROUTER_ADMIN_TOKEN", ADMIN_TOKEN)],
            self.http[i],
        )
        .await;
        self.procs[i] = Some(p);
    }

    /// Peer `i`'s Raft data directory.
    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.data.path(&format!("peer{i}"))
    }

    /// Starts peer `i` without waiting for it to serve (for a start that should fail).
    pub fn spawn_unchecked(&self, i: usize) -> Proc {
        let cfg = self.dirs[i].path("router.toml");
        std::fs::write(&cfg, &self.tomls[i]).expect("write config");
        crate::spawn_router(
            &self.dirs[i],
            &["--config", cfg.to_str().expect("utf8")],
            &[("ROUTER_ADMIN_TOKEN", ADMIN_TOKEN)],
        )
    }

    /// `kill -9` of peer `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.procs[i].take() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }

    /// Indexes of running peers.
    pub fn alive(&self) -> Vec<usize> {
        (0..self.procs.len())
            .filter(|i| self.procs[*i].is_some())
            .collect()
    }

    /// `/health` of peer `i`.
    pub async fn health(&self, i: usize) -> Option<serde_json::Value> {
        health(self.http[i]).await
    }

    /// Waits until every running peer knows a leader and routes to `upstreams` servers.
    pub async fn wait_formed(&self, upstreams: usize, secs: u64) {
        wait_until(
            "a leader and every upstream on every peer",
            secs,
            async || {
                for i in self.alive() {
                    let Some(h) = self.health(i).await else {
                        return false;
                    };
                    if h["cluster"]["leader"].is_null() || h["upstreams_total"] != upstreams {
                        return false;
                    }
                }
                true
            },
        )
        .await;
    }

    /// The leader's node id as some running peer sees it.
    pub async fn leader(&self) -> Option<u64> {
        for i in self.alive() {
            if let Some(h) = self.health(i).await {
                if let Some(l) = h["cluster"]["leader"].as_u64() {
                    return Some(l);
                }
            }
        }
        None
    }

    /// Running peers' state digests.
    pub async fn digests(&self) -> Vec<String> {
        let mut v = Vec::new();
        for i in self.alive() {
            let h = self.health(i).await.unwrap_or_default();
            v.push(
                h["cluster"]["state_digest"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned(),
            );
        }
        v
    }

    /// Waits until every running peer has the same digest and applied index.
    pub async fn wait_converged(&self, secs: u64) {
        wait_until("equal digests on every running peer", secs, async || {
            let mut seen = Vec::new();
            for i in self.alive() {
                let Some(h) = self.health(i).await else {
                    return false;
                };
                seen.push((
                    h["cluster"]["state_digest"]
                        .as_str()
                        .unwrap_or("")
                        .to_owned(),
                    h["cluster"]["applied_index"].as_u64(),
                ));
            }
            !seen.is_empty() && !seen[0].0.is_empty() && seen.windows(2).all(|w| w[0] == w[1])
        })
        .await;
    }

    /// The log of peer `i` (empty when down).
    pub fn log(&self, i: usize) -> String {
        self.procs[i].as_ref().map(|p| p.log()).unwrap_or_default()
    }
}
