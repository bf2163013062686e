//! Client API key, upstream token, TLS on the client port.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use router_tests::*;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_is_enforced_and_not_forwarded() {
    let r = router("apikey")
        .engines(1)
        .key("upstream_token = \"up-token\"")
        .env("ROUTER_API_KEY", "s3cret-key")
        .start()
        .await;
    let (addr, engines) = (r.addr, &r.engines);
    let url = format!("http://{addr}/v1/chat/completions");
    let body = Conversation::new(1, 100).body("m", false);
    for h in [
        vec![],
        vec![("authorization", "Bearer wrong")],
        vec![("authorization", "Bearer s3cret-ke")],
        vec![("authorization", "s3cret-key")],
    ] {
        let r = post(&url, &body, &h).await;
        assert_eq!(r.status, 401, "{h:?}");
        assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    }
    assert_eq!(
        send("GET", &format!("http://{addr}/v1/models"), "", &[])
            .await
            .status,
        401
    );
    assert_eq!(engines[0].count(), 0);
    let r = post(&url, &body, &[("authorization", "Bearer s3cret-key")]).await;
    assert_eq!(r.status, 200);
    let r = post(&url, &body, &[("x-api-key", "s3cret-key")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        send("GET", &format!("http://{addr}/health"), "", &[])
            .await
            .status,
        200
    );
    for b in engines[0].state.bodies.lock().unwrap().iter() {
        assert_eq!(
            b["_auth"], "Bearer up-token",
            "the router's key leaked upstream or the token is missing"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_client_port() {
    let dir = TempDir::new("tls");
    let ck =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    std::fs::write(dir.path("cert.pem"), ck.cert.pem()).unwrap();
    std::fs::write(dir.path("key.pem"), ck.signing_key.serialize_pem()).unwrap();
    let tls = format!(
        "[tls]\ncert = \"{}\"\nkey = \"{}\"",
        dir.path("cert.pem").display(),
        dir.path("key.pem").display(),
    );
    let r = router("tls")
        .engines(1)
        .table(&tls)
        .in_dir(dir)
        .start()
        .await;
    let addr = r.addr;

    let mut roots = rustls::RootCertStore::empty();
    roots.add(ck.cert.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = connector.connect(name, tcp).await.expect("TLS handshake");
    let (mut send_req, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let body = serde_json::to_vec(&Conversation::new(1, 100).body("m", false)).unwrap();
    let req = http::Request::post("/v1/chat/completions")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = send_req.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let b = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&b).contains("reply from e0"));

    // Plain HTTP to the TLS port gets no HTTP answer at all: the TLS layer refuses the
    // bytes (an alert or a close), and the port still serves TLS afterwards.
    let mut plain = tokio::net::TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        plain.read_to_end(&mut got),
    )
    .await;
    assert!(read.is_ok(), "the TLS port kept a plaintext client hanging");
    assert!(
        !got.starts_with(b"HTTP/"),
        "the TLS port answered plaintext HTTP: {:?}",
        String::from_utf8_lossy(&got)
    );
    assert!(
        got.is_empty() || got[0] == 0x15,
        "expected a TLS alert or a close, got {got:?}"
    );
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    connector
        .connect(name, tcp)
        .await
        .expect("TLS still served after a plaintext client");
}
