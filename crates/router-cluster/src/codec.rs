//! One binary encoding for everything router-cluster puts on the wire or on disk: Raft
//! messages, log entries, snapshots. MessagePack with field names (self-describing, so
//! serde defaults and openraft's types work as they do with JSON), at a fraction of JSON's
//! size and cost for the arrays of fingerprints that dominate route records.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Encoding or decoding failed.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// Could not encode.
    #[error("encode: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
    /// Could not decode.
    #[error("decode: {0}")]
    Decode(#[from] rmp_serde::decode::Error),
}

/// Encodes `v`.
pub fn encode<T: Serialize + ?Sized>(v: &T) -> Result<Vec<u8>, CodecError> {
    Ok(rmp_serde::to_vec_named(v)?)
}

/// Decodes a `T`.
pub fn decode<T: DeserializeOwned>(b: &[u8]) -> Result<T, CodecError> {
    Ok(rmp_serde::from_slice(b)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use router_core::{Command, Route};

    #[test]
    fn commands_round_trip() {
        let c = Command::RecordRoutes {
            peer: 3,
            at_ms: 17,
            routes: vec![Route {
                rank: 2,
                hashes: vec![u64::MAX, 0, 12345678901234567890],
                chunk_tokens: vec![512, 512, 7],
                session: Some(9),
            }],
        };
        let b = encode(&c).unwrap();
        assert_eq!(decode::<Command>(&b).unwrap(), c);
        assert!(b.len() < serde_json::to_vec(&c).unwrap().len());
        assert!(decode::<Command>(b"\xc1garbage").is_err());
    }
}
