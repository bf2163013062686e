//! Configuration: built-in defaults < TOML file < `RJ_*` (Ramjet compatibility) <
//! `ROUTER_*` environment < command-line flags, validated before anything binds.

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use router_cluster::RaftTunables;
use router_core::{
    parse_upstream_url, FingerprintConfig, HealthThresholds, OutlierConfig, Policy, ScoreParams,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Everything the daemon needs. Every key is documented in README.md.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Client HTTP(S) listener.
    pub listen: SocketAddr,
    /// Optional extra listener serving only `/metrics` and `/health`.
    pub metrics_listen: Option<SocketAddr>,
    /// Client API key; when set, every route but `/health` and `/metrics` needs
    /// `Authorization: Bearer <key>` (or `x-api-key`).
    pub api_key: Option<String>,
    /// Token for operator calls: the admin gRPC service (`routerctl`) and the HTTP
    /// `/add_worker`, `/remove_worker`, `/list_workers` endpoints. Unset = admin disabled.
    pub admin_token: Option<String>,
    /// Bearer token sent to upstreams (replaces the client's Authorization header).
    pub upstream_token: Option<String>,
    /// Routing policy: prefix, load, round_robin, session.
    pub policy: Policy,
    /// Seed of the tie-break rotation.
    pub seed: u64,
    /// Engine servers.
    pub upstreams: Vec<UpstreamConfig>,
    /// Prompt fingerprinting.
    pub fingerprint: FingerprintConfig,
    /// Cost formula constants.
    pub score: ScoreParams,
    /// Cache model.
    pub cache: CacheConfig,
    /// Request limits.
    pub limits: Limits,
    /// Timeouts in milliseconds.
    pub timeouts: Timeouts,
    /// Upstream attempts per request (connect errors and 502/503 before the first byte).
    pub max_attempts: u32,
    /// Data-plane threads, each with its own event loop and upstream connection pool
    /// (0 = one per CPU).
    pub workers: usize,
    /// Active health checks.
    pub health: HealthConfig,
    /// TLS on the client listener.
    pub tls: Option<TlsConfig>,
    /// Logging.
    pub log: LogConfig,
    /// OpenTelemetry traces over OTLP/gRPC (off unless an endpoint is set).
    pub tracing: TracingConfig,
    /// Raft cluster of router peers; absent = a single router with its own map.
    pub cluster: Option<ClusterConfig>,
}

/// A peer of the router cluster.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PeerConfig {
    /// Node id (never reused).
    pub id: u64,
    /// Its peer gRPC address.
    pub addr: String,
}

/// Cluster settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// This peer's node id.
    pub node_id: u64,
    /// Peer gRPC listen address.
    pub listen: SocketAddr,
    /// sled data directory.
    pub data_dir: PathBuf,
    /// Shared by the cluster's peers; a peer with another id is refused.
    pub cluster_id: String,
    /// Initial voters (static bootstrap); the lowest id initializes a new cluster. A node
    /// not listed is a new peer: it waits until a member adds it (`routerctl peers add`).
    pub peers: Vec<PeerConfig>,
    /// Raft timing and log retention (`heartbeat_ms`, `election_min_ms`,
    /// `election_max_ms`, `snapshot_every`, `keep_logs`), owned by router-cluster.
    #[serde(flatten)]
    pub raft: RaftTunables,
    /// Routing decisions batched into one proposal at most (default 512).
    #[serde(default = "batch")]
    pub batch_routes: usize,
    /// Longest wait before a partial batch is proposed (default 5 ms).
    #[serde(default = "batch_ms")]
    pub batch_ms: u64,
    /// How often this peer shares its in-flight load per rank (default 250 ms).
    #[serde(default = "load_report_ms")]
    pub load_report_ms: u64,
    /// Other peers' load reports older than this are ignored (default 2000 ms).
    #[serde(default = "load_stale_ms")]
    pub load_stale_ms: u64,
    /// Mutual TLS on the peer port: `ca`, `cert`, `key` (PEM). Peers must present a
    /// certificate signed by `ca`; admin clients need TLS and the admin token.
    #[serde(default)]
    pub tls: Option<PeerTlsConfig>,
    /// Allows a plaintext peer port on a non-loopback address (default false: such a
    /// cluster must set `tls`, so the Raft log is never open to the network by accident).
    #[serde(default)]
    pub insecure_plaintext: bool,
}

