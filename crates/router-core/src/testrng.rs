//! A seeded xorshift for the randomized unit tests: same seed, same cases.

/// Returns a generator of numbers below its argument (0 when the argument is 0 or 1).
pub(crate) fn below(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut x = seed | 1;
    move |n| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n.max(1)
    }
}
