//! `routerbench proxy`: what the router adds on the request path. A fast in-process
//! upstream answers at once; the same requests go to it directly, through `router` and
//! through nginx (least_conn), interleaved in one run so machine noise hits all three.

use crate::procs::{free_port, sibling, spawn, start_nginx, wait_port};
use crate::workload::pct;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Settings.
#[derive(Debug, Clone, clap::Args)]
pub struct ProxyArgs {
    /// Sequential requests per target for the latency test (150 KB prompts).
    #[arg(long, default_value_t = 1000)]
    pub latency_requests: usize,
    /// Seconds per target for the throughput test (40 KB prompts).
    #[arg(long, default_value_t = 16)]
    pub throughput_secs: u64,
    /// Prompt size for the latency test, bytes.
    #[arg(long, default_value_t = 150_000)]
    pub latency_bytes: usize,
    /// Interleaved rounds the throughput time is split into (median per target).
    #[arg(long, default_value_t = 4)]
    pub rounds: usize,
    /// Concurrent connections for the throughput test.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Request path sent to every target (`/v1/embeddings` measures the router's
    /// pass-through floor: same proxying, no prompt work).
    #[arg(long, default_value = "/v1/chat/completions")]
    pub path: String,
    /// Another `router` binary (e.g. a build of the previous commit) measured in the same
    /// run as a fourth target, `router-b`, to compare two builds under the same noise.
    #[arg(long)]
    pub compare_router: Option<std::path::PathBuf>,
    /// Also measure a router with OpenTelemetry tracing on (sampling 1.0) exporting every
    /// span to an OTLP/gRPC collector in this process, as the target `traced`.
    #[arg(long)]
    pub traced: bool,
    /// Sampling ratio of the `traced` router (what a partial sampling costs).
    #[arg(long, default_value_t = 1.0)]
    pub traced_sampling: f64,
    /// CPU budget of the `traced` router's span exporter, percent of one core (its
    /// `tracing.export_cpu_percent`; the router's default when unset).
    #[arg(long)]
    pub traced_cpu_percent: Option<u32>,
    /// Keep the router's and nginx's logs.
    #[arg(long)]
    pub keep_logs: bool,
    /// Write the figures as JSON.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

async fn upstream() -> anyhow::Result<SocketAddr> {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else {
                continue;
            };
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let svc = service_fn(|req: http::Request<hyper::body::Incoming>| async move {
                    let _ = req.into_body().collect().await;
                    let body = r#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10000,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":9000}}}"#;
                    Ok::<_, Infallible>(
                        http::Response::builder()
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from_static(body.as_bytes())))
                            .unwrap_or_default(),
                    )
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    Ok(addr)
}

fn chat_body(bytes: usize, salt: u64) -> Bytes {
    let mut rng = crate::rng::Rng::new(salt);
    let sys = crate::rng::text(&mut rng, bytes / 8);
    let user = crate::rng::text(&mut rng, bytes / 8);
    Bytes::from(
        serde_json::to_vec(&serde_json::json!({"model":"m","messages":[{"role":"system","content":sys},{"role":"user","content":user}],"max_tokens":1}))
            .unwrap_or_default(),
    )
}

type C = Client<HttpConnector, Full<Bytes>>;

async fn once(c: &C, url: &str, body: &Bytes) -> anyhow::Result<()> {
    let req = http::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(body.clone()))?;
    let resp = c.request(req).await?;
    anyhow::ensure!(resp.status().is_success(), "status {}", resp.status());
    resp.into_body().collect().await?;
    Ok(())
}

/// Requests per second from `concurrency` clients over `dur`.
async fn throughput(
    client: &C,
    url: &str,
    small: &Arc<Vec<Bytes>>,
    concurrency: usize,
    dur: Duration,
) -> anyhow::Result<f64> {
    let count = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + dur;
    let tasks: Vec<_> = (0..concurrency)
        .map(|w| {
            let (client, url, small, count, errors) = (
                client.clone(),
                url.to_owned(),
                small.clone(),
                count.clone(),
                errors.clone(),
            );
            tokio::spawn(async move {
                let mut i = w;
                while Instant::now() < deadline {
                    match once(&client, &url, &small[i % small.len()]).await {
                        Ok(()) => count.fetch_add(1, Relaxed),
                        Err(_) => errors.fetch_add(1, Relaxed),
                    };
                    i += 7;
                }
            })
        })
        .collect();
    let s = Instant::now();
    for t in tasks {
        let _ = t.await;
    }
    anyhow::ensure!(
        errors.load(Relaxed) == 0,
        "{url}: {} errors",
        errors.load(Relaxed)
    );
    Ok(count.load(Relaxed) as f64 / s.elapsed().as_secs_f64())
}

