//! `routerbench fleet-sim`: a deterministic, logical-time simulation with no HTTP. It drives
//! router-core's scoring and cache model against per-replica engine LRU caches (engine-sim's
//! cache, an independent implementation) and measures stickiness and hit rate.
//!
//! Shape: 12 apps with 48-block shared prompts, 6 developers per replica, 14-turn sessions,
//! 4,096-block LRU per replica. Time advances in rounds; in each round every developer sends
//! one turn, in a seeded random order; a request counts as load on its replica (its uncached
//! tokens as queued prefill, then one decode) until the round ends.

use crate::rng::Rng;
use engine_sim::cache::PrefixCache;
use router_core::{
    select_top, CacheModel, Candidate, FingerprintConfig, Policy, RouteInput, ScoreParams,
};
use serde::Serialize;
use xxhash_rust::xxh3::xxh3_64;

/// Tokens per engine block.
pub const BLOCK: usize = 16;

/// Simulation shape.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Replicas.
    pub replicas: usize,
    /// Apps, each with a shared system prompt.
    pub apps: usize,
    /// Blocks of each app's shared prompt.
    pub app_blocks: usize,
    /// Developers per replica.
    pub devs_per_replica: usize,
    /// Turns per session.
    pub turns: usize,
    /// Sessions each developer runs.
    pub sessions: usize,
    /// New blocks each turn adds (reply + tool result).
    pub blocks_per_turn: usize,
    /// Engine LRU capacity per replica, in blocks.
    pub lru_blocks: usize,
    /// Seed.
    pub seed: u64,
}

impl Shape {
    /// The shape from the issue at `replicas`.
    pub fn standard(replicas: usize, seed: u64) -> Shape {
        Shape {
            replicas,
            apps: 12,
            app_blocks: 48,
            devs_per_replica: 6,
            turns: 14,
            sessions: 5,
            blocks_per_turn: 16,
            lru_blocks: 4096,
            seed,
        }
    }
}

/// One result row.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Row {
    /// Replicas.
    pub replicas: usize,
    /// Policy name.
    pub policy: String,
    /// Follow-up turns on the same replica as the previous turn.
    pub stickiness: f64,
    /// Engine-side cached tokens / prompt tokens.
    pub hit_rate: f64,
    /// Time of one `select` over every replica (the scorer alone), microseconds: p50.
    pub decide_p50_us: f64,
    /// p99.
    pub decide_p99_us: f64,
}

struct Dev {
    app: usize,
    session: u64,
    turn: usize,
    blocks: Vec<u64>,
    last: Option<usize>,
    done_sessions: usize,
}

fn block_tokens(id: u64) -> [u32; BLOCK] {
    let mut t = [0u32; BLOCK];
    let mut x = id | 1;
    for v in &mut t {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *v = x as u32;
    }
    t
}

