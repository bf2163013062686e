//! Prometheus metrics held in atomics: recording never locks or allocates; the text is
//! written at scrape time by the one writer, `promtext`.

pub use promtext::Histogram;
use promtext::{Exposition, Kind};
use router_core::{IndexStats, Reason};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

/// Endpoints counted separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/completions`
    Completions,
    /// `/v1/responses`
    Responses,
    /// `/v1/messages`
    Messages,
    /// `/v1/models`
    Models,
    /// other `/v1/*`
    Passthrough,
    /// `/health`
    Health,
    /// `/metrics`
    Metrics,
    /// `/add_worker`, `/remove_worker`, `/list_workers`
    Admin,
    /// anything else
    Other,
}

impl Route {
    /// Requests forwarded to an engine (traced).
    pub fn is_inference(self) -> bool {
        matches!(
            self,
            Route::Chat
                | Route::Completions
                | Route::Responses
                | Route::Messages
                | Route::Passthrough
        )
    }

    const ALL: [Route; 10] = [
        Route::Chat,
        Route::Completions,
        Route::Responses,
        Route::Messages,
        Route::Models,
        Route::Passthrough,
        Route::Health,
        Route::Metrics,
        Route::Admin,
        Route::Other,
    ];
    fn label(self) -> &'static str {
        match self {
            Route::Chat => "chat_completions",
            Route::Completions => "completions",
            Route::Responses => "responses",
            Route::Messages => "messages",
            Route::Models => "models",
            Route::Passthrough => "passthrough",
            Route::Health => "health",
            Route::Metrics => "metrics",
            Route::Admin => "admin",
            Route::Other => "other",
        }
    }
}

const STATUS_SLOTS: usize = 600;
/// Stream failures after the first byte, by code.
const STREAM_ERRORS: [&str; 2] = ["upstream_stream_error", "upstream_idle_timeout"];
/// Upstream attempt failures before the first byte, by kind.
pub const ATTEMPT_FAILURES: [&str; 5] = [
    "connect",
    "status_502_503",
    "reset",
    "timeout",
    "marked_down",
];

/// All counters.
pub struct Metrics {
    requests: Vec<[AtomicU64; STATUS_SLOTS]>,
    decisions: [AtomicU64; Reason::ALL.len()],
    predicted_cached_tokens: AtomicU64,
    routed_prompt_tokens: AtomicU64,
    usage_prompt_tokens: AtomicU64,
    usage_cached_tokens: AtomicU64,
    usage_responses: AtomicU64,
    retries: AtomicU64,
    attempt_failures: [AtomicU64; ATTEMPT_FAILURES.len()],
    stream_errors: [AtomicU64; STREAM_ERRORS.len()],
    records_dropped: AtomicU64,
    ttft: Histogram,
    duration: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Route::ALL
                .iter()
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
            decisions: std::array::from_fn(|_| AtomicU64::new(0)),
            predicted_cached_tokens: AtomicU64::new(0),
            routed_prompt_tokens: AtomicU64::new(0),
            usage_prompt_tokens: AtomicU64::new(0),
            usage_cached_tokens: AtomicU64::new(0),
            usage_responses: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            attempt_failures: std::array::from_fn(|_| AtomicU64::new(0)),
            stream_errors: std::array::from_fn(|_| AtomicU64::new(0)),
            records_dropped: AtomicU64::new(0),
            ttft: Histogram::new(),
            duration: Histogram::new(),
        }
    }
}

type Gauge = (&'static str, &'static str, fn(&UpstreamSample) -> u64);

/// Per-upstream values read at scrape time.
pub struct UpstreamSample {
    /// URL.
    pub url: String,
    /// Health.
    pub up: bool,
    /// Requests in flight.
    pub inflight: u64,
    /// Predicted uncached prompt tokens waiting for a first token.
    pub queued_prefill: u64,
    /// Requests generating.
    pub decodes: u64,
    /// Requests sent there.
    pub requests: u64,
    /// Outlier ejections (consecutive 5xx).
    pub ejections: u64,
}

impl Metrics {
    /// Counts a finished request.
    pub fn request(&self, route: Route, status: u16) {
        let i = Route::ALL.iter().position(|r| *r == route).unwrap_or(0);
        self.requests[i][(status as usize).min(STATUS_SLOTS - 1)].fetch_add(1, Relaxed);
    }

    /// Routing decisions so far, by reason.
    pub fn decision_counts(&self) -> Vec<(&'static str, u64)> {
        Reason::ALL
            .iter()
            .enumerate()
            .map(|(i, r)| (r.label(), self.decisions[i].load(Relaxed)))
            .collect()
    }

    /// Counts a routing decision.
    pub fn decision(&self, reason: Reason, predicted_cached: u64, prompt_tokens: u64) {
        let i = Reason::ALL.iter().position(|r| *r == reason).unwrap_or(0);
        self.decisions[i].fetch_add(1, Relaxed);
        self.predicted_cached_tokens
            .fetch_add(predicted_cached, Relaxed);
        self.routed_prompt_tokens.fetch_add(prompt_tokens, Relaxed);
    }

    /// Counts a failed attempt before the first byte.
    pub fn attempt_failed(&self, kind: &str, retried: bool) {
        if let Some(i) = ATTEMPT_FAILURES.iter().position(|k| *k == kind) {
            self.attempt_failures[i].fetch_add(1, Relaxed);
        }
        if retried {
            self.retries.fetch_add(1, Relaxed);
        }
    }

    /// Counts a stream broken after the first byte.
    pub fn stream_error(&self, code: &str) {
        if let Some(i) = STREAM_ERRORS.iter().position(|k| *k == code) {
            self.stream_errors[i].fetch_add(1, Relaxed);
        }
    }

