//! Bad input gets the right status and an OpenAI-style JSON error, and loses nothing: the
//! router keeps serving afterwards.

use router_tests::engine::fleet;
use router_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn assert_error(r: &Reply, status: u16, code: &str) {
    assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
    let j = r.json();
    assert_eq!(j["error"]["code"], code, "{j}");
    assert!(j["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
    assert!(j["error"]["type"].is_string());
    assert_eq!(
        r.header("content-type").as_deref(),
        Some("application/json")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_statuses_and_bodies() {
    let engines = fleet(1).await;
    let addr = free_addr();
    let dir = TempDir::new("errors");
    let toml = format!(
        "listen = \"{addr}\"\n[limits]\nmax_body_bytes = 100000\nmax_header_bytes = 4096\n[[upstreams]]\nurl = \"{}\"\n",
        engines[0].url()
    );
    let _r = start_router(&dir, &toml, &[], addr).await;
    let base = format!("http://{addr}");
    let chat = format!("{base}/v1/chat/completions");
    let ct = [("content-type", "application/json")];

    assert_error(
        &send("POST", &chat, "{not json", &ct).await,
        400,
        "invalid_json",
    );
    assert_error(&send("POST", &chat, "", &ct).await, 400, "invalid_json");
    assert_error(
        &send("POST", &chat, "[1,2]", &ct).await,
        400,
        "invalid_request",
    );
    assert_error(
        &send("POST", &chat, r#"{"messages":"hi"}"#, &ct).await,
        400,
        "invalid_request",
    );
    assert_error(
        &send(
            "POST",
            &chat,
            r#"{"messages":[{"role":"user","content":7}]}"#,
            &ct,
        )
        .await,
        400,
        "invalid_request",
    );
    assert_error(
        &send("POST", &chat, r#"{"model":1,"messages":[]}"#, &ct).await,
        400,
        "invalid_request",
    );
    assert_error(
        &send(
            "POST",
            &format!("{base}/v1/completions"),
            r#"{"prompt":{"a":1}}"#,
            &ct,
        )
        .await,
        400,
        "invalid_request",
    );
    assert_error(
        &send(
            "POST",
            &format!("{base}/v1/messages"),
            r#"{"messages":[{"role":"user","content":[{"type":"text","text":1}]}]}"#,
            &ct,
        )
        .await,
        400,
        "invalid_request",
    );
    assert_error(
        &send(
            "POST",
            &format!("{base}/v1/responses"),
            r#"{"input":5}"#,
            &ct,
        )
        .await,
        400,
        "invalid_request",
    );
    // Invalid UTF-8 inside a JSON string.
    assert_error(
        &send(
            "POST",
            &chat,
            &b"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}"[..],
            &ct,
        )
        .await,
        400,
        "invalid_json",
    );

    let big = format!(
        r#"{{"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "a".repeat(200_000)
    );
    assert_error(
        &send("POST", &chat, big.clone(), &ct).await,
        413,
        "request_too_large",
    );

    let long = "x".repeat(6000);
    assert_error(
        &send("POST", &chat, "{}", &[("x-filler", long.as_str())]).await,
        431,
        "headers_too_large",
    );

    assert_error(
        &send("GET", &format!("{base}/nope"), "", &[]).await,
        404,
        "not_found",
    );
    assert_error(
        &send("GET", &chat, "", &[]).await,
        405,
        "method_not_allowed",
    );

    // A head far beyond the limit is refused by the HTTP layer itself (431, no panic).
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let huge = format!(
        "GET /health HTTP/1.1\r\nhost: x\r\nx-a: {}\r\n\r\n",
        "y".repeat(200_000)
    );
    let _ = s.write_all(huge.as_bytes()).await;
    let mut buf = vec![0u8; 256];
    let n = s.read(&mut buf).await.unwrap_or(0);
    let head = String::from_utf8_lossy(&buf[..n]);
    assert!(n == 0 || head.contains("431"), "{head}");

    // Nothing was forwarded, and the router still routes.
    assert_eq!(engines[0].count(), 0);
    let ok = post(
        &chat,
        &serde_json::json!({"model":"m","messages":[{"role":"user","content":"hi"}]}),
        &[],
    )
    .await;
    assert_eq!(ok.status, 200);
    assert_eq!(engines[0].count(), 1);
    let m = send("GET", &format!("{base}/metrics"), "", &[]).await;
    let t = String::from_utf8_lossy(&m.body);
    assert!(
        t.contains("router_requests_total{endpoint=\"chat_completions\",status=\"400\"}"),
        "{t}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_client_header_times_out() {
    let addr = free_addr();
    let dir = TempDir::new("slowhdr");
    let toml = format!("listen = \"{addr}\"\n[timeouts]\nclient_header_ms = 300\n");
    let _r = start_router(&dir, &toml, &[], addr).await;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let t = std::time::Instant::now();
    let mut buf = vec![0u8; 256];
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("not closed")
        .unwrap_or(0);
    assert!(t.elapsed() < std::time::Duration::from_secs(3));
    let head = String::from_utf8_lossy(&buf[..n]);
    assert!(n == 0 || head.contains("408"), "{head}");
}