/// Runs one (shape, policy) cell.
pub fn simulate(shape: Shape, policy: Policy, params: &ScoreParams) -> Row {
    let mut rng = Rng::new(shape.seed);
    let n_devs = shape.replicas * shape.devs_per_replica;
    let app_ids: Vec<Vec<u64>> = (0..shape.apps)
        .map(|a| {
            (0..shape.app_blocks as u64)
                .map(|b| xxh3_64(&[a as u64, b].map(u64::to_le_bytes).concat()))
                .collect()
        })
        .collect();
    let mut engines: Vec<PrefixCache> = (0..shape.replicas)
        .map(|_| PrefixCache::new(shape.lru_blocks * BLOCK, BLOCK))
        .collect();
    let mut model = CacheModel::new(u64::MAX / 2, 1 << 20);
    for r in 0..shape.replicas {
        model.set_capacity(r as u32, (shape.lru_blocks * BLOCK) as u64);
    }
    let fp = FingerprintConfig {
        chunk_bytes: (BLOCK * 4) as u32,
        max_prefix_bytes: u32::MAX,
        bytes_per_token: 4,
    };
    let mut devs: Vec<Dev> = (0..n_devs)
        .map(|_| Dev {
            app: 0,
            session: 0,
            turn: shape.turns,
            blocks: Vec::new(),
            last: None,
            done_sessions: 0,
        })
        .collect();
    let mut next_session = 0u64;
    let keys: Vec<u64> = (0..shape.replicas)
        .map(|r| xxh3_64(&(r as u64).to_le_bytes()))
        .collect();
    let (mut same, mut follow, mut prompt_tokens, mut cached_tokens) = (0u64, 0u64, 0u64, 0u64);
    let mut tie = shape.seed;
    let mut order: Vec<usize> = (0..n_devs).collect();
    let mut decide_ns: Vec<f64> = Vec::new();
    let attempts = router_server::config::Config::default().max_attempts as usize;
    loop {
        let mut active = false;
        let mut queued = vec![0u64; shape.replicas];
        let mut decodes = vec![0u64; shape.replicas];
        // A seeded shuffle: who arrives first in this round.
        for i in (1..order.len()).rev() {
            order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        for &d in &order {
            let dev = &mut devs[d];
            if dev.turn >= shape.turns {
                if dev.done_sessions >= shape.sessions {
                    continue;
                }
                dev.done_sessions += 1;
                dev.app = (rng.next_u64() % shape.apps as u64) as usize;
                next_session += 1;
                dev.session = next_session;
                dev.turn = 0;
                dev.blocks = app_ids[dev.app].clone();
                dev.last = None;
            }
            active = true;
            for k in 0..shape.blocks_per_turn as u64 {
                dev.blocks.push(xxh3_64(
                    &[dev.session, dev.turn as u64, k]
                        .map(u64::to_le_bytes)
                        .concat(),
                ));
            }
            dev.turn += 1;
            let tokens: Vec<u32> = dev.blocks.iter().flat_map(|b| block_tokens(*b)).collect();
            let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
            let fps = fp.fingerprint("sim", &bytes);
            let cands: Vec<Candidate> = (0..shape.replicas)
                .map(|r| Candidate {
                    rank: r as u32,
                    key: keys[r],
                    weight: 1.0,
                    queued_prefill: queued[r],
                    decodes: decodes[r],
                })
                .collect();
            // Only the session policy gets ids: the prefix policy must find conversations unaided.
            let session = (policy == Policy::Session).then_some(dev.session);
            // The view is published once per applied batch in the router, not per
            // decision: only `select` is timed.
            let view = model.view();
            let t0 = std::time::Instant::now();
            // Ordered as the router orders them: as many as its default attempts.
            let dec = select_top(
                policy,
                params,
                &RouteInput {
                    fps: &fps,
                    session,
                    tie,
                },
                &view,
                &cands,
                attempts,
            );
            decide_ns.push(t0.elapsed().as_nanos() as f64);
            if matches!(
                dec.reason,
                router_core::Reason::Cold
                    | router_core::Reason::RoundRobin
                    | router_core::Reason::Load
                    | router_core::Reason::Fallback
            ) {
                tie = tie.wrapping_add(1);
            }
            let r = dec.order[0];
            let cached = engines[r].admit(&tokens) as u64;
            prompt_tokens += tokens.len() as u64;
            cached_tokens += cached;
            queued[r] += fps.total_tokens - dec.predicted_cached_tokens;
            decodes[r] += 1;
            model.record(r as u32, &fps.hashes, &fps.chunk_tokens, session);
            if let Some(prev) = dev.last {
                follow += 1;
                if prev == r {
                    same += 1;
                }
            }
            dev.last = Some(r);
        }
        if !active {
            break;
        }
    }
    let decide_p50_us = crate::workload::pct(&mut decide_ns, 0.5) / 1e3;
    let decide_p99_us = crate::workload::pct(&mut decide_ns, 0.99) / 1e3;
    Row {
        decide_p50_us,
        decide_p99_us,
        replicas: shape.replicas,
        policy: format!("{policy:?}").to_lowercase(),
        stickiness: if follow == 0 {
            0.0
        } else {
            same as f64 / follow as f64
        },
        hit_rate: if prompt_tokens == 0 {
            0.0
        } else {
            cached_tokens as f64 / prompt_tokens as f64
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_prefix_beats_round_robin() {
        let s = Shape {
            sessions: 2,
            ..Shape::standard(4, 1)
        };
        let p = ScoreParams::default();
        let a = simulate(s, Policy::Prefix, &p);
        // Same decisions, same outcome; only the measured times differ.
        let again = simulate(s, Policy::Prefix, &p);
        assert_eq!(
            (a.stickiness, a.hit_rate),
            (again.stickiness, again.hit_rate)
        );
        assert!(a.decide_p50_us > 0.0 && a.decide_p99_us >= a.decide_p50_us);
        let rr = simulate(s, Policy::RoundRobin, &p);
        assert!(a.stickiness > rr.stickiness + 0.3, "{a:?} {rr:?}");
        assert!(a.hit_rate > rr.hit_rate, "{a:?} {rr:?}");
    }

    /// Placement stays sticky on large fleets: a conversation's follow-ups go back to its
    /// replica (>= 99% at 128 and 1,024 replicas, one session per developer to keep it short).
    #[test]
    fn large_fleets_stay_sticky() {
        for replicas in [128, 1024] {
            let s = Shape {
                sessions: 1,
                ..Shape::standard(replicas, 7)
            };
            let row = simulate(s, Policy::Prefix, &ScoreParams::default());
            assert!(row.stickiness >= 0.99, "{row:?}");
        }
    }
}
