//! A real Prometheus (Debian's `prometheus`, installed by `.ci/run`) scrapes a running
//! router peer; the test reads the routing counters, a histogram's buckets and the Raft
//! gauges back through Prometheus's HTTP API, and `promtool check metrics` lints the
//! exposition.

use router_tests::cluster::wait_until;
use router_tests::*;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

fn tool(name: &str) -> std::path::PathBuf {
    for dir in ["/usr/bin", "/usr/local/bin", "/bin"] {
        let p = std::path::Path::new(dir).join(name);
        if p.exists() {
            return p;
        }
    }
    panic!("{name} is not installed: install Debian's `prometheus` package (.ci/run does)");
}

/// Percent-encodes a PromQL query for a URL.
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The instant vector a query returns: (labels, value) per series.
async fn query(prom: SocketAddr, q: &str) -> Vec<(serde_json::Value, f64)> {
    let r = send(
        "GET",
        &format!("http://{prom}/api/v1/query?query={}", encode(q)),
        "",
        &[],
    )
    .await;
    let v = r.json();
    assert_eq!(v["status"], "success", "{q}: {v}");
    v["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|s| {
            let val = s["value"][1]
                .as_str()
                .and_then(|x| x.parse().ok())
                .unwrap_or(f64::NAN);
            (s["metric"].clone(), val)
        })
        .collect()
}

