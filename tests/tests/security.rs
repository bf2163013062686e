//! Client API key, upstream token, TLS on the client port.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use router_tests::engine::fleet;
use router_tests::*;
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_is_enforced_and_not_forwarded() {
    let engines = fleet(1).await;
    let addr = free_addr();
    let dir = TempDir::new("apikey");
    let toml = format!(
        "listen = \"{addr}\"\nupstream_token = \"up-token\"\n[[upstreams]]\nurl = \"{}\"\n",
        engines[0].url()
    );
    let _p = start_router(&dir, &toml, &[("ROUTER_API_KEY", "s3cret-key")], addr).await;
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
    let engines = fleet(1).await;
    let addr = free_addr();
    let dir = TempDir::new("tls");
    let ck =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    std::fs::write(dir.path("cert.pem"), ck.cert.pem()).unwrap();
    std::fs::write(dir.path("key.pem"), ck.signing_key.serialize_pem()).unwrap();
    let toml = format!(
        "listen = \"{addr}\"\n[tls]\ncert = \"{}\"\nkey = \"{}\"\n[[upstreams]]\nurl = \"{}\"\n",
        dir.path("cert.pem").display(),
        dir.path("key.pem").display(),
        engines[0].url()
    );
    let _p = start_router(&dir, &toml, &[], addr).await;

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

    // Plain HTTP to the TLS port does not get through.
    let plain = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        client().request(
            http::Request::get(format!("http://{addr}/health"))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        ),
    )
    .await;
    assert!(!matches!(plain, Ok(Ok(ref r)) if r.status() == 200));
}
