//! The Jepsen suite's short profile (`jepsen run --rounds 1`): every nemesis family once
//! (router kill, pause, partition, packet loss, engine kill or pause, membership change
//! while a peer is down, a peer's disk lost) against the docker-compose cluster, with
//! agent clients and admin changes throughout, and every checker over the history.
//! The full runs are `target/release/jepsen run --time 300 --seed N` (see README).
//! A binary of its own: it owns the `router` compose project while it runs (so does the
//! compose test; cargo runs test binaries one after another).

use router_tests::{without_test_env, workspace};
use std::process::Command;
use std::time::Instant;

#[test]
fn short_profile_every_nemesis_once_and_every_checker_valid() {
    let t = Instant::now();
    let mut build = Command::new("cargo");
    build
        .args(["build", "--release", "--quiet", "-p", "jepsen"])
        .current_dir(workspace());
    without_test_env(&mut build);
    assert!(build.status().expect("cargo").success(), "building jepsen");
    let out = workspace().join("target/jepsen/short");
    // jepsen builds the release binaries and the image itself (compose-up.sh).
    let mut run = Command::new(workspace().join("target/release/jepsen"));
    run.args(["run", "--rounds", "1", "--seed", "7"])
        .args(["--fault-secs", "6", "--quiet-secs", "3"])
        .arg("--out")
        .arg(&out)
        .current_dir(workspace());
    without_test_env(&mut run);
    let o = run.output().expect("running jepsen");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let report = std::fs::read_to_string(out.join("report.md")).unwrap_or_default();
    eprintln!("{report}\n{text}\njepsen short profile: {:?}", t.elapsed());
    assert!(o.status.success(), "a checker found a violation (above)");
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("results.json")).expect("results.json"))
            .expect("results.json is JSON");
    let names: Vec<&str> = results
        .as_array()
        .expect("verdicts")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    for want in [
        "servers",
        "convergence",
        "leave_safety",
        "availability",
        "affinity",
        "elections",
        "membership",
        "sound",
    ] {
        assert!(names.contains(&want), "no {want} verdict in {names:?}");
    }
    for v in results.as_array().expect("verdicts") {
        assert_ne!(v["valid"], false, "{v}");
    }
    // Every family ran: its fault is in the history.
    let history = std::fs::read_to_string(out.join("history.jsonl")).expect("history");
    for f in ["kill", "pause", "partition", "loss", "membership", "disk"] {
        assert!(
            history.contains(&format!(
                "\"process\":\"nemesis\",\"type\":\"invoke\",\"f\":\"{f}\""
            )),
            "no {f} fault in the history"
        );
    }
    assert!(
        history.contains("\"f\":\"engine-"),
        "no engine fault in the history"
    );
}
