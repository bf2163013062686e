//! `jepsen`: Jepsen-style testing of the router cluster. `jepsen run` drives the
//! docker-compose cluster with agent clients, an admin client and nemeses on a seeded
//! schedule, records the history and checks it; `jepsen check HISTORY` runs the checkers
//! over a recorded history again.

mod check;
mod docker;
mod history;
mod plot;
mod report;
mod rng;
mod run;

use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "jepsen",
    about = "Fault-injection tests for the router cluster"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run against the compose cluster (it is started, and removed afterwards).
    Run {
        /// Nemesis families, comma-separated: kill, pause, partition, loss, engine,
        /// membership (peers add/remove of router-4 while a peer is down; `membership:add`,
        /// `membership:add-unreachable` or `membership:remove` forces one change), disk (a
        /// peer's data volume lost).
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "kill,pause,partition,loss,engine,membership,disk"
        )]
        nemesis: Vec<String>,
        /// Seconds of the fault phase.
        #[arg(long, default_value_t = 300)]
        time: u64,
        /// Run every nemesis family this many times (in a seeded order) and stop; `--time`
        /// is then ignored. `--rounds 1` is the short profile the test suite runs.
        #[arg(long, default_value_t = 0)]
        rounds: usize,
        /// Seed of every random choice (clients, admin, nemeses).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Concurrent agent clients.
        #[arg(long, default_value_t = 16)]
        clients: usize,
        /// Seconds each fault lasts.
        #[arg(long, default_value_t = 8.0)]
        fault_secs: f64,
        /// Seconds of quiet after each heal.
        #[arg(long, default_value_t = 4.0)]
        quiet_secs: f64,
        /// Output directory (history.jsonl, results.json, report.md, router logs).
        #[arg(long, default_value = "target/jepsen/latest")]
        out: PathBuf,
        /// Use the binaries already in target/release.
        #[arg(long)]
        no_build: bool,
        /// Leave the compose cluster running afterwards.
        #[arg(long)]
        keep: bool,
    },
    /// Run every checker over a history (JSON lines); write results.json and the plots
    /// beside it.
    Check {
        /// The history file.
        history: PathBuf,
        /// Seconds after the final heal by which the peers must agree.
        #[arg(long, default_value_t = 10.0)]
        converge_secs: f64,
    },
}

/// The workspace root (the compose files and scripts live there).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

fn print(verdicts: &[check::Verdict]) -> bool {
    let mut bad = false;
    for v in verdicts {
        let word = match v.valid {
            Some(true) => "valid",
            Some(false) => "INVALID",
            None => "unknown",
        };
        bad |= v.valid == Some(false);
        println!("{:<14} {word}", v.name);
        for p in v.problems.iter().take(5) {
            println!("    {p}");
        }
    }
    bad
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Run {
            nemesis,
            time,
            rounds,
            seed,
            clients,
            fault_secs,
            quiet_secs,
            out,
            no_build,
            keep,
        } => {
            let out = if out.is_absolute() {
                out
            } else {
                workspace().join(out)
            };
            let opts = run::Opts {
                seed,
                time: Duration::from_secs(time),
                rounds,
                nemeses: nemesis,
                clients,
                fault_secs,
                quiet_secs,
                out: out.clone(),
                no_build,
                keep,
            };
            let verdicts = run::run(opts).await?;
            let bad = print(&verdicts);
            println!("history, results.json and report.md in {}", out.display());
            if bad {
                std::process::exit(1);
            }
        }
        Cmd::Check {
            history,
            converge_secs,
        } => {
            let text = std::fs::read_to_string(&history)?;
            let events = history::read(&text)?;
            let limits = check::Limits {
                converge_secs,
                ..Default::default()
            };
            let verdicts = check::all(&events, &limits);
            let out = history.with_file_name("results.json");
            std::fs::write(&out, serde_json::to_vec_pretty(&verdicts)?)?;
            std::fs::write(
                history.with_file_name("latency.svg"),
                plot::latency(&events),
            )?;
            std::fs::write(
                history.with_file_name("commits.svg"),
                plot::commits(&events),
            )?;
            let bad = print(&verdicts);
            println!("results in {}", out.display());
            if bad {
                std::process::exit(1);
            }
        }
    }
    Ok(())
}
