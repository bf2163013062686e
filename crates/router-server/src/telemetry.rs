//! Logs and OpenTelemetry traces.
//!
//! The request path makes its spans with the OpenTelemetry API directly ([`Trace`]): a
//! `tracing` span bridged by `tracing-opentelemetry` cost a quarter of the proxy's
//! throughput even unsampled (registry entries, field visitors, enter/exit on every poll);
//! a direct span costs a few allocations when sampled and nothing but one branch when
//! tracing is off. The cluster's spans (proposal batches, apply), a few per second, are
//! `tracing` spans of target [`SPAN_TARGET`], exported through `tracing-opentelemetry`.
//! Both end in one [`QueuedExport`] processor that hands finished spans to one export
//! thread through a bounded queue: the request path never waits for the collector; a full
//! queue or a failed export drops spans and counts them (`router_trace_spans_dropped_total`).
//!
//! Span fields that are counts are recorded as `i64`: OpenTelemetry integers are signed,
//! and `tracing-opentelemetry` exports a `u64` field as a string.

use crate::config::{LogConfig, TracingConfig};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{
    Span as _, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    Sampler, SamplingDecision, SamplingResult, SdkTracer, SdkTracerProvider, ShouldSample, Span,
    SpanData, SpanExporter, SpanProcessor,
};
use opentelemetry_sdk::Resource;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

pub use router_cluster::SPAN_TARGET;
/// Spans sent in one export call at most (larger batches spread the exporter's per-call
/// grouping and framing over more spans).
const EXPORT_BATCH: usize = 2048;
/// Longest a finished span waits for its batch to fill.
const EXPORT_EVERY: Duration = Duration::from_millis(200);
/// Longest the process waits at exit for queued spans to go out.
const EXIT_FLUSH: Duration = Duration::from_secs(2);
/// A failing collector is reported in the log at most this often.
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(60);

/// Export counters, read by `/metrics`.
pub struct ExportStats {
    /// Tracing is configured.
    pub enabled: AtomicBool,
    /// Spans the collector accepted.
    pub exported: AtomicU64,
    /// Spans dropped because the queue was full.
    pub dropped_queue_full: AtomicU64,
    /// Spans dropped because their export failed (collector down or refusing).
    pub dropped_export_failed: AtomicU64,
    /// Traces not recorded because the export queue was nearly full when they began.
    pub traces_shed: AtomicU64,
    /// Spans waiting in the export queue.
    queued: AtomicU64,
    /// CPU time the export thread spent converting and sending spans, ns.
    export_cpu_ns: AtomicU64,
}

/// The process's export counters.
pub static STATS: ExportStats = ExportStats {
    enabled: AtomicBool::new(false),
    exported: AtomicU64::new(0),
    dropped_queue_full: AtomicU64::new(0),
    dropped_export_failed: AtomicU64::new(0),
    traces_shed: AtomicU64::new(0),
    queued: AtomicU64::new(0),
    export_cpu_ns: AtomicU64::new(0),
};

/// Appends the export counters.
pub fn render(o: &mut promtext::Exposition) {
    let s = &STATS;
    o.scalar(
        "router_trace_enabled",
        "1 when spans are exported over OTLP.",
        u64::from(s.enabled.load(Relaxed)),
    );
    o.scalar(
        "router_trace_spans_exported_total",
        "Spans the OTLP collector accepted.",
        s.exported.load(Relaxed),
    );
    o.family(
        "router_trace_spans_dropped_total",
        "Spans dropped: export queue full, or the export failed.",
        promtext::Kind::Counter,
    )
    .sample(
        "router_trace_spans_dropped_total",
        &[("reason", "queue_full")],
        s.dropped_queue_full.load(Relaxed),
    )
    .sample(
        "router_trace_spans_dropped_total",
        &[("reason", "export_failed")],
        s.dropped_export_failed.load(Relaxed),
    );
    o.scalar(
        "router_trace_traces_shed_total",
        "Traces not recorded: the export queue was nearly full when they began.",
        s.traces_shed.load(Relaxed),
    );
    o.scalar(
        "router_trace_export_cpu_seconds_total",
        "CPU time the span exporter spent converting and sending spans.",
        s.export_cpu_ns.load(Relaxed) as f64 / 1e9,
    );
}

/// The request path's tracer, set once when tracing is configured.
static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// One span of a request's trace and the context its children hang off. `Trace::default()`
/// (tracing off) does nothing at all; an unsampled one only propagates its context.
#[derive(Clone, Default)]
pub struct Trace {
    cx: Option<Context>,
    sampled: bool,
}

