//! Checker 2: Convergence: within `limit` seconds of the final heal, one `final` read shows every
//! peer at the same applied index with the same state digest and server set.

use super::{final_heal, show, Verdict};
use crate::history::{Event, Type};
use serde_json::json;

/// The checker.
pub fn check(events: &[Event], limit: f64) -> Verdict {
    let heal = final_heal(events);
    let reads: Vec<&Event> = events
        .iter()
        .filter(|e| e.f == "final" && e.kind == Type::Ok && e.time >= heal)
        .collect();
    if reads.is_empty() {
        return Verdict {
            name: "convergence",
            valid: None,
            problems: vec!["no final read after the last heal".into()],
            figures: json!({"heal": heal}),
        };
    }
    let agree = |e: &Event| {
        let peers = e.value["peers"].as_array().cloned().unwrap_or_default();
        let key = |p: &serde_json::Value| {
            (
                p["applied"].as_u64(),
                p["digest"].as_str().map(str::to_owned),
                p["servers"].to_string(),
            )
        };
        !peers.is_empty()
            && peers
                .iter()
                .all(|p| p["error"].is_null() && p["digest"].is_string())
            && peers.windows(2).all(|w| key(&w[0]) == key(&w[1]))
    };
    match reads.iter().find(|e| agree(e)) {
        Some(e) if e.time - heal <= limit => Verdict::new(
            "convergence",
            Vec::new(),
            json!({"heal": heal, "converged_after": e.time - heal}),
        ),
        Some(e) => Verdict::new(
            "convergence",
            vec![format!(
                "the peers agreed only {:.1}s after the final heal (limit {limit}s): {}",
                e.time - heal,
                show(e)
            )],
            json!({"heal": heal, "converged_after": e.time - heal}),
        ),
        None => Verdict::new(
            "convergence",
            vec![format!(
                "the peers never agreed after the final heal; last read: {}",
                show(reads[reads.len() - 1])
            )],
            json!({"heal": heal}),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::build::H;
    use crate::history::Type::*;

    fn peer(applied: u64, digest: &str) -> serde_json::Value {
        json!({"peer": "p", "applied": applied, "digest": digest, "servers": {"e1": {}}})
    }

    #[test]
    fn diverged_or_late_peers_are_invalid() {
        let faulty = H::default()
            .at(0.0, "nemesis", Invoke, "kill", json!({}))
            .at(5.0, "nemesis", Ok, "kill", json!({}))
            .at(
                6.0,
                "observer",
                Ok,
                "final",
                json!({"peers": [peer(9, "a"), peer(9, "b")]}),
            );
        assert_eq!(check(&faulty.0, 10.0).valid, Some(false));
        let late = H::default()
            .at(0.0, "nemesis", Invoke, "kill", json!({}))
            .at(5.0, "nemesis", Ok, "kill", json!({}))
            .at(
                6.0,
                "observer",
                Ok,
                "final",
                json!({"peers": [peer(8, "a"), peer(9, "b")]}),
            )
            .at(
                16.0,
                "observer",
                Ok,
                "final",
                json!({"peers": [peer(9, "b"), peer(9, "b")]}),
            );
        assert_eq!(check(&late.0, 10.0).valid, Some(false));
        let good = H::default()
            .at(0.0, "nemesis", Invoke, "kill", json!({}))
            .at(5.0, "nemesis", Ok, "kill", json!({}))
            .at(
                6.0,
                "observer",
                Ok,
                "final",
                json!({"peers": [peer(8, "a"), peer(9, "b")]}),
            )
            .at(
                7.0,
                "observer",
                Ok,
                "final",
                json!({"peers": [peer(9, "b"), peer(9, "b")]}),
            );
        assert_eq!(check(&good.0, 10.0).valid, Some(true));
    }
}
