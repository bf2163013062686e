//! Backend selection: `select(input, candidates) -> ordered candidates`.
//!
//! ## The `prefix` cost (lowest wins)
//!
//! ```text
//! load(r)   = ( prefill_weight * queued_prefill(r) + decode_weight * decodes(r) ) / weight(r)
//! excess(r) = max(0, load(r) - min_r' load(r') - load_slack)
//! cost(r)   = ( uncached(r) + kv_pressure_weight * evicted(r) ) / weight(r) + excess(r)
//! uncached(r) = prompt_tokens - cached(r)
//! evicted(r)  = max(0, uncached(r) - room(r))
//! ```
//! Candidates are ordered by `cost`, then by `load` (so cold prompts go to the least-loaded
//! rank), then by a rotation seeded by the caller.
//!
//! * `cached(r)`: tokens of the longest prefix of this prompt that the cache model says rank
//!   `r` still holds (contiguous fingerprints from the first chunk).
//! * `queued_prefill(r)`: predicted uncached prompt tokens of requests in flight on `r` that
//!   have not produced their first token yet (work the engine must do before ours).
//! * `decodes(r)`: requests on `r` that are generating.
//! * `prefill_weight` (default 1.0): a token queued ahead of us delays us as much as one of
//!   our own uncached tokens.
//! * `decode_weight` (default 64 tokens): each running decode takes a slot of every engine
//!   step and slows it; 64 prefill-token equivalents per decode keeps a rank with many
//!   generations from looking idle, while a long cached prefix still outweighs them.
//! * `load_slack` (default 2048 tokens): load differences smaller than this are noise (a
//!   couple of requests arriving in a different order) and never move a conversation. Without
//!   it, a conversation whose rank holds only a few chunks more than another rank (early turns
//!   on a shared system prompt) flips between ranks on every small imbalance, which splits its
//!   cache footprint across ranks.
//! * `weight(r)` (default 1.0): relative speed of the rank; a rank twice as fast halves
//!   every cost on it.
//! * `room(r)`: the tokens the cache model says rank `r` can still take before it evicts
//!   what conversations still use: its capacity minus what it holds, unbounded once the
//!   entry it would evict next is older than 8 mean return intervals (the ticks after which
//!   conversations come back, a moving mean kept in the replicated model). Engines keep
//!   finished conversations until evicted, so in steady state every rank is full and only
//!   the age of what it would evict tells pressure apart. `evicted(r)` is what storing this
//!   prompt's uncached tokens there would push out of that: other conversations' prefixes,
//!   computed again when they come back, so each such token costs `kv_pressure_weight`
//!   (default 1.0) more. A new conversation (uncached the same everywhere) goes to a rank
//!   with room for it rather than one that would have to evict live conversations, and a
//!   rank near capacity stops taking new conversations before it starts evicting, while its
//!   own conversations (few uncached tokens) stay. Measured (`routerbench compare`, one run
//!   each, turns/min against SMG's in the same or an adjacent run): under KV pressure
//!   (4 ranks, 40 developers) 90.1% cached and about 1.00x with this, 87.8% cached at weight
//!   0; with KV to spare (16 ranks, 96 developers) about 1.00x, where charging evictions
//!   regardless of age gave 0.94x (and a surcharge proportional to fill 0.93-0.96x): on a
//!   full fleet it steered new conversations by a few tokens of room and kept overloaded
//!   ranks' conversations home, which unbalanced decodes.
//! * `pressured_prefill_weight` (0.5), `pressured_decode_weight` (128): the load weights once
//!   some candidate has less room than the whole prompt (the fleet's KV, not its compute, is
//!   what limits it). A move for load then costs a re-read, a stale copy on the old rank and
//!   live prefixes pushed out of the new one, while queued prefill is mostly bursts of first
//!   turns that pass; decodes, which persist, count more. Measured (`routerbench compare
//!   --policies prefix`, the same binary with the shift off, pairs of runs): 4 ranks / 40
//!   developers 90.9-91.1% cached against 90.2-90.6% (sticky 90% against 87%), turns/min
//!   +0.6% and +2.6%; 8 and 16 ranks (room to spare, no shift) level. The same weights
//!   applied always gained as much at 4 ranks and lost 5-6% at 16 (busiest rank 1.3-1.6x
//!   the mean).
//!
//! Everything is in engine tokens, so the formula reads as "estimated work before our first
//! token". A cached conversation moves only when its rank's queue exceeds the least-loaded
//! rank's by more than the slack plus the re-prefill cost elsewhere.
//!
//! With a session id (header or body), the rank the session last went to is credited with the
//! best cached prefix any rank holds: a strong hint, still subject to load.

use crate::fingerprint::Fingerprints;
use crate::index::{IndexView, RankId};
use smallvec::SmallVec;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Routing policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Cache-aware cost (default).
    #[default]
    Prefix,
    /// Load only.
    Load,
    /// Rotation.
    RoundRobin,
    /// Rendezvous hash on the session id (load when there is none).
    Session,
}

