//! The fingerprint table: fingerprint -> packed holders, one writer, lock-free readers.
//!
//! Open addressing with linear probing over 16-byte slots (key, value), both atomics, so
//! request threads read the table the writer is changing without a lock and without
//! copying it: a persistent map path-copies on every write after each publish and keeps
//! partly filled trie nodes, which at 10M entries cost more memory than the entries.
//!
//! The rules that make unsynchronised reads sound:
//! * a removal moves the keys after it in its run back (backward-shift deletion), so a
//!   churning model keeps no removed keys; a reader racing a move can miss the moved key,
//!   or pair a key with the value of the key moved into its slot, for that one read: a
//!   wrong hint, never a wrong memory access (everything is an atomic word);
//! * while a snapshot image reads the table's keys by slot, keys must not move: removals
//!   then only write the `EMPTY` value, and such a slot goes to the next new key whose
//!   probe passes it;
//! * a new key's value is stored with release after its key, and readers load the key
//!   with acquire, so a found key comes with a value written for it (or, as above, for a
//!   key that had the slot before);
//! * the writer replaces the whole table (a new allocation) to grow; readers holding the
//!   old one keep a consistent, slightly stale table.
//!
//! A reader can see a record half applied (some chunks credited, not yet others): the
//! result is only ever a routing hint, never replicated state.

use std::sync::atomic::{AtomicU64, Ordering};

/// The value of a slot whose key holds nothing (removed) or not yet written.
pub(crate) const EMPTY: u64 = u64::MAX;
/// Marks a value as "several holders" (the list lives elsewhere); the low bits count them.
pub(crate) const MULTI: u64 = 1 << 63;

/// Key 0 marks an empty slot, so fingerprint 0 is stored under another constant (an alias
/// with probability 2^-64, like any fingerprint collision).
const ZERO_KEY: u64 = 0x9E37_79B9_7F4A_7C15;

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

/// See the module docs.
pub(crate) struct FpTable {
    slots: Box<[[AtomicU64; 2]]>,
}

impl Default for FpTable {
    fn default() -> Self {
        FpTable::with_slots(0)
    }
}

impl Clone for FpTable {
    /// A deep copy (a cloned model must not share its writer's table).
    fn clone(&self) -> Self {
        FpTable {
            slots: self
                .slots
                .iter()
                .map(|[k, v]| {
                    [
                        AtomicU64::new(k.load(Ordering::Relaxed)),
                        AtomicU64::new(v.load(Ordering::Relaxed)),
                    ]
                })
                .collect(),
        }
    }
}

impl FpTable {
    /// An empty table of `n` slots.
    pub(crate) fn with_slots(n: usize) -> Self {
        FpTable {
            slots: (0..n)
                .map(|_| [AtomicU64::new(0), AtomicU64::new(EMPTY)])
                .collect(),
        }
    }

    /// Slots.
    pub(crate) fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Where a key's probe starts: fingerprints are uniform hashes already, so their high
    /// bits scaled to the table need no mixing and no power-of-two size.
    #[inline]
    fn home(&self, key: u64) -> usize {
        ((u128::from(key) * self.slots.len() as u128) >> 64) as usize
    }

    /// The slot holding `key`, or `Err` with the empty slot that ends its probe chain
    /// (the table is never full: the writer keeps a share of slots empty).
    #[inline]
    pub(crate) fn probe(&self, key: u64) -> Result<usize, usize> {
        let n = self.slots.len();
        if n == 0 {
            return Err(0);
        }
        let mut i = self.home(key);
        // Bounded although the table is never full: a reader racing the writer's moves
        // must not chase them forever.
        for _ in 0..n {
            match self.slots[i][0].load(Ordering::Acquire) {
                k if k == key => return Ok(i),
                0 => return Err(i),
                _ => i = if i + 1 == n { 0 } else { i + 1 },
            }
        }
        Err(i)
    }

    /// Writer only: the first slot on `key`'s probe chain whose key was removed.
    pub(crate) fn reusable(&self, key: u64) -> Option<usize> {
        let n = self.slots.len();
        let mut i = if n == 0 { return None } else { self.home(key) };
        loop {
            match self.slots[i][0].load(Ordering::Relaxed) {
                0 => return None,
                _ if self.slots[i][1].load(Ordering::Relaxed) == EMPTY => return Some(i),
                _ => i = if i + 1 == n { 0 } else { i + 1 },
            }
        }
    }

