//! Raft storage on sled: the log and vote on disk (flushed before openraft is told they are
//! durable), the state machine in memory with snapshots persisted to a file beside the
//! database, so a restarted peer rebuilds from its last snapshot plus the log after it.
//!
//! No value put in sled is larger than [`PART_BYTES`]: sled 0.34 keeps a page over 128 KiB
//! in a file of its own under `blobs/` that it never fsyncs (`pagecache/blob_io.rs`), so a
//! log entry stored that way (a batch of route records is a few hundred KB) would be lost
//! in a power cut although `flush` had returned and the entry had been acknowledged. Large
//! entries are stored as parts under consecutive keys (one atomic batch); snapshots go to
//! [`SnapshotFile`].

use crate::snapfile::SnapshotFile;
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership, Vote,
};
use router_core::{Command, Machine, MachineSnapshot, Outcome};
use serde::{Deserialize, Serialize};
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use tokio::sync::RwLock;

/// Storage counters for metrics and status.
#[derive(Debug, Default)]
pub struct StoreStats {
    /// Last committed log index openraft saved.
    pub committed: AtomicU64,
    /// Snapshots built here.
    pub snapshots_built: AtomicU64,
    /// Snapshots received from a leader and installed.
    pub snapshots_installed: AtomicU64,
    /// Size of the last snapshot built or installed, bytes.
    pub snapshot_bytes: AtomicU64,
    /// Time the last snapshot build held the state machine's lock, microseconds.
    pub snapshot_lock_us: AtomicU64,
    /// Time the last snapshot build took, microseconds (copy + encode + persist).
    pub snapshot_build_us: AtomicU64,
    /// Time the last snapshot install took, microseconds.
    pub snapshot_install_us: AtomicU64,
}

openraft::declare_raft_types!(
    /// The router cluster's Raft types.
    pub TypeConfig:
        D = Command,
        R = Outcome,
);

/// Node ids (never reused).
pub type NodeId = u64;
/// Peer address record.
pub type Node = openraft::BasicNode;
type SErr = StorageError<NodeId>;

/// Largest value stored in sled. sled's blob threshold applies to whole tree nodes: a leaf
/// holds up to 17 values before it splits (by count, not size) and is rewritten whole when
/// consolidated, so 17 parts and their keys must fit in 128 KiB less headers.
pub const PART_BYTES: usize = 6 << 10;

/// A log entry's key (its first part).
fn key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// The key of part `part` (from 1) of a large entry: it sorts after the entry's own key
/// and before the next entry's.
fn part_key(index: u64, part: u32) -> [u8; 12] {
    let mut k = [0; 12];
    k[..8].copy_from_slice(&index.to_be_bytes());
    k[8..].copy_from_slice(&part.to_be_bytes());
    k
}

/// The log index a key belongs to, and whether it is an entry's first part.
fn index_of(k: &[u8]) -> (u64, bool) {
    let idx = u64::from_be_bytes(k.get(..8).and_then(|b| b.try_into().ok()).unwrap_or([0; 8]));
    (idx, k.len() == 8)
}

const VOTE: &str = "vote";
const PURGED: &str = "last_purged";
const COMMITTED: &str = "committed";
const SNAPSHOT: &str = "snapshot";

/// The Raft log and vote in sled.
#[derive(Clone)]
pub struct LogStore {
    db: sled::Db,
    logs: sled::Tree,
    meta: sled::Tree,
    stats: Arc<StoreStats>,
}

impl LogStore {
    /// Opens (or creates) the log in `db`.
    pub fn open(db: &sled::Db, stats: Arc<StoreStats>) -> Result<LogStore, sled::Error> {
        Ok(LogStore {
            db: db.clone(),
            logs: db.open_tree("raft_log")?,
            meta: db.open_tree("raft_meta")?,
            stats,
        })
    }

    fn get_meta<T: for<'de> Deserialize<'de>>(&self, k: &str) -> Result<Option<T>, SErr> {
        match self.meta.get(k).map_err(|e| StorageIOError::read(&e))? {
            Some(v) => Ok(Some(
                crate::codec::decode(&v).map_err(|e| StorageIOError::read(&e))?,
            )),
            None => Ok(None),
        }
    }

    async fn put_meta<T: Serialize>(&self, k: &str, v: &T) -> Result<(), SErr> {
        let bytes = crate::codec::encode(v).map_err(|e| StorageIOError::write(&e))?;
        self.meta
            .insert(k, bytes)
            .map_err(|e| StorageIOError::write(&e))?;
        self.db
            .flush_async()
            .await
            .map_err(|e| StorageIOError::write(&e))?;
        Ok(())
    }
}

