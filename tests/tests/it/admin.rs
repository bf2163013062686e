//! Operating a running three-router cluster with mutual TLS between peers: `routerctl`
//! (token required) joins, drains and removes engine servers mid-run, the
//! vllm-router-compatible HTTP endpoints do the same, and the peer port refuses callers
//! without the cluster's certificate or with another cluster's id.

use router_proto::v1::peer_client::PeerClient;
use router_proto::v1::RaftMessage;
use router_tests::cluster::{wait_until, Cluster, Pki};
use router_tests::engine::{fleet, FakeEngine};
use router_tests::*;
use std::time::{Duration, Instant};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

const TOKEN: &str = ADMIN_TOKEN;

struct Ctl {
    router: String,
    /// The cluster CA, when the peers speak TLS.
    ca: Option<std::path::PathBuf>,
}

impl Ctl {
    /// Runs routerctl; returns (success, stdout, stderr).
    async fn run(&self, token: Option<&str>, args: &[&str]) -> (bool, String, String) {
        let mut cmd = tokio::process::Command::new(bin("routerctl"));
        cmd.args(["--router", &self.router]);
        if let Some(ca) = &self.ca {
            cmd.arg("--ca").arg(ca);
        }
        cmd.args(args).env_remove("ROUTERCTL_TOKEN");
        if let Some(t) = token {
            cmd.env("ROUTERCTL_TOKEN", t);
        }
        let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
            .await
            .expect("routerctl timed out")
            .expect("routerctl runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(Some(TOKEN), args).await;
        assert!(ok, "routerctl {args:?} failed: {err}");
        out
    }
}

fn engine_of(engines: &[FakeEngine], r: &Reply) -> usize {
    let up = r.header("x-router-upstream").expect("upstream header");
    engines
        .iter()
        .position(|e| e.url() == up)
        .unwrap_or_else(|| panic!("unknown upstream {up}"))
}

async fn turn(c: &Cluster, peer: usize, conv: &Conversation, headers: &[(&str, &str)]) -> Reply {
    let r = post(
        &format!("http://{}/v1/chat/completions", c.http[peer]),
        &conv.body("m", false),
        headers,
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r
}

async fn admin_http(c: &Cluster, method: &str, path: &str, token: Option<&str>) -> Reply {
    let auth = token.map(|t| format!("Bearer {t}"));
    let h: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| vec![("authorization", a)])
        .unwrap_or_default();
    send(
        method,
        &format!("http://{}{path}", c.http[1]),
        Vec::new(),
        &h,
    )
    .await
}

async fn vote_with(
    addr: std::net::SocketAddr,
    tls: ClientTlsConfig,
    cluster_id: &str,
) -> Result<(), String> {
    let ch = Endpoint::from_shared(format!("https://{addr}"))
        .map_err(|e| e.to_string())?
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut c = PeerClient::new(ch);
    let mut req = tonic::Request::new(RaftMessage {
        cluster_id: cluster_id.into(),
        payload: b"{}".to_vec(),
        error: String::new(),
    });
    req.set_timeout(Duration::from_secs(2));
    c.applied(req)
        .await
        .map(|_| ())
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routerctl_and_http_admin_change_servers_on_every_peer() {
    let t0 = Instant::now();
    let engines = fleet(3).await;
    // Four address pairs in the certificates; the fourth peer joins later.
    let (mut http, mut raft) = Cluster::addresses(4);
    let certs = TempDir::new("pki");
    let pki = Pki::generate(&certs, "good", &raft);
    let rogue = Pki::generate(&certs, "rogue", &raft);
    let (http4, raft4) = (http.pop().unwrap(), raft.pop().unwrap());
    let top = format!(
        "admin_token = \"{TOKEN}\"\n[health]\ninterval_ms = 500\n[[upstreams]]\nurl = \"{}\"\n[[upstreams]]\nurl = \"{}\"\n",
        engines[0].url(),
        engines[1].url()
    );
    let tls = format!(
        "[cluster.tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n",
        pki.ca.display(),
        pki.cert.display(),
        pki.key.display()
    );
    let mut c = Cluster::start(http, raft, &top, &tls).await;
    c.wait_formed(2, 30).await;
    eprintln!("cluster formed over mTLS after {:?}", t0.elapsed());
    let ctl = Ctl {
        router: c.raft[2].to_string(),
        ca: Some(pki.ca.clone()),
    };

    // Admin needs the token, on gRPC and HTTP.
    let (ok, _, err) = ctl.run(None, &["servers"]).await;
    assert!(!ok && err.contains("token"), "no token: {err}");
    let (ok, _, err) = ctl.run(Some("wrong-token-wrong-token"), &["servers"]).await;
    assert!(!ok && err.contains("Unauthenticated"), "wrong token: {err}");
    let r = admin_http(&c, "GET", "/list_workers", None).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["code"], "invalid_admin_token");
    let r = admin_http(&c, "GET", "/list_workers", Some("nope")).await;
    assert_eq!(r.status, 401);
    let r = admin_http(&c, "GET", "/list_workers", Some(TOKEN)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["urls"].as_array().unwrap().len(), 2);

    // The peer port: the cluster's certificate with the right id passes; no client
    // certificate, another CA's certificate, or another cluster id is refused.
    let good = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(&pki.ca).unwrap()))
        .identity(Identity::from_pem(
            std::fs::read(&pki.cert).unwrap(),
            std::fs::read(&pki.key).unwrap(),
        ));
    let bare = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(&pki.ca).unwrap()));
    let foreign = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(&pki.ca).unwrap()))
        .identity(Identity::from_pem(
            std::fs::read(&rogue.cert).unwrap(),
            std::fs::read(&rogue.key).unwrap(),
        ));
    assert_eq!(vote_with(c.raft[0], good.clone(), "test").await, Ok(()));
    let e = vote_with(c.raft[0], bare, "test").await.unwrap_err();
    assert!(e.contains("Unauthenticated"), "no client cert: {e}");
    let e = vote_with(c.raft[0], foreign, "test").await.unwrap_err();
    assert!(!e.is_empty(), "a certificate of another CA was accepted");
    let e = vote_with(c.raft[0], good, "other-cluster")
        .await
        .unwrap_err();
    assert!(e.contains("PermissionDenied"), "wrong cluster id: {e}");

    let status = ctl.ok(&["status", "--json"]).await;
    let s: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(s["peers"].as_array().unwrap().len(), 3, "{s}");
    assert!(s["leader"].as_u64().unwrap() > 0);
    let table = ctl.ok(&["status"]).await;
    assert!(
        table.contains("APPLIED") && table.contains(&engines[0].url()),
        "{table}"
    );

    // Join mid-run: new conversations reach the new server within 2 s of the command.
    let joined_at = Instant::now();
    let out = ctl
        .ok(&["join", &engines[2].url(), "--capacity-tokens", "200000"])
        .await;
    assert!(out.contains("joined"), "{out}");
    let mut first_on_new = None;
    for k in 0..60u64 {
        let conv = Conversation::new(10_000 + k, 3000);
        let r = turn(&c, (k % 3) as usize, &conv, &[]).await;
        if engine_of(&engines, &r) == 2 {
            first_on_new = Some(joined_at.elapsed());
            break;
        }
    }
    let first = first_on_new.expect("the joined server never got a new conversation");
    eprintln!("joined server took its first new conversation {first:?} after the join began");
    assert!(first < Duration::from_secs(2), "{first:?}");
    let servers = ctl.ok(&["servers", "--json"]).await;
    let sv: serde_json::Value = serde_json::from_str(&servers).unwrap();
    assert_eq!(sv["servers"].as_array().unwrap().len(), 3, "{sv}");

    // Drain engine 0 while a slow stream runs on it: the stream finishes, nothing new
    // goes there from any peer.
    let mut pinned = None;
    for k in 0..60u64 {
        let conv = Conversation::new(20_000 + k, 3000);
        let r = turn(&c, 0, &conv, &[]).await;
        if engine_of(&engines, &r) == 0 {
            pinned = Some(conv);
            break;
        }
    }
    let pinned = pinned.expect("no conversation landed on engine 0");
    // An agent's next turn comes after it ran its tools; by then every peer knows the route.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let slow_url = format!("http://{}/v1/chat/completions", c.http[0]);
    let slow_body = pinned.body("m", true);
    let slow = tokio::spawn(async move {
        post(
            &slow_url,
            &slow_body,
            &[("x-fake-chunks", "8"), ("x-fake-gap-ms", "250")],
        )
        .await
    });
    wait_until("the slow stream in flight", 5, async || {
        c.health(0).await.is_some_and(|h| {
            h["upstreams"]
                .as_array()
                .unwrap()
                .iter()
                .any(|u| u["url"] == engines[0].url() && u["inflight"].as_u64() > Some(0))
        })
    })
    .await;
    let completed_before = engines[0]
        .state
        .completed
        .load(std::sync::atomic::Ordering::Relaxed);
    ctl.ok(&["drain", &engines[0].url()]).await;
    let before = engines[0].count();
    for k in 0..24u64 {
        let mut conv = Conversation::new(30_000 + k, 3000);
        turn(&c, (k % 3) as usize, &conv, &[]).await;
        conv.advance("ok", 500);
        turn(&c, ((k + 1) % 3) as usize, &conv, &[]).await;
    }
    // The pinned conversation moves too.
    turn(&c, 1, &pinned, &[]).await;
    assert_eq!(
        engines[0].count(),
        before,
        "a drained server got new requests"
    );
    let r = slow.await.unwrap();
    assert_eq!(r.status, 200);
    let body = String::from_utf8_lossy(&r.body);
    assert!(
        body.contains("[DONE]"),
        "the in-flight stream was cut: {body}"
    );
    assert!(
        engines[0]
            .state
            .completed
            .load(std::sync::atomic::Ordering::Relaxed)
            > completed_before,
        "the in-flight stream did not complete on the drained server"
    );
    ctl.ok(&["drain", "--undo", &engines[0].url()]).await;

    // Leave: after the command returns, no peer sends anything there.
    ctl.ok(&["leave", &engines[1].url()]).await;
    let before = engines[1].count();
    for k in 0..30u64 {
        let conv = Conversation::new(40_000 + k, 3000);
        turn(&c, (k % 3) as usize, &conv, &[]).await;
    }
    assert_eq!(engines[1].count(), before, "a departed server got requests");
    let (ok, _, err) = ctl.run(Some(TOKEN), &["leave", &engines[1].url()]).await;
    assert!(!ok && err.contains("no server"), "{err}");

    // The same through the vllm-router-style HTTP endpoints, on another peer.
    let enc = |u: &str| u.replace(':', "%3A").replace('/', "%2F");
    let r = admin_http(
        &c,
        "POST",
        &format!("/add_worker?url={}", enc(&engines[1].url())),
        Some(TOKEN),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let mut back = false;
    for k in 0..60u64 {
        let conv = Conversation::new(50_000 + k, 3000);
        if engine_of(&engines, &turn(&c, (k % 3) as usize, &conv, &[]).await) == 1 {
            back = true;
            break;
        }
    }
    assert!(back, "a server added with /add_worker got no traffic");
    let r = admin_http(
        &c,
        "POST",
        &format!("/remove_worker?url={}", engines[2].url()),
        Some(TOKEN),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let r = admin_http(&c, "GET", "/list_workers", Some(TOKEN)).await;
    let urls = r.json()["urls"].clone();
    assert_eq!(urls.as_array().unwrap().len(), 2, "{urls}");
    assert!(!urls.to_string().contains(&engines[2].url()));
    let r = admin_http(
        &c,
        "POST",
        "/remove_worker?url=http%3A%2F%2F127.0.0.1%3A1",
        Some(TOKEN),
    )
    .await;
    assert_eq!(r.status, 404);
    let r = admin_http(&c, "POST", "/add_worker?url=ftp%3A%2F%2Fx", Some(TOKEN)).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "invalid_url");
    let r = admin_http(&c, "GET", "/add_worker?url=x", Some(TOKEN)).await;
    assert_eq!(r.status, 405);

    c.wait_converged(10).await;

    // A fourth router peer: started alone, added with routerctl (learner, then voter), it
    // holds the same state; removed, its id is retired for good.
    let p4 = c.spawn_new_peer(http4, raft4).await;
    let out = ctl.ok(&["peers", "add", "4", &raft4.to_string()]).await;
    assert!(out.contains("voter"), "{out}");
    let s: serde_json::Value = serde_json::from_str(&ctl.ok(&["status", "--json"]).await).unwrap();
    let peers = s["peers"].as_array().unwrap();
    assert_eq!(peers.len(), 4, "{s}");
    assert!(peers.iter().all(|p| p["voter"] == true), "{s}");
    c.wait_converged(10).await;
    let r = turn(&c, p4, &Conversation::new(60_000, 3000), &[]).await;
    assert!(r.header("x-router-upstream").is_some());
    ctl.ok(&["peers", "remove", "4"]).await;
    let s: serde_json::Value = serde_json::from_str(&ctl.ok(&["status", "--json"]).await).unwrap();
    assert_eq!(s["peers"].as_array().unwrap().len(), 3, "{s}");
    c.kill(p4);
    let (ok, _, err) = ctl
        .run(Some(TOKEN), &["peers", "add", "4", &raft4.to_string()])
        .await;
    assert!(!ok && err.contains("never reused"), "{err}");
    c.wait_converged(10).await;
    eprintln!("done after {:?}", t0.elapsed());
}

