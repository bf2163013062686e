//! Checker 6: Elections: never two leaders in one term (from every peer's own reports of its role
//! and term), and the time from each fault of a leader to a new leader that a majority of
//! the answering peers names.

use super::{show, Verdict};
use crate::history::{windows, Event, Type};
use serde_json::json;
use std::collections::BTreeMap;

/// The checker.
pub fn check(events: &[Event]) -> Verdict {
    let status: Vec<&Event> = events
        .iter()
        .filter(|e| e.f == "status" && e.kind == Type::Ok)
        .collect();
    let mut leaders: BTreeMap<u64, (&str, &Event)> = BTreeMap::new();
    let mut problems = Vec::new();
    for e in &status {
        if e.value["role"] != "Leader" {
            continue;
        }
        let (Some(term), Some(peer)) = (e.value["term"].as_u64(), e.value["peer"].as_str()) else {
            continue;
        };
        match leaders.get(&term) {
            Some((other, first)) if *other != peer => problems.push(format!(
                "two leaders in term {term}: {other} ({}) and {peer} ({})",
                show(first),
                show(e)
            )),
            Some(_) => {}
            None => {
                leaders.insert(term, (peer, e));
            }
        }
    }
    // Leader faults: windows whose value names the leader it hit. The next leader is the
    // first one any peer reports in a higher term than the faulted leader's (the old leader
    // itself may win again once it is back).
    let mut times = Vec::new();
    for (fault, start, _, value) in windows(events) {
        let Some(old) = value["leader"].as_str() else {
            continue;
        };
        let term_then = status
            .iter()
            .filter(|e| e.time <= start && e.value["role"] == "Leader")
            .filter_map(|e| e.value["term"].as_u64())
            .max()
            .unwrap_or(0);
        let new = status.iter().find(|e| {
            e.time > start
                && e.value["role"] == "Leader"
                && e.value["term"].as_u64().is_some_and(|t| t > term_then)
        });
        match new {
            Some(e) => times.push(json!({"fault": fault, "at": start, "old": old,
                "new": e.value["peer"], "term": e.value["term"], "seconds": e.time - start})),
            None => times.push(json!({"fault": fault, "at": start, "old": old, "new": null})),
        }
    }
    Verdict::new(
        "elections",
        problems,
        json!({"terms": leaders.len(), "leader_faults": times}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::build::H;
    use crate::history::Type::*;

    #[test]
    fn two_leaders_in_one_term_are_invalid() {
        let h = H::default()
            .at(
                1.0,
                "observer",
                Ok,
                "status",
                json!({"peer": "router-1", "role": "Leader", "term": 3}),
            )
            .at(
                1.1,
                "observer",
                Ok,
                "status",
                json!({"peer": "router-2", "role": "Follower", "term": 3}),
            )
            .at(
                2.0,
                "observer",
                Ok,
                "status",
                json!({"peer": "router-2", "role": "Leader", "term": 3}),
            );
        let v = check(&h.0);
        assert_eq!(v.valid, Some(false), "{v:?}");
        let fine = H::default()
            .at(
                0.4,
                "observer",
                Ok,
                "status",
                json!({"peer": "router-1", "role": "Leader", "term": 3}),
            )
            .at(
                0.5,
                "nemesis",
                Invoke,
                "kill",
                json!({"leader": "router-1"}),
            )
            .at(
                1.0,
                "observer",
                Ok,
                "status",
                json!({"peer": "router-1", "role": "Leader", "term": 3}),
            )
            .at(
                2.0,
                "observer",
                Ok,
                "status",
                json!({"peer": "router-2", "role": "Leader", "term": 4}),
            );
        let v = check(&fine.0);
        assert_eq!(v.valid, Some(true), "{v:?}");
        assert_eq!(v.figures["leader_faults"][0]["seconds"], 1.5);
    }
}
