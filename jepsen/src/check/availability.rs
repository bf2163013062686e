//! Checker 4: Availability: answered turns per peer, overall and in each fault window. A peer cut
//! off from the other peers but not from the engines (a partition window whose value
//! lists it under `minority`) must keep answering: routing never waits for Raft.
//! Each attempt of a turn is its own operation (a client retries on another router).

use super::Verdict;
use crate::history::{pair, windows, Type};
use crate::history::{Event, Op};
use serde_json::json;
use std::collections::BTreeMap;

/// Attempts at least this many before a share is judged.
const MIN_ATTEMPTS: u64 = 5;

fn tally<'a>(ops: impl Iterator<Item = &'a Op<'a>>) -> BTreeMap<String, (u64, u64)> {
    let mut m: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for o in ops {
        let r = o.invoke.router.clone().unwrap_or_else(|| "?".into());
        let e = m.entry(r).or_default();
        e.1 += 1;
        e.0 += u64::from(o.kind() == Type::Ok);
    }
    m
}

/// The checker.
pub fn check(events: &[Event], least: f64) -> Verdict {
    let all = pair(events);
    let turns: Vec<&Op<'_>> = all.iter().filter(|o| o.invoke.f == "turn").collect();
    let overall = tally(turns.iter().copied());
    let mut problems = Vec::new();
    let mut per_window = Vec::new();
    for (fault, start, end, value) in windows(events) {
        let inside = tally(
            turns
                .iter()
                .copied()
                .filter(|o| o.invoke.time >= start && o.invoke.time < end),
        );
        let minority: Vec<String> = value["minority"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        for r in &minority {
            let (ok, n) = inside.get(r).copied().unwrap_or_default();
            if n >= MIN_ATTEMPTS && (ok as f64) < least * n as f64 {
                problems.push(format!(
                    "{r} answered {ok}/{n} turns while cut off from the other peers ({fault} {start:.1}-{end:.1}s); it should keep routing"
                ));
            }
        }
        per_window.push(json!({"fault": fault, "start": start, "end": end,
            "turns": inside.iter().map(|(r, (ok, n))| (r.clone(), json!({"ok": ok, "attempts": n}))).collect::<serde_json::Map<_, _>>()}));
    }
    let total: (u64, u64) = overall
        .values()
        .fold((0, 0), |a, (ok, n)| (a.0 + ok, a.1 + n));
    Verdict::new(
        "availability",
        problems,
        json!({"ok": total.0, "attempts": total.1,
               "per_router": overall.iter().map(|(r, (ok, n))| (r.clone(), json!({"ok": ok, "attempts": n}))).collect::<serde_json::Map<_, _>>(),
               "windows": per_window}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::build::H;
    use crate::history::Type::*;

    #[test]
    fn a_minority_peer_that_stops_routing_is_invalid() {
        let mut h = H::default().at(
            0.0,
            "nemesis",
            Invoke,
            "partition",
            json!({"minority": ["router-1"]}),
        );
        for i in 0..10 {
            let p = format!("client-{i}");
            let t = 0.1 + f64::from(i) * 0.1;
            h = h.at(t, &p, Invoke, "turn", json!({"conv": i})).at(
                t + 0.05,
                &p,
                if i < 5 { Ok } else { Info },
                "turn",
                json!({}),
            );
        }
        for e in h.0.iter_mut().filter(|e| e.process.starts_with("client")) {
            e.router = Some("router-1".into());
        }
        let h = h.at(5.0, "nemesis", Ok, "partition", json!({}));
        let v = check(&h.0, 0.99);
        assert_eq!(v.valid, Some(false), "{v:?}");
        assert!(v.problems[0].contains("router-1 answered 5/10"));
    }
}
