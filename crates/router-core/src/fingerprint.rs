//! Chained prefix fingerprints.
//!
//! The canonical bytes are cut into fixed-size chunks; chunk `i`'s fingerprint is
//! `xxh3_64_with_seed(chunk_i, fp_{i-1})` with `fp_{-1}` derived from the format version and
//! the model name. So `fp_i` identifies the whole prefix up to and including chunk `i`, and
//! two prompts share fingerprints exactly as far as they share chunks. A trailing partial
//! chunk gets a fingerprint too (it matches an identical re-sent prompt, e.g. pass@k).
//!
//! xxh3 is specified byte-for-byte and we feed it explicit little-endian values, so the
//! fingerprints are the same on every architecture and release (golden vectors below).

use crate::canon::{canonical, CanonError, Endpoint, Sink, FORMAT_VERSION};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// How prompts are cut. `bytes_per_token` converts bytes to the engine's tokens for the
/// cache model: English text and code average about 4 bytes per BPE token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FingerprintConfig {
    /// Chunk size in canonical bytes (default 2048, about 512 tokens).
    pub chunk_bytes: u32,
    /// Only this many leading bytes are fingerprinted (default 2 MiB).
    pub max_prefix_bytes: u32,
    /// Canonical bytes per engine token, for converting chunk sizes to tokens (default 4).
    pub bytes_per_token: u32,
}

impl Default for FingerprintConfig {
    fn default() -> Self {
        FingerprintConfig {
            chunk_bytes: 2048,
            max_prefix_bytes: 2 << 20,
            bytes_per_token: 4,
        }
    }
}

/// The fingerprints of one prompt, with the size of what each one covers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fingerprints {
    /// `hashes[i]` identifies the prefix made of chunks `0..=i`.
    pub hashes: Vec<u64>,
    /// Estimated engine tokens of chunk `i` alone.
    pub chunk_tokens: Vec<u32>,
    /// Estimated engine tokens of the whole prompt (including any bytes past the limit).
    pub total_tokens: u64,
}

impl Fingerprints {
    /// Tokens covered by the first `chunks` fingerprints.
    pub fn tokens_of_prefix(&self, chunks: usize) -> u64 {
        self.chunk_tokens[..chunks.min(self.chunk_tokens.len())]
            .iter()
            .map(|t| u64::from(*t))
            .sum()
    }
}

/// The chain seed: a different model never shares a prefix.
pub fn seed(model: &str) -> u64 {
    let mut s = Vec::with_capacity(model.len() + 16);
    s.extend_from_slice(b"rtr-fp");
    s.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    s.extend_from_slice(model.as_bytes());
    xxh3_64(&s)
}

impl FingerprintConfig {
    /// Fingerprints `bytes` for `model`.
    pub fn fingerprint(&self, model: &str, bytes: &[u8]) -> Fingerprints {
        let mut c = self.chain(model);
        c.put(bytes);
        c.finish()
    }

    /// A chain that fingerprints bytes fed to it in pieces, as if they were one slice.
    pub(crate) fn chain(&self, model: &str) -> Chain {
        let chunk = self.chunk_bytes.max(1) as usize;
        Chain {
            chunk,
            limit: self.max_prefix_bytes as usize,
            bpt: u64::from(self.bytes_per_token.max(1)),
            seen: 0,
            buf: Vec::with_capacity(chunk),
            prev: seed(model),
            out: Fingerprints {
                hashes: Vec::with_capacity(32),
                chunk_tokens: Vec::with_capacity(32),
                total_tokens: 0,
            },
        }
    }

    /// Checks the values make sense.
    pub fn validate(self) -> Result<Self, String> {
        if self.chunk_bytes < 64 {
            return Err("chunk_bytes must be at least 64".into());
        }
        if self.max_prefix_bytes < self.chunk_bytes {
            return Err("max_prefix_bytes must be at least chunk_bytes".into());
        }
        if self.bytes_per_token == 0 {
            return Err("bytes_per_token must be positive".into());
        }
        Ok(self)
    }
}

/// Cuts a byte stream into chunks and chains their hashes. Whole chunks inside one piece
/// are hashed where they lie; only chunks that straddle pieces are copied.
pub(crate) struct Chain {
    chunk: usize,
    limit: usize,
    bpt: u64,
    /// Bytes fed so far (including any past the limit).
    seen: usize,
    /// The current partial chunk.
    buf: Vec<u8>,
    prev: u64,
    out: Fingerprints,
}

impl Chain {
    fn hash(&mut self, c: &[u8]) {
        self.prev = xxh3_64_with_seed(c, self.prev);
        self.out.hashes.push(self.prev);
        self.out
            .chunk_tokens
            .push((c.len() as u64).div_ceil(self.bpt) as u32);
    }

