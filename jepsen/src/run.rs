//! One run against the compose cluster: clients doing agent turns through random routers,
//! an admin client changing the server set through random routers, an observer reading
//! every peer's status, and nemeses on a seeded schedule; then heal, final reads, the
//! engines' request logs and the routers' logs into the history, and the checkers.

use crate::check;
use crate::docker::{self, must, ENGINES, MOVABLE, ROUTERS};
use crate::history::{Event, Type};
use crate::rng::{text, Rng};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What to run.
#[derive(Debug, Clone)]
pub struct Opts {
    /// Seed of every random choice.
    pub seed: u64,
    /// Length of the fault phase.
    pub time: Duration,
    /// Nemesis families: kill, pause, partition, engine, loss.
    pub nemeses: Vec<String>,
    /// Concurrent agent clients.
    pub clients: usize,
    /// Seconds each fault lasts, then seconds of quiet after its heal.
    pub fault_secs: f64,
    /// See `fault_secs`.
    pub quiet_secs: f64,
    /// Where history.jsonl, results.json and report.md go.
    pub out: PathBuf,
    /// Reuse target/release instead of building.
    pub no_build: bool,
    /// Leave the cluster up afterwards.
    pub keep: bool,
}

/// The history being recorded.
pub struct Rec {
    start: Instant,
    start_wall: f64,
    events: Mutex<Vec<Event>>,
}

fn wall() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Rec {
    fn new() -> Rec {
        Rec {
            start: Instant::now(),
            start_wall: wall(),
            events: Mutex::new(Vec::new()),
        }
    }

    /// Records an event now.
    pub fn log(
        &self,
        process: &str,
        kind: Type,
        f: &str,
        value: Value,
        router: Option<&str>,
        error: Option<String>,
    ) {
        let e = Event {
            index: 0,
            time: self.start.elapsed().as_secs_f64(),
            wall: wall(),
            process: process.to_owned(),
            kind,
            f: f.to_owned(),
            value,
            router: router.map(str::to_owned),
            error,
        };
        if let Ok(mut v) = self.events.lock() {
            v.push(e);
        }
    }
}

struct Shared {
    rec: Rec,
    stop: AtomicBool,
    /// The leader's node id as the observer last saw it (0: none).
    leader: AtomicU64,
    http: Client<HttpConnector, Full<Bytes>>,
}

async fn get_json(s: &Shared, url: &str, timeout: Duration) -> Result<Value, String> {
    let req = http::Request::get(url)
        .header("authorization", format!("Bearer {}", docker::TOKEN))
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let resp = tokio::time::timeout(timeout, s.http.request(req))
        .await
        .map_err(|_| "timeout".to_string())?
        .map_err(|e| format!("transport: {e}"))?;
    let b = tokio::time::timeout(timeout, resp.into_body().collect())
        .await
        .map_err(|_| "timeout".to_string())?
        .map_err(|e| e.to_string())?
        .to_bytes();
    serde_json::from_slice(&b).map_err(|e| e.to_string())
}

/// A peer's status from its detailed /health, in the history's `status` shape.
async fn status_of(s: &Shared, router: &str, port: u16) -> Result<Value, String> {
    let h = get_json(
        s,
        &format!("http://127.0.0.1:{port}/health"),
        Duration::from_secs(1),
    )
    .await?;
    let c = &h["cluster"];
    Ok(
        json!({"peer": router, "role": c["role"], "term": c["term"], "leader": c["leader"],
        "commit": c["commit_index"], "applied": c["applied_index"], "digest": c["state_digest"]}),
    )
}

