//! The canonicalizer against the serde_json implementation it replaced (`reference/`):
//! for every body, both accept it with the same canonical bytes, model, session id and
//! stream flag, or both refuse it. Bodies are generated as agents send them (messages, parts,
//! tool calls, tools, Responses items, Anthropic blocks) and then re-spelled as other
//! clients spell the same JSON: escaped non-ASCII, escaped slashes, whitespace, key order.

#[path = "reference/serde_canon.rs"]
mod reference;

use proptest::prelude::*;
use router_core::{canonicalize_json, fingerprint_json, Endpoint, FingerprintConfig};
use serde_json::{json, Map, Value};

const ENDPOINTS: [Endpoint; 4] = [
    Endpoint::Chat,
    Endpoint::Completions,
    Endpoint::Responses,
    Endpoint::Messages,
];

fn arb_text() -> BoxedStrategy<String> {
    prop_oneof![
        ".{0,30}",
        "[a-z \n\t\"\\\\/]{0,30}",
        "[\u{0}-\u{1f}é€😀\u{2028}a/]{0,12}",
        Just(String::new()),
    ]
    .boxed()
}

fn arb_leaf() -> BoxedStrategy<Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        arb_text().prop_map(Value::String),
        prop_oneof![
            Just("text"),
            Just("user"),
            Just("system"),
            Just("message"),
            Just("function_call_output"),
            Just("reasoning"),
            Just("tool_result"),
            Just("thinking"),
            Just("input_text"),
        ]
        .prop_map(Value::from),
    ]
    .boxed()
}

fn key() -> BoxedStrategy<String> {
    prop_oneof![
        Just("role"),
        Just("content"),
        Just("type"),
        Just("text"),
        Just("name"),
        Just("tool_calls"),
        Just("tool_call_id"),
        Just("cache_control"),
        Just("id"),
        Just("status"),
        Just("call_id"),
        Just("output"),
        Just("thinking"),
        Just("tool_use_id"),
        Just("session_id"),
        Just("reasoning_content"),
        Just("function_call"),
        Just("z"),
        Just("é"),
    ]
    .prop_map(str::to_owned)
    .boxed()
}

fn arb_json() -> BoxedStrategy<Value> {
    arb_leaf()
        .prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec((key(), inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<String, Value>>())),
            ]
        })
        .boxed()
}

fn arb_part() -> BoxedStrategy<Value> {
    prop_oneof![
        arb_text().prop_map(|t| json!({"type": "text", "text": t})),
        arb_text().prop_map(
            |t| json!({"type": "input_text", "text": t, "cache_control": {"type": "ephemeral"}})
        ),
        arb_text().prop_map(|t| json!({"text": t})),
        arb_text().prop_map(|t| json!({"type": "thinking", "thinking": t})),
        (arb_text(), arb_text())
            .prop_map(|(id, t)| json!({"type": "tool_result", "tool_use_id": id, "content": t})),
        arb_json().prop_map(|v| json!({"type": "image_url", "image_url": v, "cache_control": 1})),
        arb_text().prop_map(Value::String),
        arb_json(),
    ]
    .boxed()
}

fn arb_content() -> BoxedStrategy<Value> {
    prop_oneof![
        3 => arb_text().prop_map(Value::String),
        2 => prop::collection::vec(arb_part(), 0..4).prop_map(Value::Array),
        1 => Just(Value::Null),
        1 => arb_json(),
    ]
    .boxed()
}

fn arb_message() -> BoxedStrategy<Value> {
    (
        prop_oneof![
            Just(json!("system")),
            Just(json!("developer")),
            Just(json!("user")),
            Just(json!("assistant")),
            Just(json!("tool")),
            arb_leaf(),
        ],
        arb_content(),
        prop::option::of(arb_text()),
        prop::option::of(prop::collection::vec(arb_json(), 0..3)),
        prop::option::of(arb_text()),
        prop::option::of(arb_json()),
    )
        .prop_map(|(role, content, name, calls, call_id, reasoning)| {
            let mut m = Map::new();
            m.insert("role".into(), role);
            m.insert("content".into(), content);
            if let Some(n) = name {
                m.insert("name".into(), Value::String(n));
            }
            if let Some(c) = calls {
                m.insert("tool_calls".into(), Value::Array(c));
            }
            if let Some(c) = call_id {
                m.insert("tool_call_id".into(), Value::String(c));
            }
            if let Some(r) = reasoning {
                m.insert("reasoning_content".into(), r);
            }
            Value::Object(m)
        })
        .boxed()
}

