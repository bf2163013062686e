//! `routerbench raft`: how many route records three Raft peers replicate per second. Three
//! peers in this process, real gRPC over loopback and sled on disk (flushed before every
//! acknowledgement); every peer proposes batches at once (followers forward to the leader),
//! and the clock stops when all three have applied everything.

use crate::procs::free_port;
use router_cluster::{ClusterNode, NodeConfig, RaftTunables};
use router_core::{Command, Route};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The route records `raft` replicates and `model` applies.
#[derive(Debug, Clone, clap::Args)]
pub struct RecordArgs {
    /// Route records in total.
    #[arg(long, default_value_t = 200_000)]
    pub records: usize,
    /// Records per proposal / command (the router's `batch_routes`).
    #[arg(long, default_value_t = 512)]
    pub batch: usize,
    /// Fingerprints per record (a 40k-token prompt at 2 KiB chunks is about 80).
    #[arg(long, default_value_t = 80)]
    pub hashes: usize,
    /// Conversations the records belong to. Like agent turns, a record repeats its
    /// conversation's prefix (touches) and adds `--new` fingerprints of its own.
    /// The default's shared prefixes (2000 x 76 chunks x 512 tokens) fit the 16 ranks' modelled
    /// KV (10M tokens each); many more conversations make the model thrash like the engines
    /// would, and every record then evicts and re-adds most of its prefix.
    #[arg(long, default_value_t = 2000)]
    pub conversations: usize,
    /// New fingerprints per record (the rest are the conversation's shared prefix).
    #[arg(long, default_value_t = 4)]
    pub new: usize,
}

/// Settings.
#[derive(Debug, Clone, clap::Args)]
pub struct RaftArgs {
    #[command(flatten)]
    pub rec: RecordArgs,
    /// Proposals in flight per peer.
    #[arg(long, default_value_t = 4)]
    pub pipeline: usize,
    /// Peers.
    #[arg(long, default_value_t = 3)]
    pub peers: u64,
}

impl RecordArgs {
    /// Refuses settings that make no records (a zero batch would divide by zero).
    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.batch > 0 && self.hashes > 0,
            "--batch and --hashes must be positive"
        );
        Ok(())
    }

    /// New fingerprints per record: `--new`, at most the whole record.
    pub fn fresh(&self) -> usize {
        self.new.min(self.hashes)
    }

    /// Record number `seed`: the next turn of conversation `seed % conversations` (on rank
    /// `conv % 16`), its shared prefix plus [`Self::fresh`] fingerprints of its own, 512
    /// tokens each.
    pub fn record(&self, seed: u64) -> Route {
        let conv = seed % self.conversations.max(1) as u64;
        let fresh = self.fresh();
        let shared = (self.hashes - fresh) as u64;
        let h = |x: u64| xxhash_rust::xxh3::xxh3_64(&x.to_le_bytes());
        Route {
            rank: (conv % 16) as u32,
            hashes: (0..shared)
                .map(|k| h((conv << 20) | k))
                .chain((0..fresh as u64).map(|k| h((seed << 24) | (1 << 23) | k)))
                .collect(),
            chunk_tokens: vec![512; self.hashes],
            session: None,
        }
    }
}

/// The server the records' ranks belong to: 16 ranks of 10M tokens.
pub fn join() -> Command {
    Command::JoinServer {
        url: "http://bench:80".into(),
        ranks: 16,
        capacity_tokens: 10_000_000,
        weight: 1.0,
    }
}

