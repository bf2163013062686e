//! Checker 3: Leave safety: once `leave X` returned ok naming the peers that confirmed it, no
//! request routed by one of those peers after that moment reaches X (the engines log the
//! router peer of every request and when it routed it), unless X joined again first.

use super::{show, Verdict};
use crate::history::{pair, Event, Type};
use serde_json::json;

/// The checker.
pub fn check(events: &[Event]) -> Verdict {
    let ops = pair(events);
    let requests: Vec<&Event> = events.iter().filter(|e| e.f == "request").collect();
    let mut problems = Vec::new();
    let mut checked = 0u64;
    for leave in ops
        .iter()
        .filter(|o| o.invoke.f == "leave" && o.kind() == Type::Ok)
    {
        let Some(done) = leave.done else { continue };
        let Some(url) = leave.arg("url") else {
            continue;
        };
        let confirmed: Vec<u64> = done.value["confirmed"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_u64()).collect())
            .unwrap_or_default();
        for r in requests.iter().filter(|r| r.value["engine"] == url) {
            let routed = r.value["routed_at"].as_f64().unwrap_or(r.wall);
            let Some(peer) = r.value["peer"].as_u64() else {
                continue;
            };
            if routed <= done.wall || !confirmed.contains(&peer) {
                continue;
            }
            checked += 1;
            // A join of the same URL sent before the request may have brought it back.
            let rejoined = ops.iter().any(|o| {
                o.invoke.f == "join"
                    && o.arg("url") == Some(url)
                    && o.kind() != Type::Fail
                    && o.invoke.wall > done.wall
                    && o.invoke.wall < routed
            });
            if !rejoined {
                problems.push(format!(
                    "peer {peer} routed a request to {url} {:.3}s after confirming its leave: leave {} / request {}",
                    routed - done.wall,
                    show(done),
                    show(r)
                ));
            }
        }
    }
    Verdict::new(
        "leave_safety",
        problems,
        json!({"requests_logged": requests.len(), "requests_after_leaves": checked}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::build::H;
    use crate::history::Type::*;

    #[test]
    fn a_request_to_a_left_server_from_a_confirming_peer_is_invalid() {
        let h = || {
            H::default()
                .at(0.0, "admin-1", Invoke, "leave", json!({"url": "e3"}))
                .at(
                    0.5,
                    "admin-1",
                    Ok,
                    "leave",
                    json!({"url": "e3", "confirmed": [1, 2]}),
                )
        };
        let bad = h().at(
            0.6,
            "engine-3",
            Ok,
            "request",
            json!({"engine": "e3", "peer": 2}),
        );
        let v = check(&bad.0);
        assert_eq!(v.valid, Some(false), "{v:?}");
        // From a peer that did not confirm, or routed before the leave returned: fine.
        let ok = h()
            .at(
                0.6,
                "engine-3",
                Ok,
                "request",
                json!({"engine": "e3", "peer": 3}),
            )
            .at(
                0.4,
                "engine-3",
                Ok,
                "request",
                json!({"engine": "e3", "peer": 1}),
            );
        assert_eq!(check(&ok.0).valid, Some(true));
        // After a new join of the same URL: fine.
        let back = h()
            .at(1.0, "admin-1", Invoke, "join", json!({"url": "e3"}))
            .at(1.1, "admin-1", Ok, "join", json!({"url": "e3"}))
            .at(
                1.2,
                "engine-3",
                Ok,
                "request",
                json!({"engine": "e3", "peer": 1}),
            );
        assert_eq!(check(&back.0).valid, Some(true));
    }
}