    /// The fingerprints of everything fed (a trailing partial chunk gets one too).
    pub(crate) fn finish(mut self) -> Fingerprints {
        if !self.buf.is_empty() {
            let buf = std::mem::take(&mut self.buf);
            self.hash(&buf);
        }
        self.out.total_tokens = (self.seen as u64).div_ceil(self.bpt);
        self.out
    }
}

impl Sink for Chain {
    fn put(&mut self, bytes: &[u8]) {
        let before = self.seen;
        self.seen += bytes.len();
        if before >= self.limit {
            return;
        }
        let mut b = &bytes[..bytes.len().min(self.limit - before)];
        if !self.buf.is_empty() {
            let take = (self.chunk - self.buf.len()).min(b.len());
            self.buf.extend_from_slice(&b[..take]);
            b = &b[take..];
            if self.buf.len() < self.chunk {
                return;
            }
            let buf = std::mem::take(&mut self.buf);
            self.hash(&buf);
            self.buf = buf;
            self.buf.clear();
        }
        while b.len() >= self.chunk {
            let (c, rest) = b.split_at(self.chunk);
            self.hash(c);
            b = rest;
        }
        self.buf.extend_from_slice(b);
    }
}

/// What the request path needs from a body: the same as [`CanonicalPrompt`] but with the
/// fingerprints in place of the canonical bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptPrint {
    /// Model name (the fingerprint seed).
    pub model: String,
    /// Fingerprints of the canonical bytes.
    pub fingerprints: Fingerprints,
    /// `session_params.session_id` from the body, when present.
    pub session_id: Option<String>,
    /// Whether the client asked for a streamed response.
    pub stream: bool,
}

/// Canonicalizes and fingerprints in one pass, hashing the canonical bytes as they are
/// produced instead of collecting them. Equal to `cfg.fingerprint(model, canonical bytes)`.
pub fn fingerprint_json(
    endpoint: Endpoint,
    body: &[u8],
    cfg: &FingerprintConfig,
) -> Result<PromptPrint, CanonError> {
    let (head, chain) = canonical(endpoint, body, |model| cfg.chain(model))?;
    Ok(PromptPrint {
        model: head.model,
        fingerprints: chain.finish(),
        session_id: head.session_id,
        stream: head.stream,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canon::canonicalize;

    #[test]
    fn chain_property() {
        let cfg = FingerprintConfig {
            chunk_bytes: 64,
            ..Default::default()
        };
        let a: Vec<u8> = (0..200u32).map(|i| (i % 251) as u8).collect();
        let mut b = a[..128].to_vec();
        b.extend_from_slice(&[9; 100]);
        let fa = cfg.fingerprint("m", &a);
        let fb = cfg.fingerprint("m", &b);
        assert_eq!(fa.hashes.len(), 4);
        assert_eq!(fa.hashes[..2], fb.hashes[..2]);
        assert_ne!(fa.hashes[2], fb.hashes[2]);
        assert_eq!(fa.chunk_tokens, vec![16, 16, 16, 2]);
        assert_ne!(
            cfg.fingerprint("m", &a).hashes[0],
            cfg.fingerprint("other", &a).hashes[0]
        );
    }

    #[test]
    fn limit_bounds_work() {
        let cfg = FingerprintConfig {
            chunk_bytes: 64,
            max_prefix_bytes: 128,
            bytes_per_token: 4,
        };
        let f = cfg.fingerprint("m", &[1u8; 1000]);
        assert_eq!(f.hashes.len(), 2);
        assert_eq!(f.total_tokens, 250);
    }

    /// Golden vectors: these values are a compatibility promise (replicated maps and
    /// mixed-version clusters depend on them). Change them only with FORMAT_VERSION.
    #[test]
    fn golden_vectors() {
        let body = serde_json::json!({
            "model": "qwen3-32b",
            "messages": [
                {"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "List the files."}
            ],
            "tools": [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]
        });
        let c = canonicalize(Endpoint::Chat, &body).unwrap();
        let cfg = FingerprintConfig {
            chunk_bytes: 64,
            ..Default::default()
        };
        let f = cfg.fingerprint(&c.model, &c.bytes);
        assert_eq!(c.bytes.len(), GOLDEN_LEN, "canonical length changed");
        assert_eq!(seed("qwen3-32b"), GOLDEN_SEED, "seed changed");
        assert_eq!(f.hashes, GOLDEN_HASHES, "fingerprints changed");
    }

    const GOLDEN_LEN: usize = 166;
    const GOLDEN_SEED: u64 = 0x8e77_d137_277e_2b99;
    const GOLDEN_HASHES: [u64; 3] = [
        0x054a_4c10_78fd_defa,
        0xc81f_10e2_608c_c3f5,
        0xc5be_0500_8f43_ddbf,
    ];
}
