//! Helpers for the integration tests: build and start the real binaries, a small fake
//! engine that speaks enough of the OpenAI API, and an HTTP client.

pub mod cluster;
pub mod engine;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The admin token the test clusters run with (the detailed `/health` needs it).
pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Removes what `cargo test` gives its test processes (LD_LIBRARY_PATH and package
/// variables) from a command that runs cargo or a script that does: some build scripts
/// watch them, and a nested build that saw them would rebuild half the graph in every test
/// binary (and again in the shell).
pub fn without_test_env(cmd: &mut Command) {
    for (k, _) in std::env::vars() {
        if k == "LD_LIBRARY_PATH"
            || k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_MANIFEST_")
            || k == "CARGO_CRATE_NAME"
            || k == "CARGO_PRIMARY_PACKAGE"
        {
            cmd.env_remove(k);
        }
    }
}

/// Builds the workspace binaries once per test process and returns the path of `name`.
/// Tests run the same profile the test binary was built with.
pub fn bin(name: &str) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let exe = std::env::current_exe().expect("current exe");
        // target/<profile>/deps/<test> -> target/<profile>
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("profile dir")
            .to_path_buf();
        let release = profile_dir.file_name().is_some_and(|n| n == "release");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        // --all-targets resolves features as `cargo test` does, so the two do not
        // invalidate each other's artifacts.
        cmd.current_dir(workspace())
            .args(["build", "--quiet", "--workspace", "--all-targets"]);
        without_test_env(&mut cmd);
        if release {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("running cargo build");
        assert!(status.success(), "cargo build --bins failed");
        profile_dir
    });
    dir.join(name)
}

/// A free port on its own loopback address (127.1.x.y): each call gets a different
/// address, so two tests running at once can never be handed the same socket between the
/// moment it is released here and the moment the binary binds it.
pub fn free_addr() -> SocketAddr {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let ip = std::net::Ipv4Addr::new(127, 1, (n / 250 % 250) as u8, (n % 250 + 1) as u8);
    let l = TcpListener::bind((ip, 0)).expect("bind");
    l.local_addr().expect("addr")
}

/// A running process, killed on drop.
pub struct Proc {
    /// The child.
    pub child: Child,
    /// Where its stderr goes.
    pub log: PathBuf,
}

impl Proc {
    /// The process's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// Creates a fresh directory.
    pub fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("rtr-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("mkdir");
        TempDir(p)
    }
    /// A path inside.
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts `router` with a TOML config and extra environment, and waits until it answers
/// `/health` at `addr` (any status).
pub async fn start_router(
    dir: &TempDir,
    toml: &str,
    env: &[(&str, &str)],
    addr: SocketAddr,
) -> Proc {
    let cfg = dir.path("router.toml");
    std::fs::write(&cfg, toml).expect("write config");
    let p = spawn_router(dir, &["--config", cfg.to_str().expect("utf8")], env);
    wait_http(addr, &p).await;
    p
}

/// Spawns `router` with arguments and environment, without waiting.
pub fn spawn_router(dir: &TempDir, args: &[&str], env: &[(&str, &str)]) -> Proc {
    let log = dir.path(&format!(
        "router-{}.log",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    let f = std::fs::File::create(&log).expect("log file");
    let mut cmd = Command::new(bin("router"));
    cmd.args(args).stdout(Stdio::null()).stderr(f);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("spawn router");
    Proc { child, log }
}

/// Waits until something answers HTTP on `addr`.
pub async fn wait_http(addr: SocketAddr, p: &Proc) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("router at {addr} did not start; log:\n{}", p.log());
}

/// A plain HTTP client.
pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// A response read whole.
#[derive(Debug)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Headers.
    pub headers: http::HeaderMap,
    /// Body.
    pub body: Bytes,
}

impl Reply {
    /// Body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    /// A header as a string.
    pub fn header(&self, k: &str) -> Option<String> {
        self.headers
            .get(k)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }
}

/// Sends a request and reads the whole response.
pub async fn send(
    method: &str,
    url: &str,
    body: impl Into<Bytes>,
    headers: &[(&str, &str)],
) -> Reply {
    let mut b = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b.body(Full::new(body.into())).expect("request");
    let resp = tokio::time::timeout(Duration::from_secs(30), client().request(req))
        .await
        .expect("timeout")
        .expect("request failed");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    Reply {
        status,
        headers,
        body,
    }
}

/// POSTs JSON.
pub async fn post(url: &str, body: &serde_json::Value, headers: &[(&str, &str)]) -> Reply {
    let mut h = vec![("content-type", "application/json")];
    h.extend_from_slice(headers);
    send("POST", url, serde_json::to_vec(body).expect("json"), &h).await
}

/// Deterministic filler text of `n` bytes (distinct per `seed`).
pub fn text(seed: u64, n: usize) -> String {
    let words = [
        "alpha", "beta", "gamma", "delta", "omega", "fn", "let", "match", "impl", "struct",
        "cargo", "tokio",
    ];
    let mut s = String::with_capacity(n + 16);
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    while s.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(words[(x % words.len() as u64) as usize]);
        s.push(' ');
    }
    s.truncate(n);
    s
}

