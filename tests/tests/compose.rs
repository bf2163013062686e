//! The docker-compose deployment as an operator runs it (docker-compose.yml,
//! scripts/compose-up.sh, scripts/compose-down.sh): three routers behind one DNS name,
//! an agent workload from the `client` container through that name, a fifth engine joined
//! with routerctl during the run, router-1 killed with SIGKILL and started again.
//! A binary of its own: it needs Docker and owns the `router` compose project while it
//! runs. Needs the Docker daemon; fails with a clear message without it.

use router_tests::cluster::health_as;
use router_tests::{post, text, without_test_env, workspace};
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The compose cluster's admin token (`.env`).
const TOKEN: &str = "compose-admin-token-change-me";
/// Published client ports of router-1..3.
const HTTP: [u16; 3] = [18081, 18082, 18083];
/// Published admin ports of router-1..3.
const ADMIN: [u16; 3] = [17081, 17082, 17083];
/// The routers' addresses on the compose network.
const ROUTER_IPS: [&str; 3] = ["10.77.0.11", "10.77.0.12", "10.77.0.13"];
/// When, after the client starts, engine-5 is joined, router-1 killed and started again.
const JOIN_AT: Duration = Duration::from_secs(12);
/// One fingerprint chunk of the router's default (2048 bytes) in enginesim tokens (4 bytes
/// each): the finest grain at which the router can tell two ranks' copies of a
/// conversation apart.
const CHUNK_TOKENS: u64 = 512;
const KILL_AT: Duration = Duration::from_secs(24);
const START_AT: Duration = Duration::from_secs(34);

/// A command with the nested-cargo variables of `cargo test` removed (see `bin()`), run in
/// the workspace root.
fn cmd(program: &str, args: &[&str]) -> Command {
    let mut c = Command::new(program);
    c.args(args).current_dir(workspace());
    without_test_env(&mut c);
    c
}

fn run(program: &str, args: &[&str]) -> Output {
    cmd(program, args)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"))
}

fn text_of(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn must(program: &str, args: &[&str]) -> String {
    let o = run(program, args);
    assert!(
        o.status.success(),
        "{program} {} failed:\n{}",
        args.join(" "),
        text_of(&o)
    );
    text_of(&o)
}

/// Runs compose-down.sh when dropped, so a failed run leaves nothing behind.
struct Down;

impl Drop for Down {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for c in ["router-1", "router-2", "router-3"] {
                let o = run("docker", &["logs", "--tail", "25", c]);
                eprintln!("--- {c} (last lines)\n{}", text_of(&o));
            }
        }
        let o = run("bash", &["scripts/compose-down.sh"]);
        eprintln!("compose-down: {}", text_of(&o).trim());
    }
}

fn routerctl(port: u16, args: &[&str]) -> String {
    let router = format!("127.0.0.1:{port}");
    let ca = workspace().join(".data/compose/certs/ca.pem");
    let mut all = vec![
        "--router",
        &router,
        "--ca",
        ca.to_str().expect("path"),
        "--token",
        TOKEN,
    ];
    all.extend_from_slice(args);
    must(
        workspace()
            .join("target/release/routerctl")
            .to_str()
            .expect("path"),
        &all,
    )
}

/// (applied index, state digest) of each router from its detailed /health; None for a
/// router that does not answer.
async fn views() -> Vec<Option<(u64, String)>> {
    let one = |port: u16| async move {
        let h = health_as(([127, 0, 0, 1], port).into(), TOKEN).await?;
        Some((
            h["cluster"]["applied_index"].as_u64()?,
            h["cluster"]["state_digest"].as_str()?.to_owned(),
        ))
    };
    let (a, b, c) = tokio::join!(one(HTTP[0]), one(HTTP[1]), one(HTTP[2]));
    vec![a, b, c]
}

