//! Checker 5: Affinity: follow-up turns of the developers' own conversations on the rank of their
//! previous turn, overall and per fault window (figures), with the least share over the
//! whole run as the verdict. Moves are listed by the router's reason (`x-router-reason`:
//! a `load` move is the scoring's choice, a `prefix_hit` move means the router did not
//! know where the conversation was).

use super::Verdict;
use crate::history::{pair, windows, Event, Type};
use serde_json::json;
use std::collections::BTreeMap;

/// The checker.
pub fn check(events: &[Event], least: f64) -> Verdict {
    let ops = pair(events);
    let mut last: BTreeMap<u64, String> = BTreeMap::new();
    // (time, same rank, reason) per main follow-up.
    let mut follow: Vec<(f64, bool, String)> = Vec::new();
    for o in ops
        .iter()
        .filter(|o| o.invoke.f == "turn" && o.kind() == Type::Ok)
    {
        let Some(done) = o.done else { continue };
        let (Some(conv), Some(rank)) =
            (o.invoke.value["conv"].as_u64(), done.value["rank"].as_str())
        else {
            continue;
        };
        let prev = last.insert(conv, rank.to_owned());
        if o.invoke.value["main"] == false || o.invoke.value["fresh_context"] == true {
            continue;
        }
        if let Some(prev) = prev {
            let reason = done.value["reason"].as_str().unwrap_or("?").to_owned();
            follow.push((o.invoke.time, prev == rank, reason));
        }
    }
    let share = |f: &[&(f64, bool, String)]| {
        let same = f.iter().filter(|x| x.1).count();
        (same, f.len())
    };
    let everything: Vec<&(f64, bool, String)> = follow.iter().collect();
    let (same, n) = share(&everything);
    let mut moves: BTreeMap<&str, u64> = BTreeMap::new();
    for x in follow.iter().filter(|x| !x.1) {
        *moves.entry(x.2.as_str()).or_default() += 1;
    }
    let per_window: Vec<serde_json::Value> = windows(events)
        .into_iter()
        .map(|(fault, start, end, _)| {
            let inside: Vec<&(f64, bool, String)> = follow
                .iter()
                .filter(|x| x.0 >= start && x.0 < end)
                .collect();
            let (s, k) = share(&inside);
            json!({"fault": fault, "start": start, "end": end, "same": s, "follow_ups": k})
        })
        .collect();
    let mut problems = Vec::new();
    if n > 0 && (same as f64) < least * n as f64 {
        problems.push(format!(
            "{same}/{n} follow-ups on their rank, below {:.0}% (moves by reason: {moves:?})",
            least * 100.0
        ));
    }
    let mut v = Verdict::new(
        "affinity",
        problems,
        json!({"same": same, "follow_ups": n, "moves": moves, "windows": per_window}),
    );
    if n == 0 {
        v.valid = None;
        v.problems.push("no follow-up turns".into());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::build::H;
    use crate::history::Type::*;

    #[test]
    fn conversations_that_lose_their_rank_are_invalid() {
        let mut h = H::default();
        for t in 0..10u32 {
            let rank = if t % 2 == 0 { "e1" } else { "e2" };
            h = h
                .at(
                    f64::from(t),
                    "client-1",
                    Invoke,
                    "turn",
                    json!({"conv": 7, "main": true}),
                )
                .at(
                    f64::from(t) + 0.5,
                    "client-1",
                    Ok,
                    "turn",
                    json!({"rank": rank, "reason": "prefix_hit"}),
                );
        }
        let v = check(&h.0, 0.95);
        assert_eq!(v.valid, Some(false), "{v:?}");
        assert_eq!(v.figures["moves"]["prefix_hit"], 9);
    }
}