impl Trace {
    /// The server span of an inference request, a child of the client's `traceparent`
    /// when it sends one.
    pub fn request(headers: &http::HeaderMap, attrs: impl FnOnce() -> Vec<KeyValue>) -> Trace {
        let Some(t) = TRACER.get() else {
            return Trace::default();
        };
        Trace::start(t, "request", SpanKind::Server, &extract(headers), attrs)
    }

    /// A root span (no parent).
    pub fn root(name: &'static str, attrs: impl FnOnce() -> Vec<KeyValue>) -> Trace {
        let Some(t) = TRACER.get() else {
            return Trace::default();
        };
        Trace::start(t, name, SpanKind::Internal, &Context::new(), attrs)
    }

    /// A child span.
    pub fn child(
        &self,
        name: &'static str,
        kind: SpanKind,
        attrs: impl FnOnce() -> Vec<KeyValue>,
    ) -> Trace {
        match (&self.cx, TRACER.get()) {
            (Some(cx), Some(t)) => Trace::start(t, name, kind, cx, attrs),
            _ => Trace::default(),
        }
    }

    fn start(
        t: &SdkTracer,
        name: &'static str,
        kind: SpanKind,
        parent: &Context,
        attrs: impl FnOnce() -> Vec<KeyValue>,
    ) -> Trace {
        // The sampler decides from the parent and the trace id alone; attributes are built
        // only for spans that are recorded.
        let mut span = t
            .span_builder(name)
            .with_kind(kind)
            .start_with_context(t, parent);
        let sampled = span.span_context().is_sampled();
        if sampled {
            span.set_attributes(attrs());
        }
        Trace {
            cx: Some(parent.with_span(span)),
            sampled,
        }
    }

    /// The span is recorded (attributes are worth building).
    pub fn recording(&self) -> bool {
        self.sampled
    }

    /// Sets attributes (built only when recorded).
    pub fn set(&self, attrs: impl FnOnce() -> Vec<KeyValue>) {
        if let (true, Some(cx)) = (self.sampled, &self.cx) {
            cx.span().set_attributes(attrs());
        }
    }

    /// Adds a timestamped event.
    pub fn event(&self, name: &'static str) {
        if let (true, Some(cx)) = (self.sampled, &self.cx) {
            cx.span().add_event(name, Vec::new());
        }
    }

    /// Marks the span failed.
    pub fn fail(&self, description: &str) {
        if let (true, Some(cx)) = (self.sampled, &self.cx) {
            cx.span().set_status(Status::error(description.to_owned()));
        }
    }

    /// Ends the span now (it also ends when the last clone is dropped).
    pub fn end(&self) {
        if let Some(cx) = &self.cx {
            cx.span().end();
        }
    }

    /// Writes this span as the `traceparent` / `tracestate` of an outgoing request.
    pub fn inject(&self, headers: &mut http::HeaderMap) {
        if let Some(cx) = &self.cx {
            inject(cx, headers);
        }
    }

    /// The trace id, for log lines (none when tracing is off).
    pub fn trace_id(&self) -> Option<String> {
        self.cx
            .as_ref()
            .map(|cx| cx.span().span_context().trace_id().to_string())
    }

    /// The span id, for log lines.
    pub fn span_id(&self) -> Option<String> {
        self.cx
            .as_ref()
            .map(|cx| cx.span().span_context().span_id().to_string())
    }
}

/// What `main` keeps until exit: the tracer provider, flushed on drop.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            let _ = p.shutdown_with_timeout(EXIT_FLUSH);
        }
    }
}

/// Installs the global subscriber (log lines, text or JSON, and the bridge for the
/// cluster's spans) and, when an OTLP endpoint is configured, the tracer the request path
/// uses. Call outside any async runtime: the exporter runs its own thread.
pub fn init(log: &LogConfig, tr: &TracingConfig) -> Telemetry {
    let provider = tr.otlp_endpoint.as_ref().map(|ep| provider(ep, tr));
    let base = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&log.level));
    // The cluster's trace spans are for the exporter, not for log lines.
    let filter = match format!("{SPAN_TARGET}=off").parse() {
        Ok(d) => base.add_directive(d),
        Err(_) => base,
    };
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt: Box<dyn Layer<_> + Send + Sync> = if log.format == "json" {
        fmt.json().with_filter(filter).boxed()
    } else {
        fmt.with_filter(filter).boxed()
    };
    if let Some(p) = &provider {
        let _ = TRACER.set(p.tracer("router"));
    }
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("router"))
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            // Nothing reads OpenTelemetry's current context: attaching it on every poll of
            // an instrumented future would be pure cost.
            .with_context_activation(false)
            .with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target(SPAN_TARGET, tracing::Level::TRACE),
            )
    });
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .try_init();
    if let Some(ep) = &tr.otlp_endpoint {
        tracing::info!(endpoint = %ep, service = %tr.service_name, sampling = tr.sampling_ratio, "exporting traces over OTLP/gRPC");
    }
    Telemetry { provider }
}

