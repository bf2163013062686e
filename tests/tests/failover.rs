//! Three real `router` processes forming a Raft group in front of fake engines: turns sent
//! to a random peer (DNS round-robin) stay on their conversation's rank, the peers' state
//! digests converge, and `kill -9` of the leader fails no turn and loses no affinity.
//!
//! A test binary of its own, not a module of `it`: it asserts how soon a new leader is
//! elected (within 1 s), and cargo runs test binaries one after another, so the forty `it`
//! tests do not compete with it for the two cores (among them it measured 1.6 s once, alone
//! 0.74-0.81 s).

use router_tests::cluster::{health, wait_until, Cluster};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_peer_per_turn_keeps_affinity_through_leader_kill() {
    let t0 = Instant::now();
    let engines = fleet(4).await;
    let ups: String = engines
        .iter()
        .map(|e| format!("[[upstreams]]\nurl = \"{}\"\n", e.url()))
        .collect();
    let (http, raft) = Cluster::addresses(3);
    // The Raft timings of config/cluster-local (and the defaults): heartbeat 100 ms,
    // election 250-400 ms.
    let mut cl = Cluster::start_timed(
        http,
        raft,
        &format!("[health]\ninterval_ms = 500\n{ups}"),
        "",
        (100, 250, 400),
    )
    .await;
    eprintln!("peers started after {:?}", t0.elapsed());
    cl.wait_formed(4, 20).await;

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
                &format!("http://{}/v1/chat/completions", cl.http[p]),
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
        let d = cl.digests().await;
        d.len() == 3 && !d[0].is_empty() && d.windows(2).all(|w| w[0] == w[1])
    })
    .await;

    eprintln!("digests equal after {:?}", t0.elapsed());
    // kill -9 the leader mid-run.
    let old = cl.leader().await.unwrap();
    let killed = (old - 1) as usize;
    cl.kill(killed);
    let t = Instant::now();
    let alive: Vec<usize> = (0..3).filter(|i| *i != killed).collect();
    // Watch for the new leader while the turns go on.
    let watch: Vec<SocketAddr> = alive.iter().map(|i| cl.http[*i]).collect();
    let elected = tokio::spawn(async move {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            // Both survivors at once: a sequential poll adds a whole /health round trip
            // (debug build, a machine busy with the turns) to the measured time.
            let seen = futures_util::future::join_all(watch.iter().map(|a| health(*a))).await;
            if seen
                .iter()
                .flatten()
                .any(|h| h["cluster"]["leader"].as_u64().is_some_and(|l| l != old))
            {
                return Some(t.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        None
    });
    for _ in 0..10 {
        for (i, c) in convs.iter_mut().enumerate() {
            let p = alive[next(2)];
            let r = post(
                &format!("http://{}/v1/chat/completions", cl.http[p]),
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
    // Lease (400 ms, counted from the last heartbeat) + election timeout (250-400 ms) + a
    // vote: 0.58-0.85 s here.
    assert!(
        elected.is_some_and(|e| e < Duration::from_secs(1)),
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
        let d = cl.digests().await;
        d.len() == 2 && !d[0].is_empty() && d[0] == d[1]
    })
    .await;
}
