//! `routerbench compare`: one engine-sim fleet per run, the router under each policy and
//! nginx least_conn in turn, the same seeded workload through each, one table.

use crate::procs::{free_port, sibling, spawn, start_nginx, wait_port, Proc};
use crate::workload::{self, Kind, Params, Report};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Settings of a comparison.
#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {
    /// Engine ranks (one enginesim port each).
    #[arg(long, default_value_t = 8)]
    pub ranks: usize,
    /// Concurrent developers.
    #[arg(long, default_value_t = 48)]
    pub developers: usize,
    /// Seconds per run.
    #[arg(long, default_value_t = 60)]
    pub duration: u64,
    /// Prompt size factor.
    #[arg(long, default_value_t = 0.25)]
    pub scale: f64,
    /// Engine speed factor (gaps are divided by it too).
    #[arg(long, default_value_t = 10.0)]
    pub speed: f64,
    /// KV capacity per rank in tokens.
    #[arg(long, default_value_t = 150_000)]
    pub capacity_tokens: u64,
    /// KV capacity the router is told each rank has, as a multiple of the engines' real
    /// `--capacity-tokens` (what a misconfigured or deliberately loose cache model costs).
    #[arg(long, default_value_t = 1.0)]
    pub router_capacity_factor: f64,
    /// Engine prefill throughput (tokens/s of simulated time).
    #[arg(long, default_value_t = 5_000.0)]
    pub prefill_tps: f64,
    /// Router policies to run.
    #[arg(long, value_delimiter = ',', default_value = "round_robin,load,prefix")]
    pub policies: Vec<String>,
    /// Skip the nginx run.
    #[arg(long)]
    pub no_nginx: bool,
    /// Skip the peer routers (SMG and vllm-router `cache_aware`).
    #[arg(long)]
    pub no_peers: bool,
    /// Skip the ceiling run: the router (`prefix`) in front of engines whose prefill costs
    /// nothing, as if every prompt token were cached. No placement can beat its turns/min on
    /// this fleet and workload, so it bounds every router's ratio against the others.
    #[arg(long)]
    pub no_ceiling: bool,
    /// Virtual environment the peer routers are installed into (made on first use;
    /// default: `peers-venv` beside this binary).
    #[arg(long)]
    pub peers_venv: Option<std::path::PathBuf>,
    /// Workload family.
    #[arg(long, value_enum, default_value_t = Kind::Agent)]
    pub workload: Kind,
    /// Structure seed.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Write the reports as JSON.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Keep logs here (default: a temp dir).
    #[arg(long)]
    pub workdir: Option<std::path::PathBuf>,
}

/// The label of the ceiling run.
pub const CEILING: &str = "ceiling (prefill free)";

/// A running engine-sim fleet.
pub struct Fleet {
    _proc: Proc,
    /// One address per rank.
    pub addrs: Vec<String>,
}

/// Starts one enginesim process with a port per rank.
pub async fn start_fleet(a: &CompareArgs, dir: &Path, tag: &str) -> anyhow::Result<Fleet> {
    let mut cmd = Command::new(sibling("enginesim")?);
    let mut addrs = Vec::new();
    for _ in 0..a.ranks {
        let p = free_port()?;
        addrs.push(format!("127.0.0.1:{p}"));
        cmd.arg("--listen").arg(format!("127.0.0.1:{p}"));
    }
    cmd.args([
        "--speed",
        &a.speed.to_string(),
        "--capacity-tokens",
        &a.capacity_tokens.to_string(),
        "--prefill-tps",
        &a.prefill_tps.to_string(),
    ]);
    let proc = spawn("enginesim", cmd, &dir.join(format!("enginesim-{tag}.log")))?;
    for a in &addrs {
        wait_port(a.parse()?, "enginesim").await?;
    }
    Ok(Fleet { _proc: proc, addrs })
}

/// Starts one plain (single-node) router in front of `fleet`.
pub async fn start_router(
    dir: &Path,
    fleet: &Fleet,
    policy: &str,
    capacity: u64,
) -> anyhow::Result<(Proc, String)> {
    let port = free_port()?;
    let mut toml =
        format!("listen = \"127.0.0.1:{port}\"\npolicy = \"{policy}\"\n[log]\nlevel = \"warn\"\n");
    for u in &fleet.addrs {
        toml.push_str(&format!(
            "[[upstreams]]\nurl = \"http://{u}\"\ncapacity_tokens = {capacity}\n"
        ));
    }
    let cfg = dir.join(format!("router-{policy}.toml"));
    std::fs::write(&cfg, toml)?;
    let mut cmd = Command::new(sibling("router")?);
    cmd.arg("--config").arg(&cfg);
    let p = spawn("router", cmd, &dir.join(format!("router-{policy}.log")))?;
    wait_port(SocketAddr::from(([127, 0, 0, 1], port)), "router").await?;
    Ok((p, format!("http://127.0.0.1:{port}")))
}