async fn observer(s: Arc<Shared>) {
    while !s.stop.load(Relaxed) {
        // The three at once: a paused peer's timeout must not thin out the others' reads.
        let reads = ROUTERS.map(|(name, _, port, _, _)| {
            let s = s.clone();
            tokio::spawn(async move { (name, status_of(&s, name, port).await) })
        });
        for r in reads {
            let Ok((name, res)) = r.await else { continue };
            match res {
                Ok(v) => {
                    if let Some(l) = v["leader"].as_u64() {
                        if v["role"] == "Leader" {
                            s.leader.store(l, Relaxed);
                        }
                    }
                    s.rec
                        .log("observer", Type::Ok, "status", v, Some(name), None);
                }
                Err(e) => s.rec.log(
                    "observer",
                    Type::Fail,
                    "status",
                    json!({"peer": name}),
                    Some(name),
                    Some(e),
                ),
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One agent client: conversations of growing prompts, each turn to a random router,
/// retried on the others after a failure (each attempt its own operation).
async fn client(s: Arc<Shared>, id: usize, mut rng: Rng, harness: Arc<Vec<String>>) {
    let process = format!("client-{id}");
    let mut n = 0u64;
    while !s.stop.load(Relaxed) {
        n += 1;
        let conv = id as u64 * 1_000_000 + n;
        let mut msgs = vec![
            json!({"role": "system", "content": rng.pick(&harness)}),
            json!({"role": "user", "content": format!("task {conv}: {}", text(&mut rng, 600))}),
        ];
        let turns = 4 + rng.below(12);
        'conv: for turn in 0..turns {
            if s.stop.load(Relaxed) {
                break;
            }
            let body = json!({"model": "sim-model", "messages": msgs, "max_tokens": 8});
            let body = Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
            let mut order: Vec<usize> = (0..ROUTERS.len()).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i + 1));
            }
            let mut reply = None;
            for &r in &order {
                let (name, _, port, _, _) = ROUTERS[r];
                s.rec.log(
                    &process,
                    Type::Invoke,
                    "turn",
                    json!({"conv": conv, "turn": turn, "main": true}),
                    Some(name),
                    None,
                );
                let req =
                    http::Request::post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
                        .header("content-type", "application/json")
                        .body(Full::new(body.clone()));
                let Ok(req) = req else { break 'conv };
                let res = tokio::time::timeout(Duration::from_secs(5), async {
                    let resp = s
                        .http
                        .request(req)
                        .await
                        .map_err(|e| (Type::Fail, format!("transport: {e}")))?;
                    let code = resp.status().as_u16();
                    let h = |k: &str| {
                        resp.headers()
                            .get(k)
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_owned)
                    };
                    let (rank, reason) = (h("x-engine-rank"), h("x-router-reason"));
                    let b = resp
                        .into_body()
                        .collect()
                        .await
                        .map_err(|e| (Type::Info, format!("body: {e}")))?
                        .to_bytes();
                    if code != 200 {
                        return Err((Type::Fail, format!("http {code}")));
                    }
                    let v: Value =
                        serde_json::from_slice(&b).map_err(|e| (Type::Info, e.to_string()))?;
                    let text = v["choices"][0]["message"]["content"]
                        .as_str()
                        .unwrap_or("")
                        .to_owned();
                    Ok((rank, reason, text))
                })
                .await
                .unwrap_or_else(|_| Err((Type::Info, "timeout".into())));
                match res {
                    Ok((rank, reason, text)) => {
                        s.rec.log(
                            &process,
                            Type::Ok,
                            "turn",
                            json!({"conv": conv, "turn": turn, "rank": rank, "reason": reason}),
                            Some(name),
                            None,
                        );
                        reply = Some(text);
                        break;
                    }
                    Err((kind, e)) => {
                        s.rec.log(
                            &process,
                            kind,
                            "turn",
                            json!({"conv": conv, "turn": turn}),
                            Some(name),
                            Some(e),
                        );
                    }
                }
            }
            let Some(reply) = reply else { break };
            msgs.push(json!({"role": "assistant", "content": reply}));
            let n = 300 + rng.below(1500);
            msgs.push(json!({"role": "user", "content": text(&mut rng, n)}));
            tokio::time::sleep(Duration::from_secs_f64(rng.range_f(0.1, 0.4))).await;
        }
    }
}