/// A growing agent conversation.
pub struct Conversation {
    /// Messages so far.
    pub messages: Vec<serde_json::Value>,
    seed: u64,
    turn: u64,
}

impl Conversation {
    /// Starts with a system prompt of `system_bytes` and a first user message.
    pub fn new(seed: u64, system_bytes: usize) -> Self {
        Conversation {
            messages: vec![
                serde_json::json!({"role": "system", "content": text(seed, system_bytes)}),
                serde_json::json!({"role": "user", "content": format!("task {seed}: {}", text(seed + 1000, 300))}),
            ],
            seed,
            turn: 0,
        }
    }

    /// The request body for the next turn.
    pub fn body(&self, model: &str, stream: bool) -> serde_json::Value {
        serde_json::json!({"model": model, "messages": self.messages, "stream": stream, "max_tokens": 16})
    }

    /// Appends the assistant's reply and a tool result of `tool_bytes`.
    pub fn advance(&mut self, reply: &str, tool_bytes: usize) {
        self.turn += 1;
        self.messages
            .push(serde_json::json!({"role": "assistant", "content": reply}));
        self.messages.push(serde_json::json!({"role": "user", "content": text(self.seed * 7919 + self.turn, tool_bytes)}));
    }
}

/// A `router` in front of fake engines, assembled from pieces of TOML: the setup most
/// tests share.
pub struct RouterBuilder {
    tag: String,
    engines: Vec<engine::FakeEngine>,
    new_engines: usize,
    keys: Vec<String>,
    tables: Vec<String>,
    per_upstream: String,
    extra_upstreams: Vec<String>,
    env: Vec<(String, String)>,
    dir: Option<TempDir>,
}

/// Starts describing a router for the test `tag`.
pub fn router(tag: &str) -> RouterBuilder {
    RouterBuilder {
        tag: tag.to_owned(),
        engines: Vec::new(),
        new_engines: 0,
        keys: Vec::new(),
        tables: Vec::new(),
        per_upstream: String::new(),
        extra_upstreams: Vec::new(),
        env: Vec::new(),
        dir: None,
    }
}

impl RouterBuilder {
    /// `n` fresh fake engines, each an upstream.
    pub fn engines(mut self, n: usize) -> Self {
        self.new_engines = n;
        self
    }
    /// Engines the test started itself (with options), each an upstream.
    pub fn with_engines(mut self, e: Vec<engine::FakeEngine>) -> Self {
        self.engines = e;
        self
    }
    /// A top-level config line, e.g. `workers = 1`.
    pub fn key(mut self, line: &str) -> Self {
        self.keys.push(line.to_owned());
        self
    }
    /// A config table, e.g. `[health]\ninterval_ms = 50`.
    pub fn table(mut self, toml: &str) -> Self {
        self.tables.push(toml.to_owned());
        self
    }
    /// Lines added to every engine's `[[upstreams]]` entry.
    pub fn per_upstream(mut self, lines: &str) -> Self {
        self.per_upstream = lines.to_owned();
        self
    }
    /// An upstream that is not one of the engines (a dead address, say).
    pub fn upstream(mut self, url: &str) -> Self {
        self.extra_upstreams.push(url.to_owned());
        self
    }
    /// An environment variable for the router process.
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.to_owned(), v.to_owned()));
        self
    }
    /// Uses a directory the test already made (for files the config names).
    pub fn in_dir(mut self, dir: TempDir) -> Self {
        self.dir = Some(dir);
        self
    }

    /// Starts the engines and the router, and waits until the router answers.
    pub async fn start(self) -> Running {
        let mut engines = self.engines;
        let first = engines.len();
        for i in 0..self.new_engines {
            engines.push(engine::FakeEngine::start(&format!("e{}", first + i)).await);
        }
        let addr = free_addr();
        let dir = self.dir.unwrap_or_else(|| TempDir::new(&self.tag));
        let mut toml = format!("listen = \"{addr}\"\n");
        for k in &self.keys {
            toml.push_str(k);
            toml.push('\n');
        }
        for t in &self.tables {
            toml.push_str(t);
            toml.push('\n');
        }
        for u in &self.extra_upstreams {
            toml.push_str(&format!("[[upstreams]]\nurl = \"{u}\"\n"));
        }
        for e in &engines {
            toml.push_str(&format!(
                "[[upstreams]]\nurl = \"{}\"\n{}\n",
                e.url(),
                self.per_upstream
            ));
        }
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let proc = start_router(&dir, &toml, &env, addr).await;
        Running {
            engines,
            addr,
            proc,
            dir,
        }
    }
}

/// A started router and its engines; everything stops when it is dropped.
pub struct Running {
    /// The fake engines, in upstream order (after any [`RouterBuilder::upstream`]).
    pub engines: Vec<engine::FakeEngine>,
    /// The router's client address.
    pub addr: SocketAddr,
    /// The router process.
    pub proc: Proc,
    /// Its directory (config, log).
    pub dir: TempDir,
}

impl Running {
    /// `http://<router><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}
