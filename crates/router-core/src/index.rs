//! The affinity index and per-rank cache model.
//!
//! `CacheModel` remembers which ranks served which prefix fingerprints and forgets, per
//! rank, what that rank's own LRU would have evicted: each rank has a capacity in tokens and
//! an LRU list of the chunks routed to it. When a rank's chunks exceed its capacity, the
//! least recently used chunks leave the index, so the router stops crediting prefixes the
//! engine no longer holds.
//!
//! Within one recorded prompt the chunks are touched last-to-first, so the first chunk is
//! the most recent: like vLLM's free queue, the tail of a prefix is evicted before its
//! head, and what remains is always a usable prefix.
//!
//! State changes only through [`CacheModel::record`], [`CacheModel::remove_rank`] and
//! [`CacheModel::set_capacity`], driven by a logical clock, so replaying the same calls
//! gives byte-identical state (see [`CacheModel::digest`]).
//!
//! Readers never lock the model: [`CacheModel::view`] hands out an [`IndexView`] (O(1))
//! that request threads read while the single writer goes on. Its fingerprint table is
//! the writer's own, read through atomics (see `fptable`): a view sees writes made after it
//! was taken, as a routing hint may. Session hints, the lists of fingerprints held by
//! several ranks and each rank's free KV are persistent snapshots as of the view.

use crate::fptable::{key_of, pack, unpack, FpTable, EMPTY, MULTI, NO_SLOT};
use smallvec::SmallVec;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use xxhash_rust::xxh3::Xxh3;

/// One routing decision to remember.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Route {
    /// Rank that served the prompt.
    pub rank: RankId,
    /// The prompt's fingerprints.
    #[serde(with = "crate::packed")]
    pub hashes: Vec<u64>,
    /// Tokens of each fingerprinted chunk.
    #[serde(with = "crate::packed")]
    pub chunk_tokens: Vec<u32>,
    /// Session id hash, if any.
    pub session: Option<u64>,
}

/// Dense id of one engine rank (one KV cache). Never reused while its state exists.
pub type RankId = u32;

/// Fingerprints are xxh3 outputs already: hashing them again is wasted work.
#[derive(Default, Clone, Copy)]
pub struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

type Ident = BuildHasherDefault<IdentityHasher>;
/// The ranks holding one fingerprint, sorted by rank (membership is a binary search: a
/// shared system prompt can be held by every rank of a large fleet), each with its LRU
/// node in the writer's model (`NIL` for a pending decision). Carrying the node is what
/// lets the writer find a (fingerprint, rank) entry without a second map. Kept only for
/// fingerprints with two holders or more; one holder is packed into the table's value.
pub type Holders = SmallVec<[(RankId, u32); 2]>;

fn insert_sorted(holders: &mut Holders, rank: RankId, node: u32) {
    match holders.binary_search_by_key(&rank, |h| h.0) {
        Ok(at) => holders[at].1 = node,
        Err(at) => holders.insert(at, (rank, node)),
    }
}
type PMap<V> = imbl::GenericHashMap<u64, V, Ident, imbl::shared_ptr::DefaultSharedPtr>;

const NIL: u32 = u32::MAX;

/// Keys whose table buckets are read ahead at once (see `FpTable::warm`): enough misses in
/// flight to keep the memory system busy, few enough to stay in the first-level cache.
const WARM_AHEAD: usize = 16;

/// Bits of a node's stamp that hold its chunk's tokens; the tick takes the other 44
/// (1.7e13 records: centuries at any real routing rate).
const TOKEN_BITS: u32 = 20;
/// Tokens one chunk can count (larger counts saturate; chunks are a few thousand tokens).
pub const MAX_CHUNK_TOKENS: u32 = (1 << TOKEN_BITS) - 1;

/// The table is replaced once its keys pass 9/10 of its slots (two-bucket cuckoo hashing
/// with four-slot buckets places keys up to about 97%; above 90% room takes longer chains
/// of moves)...
const MAX_LOAD: (usize, usize) = (9, 10);
/// ...by one that the live keys fill to 18/25: dense enough for memory, growth by a
/// quarter at a time.
const REBUILD_LOAD: (usize, usize) = (18, 25);

/// One (fingerprint, rank) entry: 24 bytes. Its rank is the list it is in (every caller
/// knows it). It names its fingerprint by key, not by table slot, so the table may move
/// keys (see `fptable`) without touching the nodes, and a snapshot image needs only the
/// nodes.
#[derive(Clone, Copy, Debug)]
struct Node {
    /// The fingerprint's table key.
    key: u64,
    prev: u32,
    next: u32,
    /// Tick of the last touch and the chunk's tokens, packed.
    stamp: u64,
}

impl Node {
    fn tick(&self) -> u64 {
        self.stamp >> TOKEN_BITS
    }
    fn tokens(&self) -> u32 {
        (self.stamp & u64::from(MAX_CHUNK_TOKENS)) as u32
    }
}

fn stamp(tick: u64, tokens: u32) -> u64 {
    (tick << TOKEN_BITS) | u64::from(tokens.min(MAX_CHUNK_TOKENS))
}

/// Ticks since `n` was last touched, at `tick` (in the stamp's 44 bits).
fn age(tick: u64, n: &Node) -> u64 {
    (stamp(tick, 0) >> TOKEN_BITS).wrapping_sub(n.tick()) & (u64::MAX >> TOKEN_BITS)
}

/// Return intervals within which a rank's oldest entry counts as still in use (see
/// `CacheModel::room`).
const LIVE_RETURNS: u64 = 8;

#[derive(Clone, Debug, Default)]
struct RankLru {
    present: bool,
    head: u32,
    tail: u32,
    tokens: u64,
    capacity: u64,
    entries: u64,
}

/// The holders of one fingerprint as a reader sees them.
enum Held<'a> {
    One([(RankId, u32); 1]),
    Shared(&'a [(RankId, u32)]),
    Own(SmallVec<[(RankId, u32); 4]>),
}

impl std::ops::Deref for Held<'_> {
    type Target = [(RankId, u32)];
    fn deref(&self) -> &Self::Target {
        match self {
            Held::One(a) => a,
            Held::Shared(s) => s,
            Held::Own(v) => v,
        }
    }
}

/// What the request path reads. See the module docs.
#[derive(Clone, Default)]
pub struct IndexView {
    table: Arc<FpTable>,
    /// Holder lists of fingerprints held by several ranks, as of the view.
    multi: PMap<Holders>,
    /// Decisions not applied yet (see [`IndexView::overlay`]): fingerprint -> ranks.
    pending: PMap<SmallVec<[RankId; 2]>>,
    sessions: PMap<RankId>,
    /// Each rank's modelled free KV (capacity - tokens held), by rank id, as of the view;
    /// infinite for a rank without a capacity.
    room: Arc<[f32]>,
    /// Fingerprints held when the view was taken.
    len: usize,
}