/// The admin client: join / leave / drain / undrain of the movable engines through a
/// random router. An error that says the change was refused (or never sent) is a fail;
/// anything else (timeouts, a leader lost mid-call) is info: it may still apply.
async fn admin(s: Arc<Shared>, mut rng: Rng) {
    let process = "admin-1";
    while !s.stop.load(Relaxed) {
        tokio::time::sleep(Duration::from_secs_f64(rng.range_f(1.0, 2.5))).await;
        let f = *rng.pick(&["join", "leave", "drain", "undrain"]);
        let url = *rng.pick(&MOVABLE);
        let router = rng.pick(&ROUTERS).0;
        s.rec.log(
            process,
            Type::Invoke,
            f,
            json!({"url": url}),
            Some(router),
            None,
        );
        let args: Vec<&str> = match f {
            "join" => vec!["join", url, "--capacity-tokens", "400000"],
            "leave" => vec!["leave", url],
            "drain" => vec!["drain", url],
            _ => vec!["drain", url, "--undo"],
        };
        let (ok, out) = docker::routerctl(router, &args, Duration::from_secs(10)).await;
        if ok {
            let r: Value = out
                .lines()
                .find_map(|l| serde_json::from_str(l).ok())
                .unwrap_or(Value::Null);
            s.rec.log(
                process,
                Type::Ok,
                f,
                json!({"url": url, "confirmed": r["confirmed_peers"], "unconfirmed": r["unconfirmed_peers"], "log_index": r["log_index"]}),
                Some(router),
                None,
            );
        } else {
            let lower = out.to_ascii_lowercase();
            let refused = lower.contains("unknown server")
                || lower.contains("not a server")
                || lower.contains("connection refused")
                || lower.contains("invalid");
            let kind = if refused { Type::Fail } else { Type::Info };
            s.rec.log(
                process,
                kind,
                f,
                json!({"url": url}),
                Some(router),
                Some(out.trim().to_owned()),
            );
        }
    }
}

fn leader_name(s: &Shared) -> Option<&'static str> {
    let id = s.leader.load(Relaxed);
    ROUTERS.iter().find(|r| r.4 == id).map(|r| r.0)
}

/// Starts one fault; returns its name, description and how to heal it.
async fn start_fault(
    s: &Shared,
    family: &str,
    rng: &mut Rng,
) -> anyhow::Result<(String, Value, Vec<(String, Vec<String>)>)> {
    let names: Vec<&str> = ROUTERS.iter().map(|r| r.0).collect();
    let leader = leader_name(s);
    let lead = json!(leader);
    Ok(match family {
        "kill" => {
            let variant = rng.below(3);
            let targets: Vec<&str> = match (variant, leader) {
                (0, Some(l)) => vec![l],
                (1, _) => {
                    let a = rng.below(3);
                    vec![names[a], names[(a + 1 + rng.below(2)) % 3]]
                }
                _ => vec![*rng.pick(&names)],
            };
            for t in &targets {
                must("docker", &["kill", "-s", "KILL", t])?;
            }
            let heal = targets
                .iter()
                .map(|t| ("docker".to_owned(), vec!["start".to_owned(), t.to_string()]))
                .collect();
            (
                "kill".into(),
                json!({"targets": targets, "leader": if targets.contains(&leader.unwrap_or("")) { lead } else { Value::Null }}),
                heal,
            )
        }
        "pause" => {
            let t = if rng.below(2) == 0 {
                leader.unwrap_or(names[0])
            } else {
                *rng.pick(&names)
            };
            must("docker", &["pause", t])?;
            (
                "pause".into(),
                json!({"targets": [t], "leader": if Some(t) == leader { lead } else { Value::Null }}),
                vec![("docker".into(), vec!["unpause".into(), t.into()])],
            )
        }
        "partition" => {
            let variant = rng.below(4);
            let one = match variant {
                0 => leader.unwrap_or(names[0]),
                _ => *rng.pick(&names),
            };
            let others: Vec<&str> = names.iter().copied().filter(|n| *n != one).collect();
            let (kind, minority): (&str, Vec<&str>) = match variant {
                0 | 1 => {
                    for o in &others {
                        docker::drop_between(one, o, None)?;
                        docker::drop_between(o, one, None)?;
                    }
                    (
                        if variant == 0 {
                            "isolate-leader"
                        } else {
                            "minority"
                        },
                        vec![one],
                    )
                }
                2 => {
                    // A bridge: the two others cannot see each other; `one` sees both.
                    docker::drop_between(others[0], others[1], None)?;
                    docker::drop_between(others[1], others[0], None)?;
                    ("bridge", vec![])
                }
                _ => {
                    docker::drop_between(one, others[0], None)?;
                    ("one-way", vec![])
                }
            };
            (
                "partition".into(),
                json!({"kind": kind, "targets": [one], "minority": minority,
                "leader": if variant == 0 { lead } else { Value::Null }}),
                vec![],
            )
        }
        "loss" => {
            for a in &names {
                for b in &names {
                    if a != b {
                        docker::drop_between(a, b, Some(0.3))?;
                    }
                }
            }
            ("loss".into(), json!({"probability": 0.3}), vec![])
        }
        "engine" => {
            let e = *rng.pick(&ENGINES);
            if rng.below(2) == 0 {
                must("docker", &["kill", "-s", "KILL", e])?;
                (
                    "engine-kill".into(),
                    json!({"targets": [e]}),
                    vec![("docker".into(), vec!["start".into(), e.into()])],
                )
            } else {
                must("docker", &["pause", e])?;
                (
                    "engine-pause".into(),
                    json!({"targets": [e]}),
                    vec![("docker".into(), vec!["unpause".into(), e.into()])],
                )
            }
        }
        other => anyhow::bail!("unknown nemesis '{other}' (kill, pause, partition, loss, engine)"),
    })
}

