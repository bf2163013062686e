//! The compose cluster as the suite drives it: container names and addresses, docker
//! commands for faults, iptables rules for partitions (a chain of our own hooked into
//! DOCKER-USER, removed by name), and routerctl for admin operations.

use std::process::{Command, Output};
use std::time::Duration;

/// The router containers: (name, address on the compose network, published HTTP port,
/// published admin port, initial Raft node id). The first three are the initial voters;
/// router-4 (profile `extra`) is added and removed by the membership nemesis. A container
/// whose data was lost comes back under a new id.
pub const ROUTERS: [(&str, &str, u16, u16, u64); 4] = [
    ("router-1", "10.77.0.11", 18081, 17081, 1),
    ("router-2", "10.77.0.12", 18082, 17082, 2),
    ("router-3", "10.77.0.13", 18083, 17083, 3),
    ("router-4", "10.77.0.14", 18084, 17084, 4),
];
/// The router container that is not an initial voter.
pub const SPARE: &str = "router-4";

/// A router's published HTTP port.
pub fn http_port(router: &str) -> u16 {
    ROUTERS.iter().find(|r| r.0 == router).map_or(0, |r| r.2)
}

/// `docker-compose` with each router's node id (`ROUTER_N_ID`, read by docker-compose.yml)
/// in its environment, so no command recreates a router under a stale id.
pub fn compose(ids: &[(&str, u64)], args: &[&str]) -> anyhow::Result<String> {
    let mut c = Command::new("docker-compose");
    c.args(args)
        .current_dir(crate::workspace())
        .env("COMPOSE_PROJECT_NAME", "router");
    for (name, id) in ids {
        let n = name.trim_start_matches("router-");
        c.env(format!("ROUTER_{n}_ID"), id.to_string());
    }
    checked(c.output()?, "docker-compose", args)
}

/// Removes a router container and its data volume: the disk is gone.
pub fn wipe(router: &str) -> anyhow::Result<()> {
    let _ = sh("docker", &["rm", "-f", router]);
    must(
        "docker",
        &["volume", "rm", "-f", &format!("router_{router}-data")],
    )?;
    Ok(())
}

/// A container's log (stdout and stderr).
pub fn logs(name: &str) -> String {
    sh("docker", &["logs", name])
        .map(|o| text(&o))
        .unwrap_or_default()
}
/// Engines the admin clients join, drain and remove (1 and 2 always stay).
pub const MOVABLE: [&str; 3] = [
    "http://engine-3:9000",
    "http://engine-4:9000",
    "http://engine-5:9000",
];
/// Every engine container.
pub const ENGINES: [&str; 5] = ["engine-1", "engine-2", "engine-3", "engine-4", "engine-5"];
/// The compose cluster's admin token (`.env`).
pub const TOKEN: &str = "compose-admin-token-change-me";
/// Our iptables chain.
const CHAIN: &str = "JEPSEN-ROUTER";

/// Runs a command in the workspace root; the output, or why it could not start.
pub fn sh(program: &str, args: &[&str]) -> Result<Output, String> {
    Command::new(program)
        .args(args)
        .current_dir(crate::workspace())
        .output()
        .map_err(|e| format!("{program}: {e}"))
}

/// Runs a command that must succeed.
pub fn must(program: &str, args: &[&str]) -> anyhow::Result<String> {
    checked(
        sh(program, args).map_err(anyhow::Error::msg)?,
        program,
        args,
    )
}

/// Stdout and stderr of a finished command.
fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The output of a command that had to succeed, or what it said.
fn checked(o: Output, program: &str, args: &[&str]) -> anyhow::Result<String> {
    let t = text(&o);
    anyhow::ensure!(
        o.status.success(),
        "{program} {} failed: {t}",
        args.join(" ")
    );
    Ok(t)
}

/// A router's address by name.
pub fn ip_of(router: &str) -> &'static str {
    ROUTERS
        .iter()
        .find(|r| r.0 == router)
        .map_or("0.0.0.0", |r| r.1)
}

/// Creates the partition chain (empty) and hooks it in; removes leftovers first.
pub fn partition_setup() -> anyhow::Result<()> {
    partition_teardown();
    must("iptables", &["-N", CHAIN])?;
    must("iptables", &["-I", "DOCKER-USER", "-j", CHAIN])?;
    Ok(())
}

/// Removes the chain and its hook (also after a failed run).
pub fn partition_teardown() {
    for _ in 0..4 {
        let _ = sh("iptables", &["-D", "DOCKER-USER", "-j", CHAIN]);
    }
    let _ = sh("iptables", &["-F", CHAIN]);
    let _ = sh("iptables", &["-X", CHAIN]);
}

/// Drops packets from `a` to `b` (one way), or with probability `p` when given.
pub fn drop_between(a: &str, b: &str, p: Option<f64>) -> anyhow::Result<()> {
    let (sa, sb) = (ip_of(a), ip_of(b));
    let mut args = vec!["-A", CHAIN, "-s", sa, "-d", sb];
    let prob;
    if let Some(p) = p {
        prob = format!("{p}");
        args.extend([
            "-m",
            "statistic",
            "--mode",
            "random",
            "--probability",
            &prob,
        ]);
    }
    args.extend(["-j", "DROP"]);
    must("iptables", &args)?;
    Ok(())
}

/// Heals every partition.
pub fn heal_all() -> anyhow::Result<()> {
    must("iptables", &["-F", CHAIN])?;
    Ok(())
}

/// `routerctl --json` through `router`'s published admin port: (exit ok, stdout+stderr).
pub async fn routerctl(router: &str, args: &[&str], timeout: Duration) -> (bool, String) {
    let port = ROUTERS.iter().find(|r| r.0 == router).map_or(0, |r| r.3);
    let ctl = crate::workspace().join("target/release/routerctl");
    let ca = crate::workspace().join(".data/compose/certs/ca.pem");
    let mut cmd = tokio::process::Command::new(ctl);
    cmd.arg("--router")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--ca")
        .arg(ca)
        .arg("--token")
        .arg(TOKEN)
        .arg("--json")
        .arg("--timeout")
        .arg(timeout.as_secs().max(1).to_string())
        .args(args)
        .kill_on_drop(true);
    match tokio::time::timeout(timeout + Duration::from_secs(2), cmd.output()).await {
        Ok(Ok(o)) => (o.status.success(), text(&o)),
        Ok(Err(e)) => (false, format!("cannot run routerctl: {e}")),
        Err(_) => (false, "routerctl timed out".into()),
    }
}