impl IndexView {
    /// The ranks holding `fingerprint`, sorted by rank.
    fn held(&self, fingerprint: u64) -> Held<'_> {
        let key = key_of(fingerprint);
        let v = self.table.get(key);
        let base = if v == EMPTY {
            Held::Shared(&[])
        } else if v & MULTI == 0 {
            Held::One([unpack(v)])
        } else {
            // Several holders since after this view was taken: unknown here until the
            // next one (a hint missed for milliseconds).
            Held::Shared(self.multi.get(&key).map_or(&[], |h| h.as_slice()))
        };
        let Some(extra) = (!self.pending.is_empty())
            .then(|| self.pending.get(&key))
            .flatten()
        else {
            return base;
        };
        let mut out: SmallVec<[(RankId, u32); 4]> = base.iter().copied().collect();
        for r in extra {
            if let Err(at) = out.binary_search_by_key(r, |h| h.0) {
                out.insert(at, (*r, NIL));
            }
        }
        Held::Own(out)
    }

    /// For each rank, how many leading fingerprints of `hashes` it holds, contiguously from
    /// the first, sorted by rank.
    ///
    /// What a rank holds of a chain is always a prefix of it (every record is a whole
    /// prefix, and a prompt's chunks are evicted tail first), so the holders of chunk `d + 1`
    /// are a subset of the holders of chunk `d`, and depths are found by bisection: the
    /// ranks whose depth lies in `lo..=hi` are split by the holders of the middle chunk and
    /// each group goes on with its half, deepest group first. Because the deeper ranks are
    /// all settled by then, the size of the middle chunk's holder list tells how many of the
    /// group hold it; only a group that really splits is compared rank by rank. A system
    /// prompt held by hundreds of ranks costs O(log n) map lookups, not hundreds of
    /// membership tests per lookup. (A record being applied while this reads can break the
    /// subset rule for a moment; the answer is then off by a few chunks, never out of
    /// bounds.)
    pub fn matches(&self, hashes: &[u64]) -> SmallVec<[(RankId, u32); 8]> {
        let mut out: SmallVec<[(RankId, u32); 8]> = SmallVec::new();
        let Some(first) = hashes.first().map(|h| self.held(*h)) else {
            return out;
        };
        // Sorted by rank, like every holder list; each group below stays sorted.
        out.extend(first.iter().map(|h| (h.0, 1)));
        if out.is_empty() {
            return out;
        }
        let mut settled = 0;
        let mut below: SmallVec<[(RankId, u32); 8]> = SmallVec::new();
        // (start, end) of a group in `out`, and the lo..=hi its depths lie in. Groups on
        // the stack are disjoint in depth, the deepest on top.
        let mut work: SmallVec<[(usize, usize, usize, usize); 32]> = SmallVec::new();
        work.push((0, out.len(), 1, hashes.len()));
        while let Some((s, e, lo, hi)) = work.pop() {
            if lo == hi {
                out[s..e].iter_mut().for_each(|m| m.1 = lo as u32);
                settled += e - s;
                continue;
            }
            // Depth d means chunk d - 1 is held.
            let mid = lo + (hi - lo).div_ceil(2);
            let holders = self.held(hashes[mid - 1]);
            let k = match holders.len().saturating_sub(settled) {
                n if n >= e - s => e,
                0 => s,
                _ => {
                    // A real split: keep the holders in front, both parts sorted.
                    // Both sorted by rank: one merge walk, not a search per rank.
                    below.clear();
                    let (mut k, mut j) = (s, 0);
                    for i in s..e {
                        let r = out[i].0;
                        while j < holders.len() && holders[j].0 < r {
                            j += 1;
                        }
                        if j < holders.len() && holders[j].0 == r {
                            out[k] = out[i];
                            k += 1;
                        } else {
                            below.push(out[i]);
                        }
                    }
                    out[k..e].copy_from_slice(&below);
                    k
                }
            };
            if k < e {
                work.push((k, e, lo, mid - 1));
            }
            if s < k {
                work.push((s, k, mid, hi));
            }
        }
        // A few sorted runs, one per group: a run-merging sort is linear here.
        out.sort_by_key(|m| m.0);
        out
    }

    /// The rank a session was last routed to.
    pub fn session(&self, session: u64) -> Option<RankId> {
        self.sessions.get(&session).copied()
    }

    /// This view plus decisions not applied yet: each route's fingerprints credited to its
    /// rank, and its session bound to it. No eviction (the overlay lives for milliseconds,
    /// until the log applies the same routes). The view itself is unchanged (the pending
    /// decisions are a persistent map of their own, laid over the table on reads).
    pub fn overlay<'a>(&self, routes: impl IntoIterator<Item = &'a Route>) -> IndexView {
        let mut out = self.clone();
        for r in routes {
            for h in &r.hashes {
                let key = key_of(*h);
                let mut ranks = out.pending.get(&key).cloned().unwrap_or_default();
                if let Err(at) = ranks.binary_search(&r.rank) {
                    ranks.insert(at, r.rank);
                    out.pending.insert(key, ranks);
                }
            }
            if let Some(s) = r.session {
                out.sessions.insert(s, r.rank);
            }
        }
        out
    }

    /// Tokens the model believes `rank`'s KV cache can take before it evicts (infinite for
    /// a rank it has no capacity for).
    pub fn room(&self, rank: RankId) -> f64 {
        self.room
            .get(rank as usize)
            .map_or(f64::INFINITY, |f| f64::from(*f))
    }

    /// Number of fingerprints held by any rank when the view was taken.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view was empty when taken.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Counters exported as metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Distinct fingerprints.
    pub fingerprints: u64,
    /// (fingerprint, rank) entries.
    pub entries: u64,
    /// Estimated bytes used by the index.
    pub bytes: u64,
    /// Entries dropped because a rank's modelled cache was full.
    pub capacity_evictions: u64,
    /// Entries dropped because the global entry cap was reached.
    pub cap_evictions: u64,
    /// Session hints held.
    pub sessions: u64,
}

/// One rank's part of a [`ModelSnapshot`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RankSnapshot {
    /// Rank id.
    pub rank: RankId,
    /// KV capacity in tokens.
    pub capacity: u64,
    /// `(fingerprint, tick, tokens)`, most recent first.
    pub entries: Vec<(u64, u64, u32)>,
}