/// Peer mutual TLS files.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PeerTlsConfig {
    /// Cluster CA certificate.
    pub ca: PathBuf,
    /// This peer's certificate (server and client).
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
}

fn load_report_ms() -> u64 {
    250
}
fn load_stale_ms() -> u64 {
    2000
}

fn batch() -> usize {
    512
}
fn batch_ms() -> u64 {
    5
}

/// One engine server.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Base URL, e.g. `http://10.0.0.5:8000`.
    pub url: String,
    /// Data-parallel ranks behind this URL, addressed with `routed_dp_rank` (default 1).
    #[serde(default = "one")]
    pub ranks: u32,
    /// KV capacity of each rank in tokens (default: `cache.default_capacity_tokens`).
    #[serde(default)]
    pub capacity_tokens: Option<u64>,
    /// Relative speed of each rank (default 1.0).
    #[serde(default = "one_f")]
    pub weight: f64,
}

fn one() -> u32 {
    1
}
fn one_f() -> f64 {
    1.0
}

impl UpstreamConfig {
    /// An upstream with defaults.
    pub fn from_url(url: &str) -> Self {
        UpstreamConfig {
            url: url.trim().trim_end_matches('/').to_owned(),
            ranks: 1,
            capacity_tokens: None,
            weight: 1.0,
        }
    }
}

/// Cache model sizing.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// KV tokens per rank when the upstream does not say (default 1,000,000).
    pub default_capacity_tokens: u64,
    /// Cap on (fingerprint, rank) entries across all ranks (default 2,000,000, ~200 MB).
    pub max_entries: u64,
    /// Cap on remembered session ids (default 200,000).
    pub max_sessions: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            default_capacity_tokens: 1_000_000,
            max_entries: 2_000_000,
            max_sessions: 200_000,
        }
    }
}

/// Request limits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest accepted request body (default 32 MiB); larger gets 413.
    pub max_body_bytes: u64,
    /// Largest accepted request head, all header names and values (default 64 KiB); larger
    /// gets 431.
    pub max_header_bytes: u64,
    /// Concurrent client connections (default 4096); more wait in the accept queue.
    pub max_connections: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 32 << 20,
            max_header_bytes: 64 << 10,
            max_connections: 4096,
        }
    }
}

/// Timeouts in milliseconds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// TCP connect to an upstream (default 2,000).
    pub connect_ms: u64,
    /// From sending a request to the upstream's response head (default 600,000: a long
    /// prompt in a long queue can take minutes).
    pub first_byte_ms: u64,
    /// Longest silence inside a streamed response (default 120,000).
    pub idle_stream_ms: u64,
    /// Reading a client's request head (default 10,000).
    pub client_header_ms: u64,
    /// Reading a client's request body (default 60,000).
    pub client_body_ms: u64,
    /// An idle upstream connection is closed after this (default 4,000: below the 5 s
    /// keep-alive timeout of uvicorn, which serves vLLM and SGLang, so the router never
    /// sends on a connection the engine is closing at that moment).
    pub upstream_idle_ms: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect_ms: 2_000,
            first_byte_ms: 600_000,
            idle_stream_ms: 120_000,
            client_header_ms: 10_000,
            client_body_ms: 60_000,
            upstream_idle_ms: 4_000,
        }
    }
}

/// Active health checks.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// Path probed on each upstream (default `/health`).
    pub path: String,
    /// Probe period (default 2,000 ms).
    pub interval_ms: u64,
    /// Probe timeout (default 1,000 ms).
    pub timeout_ms: u64,
    /// Consecutive failures to mark down, successes to mark up.
    #[serde(flatten)]
    pub thresholds: HealthThresholds,
    /// Outlier ejection: `consecutive_5xx` server errors in a row take an engine out for
    /// `ejection_ms` (times the ejections so far, up to 10x).
    #[serde(flatten)]
    pub outlier: OutlierConfig,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            path: "/health".into(),
            interval_ms: 2_000,
            timeout_ms: 1_000,
            thresholds: HealthThresholds::default(),
            outlier: OutlierConfig::default(),
        }
    }
}

/// PEM files for the client listener.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// Certificate chain.
    pub cert: PathBuf,
    /// Private key.
    pub key: PathBuf,
}