impl Policy {
    /// Parses the names used in config and `RJ_AFFINITY`.
    pub fn parse(s: &str) -> Option<Policy> {
        match s.trim().to_ascii_lowercase().as_str() {
            "prefix" => Some(Policy::Prefix),
            "load" => Some(Policy::Load),
            "round_robin" | "round-robin" | "rr" => Some(Policy::RoundRobin),
            "session" => Some(Policy::Session),
            _ => None,
        }
    }
}

/// Tunables of the cost formula (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScoreParams {
    /// Weight of queued prefill tokens.
    pub prefill_weight: f64,
    /// Prefill-token equivalents of one running decode.
    pub decode_weight: f64,
    /// Load differences (in tokens) too small to move a conversation.
    pub load_slack: f64,
    /// Honour session ids as hints under the `prefix` policy.
    pub session_hint: bool,
    /// Extra cost of each token a prompt would evict from a rank's modelled KV, as a
    /// multiple of its prefill: other conversations compute their evicted prefixes again.
    pub kv_pressure_weight: f64,
    /// `prefill_weight` once some candidate has no room for a whole copy of the prompt
    /// without evicting live conversations (the fleet's KV is the constraint).
    pub pressured_prefill_weight: f64,
    /// `decode_weight` under the same condition.
    pub pressured_decode_weight: f64,
}

impl Default for ScoreParams {
    fn default() -> Self {
        ScoreParams {
            prefill_weight: 1.0,
            decode_weight: 64.0,
            load_slack: 2048.0,
            session_hint: true,
            kv_pressure_weight: 1.0,
            pressured_prefill_weight: 0.5,
            pressured_decode_weight: 128.0,
        }
    }
}

/// One eligible rank (healthy, accepting new work) and its current load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// Rank id in the cache model.
    pub rank: RankId,
    /// Stable key for rendezvous hashing (e.g. hash of URL and rank index).
    pub key: u64,
    /// Relative speed (> 0).
    pub weight: f64,
    /// Predicted uncached prompt tokens of requests waiting for their first token.
    pub queued_prefill: u64,
    /// Requests generating.
    pub decodes: u64,
}

/// What a decision is based on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The winner holds part of the prompt.
    PrefixHit,
    /// No rank holds any of it.
    Cold,
    /// Some rank holds more of it, but load sent us elsewhere.
    Load,
    /// The session hint decided.
    Session,
    /// The policy had nothing to go on and fell back to load.
    Fallback,
    /// Rotation.
    RoundRobin,
}

impl Reason {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Reason::PrefixHit => "prefix_hit",
            Reason::Cold => "cold",
            Reason::Load => "load",
            Reason::Session => "session",
            Reason::Fallback => "fallback",
            Reason::RoundRobin => "round_robin",
        }
    }

    /// All reasons, for metric exposition.
    pub const ALL: [Reason; 6] = [
        Reason::PrefixHit,
        Reason::Cold,
        Reason::Load,
        Reason::Session,
        Reason::Fallback,
        Reason::RoundRobin,
    ];
}

/// One request as the scorer sees it.
#[derive(Debug, Clone, Copy)]
pub struct RouteInput<'a> {
    /// The prompt's fingerprints.
    pub fps: &'a Fingerprints,
    /// Hash of the session id, if any.
    pub session: Option<u64>,
    /// Rotation seed for ties (e.g. a per-process counter mixed with a seed).
    pub tie: u64,
}

/// The ordered candidates and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Indexes into the candidate slice, best first; later ones are retry targets.
    pub order: SmallVec<[usize; 8]>,
    /// Why the first one won.
    pub reason: Reason,
    /// Tokens the first candidate is predicted to serve from cache.
    pub predicted_cached_tokens: u64,
    /// Matched fingerprints on the first candidate (to know what to record).
    pub matched_chunks: u32,
    /// Under the `prefix` policy: the winner's cost and the runner-up's (for traces).
    pub costs: Option<(f64, Option<f64>)>,
}

/// Orders `candidates` for one request. Pure: same inputs, same output.
pub fn select(
    policy: Policy,
    params: &ScoreParams,
    input: &RouteInput<'_>,
    view: &IndexView,
    candidates: &[Candidate],
) -> Decision {
    select_top(policy, params, input, view, candidates, usize::MAX)
}

