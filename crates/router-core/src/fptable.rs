//! The fingerprint table: fingerprint -> packed holders, one writer, lock-free readers.
//!
//! Open addressing over buckets of four 16-byte slots (key, value), one cache line each,
//! all atomics, so request threads read the table the writer is changing without a lock
//! and without copying it: a persistent map path-copies on every write after each publish
//! and keeps partly filled trie nodes, which at 10M entries cost more memory than the
//! entries.
//!
//! A key lives in the first bucket from its home with a free slot. Each bucket counts the
//! keys that passed it on the way to a later bucket (`over`); a probe stops at the first
//! bucket that no key passed, so it reads one cache line, or two, at the loads the writer
//! keeps. A removal moves back a key that passed the hole's bucket, then one into the hole
//! that left, and so on: every key stays in the first bucket from its home that had room,
//! as in a table filled afresh. (Without the moves a churning table's displaced keys stay
//! displaced: probes walked ten buckets on average where a fresh table's walk two.) Keys
//! move only within the table: the LRU nodes name their fingerprint by key, not by slot.
//! A pass count sticks at its maximum (probes then only walk further).
//!
//! The rules that make unsynchronised reads sound:
//! * a new key's passes are counted before its key is stored, its value is stored with
//!   release after its key, and readers load the key with acquire, so a found key comes
//!   with a value written for it;
//! * a moved key is written to its new slot before its old slot is cleared, and a reader
//!   checks that the slot still holds the key after reading its value; racing a move or a
//!   removal, a reader can miss a key, or pair it with a value written an instant before
//!   or after, for that one read: a wrong hint, never a wrong memory access (everything is
//!   an atomic word);
//! * the writer replaces the whole table (a new allocation) to grow; readers holding the
//!   old one keep a consistent, slightly stale table.
//!
//! A reader can see a record half applied (some chunks credited, not yet others): the
//! result is only ever a routing hint, never replicated state.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// The value of a slot whose key holds nothing (removed) or not yet written.
pub(crate) const EMPTY: u64 = u64::MAX;
/// Marks a value as "several holders" (the list lives elsewhere); the low bits count them.
pub(crate) const MULTI: u64 = 1 << 63;

/// Key 0 marks an empty slot, so fingerprint 0 is stored under another constant (an alias
/// with probability 2^-64, like any fingerprint collision).
const ZERO_KEY: u64 = 0x9E37_79B9_7F4A_7C15;

/// Slots per bucket: four 16-byte slots fill one 64-byte cache line.
pub(crate) const BUCKET: usize = 4;

/// Where a pass count sticks: it is no longer counted down, so probes walk on there.
const STUCK: u8 = u8::MAX;

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
    /// Per bucket: keys stored in a later bucket whose probe passed this one.
    over: Box<[AtomicU8]>,
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
            over: self
                .over
                .iter()
                .map(|o| AtomicU8::new(o.load(Ordering::Relaxed)))
                .collect(),
        }
    }
}

