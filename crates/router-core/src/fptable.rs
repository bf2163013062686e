//! The fingerprint table: fingerprint -> packed holders, one writer, lock-free readers.
//!
//! Open addressing with linear probing over 16-byte slots (key, value), both atomics, so
//! request threads read the table the writer is changing without a lock and without
//! copying it: a persistent map path-copies on every write after each publish and keeps
//! partly filled trie nodes, which at 10M entries cost more memory than the entries.
//!
//! The rules that make unsynchronised reads sound:
//! * a key, once written into a slot, stays there until the table is replaced (a removal
//!   only writes the `EMPTY` value), so a reader that found its key in a slot never reads
//!   another key's value there, and probe chains never break;
//! * a new slot's value is stored before its key (release), and readers load the key with
//!   acquire, so a found key always comes with a value written for it;
//! * the writer replaces the whole table (a new allocation) to grow or to drop removed
//!   keys; readers holding the old one keep a consistent, slightly stale table.
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

    /// The slot holding `key`, or `Err` with the empty slot where it would go (the table
    /// is never full: the writer keeps a share of slots empty).
    #[inline]
    pub(crate) fn probe(&self, key: u64) -> Result<usize, usize> {
        let n = self.slots.len();
        if n == 0 {
            return Err(0);
        }
        let mut i = self.home(key);
        loop {
            match self.slots[i][0].load(Ordering::Acquire) {
                k if k == key => return Ok(i),
                0 => return Err(i),
                _ => i = if i + 1 == n { 0 } else { i + 1 },
            }
        }
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

    /// Writer only: writes `key` with `value` into the empty slot `i` (from `probe`).
    #[inline]
    pub(crate) fn claim(&self, i: usize, key: u64, value: u64) {
        self.slots[i][1].store(value, Ordering::Relaxed);
        self.slots[i][0].store(key, Ordering::Release);
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
        assert_eq!(key_of(0), ZERO_KEY);
        assert_eq!(unpack(pack(1023, 77)), (1023, 77));
        assert_eq!(FpTable::default().get(9), EMPTY);
    }
}
