//! `routerctl`: operator CLI for a router cluster. Talks to any peer's admin gRPC service
//! (writes go through the leader); human tables by default, `--json` for scripts.

mod certs;
mod probe;
mod top;

use clap::{Parser, Subcommand};
use router_proto::v1::admin_client::AdminClient;
use router_proto::v1::{
    AddPeerRequest, AdminReply, DrainRequest, Empty, ExplainRequest, JoinRequest,
    RemovePeerRequest, ServerInfo, ServerRequest, StatusReply,
};
use serde_json::json;
use std::path::PathBuf;
use std::time::Duration;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// Admin CLI for the router cluster.
#[derive(Parser, Debug)]
#[command(name = "routerctl", version)]
struct Cli {
    /// Admin (peer gRPC) address of any router peer: host:port, or http(s)://host:port.
    #[arg(
        long,
        global = true,
        env = "ROUTERCTL_ROUTER",
        default_value = "127.0.0.1:7081"
    )]
    router: String,
    /// Admin token (the routers' admin_token).
    #[arg(long, global = true, env = "ROUTERCTL_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// CA certificate that signed the routers' peer certificates (enables TLS).
    #[arg(long, global = true, env = "ROUTERCTL_CA")]
    ca: Option<PathBuf>,
    /// Client certificate (optional with TLS; the admin token is what authorizes).
    #[arg(long, global = true, env = "ROUTERCTL_CERT", requires = "key")]
    cert: Option<PathBuf>,
    /// Client key.
    #[arg(long, global = true, env = "ROUTERCTL_KEY", requires = "cert")]
    key: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// Seconds to wait for an answer.
    #[arg(long, global = true, default_value_t = 30)]
    timeout: u64,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Add an engine server (or change its capacity and weight).
    Join {
        /// Base URL, e.g. http://10.0.0.5:8000
        url: String,
        /// Data-parallel ranks behind the URL.
        #[arg(long, default_value_t = 1)]
        ranks: u32,
        /// KV capacity per rank in tokens (default: the routers' default).
        #[arg(long)]
        capacity_tokens: Option<u64>,
        /// Relative speed.
        #[arg(long, default_value_t = 1.0)]
        weight: f64,
    },
    /// Remove an engine server: no new request goes there once this returns.
    Leave {
        /// Base URL.
        url: String,
    },
    /// Stop sending new requests to a server; in-flight ones finish. `--undo` resumes.
    Drain {
        /// Base URL.
        url: String,
        /// Resume instead.
        #[arg(long)]
        undo: bool,
    },
    /// List engine servers with health and load.
    Servers,
    /// Leader, term, indexes per peer, servers, map size.
    Status,
    /// Live view of this peer's ranks (health, drain, in-flight prefill and decodes,
    /// requests/s, cached share, modelled cache fill), its routing decisions per second by
    /// reason, and every peer's role, term, commit/applied index and lag.
    Top {
        /// Print one frame (rates over one interval) and exit.
        #[arg(long)]
        once: bool,
        /// Refresh interval in milliseconds.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
    },
    /// The decision this router would make for a request body now (not forwarded): the
    /// prompt's fingerprint chain, each rank's predicted cached tokens, load and cost, the
    /// winner and why.
    Explain {
        /// File with the request body (JSON); `-` or none: standard input.
        #[arg(default_value = "-")]
        body: String,
        /// chat, completions, messages or responses.
        #[arg(long, default_value = "chat")]
        endpoint: String,
        /// An x-session-id the request would carry.
        #[arg(long)]
        session: Option<String>,
    },
    /// Router peers (Raft members).
    Peers {
        #[command(subcommand)]
        cmd: PeerCmd,
    },
    /// Create a cluster CA (once) and certificates for peers, e.g.
    /// `routerctl certs --dir certs --node router-1,10.0.0.1 --node router-2,10.0.0.2`.
    /// Needs no router.
    Certs {
        /// Directory for ca.pem/ca.key and <name>.pem/<name>.key (keys are mode 0600).
        #[arg(long)]
        dir: PathBuf,
        /// A peer: its name, then the DNS names and IP addresses it is reached at. Repeat.
        #[arg(long = "node")]
        nodes: Vec<String>,
        /// Replace existing peer certificates (the CA is always kept).
        #[arg(long)]
        force: bool,
    },
    /// GET an HTTP URL; exit 0 on a 2xx answer (container health checks). Needs no router.
    Probe {
        /// e.g. http://127.0.0.1:8080/health
        url: String,
    },
}

