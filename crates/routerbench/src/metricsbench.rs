//! `routerbench metrics`: what the metric updates of one request cost on the request path,
//! the router's own lock-free counters and histograms against the Prometheus project's Rust
//! client (`prometheus-client`), same threads, same run. Its `Histogram::observe` takes a
//! write lock shared by every thread, and `Family::get_or_create` a read lock and a label
//! hash per update: under concurrency the lock is the cost.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use router_core::Reason;
use router_server::metrics::{Metrics, Route};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Settings.
#[derive(Debug, Clone, clap::Args)]
pub struct MetricsArgs {
    /// Simulated requests per thread.
    #[arg(long, default_value_t = 200_000)]
    pub requests: u64,
    /// Thread counts to measure (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,2,8")]
    pub threads: Vec<usize>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    endpoint: &'static str,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// The same metrics as the router's, in `prometheus-client`.
struct Client {
    requests: Family<RequestLabels, Counter>,
    decisions: Family<ReasonLabels, Counter>,
    predicted: Counter,
    prompt: Counter,
    usage_prompt: Counter,
    usage_cached: Counter,
    ttft: Histogram,
    duration: Histogram,
}

impl Client {
    fn new() -> Client {
        Client {
            requests: Family::default(),
            decisions: Family::default(),
            predicted: Counter::default(),
            prompt: Counter::default(),
            usage_prompt: Counter::default(),
            usage_cached: Counter::default(),
            ttft: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            duration: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
        }
    }

    /// One request's updates, as the data plane makes them.
    fn request(&self, i: u64) {
        let reason = if i.is_multiple_of(10) {
            Reason::Cold
        } else {
            Reason::PrefixHit
        };
        self.decisions
            .get_or_create(&ReasonLabels {
                reason: reason.label(),
            })
            .inc();
        self.predicted.inc_by(30_000);
        self.prompt.inc_by(32_000);
        self.ttft.observe(0.02 + (i % 7) as f64 * 0.01);
        self.usage_prompt.inc_by(32_000);
        self.usage_cached.inc_by(30_000);
        self.duration.observe(0.5 + (i % 5) as f64 * 0.1);
        self.requests
            .get_or_create(&RequestLabels {
                endpoint: "chat_completions",
                status: 200,
            })
            .inc();
    }
}

/// The router's updates for one request.
fn ours(m: &Metrics, i: u64) {
    let reason = if i.is_multiple_of(10) {
        Reason::Cold
    } else {
        Reason::PrefixHit
    };
    m.decision(reason, 30_000, 32_000);
    m.observe_ttft(Duration::from_secs_f64(0.02 + (i % 7) as f64 * 0.01));
    m.observe_usage(32_000, 30_000);
    m.observe_duration(Duration::from_secs_f64(0.5 + (i % 5) as f64 * 0.1));
    m.request(Route::Chat, 200);
}

/// Nanoseconds per request with `threads` threads each making `n` requests' updates.
fn timed(threads: usize, n: u64, f: Arc<dyn Fn(u64) + Send + Sync>) -> f64 {
    let start = Instant::now();
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let f = f.clone();
            std::thread::spawn(move || {
                for i in 0..n {
                    f(i * threads as u64 + t as u64);
                }
            })
        })
        .collect();
    for h in hs {
        let _ = h.join();
    }
    start.elapsed().as_nanos() as f64 / (n * threads as u64) as f64
}

/// Runs both, interleaved per thread count, and prints the figures.
pub fn run(a: MetricsArgs) -> anyhow::Result<serde_json::Value> {
    println!(
        "\nmetric updates of one request ({} requests per thread; ns per request, wall time / requests)\n",
        a.requests
    );
    println!(
        "{:>8} {:>14} {:>20} {:>8}",
        "threads", "router ns", "prometheus-client ns", "ratio"
    );
    let mut rows = Vec::new();
    for &t in &a.threads {
        let t = t.max(1);
        // Best of three rounds each, alternating, so noise hits both alike.
        let (mut best_ours, mut best_client) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..3 {
            let m = Arc::new(Metrics::default());
            best_ours = best_ours.min(timed(t, a.requests, Arc::new(move |i| ours(&m, i))));
            let c = Arc::new(Client::new());
            best_client = best_client.min(timed(t, a.requests, Arc::new(move |i| c.request(i))));
        }
        println!(
            "{:>8} {:>14.1} {:>20.1} {:>7.2}x",
            t,
            best_ours,
            best_client,
            best_client / best_ours
        );
        rows.push(serde_json::json!({"threads": t, "router_ns": best_ours,
            "prometheus_client_ns": best_client, "ratio": best_client / best_ours}));
    }
    println!("\nratio: prometheus-client's time per request over the router's own (the router keeps its writer when > 1)");
    Ok(serde_json::json!({ "rows": rows }))
}
