//! `router`: parse config (without binding), build, serve, drain on SIGINT/SIGTERM.

use clap::Parser;
use router_core::Policy;
use router_server::config::{Config, Overrides, UpstreamConfig};
use std::net::SocketAddr;
use std::path::PathBuf;

// Every request allocates and frees body-sized buffers on two worker threads; glibc's
// allocator spent about an eighth of the request path's CPU consolidating them.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// LLM router: sends each request to the engine rank that holds its prompt prefix.
#[derive(Parser, Debug)]
#[command(name = "router", version)]
struct Cli {
    /// TOML config file.
    #[arg(long, env = "ROUTER_CONFIG")]
    config: Option<PathBuf>,
    /// Client listen address (overrides config).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Extra listener for /metrics and /health only.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Upstream URL; repeat or comma-separate (replaces the configured list).
    #[arg(long = "upstream", value_delimiter = ',')]
    upstreams: Vec<String>,
    /// Routing policy: prefix, load, round_robin, session.
    #[arg(long)]
    policy: Option<String>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    print_config: bool,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let policy = match cli.policy.as_deref().map(|p| (p, Policy::parse(p))) {
        Some((p, None)) => {
            eprintln!(
                "router: unknown policy '{p}' (expected prefix, load, round_robin or session)"
            );
            return std::process::ExitCode::from(2);
        }
        Some((_, p)) => p,
        None => None,
    };
    let overrides = Overrides {
        listen: cli.listen,
        metrics_listen: cli.metrics_listen,
        policy,
        upstreams: (!cli.upstreams.is_empty()).then(|| {
            cli.upstreams
                .iter()
                .map(|u| UpstreamConfig::from_url(u))
                .collect()
        }),
    };
    let env = |k: &str| std::env::var(k).ok();
    let cfg = match Config::load(cli.config.as_deref(), &env, overrides) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("router: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    if cli.print_config {
        match toml::to_string_pretty(&cfg.redacted()) {
            Ok(s) => {
                println!("{s}");
                return std::process::ExitCode::SUCCESS;
            }
            Err(e) => {
                eprintln!("router: {e}");
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    let telemetry = router_server::telemetry::init(&cfg.log, &cfg.tracing);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("router: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let res = rt.block_on(async {
        let (tx, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("shutting down: draining connections");
            let _ = tx.send(true);
        });
        router_server::run(cfg, rx).await
    });
    // Queued spans go out (bounded wait) before the process ends.
    drop(telemetry);
    match res {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("router: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn wait_for_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