fn arb_item() -> BoxedStrategy<Value> {
    prop_oneof![
        arb_message(),
        (arb_text(), arb_content()).prop_map(
            |(id, o)| json!({"type": "function_call_output", "call_id": id, "output": o})
        ),
        arb_json().prop_map(
            |v| json!({"type": "function_call", "id": "fc_1", "status": "done", "arguments": v})
        ),
        arb_json().prop_map(|v| json!({"type": "reasoning", "summary": v})),
        arb_json(),
    ]
    .boxed()
}

fn arb_body() -> BoxedStrategy<Value> {
    (
        prop::option::of(prop_oneof![arb_text().prop_map(Value::String), arb_leaf()]),
        prop::collection::vec(arb_message(), 0..5),
        prop::option::of(prop::collection::vec(arb_json(), 0..3)),
        prop::option::of(prop_oneof![
            arb_text().prop_map(Value::String),
            prop::collection::vec(arb_part(), 0..3).prop_map(Value::Array),
            arb_leaf()
        ]),
        prop::option::of(prop_oneof![
            arb_text().prop_map(Value::String),
            prop::collection::vec(arb_item(), 0..4).prop_map(Value::Array),
            arb_leaf()
        ]),
        prop::option::of(prop_oneof![
            arb_text().prop_map(Value::String),
            prop::collection::vec(any::<u32>().prop_map(Value::from), 1..4).prop_map(Value::Array),
            prop::collection::vec(arb_leaf(), 0..3).prop_map(Value::Array),
        ]),
        prop::option::of(arb_json()),
        prop::option::of(any::<bool>()),
        prop::option::of(arb_json()),
    )
        .prop_map(
            |(model, messages, tools, system, input, prompt, session, stream, extra)| {
                let mut b = Map::new();
                if let Some(m) = model {
                    b.insert("model".into(), m);
                }
                b.insert("messages".into(), Value::Array(messages));
                if let Some(t) = tools {
                    b.insert("tools".into(), Value::Array(t));
                }
                if let Some(s) = system {
                    b.insert("system".into(), s);
                }
                if let Some(i) = input {
                    b.insert("input".into(), i);
                }
                if let Some(p) = prompt {
                    b.insert("prompt".into(), p);
                }
                if let Some(s) = session {
                    b.insert("session_params".into(), json!({"session_id": s}));
                }
                if let Some(s) = stream {
                    b.insert("stream".into(), Value::Bool(s));
                }
                if let Some(e) = extra {
                    b.insert("chat_template_kwargs".into(), e.clone());
                    b.insert("temperature".into(), e);
                }
                Value::Object(b)
            },
        )
        .boxed()
}

/// The same JSON as another client would spell it: chosen characters escaped as `\uXXXX`
/// (surrogate pairs above the BMP), `/` as `\/`, and pretty-printed.
fn respell(v: &Value, escape_every: usize) -> String {
    let text = serde_json::to_string_pretty(v).unwrap();
    let mut out = String::with_capacity(text.len() * 2);
    let mut in_str = false;
    let mut esc = false;
    for (n, c) in text.chars().enumerate() {
        if in_str && !esc && c != '"' && c != '\\' && n % escape_every == 0 {
            if c == '/' {
                out.push_str("\\/");
            } else {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{:04X}", u));
                }
            }
            continue;
        }
        if !esc && c == '"' {
            in_str = !in_str;
        }
        esc = !esc && c == '\\';
        out.push(c);
    }
    out
}