impl LogStore {
    /// Deletes the entries whose keys fall in `range`.
    fn remove_logs<R: RangeBounds<[u8; 8]>>(&self, range: R) -> Result<(), SErr> {
        for k in self.logs.range(range).keys() {
            let k = k.map_err(|e| StorageIOError::write_logs(&e))?;
            self.logs
                .remove(k)
                .map_err(|e| StorageIOError::write_logs(&e))?;
        }
        Ok(())
    }
}

impl LogStore {
    /// The entries from `start` on while `more(index)` holds, each put back together from
    /// its parts.
    fn read_from(
        &self,
        start: u64,
        mut more: impl FnMut(u64) -> bool,
    ) -> Result<Vec<Entry<TypeConfig>>, SErr> {
        let decode = |b: &[u8]| crate::codec::decode(b).map_err(|e| StorageIOError::read_logs(&e));
        let mut out = Vec::new();
        // The entry being put together: its first part, then the bytes of all parts.
        let mut first: Option<sled::IVec> = None;
        let mut whole: Vec<u8> = Vec::new();
        let mut finish = |first: &mut Option<sled::IVec>, whole: &mut Vec<u8>| {
            if let Some(f) = first.take() {
                out.push(if whole.is_empty() {
                    decode(&f)?
                } else {
                    decode(whole)?
                });
                whole.clear();
            }
            Ok::<_, SErr>(())
        };
        for kv in self.logs.range(key(start)..) {
            let (k, v) = kv.map_err(|e| StorageIOError::read_logs(&e))?;
            match index_of(&k) {
                (idx, true) => {
                    finish(&mut first, &mut whole)?;
                    if !more(idx) {
                        break;
                    }
                    first = Some(v);
                }
                (_, false) => {
                    let Some(f) = &first else { continue };
                    if whole.is_empty() {
                        whole.extend_from_slice(f);
                    }
                    whole.extend_from_slice(&v);
                }
            }
        }
        finish(&mut first, &mut whole)?;
        Ok(out)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, SErr> {
        let start = match range.start_bound() {
            Bound::Included(x) => *x,
            Bound::Excluded(x) => x.saturating_add(1),
            Bound::Unbounded => 0,
        };
        self.read_from(start, |idx| range.contains(&idx))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, SErr> {
        let last_purged: Option<LogId<NodeId>> = self.get_meta(PURGED)?;
        let last = match self
            .logs
            .last()
            .map_err(|e| StorageIOError::read_logs(&e))?
        {
            Some((k, _)) => {
                let idx = index_of(&k).0;
                match self.read_from(idx, |i| i == idx)?.pop() {
                    Some(e) => Some(e.log_id),
                    None => last_purged,
                }
            }
            None => last_purged,
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), SErr> {
        self.put_meta(VOTE, vote).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, SErr> {
        self.get_meta(VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<(), SErr> {
        self.stats
            .committed
            .store(committed.map_or(0, |c| c.index), Relaxed);
        self.put_meta(COMMITTED, &committed).await
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, SErr> {
        Ok(self.get_meta::<Option<LogId<NodeId>>>(COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), SErr>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = sled::Batch::default();
        for e in entries {
            let v = crate::codec::encode(&e).map_err(|e| StorageIOError::write_logs(&e))?;
            let idx = e.log_id.index;
            let mut parts = v.chunks(PART_BYTES);
            batch.insert(&key(idx), parts.next().unwrap_or_default());
            for (p, part) in (1..).zip(parts) {
                batch.insert(&part_key(idx, p), part);
            }
        }
        self.logs
            .apply_batch(batch)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        // Durable before openraft may count this entry towards a quorum.
        let res = self
            .db
            .flush_async()
            .await
            .map(|_| ())
            .map_err(std::io::Error::other);
        let failed = res.as_ref().err().map(StorageIOError::write_logs);
        callback.log_io_completed(res);
        match failed {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), SErr> {
        self.remove_logs(key(log_id.index)..)?;
        self.db
            .flush_async()
            .await
            .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), SErr> {
        self.put_meta(PURGED, &log_id).await?;
        // The purged entry's parts sort after its key, before the next entry's.
        self.remove_logs(..key(log_id.index.saturating_add(1)))?;
        Ok(())
    }
}

/// What a snapshot carries.
#[derive(Serialize, Deserialize)]
struct SnapshotBody {
    meta: SnapshotMeta<NodeId, Node>,
    machine: MachineSnapshot,
}

/// A [`SnapshotBody`]'s meta alone.
#[derive(Deserialize)]
struct SnapshotHead {
    meta: SnapshotMeta<NodeId, Node>,
}

/// Called after each applied batch, under the state machine's lock.
pub type OnApply = Arc<dyn Fn(&SmState) + Send + Sync>;

/// State shared between the state machine and its snapshot builders.
pub struct SmState {
    /// The routing state.
    pub machine: Machine,
    /// Last applied log id.
    pub last_applied: Option<LogId<NodeId>>,
    /// Last membership.
    pub membership: StoredMembership<NodeId, Node>,
    /// Proposing peer and its clock (ms) of the last `RecordRoutes` batch applied.
    pub last_routes: Option<(u64, u64)>,
}

/// The state machine: router-core's [`Machine`] behind a lock that only the Raft apply task
/// and snapshot builders take (the request path reads published views instead).
#[derive(Clone)]
pub struct StateMachineStore {
    /// Current state.
    pub state: Arc<RwLock<SmState>>,
    /// Where snapshots persist.
    file: Arc<SnapshotFile>,
    /// Earlier versions kept the snapshot in sled (as a blob); read once, then dropped.
    legacy: sled::Tree,
    snapshot_seq: Arc<AtomicU64>,
    on_apply: Option<OnApply>,
    /// Counters.
    pub stats: Arc<StoreStats>,
}

impl StateMachineStore {
    /// Opens the state machine, restoring the last snapshot persisted in `dir` (the data
    /// directory `db` lives in). `on_apply` is called after every applied batch (to publish
    /// views to the request path).
    pub fn open(
        db: &sled::Db,
        dir: &std::path::Path,
        max_entries: u64,
        max_sessions: u64,
        on_apply: Option<OnApply>,
        stats: Arc<StoreStats>,
    ) -> Result<StateMachineStore, SErr> {
        let legacy = db
            .open_tree("raft_snapshot")
            .map_err(|e| StorageIOError::read_state_machine(&e))?;
        let file = SnapshotFile::new(dir).map_err(|e| StorageIOError::read_state_machine(&e))?;
        file.clean();
        let mut st = SmState {
            machine: Machine::new(max_entries, max_sessions),
            last_applied: None,
            membership: StoredMembership::default(),
            last_routes: None,
        };
        let stored = match file
            .read()
            .map_err(|e| StorageIOError::read_state_machine(&e))?
        {
            Some((_, bytes)) => Some(bytes),
            None => legacy
                .get(SNAPSHOT)
                .map_err(|e| StorageIOError::read_state_machine(&e))?
                .map(|b| b.to_vec()),
        };
        if let Some(bytes) = stored {
            let f: SnapshotBody =
                crate::codec::decode(&bytes).map_err(|e| StorageIOError::read_state_machine(&e))?;
            st.machine = Machine::restore(&f.machine);
            st.last_applied = f.meta.last_log_id;
            st.membership = f.meta.last_membership;
        }
        // Readers get the restored state before the log replays the rest.
        if let Some(f) = &on_apply {
            f(&st);
        }
        Ok(StateMachineStore {
            state: Arc::new(RwLock::new(st)),
            file: Arc::new(file),
            legacy,
            snapshot_seq: Arc::new(AtomicU64::new(0)),
            on_apply,
            stats,
        })
    }

    /// Makes `bytes` the persisted snapshot (durable when this returns), off the async
    /// threads: a snapshot at 10M entries is a few hundred MB.
    async fn persist(
        &self,
        meta: &SnapshotMeta<NodeId, Node>,
        bytes: Vec<u8>,
    ) -> Result<Vec<u8>, SErr> {
        let index = meta.last_log_id.map_or(0, |l| l.index);
        let file = self.file.clone();
        let (res, bytes) =
            tokio::task::spawn_blocking(move || (file.replace(index, &bytes), bytes))
                .await
                .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        res.map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        if self.legacy.contains_key(SNAPSHOT).unwrap_or(false) {
            let _ = self.legacy.remove(SNAPSHOT);
        }
        Ok(bytes)
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, SErr> {
        let started = std::time::Instant::now();
        // Copy under the read lock (the LRU nodes flat, the rest shared or small), export
        // and encode without it: apply waits only for the copy.
        let (machine, last_applied, membership) = {
            let st = self.state.read().await;
            (st.machine.image(), st.last_applied, st.membership.clone())
        };
        self.stats
            .snapshot_lock_us
            .store(started.elapsed().as_micros() as u64, Relaxed);
        let machine = machine.snapshot();
        let seq = self.snapshot_seq.fetch_add(1, Relaxed);
        let snapshot_id = match last_applied {
            Some(l) => format!("{}-{}-{seq}", l.leader_id, l.index),
            None => format!("--{seq}"),
        };
        let meta = SnapshotMeta {
            last_log_id: last_applied,
            last_membership: membership,
            snapshot_id,
        };
        let file = SnapshotBody {
            meta: meta.clone(),
            machine,
        };
        let bytes = crate::codec::encode(&file)
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
        let bytes = self.persist(&meta, bytes).await?;
        self.stats.snapshots_built.fetch_add(1, Relaxed);
        self.stats.snapshot_bytes.store(bytes.len() as u64, Relaxed);
        self.stats
            .snapshot_build_us
            .store(started.elapsed().as_micros() as u64, Relaxed);
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = StateMachineStore;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, Node>), SErr> {
        let st = self.state.read().await;
        Ok((st.last_applied, st.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Outcome>, SErr>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut st = self.state.write().await;
        // No await below: the span is entered for the synchronous apply and publish only.
        let span = tracing::info_span!(target: crate::span::SPAN_TARGET, "apply",
            entries = tracing::field::Empty, routes = tracing::field::Empty,
            index = tracing::field::Empty);
        let _in = span.enter();
        let mut out = Vec::new();
        let mut routes = 0u64;
        for e in entries {
            st.last_applied = Some(e.log_id);
            match e.payload {
                EntryPayload::Blank => out.push(Outcome::Ok),
                EntryPayload::Normal(cmd) => {
                    if let Command::RecordRoutes {
                        peer,
                        at_ms,
                        routes: r,
                    } = &cmd
                    {
                        st.last_routes = Some((*peer, *at_ms));
                        routes += r.len() as u64;
                    }
                    out.push(st.machine.apply(&cmd));
                }
                EntryPayload::Membership(m) => {
                    st.membership = StoredMembership::new(Some(e.log_id), m);
                    out.push(Outcome::Ok);
                }
            }
        }
        if !span.is_disabled() {
            span.record("entries", out.len() as i64);
            span.record("routes", routes as i64);
            span.record("index", st.last_applied.map_or(0, |l| l.index) as i64);
        }
        if let Some(f) = &self.on_apply {
            f(&st);
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, SErr> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, Node>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), SErr> {
        let started = std::time::Instant::now();
        let bytes = snapshot.into_inner();
        let len = bytes.len() as u64;
        let f: SnapshotBody = crate::codec::decode(&bytes)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        // Rebuild outside the lock; readers and snapshot builders wait only for the swap.
        let machine = Machine::restore(&f.machine);
        {
            let mut st = self.state.write().await;
            st.machine = machine;
            st.last_applied = meta.last_log_id;
            st.membership = meta.last_membership.clone();
            if let Some(cb) = &self.on_apply {
                cb(&st);
            }
        }
        self.persist(meta, bytes).await?;
        self.stats.snapshots_installed.fetch_add(1, Relaxed);
        self.stats.snapshot_bytes.store(len, Relaxed);
        self.stats
            .snapshot_install_us
            .store(started.elapsed().as_micros() as u64, Relaxed);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, SErr> {
        let file = self.file.clone();
        let stored = tokio::task::spawn_blocking(move || file.read())
            .await
            .map_err(|e| StorageIOError::read_state_machine(&e))?
            .map_err(|e| StorageIOError::read_state_machine(&e))?;
        let bytes = match stored {
            Some((_, bytes)) => bytes,
            None => match self
                .legacy
                .get(SNAPSHOT)
                .map_err(|e| StorageIOError::read_state_machine(&e))?
            {
                Some(b) => b.to_vec(),
                None => return Ok(None),
            },
        };
        // Only the meta: the machine is skipped over, not built.
        let f: SnapshotHead =
            crate::codec::decode(&bytes).map_err(|e| StorageIOError::read_state_machine(&e))?;
        Ok(Some(Snapshot {
            meta: f.meta,
            snapshot: Box::new(Cursor::new(bytes)),
        }))
    }
}