#[derive(Subcommand, Debug)]
enum PeerCmd {
    /// Add a router peer: learner first, voter once caught up. Ids are never reused.
    Add {
        /// Node id.
        id: u64,
        /// Its peer gRPC address, host:port.
        addr: String,
        /// Seconds the new peer may take to catch up with the log (a big snapshot may
        /// need more); one that does not is taken out again and never votes.
        #[arg(long, default_value_t = 10)]
        catch_up_secs: u64,
    },
    /// Remove a router peer; its id is retired.
    Remove {
        /// Node id.
        id: u64,
    },
}

struct Conn {
    tls: Option<ClientTlsConfig>,
    token: Option<String>,
    timeout: Duration,
}

impl Conn {
    async fn client(&self, addr: &str) -> anyhow::Result<AdminClient<Channel>> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut e = Endpoint::from_shared(format!("{scheme}://{addr}"))?
            .connect_timeout(Duration::from_secs(3))
            .timeout(self.timeout);
        if let Some(t) = &self.tls {
            e = e.tls_config(t.clone())?;
        }
        let ch = e
            .connect()
            .await
            .map_err(|err| anyhow::anyhow!("cannot reach {addr}: {err}"))?;
        Ok(AdminClient::new(ch))
    }

    fn req<T>(&self, msg: T) -> anyhow::Result<tonic::Request<T>> {
        let mut r = tonic::Request::new(msg);
        if let Some(t) = &self.token {
            r.metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse()?);
        }
        Ok(r)
    }
}

fn status_error(router: &str, s: tonic::Status) -> anyhow::Error {
    // A gRPC call to the router's HTTP (client) port gets a JSON 404 that tonic reads as
    // a malformed gRPC frame ("invalid compression flag: 123", 123 being '{').
    let http_port = s.message().contains("compression flag")
        || s.message().contains("content-type")
        || (s.code() == tonic::Code::Unimplemented && s.metadata().get("grpc-status").is_none());
    if http_port {
        return anyhow::anyhow!(
            "{router} answered like the router's HTTP (client) port, not its peer/admin gRPC \
             port: point --router at the peer's cluster.listen address (7081 in the example \
             configs), not its listen address"
        );
    }
    let hint = match s.code() {
        tonic::Code::Unauthenticated => " (pass --token or ROUTERCTL_TOKEN)",
        _ => "",
    };
    anyhow::anyhow!("{:?}: {}{hint}", s.code(), s.message())
}

