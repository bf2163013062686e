//! The fingerprint table: fingerprint -> packed holders, one writer, lock-free readers.
//!
//! Bucketized cuckoo hashing: every key has two buckets of four 16-byte slots (key,
//! value), one cache line each, all atomics, so request threads read the table the writer
//! is changing without a lock and without copying it (a persistent map path-copies on
//! every write after each publish and keeps partly filled trie nodes, which at 10M entries
//! cost more memory than the entries).
//!
//! A lookup reads the key's two buckets and nothing else, whatever the table went
//! through; a removal clears one slot and moves nothing. Keys move only when a new key
//! finds both its buckets full: a key in one of them moves to its other bucket (a short
//! chain of such moves at most) to make room. Open addressing with linear probing needed
//! moves on removals to keep probes short, and a churning model (every record evicting
//! as many fingerprints as it adds) spent most of its time in them. The LRU nodes name
//! their fingerprint by key, not by slot, so moves never touch them.
//!
//! The rules that make unsynchronised reads sound:
//! * a key's value is stored with release after its key, and readers load the key with
//!   acquire, then check after reading the value that the slot still holds the key;
//! * a moved key is written to its new slot before its old slot is cleared;
//! * racing a move or a removal, a reader can miss a key, or pair it with a value written
//!   an instant before or after, for that one read: a wrong hint, never a wrong memory
//!   access (everything is an atomic word);
//! * the writer replaces the whole table (a new allocation) to grow; readers holding the
//!   old one keep a consistent, slightly stale table.
//!
//! A reader can see a record half applied (some chunks credited, not yet others): the
//! result is only ever a routing hint, never replicated state.

use smallvec::SmallVec;
use std::sync::atomic::{AtomicU64, Ordering};

/// The value of a slot whose key holds nothing (removed) or not yet written.
pub(crate) const EMPTY: u64 = u64::MAX;
/// Marks a value as "several holders" (the list lives elsewhere); the low bits count them.
pub(crate) const MULTI: u64 = 1 << 63;
/// No slot: what [`FpTable::probe`] gives for an absent key whose buckets are both full.
pub(crate) const NO_SLOT: usize = usize::MAX;

/// Key 0 marks an empty slot, so fingerprint 0 is stored under another constant (an alias
/// with probability 2^-64, like any fingerprint collision).
const ZERO_KEY: u64 = 0x9E37_79B9_7F4A_7C15;

/// Slots per bucket: four 16-byte slots fill one 64-byte cache line.
pub(crate) const BUCKET: usize = 4;

/// Slots a search for room looks at before the table is grown instead (four levels of
/// moves, as a breadth-first tree).
const MAX_SEARCH: usize = 2 * (BUCKET + BUCKET.pow(2) + BUCKET.pow(3) + BUCKET.pow(4));

/// The key a fingerprint is stored under.
#[inline]
pub(crate) fn key_of(fingerprint: u64) -> u64 {
    if fingerprint == 0 {
        ZERO_KEY
    } else {
        fingerprint
    }
}

/// One holder packed in a value: rank in the high half (below 2^31), node in the low.
#[inline]
pub(crate) fn pack(rank: u32, node: u32) -> u64 {
    debug_assert!(rank < 1 << 31);
    (u64::from(rank) << 32) | u64::from(node)
}

/// The (rank, node) of a single-holder value.
#[inline]
pub(crate) fn unpack(v: u64) -> (u32, u32) {
    ((v >> 32) as u32, v as u32)
}

/// Four slots on one cache line.
#[repr(align(64))]
struct Bucket([[AtomicU64; 2]; BUCKET]);

impl Bucket {
    fn empty() -> Bucket {
        Bucket(std::array::from_fn(|_| {
            [AtomicU64::new(0), AtomicU64::new(EMPTY)]
        }))
    }
}

/// See the module docs.
pub(crate) struct FpTable {
    buckets: Box<[Bucket]>,
    /// Mixed into keys before they pick their buckets: fingerprints are uniform, but a
    /// fixed choice could be attacked with prompts chosen to collide, and tests use small
    /// integers. A table that cannot place a key is rebuilt with another seed.
    seed: u64,
}

impl Default for FpTable {
    fn default() -> Self {
        FpTable::with_slots(0)
    }
}

impl Clone for FpTable {
    /// A deep copy (a cloned model must not share its writer's table).
    fn clone(&self) -> Self {
        let load = |a: &AtomicU64| AtomicU64::new(a.load(Ordering::Relaxed));
        FpTable {
            buckets: self
                .buckets
                .iter()
                .map(|b| {
                    Bucket(std::array::from_fn(|i| {
                        [load(&b.0[i][0]), load(&b.0[i][1])]
                    }))
                })
                .collect(),
            seed: self.seed,
        }
    }
}