/// Serializable image of a [`CacheModel`]; importing it gives the same digest.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ModelSnapshot {
    /// Logical clock.
    pub tick: u64,
    /// Entry cap.
    pub max_entries: u64,
    /// Session cap.
    pub max_sessions: u64,
    /// Ranks with their LRU lists.
    pub ranks: Vec<RankSnapshot>,
    /// `(session, tick, rank)`.
    pub sessions: Vec<(u64, u64, RankId)>,
    /// Counter.
    pub capacity_evictions: u64,
    /// Counter.
    pub cap_evictions: u64,
    /// How long conversations take to come back, ticks x 16 (see [`CacheModel::view`]).
    #[serde(default)]
    pub return_x16: u64,
}

/// The single-writer model. See the module docs.
pub struct CacheModel {
    /// Fingerprint -> holders; shared with the views (see `fptable`).
    table: Arc<FpTable>,
    /// Keys in the table (each has holders).
    live: usize,
    /// Holder lists of the keys with several holders.
    multi: PMap<Holders>,
    /// (fingerprint, rank) entries: nodes in use.
    entries: u64,
    nodes: Vec<Node>,
    free: Vec<u32>,
    ranks: Vec<RankLru>,
    sessions: PMap<RankId>,
    session_ticks: HashMap<u64, u64, Ident>,
    max_entries: u64,
    max_sessions: u64,
    tick: u64,
    /// Moving mean of how many ticks pass before a conversation comes back (the age of the
    /// oldest chunk a record touches), times 16.
    return_x16: u64,
    capacity_evictions: u64,
    cap_evictions: u64,
}

impl Clone for CacheModel {
    /// A deep copy: the clone gets a table of its own.
    fn clone(&self) -> Self {
        CacheModel {
            table: Arc::new((*self.table).clone()),
            live: self.live,
            multi: self.multi.clone(),
            entries: self.entries,
            nodes: self.nodes.clone(),
            free: self.free.clone(),
            ranks: self.ranks.clone(),
            sessions: self.sessions.clone(),
            session_ticks: self.session_ticks.clone(),
            max_entries: self.max_entries,
            max_sessions: self.max_sessions,
            tick: self.tick,
            return_x16: self.return_x16,
            capacity_evictions: self.capacity_evictions,
            cap_evictions: self.cap_evictions,
        }
    }
}

/// What a [`ModelSnapshot`] is exported from, copied under the writer's lock: the LRU
/// nodes (which carry their keys) and ranks as flat copies, the session maps. The export
/// itself, walking 10M nodes, runs outside.
pub struct ModelImage {
    nodes: Vec<Node>,
    ranks: Vec<RankLru>,
    sessions: PMap<RankId>,
    session_ticks: HashMap<u64, u64, Ident>,
    /// The snapshot's scalars.
    head: ModelSnapshot,
}

/// Approximate bytes one (fingerprint, rank) entry costs: its LRU node and its share of the
/// table (16-byte slots, 18/25 to 9/10 full). A lower bound: `routerbench index` measures
/// the resident figure, which holder lists of shared fingerprints and allocator slack raise.
pub const BYTES_PER_ENTRY: u64 = (std::mem::size_of::<Node>() + 16 * 25 / 18) as u64;

impl CacheModel {
    /// An empty model holding at most `max_entries` (fingerprint, rank) entries and
    /// `max_sessions` session hints.
    pub fn new(max_entries: u64, max_sessions: u64) -> Self {
        CacheModel {
            table: Arc::default(),
            live: 0,
            multi: PMap::default(),
            entries: 0,
            nodes: Vec::new(),
            free: Vec::new(),
            ranks: Vec::new(),
            sessions: PMap::default(),
            session_ticks: HashMap::default(),
            max_entries: max_entries.max(1),
            max_sessions: max_sessions.max(1),
            tick: 0,
            return_x16: 0,
            capacity_evictions: 0,
            cap_evictions: 0,
        }
    }

    /// Declares a rank with a KV capacity in tokens (or changes its capacity). A smaller
    /// capacity evicts at once.
    pub fn set_capacity(&mut self, rank: RankId, capacity_tokens: u64) {
        let r = rank as usize;
        if self.ranks.len() <= r {
            self.ranks.resize(r + 1, RankLru::default());
        }
        let lru = &mut self.ranks[r];
        if !lru.present {
            *lru = RankLru {
                present: true,
                head: NIL,
                tail: NIL,
                tokens: 0,
                capacity: capacity_tokens,
                entries: 0,
            };
        }
        lru.capacity = capacity_tokens;
        self.evict_rank_to_capacity(rank);
    }

    /// Whether `rank` is known.
    pub fn has_rank(&self, rank: RankId) -> bool {
        self.ranks.get(rank as usize).is_some_and(|r| r.present)
    }

    /// Tokens the model believes `rank` holds.
    pub fn rank_tokens(&self, rank: RankId) -> u64 {
        self.ranks.get(rank as usize).map_or(0, |r| r.tokens)
    }

    /// Forgets everything about `rank` (its server left).
    pub fn remove_rank(&mut self, rank: RankId) {
        let Some(lru) = self.ranks.get(rank as usize) else {
            return;
        };
        let mut cur = lru.head;
        while cur != NIL {
            let next = self.nodes[cur as usize].next;
            self.drop_node(rank, cur);
            cur = next;
        }
        self.ranks[rank as usize] = RankLru::default();
        let stale: Vec<u64> = self
            .sessions
            .iter()
            .filter(|(_, r)| **r == rank)
            .map(|(k, _)| *k)
            .collect();
        for k in stale {
            self.sessions.remove(&k);
            self.session_ticks.remove(&k);
        }
    }

