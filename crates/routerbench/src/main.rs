//! `routerbench`: workloads, comparisons and simulations for the router.

mod canonbench;
mod cluster;
mod compare;
mod fleet;
mod indexbench;
mod metricsbench;
mod modelbench;
mod peers;
mod procs;
mod proxy;
mod raftbench;
mod rng;
mod workload;

use clap::{Parser, Subcommand};
use router_core::{Policy, ScoreParams};
use std::time::Duration;

#[derive(Parser)]
#[command(name = "routerbench", version, about = "Benchmarks for the LLM router")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a seeded agent workload against one or more URLs (a random one per turn).
    Agent(AgentArgs),
    /// Start an engine-sim fleet and compare router policies and nginx on one workload.
    Compare(compare::CompareArgs),
    /// Logical-time simulation of the router's scoring at 10, 40 and 128 replicas (stickiness,
    /// hit rate, time per decision).
    FleetSim(FleetArgs),
    /// Request-path overhead: direct vs router vs nginx.
    Proxy(proxy::ProxyArgs),
    /// The agent workload through one router vs a Raft cluster of routers (random peer per turn).
    Cluster(cluster::ClusterArgs),
    /// Route records replicated per second across Raft peers (gRPC + sled, in process).
    Raft(raftbench::RaftArgs),
    /// The replicated state at 10M entries: bytes per entry, snapshot size and build time,
    /// restart to routing (the peer's sled-backed state machine store, in process).
    Index(indexbench::IndexArgs),
    /// The cache model alone (one peer's apply, no Raft or disk) on the `raft` records.
    Model(raftbench::RecordArgs),
    /// CPU cost of canonicalizing and fingerprinting one request body.
    Canon(canonbench::CanonArgs),
    /// Metric updates per request: the router's lock-free writer vs prometheus-client.
    Metrics(metricsbench::MetricsArgs),
    /// Print the addresses a name resolves to (checks DNS round-robin from a container).
    Resolve(ResolveArgs),
}

#[derive(clap::Args)]
struct AgentArgs {
    /// Router URLs, comma-separated; each turn goes to a random one (DNS round-robin).
    #[arg(long, value_delimiter = ',', required = true)]
    url: Vec<String>,
    /// Concurrent developers.
    #[arg(long, default_value_t = 8)]
    developers: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 60)]
    duration: u64,
    /// Prompt size factor (1.0 = 18k-token harness prompts).
    #[arg(long, default_value_t = 0.25)]
    scale: f64,
    /// Divides tool gaps (use the engines' speed factor).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Structure seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Salt (default: fresh per run).
    #[arg(long)]
    salt: Option<u64>,
    /// Send X-Session-ID headers.
    #[arg(long)]
    session_ids: bool,
    /// Workload family.
    #[arg(long, value_enum, default_value_t = workload::Kind::Agent)]
    workload: workload::Kind,
    /// Model name.
    #[arg(long, default_value = "sim-model")]
    model: String,
    /// API key for the router.
    #[arg(long, env = "ROUTER_API_KEY")]
    api_key: Option<String>,
    /// Write the report as JSON.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Write every turn as a JSON line (time, conversation, router, rank, retries, result).
    #[arg(long)]
    turns_log: Option<std::path::PathBuf>,
    /// Resolve the URL's host name on every turn and pick one of its addresses at random,
    /// as DNS round-robin clients do (e.g. `--url http://router:8080` in compose).
    #[arg(long)]
    resolve: bool,
    /// Tries per turn: a turn whose attempt fails before it completes (refused or cut
    /// connection, no answer head within 20 s, 408/429/5xx) is sent whole to another router.
    #[arg(long, default_value_t = 3)]
    attempts: u32,
}

#[derive(clap::Args)]
struct ResolveArgs {
    /// host:port to resolve.
    target: String,
    /// Lookups to make; prints every distinct address seen.
    #[arg(long, default_value_t = 10)]
    lookups: u32,
}