/// Logging.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: String,
    /// A tracing filter, e.g. `info` or `router_server=debug` (`RUST_LOG` wins).
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: "text".into(),
            level: "info".into(),
        }
    }
}

/// Default CPU budget of the span exporter, percent of one core.
pub const DEFAULT_EXPORT_CPU_PERCENT: u32 = 5;

/// OpenTelemetry traces. Also set by the standard variables `OTEL_EXPORTER_OTLP_ENDPOINT`
/// (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), `OTEL_SERVICE_NAME`,
/// `OTEL_TRACES_SAMPLER_ARG`, `OTEL_EXPORTER_OTLP_HEADERS` and `OTEL_SDK_DISABLED`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// OTLP/gRPC collector, e.g. `http://otel-collector:4317`. Unset = no traces.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the router's spans.
    pub service_name: String,
    /// Share of new traces recorded (0.0-1.0); a client's sampled `traceparent` is followed.
    pub sampling_ratio: f64,
    /// gRPC metadata sent with every export (e.g. an API key of the collector).
    pub headers: BTreeMap<String, String>,
    /// Finished spans held for export; when full, new spans are dropped and counted.
    pub queue_spans: usize,
    /// Longest wait for one export call.
    pub export_timeout_ms: u64,
    /// Most CPU the span exporter may use, in percent of one core (1-100). Converting and
    /// sending spans costs more than making them; past this budget the export queue fills
    /// and new traces are shed (`router_trace_traces_shed_total`), so tracing at sampling
    /// 1.0 on a saturated router costs a bounded share of it.
    pub export_cpu_percent: u32,
    /// CA certificate (PEM) that signed an `https://` collector's certificate; without it
    /// the public web PKI roots are trusted.
    pub ca: Option<PathBuf>,
}

impl Default for TracingConfig {
    fn default() -> Self {
        TracingConfig {
            otlp_endpoint: None,
            service_name: "router".into(),
            sampling_ratio: 1.0,
            headers: BTreeMap::new(),
            queue_spans: 8192,
            export_timeout_ms: 5000,
            export_cpu_percent: DEFAULT_EXPORT_CPU_PERCENT,
            ca: None,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:8080".parse().expect("static address"),
            metrics_listen: None,
            api_key: None,
            admin_token: None,
            upstream_token: None,
            policy: Policy::Prefix,
            seed: 0x5eed,
            upstreams: Vec::new(),
            fingerprint: FingerprintConfig::default(),
            score: ScoreParams::default(),
            cache: CacheConfig::default(),
            limits: Limits::default(),
            timeouts: Timeouts::default(),
            max_attempts: 3,
            workers: 0,
            health: HealthConfig::default(),
            tls: None,
            log: LogConfig::default(),
            tracing: TracingConfig::default(),
            cluster: None,
        }
    }
}

/// A configuration problem, reported before anything starts.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A source could not be read or parsed.
    #[error("{0}")]
    Load(String),
    /// A value is out of range.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// Values given on the command line (highest precedence).
#[derive(Debug, Default, Clone, Serialize)]
pub struct Overrides {
    /// `--listen`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// `--metrics-listen`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<SocketAddr>,
    /// `--policy`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<Policy>,
    /// `--upstream` (replaces the list).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstreams: Option<Vec<UpstreamConfig>>,
}

