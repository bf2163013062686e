//! Checker 1: No acknowledged server-set change is lost. Per server URL, the state (absent,
//! active, draining) evolves by join / leave / drain / undrain. Every `ok` change must
//! take effect at one instant between its invoke and its completion; an `info` change at
//! any instant after its invoke, or never; a `fail` never. The final state each peer
//! reports must be one such an order reaches (Lowe's just-in-time linearization: a set of
//! configurations, each a state and the changes still pending, advanced only when a
//! completion forces it).

use super::{show, Verdict};
use crate::history::{pair, Event, Type};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// A server's state in the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum S {
    /// Not a server.
    Absent,
    /// Taking requests.
    Active,
    /// Drained.
    Draining,
}

/// The change `f` in state `s`: the new state, or None when the cluster refuses it there
/// (leave or drain of an unknown server). A join keeps the drain flag (the state machine
/// updates capacity and weight only).
fn apply(s: S, f: &str) -> Option<S> {
    match (f, s) {
        ("join", S::Absent) => Some(S::Active),
        ("join", s) => Some(s),
        ("leave", S::Absent) | ("drain" | "undrain", S::Absent) => None,
        ("leave", _) => Some(S::Absent),
        ("drain", _) => Some(S::Draining),
        ("undrain", _) => Some(S::Active),
        _ => Some(s),
    }
}

const CHANGES: [&str; 4] = ["join", "leave", "drain", "undrain"];
/// Configurations beyond this make the verdict unknown rather than the run slow.
const MAX_CONFIGS: usize = 200_000;

type Config = (S, BTreeSet<usize>);

/// Linearizes pending changes of `c` in every order until `must` is in; returns the
/// configurations right after it.
fn force(c: &Config, must: usize, fs: &[&str], okay: &[bool], out: &mut HashSet<Config>) {
    let mut seen: HashSet<Config> = HashSet::new();
    let mut stack = vec![c.clone()];
    while let Some((s, pending)) = stack.pop() {
        if !seen.insert((s, pending.clone())) || seen.len() > MAX_CONFIGS {
            continue;
        }
        for &i in &pending {
            let mut rest = pending.clone();
            rest.remove(&i);
            match apply(s, fs[i]) {
                Some(n) => {
                    if i == must {
                        out.insert((n, rest));
                    } else {
                        stack.push((n, rest));
                    }
                }
                // Refused in this state: an acknowledged change cannot have been refused;
                // an unknown one may have been, without effect.
                None if !okay[i] && i != must => stack.push((s, rest)),
                None => {}
            }
        }
    }
}

/// Every state reachable from `c` by applying any of its pending changes in any order.
fn closure(c: &Config, fs: &[&str], out: &mut BTreeSet<S>) {
    let mut seen: HashSet<Config> = HashSet::new();
    let mut stack = vec![c.clone()];
    while let Some((s, pending)) = stack.pop() {
        if !seen.insert((s, pending.clone())) || seen.len() > MAX_CONFIGS {
            continue;
        }
        out.insert(s);
        for &i in &pending {
            let mut rest = pending.clone();
            rest.remove(&i);
            stack.push((apply(s, fs[i]).unwrap_or(s), rest));
        }
    }
}

/// A peer's reported state of `url` in a `final` observation.
fn reported(peer: &serde_json::Value, url: &str) -> S {
    match peer["servers"].get(url) {
        None => S::Absent,
        Some(v) if v["draining"] == true => S::Draining,
        Some(_) => S::Active,
    }
}

