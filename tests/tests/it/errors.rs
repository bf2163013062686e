//! Bad input gets the right status and an OpenAI-style JSON error, and loses nothing: the
//! router keeps serving afterwards.

use router_tests::*;
use std::time::{Duration, Instant};
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
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got)).await;
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

/// A request head that does not arrive within `timeouts.client_header_ms` gets a 408 with
/// a JSON body, then the connection closes; an idle kept-alive connection is closed after
/// the same time without an answer; a head sent in time is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_client_header_gets_408() {
    let addr = free_addr();
    let dir = TempDir::new("slowhdr");
    let toml = format!("listen = \"{addr}\"\n[timeouts]\nclient_header_ms = 300\n");
    let _r = start_router(&dir, &toml, &[], addr).await;
    let read_all = |mut s: tokio::net::TcpStream| async move {
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got))
            .await
            .expect("connection not closed")
            .expect("read failed");
        String::from_utf8_lossy(&got).into_owned()
    };

    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let t = Instant::now();
    let got = read_all(s).await;
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t.elapsed()
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert!(got.starts_with("HTTP/1.1 408 "), "{got:?}");
    let body = &got[got.find("\r\n\r\n").unwrap() + 4..];
    let j: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(j["error"]["code"], "request_timeout", "{j}");

    // A head dripped a byte at a time does not keep the connection open past the limit.
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let t = Instant::now();
    for b in b"GET /health HTTP/1.1\r\nhost: x\r\nx-slow: abcdefghijklmnop" {
        if s.write_all(&[*b]).await.is_err() || t.elapsed() > Duration::from_secs(2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let got = read_all(s).await;
    assert!(got.starts_with("HTTP/1.1 408 "), "{got:?}");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());

    // Kept alive: a request is served, then the idle connection closes without an answer.
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let t = Instant::now();
    let got = read_all(s).await;
    assert!(got.starts_with("HTTP/1.1 "), "{got:?}");
    assert_eq!(got.matches("HTTP/1.1 ").count(), 1, "{got:?}");
    // The status line, not any "408" (a request id or date header can hold those digits).
    assert!(!got.starts_with("HTTP/1.1 408"), "{got:?}");
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t.elapsed()
    );
}
