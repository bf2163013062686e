//! A small seeded generator (splitmix64) with the distributions the workloads need.

/// Deterministic random numbers.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    /// Next raw value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform integer in [lo, hi].
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.f64() < p
    }

    /// Log-normal with the given median and shape (sigma of the log).
    pub fn lognormal(&mut self, median: f64, sigma: f64) -> f64 {
        let u1 = self.f64().max(1e-12);
        let u2 = self.f64();
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        median * (sigma * z).exp()
    }

    /// Index in 0..n with Zipf-like skew (weight 1/(i+1)).
    pub fn zipf(&mut self, n: usize) -> usize {
        let total: f64 = (1..=n).map(|i| 1.0 / i as f64).sum();
        let mut x = self.f64() * total;
        for i in 0..n {
            x -= 1.0 / (i + 1) as f64;
            if x <= 0.0 {
                return i;
            }
        }
        n - 1
    }
}

const WORDS: [&str; 24] = [
    "fn ", "let ", "mut ", "impl ", "pub ", "use ", "self", "type", "enum", "loop", "true", "else",
    "Some", "None", "Ok()", "Err(", "&str", "u64 ", "Vec<", "map(", "iter", "into", "cfg ", "mod ",
];

/// About `tokens` engine tokens of code-like text (4 bytes per token).
pub fn text(rng: &mut Rng, tokens: usize) -> String {
    let n = tokens * 4;
    let mut s = String::with_capacity(n + 8);
    while s.len() < n {
        s.push_str(WORDS[(rng.next_u64() % WORDS.len() as u64) as usize]);
    }
    s.truncate(n);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_shaped() {
        let mut a = Rng::new(1);
        let mut b = Rng::new(1);
        assert_eq!(a.next_u64(), b.next_u64());
        let mut r = Rng::new(7);
        let mut v: Vec<f64> = (0..10_001).map(|_| r.lognormal(1500.0, 0.8)).collect();
        v.sort_by(f64::total_cmp);
        let median = v[5000];
        assert!((1300.0..1700.0).contains(&median), "{median}");
        let zero = (0..10_000).filter(|_| r.zipf(6) == 0).count();
        assert!(zero > 3000 && zero < 5000, "{zero}");
        assert_eq!(text(&mut r, 10).len(), 40);
    }
}
