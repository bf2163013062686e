//! Prometheus text exposition (format 0.0.4), written by hand in one place.
//!
//! The router records into atomics and renders at scrape time; `prometheus-client` was
//! measured against it (`routerbench metrics`: 1.5-1.65x slower per request, a write lock
//! shared by every thread on each histogram observation), so the router keeps its own
//! recording and this crate is the single writer of the text: every family gets its
//! `# HELP` and `# TYPE`, label values are escaped, floats are spelled as Prometheus
//! parses them, and counter names end in `_total`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// A metric family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up; the name ends in `_total`.
    Counter,
    /// Goes up and down.
    Gauge,
    /// `_bucket` / `_sum` / `_count` series.
    Histogram,
}

impl Kind {
    /// Counter when the name ends in `_total`, else gauge: for tables of scalar series.
    pub fn by_name(name: &str) -> Kind {
        if name.ends_with("_total") {
            Kind::Counter
        } else {
            Kind::Gauge
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A sample value.
pub trait Value {
    /// Appends the value as Prometheus spells it.
    fn write_to(&self, out: &mut String);
}

/// Integers print as Rust prints them.
macro_rules! integer_value {
    ($($t:ty),*) => {$(
        impl Value for $t {
            fn write_to(&self, out: &mut String) {
                let _ = write!(out, "{self}");
            }
        }
    )*};
}
integer_value!(u64, i64, usize);

impl Value for f64 {
    fn write_to(&self, out: &mut String) {
        if self.is_nan() {
            out.push_str("NaN");
        } else if self.is_infinite() {
            out.push_str(if *self > 0.0 { "+Inf" } else { "-Inf" });
        } else {
            let _ = write!(out, "{self}");
        }
    }
}

/// A text exposition being written.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// Empty, with room for `bytes`.
    pub fn with_capacity(bytes: usize) -> Exposition {
        Exposition {
            out: String::with_capacity(bytes),
        }
    }

    /// Starts a family: its `# HELP` and `# TYPE` lines.
    pub fn family(&mut self, name: &str, help: &str, kind: Kind) -> &mut Self {
        debug_assert!(valid_name(name), "metric name {name:?}");
        debug_assert!(
            (kind == Kind::Counter) == name.ends_with("_total"),
            "{name}: counters and only counters end in _total"
        );
        self.out.push_str("# HELP ");
        self.out.push_str(name);
        self.out.push(' ');
        escape(&mut self.out, help, false);
        self.out.push_str("\n# TYPE ");
        self.out.push_str(name);
        self.out.push(' ');
        self.out.push_str(kind.as_str());
        self.out.push('\n');
        self
    }

    /// One sample line of the family just started (or of its `_bucket`/`_sum`/`_count`).
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: impl Value) -> &mut Self {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                debug_assert!(valid_name(k), "label name {k:?}");
                self.out.push_str(k);
                self.out.push_str("=\"");
                escape(&mut self.out, val, true);
                self.out.push('"');
            }
            self.out.push('}');
        }
        self.out.push(' ');
        v.write_to(&mut self.out);
        self.out.push('\n');
        self
    }

    /// A family of one unlabelled sample, its kind by its name (see [`Kind::by_name`]).
    pub fn scalar(&mut self, name: &str, help: &str, v: impl Value) -> &mut Self {
        self.family(name, help, Kind::by_name(name))
            .sample(name, &[], v)
    }

    /// The text.
    pub fn finish(self) -> String {
        self.out
    }
}

/// Appends `s` escaped as the text format wants: backslash and newline always (HELP text),
/// the double quote too inside a label value.
fn escape(out: &mut String, s: &str, quote: bool) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

fn valid_name(n: &str) -> bool {
    let mut chars = n.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Latency buckets (seconds) of the router's histograms: 1 ms to 5 min.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// A latency histogram over [`LATENCY_BUCKETS`], lock-free: an observation is two relaxed
/// atomic adds.
pub struct Histogram {
    counts: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_us: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Histogram {
    /// Empty.
    pub fn new() -> Self {
        Histogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_us: AtomicU64::new(0),
        }
    }

    /// Counts one observation.
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = LATENCY_BUCKETS
            .iter()
            .position(|b| s <= *b)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.counts[i].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(d.as_micros() as u64, Relaxed);
    }

    /// Appends the family: cumulative buckets, `+Inf`, sum (seconds) and count.
    pub fn render(&self, out: &mut Exposition, name: &str, help: &str) {
        out.family(name, help, Kind::Histogram);
        let bucket = format!("{name}_bucket");
        let mut cum = 0;
        let mut le = String::new();
        for (i, b) in LATENCY_BUCKETS.iter().enumerate() {
            cum += self.counts[i].load(Relaxed);
            le.clear();
            b.write_to(&mut le);
            out.sample(&bucket, &[("le", &le)], cum);
        }
        cum += self.counts[LATENCY_BUCKETS.len()].load(Relaxed);
        out.sample(&bucket, &[("le", "+Inf")], cum);
        out.sample(
            &format!("{name}_sum"),
            &[],
            self.sum_us.load(Relaxed) as f64 / 1e6,
        );
        out.sample(&format!("{name}_count"), &[], cum);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_have_help_and_type_and_labels_are_escaped() {
        let mut e = Exposition::default();
        e.family(
            "x_requests_total",
            "Requests.\nBy path \\ code.",
            Kind::Counter,
        )
        .sample(
            "x_requests_total",
            &[("path", "a\"b\\c\nd"), ("code", "200")],
            3u64,
        );
        e.scalar("x_up", "Up.", 1u64);
        e.scalar("x_ratio", "Ratio.", f64::NAN)
            .sample("x_ratio", &[], f64::INFINITY)
            .sample("x_ratio", &[], f64::NEG_INFINITY)
            .sample("x_ratio", &[], 0.25);
        assert_eq!(
            e.finish(),
            "# HELP x_requests_total Requests.\\nBy path \\\\ code.\n\
             # TYPE x_requests_total counter\n\
             x_requests_total{path=\"a\\\"b\\\\c\\nd\",code=\"200\"} 3\n\
             # HELP x_up Up.\n# TYPE x_up gauge\nx_up 1\n\
             # HELP x_ratio Ratio.\n# TYPE x_ratio gauge\nx_ratio NaN\nx_ratio +Inf\nx_ratio -Inf\nx_ratio 0.25\n"
        );
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_end_at_inf() {
        let h = Histogram::new();
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(1000));
        let mut e = Exposition::default();
        h.render(&mut e, "x_seconds", "Latency.");
        let t = e.finish();
        assert!(t.starts_with("# HELP x_seconds Latency.\n# TYPE x_seconds histogram\n"));
        assert!(t.contains("x_seconds_bucket{le=\"0.001\"} 1\n"), "{t}");
        assert!(t.contains("x_seconds_bucket{le=\"0.005\"} 2\n"), "{t}");
        assert!(t.contains("x_seconds_bucket{le=\"300\"} 2\n"), "{t}");
        assert!(t.contains("x_seconds_bucket{le=\"+Inf\"} 3\n"), "{t}");
        assert!(t.contains("x_seconds_count 3\n"), "{t}");
        assert!(t.contains("x_seconds_sum 1000.0035\n"), "{t}");
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "_total")]
    fn a_counter_without_total_is_refused() {
        Exposition::default().family("x_requests", "Requests.", Kind::Counter);
    }
}
