//! Canonical prompt bytes.
//!
//! Two requests that an engine would render to the same prompt prefix must produce the same
//! canonical bytes, whatever their JSON key order, whitespace, string escaping or sampling
//! fields. The encoding is a flat sequence of records `tag (1 byte) | len (u32 LE) | bytes`,
//! in prompt order: system/developer text first, then prompt-shaping fields (tools, ...),
//! then the conversation. Because a conversation only grows at its end, every turn's bytes
//! extend the previous turn's bytes, which is what chained fingerprints need.
//!
//! The format is versioned through [`FORMAT_VERSION`] in the fingerprint seed: changing
//! anything here must bump it (golden vectors in the tests catch accidental changes).

mod chat;
mod completions;
mod content;
mod fields;
mod format;
mod messages;
mod responses;

pub use chat::CHAT_PROMPT_FIELDS;
pub(crate) use format::Sink;
pub use format::{CanonError, FORMAT_VERSION};

use crate::json::{Doc, Kind, ParseError, Val};
use fields::{str_of, Body, BODY_FIELDS};
use format::{invalid, wrong, Writer};
use serde_json::Value;

/// Which API shape the body follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// OpenAI `/v1/chat/completions`.
    Chat,
    /// OpenAI `/v1/completions`.
    Completions,
    /// OpenAI `/v1/responses`.
    Responses,
    /// Anthropic `/v1/messages`.
    Messages,
}

impl Endpoint {
    /// Maps a request path to the endpoint whose prompt the router understands.
    pub fn from_path(path: &str) -> Option<Endpoint> {
        match path {
            "/v1/chat/completions" => Some(Endpoint::Chat),
            "/v1/completions" => Some(Endpoint::Completions),
            "/v1/responses" => Some(Endpoint::Responses),
            "/v1/messages" => Some(Endpoint::Messages),
            _ => None,
        }
    }

    /// A short stable label for metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat_completions",
            Endpoint::Completions => "completions",
            Endpoint::Responses => "responses",
            Endpoint::Messages => "messages",
        }
    }
}

/// The part of a request that decides where its KV cache lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalPrompt {
    /// Model name, part of the fingerprint seed (different models never share a cache).
    pub model: String,
    /// Canonical bytes of the prompt.
    pub bytes: Vec<u8>,
    /// `session_params.session_id` from the body, when present.
    pub session_id: Option<String>,
    /// Whether the client asked for a streamed response.
    pub stream: bool,
}

/// Produces the canonical prompt of a parsed body (re-serializes it; tests and tools).
pub fn canonicalize(endpoint: Endpoint, body: &Value) -> Result<CanonicalPrompt, CanonError> {
    canonicalize_json(endpoint, &serde_json::to_vec(body).unwrap_or_default())
}

/// Produces the canonical prompt straight from the request bytes: one validating pass over
/// the body, then the prompt's records copied out in prompt order.
pub fn canonicalize_json(endpoint: Endpoint, body: &[u8]) -> Result<CanonicalPrompt, CanonError> {
    let (head, bytes) = canonical(endpoint, body, |_| Vec::with_capacity(body.len()))?;
    Ok(CanonicalPrompt {
        model: head.model,
        bytes,
        session_id: head.session_id,
        stream: head.stream,
    })
}

pub(crate) struct Head {
    pub(crate) model: String,
    pub(crate) session_id: Option<String>,
    pub(crate) stream: bool,
}

/// Validates `body` and writes its prompt's records, in prompt order, into the sink that
/// `sink` makes for the body's model.
pub(crate) fn canonical<S: Sink>(
    endpoint: Endpoint,
    body: &[u8],
    sink: impl FnOnce(&str) -> S,
) -> Result<(Head, S), CanonError> {
    let doc = Doc::parse_members(body, &BODY_FIELDS).map_err(|e| match e {
        ParseError::TooManyValues { limit } => CanonError::TooManyValues { limit },
        _ if body.iter().all(u8::is_ascii_whitespace) => CanonError::Json("empty body".into()),
        ParseError::Syntax { .. } => CanonError::Json(e.to_string()),
    })?;
    let root = doc.root();
    if root.kind() != Kind::Obj {
        return Err(CanonError::NotAnObject);
    }
    let b = Body::read(root)?;
    let model = match b.model {
        None => String::new(),
        Some(r) => str_of(r, &|| "model".to_owned())?.into_owned(),
    };
    let stream = match b.stream {
        None => false,
        Some(r) if r.kind() == Kind::Bool => r.raw() == b"true",
        Some(_) => return Err(wrong("stream", "a boolean")),
    };
    let session_id = session_id(b.session_params)?;
    let mut w = Writer {
        sink: sink(&model),
        scratch: Vec::new(),
    };
    match endpoint {
        Endpoint::Chat => chat::write(&b, &mut w)?,
        Endpoint::Completions => completions::write(&b, &mut w)?,
        Endpoint::Responses => responses::write(&b, &mut w)?,
        Endpoint::Messages => messages::write(&b, &mut w)?,
    }
    Ok((
        Head {
            model,
            session_id,
            stream,
        },
        w.sink,
    ))
}