/// `host:port` from what people type: `host:port`, `http://host:port/`, `https://...`.
fn router_addr(given: &str, tls: bool) -> anyhow::Result<String> {
    let g = given.trim();
    let (rest, https) = if let Some(r) = g.strip_prefix("https://") {
        (r, true)
    } else if let Some(r) = g.strip_prefix("http://") {
        (r, false)
    } else {
        (g, tls)
    };
    if https && !tls {
        anyhow::bail!("{given} is https: pass --ca (ROUTERCTL_CA) with the cluster CA");
    }
    let addr = rest.trim_end_matches('/');
    if addr.is_empty() || addr.contains('/') {
        anyhow::bail!("--router takes host:port (or http(s)://host:port), not {given}");
    }
    Ok(addr.to_owned())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("routerctl: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn tls(cli: &Cli) -> anyhow::Result<Option<ClientTlsConfig>> {
    let Some(ca) = &cli.ca else { return Ok(None) };
    let read =
        |p: &PathBuf| std::fs::read(p).map_err(|e| anyhow::anyhow!("reading {}: {e}", p.display()));
    let mut t = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?));
    if let (Some(c), Some(k)) = (&cli.cert, &cli.key) {
        t = t.identity(Identity::from_pem(read(c)?, read(k)?));
    }
    Ok(Some(t))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    // The commands that talk to no router.
    match &cli.cmd {
        Cmd::Certs { dir, nodes, force } => {
            let nodes = nodes
                .iter()
                .map(|n| certs::parse_node(n))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let made = certs::make(dir, &nodes, *force)?;
            for p in &made.created {
                println!("created {}", p.display());
            }
            for p in &made.kept {
                println!("kept    {}", p.display());
            }
            return Ok(());
        }
        Cmd::Probe { url } => {
            let code = probe::get(url, Duration::from_secs(cli.timeout.min(10))).await?;
            if (200..300).contains(&code) {
                return Ok(());
            }
            anyhow::bail!("{url} answered {code}");
        }
        _ => {}
    }
    let conn = Conn {
        tls: tls(&cli)?,
        token: cli.token.clone(),
        timeout: Duration::from_secs(cli.timeout),
    };
    let router = router_addr(&cli.router, conn.tls.is_some())?;
    let mut c = conn.client(&router).await?;
    match cli.cmd {
        Cmd::Join {
            url,
            ranks,
            capacity_tokens,
            weight,
        } => {
            let r = c
                .join(conn.req(JoinRequest {
                    url: url.clone(),
                    ranks,
                    capacity_tokens: capacity_tokens.unwrap_or(0),
                    weight,
                })?)
                .await
                .map_err(|s| status_error(&cli.router, s))?
                .into_inner();
            reply(
                cli.json,
                &format!("joined {url} as ranks {:?}", r.ranks),
                &r,
            );
        }
        Cmd::Leave { url } => {
            let r = c
                .leave(conn.req(ServerRequest { url: url.clone() })?)
                .await
                .map_err(|s| status_error(&cli.router, s))?
                .into_inner();
            reply(cli.json, &format!("{url} left"), &r);
        }
        Cmd::Drain { url, undo } => {
            let r = c
                .drain(conn.req(DrainRequest {
                    url: url.clone(),
                    draining: !undo,
                })?)
                .await
                .map_err(|s| status_error(&cli.router, s))?
                .into_inner();
            let what = if undo { "resumed" } else { "draining" };
            reply(cli.json, &format!("{url} {what}"), &r);
        }
        Cmd::Explain {
            body,
            endpoint,
            session,
        } => {
            let bytes = if body == "-" {
                let mut b = Vec::new();
                std::io::Read::read_to_end(&mut std::io::stdin(), &mut b)?;
                b
            } else {
                std::fs::read(&body).map_err(|e| anyhow::anyhow!("reading {body}: {e}"))?
            };
            let r = c
                .explain(conn.req(ExplainRequest {
                    body: bytes,
                    endpoint,
                    session_id: session.unwrap_or_default(),
                })?)
                .await
                .map_err(|s| status_error(&cli.router, s))?
                .into_inner();
            let v: serde_json::Value = serde_json::from_str(&r.json)?;
            if cli.json {
                println!("{v}");
            } else {
                print!("{}", explain_text(&v));
            }
        }
        Cmd::Servers => {
            let r = c
                .servers(conn.req(Empty {})?)
                .await
                .map_err(|s| status_error(&cli.router, s))?
                .into_inner();
            if cli.json {
                println!(
                    "{}",
                    json!({"servers": r.servers.iter().map(server_json).collect::<Vec<_>>()})
                );
            } else {
                print_servers(&r.servers);
            }
        }
        Cmd::Status => {
            let me = c
                .status(conn.req(Empty {})?)
                .await
                .map_err(|s| status_error(&cli.router, s))?
                .into_inner();
            let per_peer = top::peer_statuses(&mut c, &conn, &me).await?;
            if cli.json {
                let peers: Vec<_> = per_peer
                    .iter()
                    .map(|(p, s)| match s {
                        Ok(s) => json!({"node_id": p.node_id, "addr": p.addr, "voter": p.voter,
                            "role": s.role, "term": s.term, "leader": s.leader,
                            "last_log_index": s.last_log_index, "commit_index": s.commit_index,
                            "applied_index": s.applied_index, "lag": me.commit_index.saturating_sub(s.applied_index),
                            "snapshot_index": s.snapshot_index, "state_digest": format!("{:016x}", s.state_digest),
                            "map_entries": s.map_entries}),
                        Err(e) => json!({"node_id": p.node_id, "addr": p.addr, "voter": p.voter, "error": e}),
                    })
                    .collect();
                println!(
                    "{}",
                    json!({"node_id": me.node_id, "leader": me.leader, "term": me.term,
                        "commit_index": me.commit_index, "applied_index": me.applied_index,
                        "map_entries": me.map_entries, "state_digest": format!("{:016x}", me.state_digest),
                        "peers": peers, "servers": me.servers.iter().map(server_json).collect::<Vec<_>>()})
                );
            } else {
                print_status(&me, &per_peer);
            }
        }
        Cmd::Top { once, interval_ms } => {
            let every = Duration::from_millis(interval_ms.max(100));
            let mut prev = top::read(&mut c, &conn)
                .await
                .map_err(|e| anyhow::anyhow!("{}: {e}", cli.router))?;
            loop {
                tokio::time::sleep(every).await;
                let cur = top::read(&mut c, &conn)
                    .await
                    .map_err(|e| anyhow::anyhow!("{}: {e}", cli.router))?;
                if cli.json {
                    println!("{}", top::json(&prev, &cur));
                } else if once {
                    print!("{}", top::text(&prev, &cur));
                } else {
                    // Clear the screen and draw the frame from the top left.
                    print!("\x1b[2J\x1b[H{}", top::text(&prev, &cur));
                }
                if once {
                    break;
                }
                prev = cur;
            }
        }
        Cmd::Peers { cmd } => {
            let r = match cmd {
                PeerCmd::Add {
                    id,
                    addr,
                    catch_up_secs,
                } => c
                    .add_peer(conn.req(AddPeerRequest {
                        node_id: id,
                        addr,
                        catch_up_timeout_ms: catch_up_secs * 1000,
                    })?)
                    .await
                    .map_err(|s| status_error(&cli.router, s))?
                    .into_inner(),
                PeerCmd::Remove { id } => c
                    .remove_peer(conn.req(RemovePeerRequest { node_id: id })?)
                    .await
                    .map_err(|s| status_error(&cli.router, s))?
                    .into_inner(),
            };
            reply(cli.json, "done", &r);
        }
        Cmd::Certs { .. } | Cmd::Probe { .. } => unreachable!("handled above"),
    }
    Ok(())
}

