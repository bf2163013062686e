//! Starting the daemon: Ramjet's environment, config errors, and router-core's purity.

use router_tests::engine::fleet;
use router_tests::*;
use std::collections::HashSet;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ramjet_environment_starts_the_router() {
    let engines = fleet(2).await;
    let addr = free_addr();
    let dir = TempDir::new("rj");
    let ups = format!("{},{}", engines[0].url(), engines[1].url());
    let listen = addr.to_string();
    let p = spawn_router(
        &dir,
        &[],
        &[
            ("RJ_UPSTREAM", ups.as_str()),
            ("RJ_API_ADDR", listen.as_str()),
            ("RJ_AFFINITY", "round_robin"),
            ("RJ_UPSTREAM_DP_RANKS", "2"),
            ("RJ_UPSTREAM_TOKEN", "tok"),
        ],
    );
    wait_http(addr, &p).await;
    let url = format!("http://{addr}/v1/chat/completions");
    let mut ranks = HashSet::new();
    for i in 0..8 {
        let r = post(&url, &Conversation::new(7, 100 + i).body("m", false), &[]).await;
        assert_eq!(r.status, 200, "{}", p.log());
        ranks.insert(r.header("x-router-rank").unwrap());
    }
    // Round robin over 2 servers x 2 dp ranks.
    assert_eq!(ranks.len(), 4, "{ranks:?}");
    assert_eq!(
        engines[0].state.bodies.lock().unwrap()[0]["_auth"],
        "Bearer tok"
    );
}

fn run_and_wait(dir: &TempDir, args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut p = spawn_router(dir, args, env);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(s) = p.child.try_wait().unwrap() {
            return (s.code().unwrap_or(-1), p.log());
        }
        assert!(
            std::time::Instant::now() < deadline,
            "router did not exit on bad config"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn bad_configuration_is_reported_before_start() {
    let dir = TempDir::new("badcfg");
    let cfg = dir.path("bad.toml");
    std::fs::write(&cfg, "[[upstreams]]\nurl = \"https://x:1\"\n").unwrap();
    let (code, log) = run_and_wait(&dir, &["--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 2);
    assert!(log.contains("only http://"), "{log}");
    std::fs::write(&cfg, "polcy = \"prefix\"\n").unwrap();
    let (code, log) = run_and_wait(&dir, &["--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 2);
    assert!(log.contains("polcy"), "{log}");
    let (code, log) = run_and_wait(&dir, &["--config", "/nonexistent/router.toml"], &[]);
    assert_eq!(code, 2);
    assert!(log.contains("does not exist"), "{log}");
    let (code, log) = run_and_wait(&dir, &["--policy", "fastest"], &[]);
    assert_eq!(code, 2);
    assert!(log.contains("unknown policy"), "{log}");
    let (code, log) = run_and_wait(&dir, &[], &[("ROUTER_LIMITS__MAX_BODY_BYTES", "0")]);
    assert_eq!(code, 2);
    assert!(log.contains("max_body_bytes"), "{log}");

    // TLS material is parsed in validation: a bad PEM exits 2 and binds nothing.
    let good = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let other = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    std::fs::write(dir.path("cert.pem"), good.cert.pem()).unwrap();
    std::fs::write(dir.path("key.pem"), good.signing_key.serialize_pem()).unwrap();
    std::fs::write(dir.path("other.key"), other.signing_key.serialize_pem()).unwrap();
    std::fs::write(
        dir.path("junk.pem"),
        "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    std::fs::write(dir.path("empty.pem"), "hello\n").unwrap();
    let p = |n: &str| dir.path(n).display().to_string();
    for (cert, key, says) in [
        (p("junk.pem"), p("key.pem"), "junk.pem"),
        (p("empty.pem"), p("key.pem"), "no PEM certificate"),
        (p("cert.pem"), p("empty.pem"), "no PEM private key"),
        (
            p("cert.pem"),
            p("other.key"),
            "do not make a usable certificate and key",
        ),
    ] {
        let addr = free_addr();
        std::fs::write(
            &cfg,
            format!("listen = \"{addr}\"\n[tls]\ncert = \"{cert}\"\nkey = \"{key}\"\n"),
        )
        .unwrap();
        let (code, log) = run_and_wait(&dir, &["--config", cfg.to_str().unwrap()], &[]);
        assert_eq!(code, 2, "{log}");
        assert!(log.contains(says), "expected '{says}' in: {log}");
        assert!(
            std::net::TcpStream::connect(addr).is_err(),
            "bound {addr} before failing"
        );
    }
    let peer = format!(
        "[cluster]\nnode_id = 1\nlisten = \"127.0.0.1:7001\"\ndata_dir = \"{}\"\ncluster_id = \"c\"\npeers = [{{ id = 1, addr = \"127.0.0.1:7001\" }}]\n[cluster.tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n",
        p("data"),
        p("junk.pem"),
        p("cert.pem"),
        p("key.pem")
    );
    std::fs::write(&cfg, peer).unwrap();
    let (code, log) = run_and_wait(&dir, &["--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(code, 2, "{log}");
    assert!(
        log.contains("cluster.tls") && log.contains("junk.pem"),
        "{log}"
    );
    // --print-config shows the merged result, env and flags included.
    let out = std::process::Command::new(bin("router"))
        .args([
            "--print-config",
            "--upstream",
            "http://a:1,http://b:2",
            "--policy",
            "load",
        ])
        .env("ROUTER_LIMITS__MAX_BODY_BYTES", "1234")
        .env("ROUTER_API_KEY", "client-key-sekrit")
        .env("ROUTER_ADMIN_TOKEN", "admin-token-sekrit-123")
        .env("RJ_UPSTREAM_TOKEN", "upstream-token-sekrit")
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{s}");
    // Secrets are shown as set, never printed.
    assert!(!s.contains("sekrit"), "a secret was printed:\n{s}");
    assert_eq!(s.matches("\"<redacted>\"").count(), 3, "{s}");
    assert!(s.contains("max_body_bytes = 1234"), "{s}");
    assert!(s.contains("policy = \"load\""), "{s}");
    assert!(s.contains("http://b:2"), "{s}");
}