fn same(text: &[u8]) -> Result<(), TestCaseError> {
    for ep in ENDPOINTS {
        let new = canonicalize_json(ep, text);
        let old = reference::canonicalize_json(ep, text);
        // The request path hashes as it canonicalizes; it must equal hashing the bytes.
        for cfg in [
            FingerprintConfig::default(),
            FingerprintConfig {
                chunk_bytes: 64,
                max_prefix_bytes: 64 * 4 + 17,
                bytes_per_token: 3,
            },
            FingerprintConfig {
                chunk_bytes: 7,
                max_prefix_bytes: 1 << 20,
                bytes_per_token: 4,
            },
        ] {
            let printed = fingerprint_json(ep, text, &cfg);
            match (&printed, &new) {
                (Ok(p), Ok(c)) => {
                    prop_assert_eq!(&p.fingerprints, &cfg.fingerprint(&c.model, &c.bytes));
                    prop_assert_eq!(
                        (&p.model, &p.session_id, p.stream),
                        (&c.model, &c.session_id, c.stream)
                    );
                }
                (Err(a), Err(b)) => prop_assert_eq!(a, b),
                _ => prop_assert!(false, "fingerprint_json and canonicalize_json disagree"),
            }
        }
        match (&new, &old) {
            (Ok(a), Ok(b)) => prop_assert_eq!(a, b, "{:?} {}", ep, String::from_utf8_lossy(text)),
            (Err(_), Err(_)) => {}
            // serde's derive also read a struct from a JSON array (`["user", null, "hi"]`
            // as a message); the new reader wants messages to be objects, as the APIs say.
            (
                Err(router_core::CanonError::WrongType {
                    field,
                    expected: "an object",
                }),
                Ok(_),
            ) if field.starts_with("messages[") && !field.contains('.') => {}
            // serde skipped unknown fields without checking their UTF-8; the new reader
            // checks every string (invalid JSON is refused wherever it is).
            (Err(router_core::CanonError::Json(m)), Ok(_)) if m.contains("invalid UTF-8") => {}
            _ => prop_assert!(
                false,
                "{:?}: new {:?} old {:?} for {}",
                ep,
                new.as_ref().map(|_| ()),
                old.as_ref().map(|_| ()),
                String::from_utf8_lossy(text)
            ),
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, .. ProptestConfig::default() })]

    #[test]
    fn agrees_on_agent_bodies(b in arb_body(), every in 1usize..9) {
        same(serde_json::to_string(&b).unwrap().as_bytes())?;
        same(respell(&b, every).as_bytes())?;
    }

    #[test]
    fn agrees_on_arbitrary_json(v in arb_json()) {
        same(serde_json::to_string(&v).unwrap().as_bytes())?;
        let wrapped = json!({"model": "m", "messages": [v.clone()], "input": [v.clone()], "prompt": v, "system": [v], "tools": [v]});
        same(serde_json::to_string(&wrapped).unwrap().as_bytes())?;
    }

    #[test]
    fn agrees_on_damaged_text(b in arb_body(), cut in 0.0f64..1.0, junk in prop::collection::vec(any::<u8>(), 0..8)) {
        let text = serde_json::to_string(&b).unwrap().into_bytes();
        let at = (text.len() as f64 * cut) as usize;
        let mut damaged = text[..at].to_vec();
        damaged.extend_from_slice(&junk);
        damaged.extend_from_slice(&text[at..]);
        same(&damaged)?;
    }
}

#[test]
fn agrees_on_edge_cases() {
    for s in [
        "",
        "  ",
        "[]",
        "null",
        "{",
        r#"{"messages":[]}"#,
        r#"{"messages":null}"#,
        r#"{"model":"a","model":"b","messages":[]}"#,
        r#"{"mod\u0065l":"x","messages":[]}"#,
        r#"{"messages":[{"role":"user","role":"user"}]}"#,
        r#"{"messages":[{"role":"user","content":"\ud800"}]}"#,
        r#"{"messages":[{"role":"user","content":"\ud83d\ude00 \u00e9 \/ \\u"}]}"#,
        r#"{"messages":[{"role":"user","content":"a"}],"session_params":{"session_id":12,"x":"\udc00"}}"#,
        r#"{"messages":[{"role":"user","content":"a"}],"session_params":{"session_id":1e2}}"#,
        r#"{"messages":[{"role":"user","content":"a"}],"session_params":{"session_id":"s","session_id":""}}"#,
        r#"{"messages":[{"role":"user","content":[{"type":"text","text":"a","text":"b"}]}]}"#,
        r#"{"messages":[{"role":"user","content":"x"}],"tools":[{"b":-0,"a":1.50,"c":1E400}]}"#,
        r#"{"messages":[{"role":"user","content":"x"}],"tools":[{"b":-0,"a":1.50,"c":123456789012345678901234}]}"#,
        r#"{"prompt":[1,2,4294967296]}"#,
        r#"{"prompt":[[1,2],"x"]}"#,
        r#"{"prompt":[1.0]}"#,
        r#"{"input":[{"type":null,"content":"x"}]}"#,
        r#"{"messages":[{"role":"user","content":"x"}]} x"#,
        "{\"messages\":[{\"role\":\"user\",\"content\":\"a\tb\"}]}",
    ] {
        same(s.as_bytes()).unwrap();
    }
}

/// The deepest body the reader accepts, canonicalized on a small stack: nesting cannot
/// overflow a request task's stack.
#[test]
fn deep_nesting_fits_a_small_stack() {
    let depth = 126;
    let tools = "[".repeat(depth) + &"]".repeat(depth);
    let body = format!(r#"{{"messages":[{{"role":"user","content":"x"}}],"tools":{tools}}}"#);
    let deeper = format!(
        r#"{{"messages":[],"tools":{}{}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(move || {
            assert!(canonicalize_json(Endpoint::Chat, body.as_bytes()).is_ok());
            assert!(canonicalize_json(Endpoint::Chat, deeper.as_bytes()).is_err());
        })
        .unwrap()
        .join()
        .unwrap();
}
