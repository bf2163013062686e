//! Checker 7: Soundness of the processes: no panic in any router log (the runner scans them into
//! `log` events), and no peer stuck: after the final heal, every peer's commit index moves
//! past where it stood at the heal, as long as turns were answered after it.

use super::{final_heal, Verdict};
use crate::history::{pair, Event, Type};
use serde_json::json;
use std::collections::BTreeMap;

/// The checker.
pub fn check(events: &[Event]) -> Verdict {
    let mut problems = Vec::new();
    for e in events.iter().filter(|e| e.f == "log") {
        let panics = e.value["panics"].as_u64().unwrap_or(0);
        if panics > 0 {
            problems.push(format!(
                "{} logged {panics} panic(s): {}",
                e.value["peer"], e.value["excerpt"]
            ));
        }
    }
    let heal = final_heal(events);
    let answered_after = pair(events)
        .iter()
        .any(|o| o.invoke.f == "turn" && o.kind() == Type::Ok && o.invoke.time > heal);
    let mut at_heal: BTreeMap<String, u64> = BTreeMap::new();
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    for e in events
        .iter()
        .filter(|e| e.f == "status" && e.kind == Type::Ok)
    {
        let (Some(p), Some(c)) = (e.value["peer"].as_str(), e.value["commit"].as_u64()) else {
            continue;
        };
        if e.time <= heal {
            at_heal.insert(p.to_owned(), c);
        }
        last.insert(p.to_owned(), c);
    }
    // Peers still members at the end (a removed peer's commit index rightly stands still).
    let members: Option<Vec<String>> = events
        .iter()
        .rev()
        .find(|e| e.f == "final" && e.kind == Type::Ok)
        .map(|e| {
            e.value["peers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["peer"].as_str().map(str::to_owned))
                .collect()
        });
    if answered_after {
        for (p, c0) in &at_heal {
            if members.as_ref().is_some_and(|m| !m.contains(p)) {
                continue;
            }
            let c1 = last.get(p).copied().unwrap_or(0);
            if c1 <= *c0 {
                problems.push(format!(
                    "{p} is stuck: commit index {c1} after the heal, {c0} at it"
                ));
            }
        }
    }
    Verdict::new(
        "sound",
        problems,
        json!({"commit_at_heal": at_heal, "commit_at_end": last}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::build::H;
    use crate::history::Type::*;

    #[test]
    fn panics_and_stuck_peers_are_invalid() {
        let h = H::default()
            .at(0.0, "nemesis", Invoke, "partition", json!({}))
            .at(
                1.0,
                "observer",
                Ok,
                "status",
                json!({"peer": "router-1", "commit": 10}),
            )
            .at(2.0, "nemesis", Ok, "partition", json!({}))
            .at(3.0, "client-1", Invoke, "turn", json!({}))
            .at(3.1, "client-1", Ok, "turn", json!({}))
            .at(
                4.0,
                "observer",
                Ok,
                "status",
                json!({"peer": "router-1", "commit": 10}),
            );
        let v = check(&h.0);
        assert_eq!(v.valid, Some(false), "{v:?}");
        assert!(v.problems[0].contains("stuck"));
        let p = H::default().at(
            1.0,
            "observer",
            Ok,
            "log",
            json!({"peer": "router-2", "panics": 1, "excerpt": "thread 'main' panicked"}),
        );
        assert_eq!(check(&p.0).valid, Some(false));
    }
}
