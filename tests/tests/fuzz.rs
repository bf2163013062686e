//! The fuzz targets (`fuzz/`: the request-body path against the serde oracle, and config
//! parsing) run for a bounded time without a finding. A binary of its own, so that its
//! instrumented build never runs beside the timing-sensitive tests in `it`.
//! `FUZZ_SECS` sets the time per target (default 30); `scripts/fuzz.sh 600` runs longer.

use router_tests::{without_test_env, workspace};

#[test]
fn fuzz_targets_find_nothing() {
    let secs = std::env::var("FUZZ_SECS").unwrap_or_else(|_| "30".into());
    let mut cmd = std::process::Command::new("bash");
    cmd.arg(workspace().join("scripts/fuzz.sh")).arg(&secs);
    // The nested cargo must not inherit this test's build environment, nor its flags.
    without_test_env(&mut cmd);
    cmd.env_remove("RUSTFLAGS");
    let out = cmd.output().expect("running scripts/fuzz.sh");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(out.status.success(), "fuzzing found a failure:\n{text}");
    for t in ["canon", "config"] {
        let execs: u64 = text
            .lines()
            .find(|l| l.contains(&format!("{t} stat::number_of_executed_units")))
            .and_then(|l| l.rsplit(':').next())
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no run of {t}:\n{text}"));
        assert!(execs > 1000, "{t} ran only {execs} inputs");
    }
}
