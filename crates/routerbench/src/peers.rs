//! The routers ours is measured against, run on the same fleet in the same comparison:
//! the SGLang model gateway (`smg`) and vllm-router, both with their `cache_aware` policy,
//! installed from PyPI into a virtual environment this command makes on first use.

use crate::compare::Fleet;
use crate::procs::{free_port, spawn, Proc};
use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A peer router: its name (also its executable's), the pinned package, and the label
/// of its run.
pub struct Peer {
    /// Executable in the venv's `bin/`.
    pub name: &'static str,
    /// `pip install` requirement.
    pub package: &'static str,
    /// Report label.
    pub label: &'static str,
}

/// The peers measured by default.
pub const PEERS: [Peer; 2] = [
    Peer {
        name: "smg",
        package: "smg==1.13.0",
        label: "smg cache_aware",
    },
    Peer {
        name: "vllm-router",
        package: "vllm-router==0.1.17",
        label: "vllm-router cache_aware",
    },
];

/// The peer's executable, installing the package into `venv` when it is missing.
pub fn install(venv: &Path, peer: &Peer) -> anyhow::Result<PathBuf> {
    let bin = venv.join("bin").join(peer.name);
    if bin.exists() {
        return Ok(bin);
    }
    if !venv.join("bin/pip").exists() {
        eprintln!(
            "== making a venv for the peer routers at {}",
            venv.display()
        );
        let ok = Command::new("python3")
            .args(["-m", "venv"])
            .arg(venv)
            .status()?
            .success();
        anyhow::ensure!(ok, "python3 -m venv {} failed", venv.display());
    }
    eprintln!("== pip install {}", peer.package);
    let out = Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", peer.package])
        .output()?;
    anyhow::ensure!(
        out.status.success() && bin.exists(),
        "pip install {} failed: {}",
        peer.package,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(bin)
}

/// Starts a peer router with `cache_aware` in front of `fleet`; returns it once it lists
/// the model (its workers are registered and healthy).
pub async fn start(
    peer: &Peer,
    bin: &Path,
    dir: &Path,
    fleet: &Fleet,
) -> anyhow::Result<(Proc, String)> {
    let port = free_port()?;
    let mut cmd = Command::new(bin);
    if peer.name == "smg" {
        cmd.arg("launch");
    }
    cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--policy", "cache_aware"])
        // Both serve Prometheus on port 29000 unless told otherwise.
        .args(["--prometheus-port", &free_port()?.to_string()])
        .args([
            "--log-level",
            if peer.name == "smg" {
                "warn"
            } else {
                "warning"
            },
        ])
        .arg("--worker-urls")
        .args(fleet.addrs.iter().map(|a| format!("http://{a}")));
    let p = spawn(peer.name, cmd, &dir.join(format!("{}.log", peer.name)))?;
    let url = format!("http://127.0.0.1:{port}");
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .build(hyper_util::client::legacy::connect::HttpConnector::new());
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(uri) = format!("{url}/v1/models").parse::<hyper::Uri>() {
            if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(2), client.get(uri)).await {
                if r.status().is_success() {
                    return Ok((p, url));
                }
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{} did not list the model within 120 s; see {}",
            peer.name,
            dir.join(format!("{}.log", peer.name)).display()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
