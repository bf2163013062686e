//! A small seeded generator (xorshift64*): runs are reproducible from `--seed`.

/// The generator.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded; a zero seed is moved off zero.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    /// Next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [0, n).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    /// Uniform in [lo, hi).
    pub fn range_f(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// One of `xs`.
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
    /// A child generator (for one process).
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.next_u64())
    }
}

/// `n` bytes of word-like filler.
pub fn text(rng: &mut Rng, n: usize) -> String {
    const W: [&str; 12] = [
        "fn ", "let ", "match ", "impl ", "cargo ", "test ", "struct ", "tokio ", "error ",
        "return ", "self ", "mod ",
    ];
    let mut s = String::with_capacity(n + 8);
    while s.len() < n {
        s.push_str(W[rng.below(W.len())]);
    }
    s.truncate(n);
    s
}