/// Reads `RJ_*` variables from `env` into a figment layer (Ramjet drop-in).
fn ramjet_layer(env: &dyn Fn(&str) -> Option<String>) -> Result<Figment, ConfigError> {
    let mut f = Figment::new();
    if let Some(list) = env("RJ_UPSTREAM") {
        let mut ups: Vec<UpstreamConfig> =
            split_list(&list).map(UpstreamConfig::from_url).collect();
        if let Some(ranks) = env("RJ_UPSTREAM_DP_RANKS") {
            let ranks: Vec<&str> = split_list(&ranks).collect();
            for (i, u) in ups.iter_mut().enumerate() {
                let r = if ranks.len() == 1 {
                    ranks[0]
                } else {
                    ranks.get(i).copied().unwrap_or("1")
                };
                u.ranks = r.parse().map_err(|_| {
                    ConfigError::Invalid(format!("RJ_UPSTREAM_DP_RANKS: '{r}' is not a number"))
                })?;
            }
        }
        f = f.merge(Serialized::default("upstreams", ups));
    }
    if let Some(a) = env("RJ_API_ADDR") {
        f = f.merge(Serialized::default("listen", go_addr(&a, "RJ_API_ADDR")?));
    }
    if let Some(a) = env("RJ_METRICS_ADDR") {
        f = f.merge(Serialized::default(
            "metrics_listen",
            go_addr(&a, "RJ_METRICS_ADDR")?,
        ));
    }
    if let Some(a) = env("RJ_AFFINITY") {
        let p = Policy::parse(&a)
            .ok_or_else(|| ConfigError::Invalid(format!("RJ_AFFINITY: unknown policy '{a}'")))?;
        f = f.merge(Serialized::default("policy", p));
    }
    if let Some(t) = env("RJ_UPSTREAM_TOKEN") {
        f = f.merge(Serialized::default("upstream_token", t));
    }
    Ok(f)
}

/// Reads the standard `OTEL_*` variables into the `[tracing]` section.
fn otel_layer(env: &dyn Fn(&str) -> Option<String>) -> Result<Figment, ConfigError> {
    let mut f = Figment::new();
    let set = |k: &str| env(k).filter(|v| !v.trim().is_empty());
    if let Some(e) =
        set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT"))
    {
        f = f.merge(Serialized::default("tracing.otlp_endpoint", e.trim()));
    }
    if let Some(n) = set("OTEL_SERVICE_NAME") {
        f = f.merge(Serialized::default("tracing.service_name", n.trim()));
    }
    if let Some(r) = set("OTEL_TRACES_SAMPLER_ARG") {
        let r: f64 = r.trim().parse().map_err(|_| {
            ConfigError::Invalid(format!("OTEL_TRACES_SAMPLER_ARG: '{r}' is not a number"))
        })?;
        f = f.merge(Serialized::default("tracing.sampling_ratio", r));
    }
    if let Some(h) = set("OTEL_EXPORTER_OTLP_HEADERS") {
        let mut headers = BTreeMap::new();
        for kv in split_list(&h) {
            let Some((k, v)) = kv.split_once('=') else {
                return Err(ConfigError::Invalid(
                    "OTEL_EXPORTER_OTLP_HEADERS: expected key=value,key=value".into(),
                ));
            };
            headers.insert(k.trim().to_owned(), v.trim().to_owned());
        }
        f = f.merge(Serialized::default("tracing.headers", headers));
    }
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        f = f.merge(Serialized::default("tracing.otlp_endpoint", None::<String>));
    }
    Ok(f)
}

fn split_list(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').map(str::trim).filter(|x| !x.is_empty())
}

/// Go-style listen addresses: `:8080` means all interfaces.
fn go_addr(a: &str, var: &str) -> Result<SocketAddr, ConfigError> {
    let a = a.trim();
    let full = if a.starts_with(':') {
        format!("0.0.0.0{a}")
    } else {
        a.to_owned()
    };
    full.parse()
        .map_err(|_| ConfigError::Invalid(format!("{var}: '{a}' is not host:port")))
}

