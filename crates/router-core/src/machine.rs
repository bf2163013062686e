//! The replicated routing state as a pure state machine: commands in log order in, the same
//! state out on every peer. A Raft log (router-cluster) feeds [`Machine::apply`]; the
//! single-node router can use it directly.
//!
//! Everything that decides routing is here: the server topology (which URLs, which rank ids,
//! capacities, weights, draining), the affinity index with its per-rank cache model, and
//! the peers' latest load snapshots. Eviction is driven only by log order (the model's
//! logical clock), so two peers that applied the same entries hold byte-identical state;
//! [`Machine::digest`] proves it.

use crate::index::{CacheModel, IndexView, ModelImage, ModelSnapshot, RankId, Route};
use crate::upstream_url::parse_upstream_url;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use xxhash_rust::xxh3::Xxh3;

/// One rank's load as one peer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankLoad {
    /// Rank.
    pub rank: RankId,
    /// Predicted uncached prompt tokens waiting for a first byte.
    pub queued_prefill: u64,
    /// Requests generating.
    pub decodes: u64,
}

/// A state change. Applied in log order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// A batch of routing decisions (and touches) from one peer.
    RecordRoutes {
        /// Proposing peer.
        peer: u64,
        /// The proposer's wall clock in ms when the batch closed (appliers measure lag).
        #[serde(default)]
        at_ms: u64,
        /// Decisions, in the order the peer made them.
        routes: Vec<Route>,
    },
    /// One peer's in-flight load per rank.
    LoadSnapshot {
        /// Reporting peer.
        peer: u64,
        /// The peer's wall clock in ms (readers ignore stale snapshots).
        at_ms: u64,
        /// Loads.
        loads: Vec<RankLoad>,
    },
    /// An engine server joins (or changes its ranks' capacity and weight).
    JoinServer {
        /// Base URL.
        url: String,
        /// Data-parallel ranks behind it.
        ranks: u32,
        /// KV capacity per rank in tokens.
        capacity_tokens: u64,
        /// Relative speed.
        weight: f64,
    },
    /// An engine server leaves: its ranks and their cache state are forgotten.
    LeaveServer {
        /// Base URL.
        url: String,
    },
    /// Stop (or resume) sending new conversations to a server.
    DrainServer {
        /// Base URL.
        url: String,
        /// True to drain, false to resume.
        draining: bool,
    },
    /// A router peer left the cluster for good: its id is never handed out again, and its
    /// load report is dropped.
    RetirePeer {
        /// Node id.
        id: u64,
    },
    /// A router peer has acknowledged log entries: from now on, that id starting without
    /// any Raft state means its data was lost (it must not vote with an empty log).
    PeerAcked {
        /// Node id.
        id: u64,
    },
}

/// What applying a command says back to the proposer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// Applied.
    Ok,
    /// A server joined with these rank ids.
    Joined(Vec<RankId>),
    /// The command named something unknown or invalid; state unchanged.
    Rejected(Rejection),
}

/// Why the state machine refused a command. Every peer refuses the same command the same
/// way (the check is part of applying it), so the proposer's answer holds cluster-wide.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Rejection {
    /// Leave or drain of a URL that is not in the server set.
    #[error("no server {0}")]
    UnknownServer(String),
    /// A join with an invalid URL, rank count, capacity or weight.
    #[error("invalid server {url}: {reason}")]
    InvalidServer {
        /// The URL as given.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// A load report from a router peer that was removed (its id is retired).
    #[error("peer {0} was removed")]
    RetiredPeer(u64),
}

/// A server in the topology.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Server {
    /// Base URL.
    pub url: String,
    /// Its rank ids, in data-parallel order.
    pub ranks: Vec<RankId>,
    /// KV capacity per rank.
    pub capacity_tokens: u64,
    /// Relative speed.
    pub weight: f64,
    /// No new conversations.
    pub draining: bool,
}

/// A peer's last load report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerLoad {
    /// The peer's clock when it reported.
    pub at_ms: u64,
    /// Loads.
    pub loads: Vec<RankLoad>,
}

/// The whole replicated state.
#[derive(Clone)]
pub struct Machine {
    model: CacheModel,
    servers: BTreeMap<String, Server>,
    next_rank: RankId,
    loads: BTreeMap<u64, PeerLoad>,
    retired: BTreeSet<u64>,
    acked: BTreeSet<u64>,
}