    /// Counts a route record the state could not take.
    pub fn record_dropped(&self) {
        self.records_dropped.fetch_add(1, Relaxed);
    }

    /// Time to first byte.
    pub fn observe_ttft(&self, d: Duration) {
        self.ttft.observe(d);
    }

    /// Whole request duration.
    pub fn observe_duration(&self, d: Duration) {
        self.duration.observe(d);
    }

    /// Usage reported by the engine.
    pub fn observe_usage(&self, prompt: u64, cached: u64) {
        self.usage_prompt_tokens.fetch_add(prompt, Relaxed);
        self.usage_cached_tokens.fetch_add(cached, Relaxed);
        self.usage_responses.fetch_add(1, Relaxed);
    }

    /// Appends the request-path metrics, per-upstream values and index gauges.
    pub fn render(&self, o: &mut Exposition, upstreams: &[UpstreamSample], index: &IndexStats) {
        o.family(
            "router_requests_total",
            "Client requests by endpoint and status.",
            Kind::Counter,
        );
        let mut code = String::new();
        for (i, r) in Route::ALL.iter().enumerate() {
            for (status, c) in self.requests[i].iter().enumerate() {
                let v = c.load(Relaxed);
                if v > 0 {
                    code.clear();
                    promtext::Value::write_to(&(status as u64), &mut code);
                    o.sample(
                        "router_requests_total",
                        &[("endpoint", r.label()), ("status", &code)],
                        v,
                    );
                }
            }
        }
        o.family(
            "router_route_decisions_total",
            "Routing decisions by reason.",
            Kind::Counter,
        );
        for (i, r) in Reason::ALL.iter().enumerate() {
            o.sample(
                "router_route_decisions_total",
                &[("reason", r.label())],
                self.decisions[i].load(Relaxed),
            );
        }
        let counters = [
            (
                "router_predicted_cached_tokens_total",
                "Prompt tokens the router predicted the chosen rank holds.",
                &self.predicted_cached_tokens,
            ),
            (
                "router_routed_prompt_tokens_total",
                "Estimated prompt tokens of routed requests.",
                &self.routed_prompt_tokens,
            ),
            (
                "router_usage_prompt_tokens_total",
                "prompt_tokens reported in responses' usage.",
                &self.usage_prompt_tokens,
            ),
            (
                "router_usage_cached_tokens_total",
                "cached_tokens reported in responses' usage.",
                &self.usage_cached_tokens,
            ),
            (
                "router_usage_responses_total",
                "Responses that carried usage.",
                &self.usage_responses,
            ),
            (
                "router_retries_total",
                "Requests retried on another upstream before the first byte.",
                &self.retries,
            ),
            (
                "router_route_records_dropped_total",
                "Routing records the state could not take (queue full).",
                &self.records_dropped,
            ),
        ];
        for (name, help, v) in counters {
            o.scalar(name, help, v.load(Relaxed));
        }
        o.family(
            "router_upstream_attempt_failures_total",
            "Upstream attempts that failed before the first byte.",
            Kind::Counter,
        );
        for (i, k) in ATTEMPT_FAILURES.iter().enumerate() {
            o.sample(
                "router_upstream_attempt_failures_total",
                &[("kind", k)],
                self.attempt_failures[i].load(Relaxed),
            );
        }
        o.family(
            "router_stream_errors_total",
            "Responses broken after the first byte.",
            Kind::Counter,
        );
        for (i, k) in STREAM_ERRORS.iter().enumerate() {
            o.sample(
                "router_stream_errors_total",
                &[("code", k)],
                self.stream_errors[i].load(Relaxed),
            );
        }
        self.ttft.render(
            o,
            "router_ttft_seconds",
            "Time from request to the upstream's first body byte.",
        );
        self.duration.render(
            o,
            "router_request_duration_seconds",
            "Time from request to the end of the response.",
        );
        let gauges: [Gauge; 6] = [
            (
                "router_upstream_up",
                "1 when the upstream is healthy.",
                |u| u64::from(u.up),
            ),
            (
                "router_upstream_inflight",
                "Requests in flight per upstream.",
                |u| u.inflight,
            ),
            (
                "router_upstream_queued_prefill_tokens",
                "Predicted uncached prompt tokens waiting for a first token.",
                |u| u.queued_prefill,
            ),
            (
                "router_upstream_decodes",
                "Requests generating per upstream.",
                |u| u.decodes,
            ),
            (
                "router_upstream_requests_total",
                "Requests sent per upstream.",
                |u| u.requests,
            ),
            (
                "router_upstream_ejections_total",
                "Times the upstream was ejected for consecutive 5xx answers.",
                |u| u.ejections,
            ),
        ];
        for (name, help, f) in gauges {
            o.family(name, help, Kind::by_name(name));
            for u in upstreams {
                o.sample(name, &[("upstream", &u.url)], f(u));
            }
        }
        let idx = [
            (
                "router_index_fingerprints",
                "Distinct prefix fingerprints in the affinity index.",
                index.fingerprints,
            ),
            (
                "router_index_entries",
                "(fingerprint, rank) entries in the affinity index.",
                index.entries,
            ),
            (
                "router_index_bytes",
                "Estimated memory of the affinity index.",
                index.bytes,
            ),
            (
                "router_index_sessions",
                "Session hints held.",
                index.sessions,
            ),
            (
                "router_index_capacity_evictions_total",
                "Entries forgotten because a rank's modelled KV cache was full.",
                index.capacity_evictions,
            ),
            (
                "router_index_cap_evictions_total",
                "Entries forgotten because of the global entry cap.",
                index.cap_evictions,
            ),
        ];
        for (name, help, v) in idx {
            o.scalar(name, help, v);
        }
    }
}