    /// Writer only: removes the key in slot `i`. With `shift`, the keys after it in its
    /// run move back to fill the hole wherever their probe chains allow (backward-shift
    /// deletion: nothing is left behind, the table never needs rebuilding for churn), each
    /// move reported to `moved(key, value, to)`; returns 1, the slot that became empty.
    /// Without, the key stays as a removed key (see the module docs); returns 0.
    pub(crate) fn remove(
        &self,
        i: usize,
        shift: bool,
        mut moved: impl FnMut(u64, u64, usize),
    ) -> usize {
        self.set(i, EMPTY);
        if !shift {
            return 0;
        }
        let n = self.slots.len();
        let (mut hole, mut j) = (i, i);
        loop {
            j = if j + 1 == n { 0 } else { j + 1 };
            let k = self.key(j);
            if k == 0 || j == i {
                break;
            }
            // It may move back unless its home lies (cyclically) after the hole.
            let back = |from: usize| if from <= j { j - from } else { j + n - from };
            if back(self.home(k)) >= back(hole) {
                let v = self.value(j);
                // Key first: a reader racing the move misses it rather than crediting
                // the key that was in the hole with its holders.
                self.slots[hole][0].store(k, Ordering::Release);
                self.slots[hole][1].store(v, Ordering::Release);
                self.set(j, EMPTY);
                moved(k, v, hole);
                hole = j;
            }
        }
        self.slots[hole][1].store(EMPTY, Ordering::Relaxed);
        self.slots[hole][0].store(0, Ordering::Release);
        1
    }

    /// The value stored for `key` (`EMPTY` when none).
    #[inline]
    pub(crate) fn get(&self, key: u64) -> u64 {
        match self.probe(key) {
            Ok(i) => self.slots[i][1].load(Ordering::Relaxed),
            Err(_) => EMPTY,
        }
    }

    /// The key in slot `i` (0 when empty).
    #[inline]
    pub(crate) fn key(&self, i: usize) -> u64 {
        self.slots[i][0].load(Ordering::Relaxed)
    }

    /// The value in slot `i`.
    #[inline]
    pub(crate) fn value(&self, i: usize) -> u64 {
        self.slots[i][1].load(Ordering::Relaxed)
    }

    /// Writer only: sets the value of an occupied slot.
    #[inline]
    pub(crate) fn set(&self, i: usize, value: u64) {
        self.slots[i][1].store(value, Ordering::Relaxed);
    }

    /// Writer only: gives the free slot `i` (from `probe`) to `key`, with `value`.
    #[inline]
    pub(crate) fn claim(&self, i: usize, key: u64, value: u64) {
        self.slots[i][0].store(key, Ordering::Release);
        self.slots[i][1].store(value, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_finds_claimed_keys_and_wraps_around() {
        let t = FpTable::with_slots(8);
        // Keys whose home is the last slot: the chain wraps to the front.
        let keys = [u64::MAX - 1, u64::MAX - 2, u64::MAX - 3];
        for (n, k) in keys.iter().enumerate() {
            let at = t.probe(*k).unwrap_err();
            t.claim(at, *k, n as u64);
        }
        for (n, k) in keys.iter().enumerate() {
            assert_eq!(t.get(*k), n as u64);
        }
        assert_eq!(t.probe(keys[1]), Ok(0));
        assert_eq!(t.get(5), EMPTY);
        // A removed key's slot goes to the next key probing past it; the chain holds.
        t.set(0, EMPTY);
        let other = u64::MAX - 4;
        assert_eq!((t.probe(other), t.reusable(other)), (Err(2), Some(0)));
        t.claim(0, other, 9);
        assert_eq!(
            (t.get(other), t.get(keys[1]), t.get(keys[2])),
            (9, EMPTY, 2)
        );
        // State: slot 7 keys[0], 0 `other`, 1 keys[2], all homed at 7. Removing slot 7
        // moves both back one slot; every chain still finds its key.
        let mut moves = Vec::new();
        assert_eq!(t.remove(7, true, |k, v, to| moves.push((k, v, to))), 1);
        assert_eq!(moves, vec![(other, 9, 7), (keys[2], 2, 0)]);
        assert_eq!(
            (t.get(other), t.get(keys[2]), t.get(keys[0])),
            (9, 2, EMPTY)
        );
        assert_eq!((t.key(1), t.key(2)), (0, 0));
        // A key at its home does not move into a hole before it.
        let home2 = (2u128 << 64).div_ceil(8) as u64;
        assert_eq!(t.home(home2), 2);
        t.claim(1, keys[1], 5);
        t.claim(2, home2, 6);
        assert_eq!(t.remove(1, true, |_, _, _| panic!("nothing may move")), 1);
        assert_eq!((t.get(home2), t.key(1)), (6, 0));
        // Without shifting the key stays, removed.
        assert_eq!(t.remove(2, false, |_, _, _| {}), 0);
        assert_eq!((t.key(2), t.get(home2)), (home2, EMPTY));
        assert_eq!(key_of(0), ZERO_KEY);
        assert_eq!(unpack(pack(1023, 77)), (1023, 77));
        assert_eq!(FpTable::default().get(9), EMPTY);
    }
}
