//! Durability of the replicated map with real `router` processes and sled on disk: the
//! leader killed with -9 comes back behind a purged log and catches up by snapshot; the whole
//! cluster killed and restarted keeps every conversation on its rank.

use router_tests::cluster::{wait_until, Cluster};
use router_tests::engine::{fleet, FakeEngine};
use router_tests::*;
use std::collections::HashMap;
use std::time::{Duration, Instant};

async fn turns(
    c: &Cluster,
    convs: &mut [Conversation],
    rounds: usize,
    last: &mut HashMap<usize, String>,
    seed: &mut u64,
) -> (u64, u64) {
    let (mut same, mut follow) = (0, 0);
    for _ in 0..rounds {
        for (i, conv) in convs.iter_mut().enumerate() {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            let alive = c.alive();
            let p = alive[(*seed % alive.len() as u64) as usize];
            let r = post(
                &format!("http://{}/v1/chat/completions", c.http[p]),
                &conv.body("m", false),
                &[],
            )
            .await;
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
            let rank = r.header("x-router-rank").unwrap();
            if let Some(prev) = last.insert(i, rank.clone()) {
                follow += 1;
                same += u64::from(prev == rank);
            }
            conv.advance("ok", 600);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    (same, follow)
}

fn upstreams(engines: &[FakeEngine]) -> String {
    engines
        .iter()
        .map(|e| format!("[[upstreams]]\nurl = \"{}\"\n", e.url()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_after_purge_and_whole_cluster_restart_keep_the_map() {
    let t0 = Instant::now();
    let engines = fleet(4).await;
    let (http, raft) = Cluster::addresses(3);
    let top = format!("[health]\ninterval_ms = 500\n{}", upstreams(&engines));
    // Small snapshots and a short log tail, so a peer that was down falls behind the purge.
    let mut c = Cluster::start(
        http,
        raft,
        &top,
        "snapshot_every = 20\nkeep_logs = 5\nload_report_ms = 100\nload_stale_ms = 1000",
    )
    .await;
    c.wait_formed(4, 30).await;
    let mut convs: Vec<Conversation> = (0..8).map(|i| Conversation::new(900 + i, 4000)).collect();
    let mut last = HashMap::new();
    let mut seed = 99u64;
    turns(&c, &mut convs, 3, &mut last, &mut seed).await;

    // Kill the leader; the others elect a new one and go on long enough to snapshot and
    // purge past it.
    let victim = c.leader().await.expect("leader") as usize - 1;
    let before_kill = c.health(victim).await.unwrap()["cluster"]["applied_index"]
        .as_u64()
        .unwrap();
    c.kill(victim);
    let (s, f) = turns(&c, &mut convs, 4, &mut last, &mut seed).await;
    assert!(
        s as f64 >= 0.99 * f as f64,
        "stickiness {s}/{f} with a peer down"
    );
    let survivor = (victim + 1) % 3;
    wait_until(
        "the survivors to purge past the dead peer",
        20,
        async || {
            c.health(survivor).await.is_some_and(|h| {
                h["cluster"]["purged_index"]
                    .as_u64()
                    .is_some_and(|p| p > before_kill)
            })
        },
    )
    .await;
    eprintln!("purged past the dead peer at {:?}", t0.elapsed());
    c.spawn(victim).await;
    c.wait_converged(20).await;
    let h = c.health(victim).await.unwrap();
    assert!(
        h["cluster"]["snapshots_installed"].as_u64() >= Some(1),
        "the restarted peer did not catch up by snapshot: {h}"
    );
    eprintln!(
        "peer {} caught up by snapshot after {:?}",
        victim + 1,
        t0.elapsed()
    );
    // It routes by the replicated map at once.
    let (mut same, mut follow) = (0u64, 0u64);
    for (i, conv) in convs.iter_mut().enumerate() {
        let r = post(
            &format!("http://{}/v1/chat/completions", c.http[victim]),
            &conv.body("m", false),
            &[],
        )
        .await;
        assert_eq!(r.status, 200);
        let rank = r.header("x-router-rank").unwrap();
        follow += 1;
        same += u64::from(last.insert(i, rank.clone()).as_deref() == Some(rank.as_str()));
        conv.advance("ok", 600);
    }
    assert_eq!(same, follow, "the restarted peer lost affinity");
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Whole-cluster crash and restart: the map survives in sled on every peer.
    c.wait_converged(20).await;
    let entries = c.health(0).await.unwrap()["cluster"].clone();
    for i in 0..3 {
        c.kill(i);
    }
    for i in 0..3 {
        c.spawn(i).await;
    }
    c.wait_formed(4, 30).await;
    eprintln!("cluster back after a full restart at {:?}", t0.elapsed());
    let (s, f) = turns(&c, &mut convs, 3, &mut last, &mut seed).await;
    assert!(
        s as f64 >= 0.99 * f as f64,
        "stickiness {s}/{f} after a whole-cluster restart (before: {entries})"
    );
    c.wait_converged(20).await;
}

/// A peer whose disk is wiped must not come back as the same voter with an empty log (it
/// could vote twice in a term, or count towards a commit it then forgets; peer 1 would even
/// initialize a new cluster). It refuses to start with a clear error, and the other two go
/// on committing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_lost_its_data_refuses_to_start_and_the_rest_commit() {
    let engines = fleet(3).await;
    let (http, raft) = Cluster::addresses(3);
    let top = format!(
        "[[upstreams]]\nurl = \"{}\"\n[[upstreams]]\nurl = \"{}\"\n",
        engines[0].url(),
        engines[1].url()
    );
    let mut c = Cluster::start(http, raft, &top, "").await;
    c.wait_formed(2, 30).await;
    // The leader records each peer's first acknowledgement in the log every 250 ms; a peer
    // wiped before that is indistinguishable from a new one.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Peer 1: the lowest id, the one that initializes a new cluster.
    c.kill(0);
    std::fs::remove_dir_all(c.data_dir(0)).expect("wipe peer 1's data");
    let mut p = c.spawn_unchecked(0);
    let t = Instant::now();
    let status = loop {
        if let Some(s) = p.child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "peer 1 with a wiped data dir kept running:\n{}",
            p.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let log = p.log();
    assert!(!status.success(), "it exited successfully:\n{log}");
    assert!(
        log.contains("its data was lost") && log.contains("peers remove 1"),
        "no clear error:\n{log}"
    );
    eprintln!("peer 1 refused to start after {:?}", t.elapsed());
    // The two others still commit: a join through peer 2 is applied on both.
    let out = tokio::process::Command::new(bin("routerctl"))
        .args(["--router", &c.raft[1].to_string(), "--token", ADMIN_TOKEN])
        .args(["join", &engines[2].url()])
        .output()
        .await
        .expect("routerctl");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "join failed: {text}");
    assert!(text.contains("on peers [2, 3]"), "{text}");
}
