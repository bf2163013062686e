//! `routerbench cluster`: the same seeded agent workload through one `router` and through a
//! Raft cluster of `router` peers (each turn to a random peer, as DNS round-robin does), each
//! on a fresh engine-sim fleet. Prints one table and the turns/min ratio.

use crate::compare::{params, start_fleet, start_router, CompareArgs, Fleet};
use crate::procs::{free_port, sibling, spawn, wait_port, Proc};
use crate::workload::{self, Report};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Settings.
#[derive(Debug, Clone, clap::Args)]
pub struct ClusterArgs {
    /// Fleet and workload settings (policies and nginx flags are ignored).
    #[command(flatten)]
    pub base: CompareArgs,
    /// Router peers in the cluster run.
    #[arg(long, default_value_t = 3)]
    pub peers: usize,
}

/// `GET /health` over a plain socket (the benchmark needs nothing more).
pub async fn get_health(addr: SocketAddr) -> Option<serde_json::Value> {
    let mut s = tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    s.write_all(b"GET /health HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .ok()?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut buf))
        .await
        .ok()?
        .ok()?;
    let i = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    serde_json::from_slice(&buf[i + 4..]).ok()
}

async fn start_peers(
    dir: &Path,
    fleet: &Fleet,
    n: usize,
    capacity: u64,
) -> anyhow::Result<(Vec<Proc>, Vec<String>)> {
    let http: Vec<u16> = (0..n).map(|_| free_port()).collect::<Result<_, _>>()?;
    let raft: Vec<u16> = (0..n).map(|_| free_port()).collect::<Result<_, _>>()?;
    let mut peers = String::new();
    for (i, p) in raft.iter().enumerate() {
        peers.push_str(&format!(
            "[[cluster.peers]]\nid = {}\naddr = \"127.0.0.1:{p}\"\n",
            i + 1
        ));
    }
    let ups: String = fleet
        .addrs
        .iter()
        .map(|u| format!("[[upstreams]]\nurl = \"http://{u}\"\ncapacity_tokens = {capacity}\n"))
        .collect();
    let mut procs = Vec::new();
    for i in 0..n {
        let data = dir.join(format!("peer{i}-data"));
        let _ = std::fs::remove_dir_all(&data);
        let toml = format!(
            "listen = \"127.0.0.1:{}\"\npolicy = \"prefix\"\n[log]\nlevel = \"warn\"\n{ups}[cluster]\nnode_id = {}\nlisten = \"127.0.0.1:{}\"\ndata_dir = \"{}\"\ncluster_id = \"bench\"\n{peers}",
            http[i],
            i + 1,
            raft[i],
            data.display()
        );
        let cfg = dir.join(format!("peer{i}.toml"));
        std::fs::write(&cfg, toml)?;
        let mut cmd = Command::new(sibling("router")?);
        cmd.arg("--config").arg(&cfg);
        procs.push(spawn("router", cmd, &dir.join(format!("peer{i}.log")))?);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for p in &http {
        let a = SocketAddr::from(([127, 0, 0, 1], *p));
        wait_port(a, "router peer").await?;
        loop {
            let h = get_health(a).await.unwrap_or_default();
            if !h["cluster"]["leader"].is_null() && h["upstreams_total"] == fleet.addrs.len() {
                break;
            }
            if Instant::now() > deadline {
                anyhow::bail!("the cluster did not form; logs in {}", dir.display());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok((
        procs,
        http.iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect(),
    ))
}

/// Runs one router, then the cluster, and prints the comparison.
pub async fn run(a: ClusterArgs) -> anyhow::Result<Vec<Report>> {
    let dir = match &a.base.workdir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("routerbench-cluster-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    let b = &a.base;
    let salt = crate::fresh_salt();
    let mut reports = Vec::new();

    eprintln!("== one router (prefix, no cluster)");
    std::fs::create_dir_all(dir.join("cluster"))?;
    let fleet = start_fleet(b, &dir, "single").await?;
    let (single, url) = start_router(&dir, &fleet, "prefix", b.capacity_tokens).await?;
    let mut r = workload::run(params(b, url, salt), "1 router").await?;
    r.label = "1 router".into();
    reports.push(r);
    drop(single);
    drop(fleet);

    let label = format!("{} routers (raft)", a.peers);
    eprintln!("== {label}, each turn to a random peer");
    let fleet = start_fleet(b, &dir, "cluster").await?;
    let (procs, urls) =
        start_peers(&dir.join("cluster"), &fleet, a.peers, b.capacity_tokens).await?;
    let mut p = params(b, urls[0].clone(), salt.wrapping_add(1));
    p.urls = urls;
    let mut r = workload::run(p, &label).await?;
    r.label = label;
    reports.push(r);
    drop(procs);

    println!(
        "\nworkload {:?}: {} developers, {} ranks, {} s per run, scale {}, speed {}x, KV {} tokens/rank\n",
        b.workload, b.developers, b.ranks, b.duration, b.scale, b.speed, b.capacity_tokens
    );
    print!("{}", workload::table(&reports, &[("x 1", "1 router")]));
    if let Some(p) = &b.json {
        std::fs::write(p, serde_json::to_vec_pretty(&reports)?)?;
    }
    Ok(reports)
}