/// Waits until the three routers report the same applied index, then requires the same
/// digest there (equal indexes with different digests is divergence: fails at once).
/// Returns how long it took.
async fn digests_equal_within(limit: Duration) -> Duration {
    let t = Instant::now();
    let mut last = Vec::new();
    while t.elapsed() < limit {
        last = views().await;
        if let [Some(a), Some(b), Some(c)] = &last[..] {
            if a.0 == b.0 && b.0 == c.0 {
                assert!(
                    a.1 == b.1 && b.1 == c.1,
                    "the routers applied the same log index {} but their states differ: {last:?}",
                    a.0
                );
                return t.elapsed();
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "the three routers did not reach one applied index and digest within {limit:?}: {last:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_stack_routes_through_dns_survives_a_router_kill_and_cleans_up() {
    let test_started = Instant::now();
    let info = run("docker", &["info", "--format", "{{.ServerVersion}}"]);
    assert!(
        info.status.success(),
        "Docker is not running: `docker info` failed ({}). This test starts the \
         docker-compose cluster; start the Docker daemon (e.g. `service docker start`) and \
         run it again.",
        text_of(&info).trim()
    );
    let compose = run("docker-compose", &["version", "--short"]);
    assert!(
        compose.status.success(),
        "docker-compose is not installed (apt-get install docker-compose)"
    );

    // Leftovers of an earlier run that died half-way go first.
    let _ = run("bash", &["scripts/compose-down.sh"]);
    let down = Down;

    // Up: release build, image, certificates, cluster, engine-3 and -4 joined.
    let t = Instant::now();
    let up = must("bash", &["scripts/compose-up.sh"]);
    let up_secs = t.elapsed().as_secs_f64();
    eprintln!("{up}");
    let image = must(
        "docker",
        &["image", "inspect", "router:local", "--format", "{{.Size}}"],
    );
    let image_mb = image.trim().parse::<f64>().unwrap_or(0.0) / 1e6;
    assert!(
        image_mb > 1.0 && image_mb < 100.0,
        "image size {image_mb:.1} MB"
    );

    // DNS round-robin: `router` resolves to all three routers from inside the network.
    let resolved = must(
        "docker",
        &[
            "exec",
            "engine-1",
            "/routerbench",
            "resolve",
            "router:8080",
            "--lookups",
            "20",
        ],
    );
    let got: BTreeSet<String> = resolved.lines().map(|l| l.trim().to_owned()).collect();
    let want: BTreeSet<String> = ROUTER_IPS.iter().map(|ip| format!("{ip}:8080")).collect();
    assert_eq!(got, want, "`router` should resolve to the three routers");

    // engine-5 runs but is not joined yet.
    must(
        "docker-compose",
        &["--profile", "extra", "up", "-d", "engine-5"],
    );
    let out = workspace().join(".data/compose/out");
    for f in ["report.json", "turns.jsonl"] {
        let _ = std::fs::remove_file(out.join(f));
    }

    // The client container: 60 s, 12 developers, through http://router:8080.
    let client = cmd(
        "docker-compose",
        &["--profile", "client", "run", "--rm", "-T", "client"],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("docker-compose run client");
    let client_started = Instant::now();
    let unix = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64()
    };
    let client_started_unix = unix();
    let client_out = tokio::task::spawn_blocking(move || client.wait_with_output());

    // Join engine-5 through router-2's admin port; every router sends it new conversations
    // within 2 s of the acknowledgement.
    tokio::time::sleep_until((client_started + JOIN_AT).into()).await;
    let joined = routerctl(
        ADMIN[1],
        &[
            "join",
            "http://engine-5:9000",
            "--capacity-tokens",
            "400000",
        ],
    );
    let acked = Instant::now();
    eprintln!("{}", joined.trim());
    let mut first_on_5 = BTreeMap::new();
    for (i, port) in HTTP.iter().enumerate() {
        let mut tries = 0u32;
        loop {
            tries += 1;
            let body = serde_json::json!({"model": "sim-model", "max_tokens": 2,
                "messages": [{"role": "user", "content":
                    format!("new conversation {i}-{tries}: {}", text(u64::from(*port) * 1000 + u64::from(tries), 400))}]});
            let r = post(
                &format!("http://127.0.0.1:{port}/v1/chat/completions"),
                &body,
                &[],
            )
            .await;
            assert_eq!(r.status, 200, "router-{} answered {}", i + 1, r.status);
            if r.header("x-engine-rank").as_deref() == Some("engine-5") {
                first_on_5.insert(format!("router-{}", i + 1), (tries, acked.elapsed()));
                break;
            }
            assert!(
                acked.elapsed() < Duration::from_secs(2),
                "router-{} sent no new conversation to engine-5 within 2 s of the join \
                 ({tries} new conversations tried)",
                i + 1
            );
        }
    }
    eprintln!("first new conversation on engine-5 after the join: {first_on_5:?}");

    // Kill router-1 (SIGKILL) mid-run; clients retry on another address.
    tokio::time::sleep_until((client_started + KILL_AT).into()).await;
    let killed_unix = unix();
    must("docker", &["kill", "-s", "KILL", "router-1"]);
    tokio::time::sleep_until((client_started + START_AT).into()).await;

    // What the two survivors have applied when router-1 comes back: it must catch up.
    let before = views().await;
    let target = before[1..]
        .iter()
        .flatten()
        .map(|v| v.0)
        .max()
        .expect("router-2 and router-3 answer while router-1 is down");
    let started_unix = unix();
    must("docker", &["start", "router-1"]);
    let t = Instant::now();
    loop {
        if let Some(Some((applied, _))) = views().await.first() {
            if *applied >= target {
                break;
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "router-1 did not apply index {target} within 10 s of its restart"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let caught_up = t.elapsed();
    let equal_after_start =
        digests_equal_within(Duration::from_secs(10) - caught_up).await + caught_up;
    let (killed_at, started_at) = (
        killed_unix - client_started_unix,
        started_unix - client_started_unix,
    );
    eprintln!(
        "router-1 killed at {killed_at:.1} s, started at {started_at:.1} s: applied the \
         survivors' index {target} after {caught_up:?}; three equal digests after \
         {equal_after_start:?}"
    );

    // The client's run.
    let o = client_out
        .await
        .expect("join")
        .expect("docker-compose run client");
    let client_text = text_of(&o);
    eprintln!("{client_text}");
    assert!(o.status.success(), "the client failed:\n{client_text}");
    let report: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.join("report.json")).expect("client report.json"),
    )
    .expect("report JSON");
    // Turn times are relative to the client's own start (a moment after `docker-compose
    // run`): put the kill and the restart on its clock.
    let run_unix = report["started_unix"].as_f64().expect("started_unix");
    let (killed_at, started_at) = (killed_unix - run_unix, started_unix - run_unix);
    let turns: Vec<serde_json::Value> = std::fs::read_to_string(out.join("turns.jsonl"))
        .expect("client turns.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).expect("turn JSON"))
        .collect();

    // Every turn answered (a turn cut by the kill was sent again to another router).
    let failed: Vec<&serde_json::Value> = turns.iter().filter(|t| t["ok"] != true).collect();
    assert!(
        failed.is_empty(),
        "{} turns were not answered: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(report["seconds"].as_f64().unwrap_or(0.0) >= 60.0);
    assert!(turns.len() > 300, "only {} turns", turns.len());
    // Through the DNS name: all three routers answered turns.
    let per_router = report["per_router"].as_object().expect("per_router");
    for ip in ROUTER_IPS {
        let n = per_router
            .get(&format!("http://{ip}:8080"))
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        assert!(n > 20, "router at {ip} answered {n} turns: {per_router:?}");
    }
    // No turn went to router-1 while it was down.
    let during_kill = turns
        .iter()
        .filter(|t| {
            let at = t["at"].as_f64().unwrap_or(0.0);
            at > killed_at + 0.5 && at < started_at - 0.5
        })
        .filter(|t| t["router"] == "http://10.77.0.11:8080")
        .count();
    assert_eq!(
        during_kill, 0,
        "turns answered by router-1 while it was killed"
    );

    // Stickiness of the main conversations' follow-ups, overall and from the kill on; every
    // move is listed with the router's reason for it, and what it cost: the previous
    // prompt's tokens the new rank did not have. A conversation whose history grew by less
    // than one fingerprint chunk since it was placed matches its rank and any rank holding
    // the shared system prompt equally, and load picks; such a move re-reads less than a
    // chunk (in the first seconds, when every first turn lands on the rank holding the
    // system prompt, a handful of them happen). A costly move re-reads more.
    let sticky = |from: f64| {
        let mut last: BTreeMap<u64, (String, u64)> = BTreeMap::new();
        let (mut same, mut all, mut costly) = (0u64, 0u64, 0u64);
        let mut moves: BTreeMap<String, u64> = BTreeMap::new();
        for t in &turns {
            let conv = t["conv"].as_u64().expect("conv");
            let rank = t["rank"].as_str().unwrap_or("").to_owned();
            let prompt = t["prompt_tokens"].as_u64().unwrap_or(0);
            if let Some((prev, prev_prompt)) = last.insert(conv, (rank.clone(), prompt)) {
                let counted = t["main"] == true
                    && t["fresh_context"] != true
                    && t["at"].as_f64().unwrap_or(0.0) >= from;
                if counted {
                    all += 1;
                    if prev == rank {
                        same += 1;
                    } else {
                        let why = t["reason"].as_str().unwrap_or("?").to_owned();
                        *moves.entry(why).or_insert(0) += 1;
                        let kept = t["cached_tokens"].as_u64().unwrap_or(0);
                        if prev_prompt.saturating_sub(kept) > CHUNK_TOKENS {
                            costly += 1;
                        }
                    }
                }
            }
        }
        (same, all, moves, costly)
    };
    let (same, all, moves, costly) = sticky(0.0);
    let (ksame, kall, kmoves, _) = sticky(killed_at);
    eprintln!(
        "main follow-ups on their rank: {same}/{all} overall (moves by the router's reason: \
         {moves:?}; {costly} re-read more than a chunk), {ksame}/{kall} from the kill on \
         ({kmoves:?}); retries {}",
        report["retries"]
    );
    assert!(all >= 200, "only {all} main follow-ups");
    assert!(
        (costly as f64) <= 0.01 * all as f64 && same as f64 >= 0.98 * all as f64,
        "stickiness {same}/{all}, {costly} moves re-read more than a chunk of their \
         conversation (moves by reason: {moves:?})"
    );
    assert!(
        ksame as f64 >= 0.99 * kall as f64,
        "stickiness from the kill on {ksame}/{kall} below 99% (moves by reason: {kmoves:?})"
    );
    // After the run the three routers hold one state.
    let settle = digests_equal_within(Duration::from_secs(10)).await;

    // Down: nothing of the project is left.
    drop(down);
    for (what, args) in [
        (
            "container",
            vec![
                "ps",
                "-aq",
                "--filter",
                "label=com.docker.compose.project=router",
            ],
        ),
        (
            "network",
            vec![
                "network",
                "ls",
                "-q",
                "--filter",
                "label=com.docker.compose.project=router",
            ],
        ),
        (
            "volume",
            vec![
                "volume",
                "ls",
                "-q",
                "--filter",
                "label=com.docker.compose.project=router",
            ],
        ),
    ] {
        let left = must("docker", &args);
        assert!(left.trim().is_empty(), "compose-down left a {what}: {left}");
    }
    for name in ["router-1", "router-2", "router-3", "engine-1", "engine-5"] {
        let o = run("docker", &["inspect", name]);
        assert!(!o.status.success(), "container {name} still exists");
    }
    eprintln!(
        "compose test: up {up_secs:.1} s (build, image, certificates, healthy, joins), image \
         {image_mb:.1} MB, digests equal {settle:?} after the run, whole test {:.1} s",
        test_started.elapsed().as_secs_f64()
    );
}