/// [`select`], ordering only the best `want` candidates (at least one): the data plane
/// needs the winner and its retry targets, not a sorted fleet of a thousand ranks. The
/// first `want` entries are exactly those [`select`] puts first.
pub fn select_top(
    policy: Policy,
    params: &ScoreParams,
    input: &RouteInput<'_>,
    view: &IndexView,
    candidates: &[Candidate],
    want: usize,
) -> Decision {
    let n = candidates.len();
    if n == 0 {
        return Decision {
            order: SmallVec::new(),
            reason: Reason::Fallback,
            predicted_cached_tokens: 0,
            matched_chunks: 0,
            costs: None,
        };
    }
    let want = want.clamp(1, n);
    let rot = rotation(input.tie, n);
    match policy {
        Policy::RoundRobin => {
            let order = (0..want).map(rot).collect();
            finish(order, Reason::RoundRobin, input, view, candidates)
        }
        Policy::Load => {
            let order = by_cost(candidates, want, rot, |c| load_cost(params, c));
            finish(order, Reason::Load, input, view, candidates)
        }
        Policy::Session => match input.session {
            Some(s) => {
                let keys = candidates.iter().enumerate().map(|(i, c)| {
                    let h = xxh3_64_with_seed(&c.key.to_le_bytes(), s);
                    (std::cmp::Reverse(h), i)
                });
                let order = smallest(keys, want, |a, b| a.cmp(b))
                    .into_iter()
                    .map(|k| k.1)
                    .collect();
                finish(order, Reason::Session, input, view, candidates)
            }
            None => {
                let order = by_cost(candidates, want, rot, |c| load_cost(params, c));
                finish(order, Reason::Fallback, input, view, candidates)
            }
        },
        Policy::Prefix => prefix(params, input, view, candidates, want, rot),
    }
}

/// Candidate `i`'s place in the tie-breaking rotation seeded by `tie` over `n` candidates.
fn rotation(tie: u64, n: usize) -> impl Fn(usize) -> usize + Copy {
    let shift = (tie % n as u64) as usize;
    move |i| {
        if i + shift >= n {
            i + shift - n
        } else {
            i + shift
        }
    }
}

/// The `want` smallest of `keys` (by `cmp`, a total order), sorted. A handful (the usual
/// winner plus retry targets) is kept by insertion in one pass with no allocation, so a
/// thousand-rank fleet costs one comparison per rank; more are partially selected, then
/// sorted.
fn smallest<K: Copy>(
    keys: impl Iterator<Item = K>,
    want: usize,
    cmp: impl Fn(&K, &K) -> std::cmp::Ordering,
) -> SmallVec<[K; 8]> {
    use std::cmp::Ordering::Less;
    if want <= 8 {
        let mut top: SmallVec<[K; 8]> = SmallVec::new();
        // The worst kept key, by value: checked before anything else for each key.
        let mut worst: Option<K> = None;
        for k in keys {
            if let Some(w) = &worst {
                if cmp(&k, w) != Less {
                    continue;
                }
                top.pop();
            }
            let at = top.partition_point(|x| cmp(x, &k) == Less);
            top.insert(at, k);
            if top.len() == want {
                worst = top.last().copied();
            }
        }
        return top;
    }
    let mut all: Vec<K> = keys.collect();
    if want < all.len() {
        all.select_nth_unstable_by(want - 1, &cmp);
        all.truncate(want);
    }
    all.sort_unstable_by(cmp);
    all.into_iter().collect()
}

/// `f64::total_cmp` with the common case first: two plain compares, which the loop over a
/// thousand candidates feels (the bit juggling of `total_cmp` only runs on equal values).
#[inline(always)]
fn cmp_f64(a: f64, b: f64) -> std::cmp::Ordering {
    if a < b {
        std::cmp::Ordering::Less
    } else if a > b {
        std::cmp::Ordering::Greater
    } else {
        a.total_cmp(&b)
    }
}

fn load_cost(p: &ScoreParams, c: &Candidate) -> f64 {
    load_of((p.prefill_weight, p.decode_weight), c).0
}

/// A candidate's load cost and 1 / its weight: one division, none for the usual weight
/// of 1 (recomputing this is cheaper than storing it for a thousand candidates).
#[inline(always)]
fn load_of((prefill_weight, decode_weight): (f64, f64), c: &Candidate) -> (f64, f64) {
    let inv_weight = if c.weight == 1.0 {
        1.0
    } else {
        1.0 / c.weight.max(1e-9)
    };
    let load =
        (prefill_weight * c.queued_prefill as f64 + decode_weight * c.decodes as f64) * inv_weight;
    (load, inv_weight)
}

fn by_cost(
    candidates: &[Candidate],
    want: usize,
    rot: impl Fn(usize) -> usize,
    cost: impl Fn(&Candidate) -> f64,
) -> SmallVec<[usize; 8]> {
    let keys = candidates.iter().enumerate().map(|(i, c)| (cost(c), i));
    smallest(keys, want, |a, b| {
        cmp_f64(a.0, b.0).then_with(|| rot(a.1).cmp(&rot(b.1)))
    })
    .into_iter()
    .map(|k| k.1)
    .collect()
}