fn session_id(p: Option<Val<'_>>) -> Result<Option<String>, CanonError> {
    let Some(p) = p else {
        return Ok(None);
    };
    if p.kind() != Kind::Obj {
        return Err(wrong("session_params", "an object"));
    }
    // The whole object must be well-formed text, not just the member read.
    p.write_json(&mut Vec::new(), &[])
        .map_err(|e| invalid("session_params".into(), e))?;
    let Some((_, v)) = p.members().filter(|(k, _)| k.key_is("session_id")).last() else {
        return Ok(None);
    };
    match v.kind() {
        Kind::Null => Ok(None),
        Kind::Str => {
            let s = str_of(v, &|| "session_params.session_id".to_owned())?;
            Ok((!s.is_empty()).then(|| s.into_owned()))
        }
        Kind::Num => {
            let mut n = Vec::new();
            v.write_json(&mut n, &[])
                .map_err(|e| invalid("session_params.session_id".into(), e))?;
            Ok(Some(String::from_utf8_lossy(&n).into_owned()))
        }
        _ => Err(wrong("session_params.session_id", "a string")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Straight from the text, as the request path does.
    fn canon(ep: Endpoint, s: &str) -> Vec<u8> {
        canonicalize_json(ep, s.as_bytes()).unwrap().bytes
    }

    #[test]
    fn key_order_whitespace_and_escaping_do_not_matter() {
        let a = r#"{"model":"m","messages":[{"role":"user","content":"h\u00e9llo"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"a":1,"b":2}}}]}"#;
        let b = "{ \"tools\" : [ { \"function\" : { \"parameters\" : {\"b\":2,\"a\":1}, \"name\":\"f\"}, \"type\":\"function\" } ],\n \"messages\":[{\"content\":\"héllo\",\"role\":\"user\"}], \"model\":\"m\" }";
        assert_eq!(canon(Endpoint::Chat, a), canon(Endpoint::Chat, b));
    }

    #[test]
    fn escapes_are_normalized() {
        let a = canon(
            Endpoint::Chat,
            r#"{"messages":[{"role":"user","content":"a\/b \u0041 \n \"q\" \\u"}]}"#,
        );
        let b = canon(
            Endpoint::Chat,
            r#"{"messages":[{"role":"user","content":"a/b A \n \"q\" \\u"}]}"#,
        );
        assert_eq!(a, b);
        let c = canon(
            Endpoint::Chat,
            r#"{"messages":[{"role":"user","content":"a/b A \u000a \"q\" \\u"}]}"#,
        );
        assert_eq!(a, c);
    }

    #[test]
    fn sampling_fields_do_not_matter() {
        let a = json!({"model":"m","messages":[{"role":"user","content":"x"}]});
        let b = json!({"model":"m","messages":[{"role":"user","content":"x"}],
            "temperature":0.3,"max_tokens":9,"stream":true,"user":"u","tool_choice":"auto",
            "stream_options":{"include_usage":true},"seed":4,"top_p":0.5});
        assert_eq!(
            canonicalize(Endpoint::Chat, &a).unwrap().bytes,
            canonicalize(Endpoint::Chat, &b).unwrap().bytes
        );
    }

    #[test]
    fn string_content_equals_text_parts() {
        let a = json!({"messages":[{"role":"user","content":"hi"}]});
        let b = json!({"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]});
        assert_eq!(
            canonicalize(Endpoint::Chat, &a).unwrap().bytes,
            canonicalize(Endpoint::Chat, &b).unwrap().bytes
        );
    }

    #[test]
    fn next_turn_extends_previous_turn() {
        let t1 = json!({"messages":[{"role":"system","content":"sys"},{"role":"user","content":"q1"}],
            "tools":[{"type":"function","function":{"name":"ls"}}]});
        let t2 = json!({"messages":[{"role":"system","content":"sys"},{"role":"user","content":"q1"},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"ls","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"c1","content":"a b c"}],
            "tools":[{"type":"function","function":{"name":"ls"}}]});
        let a = canonicalize(Endpoint::Chat, &t1).unwrap().bytes;
        let b = canonicalize(Endpoint::Chat, &t2).unwrap().bytes;
        assert!(b.starts_with(&a));
        assert!(b.len() > a.len());
    }

    #[test]
    fn system_then_tools_then_messages() {
        // A system message placed after tools in JSON still comes first.
        let a = json!({"tools":[1],"messages":[{"role":"developer","content":"d"},{"role":"user","content":"u"}]});
        let bytes = canonicalize(Endpoint::Chat, &a).unwrap().bytes;
        let d = bytes.windows(1).position(|x| x == b"d").unwrap();
        let t = bytes.windows(5).position(|x| x == b"tools").unwrap();
        let u = bytes.windows(1).rposition(|x| x == b"u").unwrap();
        assert!(d < t && t < u);
    }

    #[test]
    fn fields_are_distinguished() {
        let a = json!({"messages":[{"role":"user","content":"ab"}]});
        let b = json!({"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]});
        let c = json!({"messages":[{"role":"assistant","content":"ab"}]});
        let ca = canonicalize(Endpoint::Chat, &a).unwrap().bytes;
        assert_ne!(ca, canonicalize(Endpoint::Chat, &b).unwrap().bytes);
        assert_ne!(ca, canonicalize(Endpoint::Chat, &c).unwrap().bytes);
    }

    #[test]
    fn reasoning_and_tool_ids_count() {
        let a =
            json!({"messages":[{"role":"assistant","content":"x","reasoning_content":"think"}]});
        let b = json!({"messages":[{"role":"assistant","content":"x"}]});
        assert_ne!(
            canonicalize(Endpoint::Chat, &a).unwrap().bytes,
            canonicalize(Endpoint::Chat, &b).unwrap().bytes
        );
    }

    #[test]
    fn completions_forms() {
        let s = canon(Endpoint::Completions, r#"{"prompt":"hello"}"#);
        let l = canon(Endpoint::Completions, r#"{"prompt":["hello","world"]}"#);
        assert_eq!(s, l);
        let t = canon(Endpoint::Completions, r#"{"prompt":[1,2,3]}"#);
        let tl = canon(Endpoint::Completions, r#"{"prompt":[[1,2,3],[4]]}"#);
        assert_eq!(t, tl);
        assert_ne!(s, t);
        assert!(canonicalize(Endpoint::Completions, &json!({"prompt":[-1]})).is_err());
        assert!(canonicalize(Endpoint::Completions, &json!({"prompt":5})).is_err());
        assert!(canonicalize(Endpoint::Completions, &json!({})).is_err());
    }

    #[test]
    fn responses_and_messages() {
        let r1 = canon(
            Endpoint::Responses,
            r#"{"instructions":"be brief","input":"hello","temperature":1}"#,
        );
        let r2 = canon(
            Endpoint::Responses,
            r#"{"input":[{"role":"user","content":[{"type":"input_text","text":"hello"}]}],"instructions":"be brief"}"#,
        );
        assert_eq!(r1, r2);
        let m1 = canon(
            Endpoint::Messages,
            r#"{"system":"s","messages":[{"role":"user","content":"hi"}],"max_tokens":5}"#,
        );
        let m2 = canon(
            Endpoint::Messages,
            r#"{"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}],"system":"s"}"#,
        );
        assert_eq!(m1, m2);
    }

    #[test]
    fn wrong_types_are_errors() {
        for (ep, body) in [
            (Endpoint::Chat, json!([])),
            (Endpoint::Chat, json!({"messages":"x"})),
            (Endpoint::Chat, json!({"messages":[1]})),
            (Endpoint::Chat, json!({"messages":[{"role":1}]})),
            (
                Endpoint::Chat,
                json!({"messages":[{"role":"user","content":5}]}),
            ),
            (Endpoint::Chat, json!({"model":5,"messages":[]})),
            (Endpoint::Chat, json!({"stream":"yes","messages":[]})),
            (Endpoint::Chat, json!({})),
            (
                Endpoint::Messages,
                json!({"messages":[{"role":"user","content":[{"type":"text","text":3}]}]}),
            ),
            (Endpoint::Responses, json!({"input":7})),
        ] {
            assert!(canonicalize(ep, &body).is_err(), "{body}");
        }
    }

    #[test]
    fn session_id_from_body() {
        let b = json!({"messages":[],"session_params":{"session_id":"abc"}});
        assert_eq!(
            canonicalize(Endpoint::Chat, &b)
                .unwrap()
                .session_id
                .as_deref(),
            Some("abc")
        );
    }
}
