//! What the sled-backed stores leave on disk: nothing sled would keep without fsync.
//!
//! sled 0.34 writes a value over ~128 KiB into a file of its own under `blobs/` and never
//! fsyncs it, so such a value is lost in a power cut even after `flush` returned. A batch
//! of route records is several hundred KB and a snapshot many MB: this test writes both,
//! checks that no blob file appears, and that everything reads back the same after the
//! stores are reopened (entries put together from their parts, the snapshot from its own
//! file, purge and truncate removing every part).

use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, RaftLogReader, RaftSnapshotBuilder};
use router_cluster::store::{LogStore, StateMachineStore, TypeConfig, PART_BYTES};
use router_core::{Command, Route};
use std::path::{Path, PathBuf};

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn entry(index: u64, routes: usize) -> Entry<TypeConfig> {
    if index == 1 {
        // Ranks for the records to land on.
        return Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Command::JoinServer {
                url: "http://engine:80".into(),
                ranks: 4,
                capacity_tokens: 100_000_000,
                weight: 1.0,
            }),
        };
    }
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(Command::RecordRoutes {
            peer: 1,
            at_ms: index,
            routes: (0..routes as u64)
                .map(|r| Route {
                    rank: (r % 4) as u32,
                    hashes: (0..80)
                        .map(|h| xxh(index * 1_000_000 + r * 100 + h))
                        .collect(),
                    chunk_tokens: vec![512; 80],
                    session: None,
                })
                .collect(),
        }),
    }
}

fn xxh(x: u64) -> u64 {
    xxhash_rust::xxh3::xxh3_64(&x.to_le_bytes())
}

fn blobs(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("blobs")).map_or(0, |d| d.count())
}

fn open(dir: &Path) -> (sled::Db, LogStore, StateMachineStore) {
    let db = sled::open(dir).unwrap();
    let log = LogStore::open(&db, Default::default()).unwrap();
    let sm = StateMachineStore::open(&db, dir, 10_000_000, 1000, None, Default::default()).unwrap();
    (db, log, sm)
}

async fn read_all(log: &mut LogStore) -> Vec<Entry<TypeConfig>> {
    log.try_get_log_entries(0..u64::MAX).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_entries_and_snapshots_stay_out_of_sled_blobs() {
    let path = std::env::temp_dir().join(format!("router-durable-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    let dir = Dir(path.clone());
    let (db, mut log, mut sm) = open(&dir.0);

    // Small, large (512 records: ~0.5 MB, about eighty parts) and small again.
    let written: Vec<_> = (1..=6)
        .map(|i| entry(i, if i % 2 == 0 { 512 } else { 2 }))
        .collect();
    let big = router_cluster::codec::encode(&written[1]).unwrap().len();
    assert!(big > 4 * PART_BYTES, "a large entry is {big} bytes");
    log.blocking_append(written.clone()).await.unwrap();
    assert_eq!(read_all(&mut log).await, written);
    assert_eq!(
        log.try_get_log_entries(2..4).await.unwrap(),
        written[1..3].to_vec()
    );
    assert_eq!(
        log.get_log_state().await.unwrap().last_log_id,
        Some(written[5].log_id)
    );

    // Applied and snapshotted: a snapshot of some MB.
    sm.apply(written.clone()).await.unwrap();
    let snap = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let snap_len = snap.snapshot.get_ref().len();
    assert!(snap_len > PART_BYTES * 8, "snapshot is {snap_len} bytes");
    let digest = sm.state.read().await.machine.digest();

    // Purge through a large entry, truncate from another: no part of either stays.
    log.purge(written[1].log_id).await.unwrap();
    log.truncate(written[5].log_id).await.unwrap();
    assert_eq!(read_all(&mut log).await, written[2..5].to_vec());
    assert_eq!(
        log.get_log_state().await.unwrap().last_log_id,
        Some(written[4].log_id)
    );
    let keys = db.open_tree("raft_log").unwrap().len();
    let parts = |e: &Entry<TypeConfig>| {
        router_cluster::codec::encode(e)
            .unwrap()
            .len()
            .div_ceil(PART_BYTES)
    };
    assert_eq!(keys, written[2..5].iter().map(parts).sum::<usize>());
    db.flush_async().await.unwrap();
    assert_eq!(blobs(&dir.0), 0, "sled wrote blob files");
    drop((log, sm, db));

    // Reopened: the same log and the same state.
    let (_db, mut log, mut sm) = open(&dir.0);
    assert_eq!(read_all(&mut log).await, written[2..5].to_vec());
    assert_eq!(sm.state.read().await.machine.digest(), digest);
    let (applied, _) = sm.applied_state().await.unwrap();
    assert_eq!(applied, Some(written[5].log_id));
    let cur = sm.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(cur.meta, snap.meta);
    assert_eq!(cur.snapshot.get_ref().len(), snap_len);
    assert_eq!(blobs(&dir.0), 0, "sled wrote blob files");
}
