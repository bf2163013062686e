//! The upstream servers and their ranks, as an immutable snapshot that request threads read
//! without locks; live counters are atomics shared across snapshots.

use crate::config::UpstreamConfig;
use http::HeaderValue;
use router_core::machine::Server;
use router_core::{parse_upstream_url, Candidate, RankId};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use xxhash_rust::xxh3::xxh3_64;

/// One engine server (one URL).
#[derive(Debug)]
pub struct Upstream {
    /// Base URL, normalized (`http://host:port`).
    pub url: Arc<str>,
    /// `host:port`.
    pub authority: Arc<str>,
    /// `Host` header sent upstream (the authority).
    pub host: HeaderValue,
    /// `x-router-upstream` response header (the URL), made once rather than per response.
    pub url_header: HeaderValue,
    /// Healthy, as decided by the health task.
    pub up: AtomicBool,
    /// Accepting new conversations (false while draining).
    pub accepting: AtomicBool,
    /// Set while the health machine has a failure streak or the upstream is down: only
    /// then are successes worth reporting (saves a cross-thread wakeup per request).
    pub suspect: AtomicBool,
    /// Times the outlier detector ejected it (consecutive 5xx).
    pub ejections: AtomicU64,
}

impl Upstream {
    /// A new, healthy, accepting upstream at `url` (validated before it got here: by the
    /// config or by the state machine, which holds only normalized URLs).
    pub fn new(url: &str) -> Upstream {
        let (url, authority) = match parse_upstream_url(url) {
            Ok(u) => (u.url, u.authority),
            Err(_) => (url.to_owned(), String::new()),
        };
        Upstream {
            host: HeaderValue::from_str(&authority).unwrap_or(HeaderValue::from_static("")),
            url_header: HeaderValue::from_str(&url).unwrap_or(HeaderValue::from_static("")),
            url: Arc::from(url),
            authority: Arc::from(authority),
            up: AtomicBool::new(true),
            accepting: AtomicBool::new(true),
            suspect: AtomicBool::new(false),
            ejections: AtomicU64::new(0),
        }
    }
}

/// `url`, or `url#dp` for one rank of a multi-rank server.
fn label_of(url: &str, dp_rank: Option<u32>) -> String {
    match dp_rank {
        Some(d) => format!("{url}#{d}"),
        None => url.to_owned(),
    }
}

/// One KV cache: an upstream, or one data-parallel rank of it.
#[derive(Debug)]
pub struct RankState {
    /// Id in the cache model.
    pub id: RankId,
    /// The server.
    pub upstream: Arc<Upstream>,
    /// `routed_dp_rank` to send, for multi-rank servers.
    pub dp_rank: Option<u32>,
    /// Stable key for rendezvous hashing.
    pub key: u64,
    /// Relative speed (f64 bits; a re-join may change it in place).
    weight_bits: AtomicU64,
    /// KV capacity in tokens.
    pub capacity_tokens: AtomicU64,
    /// Predicted uncached prompt tokens of requests waiting for their first byte.
    pub queued_prefill: AtomicU64,
    /// Requests generating.
    pub decodes: AtomicU64,
    /// Other router peers' queued prefill on this rank (their latest load reports).
    pub remote_prefill: AtomicU64,
    /// Other router peers' decodes on this rank.
    pub remote_decodes: AtomicU64,
    /// Requests in flight.
    pub inflight: AtomicU64,
    /// Requests sent here.
    pub requests: AtomicU64,
    /// Prompt tokens of the responses from here, as the engine reported them.
    pub usage_prompt_tokens: AtomicU64,
    /// Of them, served from the engine's prefix cache.
    pub usage_cached_tokens: AtomicU64,
    /// `x-router-rank` response header: `url`, or `url#dp` for one rank of a multi-rank
    /// server.
    pub label_header: HeaderValue,
    /// The same label, shared by trace attributes without a copy.
    pub label: Arc<str>,
}

impl RankState {
    /// A rank with no load yet.
    pub fn new(
        id: RankId,
        upstream: Arc<Upstream>,
        dp_rank: Option<u32>,
        weight: f64,
        capacity_tokens: u64,
    ) -> RankState {
        let d = dp_rank.unwrap_or(0);
        let label = label_of(&upstream.url, dp_rank);
        RankState {
            id,
            key: xxh3_64(format!("{}#{d}", upstream.url).as_bytes()),
            label_header: HeaderValue::from_str(&label).unwrap_or(HeaderValue::from_static("")),
            label: Arc::from(label.as_str()),
            upstream,
            dp_rank,
            weight_bits: AtomicU64::new(weight.to_bits()),
            capacity_tokens: AtomicU64::new(capacity_tokens),
            queued_prefill: AtomicU64::new(0),
            decodes: AtomicU64::new(0),
            remote_prefill: AtomicU64::new(0),
            remote_decodes: AtomicU64::new(0),
            inflight: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            usage_prompt_tokens: AtomicU64::new(0),
            usage_cached_tokens: AtomicU64::new(0),
        }
    }

    /// Relative speed.
    pub fn weight(&self) -> f64 {
        f64::from_bits(self.weight_bits.load(Relaxed))
    }

    /// KV capacity in tokens.
    pub fn capacity(&self) -> u64 {
        self.capacity_tokens.load(Relaxed)
    }

    /// Whether this rank already says what `s` says about weight and capacity.
    pub fn matches(&self, s: &Server) -> bool {
        self.weight_bits.load(Relaxed) == s.weight.to_bits() && self.capacity() == s.capacity_tokens
    }