    /// Records that the prompt with `hashes` (and per-chunk token counts) was served by
    /// `rank`, and optionally binds `session` to it. Unknown ranks are ignored.
    pub fn record(
        &mut self,
        rank: RankId,
        hashes: &[u64],
        chunk_tokens: &[u32],
        session: Option<u64>,
    ) {
        if !self.has_rank(rank) {
            return;
        }
        self.tick += 1;
        let tick = self.tick;
        // The oldest chunk touched: how long ago this conversation was last here.
        let mut back = 0u64;
        // The node expected to hold the next chunk down: a conversation re-sends its
        // prefix, whose chunks sit next to each other in the rank's list (the last record
        // left them there, head first), so a touch usually needs no probe of the table.
        // Always a live node of this rank's list (a neighbour of one), or NIL: its key
        // alone tells whether it is the chunk's.
        let mut hint = NIL;
        // Chunks from this index on have had their table buckets read ahead (`warm`).
        let mut warmed = hashes.len();
        // Last to first: the head of the prefix ends up most recent.
        for (i, h) in hashes.iter().enumerate().rev() {
            let key = key_of(*h);
            let hinted = (hint != NIL && self.nodes[hint as usize].key == key).then_some(hint);
            if hinted.is_none() && i < warmed {
                // A chunk that needs a probe: usually the ones before it will too (a new
                // or evicted prefix), so read their buckets ahead in one overlapped batch.
                let from = i.saturating_sub(WARM_AHEAD - 1);
                let keys = hashes[from..=i].iter().map(|h| key_of(*h));
                std::hint::black_box(self.table.warm(keys));
                warmed = from;
            }
            // Otherwise one probe tells whether this rank holds the chunk (and its node)
            // and gives the slot to extend when it does not.
            let (held, slot) = match hinted {
                Some(idx) => (Some(idx), Ok(NIL as usize)),
                None => match self.table.probe(key) {
                    Ok(s) => (self.holder_node(s, rank), Ok(s)),
                    Err(at) => (None, Err(at)),
                },
            };
            match held {
                Some(idx) => {
                    let n = &mut self.nodes[idx as usize];
                    hint = n.prev;
                    back = back.max(age(tick, n));
                    n.stamp = stamp(tick, n.tokens());
                    self.unlink(rank, idx);
                    self.push_front(rank, idx);
                }
                None => {
                    hint = NIL;
                    // Claiming a slot can replace the table: only then, before the node.
                    let slot = slot.unwrap_or_else(|at| self.claim(key, at));
                    let node = Node {
                        key,
                        prev: NIL,
                        next: NIL,
                        stamp: stamp(tick, chunk_tokens.get(i).copied().unwrap_or(0)),
                    };
                    let tokens = node.tokens();
                    let idx = match self.free.pop() {
                        Some(i) => {
                            self.nodes[i as usize] = node;
                            i
                        }
                        None => {
                            self.nodes.push(node);
                            (self.nodes.len() - 1) as u32
                        }
                    };
                    self.entries += 1;
                    let lru = &mut self.ranks[rank as usize];
                    lru.tokens += u64::from(tokens);
                    lru.entries += 1;
                    self.push_front(rank, idx);
                    self.add_holder(slot, rank, idx);
                }
            }
        }
        if back > 0 {
            self.return_x16 = self.return_x16 - self.return_x16 / 16 + back;
        }
        self.evict_rank_to_capacity(rank);
        while self.entries > self.max_entries {
            self.evict_globally_oldest();
        }
        if let Some(s) = session {
            self.sessions.insert(s, rank);
            self.session_ticks.insert(s, tick);
            if self.session_ticks.len() as u64 > self.max_sessions {
                self.shrink_sessions();
            }
        }
    }

    /// A view for readers (O(1)).
    pub fn view(&self) -> IndexView {
        IndexView {
            table: self.table.clone(),
            multi: self.multi.clone(),
            pending: PMap::default(),
            sessions: self.sessions.clone(),
            room: self.ranks.iter().map(|r| self.room(r)).collect(),
            len: self.live,
        }
    }

    /// The tokens `lru`'s rank can take before evicting what conversations still use: its
    /// free capacity while its least recently used entry is younger than `LIVE_RETURNS`
    /// mean return intervals (evicting it would likely cost a conversation its prefix),
    /// unbounded once older (what it evicts belongs to conversations that ended: free to
    /// drop). Engines keep finished conversations until evicted, so every rank of a fleet
    /// in steady state is full; only the age of what it would evict tells pressure apart.
    fn room(&self, lru: &RankLru) -> f32 {
        if !lru.present {
            return f32::INFINITY;
        }
        let oldest = (lru.tail != NIL).then(|| age(self.tick, &self.nodes[lru.tail as usize]));
        match oldest {
            Some(a)
                if self.return_x16 > 0 && a.saturating_mul(16) > LIVE_RETURNS * self.return_x16 =>
            {
                f32::INFINITY
            }
            _ => lru.capacity.saturating_sub(lru.tokens) as f32,
        }
    }

    /// Current counters.
    pub fn stats(&self) -> IndexStats {
        IndexStats {
            fingerprints: self.live as u64,
            entries: self.entries,
            bytes: self.entries * BYTES_PER_ENTRY,
            capacity_evictions: self.capacity_evictions,
            cap_evictions: self.cap_evictions,
            sessions: self.sessions.len() as u64,
        }
    }

    /// A digest of the whole logical state (entries, LRU order, ticks, sessions), equal on
    /// two models exactly when they would make the same decisions from now on.
    pub fn digest(&self) -> u64 {
        let mut h = Xxh3::new();
        h.update(&self.tick.to_le_bytes());
        h.update(&self.return_x16.to_le_bytes());
        for (r, lru) in self.ranks.iter().enumerate() {
            if !lru.present {
                continue;
            }
            h.update(&(r as u64).to_le_bytes());
            h.update(&lru.capacity.to_le_bytes());
            h.update(&lru.tokens.to_le_bytes());
            let mut cur = lru.head;
            while cur != NIL {
                let n = &self.nodes[cur as usize];
                h.update(&n.key.to_le_bytes());
                h.update(&n.tick().to_le_bytes());
                h.update(&n.tokens().to_le_bytes());
                cur = n.next;
            }
        }
        let mut sessions: Vec<(u64, u64, RankId)> = self
            .session_ticks
            .iter()
            .map(|(s, t)| (*s, *t, self.sessions.get(s).copied().unwrap_or(RankId::MAX)))
            .collect();
        sessions.sort_unstable();
        for (s, t, r) in sessions {
            h.update(&s.to_le_bytes());
            h.update(&t.to_le_bytes());
            h.update(&r.to_le_bytes());
        }
        h.digest()
    }

    /// What an export needs, copied (see [`ModelImage`]): O(entries) flat copying, no walk.
    pub fn image(&self) -> ModelImage {
        ModelImage {
            nodes: self.nodes.clone(),
            ranks: self.ranks.clone(),
            sessions: self.sessions.clone(),
            session_ticks: self.session_ticks.clone(),
            head: self.head(),
        }
    }

    /// An image of the whole model.
    pub fn export(&self) -> ModelSnapshot {
        export(
            &self.nodes,
            &self.ranks,
            &self.sessions,
            &self.session_ticks,
            self.head(),
        )
    }

