//! Three real `router` processes forming a Raft group in front of fake engines: turns sent
//! to a random peer (DNS round-robin) stay on their conversation's rank, the peers' state
//! digests converge, and `kill -9` of the leader fails no turn and loses no affinity.

use router_tests::engine::fleet;
use router_tests::*;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

#[derive(Default)]
struct Sticky {
    last: HashMap<usize, String>,
    same: u64,
    follow: u64,
}

impl Sticky {
    fn observe(&mut self, conv: usize, r: &Reply) {
        let rank = r.header("x-router-rank").unwrap();
        if let Some(prev) = self.last.insert(conv, rank.clone()) {
            self.follow += 1;
            if prev == rank {
                self.same += 1;
            }
        }
    }
}

struct Peer {
    http: SocketAddr,
    proc: Option<Proc>,
}

async fn health(addr: SocketAddr) -> Option<serde_json::Value> {
    let req = http::Request::get(format!("http://{addr}/health"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .ok()?;
    let resp = tokio::time::timeout(Duration::from_secs(2), client().request(req))
        .await
        .ok()?
        .ok()?;
    let b = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .ok()?
        .to_bytes();
    serde_json::from_slice(&b).ok()
}

async fn wait_until(what: &str, secs: u64, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn digests(peers: &[Peer]) -> Vec<String> {
    let mut v = Vec::new();
    for p in peers.iter().filter(|p| p.proc.is_some()) {
        let h = health(p.http).await.unwrap_or_default();
        v.push(
            h["cluster"]["state_digest"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
        );
    }
    v
}

async fn leader_of(peers: &[Peer]) -> Option<u64> {
    for p in peers.iter().filter(|p| p.proc.is_some()) {
        if let Some(h) = health(p.http).await {
            if let Some(l) = h["cluster"]["leader"].as_u64() {
                return Some(l);
            }
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_peer_per_turn_keeps_affinity_through_leader_kill() {
    let t0 = Instant::now();
    let engines = fleet(4).await;
    let dir = TempDir::new("cluster");
    let raft: Vec<SocketAddr> = (0..3).map(|_| free_addr()).collect();
    let http: Vec<SocketAddr> = (0..3).map(|_| free_addr()).collect();
    let mut peers_toml = String::new();
    for (i, a) in raft.iter().enumerate() {
        peers_toml.push_str(&format!(
            "[[cluster.peers]]\nid = {}\naddr = \"{a}\"\n",
            i + 1
        ));
    }
    let ups: String = engines
        .iter()
        .map(|e| format!("[[upstreams]]\nurl = \"{}\"\n", e.url()))
        .collect();
    let mut peers = Vec::new();
    for i in 0..3 {
        let toml = format!(
            "listen = \"{}\"\n[health]\ninterval_ms = 500\n{ups}[cluster]\nnode_id = {}\nlisten = \"{}\"\ndata_dir = \"{}\"\ncluster_id = \"test\"\nheartbeat_ms = 50\nelection_min_ms = 200\nelection_max_ms = 400\n{peers_toml}",
            http[i],
            i + 1,
            raft[i],
            dir.path(&format!("data{i}")).display()
        );
        let sub = TempDir::new(&format!("peer{i}"));
        let p = start_router(&sub, &toml, &[], http[i]).await;
        std::mem::forget(sub);
        peers.push(Peer {
            http: http[i],
            proc: Some(p),
        });
    }
    eprintln!("peers started after {:?}", t0.elapsed());
    wait_until("a leader and 4 upstreams on every peer", 20, async || {
        for p in &peers {
            let Some(h) = health(p.http).await else {
                return false;
            };
            if h["cluster"]["leader"].is_null() || h["upstreams_total"] != 4 {
                return false;
            }
        }
        true
    })
    .await;

    let mut rng = 12345u64;
    let mut next = |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    let mut convs: Vec<Conversation> = (0..8).map(|i| Conversation::new(700 + i, 5000)).collect();
    eprintln!("cluster formed after {:?}", t0.elapsed());
    let mut st = Sticky::default();
    for _ in 0..10 {
        for (i, c) in convs.iter_mut().enumerate() {
            let p = next(3);
            let r = post(
                &format!("http://{}/v1/chat/completions", peers[p].http),
                &c.body("m", false),
                &[],
            )
            .await;
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
            st.observe(i, &r);
            c.advance("ok", 800);
        }
        // Agents think (run tools) between turns, usually for seconds; 400 ms is a fast agent.
        // A decision reaches the other peers after batching, commit and the next heartbeat.
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    eprintln!("80 turns done after {:?}", t0.elapsed());
    let before = (st.same, st.follow);
    assert!(
        st.same as f64 >= 0.99 * st.follow as f64,
        "stickiness {}/{} before failover",
        st.same,
        st.follow
    );
    wait_until("equal digests", 10, async || {
        let d = digests(&peers).await;
        d.len() == 3 && !d[0].is_empty() && d.windows(2).all(|w| w[0] == w[1])
    })
    .await;

    eprintln!("digests equal after {:?}", t0.elapsed());
    // kill -9 the leader mid-run.
    let old = leader_of(&peers).await.unwrap();
    let killed = (old - 1) as usize;
    if let Some(mut p) = peers[killed].proc.take() {
        let _ = p.child.kill();
        let _ = p.child.wait();
    }
    let t = Instant::now();
    let alive: Vec<usize> = (0..3).filter(|i| *i != killed).collect();
    // Watch for the new leader while the turns go on.
    let watch: Vec<SocketAddr> = alive.iter().map(|i| peers[*i].http).collect();
    let elected = tokio::spawn(async move {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            for a in &watch {
                if let Some(h) = health(*a).await {
                    if h["cluster"]["leader"].as_u64().is_some_and(|l| l != old) {
                        return Some(t.elapsed());
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    });
    for _ in 0..10 {
        for (i, c) in convs.iter_mut().enumerate() {
            let p = alive[next(2)];
            let r = post(
                &format!("http://{}/v1/chat/completions", peers[p].http),
                &c.body("m", false),
                &[],
            )
            .await;
            assert_eq!(r.status, 200, "a turn failed after the leader died");
            st.observe(i, &r);
            c.advance("ok", 800);
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let elected = elected.await.unwrap();
    eprintln!(
        "new leader after {elected:?} (turns went on meanwhile; {:?} since the kill)",
        t.elapsed()
    );
    // The cluster-local timeouts give about 0.5 s; the bound leaves room for a loaded CI host.
    assert!(
        elected.is_some_and(|e| e < Duration::from_secs(3)),
        "no new leader in time: {elected:?}"
    );
    let after = (st.same - before.0, st.follow - before.1);
    assert!(
        after.0 as f64 >= 0.99 * after.1 as f64,
        "stickiness {}/{} across failover",
        after.0,
        after.1
    );
    wait_until("equal digests on the survivors", 10, async || {
        let d = digests(&peers).await;
        d.len() == 2 && !d[0].is_empty() && d[0] == d[1]
    })
    .await;
}
