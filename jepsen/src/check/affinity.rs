//! Checker 5: Affinity: follow-up turns of the developers' own conversations on the rank of their
//! previous turn, overall and per fault window (figures), with the least share over the
//! whole run as the verdict. A follow-up whose previous engine was drained, left or
//! faulted (killed or paused) between the two turns is excused: it had to move. Moves are
//! listed by the router's reason (`x-router-reason`: a `load` move is the scoring's
//! choice, a `prefix_hit` move means the router did not know where the conversation was).

use super::Verdict;
use crate::history::{pair, windows, Event, Type};
use serde_json::json;
use std::collections::BTreeMap;

/// Seconds an engine counts as unavailable after its fault heals (health probes, restart).
const RECOVERY: f64 = 5.0;

/// Per engine URL, the times it could not take a conversation: from a drain or leave
/// (invoked, whatever its outcome) to the end of the next undrain or join that succeeded,
/// and engine faults until [`RECOVERY`] after their heal.
fn unavailable(events: &[Event]) -> BTreeMap<String, Vec<(f64, f64)>> {
    let end = events.iter().map(|e| e.time).fold(0.0, f64::max);
    let mut out: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut since: BTreeMap<String, f64> = BTreeMap::new();
    for o in pair(events) {
        let Some(url) = o.arg("url") else { continue };
        match o.invoke.f.as_str() {
            "drain" | "leave" => {
                since.entry(url.to_owned()).or_insert(o.invoke.time);
            }
            "undrain" | "join" if o.kind() == Type::Ok => {
                if let Some(t) = since.remove(url) {
                    out.entry(url.to_owned())
                        .or_default()
                        .push((t, o.end().unwrap_or(end)));
                }
            }
            _ => {}
        }
    }
    for (url, t) in since {
        out.entry(url).or_default().push((t, end));
    }
    for (f, start, stop, value) in windows(events) {
        if !f.starts_with("engine-") {
            continue;
        }
        for t in value["targets"].as_array().into_iter().flatten() {
            if let Some(e) = t.as_str() {
                out.entry(format!("http://{e}:9000"))
                    .or_default()
                    .push((start, stop + RECOVERY));
            }
        }
    }
    out
}

/// One main follow-up: when, whether it stayed, the router's reason, whether excused.
struct Follow {
    time: f64,
    same: bool,
    reason: String,
    excused: bool,
}

/// The checker.
pub fn check(events: &[Event], least: f64) -> Verdict {
    let ops = pair(events);
    let down = unavailable(events);
    let was_down = |rank: &str, from: f64, to: f64| {
        down.get(&format!("http://{rank}:9000"))
            .is_some_and(|v| v.iter().any(|&(a, b)| a <= to && b >= from))
    };
    // Per conversation: the rank and time of its last answered turn.
    let mut last: BTreeMap<u64, (String, f64)> = BTreeMap::new();
    let mut follow: Vec<Follow> = Vec::new();
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
        let prev = last.insert(conv, (rank.to_owned(), done.time));
        if o.invoke.value["main"] == false || o.invoke.value["fresh_context"] == true {
            continue;
        }
        if let Some((prev, at)) = prev {
            let same = prev == rank;
            follow.push(Follow {
                time: o.invoke.time,
                same,
                reason: done.value["reason"].as_str().unwrap_or("?").to_owned(),
                excused: !same && was_down(&prev, at, done.time),
            });
        }
    }
    let counted = |f: &Follow| !f.excused;
    let share = |f: &[&Follow]| {
        let k: Vec<&&Follow> = f.iter().filter(|x| counted(x)).collect();
        (k.iter().filter(|x| x.same).count(), k.len())
    };
    let everything: Vec<&Follow> = follow.iter().collect();
    let (same, n) = share(&everything);
    let excused = follow.iter().filter(|x| x.excused).count();
    let mut moves: BTreeMap<&str, u64> = BTreeMap::new();
    for x in follow.iter().filter(|x| !x.same && counted(x)) {
        *moves.entry(x.reason.as_str()).or_default() += 1;
    }
    let per_window: Vec<serde_json::Value> = windows(events)
        .into_iter()
        .map(|(fault, start, end, _)| {
            let inside: Vec<&Follow> = follow
                .iter()
                .filter(|x| x.time >= start && x.time < end)
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
        json!({"same": same, "follow_ups": n, "excused": excused, "moves": moves,
        "windows": per_window}),
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

    /// Ten turns of one main conversation, one a second, on `rank(turn)`.
    fn turns(rank: impl Fn(u32) -> &'static str) -> H {
        (0..10u32).fold(H::default(), |h, t| {
            h.at(
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
                json!({"rank": rank(t), "reason": "prefix_hit"}),
            )
        })
    }

    #[test]
    fn conversations_that_lose_their_rank_are_invalid() {
        let h = turns(|t| if t % 2 == 0 { "e1" } else { "e2" });
        let v = check(&h.0, 0.95);
        assert_eq!(v.valid, Some(false), "{v:?}");
        assert_eq!(v.figures["moves"]["prefix_hit"], 9);
    }

    #[test]
    fn a_move_off_a_drained_engine_is_excused() {
        let h = turns(|t| if t < 5 { "engine-3" } else { "engine-1" });
        let drained = h
            .at(
                4.6,
                "admin-1",
                Invoke,
                "drain",
                json!({"url": "http://engine-3:9000"}),
            )
            .at(
                4.7,
                "admin-1",
                Ok,
                "drain",
                json!({"url": "http://engine-3:9000"}),
            );
        let v = check(&drained.0, 0.95);
        assert_eq!(v.valid, Some(true), "{v:?}");
        assert_eq!(v.figures["excused"], 1);
        assert_eq!(v.figures["same"], 8);
    }
}