/// Serializable image of a [`Machine`], for Raft snapshots.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineSnapshot {
    /// Cache model.
    pub model: ModelSnapshot,
    /// Topology.
    pub servers: Vec<Server>,
    /// Next rank id to hand out (ids are never reused).
    pub next_rank: RankId,
    /// Load reports.
    pub loads: Vec<(u64, PeerLoad)>,
    /// Router peer ids that left (never reused).
    #[serde(default)]
    pub retired_peers: Vec<u64>,
    /// Router peer ids that have acknowledged log entries.
    #[serde(default)]
    pub acked_peers: Vec<u64>,
}

/// A [`Machine`] copied for a snapshot; see [`Machine::image`].
pub struct MachineImage {
    model: ModelImage,
    /// Everything but the cache model (its own model is empty and unused).
    rest: Machine,
}

impl MachineImage {
    /// The snapshot of the machine as it was when the image was taken.
    pub fn snapshot(&self) -> MachineSnapshot {
        self.rest.snapshot_with(self.model.export())
    }
}

impl Machine {
    /// An empty state.
    pub fn new(max_entries: u64, max_sessions: u64) -> Self {
        Machine {
            model: CacheModel::new(max_entries, max_sessions),
            servers: BTreeMap::new(),
            next_rank: 0,
            loads: BTreeMap::new(),
            retired: BTreeSet::new(),
            acked: BTreeSet::new(),
        }
    }

    /// Applies one command.
    pub fn apply(&mut self, cmd: &Command) -> Outcome {
        match cmd {
            Command::RecordRoutes { routes, .. } => {
                for r in routes {
                    self.model
                        .record(r.rank, &r.hashes, &r.chunk_tokens, r.session);
                }
                Outcome::Ok
            }
            Command::LoadSnapshot { peer, .. } if self.retired.contains(peer) => {
                Outcome::Rejected(Rejection::RetiredPeer(*peer))
            }
            Command::LoadSnapshot { peer, at_ms, loads } => {
                self.loads.insert(
                    *peer,
                    PeerLoad {
                        at_ms: *at_ms,
                        loads: loads.clone(),
                    },
                );
                Outcome::Ok
            }
            Command::JoinServer {
                url,
                ranks,
                capacity_tokens,
                weight,
            } => {
                let invalid = |reason: String| {
                    Outcome::Rejected(Rejection::InvalidServer {
                        url: url.clone(),
                        reason,
                    })
                };
                match parse_upstream_url(url) {
                    Err(e) => return invalid(e.to_string()),
                    // Each server is held under one spelling; callers normalize first.
                    Ok(u) if u.url != *url => {
                        return invalid(format!("not in normal form (use {})", u.url))
                    }
                    Ok(_) => {}
                }
                if *ranks == 0
                    || *ranks > 1024
                    || *capacity_tokens == 0
                    || !(weight.is_finite() && *weight > 0.0)
                {
                    return invalid("ranks 1..=1024, capacity and weight positive".into());
                }
                if let Some(s) = self.servers.get_mut(url) {
                    if s.ranks.len() as u32 == *ranks {
                        s.capacity_tokens = *capacity_tokens;
                        s.weight = *weight;
                        for r in &s.ranks {
                            self.model.set_capacity(*r, *capacity_tokens);
                        }
                        return Outcome::Joined(s.ranks.clone());
                    }
                    // A different rank count is a different server: start over.
                    let old = self
                        .servers
                        .remove(url)
                        .map(|s| s.ranks)
                        .unwrap_or_default();
                    for r in old {
                        self.model.remove_rank(r);
                    }
                }
                let ids: Vec<RankId> = (0..*ranks).map(|i| self.next_rank + i).collect();
                self.next_rank += ranks;
                for r in &ids {
                    self.model.set_capacity(*r, *capacity_tokens);
                }
                self.servers.insert(
                    url.clone(),
                    Server {
                        url: url.clone(),
                        ranks: ids.clone(),
                        capacity_tokens: *capacity_tokens,
                        weight: *weight,
                        draining: false,
                    },
                );
                Outcome::Joined(ids)
            }
            Command::LeaveServer { url } => match self.servers.remove(url) {
                Some(s) => {
                    for r in s.ranks {
                        self.model.remove_rank(r);
                    }
                    Outcome::Ok
                }
                None => Outcome::Rejected(Rejection::UnknownServer(url.clone())),
            },
            Command::DrainServer { url, draining } => match self.servers.get_mut(url) {
                Some(s) => {
                    s.draining = *draining;
                    Outcome::Ok
                }
                None => Outcome::Rejected(Rejection::UnknownServer(url.clone())),
            },
            Command::PeerAcked { id } => {
                self.acked.insert(*id);
                Outcome::Ok
            }
            Command::RetirePeer { id } => {
                self.retired.insert(*id);
                self.loads.remove(id);
                Outcome::Ok
            }
        }
    }