/// `routerctl peers add` of an address where nothing listens must never make a voter:
/// with four voters, losing one real peer would leave two of four, no majority. The add
/// fails after its catch-up time with the peer taken out again, the voters stay three, and
/// after one real peer is killed joins still commit. Also: `--router` takes a URL, a
/// routerctl pointed at the HTTP port says so, and a router of the cluster cannot join as
/// an engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_peer_never_votes_and_one_failure_is_survived() {
    let engines = fleet(2).await;
    let (http, raft) = Cluster::addresses(3);
    let top = format!(
        "[health]\ninterval_ms = 500\n[[upstreams]]\nurl = \"{}\"\n",
        engines[0].url()
    );
    let mut c = Cluster::start(http, raft, &top, "").await;
    c.wait_formed(1, 30).await;
    let ctl = Ctl {
        router: format!("http://{}/", c.raft[1]),
        ca: None,
    };
    let nowhere = free_addr().to_string();
    let t = Instant::now();
    let (ok, out, err) = ctl
        .run(
            Some(TOKEN),
            &["peers", "add", "9", &nowhere, "--catch-up-secs", "2"],
        )
        .await;
    assert!(!ok, "an unreachable peer was added: {out}");
    assert!(err.contains("did not catch up"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    let s: serde_json::Value = serde_json::from_str(&ctl.ok(&["status", "--json"]).await).unwrap();
    let peers = s["peers"].as_array().unwrap();
    assert_eq!(peers.len(), 3, "{s}");
    assert!(
        peers
            .iter()
            .all(|p| p["voter"] == true && p["node_id"] != 9),
        "{s}"
    );

    // One real peer dies: two of three voters remain, and a join commits through a survivor.
    c.kill(0);
    let out = ctl.ok(&["join", &engines[1].url(), "--json"]).await;
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["ok"], true, "{j}");
    assert!(j["log_index"].as_u64().unwrap() > 0, "{j}");
    let confirmed = j["confirmed_peers"].as_array().unwrap();
    assert!(
        confirmed.contains(&2.into()) && confirmed.contains(&3.into()),
        "{j}"
    );
    for peer in [1, 2] {
        wait_until("the joined server on a survivor", 10, async || {
            c.health(peer)
                .await
                .is_some_and(|h| h["upstreams"].as_array().is_some_and(|u| u.len() == 2))
        })
        .await;
    }

    // Pointed at the HTTP port, routerctl says which port it wants.
    let wrong = Ctl {
        router: c.http[1].to_string(),
        ca: None,
    };
    let (ok, _, err) = wrong.run(Some(TOKEN), &["status"]).await;
    assert!(!ok);
    assert!(err.contains("HTTP (client) port"), "{err}");
    // A router of this cluster is not an engine.
    let (ok, _, err) = ctl
        .run(Some(TOKEN), &["join", &format!("http://{}", c.http[2])])
        .await;
    assert!(!ok);
    assert!(err.contains("this router"), "{err}");
}

