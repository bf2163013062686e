//! One run against the compose cluster: clients doing agent turns through random routers,
//! an admin client changing the server set through random routers, an observer reading
//! every peer's status, and nemeses on a seeded schedule; then heal, final reads, the
//! engines' request logs and the routers' logs into the history, and the checkers.

use crate::check;
use crate::docker::{self, must, ENGINES, MOVABLE, ROUTERS, SPARE};
use crate::history::{Event, Type};
use crate::rng::{text, Rng};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Seconds between a reply and the conversation's next turn (uniform).
const THINK: (f64, f64) = (1.0, 3.0);

/// What to run.
#[derive(Debug, Clone)]
pub struct Opts {
    /// Seed of every random choice.
    pub seed: u64,
    /// Length of the fault phase.
    pub time: Duration,
    /// When not 0: every family this many times, whatever the time.
    pub rounds: usize,
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

/// Which router containers are members of the cluster (the clients, the admin client and
/// the observer use these) and each container's current node id.
struct Cluster {
    ids: BTreeMap<&'static str, u64>,
    members: Vec<&'static str>,
    next_id: u64,
}

struct Shared {
    rec: Rec,
    cluster: Mutex<Cluster>,
    stop: AtomicBool,
    /// The leader's node id as the observer last saw it (0: none).
    leader: AtomicU64,
    http: Client<HttpConnector, Full<Bytes>>,
}

impl Shared {
    fn members(&self) -> Vec<&'static str> {
        self.cluster
            .lock()
            .map(|c| c.members.clone())
            .unwrap_or_default()
    }

    fn ids(&self) -> Vec<(&'static str, u64)> {
        self.cluster
            .lock()
            .map(|c| c.ids.iter().map(|(k, v)| (*k, *v)).collect())
            .unwrap_or_default()
    }

    fn id_of(&self, router: &str) -> u64 {
        self.ids()
            .into_iter()
            .find(|(n, _)| *n == router)
            .map_or(0, |x| x.1)
    }

    /// A fresh node id (ids are never reused), now `router`'s.
    fn new_id(&self, router: &'static str) -> u64 {
        let Ok(mut c) = self.cluster.lock() else {
            return 0;
        };
        let id = c.next_id;
        c.next_id += 1;
        c.ids.insert(router, id);
        id
    }