/// `promtool check metrics` passes on `body` with nothing to say but the lint findings
/// that contain `allowed`.
fn promtool_check(promtool: &std::path::Path, who: &str, body: &[u8], allowed: Option<&str>) {
    let mut check = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        check.stdin.take().unwrap().write_all(body).unwrap();
    }
    let out = check.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let findings: Vec<&str> = said
        .lines()
        .filter(|l| !allowed.is_some_and(|a| l.contains(a)))
        .collect();
    // promtool exits 1 for lint findings alone; a parse error is a finding too.
    assert!(
        findings.is_empty() && (out.status.success() || allowed.is_some()),
        "promtool check metrics on the {who}'s exposition: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_router_and_promtool_accepts_the_exposition() {
    let (prometheus, promtool) = (tool("prometheus"), tool("promtool"));
    let dir = TempDir::new("prometheus");
    let engine_addr = free_addr();
    let engine = Proc {
        child: Command::new(bin("enginesim"))
            .args(["--listen", &engine_addr.to_string(), "--speed", "20"])
            .stderr(std::fs::File::create(dir.path("enginesim.log")).unwrap())
            .spawn()
            .unwrap(),
        log: dir.path("enginesim.log"),
    };
    wait_http(engine_addr, &engine).await;
    // A one-peer cluster: the Raft gauges are part of its exposition.
    let (addr, raft) = (free_addr(), free_addr());
    let toml = format!(
        "listen = \"{addr}\"\n[[upstreams]]\nurl = \"http://{engine_addr}\"\n\
         [cluster]\nnode_id = 1\nlisten = \"{raft}\"\ndata_dir = \"{}\"\ncluster_id = \"prom\"\n\
         [[cluster.peers]]\nid = 1\naddr = \"{raft}\"\n",
        dir.path("data").display()
    );
    let router = start_router(&dir, &toml, &[], addr).await;
    // It leads and has joined its configured engine through the log.
    wait_until("the peer leads and routes", 30, async || {
        let m = send("GET", &format!("http://{addr}/metrics"), "", &[]).await;
        let m = String::from_utf8_lossy(&m.body);
        m.contains("\nrouter_raft_is_leader 1")
            && m.lines()
                .any(|l| l.starts_with("router_upstream_up{") && l.ends_with(" 1"))
    })
    .await;
    let mut conv = Conversation::new(21, 3000);
    for i in 0..6 {
        let r = post(
            &format!("http://{addr}/v1/chat/completions"),
            &conv.body("sim", i % 2 == 0),
            &[],
        )
        .await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        conv.advance("ok", 300);
    }

    // promtool lints both expositions (naming conventions, HELP/TYPE, histogram shape):
    // the router's and the engine simulator's come from the one writer, `promtext`.
    // vLLM's own series names carry a colon (`vllm:prompt_tokens_total`), which the
    // linter reserves for recording rules; enginesim keeps vLLM's names.
    for (who, at, allowed) in [
        ("router", addr, None),
        (
            "enginesim",
            engine_addr,
            Some("metric names should not contain ':'"),
        ),
    ] {
        let exposition = send("GET", &format!("http://{at}/metrics"), "", &[]).await;
        assert_eq!(exposition.status, 200, "{who}");
        promtool_check(&promtool, who, &exposition.body, allowed);
    }

    // Prometheus scrapes the router every second.
    let prom = free_addr();
    std::fs::write(
        dir.path("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: router\n    static_configs:\n      - targets: ['{addr}']\n  - job_name: engine\n    static_configs:\n      - targets: ['{engine_addr}']\n"
        ),
    )
    .unwrap();
    let prom_proc = Proc {
        child: Command::new(&prometheus)
            .arg(format!(
                "--config.file={}",
                dir.path("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path("tsdb").display()
            ))
            .arg(format!("--web.listen-address={prom}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path("prometheus.log")).unwrap())
            .spawn()
            .unwrap(),
        log: dir.path("prometheus.log"),
    };
    wait_http(prom, &prom_proc).await;
    // It listens before its storage is open; queries answer 503 until it is ready.
    wait_until("Prometheus is ready", 60, async || {
        send("GET", &format!("http://{prom}/-/ready"), "", &[])
            .await
            .status
            == 200
    })
    .await;
    let mut up = Vec::new();
    for _ in 0..150 {
        up = query(prom, "up{job=\"router\"}").await;
        if up.first().is_some_and(|(_, v)| *v == 1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        up.first().is_some_and(|(_, v)| *v == 1.0),
        "Prometheus did not scrape the router: {up:?}\n{}",
        prom_proc.log()
    );

    // The routing counters: every turn was one decision, by reason.
    let decisions = query(prom, "sum(router_route_decisions_total)").await;
    assert!(
        decisions.first().is_some_and(|(_, v)| *v >= 6.0),
        "{decisions:?}"
    );
    let by_reason = query(prom, "router_route_decisions_total > 0").await;
    assert!(
        by_reason
            .iter()
            .all(|(m, _)| m["reason"].as_str().is_some_and(|r| !r.is_empty())),
        "{by_reason:?}"
    );
    // A histogram's buckets: cumulative, ending in +Inf with every request.
    let buckets = query(prom, "router_request_duration_seconds_bucket").await;
    assert!(buckets.len() >= 5, "{buckets:?}");
    let inf = buckets
        .iter()
        .find(|(m, _)| m["le"] == "+Inf")
        .map(|(_, v)| *v)
        .expect("+Inf bucket");
    assert!(inf >= 6.0, "{buckets:?}");
    let p50 = query(
        prom,
        "histogram_quantile(0.5, sum by (le) (router_request_duration_seconds_bucket))",
    )
    .await;
    assert!(
        p50.first().is_some_and(|(_, v)| v.is_finite() && *v > 0.0),
        "{p50:?}"
    );
    // The Raft gauges.
    let leader = query(prom, "router_raft_is_leader").await;
    assert_eq!(leader.first().map(|(_, v)| *v), Some(1.0), "{leader:?}");
    let applied = query(prom, "router_raft_applied_index").await;
    assert!(
        applied.first().is_some_and(|(_, v)| *v >= 1.0),
        "{applied:?}"
    );
    let term = query(prom, "router_raft_term").await;
    assert!(term.first().is_some_and(|(_, v)| *v >= 1.0), "{term:?}");
    // The engine's vLLM-named series, scraped from enginesim.
    let mut prompt = Vec::new();
    for _ in 0..150 {
        prompt = query(prom, "vllm:prompt_tokens_total{job=\"engine\"}").await;
        if prompt.first().is_some_and(|(_, v)| *v > 0.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        prompt
            .first()
            .is_some_and(|(m, v)| *v > 0.0 && m["model_name"] == "sim-model"),
        "{prompt:?}"
    );
    drop(prom_proc);
    drop(router);
    drop(engine);
}