#[derive(clap::Args)]
struct FleetArgs {
    /// Replica counts.
    #[arg(long, value_delimiter = ',', default_value = "10,40,128")]
    replicas: Vec<usize>,
    /// Policies.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "prefix,load,round_robin,session"
    )]
    policies: Vec<String>,
    /// Seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Write rows as JSON.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

/// A salt nobody used before: time and pid.
pub fn fresh_salt() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ (u64::from(std::process::id()) << 32)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Agent(a) => {
            let p = workload::Params {
                urls: a
                    .url
                    .iter()
                    .map(|u| u.trim_end_matches('/').to_owned())
                    .collect(),
                developers: a.developers,
                duration: Duration::from_secs(a.duration),
                scale: a.scale,
                time_scale: a.time_scale,
                seed: a.seed,
                salt: a.salt.unwrap_or_else(fresh_salt),
                session_ids: a.session_ids,
                kind: a.workload,
                model: a.model,
                progress: true,
                api_key: a.api_key,
                resolve: a.resolve,
                attempts: a.attempts,
                pool_tokens: 0,
            };
            let (r, turns) = workload::run_logged(p, "agent").await?;
            print!("{}", workload::table(std::slice::from_ref(&r), &[]));
            println!(
                "retries {}  main-conversation stickiness {:.2}% of {} follow-ups",
                r.retries,
                r.main_stickiness * 100.0,
                r.main_follow_ups
            );
            for (router, n) in &r.per_router {
                println!("  {router:<28} {n} turns");
            }
            if let Some(j) = a.json {
                std::fs::write(j, serde_json::to_vec_pretty(&r)?)?;
            }
            if let Some(path) = a.turns_log {
                let mut out = String::new();
                for t in &turns {
                    out.push_str(&t.to_string());
                    out.push('\n');
                }
                std::fs::write(path, out)?;
            }
        }
        Cmd::Compare(c) => {
            compare::run(c).await?;
        }
        Cmd::FleetSim(f) => {
            let mut rows = Vec::new();
            println!(
                "{:<9} {:<12} {:>11} {:>9} {:>12} {:>12}",
                "replicas", "policy", "stickiness", "hit rate", "select p50", "select p99"
            );
            for &n in &f.replicas {
                for p in &f.policies {
                    let policy =
                        Policy::parse(p).ok_or_else(|| anyhow::anyhow!("unknown policy {p}"))?;
                    let row = fleet::simulate(
                        fleet::Shape::standard(n, f.seed),
                        policy,
                        &ScoreParams::default(),
                    );
                    println!(
                        "{:<9} {:<12} {:>10.1}% {:>8.1}% {:>9.2} us {:>9.2} us",
                        row.replicas,
                        row.policy,
                        row.stickiness * 100.0,
                        row.hit_rate * 100.0,
                        row.decide_p50_us,
                        row.decide_p99_us
                    );
                    rows.push(row);
                }
            }
            if let Some(j) = f.json {
                std::fs::write(j, serde_json::to_vec_pretty(&rows)?)?;
            }
        }
        Cmd::Proxy(p) => {
            proxy::run(p).await?;
        }
        Cmd::Cluster(c) => {
            cluster::run(c).await?;
        }
        Cmd::Raft(r) => {
            raftbench::run(r).await?;
        }
        Cmd::Model(m) => {
            modelbench::run(m)?;
        }
        Cmd::Index(i) => {
            indexbench::run(i).await?;
        }
        Cmd::Canon(c) => {
            canonbench::run(c)?;
        }
        Cmd::Metrics(m) => {
            metricsbench::run(m)?;
        }
        Cmd::Resolve(r) => {
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..r.lookups.max(1) {
                for a in tokio::net::lookup_host(r.target.as_str()).await? {
                    seen.insert(a);
                }
            }
            for a in seen {
                println!("{a}");
            }
        }
    }
    Ok(())
}