fn provider(endpoint: &str, tr: &TracingConfig) -> SdkTracerProvider {
    STATS.enabled.store(true, Relaxed);
    let resource = Resource::builder()
        .with_service_name(tr.service_name.clone())
        .build();
    let (tx, rx) = sync_channel(tr.queue_spans);
    let export = ExportSetup {
        endpoint: endpoint.to_owned(),
        ca: tr.ca.clone(),
        headers: tr.headers.clone(),
        timeout: Duration::from_millis(tr.export_timeout_ms),
        resource: resource.clone(),
        cpu_share: f64::from(tr.export_cpu_percent.clamp(1, 100)) / 100.0,
    };
    let spawned = std::thread::Builder::new()
        .name("otlp-export".into())
        .spawn(move || export_loop(rx, export));
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the span export thread: spans will be dropped");
    }
    SdkTracerProvider::builder()
        .with_span_processor(QueuedExport { tx })
        .with_sampler(ShedWhenFull {
            inner: Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(tr.sampling_ratio))),
            // Room for the rest of the traces already recording.
            shed_at: (tr.queue_spans as u64 * 3 / 4).max(1),
        })
        .with_resource(resource)
        .build()
}

/// Sheds whole traces while the export queue is nearly full: their spans would be built
/// on the request path only to be dropped. Spans with a local parent follow the parent, so a
/// trace is recorded whole or not at all.
#[derive(Debug, Clone)]
struct ShedWhenFull {
    inner: Sampler,
    shed_at: u64,
}

impl ShouldSample for ShedWhenFull {
    fn should_sample(
        &self,
        parent: Option<&Context>,
        trace_id: opentelemetry::trace::TraceId,
        name: &str,
        kind: &SpanKind,
        attributes: &[KeyValue],
        links: &[opentelemetry::trace::Link],
    ) -> SamplingResult {
        let local_parent = parent.is_some_and(|p| {
            let sc = p.span().span_context().clone();
            sc.is_valid() && !sc.is_remote()
        });
        if !local_parent && STATS.queued.load(Relaxed) >= self.shed_at {
            STATS.traces_shed.fetch_add(1, Relaxed);
            return SamplingResult {
                decision: SamplingDecision::Drop,
                attributes: Vec::new(),
                trace_state: parent
                    .map(|p| p.span().span_context().trace_state().clone())
                    .unwrap_or_default(),
            };
        }
        self.inner
            .should_sample(parent, trace_id, name, kind, attributes, links)
    }
}

enum Msg {
    Span(Box<SpanData>),
    Flush(SyncSender<()>),
}

/// Hands finished spans to the export thread without ever waiting.
#[derive(Debug)]
struct QueuedExport {
    tx: SyncSender<Msg>,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Msg")
    }
}