impl Config {
    /// Loads from every layer. `env` is injected so tests need not touch the process.
    pub fn load(
        file: Option<&std::path::Path>,
        env: &dyn Fn(&str) -> Option<String>,
        overrides: Overrides,
    ) -> Result<Config, ConfigError> {
        let mut f = Figment::from(Serialized::defaults(Config::default()));
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError::Load(format!(
                    "config file {} does not exist",
                    path.display()
                )));
            }
            f = f.merge(Toml::file_exact(path));
        }
        f = f.merge(ramjet_layer(env)?);
        f = f.merge(otel_layer(env)?);
        // ROUTER_UPSTREAM=url,url is the short form of the upstream list.
        if let Some(list) = env("ROUTER_UPSTREAM") {
            let ups: Vec<UpstreamConfig> =
                split_list(&list).map(UpstreamConfig::from_url).collect();
            f = f.merge(Serialized::default("upstreams", ups));
        }
        // ROUTER_LIMITS__MAX_BODY_BYTES=... sets limits.max_body_bytes.
        f = f.merge(Env::prefixed("ROUTER_").split("__").ignore(&["upstream"]));
        f = f.merge(Serialized::defaults(overrides));
        let cfg: Config = f.extract().map_err(|e| ConfigError::Load(e.to_string()))?;
        cfg.validate()
    }

    /// Built-in defaults and one TOML document, validated (no environment, no flags): for
    /// tools and the config fuzzer.
    pub fn from_toml_str(toml: &str) -> Result<Config, ConfigError> {
        let cfg: Config = Figment::from(Serialized::defaults(Config::default()))
            .merge(Toml::string(toml))
            .extract()
            .map_err(|e| ConfigError::Load(e.to_string()))?;
        cfg.validate()
    }

    /// The same config with every secret replaced by `<redacted>`, for printing.
    pub fn redacted(&self) -> Config {
        let hide = |s: &Option<String>| s.as_ref().map(|_| "<redacted>".to_owned());
        Config {
            api_key: hide(&self.api_key),
            admin_token: hide(&self.admin_token),
            upstream_token: hide(&self.upstream_token),
            tracing: TracingConfig {
                headers: self
                    .tracing
                    .headers
                    .keys()
                    .map(|k| (k.clone(), "<redacted>".to_owned()))
                    .collect(),
                ..self.tracing.clone()
            },
            ..self.clone()
        }
    }

    /// Checks every value and normalizes upstream URLs; returns the config when usable.
    pub fn validate(mut self) -> Result<Config, ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.workers > 1024 {
            return bad("workers must be 0 (one per CPU) to 1024".into());
        }
        for u in &mut self.upstreams {
            match parse_upstream_url(&u.url) {
                Ok(p) => u.url = p.url,
                Err(e) => return bad(format!("upstream '{}': {e}", u.url)),
            }
            if u.ranks == 0 || u.ranks > 1024 {
                return bad(format!("upstream '{}': ranks must be 1..=1024", u.url));
            }
            if !(u.weight.is_finite() && u.weight > 0.0) {
                return bad(format!("upstream '{}': weight must be positive", u.url));
            }
            if u.capacity_tokens == Some(0) {
                return bad(format!(
                    "upstream '{}': capacity_tokens must be positive",
                    u.url
                ));
            }
        }
        let mut urls: Vec<&str> = self.upstreams.iter().map(|u| u.url.as_str()).collect();
        urls.sort_unstable();
        if urls.windows(2).any(|w| w[0] == w[1]) {
            return bad("the same upstream URL is listed twice".into());
        }
        self.fingerprint.validate().map_err(ConfigError::Invalid)?;
        let s = &self.score;
        if ![
            s.prefill_weight,
            s.decode_weight,
            s.pressured_prefill_weight,
            s.pressured_decode_weight,
        ]
        .iter()
        .all(|w| *w >= 0.0)
        {
            return bad("score weights must be non-negative".into());
        }
        if self.cache.default_capacity_tokens == 0 || self.cache.max_entries == 0 {
            return bad("cache sizes must be positive".into());
        }
        if self.limits.max_body_bytes == 0 || self.limits.max_header_bytes < 1024 {
            return bad(
                "limits.max_body_bytes must be positive and limits.max_header_bytes at least 1024"
                    .into(),
            );
        }
        // The JSON reader indexes documents under 64 MiB (16M tokens of prompt).
        if self.limits.max_body_bytes >= 64 << 20 {
            return bad("limits.max_body_bytes must be below 64 MiB (67108864)".into());
        }
        if self.limits.max_connections == 0 {
            return bad("limits.max_connections must be positive".into());
        }
        let t = &self.timeouts;
        for (name, v) in [
            ("connect_ms", t.connect_ms),
            ("first_byte_ms", t.first_byte_ms),
            ("idle_stream_ms", t.idle_stream_ms),
            ("client_header_ms", t.client_header_ms),
            ("client_body_ms", t.client_body_ms),
            ("upstream_idle_ms", t.upstream_idle_ms),
            ("health.interval_ms", self.health.interval_ms),
            ("health.timeout_ms", self.health.timeout_ms),
        ] {
            if v == 0 {
                return bad(format!("timeouts: {name} must be positive"));
            }
        }
        if self.max_attempts == 0 {
            return bad("max_attempts must be at least 1".into());
        }
        if !self.health.path.starts_with('/') {
            return bad("health.path must start with '/'".into());
        }
        if let Some(tls) = &self.tls {
            if let Err(e) = crate::tls::acceptor(&tls.cert, &tls.key) {
                return bad(format!("tls: {e:#}"));
            }
        }
        if self.log.format != "text" && self.log.format != "json" {
            return bad("log.format must be 'text' or 'json'".into());
        }
        let tr = &self.tracing;
        if !(0.0..=1.0).contains(&tr.sampling_ratio) {
            return bad("tracing.sampling_ratio must be between 0.0 and 1.0".into());
        }
        if !(1..=100).contains(&tr.export_cpu_percent) {
            return bad("tracing.export_cpu_percent must be between 1 and 100".into());
        }
        if tr.queue_spans == 0 || tr.export_timeout_ms == 0 {
            return bad(
                "tracing.queue_spans and tracing.export_timeout_ms must be positive".into(),
            );
        }
        if let Some(e) = &tr.otlp_endpoint {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                return bad(format!(
                    "tracing.otlp_endpoint '{e}' must be an http:// or https:// URL (OTLP over gRPC, e.g. http://collector:4317)"
                ));
            }
        }
        if let Some(ca) = &tr.ca {
            if !tr
                .otlp_endpoint
                .as_deref()
                .is_some_and(|e| e.starts_with("https://"))
            {
                return bad(
                    "tracing.ca is set but tracing.otlp_endpoint is not an https:// URL".into(),
                );
            }
            match std::fs::read(ca) {
                Ok(pem) if String::from_utf8_lossy(&pem).contains("BEGIN CERTIFICATE") => {}
                Ok(_) => {
                    return bad(format!(
                        "tracing.ca {}: no PEM certificate in it",
                        ca.display()
                    ))
                }
                Err(e) => return bad(format!("tracing.ca {}: {e}", ca.display())),
            }
        }
        for (k, v) in &tr.headers {
            if http::HeaderName::from_bytes(k.as_bytes()).is_err()
                || http::HeaderValue::from_str(v).is_err()
            {
                return bad(format!("tracing.headers: '{k}' is not a valid header"));
            }
        }
        if let Some(c) = &self.cluster {
            // A node not among the initial voters is a new peer: it waits until a member
            // adds it (`routerctl peers add`); it still needs them to ask.
            if c.peers.is_empty() {
                return bad(
                    "cluster.peers must list the initial voters (this node among them when it \
                     is one)"
                        .into(),
                );
            }
            if c.cluster_id.is_empty() {
                return bad("cluster.cluster_id must not be empty".into());
            }
            if c.tls.is_none() && !c.listen.ip().is_loopback() && !c.insecure_plaintext {
                return bad(format!(
                    "cluster.listen {} is reachable from the network but [cluster.tls] is not set: \
                     configure mutual TLS between peers, or set cluster.insecure_plaintext = true \
                     on a network you trust",
                    c.listen
                ));
            }
            if let Some(t) = &c.tls {
                if let Err(e) = crate::tls::check_peer_files(&t.ca, &t.cert, &t.key) {
                    return bad(format!("cluster.tls: {e:#}"));
                }
            }
            if c.load_report_ms == 0 || c.load_stale_ms <= c.load_report_ms {
                return bad("cluster: need 0 < load_report_ms < load_stale_ms".into());
            }
            c.raft.validate().map_err(ConfigError::Invalid)?;
        }
        if matches!(&self.api_key, Some(k) if k.is_empty()) {
            return bad("api_key must not be empty when set".into());
        }
        if matches!(&self.admin_token, Some(k) if k.len() < 16) {
            return bad("admin_token must be at least 16 characters when set".into());
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn load(
        vars: &[(&str, &str)],
        file: Option<&std::path::Path>,
        o: Overrides,
    ) -> Result<Config, ConfigError> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let get = |k: &str| m.get(k).cloned();
        // ROUTER_* comes from the process environment, which these tests leave alone.
        Config::load(file, &get, o)
    }

    #[test]
    fn defaults_validate() {
        assert!(Config::default().validate().is_ok());
    }

    #[test]
    fn tracing_from_otel_env_and_redacted_headers() {
        let c = load(
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
                ("OTEL_SERVICE_NAME", "router-eu-1"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=s3cret, tenant=a"),
            ],
            None,
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(
            c.tracing.otlp_endpoint.as_deref(),
            Some("http://collector:4317")
        );
        assert_eq!(c.tracing.service_name, "router-eu-1");
        assert_eq!(c.tracing.sampling_ratio, 0.25);
        assert_eq!(c.tracing.headers["tenant"], "a");
        let printed = toml::to_string(&c.redacted()).unwrap();
        assert!(!printed.contains("s3cret"), "{printed}");
        // The traces endpoint wins over the general one; OTEL_SDK_DISABLED turns it off.
        let c = load(
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317"),
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://b:4317"),
            ],
            None,
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.tracing.otlp_endpoint.as_deref(), Some("http://b:4317"));
        let c = load(
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317"),
                ("OTEL_SDK_DISABLED", "true"),
            ],
            None,
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.tracing.otlp_endpoint, None);
        for bad in [
            ("OTEL_TRACES_SAMPLER_ARG", "2"),
            ("OTEL_TRACES_SAMPLER_ARG", "half"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "novalue"),
        ] {
            assert!(load(&[bad], None, Overrides::default()).is_err(), "{bad:?}");
        }
        assert!(Config::default().tracing.otlp_endpoint.is_none());
        // A CA for the collector needs an https endpoint and a readable PEM file.
        for toml in [
            "[tracing]\notlp_endpoint = \"http://c:4317\"\nca = \"/etc/hostname\"",
            "[tracing]\notlp_endpoint = \"https://c:4317\"\nca = \"/nonexistent/ca.pem\"",
            "[tracing]\notlp_endpoint = \"https://c:4317\"\nca = \"/etc/hostname\"",
            "[tracing]\nexport_cpu_percent = 0",
            "[tracing]\nexport_cpu_percent = 101",
        ] {
            assert!(Config::from_toml_str(toml).is_err(), "{toml}");
        }
    }

    #[test]
    fn ramjet_env() {
        let c = load(
            &[
                ("RJ_UPSTREAM", "http://a:1, http://b:2/"),
                ("RJ_API_ADDR", ":9000"),
                ("RJ_AFFINITY", "load"),
                ("RJ_UPSTREAM_DP_RANKS", "4"),
                ("RJ_UPSTREAM_TOKEN", "t"),
            ],
            None,
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.upstreams.len(), 2);
        assert_eq!(c.upstreams[1].url, "http://b:2");
        assert_eq!(c.upstreams[0].ranks, 4);
        assert_eq!(c.listen.port(), 9000);
        assert_eq!(c.policy, Policy::Load);
        assert_eq!(c.upstream_token.as_deref(), Some("t"));
    }

    #[test]
    fn precedence_file_then_flags() {
        let dir = std::env::temp_dir().join(format!("rcfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("r.toml");
        std::fs::write(
            &p,
            "listen = \"127.0.0.1:7000\"\npolicy = \"round_robin\"\n[[upstreams]]\nurl = \"http://x:1\"\nranks = 2\n[limits]\nmax_body_bytes = 100\n",
        )
        .unwrap();
        let c = load(&[], Some(&p), Overrides::default()).unwrap();
        assert_eq!(c.listen.port(), 7000);
        assert_eq!(c.policy, Policy::RoundRobin);
        assert_eq!(c.upstreams[0].ranks, 2);
        assert_eq!(c.limits.max_body_bytes, 100);
        let c = load(
            &[("RJ_AFFINITY", "load")],
            Some(&p),
            Overrides {
                policy: Some(Policy::Session),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(c.policy, Policy::Session);
        std::fs::write(&p, "lisen = 1\n").unwrap();
        let e = load(&[], Some(&p), Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("lisen"), "{e}");
    }

    #[test]
    fn plaintext_peer_port_only_on_loopback_or_when_asked() {
        let dir = std::env::temp_dir().join(format!("rcfg-peer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("r.toml");
        let cfg = |listen: &str, extra: &str| {
            format!("[cluster]\nnode_id = 1\nlisten = \"{listen}\"\ndata_dir = \"/tmp/x\"\ncluster_id = \"c\"\npeers = [{{ id = 1, addr = \"{listen}\" }}]\n{extra}")
        };
        std::fs::write(&p, cfg("127.0.0.1:7001", "")).unwrap();
        assert!(load(&[], Some(&p), Overrides::default()).is_ok());
        std::fs::write(&p, cfg("0.0.0.0:7001", "")).unwrap();
        let e = load(&[], Some(&p), Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cluster.tls") && e.contains("insecure_plaintext"),
            "{e}"
        );
        std::fs::write(&p, cfg("10.0.0.5:7001", "insecure_plaintext = true\n")).unwrap();
        assert!(load(&[], Some(&p), Overrides::default()).is_ok());
    }

    #[test]
    fn a_node_outside_the_initial_voters_is_a_new_peer_and_the_voters_must_be_listed() {
        let dir = std::env::temp_dir().join(format!("rcfg-new-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("r.toml");
        let cfg = |peers: &str| {
            format!("[cluster]\nnode_id = 9\nlisten = \"127.0.0.1:7009\"\ndata_dir = \"/tmp/x\"\ncluster_id = \"c\"\npeers = [{peers}]\n")
        };
        std::fs::write(&p, cfg("{ id = 1, addr = \"127.0.0.1:7001\" }")).unwrap();
        assert!(load(&[], Some(&p), Overrides::default()).is_ok());
        // The id from the environment, as a replacement peer gets it.
        #[allow(clippy::result_large_err)] // figment's own test harness signature
        figment::Jail::expect_with(|j| {
            j.set_env("ROUTER_CLUSTER__NODE_ID", "12");
            let c = load(&[], Some(&p), Overrides::default()).unwrap();
            assert_eq!(c.cluster.unwrap().node_id, 12);
            Ok(())
        });
        std::fs::write(&p, cfg("")).unwrap();
        let e = load(&[], Some(&p), Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("initial voters"), "{e}");
    }

    #[test]
    fn raft_tunables_come_from_the_cluster_table() {
        let dir = std::env::temp_dir().join(format!("rcfg-raft-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("r.toml");
        let base = "[cluster]\nnode_id = 1\nlisten = \"127.0.0.1:7001\"\ndata_dir = \"/tmp/x\"\ncluster_id = \"c\"\npeers = [{ id = 1, addr = \"127.0.0.1:7001\" }]\n";
        std::fs::write(&p, format!("{base}heartbeat_ms = 50\nkeep_logs = 7\n")).unwrap();
        let c = load(&[], Some(&p), Overrides::default()).unwrap();
        let raft = c.cluster.unwrap().raft;
        assert_eq!((raft.heartbeat_ms, raft.keep_logs), (50, 7));
        assert_eq!(
            raft.election_max_ms,
            RaftTunables::default().election_max_ms
        );
        // A typo in the table is an error, not a silently ignored key.
        std::fs::write(&p, format!("{base}hearbeat_ms = 50\n")).unwrap();
        let e = load(&[], Some(&p), Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("hearbeat_ms"), "{e}");
        std::fs::write(&p, format!("{base}heartbeat_ms = 500\n")).unwrap();
        let e = load(&[], Some(&p), Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("heartbeat_ms < election_min_ms"), "{e}");
    }

    #[test]
    fn invalid_values_are_reported() {
        let mut c = Config::default();
        c.upstreams.push(UpstreamConfig::from_url("ftp://x"));
        assert!(c.validate().unwrap_err().to_string().contains("http://"));
        for bad in [
            "http://u:p@x:1",
            "http://x:0",
            "http://x:1/v1",
            "http://x:99999",
        ] {
            let mut c = Config::default();
            c.upstreams.push(UpstreamConfig::from_url(bad));
            assert!(c.validate().is_err(), "{bad} accepted");
        }
        // Two spellings of one server are one server.
        let mut c = Config::default();
        c.upstreams.push(UpstreamConfig::from_url("http://X:1"));
        c.upstreams.push(UpstreamConfig::from_url("http://x:1/"));
        assert!(c.validate().is_err());
        let mut c = Config::default();
        c.upstreams.push(UpstreamConfig::from_url("http://x:1"));
        c.upstreams.push(UpstreamConfig::from_url("http://x:1"));
        assert!(c.validate().is_err());
        let mut c = Config::default();
        c.timeouts.connect_ms = 0;
        assert!(c.validate().is_err());
        assert!(load(&[("RJ_AFFINITY", "nope")], None, Overrides::default()).is_err());
    }
}