/// Undoes every fault there may be: network rules, paused and stopped containers.
fn heal_everything() {
    let _ = docker::heal_all();
    for (n, ..) in ROUTERS {
        let _ = docker::sh("docker", &["unpause", n]);
        let _ = docker::sh("docker", &["start", n]);
    }
    for e in ENGINES {
        let _ = docker::sh("docker", &["unpause", e]);
        let _ = docker::sh("docker", &["start", e]);
    }
}

/// Every peer's applied index, digest and server set, read after the final heal.
async fn final_read(s: &Shared) -> Value {
    let mut peers = Vec::new();
    for (name, _, port, _, _) in ROUTERS {
        let st = status_of(s, name, port).await;
        let (ok, out) = docker::routerctl(name, &["servers"], Duration::from_secs(3)).await;
        let servers: Option<Value> = ok
            .then(|| {
                out.lines()
                    .find_map(|l| serde_json::from_str::<Value>(l).ok())
            })
            .flatten();
        match (st, servers) {
            (Ok(mut v), Some(sv)) => {
                let mut m = serde_json::Map::new();
                for x in sv["servers"].as_array().into_iter().flatten() {
                    if let Some(u) = x["url"].as_str() {
                        m.insert(u.to_owned(), json!({"draining": x["draining"]}));
                    }
                }
                v["servers"] = Value::Object(m);
                peers.push(v);
            }
            (st, _) => peers.push(json!({"peer": name, "error": st.err().unwrap_or_else(|| "servers unreadable".into())})),
        }
    }
    json!({"peers": peers})
}

