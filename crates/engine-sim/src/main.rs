//! `enginesim`: one process, one or many simulated engine ranks.

use clap::Parser;
use engine_sim::sched::TimeModel;
use engine_sim::{serve, PortRanks, PortState, Rank, SimConfig};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Simulated vLLM/SGLang engine for router testing.
#[derive(Parser, Debug)]
#[command(name = "enginesim", version)]
struct Cli {
    /// Address to serve; repeat for several ports (each its own engine).
    #[arg(long = "listen", required = true)]
    listen: Vec<SocketAddr>,
    /// Name reported in `x-engine-rank` instead of the listen address (one port only;
    /// containers listen on 0.0.0.0, which names nothing).
    #[arg(long, env = "ENGINESIM_NAME")]
    name: Option<String>,
    /// Append one JSON line per completion request received (wall time, engine name, the
    /// router peer that sent it and when that peer routed it, from `x-router-peer` and
    /// `x-router-routed-at`, and the `traceparent` it carried): the Jepsen suite checks
    /// leave safety with it; the tracing test reads the trace context.
    #[arg(long, env = "ENGINESIM_REQUEST_LOG")]
    request_log: Option<std::path::PathBuf>,
    /// Data-parallel ranks behind each port, chosen by `routed_dp_rank` (SGLang style).
    #[arg(long, default_value_t = 1)]
    dp_ranks: usize,
    /// Model name.
    #[arg(long, default_value = "sim-model")]
    model: String,
    /// KV cache capacity per rank, in tokens.
    #[arg(long, default_value_t = 200_000)]
    capacity_tokens: usize,
    /// KV block size in tokens.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Prefill throughput, tokens per second.
    #[arg(long, default_value_t = 20_000.0)]
    prefill_tps: f64,
    /// Fixed cost of a step, ms.
    #[arg(long, default_value_t = 15.0)]
    decode_base_ms: f64,
    /// Extra step cost per request in the batch, ms.
    #[arg(long, default_value_t = 0.4)]
    decode_per_req_ms: f64,
    /// Tokens per step (chunked prefill budget).
    #[arg(long, default_value_t = 2048)]
    token_budget: u32,
    /// Requests running at once; the rest wait.
    #[arg(long, default_value_t = 32)]
    max_running: usize,
    /// Simulated time runs this many times faster than wall time.
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
    /// max_tokens when the request gives none.
    #[arg(long, default_value_t = 16)]
    default_max_tokens: u32,
}

/// One line of the request log (completion requests only).
fn log_request<B>(
    log: &Mutex<std::io::LineWriter<std::fs::File>>,
    name: &str,
    req: &hyper::Request<B>,
) {
    use std::io::Write;
    let path = req.uri().path();
    if path != "/v1/chat/completions" && path != "/v1/completions" {
        return;
    }
    let h = |k: &str| {
        req.headers()
            .get(k)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let line = serde_json::json!({
        "wall": wall,
        "engine": name,
        "peer": h("x-router-peer").and_then(|p| p.parse::<u64>().ok()),
        "routed_at": h("x-router-routed-at").and_then(|t| t.parse::<f64>().ok()).map(|ms| ms / 1e3),
        // W3C trace context as received (vLLM and SGLang continue the router's trace).
        "traceparent": h("traceparent"),
        "tracestate": h("tracestate"),
    });
    if let Ok(mut w) = log.lock() {
        let _ = writeln!(w, "{line}");
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if cli.dp_ranks == 0 || cli.block_size == 0 || cli.speed <= 0.0 || cli.prefill_tps <= 0.0 {
        anyhow::bail!("dp-ranks, block-size, speed and prefill-tps must be positive");
    }
    let cfg = SimConfig {
        model: cli.model.clone(),
        capacity_tokens: cli.capacity_tokens,
        block_size: cli.block_size,
        time: TimeModel {
            prefill_tps: cli.prefill_tps,
            decode_base: Duration::from_secs_f64(cli.decode_base_ms / 1e3),
            decode_per_req: Duration::from_secs_f64(cli.decode_per_req_ms / 1e3),
            token_budget: cli.token_budget,
            max_running: cli.max_running,
        },
        speed: cli.speed,
        default_max_tokens: cli.default_max_tokens,
    };
    if cli.name.is_some() && cli.listen.len() > 1 {
        anyhow::bail!("--name names one engine: give one --listen with it");
    }
    let log: Option<Arc<Mutex<std::io::LineWriter<std::fs::File>>>> = match &cli.request_log {
        Some(p) => Some(Arc::new(Mutex::new(std::io::LineWriter::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)?,
        )))),
        None => None,
    };
    let mut tasks = Vec::new();
    for addr in &cli.listen {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = cli.name.clone().unwrap_or_else(|| addr.to_string());
        let ranks = if cli.dp_ranks == 1 {
            PortRanks::Single(Arc::new(Rank::spawn(addr.to_string(), &cfg)))
        } else {
            PortRanks::Dp(
                (0..cli.dp_ranks)
                    .map(|i| Arc::new(Rank::spawn(format!("{addr}#{i}"), &cfg)))
                    .collect(),
                AtomicU64::new(0),
            )
        };
        let st = Arc::new(PortState {
            cfg: cfg.clone(),
            ranks,
        });
        let log = log.clone();
        let name = addr.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let st = st.clone();
                let log = log.clone();
                let name = name.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let st = st.clone();
                        if let Some(l) = &log {
                            log_request(l, &name, &req);
                        }
                        async move { Ok::<_, Infallible>(serve(st, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        }));
    }
    eprintln!(
        "enginesim: serving {} port(s) x {} rank(s)",
        cli.listen.len(),
        cli.dp_ranks
    );
    tokio::signal::ctrl_c().await?;
    Ok(())
}
