//! Three peers in one process, talking real gRPC over loopback with sled on disk: writes
//! through any peer (followers forward), identical state digests, leader loss and
//! re-election, restart and catch-up (including from a snapshot after log purge).

use router_cluster::{ClusterNode, MembershipError, NodeConfig, RaftTunables};
use router_core::{Command, Outcome, Route};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn free_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn cfg(id: u64, addr: std::net::SocketAddr, dir: &std::path::Path) -> NodeConfig {
    NodeConfig {
        id,
        listen: addr,
        data_dir: dir.join(format!("n{id}")),
        cluster_id: "test-cluster".into(),
        raft: RaftTunables {
            heartbeat_ms: 50,
            election_min_ms: 200,
            election_max_ms: 400,
            snapshot_every: 40,
            keep_logs: 5,
        },
        max_entries: 100_000,
        max_sessions: 1000,
        guard_lost_data: false,
        tls: None,
    }
}

fn routes(seed: u64) -> Command {
    Command::RecordRoutes {
        peer: seed % 3,
        at_ms: 0,
        routes: (0..4)
            .map(|i| Route {
                rank: (seed % 2) as u32,
                hashes: (0..10).map(|h| seed * 1000 + i * 100 + h).collect(),
                chunk_tokens: vec![512; 10],
                session: Some(seed),
            })
            .collect(),
    }
}

async fn leader(nodes: &[Arc<ClusterNode>]) -> Option<u64> {
    for n in nodes {
        if n.status().leader == Some(n.id) {
            return Some(n.id);
        }
    }
    None
}