/// `routerctl explain` and `POST /admin/explain` against a running cluster: the next turn
/// of a conversation, explained on another peer, goes to the rank that served its first
/// turn, by prefix hit with that prefix predicted cached; every rank is listed, best first,
/// with its load and cost; nothing is sent to an engine; the text output says the same;
/// the HTTP endpoint wants the admin token and refuses a body that is not JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shows_the_decision_for_the_next_turn_without_sending_it() {
    let engines = fleet(3).await;
    let (http, raft) = Cluster::addresses(3);
    let top: String = engines
        .iter()
        .map(|e| format!("[[upstreams]]\nurl = \"{}\"\n", e.url()))
        .collect();
    let c = Cluster::start(http, raft, &top, "").await;
    c.wait_formed(3, 30).await;
    let mut conv = Conversation::new(4242, 6000);
    let served = engine_of(&engines, &turn(&c, 0, &conv, &[]).await);
    conv.advance("done", 2000);
    let body = serde_json::to_vec(&conv.body("m", false)).unwrap();
    let dir = TempDir::new("explain");
    let file = dir.path("turn.json");
    std::fs::write(&file, &body).unwrap();
    let file = file.to_str().unwrap();
    let sent: usize = engines.iter().map(FakeEngine::count).sum();
    let ctl = Ctl {
        router: format!("http://{}/", c.raft[2]),
        ca: None,
    };
    // Peer 3 learns the first turn through the log.
    let mut v = serde_json::Value::Null;
    wait_until("peer 3 routes by the first turn", 10, async || {
        v = serde_json::from_str(&ctl.ok(&["explain", file, "--json"]).await).unwrap();
        v["winner"]["url"] == engines[served].url().as_str()
            && v["winner"]["reason"] == "prefix_hit"
    })
    .await;
    assert_eq!(v["winner"]["reason"], "prefix_hit", "{v}");
    assert!(
        v["winner"]["predicted_cached_tokens"].as_u64().unwrap() >= 1500,
        "{v}"
    );
    assert!(v["canonical_bytes"].as_u64().unwrap() > 8000, "{v}");
    assert!(v["chunks"].as_u64().unwrap() >= 4, "{v}");
    let cands = v["candidates"].as_array().unwrap();
    assert_eq!(cands.len(), 3, "{v}");
    let costs: Vec<f64> = cands.iter().map(|c| c["cost"].as_f64().unwrap()).collect();
    assert!(costs.windows(2).all(|w| w[0] <= w[1]), "{costs:?}");
    assert!(costs[0] < costs[2], "the cached rank costs less: {costs:?}");
    assert_eq!(engines.iter().map(FakeEngine::count).sum::<usize>(), sent);
    let text = ctl.ok(&["explain", file]).await;
    eprintln!("{text}");
    assert!(text.contains("winner: rank"), "{text}");
    assert!(text.contains("prefix_hit"), "{text}");
    assert!(text.contains(&engines[served].url()), "{text}");
    let (ok, _, err) = ctl.run(None, &["explain", file]).await;
    assert!(!ok && err.contains("token"), "{err}");

    let url = format!("http://{}/admin/explain?endpoint=chat", c.http[2]);
    let auth = format!("Bearer {TOKEN}");
    let r = send("POST", &url, body.clone(), &[("authorization", &auth)]).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["winner"], v["winner"]);
    let r = send("POST", &url, body.clone(), &[]).await;
    assert_eq!(r.status, 401, "{}", String::from_utf8_lossy(&r.body));
    let r = send(
        "POST",
        &url,
        b"{not json".to_vec(),
        &[("authorization", &auth)],
    )
    .await;
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(engines.iter().map(FakeEngine::count).sum::<usize>(), sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_shows_each_rank_the_decisions_and_every_peer() {
    let engines = fleet(3).await;
    let (http, raft) = Cluster::addresses(3);
    let upstreams: String = engines
        .iter()
        .map(|e| format!("[[upstreams]]\nurl = \"{}\"\n", e.url()))
        .collect();
    let c = Cluster::start(http, raft, &upstreams, "").await;
    c.wait_formed(3, 30).await;
    let ctl = Ctl {
        router: format!("http://{}/", c.raft[0]),
        ca: None,
    };
    // Turns through peer 1 while `top` measures it: its rates are over this traffic.
    let traffic = async {
        let mut conv = Conversation::new(77, 4000);
        for _ in 0..8 {
            let r = turn(&c, 0, &conv, &[]).await;
            assert_eq!(r.status, 200);
            conv.advance("ok", 500);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let (json_out, ()) = tokio::join!(
        ctl.ok(&["top", "--once", "--json", "--interval-ms", "1500"]),
        traffic
    );
    let v: serde_json::Value = serde_json::from_str(&json_out).unwrap();
    eprintln!("{v:#}");
    assert_eq!(v["node_id"], 1, "{v}");
    assert!(v["decisions_per_s"].as_f64().unwrap() > 0.0, "{v}");
    let by = v["decisions_by_reason_per_s"].as_object().unwrap();
    assert!(
        by.contains_key("prefix_hit") && by.contains_key("load"),
        "{v}"
    );
    let ranks = v["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 3, "{v}");
    for e in &engines {
        let r = ranks
            .iter()
            .find(|r| r["url"] == e.url().as_str())
            .unwrap_or_else(|| panic!("no rank for {}: {v}", e.url()));
        assert_eq!(r["up"], true, "{r}");
        assert_eq!(r["draining"], false, "{r}");
        assert!(r["capacity_tokens"].as_u64().unwrap() > 0, "{r}");
    }
    // The conversation stayed on one rank: it served the turns, reported its cached share
    // (the fake engine reports half of each prompt cached) and the model holds its prefix.
    let busy: Vec<&serde_json::Value> = ranks
        .iter()
        .filter(|r| r["requests"].as_u64().unwrap() > 0)
        .collect();
    assert_eq!(busy.len(), 1, "{v}");
    assert!(busy[0]["requests_per_s"].as_f64().unwrap() > 0.0, "{v}");
    let share = busy[0]["cached_share"].as_f64().unwrap();
    assert!((0.4..=0.6).contains(&share), "{v}");
    assert!(busy[0]["model_tokens"].as_u64().unwrap() > 1000, "{v}");
    assert!(busy[0]["cache_fill"].as_f64().unwrap() > 0.0, "{v}");
    let peers = v["peers"].as_array().unwrap();
    assert_eq!(peers.len(), 3, "{v}");
    assert_eq!(
        peers.iter().filter(|p| p["role"] == "Leader").count(),
        1,
        "{v}"
    );
    for p in peers {
        assert!(p["term"].as_u64().unwrap() >= 1, "{p}");
        assert!(p["applied_index"].as_u64().unwrap() >= 1, "{p}");
        assert!(p["lag"].as_u64().unwrap() < 50, "{p}");
    }

    // The table for people, over more turns: every rank, the decision split, every peer.
    let traffic = async {
        let mut conv = Conversation::new(78, 4000);
        for _ in 0..6 {
            assert_eq!(turn(&c, 0, &conv, &[]).await.status, 200);
            conv.advance("ok", 500);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let (text, ()) = tokio::join!(ctl.ok(&["top", "--once", "--interval-ms", "1000"]), traffic);
    eprintln!("{text}");
    let decisions = text
        .lines()
        .find(|l| l.starts_with("decisions "))
        .unwrap_or("");
    assert!(
        decisions.contains("prefix_hit") && !decisions.starts_with("decisions 0.0/s"),
        "{text}"
    );
    for e in &engines {
        assert!(text.contains(&e.url()), "{text}");
    }
    for id in ["1", "2", "3"] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(id) && l.contains("Leader")
                    || l.starts_with(id) && l.contains("Follower")),
            "peer {id} missing:\n{text}"
        );
    }
    let (ok, _, err) = ctl.run(None, &["top", "--once"]).await;
    assert!(!ok && err.contains("token"), "{err}");
}