impl FpTable {
    /// An empty table of at least `n` slots (whole buckets), with a random seed.
    pub(crate) fn with_slots(n: usize) -> Self {
        use std::hash::BuildHasher;
        let seed = std::collections::hash_map::RandomState::new().hash_one(n);
        FpTable::seeded(n, seed)
    }

    /// An empty table of at least `n` slots with the given seed.
    pub(crate) fn seeded(n: usize, seed: u64) -> Self {
        FpTable {
            buckets: (0..n.div_ceil(BUCKET)).map(|_| Bucket::empty()).collect(),
            seed,
        }
    }

    /// Slots.
    pub(crate) fn slots(&self) -> usize {
        self.buckets.len() * BUCKET
    }

    #[inline]
    fn slot(&self, i: usize) -> &[AtomicU64; 2] {
        &self.buckets[i / BUCKET].0[i % BUCKET]
    }

    /// A key's two buckets: the seeded key mixed (the splitmix64 finalizer), its high and
    /// low halves each scaled to the table (no power-of-two size needed).
    #[inline]
    fn homes(&self, key: u64) -> (usize, usize) {
        let mut z = key ^ self.seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let n = self.buckets.len() as u64;
        let at = |h: u64| ((h * n) >> 32) as usize;
        (at(z >> 32), at(z & 0xFFFF_FFFF))
    }

    /// The bucket other than `b` that `key` may live in (`b` itself when both are one).
    #[inline]
    fn other(&self, key: u64, b: usize) -> usize {
        let (x, y) = self.homes(key);
        if b == x {
            y
        } else {
            x
        }
    }

    /// The slot holding `key`, if any.
    #[inline]
    fn find(&self, key: u64) -> Option<usize> {
        if self.buckets.is_empty() {
            return None;
        }
        let (x, y) = self.homes(key);
        for b in [x, y] {
            for (i, s) in self.buckets[b].0.iter().enumerate() {
                if s[0].load(Ordering::Acquire) == key {
                    return Some(b * BUCKET + i);
                }
            }
        }
        None
    }

    /// The first free slot of bucket `b`, if any.
    #[inline]
    fn free_in(&self, b: usize) -> Option<usize> {
        self.buckets[b]
            .0
            .iter()
            .position(|s| s[0].load(Ordering::Relaxed) == 0)
            .map(|i| b * BUCKET + i)
    }

    /// Writer only: the slot holding `key`, or `Err` with a free slot it may take (in the
    /// emptier of its buckets), [`NO_SLOT`] when both are full (see
    /// [`FpTable::make_room`]).
    #[inline]
    pub(crate) fn probe(&self, key: u64) -> Result<usize, usize> {
        if self.buckets.is_empty() {
            return Err(NO_SLOT);
        }
        let (x, y) = self.homes(key);
        // (free slots, the first of them) of the emptier bucket; the first on a tie.
        let mut best = (0, NO_SLOT);
        for b in [x, y] {
            let (mut free, mut first) = (0, NO_SLOT);
            for (i, s) in self.buckets[b].0.iter().enumerate() {
                match s[0].load(Ordering::Relaxed) {
                    k if k == key => return Ok(b * BUCKET + i),
                    0 => {
                        if first == NO_SLOT {
                            first = b * BUCKET + i;
                        }
                        free += 1;
                    }
                    _ => {}
                }
            }
            if free > best.0 {
                best = (free, first);
            }
        }
        Err(best.1)
    }

