//! Serde forms for the number lists in route records. Every Raft entry carries ~40k
//! fingerprints, encoded and decoded several times on its way through the log and the
//! network: in a binary format they are written as one byte string of little-endian words
//! (a copy, not a variable-length integer per number, which profiles showed as a fifth of
//! the replication cost). Human-readable formats (JSON) keep lists of numbers. Either form
//! is read back, so entries written as lists (earlier versions) still decode.

use serde::de::{Error, SeqAccess, Visitor};
use serde::{Deserializer, Serializer};
use std::marker::PhantomData;

/// A fixed-width little-endian number.
pub trait Word: Copy + serde::Serialize + for<'de> serde::Deserialize<'de> {
    /// Bytes per number.
    const SIZE: usize;
    /// Appends the number's bytes.
    fn put(self, out: &mut Vec<u8>);
    /// The number in `b` (`SIZE` bytes).
    fn get(b: &[u8]) -> Self;
}

impl Word for u64 {
    const SIZE: usize = 8;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn get(b: &[u8]) -> Self {
        u64::from_le_bytes(b.try_into().unwrap_or([0; 8]))
    }
}

impl Word for u32 {
    const SIZE: usize = 4;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn get(b: &[u8]) -> Self {
        u32::from_le_bytes(b.try_into().unwrap_or([0; 4]))
    }
}

/// `#[serde(serialize_with)]`: bytes in binary formats, a list in readable ones.
#[allow(clippy::ptr_arg)] // serde passes the field itself
pub fn serialize<W: Word, S: Serializer>(v: &Vec<W>, s: S) -> Result<S::Ok, S::Error> {
    if s.is_human_readable() {
        return s.collect_seq(v);
    }
    let mut b = Vec::with_capacity(v.len() * W::SIZE);
    v.iter().for_each(|w| w.put(&mut b));
    s.serialize_bytes(&b)
}

/// `#[serde(deserialize_with)]`: either form.
pub fn deserialize<'de, W: Word, D: Deserializer<'de>>(d: D) -> Result<Vec<W>, D::Error> {
    d.deserialize_any(Words(PhantomData))
}

struct Words<W>(PhantomData<W>);

impl<'de, W: Word> Visitor<'de> for Words<W> {
    type Value = Vec<W>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(
            f,
            "a list of numbers or a byte string of {}-byte words",
            W::SIZE
        )
    }

    fn visit_bytes<E: Error>(self, b: &[u8]) -> Result<Vec<W>, E> {
        if !b.len().is_multiple_of(W::SIZE) {
            return Err(E::invalid_length(b.len(), &self));
        }
        Ok(b.chunks_exact(W::SIZE).map(W::get).collect())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<W>, A::Error> {
        // Bounded by what the input holds, not by what it claims.
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
        while let Some(w) = seq.next_element()? {
            out.push(w);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use crate::Route;

    fn route() -> Route {
        Route {
            rank: 7,
            hashes: vec![0, 1, u64::MAX, 0x0123_4567_89ab_cdef],
            chunk_tokens: vec![512, 0, u32::MAX, 3],
            session: Some(5),
        }
    }

    #[test]
    fn binary_is_bytes_readable_is_numbers_both_read_back() {
        let r = route();
        let bin = rmp_serde::to_vec_named(&r).unwrap();
        assert_eq!(rmp_serde::from_slice::<Route>(&bin).unwrap(), r);
        let json = serde_json::to_string(&r).unwrap();
        assert!(
            json.contains("\"hashes\":[0,1,18446744073709551615,"),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<Route>(&json).unwrap(), r);
        // What earlier versions wrote (lists of numbers in MessagePack) still decodes.
        #[derive(serde::Serialize)]
        struct Old<'a> {
            rank: u32,
            hashes: &'a [u64],
            chunk_tokens: &'a [u32],
            session: Option<u64>,
        }
        let old = rmp_serde::to_vec_named(&Old {
            rank: r.rank,
            hashes: &r.hashes,
            chunk_tokens: &r.chunk_tokens,
            session: r.session,
        })
        .unwrap();
        // The new form holds the words as they are, one byte string per list.
        let words: Vec<u8> = r.hashes.iter().flat_map(|h| h.to_le_bytes()).collect();
        assert!(bin
            .windows(34)
            .any(|w| w[..2] == [0xc4, 32] && w[2..] == words[..]));
        assert!(!old.windows(32).any(|w| w == words));
        assert_eq!(rmp_serde::from_slice::<Route>(&old).unwrap(), r);
        // A byte string that is not whole words is refused.
        let mut bad = bin.clone();
        let at = bad.windows(2).position(|w| w == [0xc4, 32]).unwrap();
        bad[at + 1] = 31;
        assert!(rmp_serde::from_slice::<Route>(&bad).is_err());
    }
}