/// Runs the benchmark and prints its figures.
pub async fn run(a: RaftArgs) -> anyhow::Result<()> {
    a.rec.check()?;
    let dir = std::env::temp_dir().join(format!("routerbench-raft-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let addrs: Vec<std::net::SocketAddr> = (0..a.peers)
        .map(|_| free_port().map(|p| std::net::SocketAddr::from(([127, 0, 0, 1], p))))
        .collect::<Result<_, _>>()?;
    let mut nodes = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let id = i as u64 + 1;
        nodes.push(
            ClusterNode::start(
                NodeConfig {
                    id,
                    listen: *addr,
                    data_dir: dir.join(format!("n{id}")),
                    cluster_id: "bench".into(),
                    raft: RaftTunables {
                        election_min_ms: 300,
                        election_max_ms: 600,
                        ..RaftTunables::default()
                    },
                    max_entries: 50_000_000,
                    max_sessions: 1_000_000,
                    guard_lost_data: false,
                    tls: None,
                },
                None,
            )
            .await?,
        );
    }
    let members: BTreeMap<u64, String> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| (i as u64 + 1, a.to_string()))
        .collect();
    nodes[0].initialize(members).await?;
    let t = Instant::now();
    while nodes[0].leader().is_none() {
        anyhow::ensure!(t.elapsed() < Duration::from_secs(10), "no leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let joined = nodes[0].propose(join()).await?;
    eprintln!("cluster up: {joined:?}");

    let batches = a.rec.records.div_ceil(a.rec.batch);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let latencies = Arc::new(std::sync::Mutex::new(Vec::<Duration>::new()));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for n in &nodes {
        for _ in 0..a.pipeline {
            let n = n.clone();
            let next = next.clone();
            let lat = latencies.clone();
            let rec = a.rec.clone();
            tasks.push(tokio::spawn(async move {
                let mut last = 0u64;
                loop {
                    let b = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if b >= batches {
                        return Ok::<u64, anyhow::Error>(last);
                    }
                    let routes = (0..rec.batch)
                        .map(|i| rec.record((b * rec.batch + i) as u64))
                        .collect();
                    let t = Instant::now();
                    let (idx, _) = n
                        .propose_at(Command::RecordRoutes {
                            peer: n.id,
                            at_ms: 0,
                            routes,
                        })
                        .await?;
                    lat.lock()
                        .map_err(|_| anyhow::anyhow!("poisoned"))?
                        .push(t.elapsed());
                    last = last.max(idx);
                }
            }));
        }
    }
    let mut last = 0;
    for t in tasks {
        last = last.max(t.await??);
    }
    let proposed = started.elapsed();
    for n in &nodes {
        while n.applied().await < last {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    let all = started.elapsed();
    let records = (batches * a.rec.batch) as f64;
    let mut lat = latencies
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    lat.sort();
    let q = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize];
    let digests: Vec<u64> = {
        let mut v = Vec::new();
        for n in &nodes {
            v.push(n.digest().await);
        }
        v
    };
    println!(
        "peers {}  records {}  batch {}  fingerprints/record {} ({} new, the rest a conversation prefix of {} conversations)  pipeline {}/peer",
        a.peers, records, a.rec.batch, a.rec.hashes, a.rec.new, a.rec.conversations, a.pipeline
    );
    println!(
        "replicated and applied on every peer: {:.0} records/s ({:.2} s; proposals done after {:.2} s)",
        records / all.as_secs_f64(),
        all.as_secs_f64(),
        proposed.as_secs_f64()
    );
    println!(
        "proposal commit latency: p50 {:.1} ms  p99 {:.1} ms  ({} proposals)",
        q(0.5).as_secs_f64() * 1e3,
        q(0.99).as_secs_f64() * 1e3,
        lat.len()
    );
    let (stats, clone_ms, export_ms) = {
        let st = nodes[0].sm.state.read().await;
        let t = Instant::now();
        // What the store's snapshot builder does: the image under the lock, export after.
        let copy = st.machine.image();
        let clone_ms = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        let image = copy.snapshot();
        let export_ms = t.elapsed().as_secs_f64() * 1e3;
        drop(image);
        (st.machine.model().stats(), clone_ms, export_ms)
    };
    let s = nodes[0].snapshot_stats();
    println!(
        "snapshots: {} built here, last {:.1} MB; a build holds the state lock {:.1} ms (image copy; exporting the same state takes {:.1} ms, outside the lock)",
        s.built,
        s.bytes as f64 / 1e6,
        clone_ms,
        export_ms
    );
    println!(
        "state digests equal: {}; cache model: {} entries, {} capacity evictions",
        digests.windows(2).all(|w| w[0] == w[1]),
        stats.entries,
        stats.capacity_evictions
    );
    for n in nodes {
        n.shutdown().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