    /// The scorer's view of this rank.
    pub fn candidate(&self) -> Candidate {
        Candidate {
            rank: self.id,
            key: self.key,
            weight: self.weight(),
            queued_prefill: self.queued_prefill.load(Relaxed) + self.remote_prefill.load(Relaxed),
            decodes: self.decodes.load(Relaxed) + self.remote_decodes.load(Relaxed),
        }
    }

    /// Whether new requests may go here.
    pub fn eligible(&self) -> bool {
        self.upstream.up.load(Relaxed) && self.upstream.accepting.load(Relaxed)
    }
}

/// Every server and rank.
#[derive(Debug, Default)]
pub struct Topology {
    /// Servers.
    pub upstreams: Vec<Arc<Upstream>>,
    /// Ranks, in id order.
    pub ranks: Vec<Arc<RankState>>,
}

impl Topology {
    /// Builds the topology from config; rank ids are assigned densely in order.
    pub fn from_config(ups: &[UpstreamConfig], default_capacity: u64) -> Topology {
        let mut t = Topology::default();
        for u in ups {
            let up = Arc::new(Upstream::new(&u.url));
            for d in 0..u.ranks {
                let id = t.ranks.len() as RankId;
                let dp_rank = (u.ranks > 1).then_some(d);
                t.ranks.push(Arc::new(RankState::new(
                    id,
                    up.clone(),
                    dp_rank,
                    u.weight,
                    u.capacity_tokens.unwrap_or(default_capacity),
                )));
            }
            t.upstreams.push(up);
        }
        t
    }

    /// Builds the topology from the replicated server list, reusing the previous snapshot's
    /// upstreams and ranks (and so their live counters and health) where they still exist.
    pub fn from_servers(
        servers: &std::collections::BTreeMap<String, Server>,
        prev: &Topology,
    ) -> Topology {
        let mut t = Topology::default();
        for s in servers.values() {
            let old_up = prev.upstreams.iter().find(|u| *u.url == *s.url);
            let up = match old_up {
                Some(u) => u.clone(),
                None => Arc::new(Upstream::new(&s.url)),
            };
            up.accepting.store(!s.draining, Relaxed);
            let n = s.ranks.len() as u32;
            for (d, id) in s.ranks.iter().enumerate() {
                if let Some(r) = prev
                    .ranks
                    .iter()
                    .find(|r| r.id == *id && Arc::ptr_eq(&r.upstream, &up))
                {
                    // Same rank (live counters kept); a re-join may have changed these.
                    r.weight_bits.store(s.weight.to_bits(), Relaxed);
                    r.capacity_tokens.store(s.capacity_tokens, Relaxed);
                    t.ranks.push(r.clone());
                    continue;
                }
                t.ranks.push(Arc::new(RankState::new(
                    *id,
                    up.clone(),
                    (n > 1).then_some(d as u32),
                    s.weight,
                    s.capacity_tokens,
                )));
            }
            t.upstreams.push(up);
        }
        t.ranks.sort_by_key(|r| r.id);
        t
    }

    /// Whether this topology already says what `servers` says (same URLs, rank ids,
    /// weights, capacities and drain flags), so the apply path can skip a rebuild.
    pub fn describes(&self, servers: &std::collections::BTreeMap<String, Server>) -> bool {
        self.upstreams.len() == servers.len()
            && servers.values().all(|s| {
                self.upstreams.iter().any(|u| {
                    *u.url == *s.url
                        && u.accepting.load(Relaxed) != s.draining
                        && self.ranks_of(u).map(|r| r.id).eq(s.ranks.iter().copied())
                        && self.ranks_of(u).all(|r| r.matches(s))
                })
            })
    }

    /// Ranks of one upstream.
    pub fn ranks_of<'a>(
        &'a self,
        up: &'a Upstream,
    ) -> impl Iterator<Item = &'a Arc<RankState>> + 'a {
        self.ranks
            .iter()
            .filter(move |r| std::ptr::eq(&*r.upstream, up))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn servers(weight: f64, capacity: u64) -> BTreeMap<String, Server> {
        let s = Server {
            url: "http://127.0.0.1:9001".into(),
            ranks: vec![4, 5],
            capacity_tokens: capacity,
            weight,
            draining: false,
        };
        [(s.url.clone(), s)].into()
    }

    #[test]
    fn a_rejoin_updates_weight_and_capacity_and_keeps_live_counters() {
        let a = Topology::from_servers(&servers(1.0, 1000), &Topology::default());
        assert_eq!(a.ranks.len(), 2);
        assert_eq!(a.ranks[1].dp_rank, Some(1));
        a.ranks[0].inflight.store(3, Relaxed);
        let b = Topology::from_servers(&servers(2.5, 4000), &a);
        assert!(
            Arc::ptr_eq(&a.ranks[0], &b.ranks[0]),
            "rank state not reused"
        );
        assert_eq!(b.ranks[0].inflight.load(Relaxed), 3);
        assert_eq!(b.ranks[0].weight(), 2.5);
        assert_eq!(b.ranks[1].capacity(), 4000);
        assert!(b.ranks[0].matches(&servers(2.5, 4000)["http://127.0.0.1:9001"]));
        assert!(!b.ranks[0].matches(&servers(1.0, 4000)["http://127.0.0.1:9001"]));
        assert!(b.describes(&servers(2.5, 4000)));
        assert!(!b.describes(&servers(1.0, 4000)));
        assert!(!b.describes(&BTreeMap::new()));
    }
}
