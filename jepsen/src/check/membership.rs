//! Checker 8: Raft membership. The voters every peer reports after the final heal equal a
//! model that starts from the initial voters and applies every `ok` `peers add` / `peers
//! remove` in the order they returned (one whose outcome is unknown may have applied or
//! not); every final voter answers the final read (none was added without catching up);
//! a `peers add` of an address where nothing listened never succeeds and never leaves a
//! voter behind (the bug this suite was built for: such a voter costs the quorum one
//! failure); and a peer restarted with an empty disk under its old id refuses to start.

use super::{show, Verdict};
use crate::history::{pair, Event, Type};
use serde_json::json;
use std::collections::BTreeSet;

/// The checker.
pub fn check(events: &[Event]) -> Verdict {
    let mut problems = Vec::new();
    let initial: BTreeSet<u64> = events
        .iter()
        .find(|e| e.f == "initial")
        .and_then(|e| serde_json::from_value(e.value["voters"].clone()).ok())
        .unwrap_or_else(|| [1, 2, 3].into());
    let mut ops: Vec<_> = pair(events)
        .into_iter()
        .filter(|o| matches!(o.invoke.f.as_str(), "peers-add" | "peers-remove"))
        .collect();
    ops.sort_by(|a, b| {
        let t = |o: &crate::history::Op| o.done.map_or(f64::MAX, |d| d.time);
        t(a).total_cmp(&t(b))
    });
    let mut certain = initial.clone();
    let mut unsure: BTreeSet<u64> = BTreeSet::new();
    let mut unreachable: BTreeSet<u64> = BTreeSet::new();
    let (mut adds, mut removes) = ([0u64; 3], [0u64; 3]);
    let slot = |k: Type| match k {
        Type::Ok => 0,
        Type::Fail => 1,
        _ => 2,
    };
    for o in &ops {
        let Some(id) = o.invoke.value["id"].as_u64() else {
            continue;
        };
        let add = o.invoke.f == "peers-add";
        if add {
            adds[slot(o.kind())] += 1;
        } else {
            removes[slot(o.kind())] += 1;
        }
        if add && o.invoke.value["reachable"] == false {
            unreachable.insert(id);
            if o.kind() == Type::Ok {
                problems.push(format!(
                    "a peer nothing listened for was added as a voter: {}",
                    show(o.done.unwrap_or(o.invoke))
                ));
            }
        }
        match (o.kind(), add) {
            (Type::Ok, true) => {
                certain.insert(id);
            }
            (Type::Ok, false) => {
                certain.remove(&id);
            }
            (Type::Info, _) => {
                unsure.insert(id);
            }
            _ => {}
        }
    }
    // At any time, not only at the end: a voter nobody could reach costs the quorum one
    // failure for as long as it stays.
    for e in events
        .iter()
        .filter(|e| e.f == "status" && e.kind == Type::Ok)
    {
        let Ok(voters) = serde_json::from_value::<BTreeSet<u64>>(e.value["voters"].clone()) else {
            continue;
        };
        if let Some(v) = voters.intersection(&unreachable).next() {
            problems.push(format!(
                "voter {v} was added while nothing listened at its address: {}",
                show(e)
            ));
            break;
        }
    }
    let mut restarts = (0u64, 0u64);
    for e in events
        .iter()
        .filter(|e| e.f == "restart-empty" && e.kind == Type::Ok)
    {
        if e.value["refused"] == true {
            restarts.0 += 1;
        } else {
            restarts.1 += 1;
            problems.push(format!(
                "a peer restarted with an empty disk under its old id was not refused: {}",
                show(e)
            ));
        }
    }
    let last = events
        .iter()
        .rev()
        .find(|e| e.f == "final" && e.kind == Type::Ok);
    let mut finals = Vec::new();
    match last {
        None => problems.push("no final read".into()),
        Some(f) => {
            let peers = f.value["peers"].as_array().cloned().unwrap_or_default();
            let answered: BTreeSet<u64> = peers.iter().filter_map(|p| p["id"].as_u64()).collect();
            let want: BTreeSet<u64> = certain.difference(&unsure).copied().collect();
            for p in &peers {
                let Ok(voters) = serde_json::from_value::<BTreeSet<u64>>(p["voters"].clone())
                else {
                    continue;
                };
                finals.push(json!({"peer": p["peer"], "voters": voters}));
                let sure: BTreeSet<u64> = voters.difference(&unsure).copied().collect();
                if sure != want {
                    problems.push(format!(
                        "{} reports voters {voters:?}; the acknowledged changes give {want:?} \
                         (unknown outcome: {unsure:?})",
                        p["peer"]
                    ));
                }
                for v in voters.intersection(&unreachable) {
                    problems.push(format!(
                        "{} has voter {v}, added while nothing listened at its address",
                        p["peer"]
                    ));
                }
                for v in voters.difference(&answered) {
                    problems.push(format!(
                        "{} has voter {v}, which did not answer after the heal",
                        p["peer"]
                    ));
                }
            }
            if finals.is_empty() {
                problems.push("no peer reported its voters in the final read".into());
            }
        }
    }
    problems.sort();
    problems.dedup();
    Verdict::new(
        "membership",
        problems,
        json!({"adds": {"ok": adds[0], "fail": adds[1], "info": adds[2]},
        "removes": {"ok": removes[0], "fail": removes[1], "info": removes[2]},
        "empty_restarts": {"refused": restarts.0, "not_refused": restarts.1},
        "model": certain, "unknown": unsure, "final": finals}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::build::H;
    use crate::history::Type::*;

    fn final_read(h: H, t: f64, voters: &[u64], answered: &[u64]) -> H {
        let peers: Vec<_> = answered
            .iter()
            .map(|id| json!({"peer": format!("router-{id}"), "id": id, "voters": voters}))
            .collect();
        h.at(t, "observer", Invoke, "final", json!({})).at(
            t,
            "observer",
            Ok,
            "final",
            json!({"peers": peers}),
        )
    }

    fn add(h: H, t: f64, id: u64, reachable: bool, k: Type) -> H {
        let v = json!({"id": id, "reachable": reachable});
        h.at(t, "operator", Invoke, "peers-add", v.clone()).at(
            t + 1.0,
            "operator",
            k,
            "peers-add",
            v,
        )
    }

    #[test]
    fn acknowledged_changes_are_the_final_voters() {
        let h = add(H::default(), 1.0, 4, true, Ok);
        let h = h
            .at(5.0, "operator", Invoke, "peers-remove", json!({"id": 2}))
            .at(6.0, "operator", Info, "peers-remove", json!({"id": 2}));
        let good = final_read(h, 9.0, &[1, 3, 4], &[1, 3, 4]);
        let v = check(&good.0);
        assert_eq!(v.valid, Some(true), "{v:?}");
    }

    #[test]
    fn a_lost_add_is_invalid() {
        let h = add(H::default(), 1.0, 4, true, Ok);
        let v = check(&final_read(h, 9.0, &[1, 2, 3], &[1, 2, 3]).0);
        assert_eq!(v.valid, Some(false), "{v:?}");
        assert!(v.problems[0].contains("acknowledged changes give"), "{v:?}");
    }

    #[test]
    fn an_unreachable_voter_is_invalid() {
        // The bug before b3714bb: the add returned ok at once and 4 stayed a voter.
        let h = add(H::default(), 1.0, 4, false, Ok);
        let v = check(&final_read(h, 9.0, &[1, 2, 3, 4], &[1, 2, 3]).0);
        assert_eq!(v.valid, Some(false), "{v:?}");
        let all = v.problems.join("\n");
        assert!(all.contains("nothing listened"), "{all}");
        assert!(all.contains("did not answer"), "{all}");
        // Refused as it should be: valid.
        let h = add(H::default(), 1.0, 4, false, Fail);
        let v = check(&final_read(h, 9.0, &[1, 2, 3], &[1, 2, 3]).0);
        assert_eq!(v.valid, Some(true), "{v:?}");
    }

    #[test]
    fn an_unreachable_voter_seen_during_the_run_is_invalid() {
        // The add's outcome unknown (it hung without a quorum), removed again later: still
        // caught by what the peers reported meanwhile.
        let h = add(H::default(), 1.0, 5, false, Info).at(
            3.0,
            "observer",
            Ok,
            "status",
            json!({"peer": "router-1", "voters": [1, 2, 3, 5]}),
        );
        let h = h
            .at(5.0, "operator", Invoke, "peers-remove", json!({"id": 5}))
            .at(6.0, "operator", Ok, "peers-remove", json!({"id": 5}));
        let v = check(&final_read(h, 9.0, &[1, 2, 3], &[1, 2, 3]).0);
        assert_eq!(v.valid, Some(false), "{v:?}");
        assert!(v.problems[0].contains("voter 5"), "{v:?}");
    }

    #[test]
    fn an_empty_disk_that_is_not_refused_is_invalid() {
        let h = H::default()
            .at(1.0, "operator", Invoke, "restart-empty", json!({"id": 2}))
            .at(
                2.0,
                "operator",
                Ok,
                "restart-empty",
                json!({"id": 2, "refused": false}),
            );
        let v = check(&final_read(h, 9.0, &[1, 2, 3], &[1, 2, 3]).0);
        assert_eq!(v.valid, Some(false), "{v:?}");
    }
}
