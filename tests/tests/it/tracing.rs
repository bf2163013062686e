//! OpenTelemetry traces: a real OTLP/gRPC receiver (built from the `opentelemetry-proto`
//! definitions) collects what the real `router` exports for a streamed chat turn, and a
//! real `enginesim` logs the trace context it received.

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use router_tests::*;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Spans received, with the `service.name` of their resource.
#[derive(Default, Clone)]
struct Receiver {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut got = self.spans.lock().unwrap();
        for rs in req.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter())
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref()?.value.as_ref())
                .map(|v| match v {
                    Value::StringValue(s) => s.clone(),
                    _ => String::new(),
                })
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    got.push((service.clone(), s));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

async fn start_receiver() -> (SocketAddr, Receiver) {
    start_receiver_tls(None).await
}

/// A receiver, over TLS with `identity` (certificate and key PEM) when given.
async fn start_receiver_tls(identity: Option<(Vec<u8>, Vec<u8>)>) -> (SocketAddr, Receiver) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let r = Receiver::default();
    let svc = TraceServiceServer::new(r.clone());
    let mut server = tonic::transport::Server::builder();
    if let Some((cert, key)) = identity {
        server = server
            .tls_config(
                tonic::transport::ServerTlsConfig::new()
                    .identity(tonic::transport::Identity::from_pem(cert, key)),
            )
            .unwrap();
    }
    tokio::spawn(async move {
        let incoming = tokio_stream_of(listener);
        let _ = server.add_service(svc).serve_with_incoming(incoming).await;
    });
    (addr, r)
}

fn tokio_stream_of(
    l: tokio::net::TcpListener,
) -> impl futures_util::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures_util::stream::unfold(l, |l| async move {
        let r = l.accept().await.map(|(s, _)| s);
        Some((r, l))
    })
}

fn attr<'a>(s: &'a Span, key: &str) -> Option<&'a Value> {
    s.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn attr_str(s: &Span, key: &str) -> Option<String> {
    match attr(s, key)? {
        Value::StringValue(v) => Some(v.clone()),
        _ => None,
    }
}