fn reply(as_json: bool, what: &str, r: &AdminReply) {
    if as_json {
        println!(
            "{}",
            json!({"ok": r.ok, "message": r.message, "ranks": r.ranks, "log_index": r.log_index,
                "confirmed_peers": r.confirmed_peers, "unconfirmed_peers": r.unconfirmed_peers})
        );
    } else {
        println!("{what}: {}", r.message);
    }
}

fn server_json(s: &ServerInfo) -> serde_json::Value {
    json!({"url": s.url, "ranks": s.ranks, "capacity_tokens": s.capacity_tokens, "weight": s.weight,
        "draining": s.draining, "up": s.up, "inflight": s.inflight})
}

fn print_servers(servers: &[ServerInfo]) {
    println!(
        "{:<32} {:<12} {:>10} {:>6} {:<6} {:<9} {:>8}",
        "URL", "RANKS", "CAPACITY", "WEIGHT", "HEALTH", "STATE", "INFLIGHT"
    );
    for s in servers {
        let ranks = s
            .ranks
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join(",");
        println!(
            "{:<32} {:<12} {:>10} {:>6.2} {:<6} {:<9} {:>8}",
            s.url,
            ranks,
            s.capacity_tokens,
            s.weight,
            if s.up { "up" } else { "down" },
            if s.draining { "draining" } else { "active" },
            s.inflight
        );
    }
}