    /// A snapshot's scalars, its ranks and sessions left empty.
    fn head(&self) -> ModelSnapshot {
        ModelSnapshot {
            tick: self.tick,
            max_entries: self.max_entries,
            max_sessions: self.max_sessions,
            ranks: Vec::new(),
            sessions: Vec::new(),
            capacity_evictions: self.capacity_evictions,
            cap_evictions: self.cap_evictions,
            return_x16: self.return_x16,
        }
    }

    /// Rebuilds a model from an image.
    pub fn import(s: &ModelSnapshot) -> CacheModel {
        let mut m = CacheModel::new(s.max_entries, s.max_sessions);
        let total: usize = s.ranks.iter().map(|r| r.entries.len()).sum();
        m.nodes.reserve_exact(total);
        // Sized once for every entry, so no replacement happens on the way.
        m.rebuild(total);
        // Holder lists of shared fingerprints gathered in a flat map, then one insert each
        // into the persistent map (not a copy of the growing list per holder).
        let mut shared: HashMap<u64, Holders, Ident> = HashMap::default();
        for r in &s.ranks {
            m.set_capacity(r.rank, r.capacity);
            // Oldest first, each pushed to the front: the list ends in the same order.
            for (i, &(hash, tick, tokens)) in r.entries.iter().enumerate().rev() {
                if i % WARM_AHEAD == WARM_AHEAD - 1 || i == r.entries.len() - 1 {
                    let from = i.saturating_sub(WARM_AHEAD - 1);
                    let keys = r.entries[from..=i].iter().map(|e| key_of(e.0));
                    std::hint::black_box(m.table.warm(keys));
                }
                let key = key_of(hash);
                let slot = m.table.probe(key).unwrap_or_else(|at| m.claim(key, at));
                let idx = m.nodes.len() as u32;
                let node = Node {
                    key,
                    prev: NIL,
                    next: NIL,
                    stamp: stamp(tick, tokens),
                };
                m.nodes.push(node);
                m.entries += 1;
                let lru = &mut m.ranks[r.rank as usize];
                lru.tokens += u64::from(node.tokens());
                lru.entries += 1;
                m.push_front(r.rank, idx);
                match m.table.value(slot) {
                    EMPTY => {
                        m.table.set(slot, pack(r.rank, idx));
                        m.live += 1;
                    }
                    v if v & MULTI == 0 => {
                        let mut hs = Holders::new();
                        hs.push(unpack(v));
                        insert_sorted(&mut hs, r.rank, idx);
                        shared.insert(key, hs);
                        m.table.set(slot, MULTI);
                    }
                    _ => insert_sorted(shared.entry(key).or_default(), r.rank, idx),
                }
            }
        }
        for (key, hs) in &shared {
            if let Ok(slot) = m.table.probe(*key) {
                m.table.set(slot, MULTI | hs.len() as u64);
            }
        }
        m.multi = shared.into_iter().collect();
        for &(sid, tick, rank) in &s.sessions {
            m.sessions.insert(sid, rank);
            m.session_ticks.insert(sid, tick);
        }
        m.tick = s.tick;
        m.return_x16 = s.return_x16;
        m.capacity_evictions = s.capacity_evictions;
        m.cap_evictions = s.cap_evictions;
        m
    }

    /// This rank's node for the key in `slot`, if it holds it.
    fn holder_node(&self, slot: usize, rank: RankId) -> Option<u32> {
        match self.table.value(slot) {
            EMPTY => None,
            v if v & MULTI == 0 => {
                let (r, n) = unpack(v);
                (r == rank).then_some(n)
            }
            _ => {
                let hs = self.multi.get(&self.table.key(slot))?;
                let at = hs.binary_search_by_key(&rank, |h| h.0).ok()?;
                Some(hs[at].1)
            }
        }
    }

    /// Adds `rank` (with its node) to the holders of the key in `slot`.
    fn add_holder(&mut self, slot: usize, rank: RankId, node: u32) {
        let v = self.table.value(slot);
        if v == EMPTY {
            self.table.set(slot, pack(rank, node));
            self.live += 1;
            return;
        }
        let key = self.table.key(slot);
        let mut hs = if v & MULTI == 0 {
            let mut hs = Holders::new();
            hs.push(unpack(v));
            hs
        } else {
            self.multi.get(&key).cloned().unwrap_or_default()
        };
        insert_sorted(&mut hs, rank, node);
        if hs.len() == 1 {
            self.table.set(slot, pack(rank, node));
            return;
        }
        // The list first, then the mark: the writer's own reads always find it.
        let n = hs.len() as u64;
        self.multi.insert(key, hs);
        self.table.set(slot, MULTI | n);
    }

    /// Removes `rank` from the holders of the key in `slot`.
    fn remove_holder(&mut self, slot: usize, rank: RankId) {
        let v = self.table.value(slot);
        if v == EMPTY {
            return;
        }
        if v & MULTI == 0 {
            if unpack(v).0 == rank {
                self.vacate(slot);
            }
            return;
        }
        let key = self.table.key(slot);
        let Some(hs) = self.multi.get(&key) else {
            return;
        };
        let mut hs = hs.clone();
        hs.retain(|h| h.0 != rank);
        match hs.len() {
            0 => {
                self.multi.remove(&key);
                self.vacate(slot);
            }
            1 => {
                self.table.set(slot, pack(hs[0].0, hs[0].1));
                self.multi.remove(&key);
            }
            n => {
                self.table.set(slot, MULTI | n as u64);
                self.multi.insert(key, hs);
            }
        }
    }

    /// The key in `slot` has no holders left.
    fn vacate(&mut self, slot: usize) {
        self.table.remove(slot);
        self.live -= 1;
    }

    /// A slot for `key`, which the table does not have (`at`: the free slot its probe
    /// gave, or `NO_SLOT`), the table replaced first when too full, or when no room can be
    /// made below the load (its seed crowded a few buckets: the new table has another).
    fn claim(&mut self, key: u64, mut at: usize) -> usize {
        loop {
            if (self.live + 1) * MAX_LOAD.1 <= self.table.slots() * MAX_LOAD.0 {
                if at == NO_SLOT {
                    at = self.table.make_room(key).unwrap_or(NO_SLOT);
                }
                if at != NO_SLOT {
                    self.table.claim(at, key, EMPTY);
                    return at;
                }
            }
            self.rebuild(self.live + 1);
            at = match self.table.probe(key) {
                Ok(at) => return at,
                Err(at) => at,
            };
        }
    }