/// Runs the whole thing; returns the verdicts.
pub async fn run(o: Opts) -> anyhow::Result<Vec<check::Verdict>> {
    std::fs::create_dir_all(&o.out)?;
    let logs = crate::workspace().join(".data/compose/engine-logs");
    // Set up: nothing left from an earlier run, then the cluster with engine-5 running
    // (not joined).
    docker::partition_teardown();
    let _ = docker::sh("bash", &["scripts/compose-down.sh"]);
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs)?;
    let mut up = std::process::Command::new("bash");
    up.arg("scripts/compose-up.sh")
        .current_dir(crate::workspace());
    if o.no_build {
        up.env("NO_BUILD", "1");
    }
    let st = up.status()?;
    anyhow::ensure!(st.success(), "scripts/compose-up.sh failed");
    must(
        "docker-compose",
        &["--profile", "extra", "up", "-d", "engine-5"],
    )?;
    docker::partition_setup()?;

    let mut rng = Rng::new(o.seed);
    let s = Arc::new(Shared {
        rec: Rec::new(),
        stop: AtomicBool::new(false),
        leader: AtomicU64::new(0),
        http: Client::builder(TokioExecutor::new()).build(HttpConnector::new()),
    });
    s.rec.log(
        "setup",
        Type::Ok,
        "initial",
        json!({"servers": {
        "http://engine-1:9000": {}, "http://engine-2:9000": {},
        "http://engine-3:9000": {}, "http://engine-4:9000": {}}, "seed": o.seed}),
        None,
        None,
    );
    let harness: Arc<Vec<String>> = Arc::new((0..3).map(|_| text(&mut rng, 6000)).collect());
    let mut tasks = vec![
        tokio::spawn(observer(s.clone())),
        tokio::spawn(admin(s.clone(), rng.fork())),
    ];
    for i in 0..o.clients {
        tasks.push(tokio::spawn(client(
            s.clone(),
            i,
            rng.fork(),
            harness.clone(),
        )));
    }

    // The nemesis schedule: quiet, fault, heal, quiet, ... over every family in turn
    // (shuffled per round) until the time is up.
    let end = Instant::now() + o.time;
    tokio::time::sleep(Duration::from_secs_f64(o.quiet_secs)).await;
    let mut families = o.nemeses.clone();
    'faults: while Instant::now() + Duration::from_secs_f64(o.fault_secs) < end {
        for i in (1..families.len()).rev() {
            families.swap(i, rng.below(i + 1));
        }
        for fam in &families {
            if Instant::now() + Duration::from_secs_f64(o.fault_secs) >= end {
                break 'faults;
            }
            let (name, value, heal) = start_fault(&s, fam, &mut rng).await?;
            s.rec
                .log("nemesis", Type::Invoke, &name, value.clone(), None, None);
            tokio::time::sleep(Duration::from_secs_f64(o.fault_secs)).await;
            for (p, args) in &heal {
                let a: Vec<&str> = args.iter().map(String::as_str).collect();
                must(p, &a)?;
            }
            docker::heal_all()?;
            s.rec.log("nemesis", Type::Ok, &name, value, None, None);
            tokio::time::sleep(Duration::from_secs_f64(o.quiet_secs)).await;
        }
    }
    s.stop.store(true, Relaxed);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(15), t).await;
    }
    heal_everything();
    // Final reads until the peers agree (or the checker's limit has clearly passed).
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(15) {
        s.rec
            .log("observer", Type::Invoke, "final", json!({}), None, None);
        let v = final_read(&s).await;
        let agreed = {
            let p = v["peers"].as_array().cloned().unwrap_or_default();
            let key = |x: &Value| {
                (
                    x["applied"].clone(),
                    x["digest"].clone(),
                    x["servers"].to_string(),
                )
            };
            p.iter().all(|x| x["error"].is_null()) && p.windows(2).all(|w| key(&w[0]) == key(&w[1]))
        };
        s.rec.log("observer", Type::Ok, "final", v, None, None);
        if agreed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The engines' request logs and the routers' logs join the history.
    for e in ENGINES {
        let Ok(text) = std::fs::read_to_string(logs.join(format!("{e}.jsonl"))) else {
            continue;
        };
        for l in text.lines() {
            let Ok(v) = serde_json::from_str::<Value>(l) else {
                continue;
            };
            let w = v["wall"].as_f64().unwrap_or(0.0);
            let engine = v["engine"].as_str().map(|n| format!("http://{n}:9000"));
            let ev = Event {
                index: 0,
                time: w - s.rec.start_wall,
                wall: w,
                process: e.to_owned(),
                kind: Type::Ok,
                f: "request".into(),
                value: json!({"engine": engine, "peer": v["peer"], "routed_at": v["routed_at"]}),
                router: None,
                error: None,
            };
            if let Ok(mut evs) = s.rec.events.lock() {
                evs.push(ev);
            }
        }
    }
    for (name, ..) in ROUTERS {
        let out = docker::sh("docker", &["logs", name])
            .map(|o| {
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                )
            })
            .unwrap_or_default();
        std::fs::write(o.out.join(format!("{name}.log")), &out)?;
        let panics: Vec<&str> = out.lines().filter(|l| l.contains("panicked")).collect();
        s.rec.log(
            "observer",
            Type::Ok,
            "log",
            json!({"peer": name, "panics": panics.len(),
            "excerpt": panics.first().copied().unwrap_or("")}),
            Some(name),
            None,
        );
    }
    let mut events = s.rec.events.lock().map(|e| e.clone()).unwrap_or_default();
    events.sort_by(|a, b| a.time.total_cmp(&b.time));
    for (i, e) in events.iter_mut().enumerate() {
        e.index = i as u64;
    }
    let mut hist = String::new();
    for e in &events {
        hist.push_str(&serde_json::to_string(e)?);
        hist.push('\n');
    }
    std::fs::write(o.out.join("history.jsonl"), hist)?;
    let verdicts = check::all(&events, &check::Limits::default());
    std::fs::write(
        o.out.join("results.json"),
        serde_json::to_vec_pretty(&verdicts)?,
    )?;
    std::fs::write(
        o.out.join("report.md"),
        crate::report::markdown(&o, &events, &verdicts),
    )?;
    std::fs::write(o.out.join("latency.svg"), crate::plot::latency(&events))?;
    std::fs::write(o.out.join("commits.svg"), crate::plot::commits(&events))?;
    docker::partition_teardown();
    if !o.keep {
        let _ = docker::sh("bash", &["scripts/compose-down.sh"]);
    }
    Ok(verdicts)
}
