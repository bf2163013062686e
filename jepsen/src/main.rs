//! `jepsen`: Jepsen-style testing of the router cluster. So far: the history format and
//! the checkers (`jepsen check HISTORY`); the generator and nemeses that drive the compose
//! cluster come next (see the issue notes).

mod check;
mod history;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

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
    /// Run every checker over a history (JSON lines) and write results.json beside it.
    Check {
        /// The history file.
        history: PathBuf,
        /// Seconds after the final heal by which the peers must agree.
        #[arg(long, default_value_t = 10.0)]
        converge_secs: f64,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
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
            let mut bad = false;
            for v in &verdicts {
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
            println!("results in {}", out.display());
            if bad {
                std::process::exit(1);
            }
        }
    }
    Ok(())
}
