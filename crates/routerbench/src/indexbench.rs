//! `routerbench index`: the replicated state at scale, through the peer's real state machine
//! store (router-cluster's `StateMachineStore` over sled). It applies route records until the
//! cache model holds `--entries` (fingerprint, rank) entries (10M by default), then reports:
//!
//! * bytes per entry: resident memory after minus before (every structure the model keeps:
//!   LRU nodes, the fingerprint table, shared holder lists; allocator slack included);
//! * the apply rate while filling;
//! * the snapshot: its encoded size, the time a build holds the state lock and its whole
//!   time (copy, export, encode, write to sled and flush);
//! * restart to routing: the store reopened on the same sled directory, timed until it
//!   publishes its first view (what a restarted peer routes with before the log after the
//!   snapshot replays).

use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
use router_cluster::store::{StateMachineStore, StoreStats, TypeConfig};
use router_core::{Command, Route};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Resident memory of this process, bytes (`/proc/self/statm`). What an operator's
/// dashboard shows: allocator slack and freed-but-kept memory included, so a figure from it
/// is an upper bound on what the structures themselves take.
pub fn resident_bytes() -> anyhow::Result<i64> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    let pages: i64 = statm
        .split_whitespace()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("statm: no resident field"))?
        .parse()?;
    Ok(pages * 4096)
}

/// Settings.
#[derive(Debug, Clone, clap::Args)]
pub struct IndexArgs {
    /// (fingerprint, rank) entries to hold.
    #[arg(long, default_value_t = 10_000_000)]
    pub entries: u64,
    /// Ranks (one server with this many data-parallel ranks).
    #[arg(long, default_value_t = 16)]
    pub ranks: u32,
    /// Apps; each has a system prompt every one of its conversations starts with.
    #[arg(long, default_value_t = 64)]
    pub apps: u64,
    /// Fingerprints of each app's system prompt.
    #[arg(long, default_value_t = 16)]
    pub shared: u64,
    /// Fingerprints per record (a 40k-token prompt at 2 KiB chunks is about 80).
    #[arg(long, default_value_t = 80)]
    pub hashes: u64,
    /// Records per applied log entry (the router's `batch_routes`).
    #[arg(long, default_value_t = 512)]
    pub batch: usize,
}

/// Runs the benchmark and prints its figures.
pub async fn run(a: IndexArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.hashes > a.shared, "--hashes must exceed --shared");
    let dir = std::env::temp_dir().join(format!("routerbench-index-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let result = measure(&a, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn entry(index: u64, cmd: Command) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(cmd),
    }
}

async fn measure(a: &IndexArgs, dir: &std::path::Path) -> anyhow::Result<()> {
    let h = |x: u64| xxhash_rust::xxh3::xxh3_64(&x.to_le_bytes());
    let db = sled::open(dir)?;
    let before = resident_bytes()?;
    let mut store = StateMachineStore::open(
        &db,
        dir,
        a.entries,
        1_000_000,
        None,
        Arc::new(StoreStats::default()),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut index = 1;
    store
        .apply([entry(
            index,
            Command::JoinServer {
                url: "http://bench:80".into(),
                ranks: a.ranks,
                // Room for everything: the count is the entry cap's, not the KV's.
                capacity_tokens: u64::MAX / 4,
                weight: 1.0,
            },
        )])
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // Each record is a new conversation: its app's system prompt, then its own chunks.
    let own = a.hashes - a.shared;
    let mut conv = 0u64;
    let started = Instant::now();
    let mut records = 0u64;
    loop {
        let held = store.state.read().await.machine.model().stats().entries;
        if held >= a.entries {
            break;
        }
        let routes: Vec<Route> = (0..a.batch)
            .map(|_| {
                conv += 1;
                let app = conv % a.apps;
                Route {
                    rank: (conv % u64::from(a.ranks)) as u32,
                    hashes: (0..a.shared)
                        .map(|k| h((app << 40) | k))
                        .chain((0..own).map(|k| h((1 << 62) | (conv << 12) | k)))
                        .collect(),
                    chunk_tokens: vec![512; a.hashes as usize],
                    session: None,
                }
            })
            .collect();
        records += routes.len() as u64;
        index += 1;
        store
            .apply([entry(
                index,
                Command::RecordRoutes {
                    peer: 1,
                    at_ms: 0,
                    routes,
                },
            )])
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let fill = started.elapsed();
    let stats = store.state.read().await.machine.model().stats();
    let bytes = resident_bytes()? - before;
    println!(
        "cache model: {} entries ({} fingerprints) over {} ranks, from {} records of {} fingerprints",
        stats.entries, stats.fingerprints, a.ranks, records, a.hashes
    );
    println!(
        "memory: {:.1} bytes per entry ({:.0} MB resident growth; the model's own estimate {:.1})",
        bytes as f64 / stats.entries as f64,
        bytes as f64 / 1e6,
        stats.bytes as f64 / stats.entries.max(1) as f64
    );
    println!(
        "apply while filling: {:.0} records/s ({:.1} s)",
        records as f64 / fill.as_secs_f64(),
        fill.as_secs_f64()
    );

    let t = Instant::now();
    let snap = store
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let built = t.elapsed();
    let size = snap.snapshot.get_ref().len();
    drop(snap);
    let lock_us = store.stats.snapshot_lock_us.load(Relaxed);
    println!(
        "snapshot: {:.1} MB ({:.1} bytes per entry), built in {:.2} s; the state lock held {:.1} ms of it",
        size as f64 / 1e6,
        size as f64 / stats.entries as f64,
        built.as_secs_f64(),
        lock_us as f64 / 1e3
    );
    let digest = store.state.read().await.machine.digest();
    drop(store);
    drop(db);

    // Restart: reopen the directory; routing starts when the first view is published.
    let t = Instant::now();
    let db = sled::open(dir)?;
    let opened = t.elapsed();
    let published: Arc<Mutex<Option<Duration>>> = Arc::default();
    let p = published.clone();
    let store = StateMachineStore::open(
        &db,
        dir,
        a.entries,
        1_000_000,
        Some(Arc::new(move |st| {
            let _view = st.machine.view();
            let mut p = p.lock().unwrap_or_else(|e| e.into_inner());
            p.get_or_insert(t.elapsed());
        })),
        Arc::new(StoreStats::default()),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let routing = published
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .ok_or_else(|| anyhow::anyhow!("no view published on open"))?;
    let same = store.state.read().await.machine.digest() == digest;
    println!(
        "restart to routing: {:.2} s (sled open {:.2} s, then snapshot read, decode, rebuild, first view); state digest equal: {same}",
        routing.as_secs_f64(),
        opened.as_secs_f64()
    );
    anyhow::ensure!(same, "the restored state differs");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The short profile: a small fill through the real store, a snapshot written to sled,
    /// the store reopened from it with the same digest (the run fails otherwise).
    #[tokio::test]
    async fn small_fill_snapshots_and_restarts_with_the_same_state() {
        run(IndexArgs {
            entries: 20_000,
            ranks: 4,
            apps: 8,
            shared: 8,
            hashes: 40,
            batch: 64,
        })
        .await
        .unwrap();
    }
}