impl FpTable {
    /// An empty table of at least `n` slots (whole buckets).
    pub(crate) fn with_slots(n: usize) -> Self {
        let b = n.div_ceil(BUCKET);
        FpTable {
            buckets: (0..b).map(|_| Bucket::empty()).collect(),
            over: (0..b).map(|_| AtomicU8::new(0)).collect(),
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

    /// The bucket a key's probe starts at: fingerprints are uniform hashes already, so
    /// their high bits scaled to the table need no mixing and no power-of-two size.
    #[inline]
    fn home(&self, key: u64) -> usize {
        ((u128::from(key) * self.buckets.len() as u128) >> 64) as usize
    }

    #[inline]
    fn next(&self, b: usize) -> usize {
        if b + 1 == self.buckets.len() {
            0
        } else {
            b + 1
        }
    }

    /// The slot holding `key`, if any.
    #[inline]
    fn find(&self, key: u64) -> Option<usize> {
        let n = self.buckets.len();
        if n == 0 {
            return None;
        }
        let mut b = self.home(key);
        // Bounded: a reader racing the writer must not walk forever.
        for _ in 0..n {
            for (i, s) in self.buckets[b].0.iter().enumerate() {
                if s[0].load(Ordering::Acquire) == key {
                    return Some(b * BUCKET + i);
                }
            }
            if self.over[b].load(Ordering::Acquire) == 0 {
                return None;
            }
            b = self.next(b);
        }
        None
    }

    /// Writer only: the slot holding `key`, or `Err` with the free slot it would take
    /// (the first from its home; the table is never full: the writer keeps a share of
    /// slots free).
    #[inline]
    pub(crate) fn probe(&self, key: u64) -> Result<usize, usize> {
        let n = self.buckets.len();
        if n == 0 {
            return Err(0);
        }
        let mut b = self.home(key);
        let mut free = None;
        let mut searching = true;
        for _ in 0..n {
            for (i, s) in self.buckets[b].0.iter().enumerate() {
                let k = s[0].load(Ordering::Relaxed);
                if searching && k == key {
                    return Ok(b * BUCKET + i);
                }
                if k == 0 && free.is_none() {
                    free = Some(b * BUCKET + i);
                }
            }
            searching = searching && self.over[b].load(Ordering::Relaxed) != 0;
            match free {
                Some(at) if !searching => return Err(at),
                _ => b = self.next(b),
            }
        }
        Err(free.unwrap_or(0))
    }

    /// Reads the home bucket of each key, so that probes of them that follow find their
    /// cache lines loaded: these reads are independent of each other, so the CPU overlaps
    /// their cache misses, where a probe waits for one before the next. Returns a value
    /// for `std::hint::black_box`, which keeps the reads.
    #[inline]
    pub(crate) fn warm(&self, keys: impl Iterator<Item = u64>) -> u64 {
        if self.buckets.is_empty() {
            return 0;
        }
        keys.fold(0, |acc, k| {
            acc ^ self.buckets[self.home(k)].0[0][0].load(Ordering::Relaxed)
        })
    }

    /// Applies `f` to the pass counts of the buckets from `key`'s home up to the bucket of
    /// slot `at` (not included).
    fn passes(&self, key: u64, at: usize, f: impl Fn(u8) -> u8) {
        let (mut b, to) = (self.home(key), at / BUCKET);
        while b != to {
            let c = self.over[b].load(Ordering::Relaxed);
            if c != STUCK {
                self.over[b].store(f(c), Ordering::Release);
            }
            b = self.next(b);
        }
    }

    /// Writer only: removes the key in slot `i`, and moves back the keys that passed its
    /// bucket into the holes (see the module docs).
    pub(crate) fn remove(&self, i: usize) {
        let key = self.key(i);
        if key == 0 {
            return;
        }
        let s = self.slot(i);
        s[1].store(EMPTY, Ordering::Relaxed);
        s[0].store(0, Ordering::Release);
        self.passes(key, i, |c| c - 1);
        let n = self.buckets.len();
        let mut hole = i;
        // Each move fills one hole and leaves one further on: bounded by the table.
        for _ in 0..n {
            let b = hole / BUCKET;
            if self.over[b].load(Ordering::Relaxed) == 0 {
                return;
            }
            let Some(from) = self.passed(b) else {
                return;
            };
            let (k, v) = (self.key(from), self.value(from));
            // Into the hole first: a reader racing the move finds the key at one place,
            // or misses it for that read.
            let h = self.slot(hole);
            h[0].store(k, Ordering::Release);
            h[1].store(v, Ordering::Release);
            let f = self.slot(from);
            f[1].store(EMPTY, Ordering::Relaxed);
            f[0].store(0, Ordering::Release);
            // It no longer passes the buckets from the hole's up to its old one.
            let (mut c, to) = (b, from / BUCKET);
            while c != to {
                let o = self.over[c].load(Ordering::Relaxed);
                if o != STUCK {
                    self.over[c].store(o - 1, Ordering::Release);
                }
                c = self.next(c);
            }
            hole = from;
        }
    }

    /// The slot of the nearest key after bucket `b` whose probe passed `b`, if any.
    fn passed(&self, b: usize) -> Option<usize> {
        let n = self.buckets.len();
        let dist = |from: usize, to: usize| if from <= to { to - from } else { to + n - from };
        let mut c = b;
        // Every bucket between `b` and such a key was passed too: the walk ends where
        // one was not.
        while self.over[c].load(Ordering::Relaxed) != 0 {
            c = self.next(c);
            if c == b {
                return None;
            }
            for (j, s) in self.buckets[c].0.iter().enumerate() {
                let k = s[0].load(Ordering::Relaxed);
                if k != 0 && dist(b, c) <= dist(self.home(k), c) {
                    return Some(c * BUCKET + j);
                }
            }
        }
        None
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

    /// Writer only: gives the free slot `i` (from `probe`) to `key`, with `value`.
    #[inline]
    pub(crate) fn claim(&self, i: usize, key: u64, value: u64) {
        self.passes(key, i, |c| c + 1);
        let s = self.slot(i);
        s[0].store(key, Ordering::Release);
        s[1].store(value, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A key whose home is bucket `b` of a table of `n` buckets (the `j`th such key).
    fn homed(b: usize, n: usize, j: u64) -> u64 {
        ((b as u128) << 64).div_ceil(n as u128) as u64 + 1 + j
    }

    #[test]
    fn probes_pass_full_buckets_wrap_around_and_stop_where_nothing_passed() {
        let t = FpTable::with_slots(4 * BUCKET);
        let n = 4;
        // Six keys homed in the last bucket: two spill over into bucket 0 (wrapping).
        let keys: Vec<u64> = (0..6).map(|j| homed(3, n, j)).collect();
        for (v, k) in keys.iter().enumerate() {
            assert_eq!(t.home(*k), 3);
            let at = t.probe(*k).unwrap_err();
            t.claim(at, *k, v as u64);
        }
        for (v, k) in keys.iter().enumerate() {
            assert_eq!(t.get(*k), v as u64);
        }
        assert_eq!(t.probe(keys[5]), Ok(1));
        assert_eq!(t.over[3].load(Ordering::Relaxed), 2);
        assert_eq!(t.over[0].load(Ordering::Relaxed), 0);
        // A key homed in bucket 1 absent: the probe stops there, its free slot is there.
        let other = homed(1, n, 0);
        assert_eq!(t.probe(other), Err(BUCKET));
        assert_eq!(t.get(other), EMPTY);
        // A key homed in the full bucket 3 takes bucket 0's next free slot.
        let more = homed(3, n, 9);
        assert_eq!(t.probe(more), Err(2));
        // Removing a key from the full bucket 3 pulls the nearest key that passed it
        // back into the hole (from bucket 0); the hole it leaves is the next key's.
        t.remove(3 * BUCKET + 1);
        assert_eq!(t.probe(keys[4]), Ok(3 * BUCKET + 1));
        assert_eq!(
            (t.get(keys[1]), t.get(keys[4]), t.get(keys[5])),
            (EMPTY, 4, 5)
        );
        assert_eq!(t.over[3].load(Ordering::Relaxed), 1);
        assert_eq!(t.probe(more), Err(0));
        // The last spilled key removed: nothing passed bucket 3 any more, probes stop there.
        t.remove(1);
        assert_eq!(t.over[3].load(Ordering::Relaxed), 0);
        assert_eq!(t.get(keys[0]), 0);
        assert_eq!(t.probe(keys[5]), Err(0));
        assert_eq!((t.get(keys[2]), t.get(keys[3]), t.get(keys[4])), (2, 3, 4));
        assert_eq!(key_of(0), ZERO_KEY);
        assert_eq!(unpack(pack(1023, 77)), (1023, 77));
        assert_eq!(FpTable::default().get(9), EMPTY);
        assert_eq!(FpTable::default().probe(9), Err(0));
    }

    /// Every key is found where its probe reaches it, the pass counts are exact, and no
    /// key sits past a bucket with a free slot on its way (what removals' moves keep).
    fn check(t: &FpTable, want: &BTreeMap<u64, u64>) {
        let n = t.buckets.len();
        let mut truth = vec![0u32; n];
        for (c, bucket) in t.buckets.iter().enumerate() {
            for s in &bucket.0 {
                let k = s[0].load(Ordering::Relaxed);
                if k == 0 {
                    continue;
                }
                let mut b = t.home(k);
                while b != c {
                    truth[b] += 1;
                    let free = t.buckets[b]
                        .0
                        .iter()
                        .any(|s| s[0].load(Ordering::Relaxed) == 0);
                    assert!(!free, "key {k:x} in bucket {c} passed bucket {b} with room");
                    b = t.next(b);
                }
            }
        }
        for (b, want) in truth.iter().enumerate() {
            assert_eq!(
                u32::from(t.over[b].load(Ordering::Relaxed)),
                *want,
                "bucket {b}"
            );
        }
        let stored = (0..t.slots()).filter(|i| t.key(*i) != 0).count();
        assert_eq!(stored, want.len());
        for (k, v) in want {
            assert_eq!(t.get(*k), *v);
        }
    }

    #[test]
    fn churn_keeps_every_key_reachable_and_the_table_as_if_filled_afresh() {
        let mut rng = crate::testrng::below(7);
        for buckets in [1usize, 2, 5, 64] {
            let t = FpTable::with_slots(buckets * BUCKET);
            let mut want: BTreeMap<u64, u64> = BTreeMap::new();
            let cap = t.slots() * 17 / 20;
            for step in 0..4000u64 {
                let insert = want.len() < cap.max(1) && (want.is_empty() || rng(2) == 0);
                if insert {
                    // Small keys collide on few homes: long spills, wrap-around.
                    let k = key_of(rng(4) + rng(buckets as u64) * (u64::MAX / buckets as u64));
                    match t.probe(k) {
                        Ok(i) => assert!(want.contains_key(&k) && t.key(i) == k),
                        Err(i) => {
                            assert!(!want.contains_key(&k) && t.key(i) == 0);
                            t.claim(i, k, step);
                            want.insert(k, step);
                        }
                    }
                } else {
                    let k = *want
                        .keys()
                        .nth(rng(want.len() as u64) as usize)
                        .expect("non-empty");
                    let i = t.probe(k).expect("a stored key is found");
                    want.remove(&k);
                    t.remove(i);
                }
                check(&t, &want);
            }
        }
    }

    #[test]
    fn a_stuck_pass_count_only_makes_probes_walk_further() {
        let t = FpTable::with_slots(2 * BUCKET);
        t.over[0].store(STUCK, Ordering::Relaxed);
        let k = homed(0, 2, 0);
        // Nothing stored: the probe walks past the stuck bucket, finds no key, and the
        // free slot is still the first one from home.
        assert_eq!(t.probe(k), Err(0));
        for j in 0..BUCKET as u64 + 1 {
            let k = homed(0, 2, j);
            let at = t.probe(k).unwrap_err();
            t.claim(at, k, j);
        }
        assert_eq!(t.over[0].load(Ordering::Relaxed), STUCK);
        t.remove(BUCKET);
        assert_eq!(t.over[0].load(Ordering::Relaxed), STUCK);
        assert_eq!(t.get(homed(0, 2, 2)), 2);
    }
}