/// The checker.
pub fn check(events: &[Event]) -> Verdict {
    let ops: Vec<_> = pair(events)
        .into_iter()
        .filter(|o| CHANGES.contains(&o.invoke.f.as_str()) && o.kind() != Type::Fail)
        .collect();
    let initial: BTreeMap<String, S> = events
        .iter()
        .filter(|e| e.f == "initial")
        .flat_map(|e| {
            e.value["servers"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(u, v)| {
                    let s = if v["draining"] == true {
                        S::Draining
                    } else {
                        S::Active
                    };
                    (u.clone(), s)
                })
        })
        .collect();
    let Some(last_final) = events
        .iter()
        .rev()
        .find(|e| e.f == "final" && e.kind == Type::Ok)
    else {
        return Verdict {
            name: "servers",
            valid: None,
            problems: vec!["no final read of the peers' server sets".into()],
            figures: json!({}),
        };
    };
    let peers: Vec<&serde_json::Value> = last_final.value["peers"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let mut urls: BTreeSet<String> = initial.keys().cloned().collect();
    urls.extend(ops.iter().filter_map(|o| o.arg("url").map(str::to_owned)));
    for p in &peers {
        if let Some(m) = p["servers"].as_object() {
            urls.extend(m.keys().cloned());
        }
    }
    let mut problems = Vec::new();
    let mut unknown = false;
    let mut per_url = serde_json::Map::new();
    for url in &urls {
        let mine: Vec<_> = ops.iter().filter(|o| o.arg("url") == Some(url)).collect();
        let fs: Vec<&str> = mine.iter().map(|o| o.invoke.f.as_str()).collect();
        let okay: Vec<bool> = mine.iter().map(|o| o.kind() == Type::Ok).collect();
        // Invokes and ok completions in time order (an invoke before a completion at the
        // same instant).
        let mut moments: Vec<(f64, u8, usize)> = Vec::new();
        for (i, o) in mine.iter().enumerate() {
            moments.push((o.invoke.time, 0, i));
            if okay[i] {
                moments.push((o.end().unwrap_or(f64::INFINITY), 1, i));
            }
        }
        moments.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let start = initial.get(url).copied().unwrap_or(S::Absent);
        let mut configs: HashSet<Config> = HashSet::from([(start, BTreeSet::new())]);
        let mut broken = false;
        for (_, what, i) in moments {
            if what == 0 {
                configs = configs
                    .into_iter()
                    .map(|(s, mut p)| {
                        p.insert(i);
                        (s, p)
                    })
                    .collect();
                continue;
            }
            let mut next = HashSet::new();
            for c in &configs {
                force(c, i, &fs, &okay, &mut next);
            }
            if next.is_empty() {
                problems.push(format!(
                    "{url}: acknowledged {} cannot take effect in any order: {}",
                    fs[i],
                    show(mine[i].done.unwrap_or(mine[i].invoke))
                ));
                broken = true;
                break;
            }
            if next.len() > MAX_CONFIGS {
                unknown = true;
                broken = true;
                break;
            }
            configs = next;
        }
        if broken {
            continue;
        }
        let mut possible = BTreeSet::new();
        for c in &configs {
            closure(c, &fs, &mut possible);
        }
        // A peer that could not be read says nothing about its servers (convergence
        // reports it).
        for p in peers.iter().filter(|p| p["error"].is_null()) {
            let got = reported(p, url);
            if !possible.contains(&got) {
                problems.push(format!(
                    "{url}: peer {} reports {got:?}; the acknowledged changes allow only {possible:?} (a lost change): {}",
                    p["peer"],
                    show(last_final)
                ));
            }
        }
        per_url.insert(
            url.clone(),
            json!({"changes": mine.len(), "ok": okay.iter().filter(|o| **o).count(),
                   "possible_final": possible.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>()}),
        );
    }
    let mut v = Verdict::new("servers", problems, serde_json::Value::Object(per_url));
    if unknown && v.valid == Some(true) {
        v.valid = None;
        v.problems.push("search too large: unknown".into());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::build::H;
    use crate::history::Type::*;
    use serde_json::json;

    fn fin(h: H, t: f64, servers: serde_json::Value) -> H {
        h.at(t, "observer", Invoke, "final", json!({})).at(
            t,
            "observer",
            Ok,
            "final",
            json!({"peers": [{"peer": "router-1", "servers": servers.clone()},
                                 {"peer": "router-2", "servers": servers}]}),
        )
    }

    #[test]
    fn an_acknowledged_join_that_is_gone_is_invalid() {
        let h = H::default()
            .at(0.0, "admin-1", Invoke, "join", json!({"url": "e5"}))
            .at(0.2, "admin-1", Ok, "join", json!({"url": "e5"}));
        let lost = fin(h, 5.0, json!({}));
        let v = check(&lost.0);
        assert_eq!(v.valid, Some(false), "{v:?}");
        assert!(v.problems[0].contains("lost"), "{v:?}");
        let h = H::default()
            .at(0.0, "admin-1", Invoke, "join", json!({"url": "e5"}))
            .at(0.2, "admin-1", Ok, "join", json!({"url": "e5"}));
        let kept = fin(h, 5.0, json!({"e5": {"draining": false}}));
        assert_eq!(check(&kept.0).valid, Some(true));
    }

    #[test]
    fn unknown_outcomes_may_go_either_way_and_order_is_real_time() {
        // join ok, then leave with unknown outcome: present or absent are both fine.
        let base = || {
            H::default()
                .at(0.0, "admin-1", Invoke, "join", json!({"url": "e5"}))
                .at(0.1, "admin-1", Ok, "join", json!({"url": "e5"}))
                .at(0.2, "admin-2", Invoke, "leave", json!({"url": "e5"}))
                .at(3.0, "admin-2", Info, "leave", json!({"url": "e5"}))
        };
        assert_eq!(check(&fin(base(), 5.0, json!({})).0).valid, Some(true));
        assert_eq!(
            check(&fin(base(), 5.0, json!({"e5": {"draining": false}})).0).valid,
            Some(true)
        );
        // leave ok strictly after join ok: the server must be gone.
        let h = H::default()
            .at(0.0, "admin-1", Invoke, "join", json!({"url": "e5"}))
            .at(0.1, "admin-1", Ok, "join", json!({"url": "e5"}))
            .at(0.2, "admin-2", Invoke, "leave", json!({"url": "e5"}))
            .at(0.3, "admin-2", Ok, "leave", json!({"url": "e5"}));
        assert_eq!(
            check(&fin(h, 5.0, json!({"e5": {"draining": false}})).0).valid,
            Some(false)
        );
        // Concurrent join and leave, both ok: either order, either final state.
        let h = H::default()
            .at(0.0, "admin-1", Invoke, "join", json!({"url": "e5"}))
            .at(0.0, "admin-2", Invoke, "leave", json!({"url": "e5"}))
            .at(0.5, "admin-1", Ok, "join", json!({"url": "e5"}))
            .at(0.6, "admin-2", Ok, "leave", json!({"url": "e5"}));
        let init = |h: H| h.at(-1.0, "setup", Ok, "initial", json!({"servers": {"e5": {}}}));
        let mut with_init = init(H::default());
        with_init.0.extend(h.0);
        assert_eq!(check(&fin(with_init, 5.0, json!({})).0).valid, Some(true));
    }

    #[test]
    fn a_drain_lost_behind_a_join_is_caught() {
        let h = H::default()
            .at(0.0, "setup", Ok, "initial", json!({"servers": {"e1": {}}}))
            .at(1.0, "admin-1", Invoke, "drain", json!({"url": "e1"}))
            .at(1.1, "admin-1", Ok, "drain", json!({"url": "e1"}))
            .at(2.0, "admin-1", Invoke, "join", json!({"url": "e1"}))
            .at(2.1, "admin-1", Ok, "join", json!({"url": "e1"}));
        // The join keeps the drain: a peer showing e1 active lost the drain.
        let v = check(&fin(h, 5.0, json!({"e1": {"draining": false}})).0);
        assert_eq!(v.valid, Some(false), "{v:?}");
    }
}
