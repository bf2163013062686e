//! Upstream failures: before the first byte the request goes elsewhere; after it the client
//! is told; with nothing healthy the client gets a 503.

use router_tests::*;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_upstream_is_retried_before_first_byte() {
    let dead = free_addr(); // nothing listens here
    let r = router("retry")
        .engines(1)
        .table("[health]\ninterval_ms = 60000")
        .upstream(&format!("http://{dead}"))
        .start()
        .await;
    let (addr, engines) = (r.addr, &r.engines);
    let url = r.url("/v1/chat/completions");
    for i in 0..6 {
        let r = post(&url, &Conversation::new(i, 3000).body("m", i % 2 == 0), &[]).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.header("x-router-upstream").unwrap(), engines[0].url());
    }
    let m = send("GET", &format!("http://{addr}/metrics"), "", &[]).await;
    let t = String::from_utf8_lossy(&m.body);
    assert!(
        t.contains("router_upstream_attempt_failures_total{kind=\"connect\"}"),
        "{t}"
    );
    assert!(
        !t.contains("router_upstream_attempt_failures_total{kind=\"connect\"} 0"),
        "{t}"
    );
    // Passive failures mark it down after 3 strikes.
    assert!(
        t.contains(&format!(
            "router_upstream_up{{upstream=\"http://{dead}\"}} 0"
        )),
        "{t}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_503_is_retried_and_all_failing_gives_502() {
    let r = router("503")
        .engines(2)
        .table("[health]\ninterval_ms = 60000\nfall = 100")
        .start()
        .await;
    let engines = &r.engines;
    engines[0].state.force_status.store(503, Relaxed);
    let url = r.url("/v1/chat/completions");
    for i in 0..4 {
        let r = post(&url, &Conversation::new(i, 100).body("m", false), &[]).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-engine").unwrap(), "e1");
    }
    engines[1].state.force_status.store(502, Relaxed);
    let r = post(&url, &Conversation::new(9, 100).body("m", false), &[]).await;
    assert_eq!(r.status, 502);
    assert_eq!(r.json()["error"]["code"], "upstream_unavailable");
    // A 500 from the engine is the engine's answer: passed through, not retried.
    engines[1].state.force_status.store(500, Relaxed);
    engines[0].state.force_status.store(500, Relaxed);
    let before = engines[0].count() + engines[1].count();
    let r = post(&url, &Conversation::new(10, 100).body("m", false), &[]).await;
    assert_eq!(r.status, 500);
    assert_eq!(engines[0].count() + engines[1].count(), before + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_healthy_upstream_gives_503() {
    let dead = free_addr();
    let r = router("nohealthy")
        .table("[health]\ninterval_ms = 50\ntimeout_ms = 50\nfall = 1")
        .upstream(&format!("http://{dead}"))
        .start()
        .await;
    let addr = r.addr;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let h = send("GET", &format!("http://{addr}/health"), "", &[]).await;
    assert_eq!(h.status, 503);
    assert_eq!(h.json()["status"], "unavailable");
    let r = post(
        &format!("http://{addr}/v1/chat/completions"),
        &Conversation::new(1, 10).body("m", false),
        &[],
    )
    .await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["code"], "no_healthy_upstream");
}

/// Active probes take an upstream whose health check fails out of rotation (requests go
/// to the other one, or get a 503 when none is left) and bring it back once it passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_probes_take_an_upstream_out_and_bring_it_back() {
    let r = router("probe")
        .engines(2)
        .env("ROUTER_ADMIN_TOKEN", ADMIN_TOKEN)
        .table("[health]\ninterval_ms = 50\nfall = 2\nrise = 2")
        .start()
        .await;
    let e = &r.engines;
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let health = || async { send("GET", &r.url("/health"), "", &[("authorization", &auth)]).await };
    let up_of = |h: &Reply, i: usize| h.json()["upstreams"][i]["up"].as_bool().unwrap();
    let wait = |what: &'static str, f: fn(&Reply) -> bool| {
        let health = &health;
        async move {
            for _ in 0..100 {
                if f(&health().await) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("{what}: {}", health().await.json());
        }
    };
    let h = health().await;
    assert_eq!((h.status, h.json()["status"].clone()), (200, "ok".into()));
    for _ in 0..100 {
        if e[0].state.probes.load(Relaxed) >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(e[0].state.probes.load(Relaxed) >= 1, "never probed");

    // e0's health check fails: it is marked down, and new requests all go to e1.
    e[0].state.health_status.store(500, Relaxed);
    wait("e0 marked down", |h| {
        h.json()["upstreams"][0]["up"] == false && h.json()["status"] == "degraded"
    })
    .await;
    assert!(up_of(&health().await, 1));
    let before = e[0].count();
    for i in 0..6 {
        let r = post(
            &r.url("/v1/chat/completions"),
            &Conversation::new(500 + i, 500).body("m", false),
            &[],
        )
        .await;
        assert_eq!(r.header("x-engine").as_deref(), Some("e1"));
    }
    assert_eq!(
        e[0].count(),
        before,
        "a request reached the upstream marked down"
    );

    // Both down: 503 on /health and on requests.
    e[1].state.health_status.store(503, Relaxed);
    wait("both down", |h| {
        h.status == 503 && h.json()["status"] == "unavailable"
    })
    .await;
    let x = post(
        &r.url("/v1/chat/completions"),
        &Conversation::new(600, 500).body("m", false),
        &[],
    )
    .await;
    assert_eq!(x.status, 503);
    assert_eq!(x.json()["error"]["code"], "no_healthy_upstream");

    // Probes pass again: both come back and serve.
    e[0].state.health_status.store(0, Relaxed);
    e[1].state.health_status.store(0, Relaxed);
    wait("both back", |h| {
        h.status == 200 && h.json()["status"] == "ok"
    })
    .await;
    let x = post(
        &r.url("/v1/chat/completions"),
        &Conversation::new(700, 500).body("m", false),
        &[],
    )
    .await;
    assert_eq!(x.status, 200);
}

/// Upstream connections are pooled: sequential requests share one; a connection the
/// engine closed while idle (its keep-alive timeout) or after a `Connection: close` reply
/// is never reused and never fails a request; and every relayed response's usage is
/// counted, whole-body replies included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_connections_are_reused_and_closed_ones_never_fail() {
    let engine = router_tests::engine::FakeEngine::start_with_idle_close(
        "e0",
        Some(Duration::from_millis(1000)),
    )
    .await;
    let r = router("pool")
        .with_engines(vec![engine])
        .key("workers = 1")
        .table("[health]\ninterval_ms = 60000")
        .start()
        .await;
    let (addr, engine) = (r.addr, &r.engines[0]);
    let url = r.url("/v1/chat/completions");
    let conns = || engine.state.connections.load(Relaxed);
    let before = conns();
    for i in 0..30 {
        let r = post(&url, &Conversation::new(i, 2000).body("m", i % 2 == 0), &[]).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    // One for the requests, at most one more for the start-up health probe's own client.
    let used = conns() - before;
    assert!(
        used <= 2,
        "30 sequential requests opened {used} connections"
    );

    // The engine drops the idle connection; the next requests open a new one.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let before = conns();
    for i in 0..3 {
        let r = post(&url, &Conversation::new(50 + i, 2000).body("m", false), &[]).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    assert!(conns() > before, "no new connection after the idle close");

    let before = conns();
    for i in 0..10 {
        let r = post(
            &url,
            &Conversation::new(60 + i, 2000).body("m", false),
            &[("x-fake-close", "1")],
        )
        .await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    assert!(
        conns() - before >= 9,
        "connections closed by the engine were reused"
    );

    let m = send("GET", &format!("http://{addr}/metrics"), "", &[]).await;
    let t = String::from_utf8_lossy(&m.body);
    assert!(
        t.lines().any(|l| l == "router_usage_responses_total 43"),
        "usage not counted for every response:\n{t}"
    );
    assert!(
        !t.contains("router_upstream_attempt_failures_total{kind=\"reset\"} 1"),
        "{t}"
    );
}

/// The router closes upstream connections idle past `timeouts.upstream_idle_ms` (set
/// below the engines' keep-alive, so it never reuses one the engine is closing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_upstream_connections_expire() {
    let r = router("pool-idle")
        .engines(1)
        .key("workers = 1")
        .table("[timeouts]\nupstream_idle_ms = 1000")
        .table("[health]\ninterval_ms = 60000")
        .start()
        .await;
    let engine = &r.engines[0];
    let url = r.url("/v1/chat/completions");
    let conns = || engine.state.connections.load(Relaxed);
    let ok = |r: Reply| assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    ok(post(&url, &Conversation::new(1, 1000).body("m", false), &[]).await);
    let before = conns();
    for i in 0..5 {
        ok(post(&url, &Conversation::new(2 + i, 1000).body("m", false), &[]).await);
    }
    assert_eq!(
        conns(),
        before,
        "back-to-back requests did not reuse the connection"
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    ok(post(&url, &Conversation::new(9, 1000).body("m", false), &[]).await);
    assert_eq!(conns(), before + 1, "an expired connection was reused");
}

/// A router never becomes its own upstream: a join of its own URL is refused, a request
/// that comes back to it is refused on the wire (508, before the key check, so it is not
/// mistaken for a client without a key), and health probes mark such an upstream down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_never_becomes_its_own_upstream() {
    let r = router("self-join")
        .engines(1)
        .env("ROUTER_ADMIN_TOKEN", ADMIN_TOKEN)
        .start()
        .await;
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let own = format!("http%3A%2F%2F{}", r.addr);
    let x = send(
        "POST",
        &r.url(&format!("/add_worker?url={own}")),
        "",
        &[("authorization", &auth)],
    )
    .await;
    assert_eq!(x.status, 400, "{}", String::from_utf8_lossy(&x.body));
    assert_eq!(x.json()["error"]["code"], "invalid_url");
    assert!(x.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("this router"));
    let list = send(
        "GET",
        &r.url("/list_workers"),
        "",
        &[("authorization", &auth)],
    )
    .await;
    assert_eq!(list.json()["urls"].as_array().unwrap().len(), 1);

    // Configured as its own upstream (probes too rare to have marked it down yet), with a
    // client key: the looped request is refused once, and the client gets a 508.
    let addr = free_addr();
    let dir = TempDir::new("self-loop");
    let toml = format!(
        "listen = \"{addr}\"\napi_key = \"client-key-1\"\n[health]\ninterval_ms = 60000\n[[upstreams]]\nurl = \"http://{addr}\"\n"
    );
    let _p = start_router(&dir, &toml, &[], addr).await;
    let t = std::time::Instant::now();
    let x = post(
        &format!("http://{addr}/v1/chat/completions"),
        &Conversation::new(1, 100).body("m", false),
        &[("authorization", "Bearer client-key-1")],
    )
    .await;
    assert_eq!(x.status, 508, "{}", String::from_utf8_lossy(&x.body));
    assert_eq!(x.json()["error"]["code"], "routing_loop");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(
        send("GET", &format!("http://{addr}/health"), "", &[])
            .await
            .status,
        200
    );

    // With probes on, the self-upstream is marked down: nothing is sent to it.
    let addr = free_addr();
    let dir = TempDir::new("self-probe");
    let toml = format!(
        "listen = \"{addr}\"\n[health]\ninterval_ms = 50\nfall = 2\n[[upstreams]]\nurl = \"http://{addr}\"\n"
    );
    let _p = start_router(&dir, &toml, &[], addr).await;
    let mut down = false;
    for _ in 0..100 {
        if send("GET", &format!("http://{addr}/health"), "", &[])
            .await
            .status
            == 503
        {
            down = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(down, "a router probing itself kept itself up");
    let x = post(
        &format!("http://{addr}/v1/chat/completions"),
        &Conversation::new(2, 100).body("m", false),
        &[],
    )
    .await;
    assert_eq!(x.json()["error"]["code"], "no_healthy_upstream");
}

/// A request waiting for its first byte from an upstream that the health checker marks
/// down meanwhile goes to another upstream at once, instead of waiting out
/// `first_byte_ms` (600 s by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_on_an_upstream_marked_down_is_retried_elsewhere() {
    let r = router("down-inflight")
        .engines(2)
        .table("[health]\ninterval_ms = 100\nfall = 2")
        .start()
        .await;
    let e = &r.engines;
    e[0].state.delay_ms.store(60_000, Relaxed);
    let url = r.url("/v1/chat/completions");
    // Find a conversation the router sends to e0 (the others return at once from e1).
    let mut stuck = None;
    for i in 0..20u64 {
        let before = e[0].count();
        let u = url.clone();
        let req = tokio::spawn(async move {
            post(&u, &Conversation::new(900 + i, 500).body("m", false), &[]).await
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        if e[0].count() > before && !req.is_finished() {
            stuck = Some(req);
            break;
        }
        let x = req.await.unwrap();
        assert_eq!(x.header("x-engine").as_deref(), Some("e1"));
    }
    let stuck = stuck.expect("no request went to e0");
    // e0's probes fail: marked down within ~200 ms, and the waiting request moves to e1.
    let t = std::time::Instant::now();
    e[0].state.health_status.store(500, Relaxed);
    let x = tokio::time::timeout(Duration::from_secs(5), stuck)
        .await
        .expect("the request kept waiting on the upstream marked down")
        .unwrap();
    assert_eq!(x.status, 200, "{}", String::from_utf8_lossy(&x.body));
    assert_eq!(x.header("x-engine").as_deref(), Some("e1"));
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let m = send("GET", &r.url("/metrics"), "", &[]).await;
    let text = String::from_utf8_lossy(&m.body);
    assert!(
        text.contains("router_upstream_attempt_failures_total{kind=\"marked_down\"} 1"),
        "{text}"
    );
}

/// An engine whose health check passes but whose answers are 500s is ejected after
/// `consecutive_5xx` of them: new requests go to the other engine, the ejection is
/// counted, and it comes back when the ejection ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_answering_500_is_ejected_and_comes_back() {
    let r = router("outlier")
        .engines(2)
        .table("[health]\ninterval_ms = 100\nconsecutive_5xx = 3\nejection_ms = 1500")
        .start()
        .await;
    let e = &r.engines;
    e[0].state.force_status.store(500, Relaxed);
    let url = r.url("/v1/chat/completions");
    let mut fives = 0;
    for i in 0..40u64 {
        let x = post(
            &url,
            &Conversation::new(2000 + i, 300).body("m", false),
            &[],
        )
        .await;
        if x.status == 500 {
            fives += 1;
        }
    }
    assert!(
        fives <= 3,
        "{fives} answers of 500 reached clients; ejection after 3"
    );
    // After the ejection, nothing more reaches e0.
    let before = e[0].count();
    for i in 0..10u64 {
        let x = post(
            &url,
            &Conversation::new(3000 + i, 300).body("m", false),
            &[],
        )
        .await;
        assert_eq!(x.status, 200);
        assert_eq!(x.header("x-engine").as_deref(), Some("e1"));
    }
    assert_eq!(e[0].count(), before, "an ejected engine got requests");
    let m = send("GET", &r.url("/metrics"), "", &[]).await;
    let text = String::from_utf8_lossy(&m.body);
    let line = format!(
        "router_upstream_ejections_total{{upstream=\"{}\"}} 1",
        e[0].url()
    );
    assert!(text.contains(&line), "{text}");
    // Fixed and the ejection over: it takes new conversations again.
    e[0].state.force_status.store(0, Relaxed);
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let mut back = false;
    for i in 0..20u64 {
        let x = post(
            &url,
            &Conversation::new(4000 + i, 300).body("m", false),
            &[],
        )
        .await;
        back |= x.header("x-engine").as_deref() == Some("e0");
    }
    assert!(back, "the engine never came back after its ejection");
}
