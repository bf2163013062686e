//! Streaming: chunks reach the client as the engine produces them, a client that leaves
//! cancels the upstream request, and a failure after the first byte is reported in-band.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use router_tests::*;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

async fn open_stream(
    url: &str,
    body: &serde_json::Value,
    headers: &[(&str, &str)],
) -> http::Response<hyper::body::Incoming> {
    let mut b = http::Request::post(url).header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b
        .body(Full::new(Bytes::from(serde_json::to_vec(body).unwrap())))
        .unwrap();
    client().request(req).await.expect("request")
}

/// One router in front of one fake engine; `table` adds config.
async fn setup(table: &str) -> Running {
    router("stream").engines(1).table(table).start().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_chunk_arrives_before_upstream_finishes() {
    let r = setup("").await;
    let url = r.url("/v1/chat/completions");
    let body = Conversation::new(1, 2000).body("m", true);
    let t = Instant::now();
    let resp = open_stream(
        &url,
        &body,
        &[("x-fake-gap-ms", "400"), ("x-fake-chunks", "4")],
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap();
    let ttfb = t.elapsed();
    assert!(String::from_utf8_lossy(first.data_ref().unwrap()).starts_with("data: "));
    let mut frames = 1;
    let mut all = Vec::from(first.data_ref().unwrap().as_ref());
    while let Some(f) = body.frame().await {
        let f = f.unwrap();
        if let Some(d) = f.data_ref() {
            all.extend_from_slice(d);
            frames += 1;
        }
    }
    let total = t.elapsed();
    assert!(
        ttfb < Duration::from_millis(350),
        "first chunk after {ttfb:?}"
    );
    assert!(
        total >= Duration::from_millis(1200),
        "whole stream in {total:?}"
    );
    assert!(frames >= 4, "{frames} frames: the stream was buffered");
    assert!(String::from_utf8_lossy(&all).contains("[DONE]"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_cancels_upstream() {
    let r = setup("").await;
    let (addr, engines) = (r.addr, &r.engines);
    let url = r.url("/v1/chat/completions");
    let resp = open_stream(
        &url,
        &Conversation::new(2, 100).body("m", true),
        &[("x-fake-gap-ms", "100"), ("x-fake-chunks", "100")],
    )
    .await;
    let mut body = resp.into_body();
    body.frame().await.unwrap().unwrap();
    drop(body);
    let deadline = Instant::now() + Duration::from_secs(5);
    while engines[0].state.cancelled.load(Relaxed) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        engines[0].state.cancelled.load(Relaxed),
        1,
        "upstream kept generating"
    );
    assert_eq!(engines[0].state.completed.load(Relaxed), 0);
    let m = send("GET", &format!("http://{addr}/metrics"), "", &[]).await;
    let t = String::from_utf8_lossy(&m.body);
    assert!(
        t.contains(&format!(
            "router_upstream_inflight{{upstream=\"{}\"}} 0",
            engines[0].url()
        )),
        "{t}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_after_first_byte_is_reported() {
    let r = setup("[timeouts]\nidle_stream_ms = 500").await;
    let addr = r.addr;
    let url = r.url("/v1/chat/completions");
    // The engine drops the connection after two chunks.
    let r = post(
        &url,
        &Conversation::new(3, 100).body("m", true),
        &[("x-fake-break-after", "2"), ("x-fake-chunks", "5")],
    )
    .await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8_lossy(&r.body).to_string();
    assert!(text.contains(" 1 "), "{text}");
    assert!(text.contains("event: error"), "{text}");
    assert!(text.contains("upstream_stream_error"), "{text}");
    assert!(!text.contains("[DONE]"));
    // The engine goes silent longer than the idle timeout.
    let r = post(
        &url,
        &Conversation::new(4, 100).body("m", true),
        &[("x-fake-gap-ms", "2000"), ("x-fake-chunks", "3")],
    )
    .await;
    let text = String::from_utf8_lossy(&r.body).to_string();
    assert!(text.contains("upstream_idle_timeout"), "{text}");
    let m = send("GET", &format!("http://{addr}/metrics"), "", &[]).await;
    let t = String::from_utf8_lossy(&m.body);
    assert!(
        t.contains("router_stream_errors_total{code=\"upstream_idle_timeout\"} 1"),
        "{t}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_union_and_passthrough() {
    let r = router("models").engines(2).start().await;
    let (addr, engines) = (r.addr, &r.engines);
    let r = send("GET", &format!("http://{addr}/v1/models"), "", &[]).await;
    assert_eq!(r.status, 200);
    let ids: Vec<String> = r.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, vec!["model-e0", "model-e1", "shared"]);
    let r = post(
        &format!("http://{addr}/v1/embeddings"),
        &serde_json::json!({"input":"x"}),
        &[],
    )
    .await;
    assert_eq!(r.status, 200);
    let b = engines
        .iter()
        .flat_map(|e| e.state.bodies.lock().unwrap().clone())
        .find(|b| b["_path"] == "/v1/embeddings");
    assert!(b.is_some());
}
