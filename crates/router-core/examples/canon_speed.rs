//! Times parse + canonicalize + fingerprint on a large chat body (a quick profile aid).
use router_core::{canonicalize, canonicalize_json, Endpoint, FingerprintConfig};
use std::time::Instant;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(150_000);
    let words = [
        "fn ",
        "let ",
        "impl ",
        "match ",
        "self.",
        "Vec<u8> ",
        "\"quoted\" ",
        "tab\t",
        "nl\n",
    ];
    let plain = std::env::args().nth(2).is_some_and(|a| a == "plain");
    let words: Vec<&str> = if plain {
        words
            .iter()
            .copied()
            .filter(|w| !w.contains(['"', '\t', '\n']))
            .collect()
    } else {
        words.to_vec()
    };
    let mut s = String::new();
    let mut i = 0usize;
    while s.len() < n / 2 {
        s.push_str(words[i % words.len()]);
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    let body = serde_json::to_vec(&serde_json::json!({"model":"m","messages":[{"role":"system","content":s},{"role":"user","content":s}]})).unwrap();
    let cfg = FingerprintConfig::default();
    let iters = 2000;
    let (mut tp, mut tc, mut tf, mut tr) = (0u128, 0u128, 0u128, 0u128);
    for _ in 0..iters {
        let t = Instant::now();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        tp += t.elapsed().as_nanos();
        let t = Instant::now();
        std::hint::black_box(canonicalize(Endpoint::Chat, &v).unwrap());
        tc += t.elapsed().as_nanos();
        let t = Instant::now();
        let c = canonicalize_json(Endpoint::Chat, &body).unwrap();
        tr += t.elapsed().as_nanos();
        let t = Instant::now();
        let f = cfg.fingerprint(&c.model, &c.bytes);
        tf += t.elapsed().as_nanos();
        std::hint::black_box(f);
    }
    let t = Instant::now();
    for _ in 0..iters {
        let v: serde::de::IgnoredAny = serde_json::from_slice(&body).unwrap();
        std::hint::black_box(v);
    }
    println!(
        "skip-only (IgnoredAny): {:.1} us",
        t.elapsed().as_nanos() as f64 / iters as f64 / 1000.0
    );
    let t = Instant::now();
    for _ in 0..iters {
        let v: Box<serde_json::value::RawValue> = serde_json::from_slice(&body).unwrap();
        std::hint::black_box(v);
    }
    println!(
        "raw value: {:.1} us",
        t.elapsed().as_nanos() as f64 / iters as f64 / 1000.0
    );
    let us = |x: u128| x as f64 / iters as f64 / 1000.0;
    println!(
        "{} bytes: Value parse {:.1} us + canonicalize(Value) {:.1} us; canonicalize_json (request path) {:.1} us; fingerprint {:.1} us",
        body.len(),
        us(tp),
        us(tc),
        us(tr),
        us(tf)
    );
}