/// Fills in cache predictions for a non-prefix policy (for metrics only).
fn finish(
    order: SmallVec<[usize; 8]>,
    reason: Reason,
    input: &RouteInput<'_>,
    view: &IndexView,
    candidates: &[Candidate],
) -> Decision {
    let first = candidates[order[0]].rank;
    let matches = view.matches(&input.fps.hashes);
    let matched = matches
        .binary_search_by_key(&first, |m| m.0)
        .map_or(0, |i| matches[i].1);
    Decision {
        order,
        reason,
        predicted_cached_tokens: input.fps.tokens_of_prefix(matched as usize),
        matched_chunks: matched,
        costs: None,
    }
}

/// One candidate as the `prefix` policy weighs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scored {
    /// Index into the candidate slice.
    pub index: usize,
    /// Its rank.
    pub rank: RankId,
    /// Leading chunks of the prompt the model says this rank holds.
    pub matched_chunks: u32,
    /// Prompt tokens counted as cached here (the session hint credits the best match to
    /// the hinted rank).
    pub cached_tokens: u64,
    /// Load cost (weighted queued prefill and decodes, per unit of speed).
    pub load: f64,
    /// Load above the least loaded candidate plus the slack, added to the cost.
    pub excess_load: f64,
    /// Uncached tokens per unit of speed plus `excess_load`: lowest wins.
    pub cost: f64,
    /// The session hint points here.
    pub hinted: bool,
}

/// What the `prefix` cost of any candidate needs, computed once per request: each
/// candidate is then O(1), so a decision is O(candidates + matching ranks * log chunks).
struct Costing<'a> {
    params: &'a ScoreParams,
    candidates: &'a [Candidate],
    /// Matched chunks by rank (from `matches`, empty when no rank holds the first chunk).
    matches: SmallVec<[(RankId, u32); 8]>,
    /// Matched chunks by rank id, for every candidate's rank: a per-thread table, zero
    /// but where `matches` set it, so a request neither allocates nor clears it whole.
    depth: Vec<u32>,
    /// Tokens of the first `i` chunks, for every `i` up to the deepest match.
    tokens_upto: Vec<u64>,
    view: &'a IndexView,
    best_matched: u32,
    hinted: Option<RankId>,
    min_load: f64,
    total: u64,
    /// Prefill and decode weights of the load term ([`load_weights`]).
    weights: (f64, f64),
}

impl<'a> Costing<'a> {
    fn new(
        params: &'a ScoreParams,
        input: &RouteInput<'_>,
        view: &'a IndexView,
        candidates: &'a [Candidate],
    ) -> Self {
        let matches = view.matches(&input.fps.hashes);
        let mut depth = DEPTH.with(|d| std::mem::take(&mut *d.borrow_mut()));
        let top_rank = candidates.iter().map(|c| c.rank).max().unwrap_or(0) as usize;
        if depth.len() <= top_rank {
            depth.resize(top_rank + 1, 0);
        }
        for (r, d) in &matches {
            if let Some(slot) = depth.get_mut(*r as usize) {
                *slot = *d;
            }
        }
        let total = input.fps.total_tokens;
        let weights = load_weights(params, view, candidates, total);
        let (mut best_matched, mut min_load) = (0, f64::INFINITY);
        for c in candidates {
            best_matched = best_matched.max(depth[c.rank as usize]);
            let load = load_of(weights, c).0;
            if load < min_load {
                min_load = load;
            }
        }
        let mut tokens_upto = Vec::with_capacity(best_matched as usize + 1);
        tokens_upto.push(0);
        for t in input.fps.chunk_tokens.iter().take(best_matched as usize) {
            tokens_upto.push(tokens_upto[tokens_upto.len() - 1] + u64::from(*t));
        }
        let hinted = if params.session_hint {
            input
                .session
                .and_then(|s| view.session(s))
                .filter(|r| candidates.iter().any(|c| c.rank == *r))
        } else {
            None
        };
        Costing {
            params,
            candidates,
            matches,
            depth,
            view,
            tokens_upto,
            best_matched,
            hinted,
            min_load,
            total,
            weights,
        }
    }

    /// Candidate `i`'s matched chunks, cached tokens credited, whether the hint points at
    /// it, its load and its cost: the whole per-candidate work of a decision.
    #[inline(always)]
    fn cost(&self, i: usize) -> (u32, u64, bool, f64, f64) {
        let c = &self.candidates[i];
        let own = self.depth[c.rank as usize];
        let hinted = self.hinted == Some(c.rank);
        let credited = if hinted {
            own.max(self.best_matched)
        } else {
            own
        };
        let cached = self.tokens_upto[credited as usize].min(self.total);
        let (load, inv_weight) = load_of(self.weights, c);
        let uncached = (self.total - cached) as i64 as f64;
        // What storing them would push out of the rank's KV.
        let evicted = uncached - self.view.room(c.rank);
        let pressure = if evicted > 0.0 {
            evicted * self.params.kv_pressure_weight
        } else {
            0.0
        };
        let work = (uncached + pressure) * inv_weight;
        (own, cached, hinted, load, work + self.excess(load))
    }