    /// Replaces the table by one sized for `live` keys, with a new seed (another, or a
    /// larger table, if the keys do not all fit). Readers holding the old one keep it.
    fn rebuild(&mut self, live: usize) {
        let mut slots = (live * REBUILD_LOAD.1 / REBUILD_LOAD.0).max(64);
        let old = &self.table;
        for attempt in 1.. {
            let new = FpTable::with_slots(slots);
            // Keys land in random buckets of the new table: their buckets are read ahead a
            // batch at a time, so the misses overlap.
            let fits = (0..old.slots()).step_by(WARM_AHEAD).all(|from| {
                let to = (from + WARM_AHEAD).min(old.slots());
                let keys = (from..to).map(|i| old.key(i)).filter(|k| *k != 0);
                std::hint::black_box(new.warm(keys));
                (from..to).all(|i| {
                    let (k, v) = (old.key(i), old.value(i));
                    k == 0 || new.insert(k, v)
                })
            });
            if fits {
                self.table = Arc::new(new);
                return;
            }
            if attempt % 3 == 0 {
                slots += slots / 4;
            }
        }
    }

    fn unlink(&mut self, rank: RankId, idx: u32) {
        let Node { prev, next, .. } = self.nodes[idx as usize];
        if prev != NIL {
            self.nodes[prev as usize].next = next;
        } else {
            self.ranks[rank as usize].head = next;
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        } else {
            self.ranks[rank as usize].tail = prev;
        }
    }

    fn push_front(&mut self, rank: RankId, idx: u32) {
        let old = self.ranks[rank as usize].head;
        self.nodes[idx as usize].prev = NIL;
        self.nodes[idx as usize].next = old;
        if old != NIL {
            self.nodes[old as usize].prev = idx;
        } else {
            self.ranks[rank as usize].tail = idx;
        }
        self.ranks[rank as usize].head = idx;
    }

    /// Removes a node from its rank's list and from its fingerprint's holders.
    fn drop_node(&mut self, rank: RankId, idx: u32) {
        self.unlink(rank, idx);
        let n = self.nodes[idx as usize];
        let lru = &mut self.ranks[rank as usize];
        lru.tokens = lru.tokens.saturating_sub(u64::from(n.tokens()));
        lru.entries = lru.entries.saturating_sub(1);
        self.entries = self.entries.saturating_sub(1);
        if let Ok(slot) = self.table.probe(n.key) {
            self.remove_holder(slot, rank);
        }
        self.free.push(idx);
    }

    fn evict_rank_to_capacity(&mut self, rank: RankId) {
        let mut batch: SmallVec<[u32; WARM_AHEAD]> = SmallVec::new();
        loop {
            let lru = &self.ranks[rank as usize];
            if lru.tokens <= lru.capacity || lru.tail == NIL {
                return;
            }
            // The nodes to drop, tail first (a walk of the list), then their keys' buckets
            // read in one overlapped batch before the removals need them.
            let mut excess = lru.tokens - lru.capacity;
            let mut cur = lru.tail;
            batch.clear();
            while cur != NIL && excess > 0 && batch.len() < WARM_AHEAD {
                let n = &self.nodes[cur as usize];
                excess = excess.saturating_sub(u64::from(n.tokens()));
                batch.push(cur);
                cur = n.prev;
            }
            let keys = batch.iter().map(|i| self.nodes[*i as usize].key);
            std::hint::black_box(self.table.warm(keys));
            for idx in &batch {
                self.drop_node(rank, *idx);
                self.capacity_evictions += 1;
            }
        }
    }

    fn evict_globally_oldest(&mut self) {
        let mut best: Option<(u64, RankId, u32)> = None;
        for (r, lru) in self.ranks.iter().enumerate() {
            if lru.present && lru.tail != NIL {
                let t = self.nodes[lru.tail as usize].tick();
                if best.is_none_or(|(bt, _, _)| t < bt) {
                    best = Some((t, r as RankId, lru.tail));
                }
            }
        }
        if let Some((_, rank, idx)) = best {
            self.drop_node(rank, idx);
            self.cap_evictions += 1;
        } else {
            // Nothing to evict: only possible if the count drifted; stop counting ghosts.
            self.entries = 0;
        }
    }

    /// Drops the older half of the session hints (amortised O(log n) per insert).
    fn shrink_sessions(&mut self) {
        let mut ticks: Vec<(u64, u64)> = self.session_ticks.iter().map(|(s, t)| (*t, *s)).collect();
        ticks.sort_unstable();
        let drop = ticks.len() / 2;
        for (_, s) in &ticks[..drop] {
            self.session_ticks.remove(s);
            self.sessions.remove(s);
        }
    }
}

impl ModelImage {
    /// The snapshot of the model as it was when the image was taken.
    pub fn export(&self) -> ModelSnapshot {
        export(
            &self.nodes,
            &self.ranks,
            &self.sessions,
            &self.session_ticks,
            self.head.clone(),
        )
    }
}

