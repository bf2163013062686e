//! A per-rank prefix KV cache like vLLM's: prompts are cut into blocks of `block_size`
//! tokens, each full block is identified by a hash chained over the blocks before it, and
//! blocks are evicted least-recently-used once the rank holds more than its capacity.

use std::collections::{BTreeMap, HashMap};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Hashes of the full blocks of `tokens`, each chained to the previous one.
pub fn block_hashes(tokens: &[u32], block_size: usize) -> Vec<u64> {
    let mut prev = 0x76_6c_6c_6d_u64; // "vllm"
    let mut out = Vec::with_capacity(tokens.len() / block_size.max(1));
    let mut buf = Vec::with_capacity(block_size * 4);
    for block in tokens.chunks_exact(block_size.max(1)) {
        buf.clear();
        for t in block {
            buf.extend_from_slice(&t.to_le_bytes());
        }
        prev = xxh3_64_with_seed(&buf, prev);
        out.push(prev);
    }
    out
}

/// One rank's cache.
#[derive(Debug, Clone)]
pub struct PrefixCache {
    block_size: usize,
    capacity_blocks: usize,
    by_hash: HashMap<u64, u64>,
    by_tick: BTreeMap<u64, u64>,
    tick: u64,
    /// Prompt tokens looked up.
    pub queries: u64,
    /// Prompt tokens found cached.
    pub hits: u64,
}

impl PrefixCache {
    /// A cache of `capacity_tokens` (rounded down to whole blocks).
    pub fn new(capacity_tokens: usize, block_size: usize) -> Self {
        PrefixCache {
            block_size: block_size.max(1),
            capacity_blocks: capacity_tokens / block_size.max(1),
            by_hash: HashMap::new(),
            by_tick: BTreeMap::new(),
            tick: 0,
            queries: 0,
            hits: 0,
        }
    }

    /// Blocks held.
    pub fn blocks(&self) -> usize {
        self.by_hash.len()
    }

    /// Fraction of capacity in use.
    pub fn usage(&self) -> f64 {
        if self.capacity_blocks == 0 {
            return 0.0;
        }
        self.by_hash.len() as f64 / self.capacity_blocks as f64
    }

    /// Looks a prompt up and admits its blocks. Returns the cached token count: the leading
    /// run of blocks already present, never the whole prompt (the engine must compute at
    /// least the last token, as vLLM does).
    pub fn admit(&mut self, tokens: &[u32]) -> usize {
        let hashes = block_hashes(tokens, self.block_size);
        let mut hit_blocks = 0;
        for h in &hashes {
            if self.by_hash.contains_key(h) {
                hit_blocks += 1;
            } else {
                break;
            }
        }
        let mut cached = hit_blocks * self.block_size;
        if cached >= tokens.len() && cached > 0 {
            cached -= self.block_size;
        }
        self.queries += tokens.len() as u64;
        self.hits += cached as u64;
        // Touch last-to-first, so the head of the prefix is the most recent and the tail
        // is evicted first (vLLM frees a request's blocks in reverse order).
        for h in hashes.iter().rev() {
            self.tick += 1;
            if let Some(old) = self.by_hash.insert(*h, self.tick) {
                self.by_tick.remove(&old);
            }
            self.by_tick.insert(self.tick, *h);
        }
        while self.by_hash.len() > self.capacity_blocks {
            let Some((_, h)) = self.by_tick.pop_first() else {
                break;
            };
            self.by_hash.remove(&h);
        }
        cached
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(seed: u32, n: usize) -> Vec<u32> {
        (0..n as u32)
            .map(|i| i.wrapping_mul(2654435761).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn hits_grow_with_shared_prefix_and_respect_block_boundaries() {
        let mut c = PrefixCache::new(10_000, 16);
        let a = toks(1, 100); // 6 full blocks + 4 tokens
        assert_eq!(c.admit(&a), 0);
        let mut b = a.clone();
        b.extend(toks(2, 50));
        assert_eq!(c.admit(&b), 96, "6 full blocks of a are reused");
        // Diverging inside block 3: only blocks 0..3 hit.
        let mut d = a[..40].to_vec();
        d.extend(toks(3, 60));
        assert_eq!(c.admit(&d), 32);
        // The same prompt again: all but the last block counts (one token must be computed).
        let e = toks(9, 64);
        c.admit(&e);
        assert_eq!(c.admit(&e), 48);
        assert!(c.hits > 0 && c.queries > c.hits);
    }

    #[test]
    fn lru_evicts_at_capacity_tail_first() {
        let mut c = PrefixCache::new(8 * 16, 16);
        let a = toks(1, 6 * 16);
        let b = toks(2, 6 * 16);
        c.admit(&a);
        c.admit(&b);
        assert_eq!(c.blocks(), 8);
        // b is newest: all 6 of b's blocks stay; a keeps its 2 first blocks.
        let mut b2 = b.clone();
        b2.push(1);
        assert_eq!(c.admit(&b2), 96);
        let mut a2 = a.clone();
        a2.push(1);
        assert_eq!(c.admit(&a2), 32);
        assert!(c.usage() <= 1.0);
    }

    #[test]
    fn zero_capacity_caches_nothing() {
        let mut c = PrefixCache::new(0, 16);
        let a = toks(1, 64);
        c.admit(&a);
        assert_eq!(c.admit(&a), 0);
    }
}