/// A router on `port` in front of the one upstream `up`, probing it rarely.
fn router_config(port: u16, up: SocketAddr) -> String {
    format!("listen = \"127.0.0.1:{port}\"\n[log]\nlevel = \"warn\"\n[health]\ninterval_ms = 60000\n[[upstreams]]\nurl = \"http://{up}\"\n")
}

/// An OTLP/gRPC trace collector that takes every export call and answers success without
/// decoding it: a real collector runs elsewhere, and decoding 50k spans/s here would slow
/// this process's clients while the traced router is measured. The router's own
/// `router_trace_spans_exported_total` counts the spans.
#[derive(Default, Clone)]
struct Collector {
    calls: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
}

fn collector() -> anyhow::Result<(SocketAddr, Collector)> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    l.set_nonblocking(true)?;
    let addr = l.local_addr()?;
    let c = Collector::default();
    let counters = c.clone();
    // The collector stands for one on another machine: it runs on its own thread at
    // SCHED_IDLE, so receiving 50k spans/s takes only CPU that the clients, the engine and
    // the routers leave idle rather than slowing the clients of the traced router.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("otlp-collector".into())
        .spawn(move || {
            // Best effort: without it the collector competes like any thread.
            let _ = router_server::telemetry::idle_priority();
            rt.block_on(async move {
                let Ok(l) = tokio::net::TcpListener::from_std(l) else {
                    return;
                };
                loop {
                    let Ok((s, _)) = l.accept().await else {
                        continue;
                    };
                    let c = counters.clone();
                    tokio::spawn(async move {
                        let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                            let c = c.clone();
                            async move {
                                let ok = req.uri().path()
                            == "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
                                let n = req
                                    .into_body()
                                    .collect()
                                    .await
                                    .map_or(0, |b| b.to_bytes().len());
                                c.calls.fetch_add(1, Relaxed);
                                c.bytes.fetch_add(n as u64, Relaxed);
                                let mut trailers = http::HeaderMap::new();
                                trailers.insert(
                                    "grpc-status",
                                    http::HeaderValue::from_static(if ok { "0" } else { "12" }),
                                );
                                // An empty ExportTraceServiceResponse: not compressed, length 0.
                                let frames = futures_util::stream::iter([
                                    Ok::<_, Infallible>(hyper::body::Frame::data(
                                        Bytes::from_static(&[0, 0, 0, 0, 0]),
                                    )),
                                    Ok(hyper::body::Frame::trailers(trailers)),
                                ]);
                                let mut resp =
                                    http::Response::new(http_body_util::StreamBody::new(frames));
                                resp.headers_mut().insert(
                                    http::header::CONTENT_TYPE,
                                    http::HeaderValue::from_static("application/grpc"),
                                );
                                Ok::<_, Infallible>(resp)
                            }
                        });
                        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(s), svc)
                            .await;
                    });
                }
            })
        })?;
    Ok((addr, c))
}

/// Spans the router dropped, for any reason.
async fn dropped(c: &C, port: u16) -> f64 {
    scrape(
        c,
        port,
        "router_trace_spans_dropped_total{reason=\"queue_full\"}",
    )
    .await
        + scrape(
            c,
            port,
            "router_trace_spans_dropped_total{reason=\"export_failed\"}",
        )
        .await
}