impl SpanProcessor for QueuedExport {
    fn on_start(&self, _span: &mut Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        match self.tx.try_send(Msg::Span(Box::new(span))) {
            Ok(()) => {
                STATS.queued.fetch_add(1, Relaxed);
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                STATS.dropped_queue_full.fetch_add(1, Relaxed);
            }
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        flush(&self.tx, EXIT_FLUSH)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        flush(&self.tx, timeout)
    }
}

/// Waits (bounded) until the export thread has sent everything queued before this call.
fn flush(tx: &SyncSender<Msg>, timeout: Duration) -> OTelSdkResult {
    let deadline = Instant::now() + timeout;
    let (done_tx, done_rx) = sync_channel(1);
    let mut msg = Msg::Flush(done_tx);
    loop {
        match tx.try_send(msg) {
            Ok(()) => break,
            Err(TrySendError::Disconnected(_)) => return Err(OTelSdkError::AlreadyShutdown),
            Err(TrySendError::Full(m)) => {
                if Instant::now() >= deadline {
                    return Err(OTelSdkError::Timeout(timeout));
                }
                msg = m;
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
    done_rx
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .map_err(|_| OTelSdkError::Timeout(timeout))
}

struct ExportSetup {
    endpoint: String,
    ca: Option<std::path::PathBuf>,
    headers: std::collections::BTreeMap<String, String>,
    timeout: Duration,
    resource: Resource,
    /// Share of one core the export thread may use.
    cpu_share: f64,
}

/// CPU time the calling thread has run (`/proc/thread-self/schedstat`, ns); `None` where
/// the kernel does not report it (then the export budget is not enforced).
fn thread_cpu() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// How long to rest after spending `cpu` so that the thread's duty cycle stays within
/// `share` of one core.
fn rest_for(cpu: Duration, share: f64) -> Duration {
    if share >= 1.0 {
        return Duration::ZERO;
    }
    cpu.mul_f64((1.0 - share) / share.max(0.01))
}

fn export_loop(rx: Receiver<Msg>, setup: ExportSetup) {
    // Serving comes first: the exporter runs on CPU time the router leaves idle
    // (SCHED_IDLE). On a saturated machine its queue fills and spans are dropped and
    // counted, rather than taking CPU from requests.
    if let Err(e) = idle_priority() {
        tracing::debug!(error = %e, "span export thread keeps normal priority");
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "span export: no runtime; spans will be dropped");
            return drain_failed(rx);
        }
    };
    let built = rt.block_on(async {
        let mut md = tonic::metadata::MetadataMap::new();
        for (k, v) in &setup.headers {
            if let (Ok(k), Ok(v)) = (
                tonic::metadata::MetadataKey::from_bytes(k.as_bytes()),
                v.parse(),
            ) {
                md.insert(k, v);
            }
        }
        let mut b = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(setup.endpoint.clone())
            .with_timeout(setup.timeout)
            .with_metadata(md);
        if setup.endpoint.starts_with("https://") {
            // The collector's own CA when given (checked by the config), else the web PKI.
            let tls = tonic::transport::ClientTlsConfig::new();
            let tls = match setup.ca.as_ref().and_then(|p| std::fs::read(p).ok()) {
                Some(pem) => tls.ca_certificate(tonic::transport::Certificate::from_pem(pem)),
                None => tls.with_webpki_roots(),
            };
            b = b.with_tls_config(tls);
        }
        b.build()
    });
    let mut exporter = match built {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(error = %e, endpoint = %setup.endpoint, "span export: cannot build the OTLP exporter; spans will be dropped");
            return drain_failed(rx);
        }
    };
    exporter.set_resource(&setup.resource);
    let mut last_failure_log: Option<Instant> = None;
    let mut batch: Vec<SpanData> = Vec::with_capacity(EXPORT_BATCH);
    let mut flushes: Vec<SyncSender<()>> = Vec::new();
    loop {
        let first = match rx.recv() {
            Ok(m) => m,
            Err(_) => return,
        };
        let take = |m: Msg, batch: &mut Vec<SpanData>, flushes: &mut Vec<SyncSender<()>>| match m {
            Msg::Span(s) => {
                STATS.queued.fetch_sub(1, Relaxed);
                batch.push(*s);
            }
            Msg::Flush(done) => flushes.push(done),
        };
        take(first, &mut batch, &mut flushes);
        let deadline = Instant::now() + EXPORT_EVERY;
        while batch.len() < EXPORT_BATCH && flushes.is_empty() {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(m) => take(m, &mut batch, &mut flushes),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
            }
        }
        if !batch.is_empty() {
            let cpu_before = thread_cpu();
            let n = batch.len() as u64;
            match rt.block_on(exporter.export(std::mem::take(&mut batch))) {
                Ok(()) => {
                    STATS.exported.fetch_add(n, Relaxed);
                }
                Err(e) => {
                    STATS.dropped_export_failed.fetch_add(n, Relaxed);
                    if last_failure_log.is_none_or(|t| t.elapsed() >= FAILURE_LOG_EVERY) {
                        last_failure_log = Some(Instant::now());
                        tracing::warn!(error = %e, endpoint = %setup.endpoint, spans = n, "span export failed; dropping spans (counted in router_trace_spans_dropped_total)");
                    }
                }
            }
            batch = Vec::with_capacity(EXPORT_BATCH);
            // Stay within the CPU budget: spans that arrive meanwhile wait in the queue,
            // and when it fills, new traces are shed rather than slowing requests.
            // A flush waiting (shutdown) is served at once.
            if let (Some(a), Some(b)) = (cpu_before, thread_cpu()) {
                let used = b.saturating_sub(a);
                STATS
                    .export_cpu_ns
                    .fetch_add(used.as_nanos() as u64, Relaxed);
                if flushes.is_empty() {
                    std::thread::sleep(rest_for(used, setup.cpu_share));
                }
            }
        }
        for f in flushes.drain(..) {
            let _ = f.send(());
        }
    }
}

