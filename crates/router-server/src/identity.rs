//! Who this router is on the wire, so that it never becomes its own upstream: every request
//! it forwards carries its id in `x-llm-router`, a request that arrives carrying it again
//! is refused (`508`), and `/health` answers with it so a join of a URL that is this router
//! (or a peer of its cluster) can be refused before it is made.

use http::{HeaderMap, HeaderValue};
use xxhash_rust::xxh3::xxh3_64;

/// The header that carries router ids.
pub const HEADER: &str = "x-llm-router";
/// Routers a request may pass through before it is refused as a loop.
pub const MAX_HOPS: usize = 8;

/// This router's id: one per cluster (every peer forwards as one router), one per
/// process otherwise. A hash, so it tells nothing about the cluster's name.
#[derive(Debug, Clone)]
pub struct RouterId(HeaderValue, Option<HeaderValue>);

/// The header naming the Raft peer that routed a forwarded request (cluster mode), and
/// the one carrying when it did (Unix milliseconds): engines may log them, and the Jepsen
/// suite checks with them that no peer routes to a server after confirming its leave.
pub const PEER_HEADER: &str = "x-router-peer";
/// See [`PEER_HEADER`].
pub const ROUTED_AT_HEADER: &str = "x-router-routed-at";

impl RouterId {
    /// The id of peer `node` of cluster `cluster_id`, or of a single router (`None`).
    pub fn new(cluster: Option<(&str, u64)>) -> RouterId {
        let cluster_id = cluster.map(|c| c.0);
        let h = match cluster_id {
            Some(c) => xxh3_64(format!("llm-router-cluster:{c}").as_bytes()),
            None => {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos());
                xxh3_64(format!("llm-router:{}:{nanos}", std::process::id()).as_bytes())
            }
        };
        RouterId(
            HeaderValue::from_str(&format!("{h:016x}")).unwrap_or(HeaderValue::from_static("0")),
            cluster.map(|(_, node)| HeaderValue::from(node)),
        )
    }

    /// This peer's node id as a header value (cluster mode only).
    pub fn peer(&self) -> Option<&HeaderValue> {
        self.1.as_ref()
    }

    /// The header value.
    pub fn header(&self) -> &HeaderValue {
        &self.0
    }

    /// Whether `headers` (a response's, or a request's) name this router.
    pub fn is_in(&self, headers: &HeaderMap) -> bool {
        ids(headers).any(|v| v == self.0.as_bytes())
    }
}

fn ids(headers: &HeaderMap) -> impl Iterator<Item = &[u8]> {
    headers
        .get_all(HEADER)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(|v| v.trim_ascii())
        .filter(|v| !v.is_empty())
}

/// Why a request is refused as a loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loop {
    /// It already passed through this router (or a peer of its cluster).
    Back,
    /// It passed through too many routers.
    TooManyHops,
}

/// Checks an incoming request's router ids.
pub fn check(me: &RouterId, headers: &HeaderMap) -> Result<(), Loop> {
    if me.is_in(headers) {
        return Err(Loop::Back);
    }
    if ids(headers).count() >= MAX_HOPS {
        return Err(Loop::TooManyHops);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loops_are_seen() {
        let a = RouterId::new(Some(("prod", 1)));
        let b = RouterId::new(Some(("prod", 1)));
        let c = RouterId::new(None);
        assert_eq!(a.header(), b.header(), "peers of one cluster share an id");
        assert_ne!(a.header(), c.header());
        let mut h = HeaderMap::new();
        assert_eq!(check(&a, &h), Ok(()));
        h.append(HEADER, c.header().clone());
        assert_eq!(check(&a, &h), Ok(()));
        h.append(
            HEADER,
            HeaderValue::from_str(&format!("x, {}", b.header().to_str().unwrap())).unwrap(),
        );
        assert_eq!(check(&a, &h), Err(Loop::Back));
        let mut h = HeaderMap::new();
        h.insert(HEADER, HeaderValue::from_static("1,2,3,4,5,6,7,8"));
        assert_eq!(check(&a, &h), Err(Loop::TooManyHops));
    }
}
