//! `routerbench canon`: CPU cost of the router's per-request prompt work (canonicalize and
//! fingerprint), against a plain copy and a full serde_json validation of the same bytes in
//! the same process, so the ratios hold on a noisy machine.

use router_core::{canonicalize_json, fingerprint_json, Endpoint, FingerprintConfig};
use std::hint::black_box;
use std::time::Instant;

/// Settings.
#[derive(Debug, Clone, clap::Args)]
pub struct CanonArgs {
    /// Body sizes to measure, bytes.
    #[arg(long, value_delimiter = ',', default_values_t = [40_000usize, 150_000])]
    pub bytes: Vec<usize>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 1.0)]
    pub secs: f64,
}

/// An agent-like chat body: system prompt, tools, then turns of code with newlines, quotes,
/// tabs and some non-ASCII, as coding agents send them.
pub fn agent_body(bytes: usize, salt: u64) -> Vec<u8> {
    let mut rng = crate::rng::Rng::new(salt);
    let mut line = |n: usize| {
        let mut s = String::new();
        while s.len() < n {
            s.push_str(&crate::rng::text(&mut rng, 12));
            match rng.next_u64() % 8 {
                0 => s.push_str("\n    \"key\": \"value\",\n"),
                1 => s.push_str("\t// r\u{e9}sum\u{e9}\n"),
                _ => s.push('\n'),
            }
        }
        s
    };
    let tools = serde_json::json!([{"type":"function","function":{"name":"read_file","description":"Read a file","parameters":{"type":"object","properties":{"path":{"type":"string"}}}}}]);
    let mut messages = vec![serde_json::json!({"role":"system","content": line(bytes / 6)})];
    let mut used = bytes / 6;
    let mut i = 0;
    while used < bytes {
        let n = (bytes - used).min(4000);
        let m = match i % 3 {
            0 => serde_json::json!({"role":"user","content": line(n)}),
            1 => {
                serde_json::json!({"role":"assistant","content": null, "tool_calls":[{"id": format!("call_{i}"),"type":"function","function":{"name":"read_file","arguments":"{\"path\":\"src/main.rs\"}"}}]})
            }
            _ => {
                serde_json::json!({"role":"tool","tool_call_id": format!("call_{}", i - 1),"content": line(n)})
            }
        };
        used += n;
        messages.push(m);
        i += 1;
    }
    serde_json::to_vec(&serde_json::json!({"model":"m","messages":messages,"tools":tools,"max_tokens":256,"stream":true}))
        .unwrap_or_default()
}

/// A prose chat body (system and user text without escapes), as `routerbench proxy` sends.
pub fn prose_body(bytes: usize, salt: u64) -> Vec<u8> {
    let mut rng = crate::rng::Rng::new(salt);
    let sys = crate::rng::text(&mut rng, bytes / 8);
    let user = crate::rng::text(&mut rng, bytes / 8);
    serde_json::to_vec(&serde_json::json!({"model":"m","messages":[{"role":"system","content":sys},{"role":"user","content":user}],"max_tokens":1}))
        .unwrap_or_default()
}

/// Makes a body of about `bytes` from a seed.
type BodyFn = fn(usize, u64) -> Vec<u8>;

/// Mean nanoseconds per call of `f` over about `secs`.
fn time(secs: f64, mut f: impl FnMut()) -> f64 {
    for _ in 0..10 {
        f();
    }
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        for _ in 0..32 {
            f();
        }
        n += 32;
    }
    start.elapsed().as_nanos() as f64 / n as f64
}

/// Runs the measurements and prints a table.
pub fn run(a: CanonArgs) -> anyhow::Result<serde_json::Value> {
    let fp = FingerprintConfig::default();
    let mut rows = Vec::new();
    println!(
        "{:<6} {:>8} {:>9} {:>9} {:>9} {:>9} {:>12} {:>11}",
        "shape", "bytes", "copy us", "serde us", "canon us", "fp us", "canon+fp us", "path/serde"
    );
    let shapes: [(&str, BodyFn); 2] = [("agent", agent_body), ("prose", prose_body)];
    for (shape, &size) in shapes
        .iter()
        .flat_map(|s| a.bytes.iter().map(move |b| (s, b)))
    {
        let body = (shape.1)(size, 7);
        canonicalize_json(Endpoint::Chat, &body)
            .map_err(|e| anyhow::anyhow!("benchmark body does not canonicalize: {e}"))?;
        let copy = time(a.secs, || {
            black_box(black_box(&body).to_vec());
        });
        let serde = time(a.secs, || {
            black_box(serde_json::from_slice::<serde::de::IgnoredAny>(black_box(&body)).ok());
        });
        let canon = time(a.secs, || {
            black_box(canonicalize_json(Endpoint::Chat, black_box(&body)).ok());
        });
        let c = canonicalize_json(Endpoint::Chat, &body).map_err(|e| anyhow::anyhow!("{e}"))?;
        let fps = time(a.secs, || {
            black_box(fp.fingerprint(&c.model, black_box(&c.bytes)));
        });
        // What the request path runs: both in one pass, no canonical buffer.
        let path = time(a.secs, || {
            black_box(fingerprint_json(Endpoint::Chat, black_box(&body), &fp).ok());
        });
        println!(
            "{:<6} {:>8} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>12.2} {:>11.2}",
            shape.0,
            body.len(),
            copy / 1e3,
            serde / 1e3,
            canon / 1e3,
            fps / 1e3,
            path / 1e3,
            path / serde
        );
        rows.push(serde_json::json!({"shape": shape.0, "bytes": body.len(), "copy_us": copy / 1e3, "serde_validate_us": serde / 1e3,
            "canonicalize_us": canon / 1e3, "fingerprint_us": fps / 1e3, "request_path_us": path / 1e3}));
    }
    Ok(serde_json::Value::Array(rows))
}