    /// Whether router peer `id` has ever acknowledged log entries.
    pub fn has_acked(&self, id: u64) -> bool {
        self.acked.contains(&id)
    }

    /// Router peer ids that have acknowledged log entries.
    pub fn acked(&self) -> &BTreeSet<u64> {
        &self.acked
    }

    /// Whether a router peer id was retired (and so may not join again).
    pub fn is_retired(&self, id: u64) -> bool {
        self.retired.contains(&id)
    }

    /// The affinity index for readers (O(1)).
    pub fn view(&self) -> IndexView {
        self.model.view()
    }

    /// The cache model.
    pub fn model(&self) -> &CacheModel {
        &self.model
    }

    /// Servers, by URL.
    pub fn servers(&self) -> &BTreeMap<String, Server> {
        &self.servers
    }

    /// Latest load report of each peer.
    pub fn loads(&self) -> &BTreeMap<u64, PeerLoad> {
        &self.loads
    }

    /// Digest of everything: equal on two peers exactly when their states are equal.
    pub fn digest(&self) -> u64 {
        let mut h = Xxh3::new();
        h.update(&self.model.digest().to_le_bytes());
        h.update(&self.next_rank.to_le_bytes());
        for s in self.servers.values() {
            h.update(s.url.as_bytes());
            h.update(&[0]);
            for r in &s.ranks {
                h.update(&r.to_le_bytes());
            }
            h.update(&s.capacity_tokens.to_le_bytes());
            h.update(&s.weight.to_bits().to_le_bytes());
            h.update(&[u8::from(s.draining)]);
        }
        for (p, l) in &self.loads {
            h.update(&p.to_le_bytes());
            h.update(&l.at_ms.to_le_bytes());
            for x in &l.loads {
                h.update(&x.rank.to_le_bytes());
                h.update(&x.queued_prefill.to_le_bytes());
                h.update(&x.decodes.to_le_bytes());
            }
        }
        for r in &self.retired {
            h.update(&r.to_le_bytes());
        }
        h.update(b"acked");
        for a in &self.acked {
            h.update(&a.to_le_bytes());
        }
        h.digest()
    }

    /// What a snapshot is made from, copied cheaply (see [`ModelImage`]): take it under
    /// the state lock, export it ([`MachineImage::snapshot`]) after letting go.
    pub fn image(&self) -> MachineImage {
        MachineImage {
            model: self.model.image(),
            rest: Machine {
                model: CacheModel::new(1, 1),
                servers: self.servers.clone(),
                next_rank: self.next_rank,
                loads: self.loads.clone(),
                retired: self.retired.clone(),
                acked: self.acked.clone(),
            },
        }
    }

    /// An image for a snapshot.
    pub fn snapshot(&self) -> MachineSnapshot {
        self.snapshot_with(self.model.export())
    }

    /// A snapshot of everything but the cache model, with `model`.
    fn snapshot_with(&self, model: ModelSnapshot) -> MachineSnapshot {
        MachineSnapshot {
            model,
            servers: self.servers.values().cloned().collect(),
            next_rank: self.next_rank,
            loads: self.loads.iter().map(|(k, v)| (*k, v.clone())).collect(),
            retired_peers: self.retired.iter().copied().collect(),
            acked_peers: self.acked.iter().copied().collect(),
        }
    }