fn drain_failed(rx: Receiver<Msg>) {
    for m in rx {
        match m {
            Msg::Span(_) => {
                STATS.queued.fetch_sub(1, Relaxed);
                STATS.dropped_export_failed.fetch_add(1, Relaxed);
            }
            Msg::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// Lowers the calling thread to `SCHED_IDLE`: it runs only on CPU nothing else wants.
pub fn idle_priority() -> Result<(), String> {
    #[cfg(target_os = "linux")]
    {
        use thread_priority::unix::{
            set_thread_priority_and_policy, thread_native_id, NormalThreadSchedulePolicy,
            ThreadSchedulePolicy,
        };
        set_thread_priority_and_policy(
            thread_native_id(),
            thread_priority::ThreadPriority::Min,
            ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle),
        )
        .map_err(|e| format!("{e:?}"))
    }
    #[cfg(not(target_os = "linux"))]
    Err("SCHED_IDLE is Linux only".into())
}

/// The W3C trace context of a request's headers (`traceparent`, `tracestate`).
pub fn extract(headers: &http::HeaderMap) -> opentelemetry::Context {
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

/// Writes `cx` as `traceparent` / `tracestate`, replacing the client's.
pub fn inject(cx: &opentelemetry::Context, headers: &mut http::HeaderMap) {
    TraceContextPropagator::new().inject_context(cx, &mut HeaderInjector(headers));
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

struct HeaderInjector<'a>(&'a mut http::HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            http::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(k, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_context_round_trips_through_headers() {
        let mut h = http::HeaderMap::new();
        h.insert(
            "traceparent",
            http::HeaderValue::from_static(
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
        );
        let cx = extract(&h);
        let sc = cx.span().span_context().clone();
        assert_eq!(
            sc.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert!(sc.is_sampled() && sc.is_remote());
        let mut out = http::HeaderMap::new();
        inject(&cx, &mut out);
        assert_eq!(
            out["traceparent"],
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        );
    }

    #[test]
    fn the_exporter_rests_to_stay_within_its_cpu_share() {
        let ms = Duration::from_millis;
        assert_eq!(rest_for(ms(10), 0.05), ms(190));
        assert_eq!(rest_for(ms(10), 0.5), ms(10));
        assert_eq!(rest_for(ms(10), 1.0), Duration::ZERO);
        // The thread's CPU clock moves with work done (where the kernel reports it).
        if let Some(a) = thread_cpu() {
            let t = Instant::now();
            let mut x = 0u64;
            while t.elapsed() < ms(30) {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            let used = thread_cpu().unwrap().saturating_sub(a);
            assert!(used >= ms(10) && used <= ms(200), "{used:?}");
        }
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let (tx, _rx) = sync_channel(1);
        let p = QueuedExport { tx };
        let before = STATS.dropped_queue_full.load(Relaxed);
        let span = || {
            let mut d = SpanData {
                span_context: opentelemetry::trace::SpanContext::new(
                    opentelemetry::trace::TraceId::from(1u128),
                    opentelemetry::trace::SpanId::from(1u64),
                    opentelemetry::trace::TraceFlags::SAMPLED,
                    false,
                    Default::default(),
                ),
                parent_span_id: opentelemetry::trace::SpanId::INVALID,
                parent_span_is_remote: false,
                span_kind: opentelemetry::trace::SpanKind::Internal,
                name: "x".into(),
                start_time: std::time::SystemTime::now(),
                end_time: std::time::SystemTime::now(),
                attributes: Vec::new(),
                dropped_attributes_count: 0,
                events: Default::default(),
                links: Default::default(),
                status: opentelemetry::trace::Status::Unset,
                instrumentation_scope: Default::default(),
            };
            d.name = "y".into();
            d
        };
        let t = Instant::now();
        for _ in 0..100 {
            p.on_end(span());
        }
        assert!(t.elapsed() < Duration::from_secs(1));
        assert!(STATS.dropped_queue_full.load(Relaxed) - before >= 99);
    }
}