fn print_status(
    me: &StatusReply,
    peers: &[(router_proto::v1::PeerInfo, Result<StatusReply, String>)],
) {
    println!(
        "leader {}  term {}  commit {}  map entries {}  digest {:016x}",
        me.leader, me.term, me.commit_index, me.map_entries, me.state_digest
    );
    println!();
    println!(
        "{:<5} {:<22} {:<8} {:<10} {:>8} {:>8} {:>8} {:>6} {:<16}",
        "PEER", "ADDR", "VOTER", "ROLE", "LOG", "COMMIT", "APPLIED", "LAG", "DIGEST"
    );
    for (p, s) in peers {
        match s {
            Ok(s) => println!(
                "{:<5} {:<22} {:<8} {:<10} {:>8} {:>8} {:>8} {:>6} {:016x}",
                p.node_id,
                p.addr,
                if p.voter { "voter" } else { "learner" },
                s.role,
                s.last_log_index,
                s.commit_index,
                s.applied_index,
                me.commit_index.saturating_sub(s.applied_index),
                s.state_digest
            ),
            Err(e) => println!(
                "{:<5} {:<22} {:<8} unreachable: {e}",
                p.node_id,
                p.addr,
                if p.voter { "voter" } else { "learner" }
            ),
        }
    }
    println!();
    print_servers(&me.servers);
}

/// `routerctl explain` for a person: the prompt, the winner and why, each candidate.
fn explain_text(v: &serde_json::Value) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "prompt: model {} via {}, {} canonical bytes, ~{} tokens, {} chunks{}",
        v["model"],
        v["endpoint"].as_str().unwrap_or("?"),
        v["canonical_bytes"],
        v["prompt_tokens"],
        v["chunks"],
        v["session"]
            .as_str()
            .map(|s| format!(", session {s}"))
            .unwrap_or_default()
    );
    match v["winner"].as_object() {
        Some(w) => {
            let _ = writeln!(
                o,
                "winner: rank {} {} ({}, {} tokens predicted cached): {}",
                w["rank"],
                w["url"].as_str().unwrap_or("?"),
                w["reason"].as_str().unwrap_or("?"),
                w["predicted_cached_tokens"],
                v["why"].as_str().unwrap_or("")
            );
        }
        None => {
            let _ = writeln!(o, "winner: none: {}", v["why"].as_str().unwrap_or(""));
        }
    }
    let _ = writeln!(
        o,
        "{:<3} {:<5} {:<32} {:>8} {:>10} {:>10} {:>7} {:>10} {:>10}",
        "#", "rank", "server", "matched", "cached", "prefill_q", "decodes", "load", "cost"
    );
    for c in v["candidates"].as_array().into_iter().flatten() {
        let num = |k: &str| c[k].as_f64().map_or("-".into(), |x| format!("{x:.0}"));
        let _ = writeln!(
            o,
            "{:<3} {:<5} {:<32} {:>8} {:>10} {:>10} {:>7} {:>10} {:>10}{}",
            c["place"].to_string(),
            c["rank"].to_string(),
            c["url"].as_str().unwrap_or("?"),
            num("matched_chunks"),
            num("predicted_cached_tokens"),
            num("queued_prefill"),
            num("decodes"),
            num("load"),
            num("cost"),
            if c["session_hint"] == true {
                "  (session)"
            } else {
                ""
            }
        );
    }
    for x in v["ineligible"].as_array().into_iter().flatten() {
        let _ = writeln!(
            o,
            "-   {:<5} {:<32} {}",
            x["rank"].to_string(),
            x["url"].as_str().unwrap_or("?"),
            x["why"].as_str().unwrap_or("")
        );
    }
    o
}
