//! Servers as both admin APIs report them, read from the lock-free topology snapshot.

use crate::state::Topology;
use router_proto::v1::ServerInfo;
use std::sync::atomic::Ordering::Relaxed;

/// One entry per server.
pub fn server_infos(topo: &Topology) -> Vec<ServerInfo> {
    topo.upstreams
        .iter()
        .map(|u| {
            let ranks: Vec<_> = topo.ranks_of(u).collect();
            ServerInfo {
                url: u.url.to_string(),
                ranks: ranks.iter().map(|r| r.id).collect(),
                capacity_tokens: ranks.first().map_or(0, |r| r.capacity()),
                weight: ranks.first().map_or(1.0, |r| r.weight()),
                draining: !u.accepting.load(Relaxed),
                up: u.up.load(Relaxed),
                inflight: ranks.iter().map(|r| r.inflight.load(Relaxed)).sum(),
            }
        })
        .collect()
}