/// Reads one sample of the router's `/metrics` (0 when absent).
async fn scrape(c: &C, port: u16, name: &str) -> f64 {
    let Ok(req) = http::Request::get(format!("http://127.0.0.1:{port}/metrics"))
        .body(Full::new(Bytes::new()))
    else {
        return 0.0;
    };
    let Ok(resp) = c.request(req).await else {
        return 0.0;
    };
    let Ok(body) = resp.into_body().collect().await else {
        return 0.0;
    };
    String::from_utf8_lossy(&body.to_bytes())
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Runs both tests and prints the figures.
pub async fn run(a: ProxyArgs) -> anyhow::Result<serde_json::Value> {
    let dir = std::env::temp_dir().join(format!("routerbench-proxy-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let up = upstream().await?;
    let rport = free_port()?;
    let cfg = dir.join("router.toml");
    std::fs::write(&cfg, router_config(rport, up))?;
    let mut cmd = Command::new(sibling("router")?);
    cmd.arg("--config").arg(&cfg);
    let _router = spawn("router", cmd, &dir.join("router.log"))?;
    wait_port(SocketAddr::from(([127, 0, 0, 1], rport)), "router").await?;
    let nport = free_port()?;
    let _nginx = start_nginx(&dir, nport, &[up.to_string()]).await?;
    let mut targets = vec![
        ("direct", format!("http://{up}{}", a.path)),
        ("router", format!("http://127.0.0.1:{rport}{}", a.path)),
        ("nginx", format!("http://127.0.0.1:{nport}{}", a.path)),
    ];
    let mut _router_b = None;
    if let Some(bin) = &a.compare_router {
        let bport = free_port()?;
        let cfg = dir.join("router-b.toml");
        std::fs::write(&cfg, router_config(bport, up))?;
        let mut cmd = Command::new(bin);
        cmd.arg("--config").arg(&cfg);
        _router_b = Some(spawn("router-b", cmd, &dir.join("router-b.log"))?);
        wait_port(SocketAddr::from(([127, 0, 0, 1], bport)), "router-b").await?;
        targets.push(("router-b", format!("http://127.0.0.1:{bport}{}", a.path)));
    }
    let mut _traced = None;
    let mut traced_at = None;
    if a.traced {
        let (otlp, c) = collector()?;
        let tport = free_port()?;
        let cfg = dir.join("router-traced.toml");
        std::fs::write(
            &cfg,
            format!(
                "{}[tracing]\notlp_endpoint = \"http://{otlp}\"\nsampling_ratio = {}\n{}",
                router_config(tport, up),
                a.traced_sampling,
                a.traced_cpu_percent
                    .map(|p| format!("export_cpu_percent = {p}\n"))
                    .unwrap_or_default()
            ),
        )?;
        let mut cmd = Command::new(sibling("router")?);
        cmd.arg("--config").arg(&cfg);
        _traced = Some(spawn("router-traced", cmd, &dir.join("router-traced.log"))?);
        wait_port(SocketAddr::from(([127, 0, 0, 1], tport)), "router-traced").await?;
        traced_at = Some((targets.len(), tport, c));
        targets.push(("traced", format!("http://127.0.0.1:{tport}{}", a.path)));
    }
    let client: C = Client::builder(TokioExecutor::new()).build(HttpConnector::new());

    // Latency: 150 KB prompts, one at a time, the three targets interleaved.
    let big: Vec<Bytes> = (0..16).map(|i| chat_body(a.latency_bytes, i)).collect();
    for (_, url) in &targets {
        for b in big.iter().take(20) {
            once(&client, url, b).await?;
        }
    }
    let mut lat: Vec<Vec<f64>> = vec![Vec::new(); targets.len()];
    for i in 0..a.latency_requests {
        for (t, (_, url)) in targets.iter().enumerate() {
            let b = &big[i % big.len()];
            let s = Instant::now();
            once(&client, url, b).await?;
            lat[t].push(s.elapsed().as_secs_f64() * 1e3);
        }
    }
    let p50: Vec<f64> = lat.iter_mut().map(|v| pct(v, 0.5)).collect();
    let p99: Vec<f64> = lat.iter_mut().map(|v| pct(v, 0.99)).collect();

    // What the traced router exported at the latency test's pace (one request at a time).
    let mut traced_sequential = (0.0, 0.0);
    if let Some((_, port, _)) = &traced_at {
        tokio::time::sleep(Duration::from_millis(500)).await;
        traced_sequential = (
            scrape(&client, *port, "router_trace_spans_exported_total").await,
            dropped(&client, *port).await,
        );
    }
    // Throughput: 40 KB prompts, `concurrency` clients for a fixed time per target.
    let small: Arc<Vec<Bytes>> = Arc::new((0..64).map(|i| chat_body(40_000, 1000 + i)).collect());
    // Several short rounds, targets interleaved, median per target: a noisy neighbour
    // then hits every target alike instead of whichever ran at the wrong moment.
    let rounds = a.rounds.max(1);
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); targets.len()];
    for r in 0..rounds {
        // Each round starts at another target, so no target always follows the same one.
        for k in 0..targets.len() {
            let t = (r + k) % targets.len();
            let url = &targets[t].1;
            samples[t].push(
                throughput(
                    &client,
                    url,
                    &small,
                    a.concurrency,
                    Duration::from_secs_f64(a.throughput_secs as f64 / rounds as f64),
                )
                .await?,
            );
        }
    }
    // Two routers compared are compared round by round (the median of the per-round
    // ratios): noise that lasts a round then hits both sides of a ratio alike.
    let paired = |t: usize| {
        let mut r: Vec<f64> = samples[t]
            .iter()
            .zip(&samples[1])
            .map(|(x, base)| x / base)
            .collect();
        pct(&mut r, 0.5)
    };
    let paired_rps: Vec<f64> = (0..targets.len()).map(paired).collect();
    let round_ratios: Vec<String> = (0..targets.len())
        .map(|t| {
            samples[t]
                .iter()
                .zip(&samples[1])
                .map(|(x, base)| format!("{:.3}", x / base))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let rps: Vec<f64> = samples.iter_mut().map(|v| pct(v, 0.5)).collect();
    println!("\nrequest-path overhead ({} sequential 150 KB requests per target; {} s x {} connections of 40 KB for throughput)\n", a.latency_requests, a.throughput_secs, a.concurrency);
    println!(
        "{:<8} {:>10} {:>10} {:>12} {:>12} {:>10}",
        "target", "p50 ms", "p99 ms", "added p50", "added p99", "req/s"
    );
    for (t, (name, _)) in targets.iter().enumerate() {
        println!(
            "{:<8} {:>10.3} {:>10.3} {:>12.3} {:>12.3} {:>10.0}",
            name,
            p50[t],
            p99[t],
            p50[t] - p50[0],
            p99[t] - p99[0],
            rps[t]
        );
    }
    println!("\nrouter added p50: {:.3} ms (target <= 0.25); router / nginx throughput: {:.2}x (target >= 1.0)", p50[1] - p50[0], rps[1] / rps[2]);
    if a.compare_router.is_some() {
        println!(
            "router / router-b throughput: {:.3}x (median of per-round ratios); router-b / nginx: {:.2}x",
            1.0 / paired_rps[3],
            rps[3] / rps[2]
        );
    }
    let mut traced_figures = serde_json::Value::Null;
    if let Some((t, port, c)) = &traced_at {
        // Spans still queued go out within the export interval.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let dropped = dropped(&client, *port).await;
        let exported = scrape(&client, *port, "router_trace_spans_exported_total").await;
        let shed = scrape(&client, *port, "router_trace_traces_shed_total").await;
        let export_cpu = scrape(&client, *port, "router_trace_export_cpu_seconds_total").await;
        // Spans per trace, from the latency test where every request was recorded.
        let warmups = big.len().min(20) as f64;
        let per_trace = traced_sequential.0 / (a.latency_requests as f64 + warmups);
        let recorded = (exported + dropped) / per_trace.max(1.0);
        println!("traced / router per round: {}", round_ratios[*t]);
        println!(
            "tracing on (sampling {}) vs off: added p50 {:.3} ms (target <= 0.5), throughput {:.3}x (median of {rounds} per-round ratios; target >= 0.9)\n  spans after the latency test: exported {}, dropped {} ({per_trace:.1} per request); after the throughput test (saturated; the exporter held to {} of one core): exported {exported}, dropped {dropped}, traces shed {shed}, so {:.0}% of the saturated requests were recorded; exporter CPU {export_cpu:.2} s, {:.2} us per span; collector took {} export calls, {:.1} MB",
            a.traced_sampling,
            p50[*t] - p50[1],
            paired_rps[*t],
            traced_sequential.0,
            traced_sequential.1,
            a.traced_cpu_percent
                .map_or("the default share".to_string(), |p| format!("{p}%")),
            100.0 * recorded / (recorded + shed).max(1.0),
            export_cpu * 1e6 / (exported + dropped).max(1.0),
            c.calls.load(Relaxed),
            c.bytes.load(Relaxed) as f64 / 1e6,
        );
        traced_figures = serde_json::json!({
            "p50": p50[*t], "p99": p99[*t], "rps": rps[*t],
            "added_p50_ms_over_router": p50[*t] - p50[1],
            "rps_over_router": paired_rps[*t],
            "export_calls": c.calls.load(Relaxed), "export_bytes": c.bytes.load(Relaxed),
            "spans_exported": exported,
            "sequential_spans_exported": traced_sequential.0,
            "spans_per_request": per_trace,
            "saturated_recorded_share": recorded / (recorded + shed).max(1.0),
            "export_cpu_seconds": export_cpu,
            "sequential_spans_dropped": traced_sequential.1,
            "spans_dropped": dropped, "traces_shed": shed,
        });
    }
    let v = serde_json::json!({
        "latency_ms": {"direct": {"p50": p50[0], "p99": p99[0]}, "router": {"p50": p50[1], "p99": p99[1]}, "nginx": {"p50": p50[2], "p99": p99[2]}},
        "router_added_p50_ms": p50[1] - p50[0], "router_added_p99_ms": p99[1] - p99[0],
        "nginx_added_p50_ms": p50[2] - p50[0],
        "rps": {"direct": rps[0], "router": rps[1], "nginx": rps[2]},
        "router_over_nginx_rps": rps[1] / rps[2],
        "traced": traced_figures,
    });
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_vec_pretty(&v)?)?;
    }
    if a.keep_logs {
        println!("logs kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(v)
}