async fn wait_same(nodes: &[Arc<ClusterNode>], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut digests = Vec::new();
        let mut applied = Vec::new();
        for n in nodes {
            digests.push(n.digest().await);
            applied.push(n.applied().await);
        }
        if digests.windows(2).all(|w| w[0] == w[1]) && applied.windows(2).all(|w| w[0] == w[1]) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: digests {digests:?} applied {applied:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts peers 1-3 on `addrs[..3]`, makes them one cluster and waits for a leader.
async fn start_three(
    addrs: &[std::net::SocketAddr],
    dir: &std::path::Path,
) -> Vec<Arc<ClusterNode>> {
    let mut nodes = Vec::new();
    for i in 0..3u64 {
        nodes.push(
            ClusterNode::start(cfg(i + 1, addrs[i as usize], dir), None)
                .await
                .unwrap(),
        );
    }
    let members: BTreeMap<u64, String> = (0..3u64)
        .map(|i| (i + 1, addrs[i as usize].to_string()))
        .collect();
    nodes[0].initialize(members).await.unwrap();
    let t = Instant::now();
    while leader(&nodes).await.is_none() {
        assert!(t.elapsed() < Duration::from_secs(5), "no leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    nodes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicate_fail_over_and_catch_up() {
    let dir = std::env::temp_dir().join(format!("router-3peers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let addrs: Vec<_> = (0..3).map(|_| free_addr()).collect();
    let mut nodes = start_three(&addrs, &dir).await;

    // Writes through every peer; followers forward to the leader.
    let joined = nodes[1]
        .propose(Command::JoinServer {
            url: "http://e1:80".into(),
            ranks: 2,
            capacity_tokens: 1_000_000,
            weight: 1.0,
        })
        .await
        .unwrap();
    assert_eq!(joined, Outcome::Joined(vec![0, 1]));
    for s in 0..60 {
        let out = nodes[(s % 3) as usize].propose(routes(s)).await.unwrap();
        assert_eq!(out, Outcome::Ok);
    }
    wait_same(&nodes, "after writes").await;
    assert!(
        nodes[0]
            .sm
            .state
            .read()
            .await
            .machine
            .model()
            .stats()
            .entries
            > 0
    );

    // Kill the leader: the others elect a new one and keep taking writes.
    let old = leader(&nodes).await.unwrap();
    let idx = nodes.iter().position(|n| n.id == old).unwrap();
    let dead = nodes.remove(idx);
    dead.shutdown().await;
    // The sled lock goes with the last handle.
    drop(dead);
    let t = Instant::now();
    loop {
        if let Some(l) = leader(&nodes).await {
            assert_ne!(l, old);
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "no new leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let failover = t.elapsed();
    for s in 100..160 {
        nodes[(s % 2) as usize].propose(routes(s)).await.unwrap();
    }
    wait_same(&nodes, "survivors").await;

    // Restart the old leader from its data dir: it catches up (its log was purged behind
    // snapshots on the others, so this exercises snapshot install too).
    let back = ClusterNode::start(cfg(old, addrs[(old - 1) as usize], &dir), None)
        .await
        .unwrap();
    nodes.push(back);
    wait_same(&nodes, "after restart").await;
    eprintln!("failover took {failover:?}");
    assert!(
        failover < Duration::from_secs(2),
        "failover took {failover:?}"
    );
    for n in nodes {
        n.shutdown().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_of_another_cluster_is_refused() {
    let dir = std::env::temp_dir().join(format!("router-2clusters-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let a = free_addr();
    let b = free_addr();
    let na = ClusterNode::start(cfg(1, a, &dir), None).await.unwrap();
    let mut cb = cfg(2, b, &dir);
    cb.cluster_id = "other".into();
    let nb = ClusterNode::start(cb, None).await.unwrap();
    let members: BTreeMap<u64, String> = [(1, a.to_string()), (2, b.to_string())].into();
    na.initialize(members).await.unwrap();
    // Node 1 needs node 2's vote to lead a 2-member cluster; node 2 refuses its RPCs.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_ne!(na.status().leader, Some(1), "a foreign peer voted");
    assert_eq!(nb.status().leader, None);
    na.shutdown().await;
    nb.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_join_as_learners_become_voters_and_ids_are_never_reused() {
    let dir = std::env::temp_dir().join(format!("router-members-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let addrs: Vec<_> = (0..4).map(|_| free_addr()).collect();
    let mut nodes = start_three(&addrs, &dir).await;
    nodes[1]
        .propose(Command::JoinServer {
            url: "http://e1:80".into(),
            ranks: 2,
            capacity_tokens: 1_000_000,
            weight: 1.0,
        })
        .await
        .unwrap();
    for s in 0..30 {
        nodes[(s % 3) as usize].propose(routes(s)).await.unwrap();
    }
    let lead = leader(&nodes).await.unwrap();
    let li = nodes.iter().position(|n| n.id == lead).unwrap();
    let follower = (li + 1) % 3;
    // Only the leader changes membership; a follower says where the leader is.
    let fourth = ClusterNode::start(cfg(4, addrs[3], &dir), None)
        .await
        .unwrap();
    match nodes[follower].add_peer(4, &addrs[3].to_string()).await {
        Err(MembershipError::NotLeader(Some(a))) => {
            assert_eq!(a, addrs[li].to_string())
        }
        other => panic!("expected NotLeader, got {other:?}"),
    }
    nodes[li].add_peer(4, &addrs[3].to_string()).await.unwrap();
    let voters: Vec<u64> = nodes[li]
        .status()
        .members
        .iter()
        .filter(|m| m.voter)
        .map(|m| m.id)
        .collect();
    assert_eq!(voters, vec![1, 2, 3, 4]);
    nodes.push(fourth);
    wait_same(&nodes, "with the new voter").await;

    // Remove it: it leaves the membership and its id is retired.
    let leader_node = nodes[li].clone();
    leader_node.remove_peer(4).await.unwrap();
    let gone = nodes.pop().unwrap();
    gone.shutdown().await;
    drop(gone);
    assert!(leader_node.sm.state.read().await.machine.is_retired(4));
    assert_eq!(
        leader_node.add_peer(4, &addrs[3].to_string()).await,
        Err(MembershipError::RetiredId(4)),
        "a retired id was accepted"
    );
    wait_same(&nodes, "after removal").await;
    for n in nodes {
        n.shutdown().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A peer added at an address where nothing answers must never become a voter: otherwise
/// the next single failure leaves the cluster without a quorum (3 live voters of 4 would
/// still be a majority, but 2 of 4 are not). It times out, is taken out again, and the
/// cluster keeps committing after one real peer is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_peer_never_votes_and_a_single_failure_is_survived() {
    let dir = std::env::temp_dir().join(format!("router-unreach-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let addrs: Vec<_> = (0..4).map(|_| free_addr()).collect();
    let nodes = start_three(&addrs, &dir).await;
    for s in 0..10 {
        nodes[(s % 3) as usize].propose(routes(s)).await.unwrap();
    }
    let lead = leader(&nodes).await.unwrap();
    let li = nodes.iter().position(|n| n.id == lead).unwrap();
    // Nothing listens on addrs[3].
    let t = Instant::now();
    let err = nodes[li]
        .add_peer_within(9, &addrs[3].to_string(), Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(
        matches!(err, MembershipError::CatchUpTimeout { id: 9, .. }),
        "{err:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());
    let st = nodes[li].status();
    assert!(
        st.members.iter().all(|m| m.id != 9),
        "the unreachable peer stayed a member: {:?}",
        st.members
    );
    assert_eq!(st.members.iter().filter(|m| m.voter).count(), 3);
    // Lose one real peer (a follower): the other two still commit.
    let victim = (li + 1) % 3;
    nodes[victim].shutdown().await;
    let survivors: Vec<_> = (0..3).filter(|i| *i != victim).collect();
    for (k, s) in (100..110).enumerate() {
        let n = &nodes[survivors[k % 2]];
        tokio::time::timeout(Duration::from_secs(5), n.propose(routes(s)))
            .await
            .expect("commit after losing one of three peers")
            .unwrap();
    }
    for i in survivors {
        nodes[i].shutdown().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A peer that restarts with its data directory wiped learns from the others that it is a
/// member, refuses to go on, and never answered a Raft call meanwhile; a new peer (not a
/// member) passes the same check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_lost_its_data_is_caught_before_it_votes() {
    let dir = std::env::temp_dir().join(format!("router-lost-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let addrs: Vec<_> = (0..4).map(|_| free_addr()).collect();
    let mut nodes = start_three(&addrs, &dir).await;
    let peers: BTreeMap<u64, String> = (0..3u64)
        .map(|i| (i + 1, addrs[i as usize].to_string()))
        .collect();
    // A peer that has not acknowledged anything yet is not known as acked: the check
    // cannot tell it from a new one (a fresh cluster's members start that way).
    for n in &nodes {
        n.record_acks(Duration::from_millis(50));
    }
    let t = Instant::now();
    while !nodes[0].sm.state.read().await.machine.has_acked(3) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "peer 3's ack never recorded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_same(&nodes, "acks recorded").await;
    // Restarted with its data (and a log long enough that Raft's metrics lag the open),
    // the same peer is not taken for a lost one.
    for s in 0..200 {
        nodes[0].propose(routes(s)).await.unwrap();
    }
    let old = nodes.remove(2);
    old.shutdown().await;
    drop(old);
    let mut c = cfg(3, addrs[2], &dir);
    c.guard_lost_data = true;
    let again = ClusterNode::start(c, None).await.unwrap();
    again.check_not_lost(&peers).await.unwrap();
    nodes.push(again);
    wait_same(&nodes, "restarted with its data").await;
    let lost = nodes.remove(2);
    lost.shutdown().await;
    drop(lost);
    let mut c = cfg(3, addrs[2], &dir);
    std::fs::remove_dir_all(&c.data_dir).unwrap();
    c.guard_lost_data = true;
    let back = ClusterNode::start(c, None).await.unwrap();
    let err = back.check_not_lost(&peers).await.unwrap_err().to_string();
    assert!(err.contains("its data was lost"), "{err}");
    // The leader's appends to it were refused: it applied nothing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(back.applied().await, 0);
    back.shutdown().await;
    // A peer id the cluster does not know is a new peer: it passes.
    let mut c4 = cfg(4, addrs[3], &dir);
    c4.guard_lost_data = true;
    let fresh = ClusterNode::start(c4, None).await.unwrap();
    fresh.check_not_lost(&peers).await.unwrap();
    // One peer takes the connection and never answers (as a paused container does): the
    // others are asked at the same time and the check ends in about one ask's timeout
    // (it waited on the silent peer before; a grpc-timeout header bounds nothing).
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut with_silent = peers.clone();
    with_silent.insert(9, silent.local_addr().unwrap().to_string());
    fresh.shutdown().await;
    drop(fresh);
    let mut c4 = cfg(4, addrs[3], &dir);
    std::fs::remove_dir_all(&c4.data_dir).unwrap();
    c4.guard_lost_data = true;
    let fresh = ClusterNode::start(c4, None).await.unwrap();
    let t = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), fresh.check_not_lost(&with_silent))
        .await
        .expect("the check waited on a silent peer")
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    fresh.shutdown().await;
    drop(silent);
    for n in nodes {
        n.shutdown().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}