    /// Rebuilds a machine from an image.
    pub fn restore(s: &MachineSnapshot) -> Machine {
        Machine {
            model: CacheModel::import(&s.model),
            servers: s
                .servers
                .iter()
                .map(|x| (x.url.clone(), x.clone()))
                .collect(),
            next_rank: s.next_rank,
            loads: s.loads.iter().cloned().collect(),
            retired: s.retired_peers.iter().copied().collect(),
            acked: s.acked_peers.iter().copied().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join(url: &str, ranks: u32) -> Command {
        Command::JoinServer {
            url: url.into(),
            ranks,
            capacity_tokens: 1000,
            weight: 1.0,
        }
    }

    fn routes(rank: RankId, seed: u64, n: u64) -> Command {
        Command::RecordRoutes {
            peer: 1,
            at_ms: 0,
            routes: vec![Route {
                rank,
                hashes: (0..n).map(|i| seed * 1000 + i).collect(),
                chunk_tokens: vec![100; n as usize],
                session: Some(seed),
            }],
        }
    }

    fn log() -> Vec<Command> {
        vec![
            join("http://a:1", 2),
            join("http://b:1", 1),
            routes(0, 1, 5),
            routes(1, 2, 8),
            routes(2, 3, 4),
            routes(0, 4, 9), // evicts part of seed 1 on rank 0 (capacity 1000 tokens)
            Command::LoadSnapshot {
                peer: 2,
                at_ms: 10,
                loads: vec![RankLoad {
                    rank: 0,
                    queued_prefill: 5,
                    decodes: 1,
                }],
            },
            Command::DrainServer {
                url: "http://b:1".into(),
                draining: true,
            },
            Command::LeaveServer {
                url: "http://a:1".into(),
            },
            join("http://c:1", 1),
            Command::RetirePeer { id: 2 },
            Command::LoadSnapshot {
                peer: 2,
                at_ms: 11,
                loads: vec![],
            },
        ]
    }

    #[test]
    fn same_log_same_state() {
        let mut a = Machine::new(100, 100);
        let mut b = Machine::new(100, 100);
        for c in log() {
            assert_eq!(a.apply(&c), b.apply(&c));
            assert_eq!(a.digest(), b.digest());
        }
        let mut c = Machine::new(100, 100);
        for cmd in &log()[..5] {
            c.apply(cmd);
        }
        assert_ne!(a.digest(), c.digest());
    }

    #[test]
    fn topology_and_ids_are_never_reused() {
        let mut m = Machine::new(100, 100);
        assert_eq!(m.apply(&join("http://a:1", 2)), Outcome::Joined(vec![0, 1]));
        assert_eq!(m.apply(&join("http://b:1", 1)), Outcome::Joined(vec![2]));
        assert_eq!(
            m.apply(&Command::LeaveServer {
                url: "http://a:1".into()
            }),
            Outcome::Ok
        );
        assert_eq!(m.apply(&join("http://a:1", 1)), Outcome::Joined(vec![3]));
        assert_eq!(
            m.apply(&Command::LeaveServer {
                url: "http://x:1".into()
            }),
            Outcome::Rejected(Rejection::UnknownServer("http://x:1".into()))
        );
        assert!(matches!(
            m.apply(&join("http://z:1", 0)),
            Outcome::Rejected(Rejection::InvalidServer { .. })
        ));
        // The URL check is the shared one, and the log holds only normalized URLs.
        for bad in [
            "http://u:p@z:1",
            "http://z:1/v1",
            "http://z:0",
            "http://Z:1",
        ] {
            assert!(
                matches!(
                    m.apply(&join(bad, 1)),
                    Outcome::Rejected(Rejection::InvalidServer { .. })
                ),
                "{bad}"
            );
        }
        // Re-joining with the same rank count keeps ids (capacity update).
        assert_eq!(m.apply(&join("http://b:1", 1)), Outcome::Joined(vec![2]));
        // Routes to a departed rank are ignored.
        m.apply(&routes(0, 9, 3));
        assert_eq!(m.model().stats().entries, 0);
    }

    #[test]
    fn acked_peers_are_state_and_survive_a_snapshot() {
        let mut m = Machine::new(1000, 100);
        let before = m.digest();
        assert_eq!(m.apply(&Command::PeerAcked { id: 3 }), Outcome::Ok);
        assert!(m.has_acked(3) && !m.has_acked(2));
        assert_ne!(m.digest(), before, "acks are part of the digest");
        let back = Machine::restore(&m.snapshot());
        assert!(back.has_acked(3));
        assert_eq!(back.digest(), m.digest());
        // Idempotent.
        m.apply(&Command::PeerAcked { id: 3 });
        assert_eq!(back.digest(), m.digest());
    }

    #[test]
    fn snapshot_round_trip_keeps_digest_and_behaviour() {
        let mut a = Machine::new(100, 100);
        for c in log() {
            a.apply(&c);
        }
        let snap = a.snapshot();
        let json = serde_json::to_vec(&snap).unwrap();
        let back: MachineSnapshot = serde_json::from_slice(&json).unwrap();
        let mut b = Machine::restore(&back);
        assert_eq!(a.digest(), b.digest());
        // Both go on identically, evictions included.
        for c in [routes(2, 7, 12), routes(3, 8, 3), routes(2, 9, 6)] {
            a.apply(&c);
            b.apply(&c);
            assert_eq!(a.digest(), b.digest());
        }
    }

    /// An image taken under the lock exports what the machine held then, however the
    /// machine changed since (entries evicted, the fingerprint table replaced).
    #[test]
    fn an_image_exports_the_state_it_was_taken_at() {
        let mut a = Machine::new(100, 100);
        for c in log() {
            a.apply(&c);
        }
        let image = a.image();
        let then = a.snapshot();
        for seed in 20..60 {
            a.apply(&routes(2, seed, 30));
        }
        assert_ne!(a.snapshot(), then);
        assert_eq!(image.snapshot(), then);
        assert_eq!(
            Machine::restore(&image.snapshot()).digest(),
            Machine::restore(&then).digest()
        );
    }
}