    /// Writer only: frees a slot in one of `key`'s buckets (both full) by moving a key
    /// that lives there to its other bucket, or along the shortest chain of such moves
    /// (a breadth-first search over at most [`MAX_SEARCH`] slots); the slot, or `None`
    /// when there is no such chain (grow the table).
    pub(crate) fn make_room(&self, key: u64) -> Option<usize> {
        if self.buckets.is_empty() {
            return None;
        }
        let (x, y) = self.homes(key);
        // (slot whose key would move, index of the step before it): the search's tree.
        let mut steps: Vec<(usize, usize)> = Vec::new();
        let mut next = 0;
        let roots = if x == y { &[x][..] } else { &[x, y][..] };
        let mut buckets: SmallVec<[(usize, usize); 2]> =
            roots.iter().map(|b| (*b, usize::MAX)).collect();
        loop {
            for (b, parent) in buckets.drain(..) {
                for j in 0..BUCKET {
                    let from = b * BUCKET + j;
                    // A chain never passes the same slot twice.
                    let mut p = parent;
                    while p != usize::MAX && steps[p].0 != from {
                        p = steps[p].1;
                    }
                    if p != usize::MAX || steps.len() >= MAX_SEARCH {
                        continue;
                    }
                    steps.push((from, parent));
                    let alt = self.other(self.key(from), b);
                    if alt == b {
                        continue;
                    }
                    if let Some(mut to) = self.free_in(alt) {
                        // Moved from the chain's end, so every key stays findable.
                        let mut at = steps.len() - 1;
                        loop {
                            let from = steps[at].0;
                            self.shift(from, to);
                            to = from;
                            match steps[at].1 {
                                usize::MAX => return Some(to),
                                up => at = up,
                            }
                        }
                    }
                }
            }
            // The next level: each slot's key's other bucket.
            if next == steps.len() {
                return None;
            }
            for (i, (from, _)) in steps.iter().enumerate().skip(next) {
                let b = from / BUCKET;
                let alt = self.other(self.key(*from), b);
                if alt != b {
                    buckets.push((alt, i));
                }
            }
            next = steps.len();
            if buckets.is_empty() {
                return None;
            }
        }
    }

    /// Moves the key in `from` to the free slot `to`: written there first, then cleared.
    fn shift(&self, from: usize, to: usize) {
        let (k, v) = (self.key(from), self.value(from));
        self.claim(to, k, v);
        let f = self.slot(from);
        f[1].store(EMPTY, Ordering::Relaxed);
        f[0].store(0, Ordering::Release);
    }

    /// Writer only: stores `key` with `value` (absent), making room if need be; false
    /// when there is none (grow the table).
    pub(crate) fn insert(&self, key: u64, value: u64) -> bool {
        let at = match self.probe(key) {
            Ok(_) => return true,
            Err(NO_SLOT) => match self.make_room(key) {
                Some(at) => at,
                None => return false,
            },
            Err(at) => at,
        };
        self.claim(at, key, value);
        true
    }

    /// Reads both buckets of each key, so that probes of them that follow find their cache
    /// lines loaded: these reads are independent of each other, so the CPU overlaps their
    /// cache misses, where the probes would wait for one before the next. Returns a value
    /// for `std::hint::black_box`, which keeps the reads.
    #[inline]
    pub(crate) fn warm(&self, keys: impl Iterator<Item = u64>) -> u64 {
        if self.buckets.is_empty() {
            return 0;
        }
        keys.fold(0, |acc, k| {
            let (x, y) = self.homes(k);
            acc ^ self.buckets[x].0[0][0].load(Ordering::Relaxed)
                ^ self.buckets[y].0[0][0].load(Ordering::Relaxed)
        })
    }

    /// Writer only: removes the key in slot `i`.
    pub(crate) fn remove(&self, i: usize) {
        let s = self.slot(i);
        s[1].store(EMPTY, Ordering::Relaxed);
        s[0].store(0, Ordering::Release);
    }

    /// The value stored for `key` (`EMPTY` when none).
    #[inline]
    pub(crate) fn get(&self, key: u64) -> u64 {
        let Some(i) = self.find(key) else {
            return EMPTY;
        };
        let s = self.slot(i);
        let v = s[1].load(Ordering::Acquire);
        // Moved or removed meanwhile: a miss for this read.
        if s[0].load(Ordering::Acquire) == key {
            v
        } else {
            EMPTY
        }
    }

    /// The key in slot `i` (0 when empty).
    #[inline]
    pub(crate) fn key(&self, i: usize) -> u64 {
        self.slot(i)[0].load(Ordering::Relaxed)
    }

    /// The value in slot `i`.
    #[inline]
    pub(crate) fn value(&self, i: usize) -> u64 {
        self.slot(i)[1].load(Ordering::Relaxed)
    }

    /// Writer only: sets the value of an occupied slot.
    #[inline]
    pub(crate) fn set(&self, i: usize, value: u64) {
        self.slot(i)[1].store(value, Ordering::Release);
    }

