//! Property tests over arbitrary JSON: the canonicalizer never panics, and its output does
//! not depend on key order or on fields that do not reach the prompt.

use proptest::prelude::*;
use router_core::{canonicalize, canonicalize_json, Endpoint, FingerprintConfig};
use serde_json::{Map, Value};

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,24}".prop_map(Value::String),
        prop_oneof![
            Just("role"),
            Just("content"),
            Just("user"),
            Just("text"),
            Just("tool_calls"),
            Just("messages")
        ]
        .prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(5, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop_oneof![
                        Just("messages".to_owned()),
                        Just("role".to_owned()),
                        Just("content".to_owned()),
                        Just("prompt".to_owned()),
                        Just("input".to_owned()),
                        Just("system".to_owned()),
                        Just("tools".to_owned()),
                        Just("type".to_owned()),
                        Just("text".to_owned()),
                        Just("tool_calls".to_owned()),
                        Just("session_params".to_owned()),
                        Just("session_id".to_owned()),
                        Just("model".to_owned()),
                        Just("stream".to_owned()),
                        "[a-z_]{1,8}",
                    ],
                    inner
                ),
                0..8
            )
            .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<String, Value>>())),
        ]
    })
}

fn arb_message() -> impl Strategy<Value = Value> {
    (
        prop_oneof![
            Just("system"),
            Just("user"),
            Just("assistant"),
            Just("tool"),
            Just("developer")
        ],
        prop_oneof![
            ".{0,40}".prop_map(Value::String),
            prop::collection::vec(
                ".{0,20}".prop_map(|t| serde_json::json!({"type":"text","text":t})),
                0..3
            )
            .prop_map(Value::Array),
        ],
    )
        .prop_map(|(r, c)| serde_json::json!({"role": r, "content": c}))
}

const ENDPOINTS: [Endpoint; 4] = [
    Endpoint::Chat,
    Endpoint::Completions,
    Endpoint::Responses,
    Endpoint::Messages,
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, .. ProptestConfig::default() })]

    #[test]
    fn never_panics(v in arb_json()) {
        for ep in ENDPOINTS {
            if let Ok(c) = canonicalize(ep, &v) {
                let _ = FingerprintConfig::default().fingerprint(&c.model, &c.bytes);
            }
        }
        // Wrapped as a chat body too, so the deep paths get exercised.
        let wrapped = serde_json::json!({"model": "m", "messages": [v.clone()], "input": [v.clone()], "prompt": v});
        for ep in ENDPOINTS {
            let _ = canonicalize(ep, &wrapped);
        }
    }

    #[test]
    fn key_order_and_sampling_fields_do_not_matter(
        msgs in prop::collection::vec(arb_message(), 1..6),
        temp in 0.0f64..2.0,
        max_tokens in 1u32..10_000,
    ) {
        let a = serde_json::json!({"model": "m", "messages": msgs});
        // Rebuild with keys inserted in reverse order (serde_json's map sorts anyway, so
        // round-trip through text with a different layout) plus sampling fields.
        let mut b = a.clone();
        b["temperature"] = Value::from(temp);
        b["max_tokens"] = Value::from(max_tokens);
        b["stream"] = Value::Bool(true);
        b["user"] = Value::from("someone");
        // Raw text in two layouts, with every non-ASCII char escaped in one of them.
        let compact = serde_json::to_string(&a).unwrap();
        let mut pretty = String::new();
        for c in serde_json::to_string_pretty(&b).unwrap().chars() {
            if c.is_ascii() {
                pretty.push(c);
            } else {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    pretty.push_str(&format!("\\u{:04x}", u));
                }
            }
        }
        let ca = canonicalize_json(Endpoint::Chat, compact.as_bytes()).unwrap();
        let cb = canonicalize_json(Endpoint::Chat, pretty.as_bytes()).unwrap();
        prop_assert_eq!(ca.bytes, cb.bytes);
    }

    #[test]
    fn raw_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600), v in arb_json()) {
        for ep in ENDPOINTS {
            let _ = canonicalize_json(ep, &bytes);
            let text = serde_json::to_string(&v).unwrap();
            let _ = canonicalize_json(ep, text.as_bytes());
            // Truncated and spliced documents.
            let cut = text.len() / 2;
            let _ = canonicalize_json(ep, &text.as_bytes()[..cut]);
            let mut spliced = text.as_bytes()[..cut].to_vec();
            spliced.extend_from_slice(&bytes);
            let _ = canonicalize_json(ep, &spliced);
        }
    }

    #[test]
    fn appending_messages_extends_bytes(
        msgs in prop::collection::vec(arb_message(), 1..6),
        more in prop::collection::vec(arb_message(), 1..3),
    ) {
        // Only when the new messages are not leading system turns (those move to the front).
        prop_assume!(msgs.iter().any(|m| m["role"] != "system" && m["role"] != "developer"));
        let a = serde_json::json!({"messages": msgs});
        let mut all = msgs.clone();
        all.extend(more);
        let b = serde_json::json!({"messages": all});
        let ca = canonicalize(Endpoint::Chat, &a).unwrap();
        let cb = canonicalize(Endpoint::Chat, &b).unwrap();
        prop_assert!(cb.bytes.starts_with(&ca.bytes));
    }
}
