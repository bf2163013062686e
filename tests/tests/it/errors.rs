//! Bad input gets the right status and an OpenAI-style JSON error, and loses nothing: the
//! router keeps serving afterwards.

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
    let r = router("errors")
        .engines(1)
        .table("[limits]\nmax_body_bytes = 100000\nmax_header_bytes = 4096")
        .start()
        .await;
    let (addr, engines) = (r.addr, &r.engines);
    let base = r.url("");
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
    // The Anthropic endpoint answers in Anthropic's error shape, so its SDKs raise their
    // typed errors.
    let r = send(
        "POST",
        &format!("{base}/v1/messages"),
        r#"{"messages":[{"role":"user","content":[{"type":"text","text":1}]}]}"#,
        &ct,
    )
    .await;
    assert_eq!(r.status, 400);
    let j = r.json();
    assert_eq!(j["type"], "error", "{j}");
    assert_eq!(j["error"]["type"], "invalid_request_error", "{j}");
    assert!(j["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("text")));
    let r = send("GET", &format!("{base}/v1/messages"), "", &[]).await;
    assert_eq!((r.status, r.json()["type"].clone()), (405, "error".into()));
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
    let r = send("GET", &chat, "", &[]).await;
    assert_error(&r, 405, "method_not_allowed");
    assert_eq!(
        r.header("allow").as_deref(),
        Some("POST"),
        "405 without Allow"
    );

    // A head beyond the HTTP layer's buffer (16 KiB here) is refused by that layer itself:
    // 431, then the connection closes. (A head under it but over the limit got the JSON
    // 431 above.) The head is sent whole before reading so that the refusal is read, not
    // a reset from unread bytes.
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let huge = format!(
        "GET /health HTTP/1.1\r\nhost: x\r\nx-a: {}\r\n\r\n",
        "y".repeat(20_000)
    );
    s.write_all(huge.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut got)).await;
    let head = String::from_utf8_lossy(&got);
    assert!(
        head.starts_with("HTTP/1.1 431"),
        "an oversized head got {head:?}"
    );

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