    /// Load above the least loaded candidate plus the slack.
    #[inline(always)]
    fn excess(&self, load: f64) -> f64 {
        // Never NaN (weights are clamped above zero): a plain compare, not `f64::max`.
        let over = load - self.min_load - self.params.load_slack;
        if over > 0.0 {
            over
        } else {
            0.0
        }
    }

    fn score(&self, i: usize) -> Scored {
        let (own, cached, hinted, load, cost) = self.cost(i);
        Scored {
            index: i,
            rank: self.candidates[i].rank,
            matched_chunks: own,
            cached_tokens: cached,
            load,
            excess_load: self.excess(load),
            cost,
            hinted,
        }
    }
}

/// The load term's prefill and decode weights: the configured ones while every candidate
/// could take a whole copy of this prompt without evicting what live conversations use, the
/// `pressured_*` ones once some cannot. Then the fleet's KV is what limits it: a
/// conversation moved for load re-reads its prompt, leaves a stale copy in its old rank
/// and pushes live prefixes out of a full one, while the queued prefill that moved it is
/// mostly a burst (first turns) that passes; running decodes, which persist, count more.
fn load_weights(
    params: &ScoreParams,
    view: &IndexView,
    candidates: &[Candidate],
    total: u64,
) -> (f64, f64) {
    if candidates.iter().any(|c| view.room(c.rank) < total as f64) {
        (
            params.pressured_prefill_weight,
            params.pressured_decode_weight,
        )
    } else {
        (params.prefill_weight, params.decode_weight)
    }
}

thread_local! {
    /// [`Costing`]'s depth table, kept between requests on each thread.
    static DEPTH: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Drop for Costing<'_> {
    fn drop(&mut self) {
        // Back to all zeros, then back to the thread.
        for (r, _) in &self.matches {
            if let Some(slot) = self.depth.get_mut(*r as usize) {
                *slot = 0;
            }
        }
        let depth = std::mem::take(&mut self.depth);
        DEPTH.with(|d| *d.borrow_mut() = depth);
    }
}

/// What the `prefix` policy sees for each candidate, best first (the order `select`
/// returns for it), for `routerctl explain`. Not on the request path.
pub fn explain(
    params: &ScoreParams,
    input: &RouteInput<'_>,
    view: &IndexView,
    candidates: &[Candidate],
) -> Vec<Scored> {
    if candidates.is_empty() {
        return Vec::new();
    }
    let costing = Costing::new(params, input, view, candidates);
    let n = candidates.len();
    let d = prefix_order(&costing, n, rotation(input.tie, n));
    d.order.iter().map(|i| costing.score(*i)).collect()
}

fn prefix(
    params: &ScoreParams,
    input: &RouteInput<'_>,
    view: &IndexView,
    candidates: &[Candidate],
    want: usize,
    rot: impl Fn(usize) -> usize,
) -> Decision {
    let costing = Costing::new(params, input, view, candidates);
    let mut d = prefix_order(&costing, want.max(2), rot);
    // The runner-up's cost is kept for traces even when only the winner was wanted.
    d.order.truncate(want);
    d
}