/// Fills `out`'s ranks and sessions from a model's parts.
fn export(
    nodes: &[Node],
    ranks: &[RankLru],
    sessions: &PMap<RankId>,
    session_ticks: &HashMap<u64, u64, Ident>,
    mut out: ModelSnapshot,
) -> ModelSnapshot {
    for (r, lru) in ranks.iter().enumerate() {
        if !lru.present {
            continue;
        }
        let mut entries = Vec::with_capacity(lru.entries as usize);
        let mut cur = lru.head;
        while cur != NIL {
            let n = &nodes[cur as usize];
            entries.push((n.key, n.tick(), n.tokens()));
            cur = n.next;
        }
        out.ranks.push(RankSnapshot {
            rank: r as RankId,
            capacity: lru.capacity,
            entries,
        });
    }
    out.sessions = session_ticks
        .iter()
        .filter_map(|(s, t)| sessions.get(s).map(|r| (*s, *t, *r)))
        .collect();
    out.sessions.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fps(range: std::ops::Range<u64>) -> Vec<u64> {
        range
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
            .collect()
    }

    impl CacheModel {
        /// The structure agrees with itself: every node in a rank's list is that rank's
        /// holder entry for its fingerprint, every holder in the table points at such a
        /// node, and the counts add up.
        fn check_links(&self) {
            let mut listed = 0u64;
            let mut in_lists = std::collections::HashSet::new();
            for (r, lru) in self.ranks.iter().enumerate() {
                let (mut cur, mut n, mut tokens) = (lru.head, 0u64, 0u64);
                while cur != NIL {
                    let node = &self.nodes[cur as usize];
                    let slot = self
                        .table
                        .probe(node.key)
                        .expect("a listed key in the table");
                    assert_eq!(self.holder_node(slot, r as RankId), Some(cur));
                    in_lists.insert((r as RankId, cur));
                    n += 1;
                    tokens += u64::from(node.tokens());
                    cur = node.next;
                }
                assert_eq!((n, tokens), (lru.entries, lru.tokens));
                listed += n;
            }
            assert_eq!(listed, self.entries);
            let (mut held, mut live, mut shared) = (0u64, 0, 0);
            for i in 0..self.table.slots() {
                let (k, v) = (self.table.key(i), self.table.value(i));
                if k == 0 {
                    continue;
                }
                assert_ne!(v, EMPTY, "a key without holders left in the table");
                live += 1;
                let hs: Vec<(RankId, u32)> = if v & MULTI == 0 {
                    vec![unpack(v)]
                } else {
                    shared += 1;
                    let hs = self.multi.get(&k).expect("a shared key without its list");
                    assert!(
                        hs.len() >= 2 && hs.len() as u64 == v & !MULTI,
                        "{v:x} {hs:?}"
                    );
                    assert!(hs.windows(2).all(|w| w[0].0 < w[1].0), "unsorted {hs:?}");
                    hs.to_vec()
                };
                for (rank, node) in hs {
                    assert_eq!(self.nodes[node as usize].key, k);
                    assert!(
                        in_lists.contains(&(rank, node)),
                        "holder {rank} node {node} not listed"
                    );
                    held += 1;
                }
            }
            assert_eq!(held, self.entries);
            assert_eq!(live, self.live);
            assert_eq!(shared, self.multi.len());
        }
    }

    /// The walk the binary search replaced: each rank extended chunk by chunk.
    fn matches_linear(v: &IndexView, hashes: &[u64]) -> Vec<(RankId, u32)> {
        let mut out: Vec<(RankId, u32)> = Vec::new();
        for (i, h) in hashes.iter().enumerate() {
            let holders = v.held(*h);
            if holders.is_empty() {
                break;
            }
            let i = i as u32;
            let mut extended = false;
            for (r, _) in holders.iter() {
                if i == 0 {
                    out.push((*r, 1));
                    extended = true;
                } else if let Some(m) = out.iter_mut().find(|(rr, n)| rr == r && *n == i) {
                    m.1 = i + 1;
                    extended = true;
                }
            }
            if !extended {
                break;
            }
        }
        out.sort_unstable();
        out
    }

    /// Random conversations sharing prefixes, on ranks with small capacities and a small
    /// global cap, so eviction runs constantly: the binary search always agrees with the
    /// chunk-by-chunk walk, i.e. what a rank holds of a chain stays a prefix.
    #[test]
    fn binary_search_matches_linear_walk_under_eviction() {
        let mut rnd = crate::testrng::below(0x1234_5678_9abc_def0);
        for round in 0..20 {
            let mut m = CacheModel::new(300 + round * 40, 100);
            // Up to 24 ranks: groups of ranks share the first chunks and split on bisection.
            let ranks = 2 + rnd(23) as RankId;
            for r in 0..ranks {
                m.set_capacity(r, 50 + rnd(400));
            }
            // 12 conversations over 3 shared system prompts.
            let chains: Vec<Vec<u64>> = (0..12u64)
                .map(|c| {
                    let mut h = fps((c % 3) * 1000..(c % 3) * 1000 + 4);
                    h.extend(fps(10_000 + c * 100..10_000 + c * 100 + 36));
                    h
                })
                .collect();
            for _ in 0..400 {
                let c = &chains[rnd(12) as usize];
                let len = 1 + rnd(c.len() as u64) as usize;
                let rank = rnd(u64::from(ranks)) as RankId;
                let tokens: Vec<u32> = (0..len).map(|_| 1 + rnd(20) as u32).collect();
                m.record(rank, &c[..len], &tokens, None);
                m.check_links();
                let v = m.view();
                for c in &chains {
                    assert_eq!(v.matches(c).to_vec(), matches_linear(&v, c));
                }
            }
        }
    }

    #[test]
    fn lookup_is_contiguous_prefix() {
        let mut m = CacheModel::new(1000, 10);
        m.set_capacity(0, 1_000_000);
        m.set_capacity(1, 1_000_000);
        let a = fps(0..10);
        m.record(0, &a, &[10; 10], None);
        m.record(1, &a[..3], &[10; 3], None);
        let v = m.view();
        let mut got = v.matches(&a).to_vec();
        got.sort_unstable();
        assert_eq!(got, vec![(0, 10), (1, 3)]);
        // A prompt diverging after chunk 4.
        let mut b = a[..4].to_vec();
        b.extend(fps(100..104));
        let mut got = v.matches(&b).to_vec();
        got.sort_unstable();
        assert_eq!(got, vec![(0, 4), (1, 3)]);
        assert!(v.matches(&fps(200..205)).is_empty());
    }

    #[test]
    fn capacity_evicts_tail_first_and_lru_order() {
        let mut m = CacheModel::new(1000, 10);
        m.set_capacity(0, 100);
        let a = fps(0..6); // 60 tokens
        let b = fps(10..16); // 60 tokens
        m.record(0, &a, &[10; 6], None);
        m.record(0, &b, &[10; 6], None);
        // 120 > 100: the two least recent entries go, which are a's last two chunks.
        assert_eq!(m.rank_tokens(0), 100);
        assert_eq!(m.view().matches(&a).to_vec(), vec![(0, 4)]);
        assert_eq!(m.view().matches(&b).to_vec(), vec![(0, 6)]);
        // Touching a makes b the oldest.
        m.record(0, &a[..4], &[10; 4], None);
        m.record(0, &fps(20..24), &[10; 4], None);
        assert_eq!(m.view().matches(&a).to_vec(), vec![(0, 4)]);
        assert_eq!(m.view().matches(&b).to_vec(), vec![(0, 2)]);
        assert!(m.stats().capacity_evictions >= 6);
    }

    #[test]
    fn global_cap_bounds_entries() {
        let mut m = CacheModel::new(50, 10);
        m.set_capacity(0, u64::MAX);
        m.set_capacity(1, u64::MAX);
        for i in 0..40u64 {
            m.record((i % 2) as RankId, &fps(i * 10..i * 10 + 5), &[1; 5], None);
        }
        let s = m.stats();
        assert_eq!(s.entries, 50);
        assert!(s.cap_evictions > 0);
        assert_eq!(s.bytes, 50 * BYTES_PER_ENTRY);
        // Most recent prompts survive.
        assert_eq!(m.view().matches(&fps(390..395)).len(), 1);
        assert!(m.view().matches(&fps(0..5)).is_empty());
    }

    #[test]
    fn a_view_reads_the_live_table_and_keeps_its_snapshots() {
        let mut m = CacheModel::new(1_000_000, 10);
        m.set_capacity(0, u64::MAX);
        m.set_capacity(1, u64::MAX);
        m.record(1, &fps(100..101), &[1], None);
        let v = m.view();
        m.record(0, &fps(0..3), &[1; 3], Some(7));
        // The fingerprint table is shared: new entries show through at once. The session
        // hint is the view's own snapshot.
        assert_eq!(v.matches(&fps(0..3)).to_vec(), vec![(0, 3)]);
        assert_eq!(v.session(7), None);
        assert_eq!(m.view().session(7), Some(0));
        // Enough new keys to replace the table several times: the old view keeps the
        // table it had (all of what was there), the new one sees everything.
        let old = m.view();
        let slots = m.table.slots();
        for i in 1..300 {
            m.record(1, &fps(i * 10..i * 10 + 10), &[1; 10], None);
        }
        assert!(m.table.slots() > 4 * slots, "{} slots", m.table.slots());
        assert_eq!(old.matches(&fps(0..3)).to_vec(), vec![(0, 3)]);
        assert!(old.matches(&fps(2990..3000)).is_empty());
        assert_eq!(m.view().matches(&fps(0..3)).to_vec(), vec![(0, 3)]);
        assert_eq!(m.view().matches(&fps(2990..3000)).to_vec(), vec![(1, 10)]);
        m.check_links();
    }

    /// Readers on other threads match prompts while the writer records, evicts and
    /// replaces the table under them: no panic, and every answer is a known rank with a
    /// depth within the prompt.
    #[test]
    fn readers_race_the_writer_safely() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Mutex;
        let ranks = 6u32;
        let mut m = CacheModel::new(4_000, 10);
        for r in 0..ranks {
            m.set_capacity(r, 600);
        }
        let chains: Vec<Vec<u64>> = (0..40u64)
            .map(|c| {
                let mut h = fps((c % 4) * 1000..(c % 4) * 1000 + 8);
                h.extend(fps(100_000 + c * 1000..100_000 + c * 1000 + 60));
                h
            })
            .collect();
        let published = Mutex::new(m.view());
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            for t in 0..2 {
                let (published, done, chains) = (&published, &done, &chains);
                s.spawn(move || {
                    let mut n = 0usize;
                    while !done.load(Ordering::Relaxed) || n < 100 {
                        let v = published.lock().unwrap().clone();
                        let c = &chains[(n * 7 + t) % chains.len()];
                        for (r, d) in v.matches(c) {
                            assert!(r < ranks && d >= 1 && d as usize <= c.len());
                        }
                        n += 1;
                    }
                });
            }
            let mut rnd = crate::testrng::below(42);
            for i in 0..3_000 {
                let c = &chains[rnd(chains.len() as u64) as usize];
                let len = 1 + rnd(c.len() as u64) as usize;
                m.record(
                    rnd(u64::from(ranks)) as RankId,
                    &c[..len],
                    &[7; 68][..len],
                    None,
                );
                if i % 10 == 0 {
                    *published.lock().unwrap() = m.view();
                }
            }
            done.store(true, Ordering::Relaxed);
        });
        m.check_links();
    }

    #[test]
    fn room_counts_only_while_what_a_rank_would_evict_is_still_in_use() {
        let mut m = CacheModel::new(1_000_000, 10);
        m.set_capacity(0, 100);
        m.set_capacity(1, 100);
        m.record(1, &fps(100..110), &[10; 10], None);
        // Rank 1 is full, and nothing is known yet of how conversations come back.
        assert_eq!(m.view().room(1), 0.0);
        // Two conversations on rank 0 come back every other record.
        let (a, b) = (fps(0..5), fps(10..15));
        for _ in 0..50 {
            m.record(0, &a, &[10; 5], None);
            m.record(0, &b, &[10; 5], None);
        }
        let v = m.view();
        // Rank 0 is full of them: what it would evict next is in use.
        assert_eq!(v.room(0), 0.0);
        // Rank 1's conversation never came back: evicting it costs nothing.
        assert_eq!(v.room(1), f64::INFINITY);
        // A rank the model does not know has no limit either.
        assert_eq!(v.room(9), f64::INFINITY);
        // The return interval is state: a snapshot carries it.
        let back = CacheModel::import(&m.export());
        assert_eq!(back.digest(), m.digest());
        assert_eq!(back.view().room(1), f64::INFINITY);
    }

    #[test]
    fn remove_rank_and_digest() {
        let mut a = CacheModel::new(100, 10);
        let mut b = CacheModel::new(100, 10);
        for m in [&mut a, &mut b] {
            m.set_capacity(0, 1000);
            m.set_capacity(1, 1000);
            m.record(0, &fps(0..3), &[1; 3], Some(1));
            m.record(1, &fps(0..5), &[1; 5], Some(2));
        }
        assert_eq!(a.digest(), b.digest());
        b.record(0, &fps(0..1), &[1], None);
        assert_ne!(a.digest(), b.digest());
        a.remove_rank(1);
        assert_eq!(a.view().matches(&fps(0..5)).to_vec(), vec![(0, 3)]);
        assert_eq!(a.view().session(2), None);
        assert_eq!(a.stats().entries, 3);
        // Records for a removed rank are ignored.
        a.record(1, &fps(0..5), &[1; 5], None);
        assert_eq!(a.stats().entries, 3);
    }

    #[test]
    fn sessions_are_bounded() {
        let mut m = CacheModel::new(100, 8);
        m.set_capacity(0, 1000);
        for s in 0..100 {
            m.record(0, &[], &[], Some(s));
        }
        assert!(m.stats().sessions <= 8);
        assert_eq!(m.view().session(99), Some(0));
    }

    #[test]
    fn overlay_credits_pending_routes_without_touching_the_view() {
        let mut m = CacheModel::new(1000, 100);
        m.set_capacity(0, 100_000);
        m.set_capacity(1, 100_000);
        m.record(0, &[1, 2, 3], &[10, 10, 10], None);
        let v = m.view();
        let pending = [Route {
            rank: 1,
            hashes: vec![1, 2, 9],
            chunk_tokens: vec![10; 3],
            session: Some(7),
        }];
        let o = v.overlay(pending.iter());
        let mut got: Vec<_> = o.matches(&[1, 2, 9]).into_vec();
        got.sort_unstable();
        assert_eq!(got, vec![(0, 2), (1, 3)]);
        assert_eq!(o.session(7), Some(1));
        assert_eq!(v.matches(&[1, 2, 9]).into_vec(), vec![(0, 2)]);
        assert_eq!(v.session(7), None);
    }
}