    fn set_member(&self, router: &'static str, member: bool) {
        if let Ok(mut c) = self.cluster.lock() {
            c.members.retain(|m| *m != router);
            if member {
                c.members.push(router);
                c.members.sort_unstable();
            }
        }
    }
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
async fn status_of(s: &Shared, router: &str) -> Result<Value, String> {
    let port = docker::http_port(router);
    let h = get_json(
        s,
        &format!("http://127.0.0.1:{port}/health"),
        Duration::from_secs(1),
    )
    .await?;
    let c = &h["cluster"];
    Ok(
        json!({"peer": router, "id": c["node_id"], "role": c["role"], "term": c["term"],
        "leader": c["leader"], "commit": c["commit_index"], "applied": c["applied_index"],
        "digest": c["state_digest"], "voters": c["voters"]}),
    )
}

async fn observer(s: Arc<Shared>) {
    while !s.stop.load(Relaxed) {
        // The three at once: a paused peer's timeout must not thin out the others' reads.
        let reads: Vec<_> = s
            .members()
            .into_iter()
            .map(|name| {
                let s = s.clone();
                tokio::spawn(async move { (name, status_of(&s, name).await) })
            })
            .collect();
        // The leader is the one of the highest term: a deposed leader may still say it
        // leads an older one.
        let mut best: Option<(u64, u64)> = None;
        for r in reads {
            let Ok((name, res)) = r.await else { continue };
            match res {
                Ok(v) => {
                    if let (Some(l), Some(t)) = (v["leader"].as_u64(), v["term"].as_u64()) {
                        if v["role"] == "Leader" && best.is_none_or(|b| t > b.0) {
                            best = Some((t, l));
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
        if let Some((_, l)) = best {
            s.leader.store(l, Relaxed);
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
            let mut order = s.members();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i + 1));
            }
            let mut reply = None;
            for &name in &order {
                let port = docker::http_port(name);
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
            // An agent's next turn waits for the model's answer and its tools: seconds.
            tokio::time::sleep(Duration::from_secs_f64(rng.range_f(THINK.0, THINK.1))).await;
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
        let members = s.members();
        let Some(&router) = members.get(rng.below(members.len().max(1))) else {
            continue;
        };
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
            // Answers that say the change was not made; routerctl's "cannot reach" is a
            // connection that was never made.
            let refused = lower.contains("unknown server")
                || lower.contains("no server")
                || lower.contains("not a server")
                || lower.contains("cannot reach")
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
    s.ids().into_iter().find(|r| r.1 == id).map(|r| r.0)
}

/// Starts one fault; returns its name, description and how to heal it.
async fn start_fault(
    s: &Shared,
    family: &str,
    rng: &mut Rng,
) -> anyhow::Result<(String, Value, Vec<(String, Vec<String>)>)> {
    let names: Vec<&str> = s.members();
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
        other => anyhow::bail!(
            "unknown nemesis '{other}' (kill, pause, partition, loss, engine, membership[:add|add-unreachable|remove], disk)"
        ),
    })
}

/// A member to send an admin change through, other than those in `avoid`.
fn via(s: &Shared, rng: &mut Rng, avoid: &[&str]) -> Option<&'static str> {
    let live: Vec<&'static str> = s
        .members()
        .into_iter()
        .filter(|m| !avoid.contains(m))
        .collect();
    live.get(rng.below(live.len().max(1))).copied()
}

/// One `routerctl peers ...` operation by the operator, recorded: ok, fail when the router
/// said no (the change was not made), info otherwise (it may have been made).
async fn peers_op(
    s: &Shared,
    router: &str,
    f: &str,
    value: Value,
    args: &[&str],
    timeout: Duration,
) -> Type {
    let process = "operator";
    s.rec
        .log(process, Type::Invoke, f, value.clone(), Some(router), None);
    let (ok, out) = docker::routerctl(router, args, timeout).await;
    let kind = if ok {
        Type::Ok
    } else {
        let lower = out.to_ascii_lowercase();
        let refused = lower.contains("did not catch up")
            || lower.contains("never reused")
            || lower.contains("not a member")
            || lower.contains("cannot reach")
            || lower.contains("connection refused");
        if refused {
            Type::Fail
        } else {
            Type::Info
        }
    };
    let err = (!ok).then(|| out.trim().to_owned());
    s.rec.log(process, kind, f, value, Some(router), err);
    kind
}

/// Starts a router container empty (its volume removed) under node id `id`.
fn start_empty(s: &Shared, router: &'static str) -> anyhow::Result<()> {
    docker::wipe(router)?;
    docker::compose(
        &s.ids(),
        &["--profile", "extra", "up", "-d", "--no-deps", router],
    )?;
    Ok(())
}

/// Starts `router` empty under a fresh id and adds it through `through`; a member once ok.
async fn add_fresh(s: &Shared, through: &str, router: &'static str) -> anyhow::Result<Type> {
    let id = s.new_id(router);
    start_empty(s, router)?;
    let (idt, addr) = (id.to_string(), format!("{router}:7081"));
    let k = peers_op(
        s,
        through,
        "peers-add",
        json!({"id": id, "peer": router, "addr": addr, "reachable": true}),
        &["peers", "add", &idt, &addr],
        Duration::from_secs(25),
    )
    .await;
    if k == Type::Ok {
        s.set_member(router, true);
    }
    Ok(k)
}

/// Saves a router's log before its container goes, and checks it for panics.
fn save_log(s: &Shared, out: &std::path::Path, router: &str, tag: &str) {
    let text = docker::logs(router);
    if text.is_empty() {
        return;
    }
    let _ = std::fs::write(out.join(format!("{router}.{tag}.log")), &text);
    let panics: Vec<&str> = text.lines().filter(|l| l.contains("panicked")).collect();
    s.rec.log(
        "observer",
        Type::Ok,
        "log",
        json!({"peer": router, "panics": panics.len(),
        "excerpt": panics.first().copied().unwrap_or("")}),
        Some(router),
        None,
    );
}

/// Reads the voters from a member and makes the member list agree (after an admin change
/// whose outcome is unknown). A container that is no voter is removed.
async fn resync(s: &Shared, out: &std::path::Path) {
    let mut voters: Option<Vec<u64>> = None;
    for _ in 0..20 {
        for m in s.members() {
            if let Ok(v) = status_of(s, m).await {
                if v["role"] == "Leader" {
                    voters = serde_json::from_value(v["voters"].clone()).ok();
                }
            }
        }
        if voters.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let Some(voters) = voters else { return };
    for (name, id) in s.ids() {
        // Clients and the observer use routers that run; a voter whose container does not
        // is left to the checkers (it does not answer the final read).
        let running = docker::sh("docker", &["inspect", "-f", "{{.State.Running}}", name])
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "true");
        let member = voters.contains(&id) && running;
        let was = s.members().contains(&name);
        s.set_member(name, member);
        if was && !member {
            save_log(s, out, name, &format!("removed-{id}"));
            let _ = docker::sh("docker", &["rm", "-f", name]);
        }
    }
}

/// The membership nemesis: a peer of the initial three is killed or paused, and while it
/// is down the spare router is added (started empty under a new id), added while nothing
/// listens at its address (it must never become a voter), or removed.
async fn membership_fault(
    s: &Shared,
    rng: &mut Rng,
    fault_secs: f64,
    out: &std::path::Path,
    forced: Option<&str>,
) -> anyhow::Result<()> {
    if let Some(f) = forced {
        anyhow::ensure!(
            ["add", "add-unreachable", "remove"].contains(&f),
            "membership:{f}: the changes are add, add-unreachable and remove"
        );
    }
    let members = s.members();
    let spare_in = members.contains(&SPARE);
    let initial: Vec<&'static str> = members.iter().copied().filter(|m| *m != SPARE).collect();
    let victim = *rng.pick(&initial);
    let leader = leader_name(s);
    let pause = rng.below(2) == 0;
    let change = if let Some(f) = forced.filter(|f| !spare_in || *f == "remove") {
        f
    } else if spare_in {
        "remove"
    } else if rng.below(3) == 0 {
        "add-unreachable"
    } else {
        "add"
    };
    if pause {
        must("docker", &["pause", victim])?;
    } else {
        must("docker", &["kill", "-s", "KILL", victim])?;
    }
    let t0 = Instant::now();
    let value = json!({"targets": [victim], "fault": if pause { "pause" } else { "kill" },
        "change": change, "leader": if Some(victim) == leader { json!(leader) } else { Value::Null }});
    s.rec.log(
        "nemesis",
        Type::Invoke,
        "membership",
        value.clone(),
        None,
        None,
    );
    let through = via(s, rng, &[victim, SPARE]).unwrap_or(victim);
    let addr = format!("{SPARE}:7081");
    let kind = match change {
        "add" => add_fresh(s, through, SPARE).await?,
        "add-unreachable" => {
            let id = s.new_id(SPARE);
            let _ = docker::sh("docker", &["rm", "-f", SPARE]);
            let idt = id.to_string();
            peers_op(
                s,
                through,
                "peers-add",
                json!({"id": id, "peer": SPARE, "addr": addr, "reachable": false}),
                &["peers", "add", &idt, &addr, "--catch-up-secs", "3"],
                Duration::from_secs(15),
            )
            .await
        }
        _ => {
            let id = s.id_of(SPARE);
            let idt = id.to_string();
            let k = peers_op(
                s,
                through,
                "peers-remove",
                json!({"id": id, "peer": SPARE}),
                &["peers", "remove", &idt],
                Duration::from_secs(15),
            )
            .await;
            if k == Type::Ok {
                s.set_member(SPARE, false);
                save_log(s, out, SPARE, &format!("removed-{id}"));
                let _ = docker::sh("docker", &["rm", "-f", SPARE]);
            }
            k
        }
    };
    let left = Duration::from_secs_f64(fault_secs).saturating_sub(t0.elapsed());
    tokio::time::sleep(left).await;
    if pause {
        must("docker", &["unpause", victim])?;
    } else {
        must("docker", &["start", victim])?;
    }
    docker::heal_all()?;
    s.rec
        .log("nemesis", Type::Ok, "membership", value, None, None);
    if kind == Type::Info {
        resync(s, out).await;
    }
    Ok(())
}

/// The disk nemesis: a peer loses its data volume and is started again under its id. It
/// must refuse to start (it acknowledged entries it no longer has, and a peer never votes
/// with a log it lost). Then the operator's way back: `peers remove` the old id, start it
/// empty under a new id, `peers add` that.
async fn disk_fault(
    s: &Shared,
    rng: &mut Rng,
    fault_secs: f64,
    out: &std::path::Path,
) -> anyhow::Result<()> {
    let members = s.members();
    let initial: Vec<&'static str> = members.iter().copied().filter(|m| *m != SPARE).collect();
    let victim = *rng.pick(&initial);
    let old = s.id_of(victim);
    let leader = leader_name(s);
    let t0 = Instant::now();
    let value = json!({"targets": [victim], "id": old,
        "leader": if Some(victim) == leader { json!(leader) } else { Value::Null }});
    save_log(s, out, victim, &format!("before-disk-loss-{old}"));
    s.rec
        .log("nemesis", Type::Invoke, "disk", value.clone(), None, None);
    start_empty(s, victim)?;
    s.rec.log(
        "operator",
        Type::Invoke,
        "restart-empty",
        json!({"peer": victim, "id": old}),
        Some(victim),
        None,
    );
    let mut line = None;
    let waited = Instant::now();
    while line.is_none() && waited.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        line = docker::logs(victim)
            .lines()
            .find(|l| l.contains("data was lost"))
            .map(str::to_owned);
    }
    // Whether it took part anyway: its own status, if it answers.
    let status = status_of(s, victim).await.ok();
    s.rec.log(
        "operator",
        Type::Ok,
        "restart-empty",
        json!({"peer": victim, "id": old, "refused": line.is_some(), "line": line,
        "status": status}),
        Some(victim),
        None,
    );
    s.set_member(victim, false);
    save_log(s, out, victim, &format!("empty-{old}"));
    let _ = docker::sh("docker", &["rm", "-f", victim]);
    let left = Duration::from_secs_f64(fault_secs).saturating_sub(t0.elapsed());
    tokio::time::sleep(left).await;
    let through = via(s, rng, &[victim, SPARE])
        .or_else(|| via(s, rng, &[victim]))
        .unwrap_or(victim);
    let idt = old.to_string();
    peers_op(
        s,
        through,
        "peers-remove",
        json!({"id": old, "peer": victim}),
        &["peers", "remove", &idt],
        Duration::from_secs(15),
    )
    .await;
    let k = add_fresh(s, through, victim).await?;
    docker::heal_all()?;
    s.rec.log("nemesis", Type::Ok, "disk", value, None, None);
    if k != Type::Ok {
        resync(s, out).await;
    }
    Ok(())
}

/// Undoes every fault there may be: network rules, paused and stopped containers.
fn heal_everything(s: &Shared) {
    let _ = docker::heal_all();
    for n in s.members() {
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
    for name in s.members() {
        let st = status_of(s, name).await;
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
        cluster: Mutex::new(Cluster {
            ids: ROUTERS.iter().map(|r| (r.0, r.4)).collect(),
            members: ROUTERS
                .iter()
                .map(|r| r.0)
                .filter(|n| *n != SPARE)
                .collect(),
            next_id: ROUTERS.len() as u64 + 1,
        }),
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
        "http://engine-3:9000": {}, "http://engine-4:9000": {}}, "seed": o.seed,
        "voters": [1, 2, 3]}),
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
    let time_left = || o.rounds > 0 || Instant::now() + Duration::from_secs_f64(o.fault_secs) < end;
    tokio::time::sleep(Duration::from_secs_f64(o.quiet_secs)).await;
    let mut families = o.nemeses.clone();
    let mut round = 0;
    'faults: while time_left() && (o.rounds == 0 || round < o.rounds) {
        round += 1;
        for i in (1..families.len()).rev() {
            families.swap(i, rng.below(i + 1));
        }
        for fam in &families {
            if !time_left() {
                break 'faults;
            }
            if let Some(forced) = fam.strip_prefix("membership") {
                let forced = forced.strip_prefix(':');
                membership_fault(&s, &mut rng, o.fault_secs, &o.out, forced).await?;
                tokio::time::sleep(Duration::from_secs_f64(o.quiet_secs)).await;
                continue;
            }
            if fam == "disk" {
                disk_fault(&s, &mut rng, o.fault_secs, &o.out).await?;
                tokio::time::sleep(Duration::from_secs_f64(o.quiet_secs)).await;
                continue;
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
    heal_everything(&s);
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
    for name in s.members() {
        let out = docker::logs(name);
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