fn attr_int(s: &Span, key: &str) -> Option<i64> {
    match attr(s, key)? {
        Value::IntValue(v) => Some(*v),
        _ => None,
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn enginesim(dir: &TempDir, port: SocketAddr) -> Proc {
    let log = dir.path("enginesim.log");
    let child = Command::new(bin("enginesim"))
        .args(["--listen", &port.to_string(), "--speed", "20"])
        .arg("--request-log")
        .arg(dir.path("requests.jsonl"))
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    Proc { child, log }
}

async fn metric(addr: SocketAddr, name: &str) -> f64 {
    let r = send("GET", &format!("http://{addr}/metrics"), "", &[]).await;
    let text = String::from_utf8_lossy(&r.body).to_string();
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_turn_is_one_trace_from_the_client_through_the_router_to_the_engine() {
    let dir = TempDir::new("tracing");
    let (otlp, receiver) = start_receiver().await;
    let port = free_addr();
    let engine = enginesim(&dir, port);
    wait_http(port, &engine).await;
    let addr = free_addr();
    let toml = format!(
        "listen = \"{addr}\"\n[log]\nformat = \"json\"\nlevel = \"info,router_server=debug\"\n\
         [tracing]\notlp_endpoint = \"http://{otlp}\"\nservice_name = \"router-test\"\n\
         [[upstreams]]\nurl = \"http://{port}\"\n"
    );
    let router = start_router(&dir, &toml, &[], addr).await;

    let client_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let traceparent = format!("00-{client_trace}-{client_span}-01");
    let conv = Conversation::new(11, 4000);
    let mut body = conv.body("sim", true);
    body["stream_options"] = serde_json::json!({"include_usage": true});
    let r = post(
        &format!("http://{addr}/v1/chat/completions"),
        &body,
        &[("traceparent", &traceparent), ("tracestate", "vendor=abc")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(String::from_utf8_lossy(&r.body).contains("[DONE]"));
    let rank = r.header("x-router-rank").expect("x-router-rank");

    // The four spans of the turn arrive (export batches every 200 ms).
    let want = ["request", "canonicalize", "route", "upstream"];
    let mut spans: Vec<(String, Span)> = Vec::new();
    for _ in 0..100 {
        spans = receiver
            .spans
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, s)| hex(&s.trace_id) == client_trace)
            .cloned()
            .collect();
        if want.iter().all(|w| spans.iter().any(|(_, s)| s.name == *w)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let named = |n: &str| -> Span {
        spans
            .iter()
            .find(|(_, s)| s.name == n)
            .map(|(_, s)| s.clone())
            .unwrap_or_else(|| {
                panic!(
                    "no '{n}' span in the client's trace; got {:?}\nrouter log:\n{}",
                    spans.iter().map(|(_, s)| &s.name).collect::<Vec<_>>(),
                    router.log()
                )
            })
    };
    let request = named("request");
    let canon = named("canonicalize");
    let route = named("route");
    let upstream = named("upstream");
    assert!(spans.iter().all(|(svc, _)| svc == "router-test"));
    // The client's trace id is kept and its span is the request's parent.
    assert_eq!(hex(&request.parent_span_id), client_span);
    for child in [&canon, &route, &upstream] {
        assert_eq!(
            child.parent_span_id, request.span_id,
            "{} is not a child of the request span",
            child.name
        );
    }
    assert_eq!(
        attr_str(&request, "http.route").as_deref(),
        Some("/v1/chat/completions")
    );
    assert_eq!(attr_int(&request, "http.response.status_code"), Some(200));
    assert_eq!(
        attr_str(&request, "gen_ai.request.model").as_deref(),
        Some("sim")
    );
    assert!(attr_int(&request, "usage.prompt_tokens").unwrap_or(0) > 500);
    assert!(attr_int(&request, "usage.completion_tokens").unwrap_or(0) > 0);
    assert_eq!(
        attr_str(&request, "stream.end").as_deref(),
        Some("complete")
    );
    assert!(attr(&request, "ttft_ms").is_some());
    assert!(attr_int(&canon, "chunks").unwrap_or(0) > 0);
    // The chosen rank is on the decision and on the attempt, and it is the one that answered.
    assert_eq!(attr_str(&route, "rank").as_deref(), Some(rank.as_str()));
    assert_eq!(attr_str(&route, "reason").as_deref(), Some("cold"));
    assert!(attr(&route, "cost").is_some());
    assert_eq!(attr_str(&upstream, "rank").as_deref(), Some(rank.as_str()));
    assert_eq!(attr_str(&upstream, "outcome").as_deref(), Some("ok"));
    assert!(upstream.events.iter().any(|e| e.name == "first_byte"));
    // The request span lasts until the stream ended; the attempt within it.
    assert!(request.end_time_unix_nano >= upstream.end_time_unix_nano);

    // The engine received the router's attempt span as its parent, in the client's trace.
    let log = std::fs::read_to_string(dir.path("requests.jsonl")).unwrap();
    let line: serde_json::Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
    assert_eq!(
        line["traceparent"],
        format!("00-{client_trace}-{}-01", hex(&upstream.span_id)),
        "engine log: {log}"
    );
    assert_eq!(line["tracestate"], "vendor=abc");

    // A JSON log line inside a traced request names its trace.
    let bad = send(
        "POST",
        &format!("http://{addr}/v1/chat/completions"),
        "{not json",
        &[
            ("content-type", "application/json"),
            (
                "traceparent",
                &format!("00-{client_trace}-{client_span}-01"),
            ),
        ],
    )
    .await;
    assert_eq!(bad.status, 400);
    let mut found = None;
    for _ in 0..50 {
        found = router
            .log()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["fields"]["message"] == "request rejected");
        if found.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let found = found.unwrap_or_else(|| panic!("no 'request rejected' line:\n{}", router.log()));
    assert_eq!(found["fields"]["trace_id"], client_trace, "{found}");
    assert_eq!(
        found["fields"]["span_id"].as_str().map(str::len),
        Some(16),
        "{found}"
    );
    // Counted once the collector's answer is back, a moment after it has the spans.
    let mut exported = 0.0;
    for _ in 0..50 {
        exported = metric(addr, "router_trace_spans_exported_total").await;
        if exported >= 4.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(exported >= 4.0, "exported {exported}");
    drop(router);
    drop(engine);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_collector_down_requests_succeed_and_dropped_spans_are_counted() {
    let dir = TempDir::new("tracing-down");
    let port = free_addr();
    let engine = enginesim(&dir, port);
    wait_http(port, &engine).await;
    // Nothing listens at the collector's address.
    let dead = free_addr();
    let addr = free_addr();
    let toml = format!(
        "listen = \"{addr}\"\n[tracing]\notlp_endpoint = \"http://{dead}\"\nexport_timeout_ms = 500\n\
         [[upstreams]]\nurl = \"http://{port}\"\n"
    );
    let router = start_router(&dir, &toml, &[], addr).await;
    let mut conv = Conversation::new(12, 2000);
    for i in 0..10 {
        let started = std::time::Instant::now();
        let r = post(
            &format!("http://{addr}/v1/chat/completions"),
            &conv.body("sim", i % 2 == 0),
            &[],
        )
        .await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "a turn took {:?} with the collector down",
            started.elapsed()
        );
        conv.advance("ok", 200);
    }
    let mut dropped = 0.0;
    for _ in 0..100 {
        dropped = metric(
            addr,
            "router_trace_spans_dropped_total{reason=\"export_failed\"}",
        )
        .await;
        if dropped >= 10.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        dropped >= 10.0,
        "dropped spans not counted ({dropped}); log:\n{}",
        router.log()
    );
    assert_eq!(metric(addr, "router_trace_spans_exported_total").await, 0.0);
    drop(router);
    drop(engine);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_a_collector_over_tls_that_the_configured_ca_vouches_for() {
    let dir = TempDir::new("tracing-tls");
    let pki = router_tests::cluster::Pki::generate(&dir, "otlp", &["127.0.0.1:0".parse().unwrap()]);
    let (otlp, receiver) = start_receiver_tls(Some((
        std::fs::read(&pki.cert).unwrap(),
        std::fs::read(&pki.key).unwrap(),
    )))
    .await;
    let port = free_addr();
    let engine = enginesim(&dir, port);
    wait_http(port, &engine).await;
    let addr = free_addr();
    let toml = format!(
        "listen = \"{addr}\"\n[tracing]\notlp_endpoint = \"https://{otlp}\"\nca = \"{}\"\n\
         [[upstreams]]\nurl = \"http://{port}\"\n",
        pki.ca.display()
    );
    let router = start_router(&dir, &toml, &[], addr).await;
    let conv = Conversation::new(13, 2000);
    let r = post(
        &format!("http://{addr}/v1/chat/completions"),
        &conv.body("sim", false),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let mut names = Vec::new();
    for _ in 0..100 {
        names = receiver
            .spans
            .lock()
            .unwrap()
            .iter()
            .map(|(_, s)| s.name.clone())
            .collect();
        if names.iter().any(|n| n == "upstream") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        names.iter().any(|n| n == "request") && names.iter().any(|n| n == "upstream"),
        "spans over TLS: {names:?}\n{}",
        router.log()
    );
    drop(router);
    drop(engine);
}