/// The `prefix` decision: lowest cost, then load, then the rotation.
fn prefix_order(costing: &Costing<'_>, want: usize, rot: impl Fn(usize) -> usize) -> Decision {
    let keys = (0..costing.candidates.len()).map(|i| {
        let (_, _, _, load, cost) = costing.cost(i);
        (cost, load, i)
    });
    // The rotation only matters on ties: computed inside the comparison.
    let keyed = smallest(keys, want, |a, b| {
        cmp_f64(a.0, b.0)
            .then_with(|| cmp_f64(a.1, b.1))
            .then_with(|| rot(a.2).cmp(&rot(b.2)))
    });
    let costs = Some((keyed[0].0, keyed.get(1).map(|k| k.0)));
    let order: SmallVec<[usize; 8]> = keyed.into_iter().map(|k| k.2).collect();
    let win = costing.score(order[0]);
    let own = win.matched_chunks;
    let best_matched = costing.best_matched;
    let reason = if win.hinted && own < best_matched {
        Reason::Session
    } else if best_matched == 0 {
        Reason::Cold
    } else if own < best_matched {
        Reason::Load
    } else {
        Reason::PrefixHit
    };
    Decision {
        order,
        reason,
        predicted_cached_tokens: costing.tokens_upto.get(own as usize).copied().unwrap_or(0),
        matched_chunks: own,
        costs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::CacheModel;

    fn fp(n: u64, tokens: u32) -> Fingerprints {
        Fingerprints {
            hashes: (1..=n).map(|i| i * 1_000_003).collect(),
            chunk_tokens: vec![tokens; n as usize],
            total_tokens: n * u64::from(tokens),
        }
    }

    fn cands(n: u32) -> Vec<Candidate> {
        (0..n)
            .map(|r| Candidate {
                rank: r,
                key: u64::from(r) * 77,
                weight: 1.0,
                queued_prefill: 0,
                decodes: 0,
            })
            .collect()
    }

    fn model(n: u32) -> CacheModel {
        let mut m = CacheModel::new(10_000, 100);
        for r in 0..n {
            m.set_capacity(r, 1_000_000);
        }
        m
    }

    fn pick(
        policy: Policy,
        f: &Fingerprints,
        m: &CacheModel,
        c: &[Candidate],
        tie: u64,
    ) -> Decision {
        select(
            policy,
            &ScoreParams::default(),
            &RouteInput {
                fps: f,
                session: None,
                tie,
            },
            &m.view(),
            c,
        )
    }

    #[test]
    fn cached_rank_wins() {
        let f = fp(20, 512);
        let mut m = model(4);
        m.record(2, &f.hashes[..15], &f.chunk_tokens[..15], None);
        let d = pick(Policy::Prefix, &f, &m, &cands(4), 0);
        assert_eq!(d.order[0], 2);
        assert_eq!(d.reason, Reason::PrefixHit);
        assert_eq!(d.predicted_cached_tokens, 15 * 512);
        assert_eq!(d.order.len(), 4);
    }

    #[test]
    fn load_moves_only_past_reprefill_cost() {
        let f = fp(20, 512); // 10240 tokens, all cached on rank 0
        let mut m = model(2);
        m.record(0, &f.hashes, &f.chunk_tokens, None);
        let mut c = cands(2);
        // Moving costs re-prefilling 10240 tokens, plus the 2048-token load slack.
        c[0].queued_prefill = 12_000;
        assert_eq!(pick(Policy::Prefix, &f, &m, &c, 0).order[0], 0);
        c[0].queued_prefill = 12_400;
        let d = pick(Policy::Prefix, &f, &m, &c, 0);
        assert_eq!(d.order[0], 1);
        assert_eq!(d.reason, Reason::Load);
        c[0].queued_prefill = 0;
        c[0].decodes = 200; // 200 * 64 = 12800 > 10240 + 2048
        assert_eq!(pick(Policy::Prefix, &f, &m, &c, 0).order[0], 1);
    }

    #[test]
    fn small_load_differences_do_not_move_but_cold_goes_to_least_loaded() {
        let f = fp(4, 512);
        let mut m = model(3);
        m.record(0, &f.hashes[..2], &f.chunk_tokens[..2], None);
        let mut c = cands(3);
        c[0].queued_prefill = 2000; // within the slack
        c[1].queued_prefill = 100;
        let d = pick(Policy::Prefix, &f, &m, &c, 0);
        assert_eq!(d.order[0], 0);
        let cold = fp(4, 700);
        let cold = Fingerprints {
            hashes: cold.hashes.iter().map(|h| h ^ 0xdead).collect(),
            ..cold
        };
        let d = pick(Policy::Prefix, &cold, &m, &c, 0);
        assert_eq!(d.order.as_slice(), &[2, 1, 0], "cold prompts order by load");
    }

    #[test]
    fn weight_scales_cost() {
        let f = fp(4, 512);
        let m = model(2);
        let mut c = cands(2);
        c[0].queued_prefill = 1000;
        c[1].queued_prefill = 1500;
        assert_eq!(pick(Policy::Prefix, &f, &m, &c, 0).order[0], 0);
        c[1].weight = 2.0;
        assert_eq!(pick(Policy::Prefix, &f, &m, &c, 0).order[0], 1);
    }

    #[test]
    fn cold_ties_rotate() {
        let f = fp(3, 512);
        let m = model(4);
        let c = cands(4);
        let firsts: Vec<usize> = (0..8)
            .map(|t| pick(Policy::Prefix, &f, &m, &c, t).order[0])
            .collect();
        assert_eq!(firsts, vec![0, 3, 2, 1, 0, 3, 2, 1]);
        assert_eq!(pick(Policy::Prefix, &f, &m, &c, 0).reason, Reason::Cold);
    }

    #[test]
    fn session_hint_and_rendezvous() {
        let f = fp(10, 512);
        let mut m = model(3);
        m.record(0, &f.hashes, &f.chunk_tokens, None);
        m.record(2, &[], &[], Some(42));
        let c = cands(3);
        let input = RouteInput {
            fps: &f,
            session: Some(42),
            tie: 0,
        };
        let d = select(
            Policy::Prefix,
            &ScoreParams::default(),
            &input,
            &m.view(),
            &c,
        );
        // Rank 2 is credited with rank 0's prefix; tie at equal cost is rotation-broken,
        // so give rank 0 a little load to make the hint decide.
        let mut c2 = c.clone();
        c2[0].decodes = 1;
        let d2 = select(
            Policy::Prefix,
            &ScoreParams::default(),
            &input,
            &m.view(),
            &c2,
        );
        assert_eq!(d2.order[0], 2);
        assert_eq!(d2.reason, Reason::Session);
        assert!(d.order[0] == 0 || d.order[0] == 2);
        // Rendezvous: stable per session, and removing another rank keeps the choice.
        let s1 = select(
            Policy::Session,
            &ScoreParams::default(),
            &input,
            &m.view(),
            &c,
        );
        let winner = c[s1.order[0]].rank;
        let without: Vec<Candidate> = c
            .iter()
            .copied()
            .filter(|x| x.rank == winner || x.rank != (winner + 1) % 3)
            .collect();
        let s2 = select(
            Policy::Session,
            &ScoreParams::default(),
            &input,
            &m.view(),
            &without,
        );
        assert_eq!(without[s2.order[0]].rank, winner);
    }

    #[test]
    fn other_policies() {
        let f = fp(3, 512);
        let m = model(3);
        let mut c = cands(3);
        c[0].queued_prefill = 5;
        c[1].decodes = 1;
        let d = pick(Policy::Load, &f, &m, &c, 0);
        assert_eq!(d.order.as_slice(), &[2, 0, 1]);
        let rr: Vec<usize> = (0..3)
            .map(|t| pick(Policy::RoundRobin, &f, &m, &c, t).order[0])
            .collect();
        assert_eq!(rr, vec![0, 1, 2]);
        assert!(pick(Policy::Prefix, &f, &m, &[], 0).order.is_empty());
    }

    #[test]
    fn explain_lists_every_candidate_in_the_decisions_order_with_its_costs() {
        let f = fp(20, 512);
        let mut m = model(3);
        m.record(2, &f.hashes[..15], &f.chunk_tokens[..15], None);
        let mut c = cands(3);
        c[1].queued_prefill = 5_000;
        let input = RouteInput {
            fps: &f,
            session: None,
            tie: 0,
        };
        let p = ScoreParams::default();
        let e = explain(&p, &input, &m.view(), &c);
        let d = select(Policy::Prefix, &p, &input, &m.view(), &c);
        assert_eq!(
            e.iter().map(|s| s.index).collect::<Vec<_>>(),
            d.order.to_vec()
        );
        assert_eq!(e[0].rank, 2);
        assert_eq!(e[0].cached_tokens, 15 * 512);
        // Rank 2 holds 15 * 512 of its 1M tokens: room for the rest, nothing evicted.
        assert_eq!(m.view().room(2), 1e6 - 15.0 * 512.0);
        assert_eq!(e[0].cost, (5 * 512) as f64);
        let busy = e.iter().find(|s| s.rank == 1).unwrap();
        assert_eq!(busy.load, 5_000.0);
        assert_eq!(busy.excess_load, 5_000.0 - 2048.0);
        assert_eq!(busy.cost, (20 * 512) as f64 + 5_000.0 - 2048.0);
    }

    #[test]
    fn a_rank_near_capacity_is_passed_over_for_a_new_conversation_while_its_own_stay() {
        // Two ranks of 20 chunks' capacity; rank 0 is nearly full with two live
        // conversations, rank 1 holds one small one. Same load everywhere.
        let mut m = CacheModel::new(10_000, 100);
        m.set_capacity(0, 20 * 512);
        m.set_capacity(1, 20 * 512);
        let conv = |seed: u64, n: u64| Fingerprints {
            hashes: (1..=n).map(|i| seed * 1_000_000 + i).collect(),
            chunk_tokens: vec![512; n as usize],
            total_tokens: n * 512,
        };
        let (a, b, small) = (conv(1, 9), conv(2, 9), conv(3, 4));
        m.record(0, &a.hashes, &a.chunk_tokens, None);
        m.record(0, &b.hashes, &b.chunk_tokens, None);
        m.record(1, &small.hashes, &small.chunk_tokens, None);
        let c = cands(2);
        // A new conversation is uncached everywhere: it goes where it fits (rank 0 would
        // have to evict a live conversation to hold it). The rotation alone would have
        // picked rank 0 for this tie seed.
        let new = conv(4, 6);
        assert_eq!(pick(Policy::Prefix, &new, &m, &c, 0).order[0], 1);
        assert_eq!(pick(Policy::Prefix, &new, &m, &c, 2).order[0], 1);
        let no_pressure = select(
            Policy::Prefix,
            &ScoreParams {
                kv_pressure_weight: 0.0,
                ..ScoreParams::default()
            },
            &RouteInput {
                fps: &new,
                session: None,
                tie: 0,
            },
            &m.view(),
            &c,
        );
        assert_eq!(no_pressure.order[0], 0, "the tie seed alone picks rank 0");
        // The live conversations' next turns stay on the full rank.
        for next in [conv(1, 10), conv(2, 10)] {
            let d = pick(Policy::Prefix, &next, &m, &c, 1);
            assert_eq!(d.order[0], 0);
            assert_eq!(d.reason, Reason::PrefixHit);
        }
    }

    #[test]
    fn a_full_fleet_keeps_a_conversation_home_under_a_prefill_burst_that_moves_it_otherwise() {
        let conv = |seed: u64, n: u64| Fingerprints {
            hashes: (1..=n).map(|i| seed * 1_000_000 + i).collect(),
            chunk_tokens: vec![512; n as usize],
            total_tokens: n * 512,
        };
        // Rank 0 holds conversation `a` (9 chunks) and, where its KV is 20 chunks, is
        // nearly full with `b`; the next turn of `a` adds one chunk. Rank 0 has a burst of
        // 10,000 queued prefill tokens, rank 1 none.
        let next = conv(1, 10);
        let holding = |capacity_chunks: u64| {
            let mut m = CacheModel::new(10_000, 100);
            m.set_capacity(0, capacity_chunks * 512);
            m.set_capacity(1, capacity_chunks * 512);
            for f in [conv(1, 9), conv(2, 9)] {
                m.record(0, &f.hashes, &f.chunk_tokens, None);
            }
            m
        };
        let place = |capacity_chunks: u64| {
            let mut c = cands(2);
            c[0].queued_prefill = 10_000;
            pick(Policy::Prefix, &next, &holding(capacity_chunks), &c, 0)
        };
        // Room to spare: 10,000 queued tokens outweigh re-reading 9 chunks on rank 1.
        let roomy = place(1_000);
        assert_eq!((roomy.order[0], roomy.reason), (1, Reason::Load));
        // Rank 0 cannot take a whole copy of the prompt without evicting `b`: the fleet's
        // KV is the constraint, queued prefill counts half, and the conversation stays.
        let full = place(20);
        assert_eq!((full.order[0], full.reason), (0, Reason::PrefixHit));
        // Running decodes still move it: they count twice under pressure.
        let m = holding(20);
        let mut c = cands(2);
        c[0].decodes = 60;
        let d = pick(Policy::Prefix, &next, &m, &c, 0);
        assert_eq!((d.order[0], d.reason), (1, Reason::Load));
        let plain = select(
            Policy::Prefix,
            &ScoreParams {
                pressured_prefill_weight: 1.0,
                pressured_decode_weight: 64.0,
                ..ScoreParams::default()
            },
            &RouteInput {
                fps: &next,
                session: None,
                tie: 0,
            },
            &m.view(),
            &c,
        );
        assert_eq!(
            plain.order[0], 0,
            "60 decodes at the plain weight do not move it"
        );
    }

    /// The partial selection the data plane uses orders exactly the first `want`
    /// candidates of the full sort, for every policy, on fleets from 1 to 300 ranks with
    /// shared prefixes, random loads, weights, a session hint and ties.
    #[test]
    fn select_top_is_the_head_of_the_full_order() {
        let mut rnd = crate::testrng::below(0x9e37_79b9_7f4a_7c15);
        for round in 0..60u64 {
            let n = 1 + rnd(300) as u32;
            let mut m = CacheModel::new(1_000_000, 1000);
            for r in 0..n {
                m.set_capacity(r, 20_000 + rnd(40_000));
            }
            let f = fp(40, 256);
            // Most ranks hold the shared first chunks, a few hold the whole conversation.
            for r in 0..n {
                let depth = match rnd(4) {
                    0 => 0,
                    1 => 1 + rnd(40) as usize,
                    _ => 8,
                };
                m.record(
                    r,
                    &f.hashes[..depth],
                    &f.chunk_tokens[..depth],
                    Some(u64::from(r)),
                );
            }
            let mut c = cands(n);
            for cand in &mut c {
                // Equal loads on a third of them: ties the rotation must break.
                if rnd(3) > 0 {
                    cand.queued_prefill = rnd(20_000);
                    cand.decodes = rnd(6);
                }
                if rnd(5) == 0 {
                    cand.weight = 0.5 + rnd(3) as f64 * 0.5;
                }
            }
            let input = RouteInput {
                fps: &f,
                session: (round % 2 == 0).then(|| rnd(u64::from(n))),
                tie: rnd(1000),
            };
            let p = ScoreParams::default();
            let v = m.view();
            for policy in [
                Policy::Prefix,
                Policy::Load,
                Policy::RoundRobin,
                Policy::Session,
            ] {
                let full = select(policy, &p, &input, &v, &c);
                assert_eq!(full.order.len(), n as usize);
                for want in [1, 2, 3, 8, 9, 40] {
                    let top = select_top(policy, &p, &input, &v, &c, want);
                    let k = want.min(n as usize);
                    assert_eq!(
                        &top.order[..],
                        &full.order[..k],
                        "{policy:?} n={n} want={want}"
                    );
                    assert_eq!(top.reason, full.reason);
                    assert_eq!(top.predicted_cached_tokens, full.predicted_cached_tokens);
                    if policy == Policy::Prefix {
                        assert_eq!(top.costs, full.costs);
                    }
                }
            }
        }
    }
}