/// Workload parameters for one run.
pub fn params(a: &CompareArgs, url: String, salt: u64) -> Params {
    Params {
        urls: vec![url],
        developers: a.developers,
        duration: Duration::from_secs(a.duration),
        scale: a.scale,
        time_scale: a.speed,
        seed: a.seed,
        salt,
        session_ids: false,
        kind: a.workload,
        model: "sim-model".into(),
        progress: true,
        api_key: None,
        resolve: false,
        // One try: a comparison counts failures, it does not hide them.
        attempts: 1,
        pool_tokens: a.capacity_tokens * a.ranks as u64,
    }
}

/// Runs the comparison and prints the table.
pub async fn run(a: CompareArgs) -> anyhow::Result<Vec<Report>> {
    let tmp;
    let dir = match &a.workdir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => {
            tmp = std::env::temp_dir().join(format!("routerbench-{}", std::process::id()));
            std::fs::create_dir_all(&tmp)?;
            tmp
        }
    };
    let mut reports = Vec::new();
    let salt0 = crate::fresh_salt();
    if !a.no_nginx {
        eprintln!("== nginx least_conn");
        let fleet = start_fleet(&a, &dir, "nginx").await?;
        let port = free_port()?;
        let _nginx = start_nginx(&dir, port, &fleet.addrs).await?;
        let r = workload::run(
            params(&a, format!("http://127.0.0.1:{port}"), salt0),
            "nginx least_conn",
        )
        .await?;
        reports.push(r);
    }
    if !a.no_peers {
        let venv = a
            .peers_venv
            .clone()
            .unwrap_or_else(|| crate::procs::bin_dir().join("peers-venv"));
        for (i, peer) in crate::peers::PEERS.iter().enumerate() {
            // A peer that cannot be installed here is reported and left out.
            let bin = match crate::peers::install(&venv, peer) {
                Ok(b) => b,
                Err(e) => {
                    eprintln!("== {} skipped: {e:#}", peer.label);
                    continue;
                }
            };
            eprintln!("== {}", peer.label);
            let fleet = start_fleet(&a, &dir, peer.name).await?;
            let (_peer, url) = crate::peers::start(peer, &bin, &dir, &fleet).await?;
            let mut r = workload::run(
                params(&a, url, salt0.wrapping_add(100 + i as u64)),
                peer.label,
            )
            .await?;
            r.label = peer.label.to_owned();
            reports.push(r);
        }
    }
    for (i, policy) in a.policies.iter().enumerate() {
        eprintln!("== router policy {policy}");
        let fleet = start_fleet(&a, &dir, policy).await?;
        let told = (a.capacity_tokens as f64 * a.router_capacity_factor) as u64;
        let (_router, url) = start_router(&dir, &fleet, policy, told).await?;
        let mut r = workload::run(
            params(&a, url, salt0.wrapping_add(i as u64 + 1)),
            &format!("router {policy}"),
        )
        .await?;
        r.label = format!("router {policy}");
        reports.push(r);
    }
    if !a.no_ceiling {
        eprintln!("== ceiling (prefill free)");
        // Prefill a million times faster: every turn costs what a fully cached one would.
        let free = CompareArgs {
            prefill_tps: a.prefill_tps * 1e6,
            ..a.clone()
        };
        let fleet = start_fleet(&free, &dir, "ceiling").await?;
        let (_router, url) = start_router(&dir, &fleet, "prefix", a.capacity_tokens).await?;
        let mut r = workload::run(params(&a, url, salt0.wrapping_add(99)), CEILING).await?;
        r.label = CEILING.to_owned();
        reports.push(r);
    }
    println!(
        "\nworkload {:?}: {} developers, {} ranks, {} s per run, scale {}, speed {}x, KV {} tokens/rank\n",
        a.workload, a.developers, a.ranks, a.duration, a.scale, a.speed, a.capacity_tokens
    );
    print!(
        "{}",
        workload::table(
            &reports,
            &[
                ("x smg", "smg cache_aware"),
                ("x nginx", "nginx least_conn")
            ]
        )
    );
    let find = |label: &str| reports.iter().find(|r| r.label == label);
    if let (Some(c), Some(smg)) = (find(CEILING), find("smg cache_aware")) {
        if smg.turns_per_min > 0.0 {
            println!(
                "\nceiling / smg turns/min: {:.2}x (no placement of this workload on this fleet does better)",
                c.turns_per_min / smg.turns_per_min
            );
        }
    }
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_vec_pretty(&reports)?)?;
    }
    Ok(reports)
}