    /// Writer only: gives the free slot `i` (from `probe` or `make_room`) to `key`, with
    /// `value`.
    #[inline]
    pub(crate) fn claim(&self, i: usize, key: u64, value: u64) {
        let s = self.slot(i);
        s[0].store(key, Ordering::Release);
        s[1].store(value, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The `j`th key (counting from 1) whose two buckets in `t` are `x` and `y`.
    fn homed(t: &FpTable, x: usize, y: usize, j: u64) -> u64 {
        (1..)
            .filter(|k| t.homes(*k) == (x, y))
            .nth(j as usize)
            .expect("found")
    }

    #[test]
    fn keys_live_in_one_of_two_buckets_and_move_to_make_room() {
        let t = FpTable::with_slots(4 * BUCKET);
        assert_eq!(t.homes(homed(&t, 1, 2, 0)), (1, 2));
        // Four keys of buckets (0, 1) go to the emptier one, the first on a tie.
        let a: Vec<u64> = (0..4).map(|j| homed(&t, 0, 1, j)).collect();
        for (v, k) in a.iter().enumerate() {
            assert!(t.insert(*k, v as u64));
        }
        for (v, k) in a.iter().enumerate() {
            assert_eq!(t.get(*k), v as u64);
        }
        let in_bucket = |b: usize| (0..BUCKET).filter(|i| t.key(b * BUCKET + i) != 0).count();
        assert_eq!((in_bucket(0), in_bucket(1)), (2, 2));
        // Four more keys of (0, 1): both full now; the next one needs a move.
        for j in 4..8 {
            assert!(t.insert(homed(&t, 0, 1, j), j));
        }
        assert_eq!(t.probe(homed(&t, 0, 1, 8)), Err(NO_SLOT));
        // Keys of (0, 1) have nowhere else to go: no room, the table must grow.
        assert_eq!(t.make_room(homed(&t, 0, 1, 8)), None);
        // A key of (1, 3) takes a hole in bucket 1 while bucket 3 is full; once bucket 3
        // has room again, it moves there to let a key of (0, 1) in.
        let threes: Vec<u64> = (0..8).map(|j| homed(&t, 3, 2, j)).collect();
        for k in &threes {
            assert!(t.insert(*k, 7));
        }
        t.remove(BUCKET + 1);
        let mover = homed(&t, 1, 3, 0);
        assert!(t.insert(mover, 100));
        assert_eq!(t.probe(mover), Ok(BUCKET + 1));
        t.remove(3 * BUCKET);
        let late = homed(&t, 0, 1, 9);
        assert!(t.insert(late, 101));
        assert_eq!((t.get(late), t.get(mover)), (101, 100));
        assert_eq!(t.probe(late), Ok(BUCKET + 1));
        assert_eq!(t.probe(mover).map(|i| i / BUCKET), Ok(3));
        // Removal clears one slot and moves nothing.
        let at = t.probe(late).expect("stored");
        t.remove(at);
        assert_eq!((t.get(late), t.key(at), t.get(mover)), (EMPTY, 0, 100));
        assert_eq!(key_of(0), ZERO_KEY);
        assert_eq!(unpack(pack(1023, 77)), (1023, 77));
        assert_eq!(FpTable::default().get(9), EMPTY);
        assert_eq!(FpTable::default().probe(9), Err(NO_SLOT));
        assert!(!FpTable::default().insert(9, 1));
    }

    /// Every key is in one of its two buckets, found, with its value; nothing else is
    /// stored.
    fn check(t: &FpTable, want: &BTreeMap<u64, u64>) {
        let mut stored = 0;
        for i in 0..t.slots() {
            let k = t.key(i);
            if k == 0 {
                continue;
            }
            stored += 1;
            let (x, y) = t.homes(k);
            assert!(i / BUCKET == x || i / BUCKET == y, "{k:x} in slot {i}");
        }
        assert_eq!(stored, want.len());
        for (k, v) in want {
            assert_eq!(t.get(*k), *v);
        }
    }

    #[test]
    fn churn_at_high_load_keeps_every_key_reachable() {
        let mut rng = crate::testrng::below(7);
        for buckets in [1usize, 2, 5, 64, 256] {
            let t = FpTable::with_slots(buckets * BUCKET);
            let mut want: BTreeMap<u64, u64> = BTreeMap::new();
            let cap = t.slots() * 9 / 10;
            let (mut full, mut grew) = (0, 0);
            for step in 0..6000u64 {
                if want.len() < cap && (want.is_empty() || rng(4) != 0) {
                    let k = key_of(rng(u64::MAX));
                    if t.insert(k, step) {
                        want.insert(k, step);
                    } else {
                        grew += 1;
                    }
                    full = full.max(want.len());
                } else {
                    let k = *want
                        .keys()
                        .nth(rng(want.len() as u64) as usize)
                        .expect("non-empty");
                    t.remove(t.probe(k).expect("a stored key is found"));
                    want.remove(&k);
                }
                if buckets <= 64 || step % 16 == 0 {
                    check(&t, &want);
                }
            }
            // Moves fill a table of 64 buckets or more to 90% without ever asking to grow.
            if buckets >= 64 {
                assert_eq!((grew, full), (0, cap));
            }
        }
    }
}
