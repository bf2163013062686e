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

use serde_json::{Map, Value};

/// Bumped whenever the canonical byte layout changes.
pub const FORMAT_VERSION: u32 = 1;

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

/// Why a body cannot be routed. Each maps to an HTTP 400 with this text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CanonError {
    /// The body is not a JSON object.
    #[error("request body must be a JSON object")]
    NotAnObject,
    /// A field has the wrong JSON type.
    #[error("'{field}' must be {expected}")]
    WrongType {
        /// Dotted path of the field.
        field: String,
        /// What was expected, in words.
        expected: &'static str,
    },
    /// A required field is absent.
    #[error("'{0}' is required")]
    Missing(&'static str),
}

fn wrong(field: impl Into<String>, expected: &'static str) -> CanonError {
    CanonError::WrongType {
        field: field.into(),
        expected,
    }
}

/// Record tags. Stable: part of the fingerprint format.
mod tag {
    pub const SYSTEM: u8 = b'S';
    pub const FIELD: u8 = b'F';
    pub const ROLE: u8 = b'r';
    pub const NAME: u8 = b'n';
    pub const TEXT: u8 = b't';
    pub const PART: u8 = b'p';
    pub const TOOL_CALL: u8 = b'k';
    pub const TOOL_CALL_ID: u8 = b'i';
    pub const REASONING: u8 = b'z';
    pub const END: u8 = b'e';
    pub const PROMPT: u8 = b'P';
    pub const TOKENS: u8 = b'K';
}

/// Chat fields that the chat template renders into the prompt (tools go into the system
/// turn; `reasoning_effort` is rendered by some templates). Sampling and output-shaping
/// fields (`tool_choice`, `response_format`, `temperature`, ...) are left out on purpose: a
/// client may change them between turns without changing the cached prefix.
const CHAT_PROMPT_FIELDS: &[&str] = &[
    "tools",
    "functions",
    "documents",
    "chat_template",
    "chat_template_kwargs",
    "reasoning_effort",
];

struct Writer {
    out: Vec<u8>,
}

impl Writer {
    fn record(&mut self, tag: u8, bytes: &[u8]) {
        self.out.push(tag);
        // Lengths above 4 GiB cannot occur: bodies are limited far below that.
        self.out
            .extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        self.out.extend_from_slice(bytes);
    }

    fn str(&mut self, tag: u8, s: &str) {
        self.record(tag, s.as_bytes());
    }

    /// Canonical JSON: serde_json's default map is ordered by key and its writer is
    /// compact, so any key order, whitespace or escaping of the input gives one output.
    fn json(&mut self, tag: u8, v: &Value) {
        let s = serde_json::to_vec(v).unwrap_or_default();
        self.record(tag, &s);
    }

    fn field(&mut self, name: &str, v: &Value) {
        let mut s = Vec::with_capacity(name.len() + 16);
        s.extend_from_slice(name.as_bytes());
        s.push(0);
        s.extend_from_slice(&serde_json::to_vec(v).unwrap_or_default());
        self.record(tag::FIELD, &s);
    }
}

/// Produces the canonical prompt of a request body.
pub fn canonicalize(endpoint: Endpoint, body: &Value) -> Result<CanonicalPrompt, CanonError> {
    let obj = body.as_object().ok_or(CanonError::NotAnObject)?;
    let model = match obj.get("model") {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) => String::new(),
        Some(_) => return Err(wrong("model", "a string")),
    };
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(wrong("stream", "a boolean")),
    };
    let session_id = session_id(obj)?;
    let mut w = Writer {
        out: Vec::with_capacity(4096),
    };
    match endpoint {
        Endpoint::Chat => chat(obj, &mut w)?,
        Endpoint::Completions => completions(obj, &mut w)?,
        Endpoint::Responses => responses(obj, &mut w)?,
        Endpoint::Messages => messages(obj, &mut w)?,
    }
    Ok(CanonicalPrompt {
        model,
        bytes: w.out,
        session_id,
        stream,
    })
}

fn session_id(obj: &Map<String, Value>) -> Result<Option<String>, CanonError> {
    match obj.get("session_params") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(p)) => match p.get("session_id") {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
            Some(Value::String(_)) => Ok(None),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(_) => Err(wrong("session_params.session_id", "a string")),
        },
        Some(_) => Err(wrong("session_params", "an object")),
    }
}

fn is_system_role(role: &str) -> bool {
    role == "system" || role == "developer"
}

fn chat(obj: &Map<String, Value>, w: &mut Writer) -> Result<(), CanonError> {
    let msgs = match obj.get("messages") {
        Some(Value::Array(a)) => a,
        Some(_) => return Err(wrong("messages", "an array")),
        None => return Err(CanonError::Missing("messages")),
    };
    for (i, m) in msgs.iter().enumerate() {
        if !m.is_object() {
            return Err(wrong(format!("messages[{i}]"), "an object"));
        }
        match m.get("role") {
            Some(Value::String(_)) => {}
            Some(_) => return Err(wrong(format!("messages[{i}].role"), "a string")),
            None => return Err(CanonError::Missing("messages[].role")),
        }
    }
    let role = |m: &Value| {
        m.get("role")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    // Leading system/developer turns are rendered first by every template; a system turn in
    // the middle stays where it is.
    let lead = msgs.iter().take_while(|m| is_system_role(&role(m))).count();
    for (i, m) in msgs[..lead].iter().enumerate() {
        chat_message(i, m, w)?;
    }
    for f in CHAT_PROMPT_FIELDS {
        if let Some(v) = obj.get(*f) {
            if !v.is_null() {
                w.field(f, v);
            }
        }
    }
    for (i, m) in msgs.iter().enumerate().skip(lead) {
        chat_message(i, m, w)?;
    }
    Ok(())
}

fn chat_message(i: usize, m: &Value, w: &mut Writer) -> Result<(), CanonError> {
    let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
    w.str(tag::ROLE, role);
    match m.get("name") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => w.str(tag::NAME, s),
        Some(_) => return Err(wrong(format!("messages[{i}].name"), "a string")),
    }
    content(&format!("messages[{i}].content"), m.get("content"), w)?;
    for key in ["reasoning_content", "reasoning", "thinking"] {
        match m.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => w.str(tag::REASONING, s),
            Some(v) => w.json(tag::REASONING, v),
        }
    }
    match m.get("tool_calls") {
        None | Some(Value::Null) => {}
        Some(Value::Array(calls)) => {
            for (j, c) in calls.iter().enumerate() {
                if !c.is_object() {
                    return Err(wrong(format!("messages[{i}].tool_calls[{j}]"), "an object"));
                }
                w.json(tag::TOOL_CALL, c);
            }
        }
        Some(_) => return Err(wrong(format!("messages[{i}].tool_calls"), "an array")),
    }
    if let Some(fc) = m.get("function_call").filter(|v| !v.is_null()) {
        w.json(tag::TOOL_CALL, fc);
    }
    match m.get("tool_call_id") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => w.str(tag::TOOL_CALL_ID, s),
        Some(_) => return Err(wrong(format!("messages[{i}].tool_call_id"), "a string")),
    }
    w.record(tag::END, &[]);
    Ok(())
}

/// Message content: a string, null, or a list of parts. Text parts become text records, so
/// `"hi"` and `[{"type":"text","text":"hi"}]` are the same prompt; other parts (images,
/// audio, files) are kept as canonical JSON.
fn content(field: &str, v: Option<&Value>, w: &mut Writer) -> Result<(), CanonError> {
    match v {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(s)) => {
            w.str(tag::TEXT, s);
            Ok(())
        }
        Some(Value::Array(parts)) => {
            for (j, p) in parts.iter().enumerate() {
                match p {
                    Value::String(s) => w.str(tag::TEXT, s),
                    Value::Object(o) => {
                        let ty = o.get("type").and_then(Value::as_str).unwrap_or_default();
                        match (ty, o.get("text")) {
                            (
                                "text" | "input_text" | "output_text" | "",
                                Some(Value::String(s)),
                            ) => w.str(tag::TEXT, s),
                            ("text" | "input_text" | "output_text", Some(_)) => {
                                return Err(wrong(format!("{field}[{j}].text"), "a string"))
                            }
                            _ => part(o, w),
                        }
                    }
                    _ => return Err(wrong(format!("{field}[{j}]"), "an object")),
                }
            }
            Ok(())
        }
        Some(_) => Err(wrong(field, "a string, an array or null")),
    }
}

/// A non-text part; Anthropic's `cache_control` markers do not change the prompt.
fn part(o: &Map<String, Value>, w: &mut Writer) {
    if o.contains_key("cache_control") {
        let mut o = o.clone();
        o.remove("cache_control");
        w.json(tag::PART, &Value::Object(o));
    } else {
        w.json(tag::PART, &Value::Object(o.clone()));
    }
}

fn completions(obj: &Map<String, Value>, w: &mut Writer) -> Result<(), CanonError> {
    let prompt = obj.get("prompt").ok_or(CanonError::Missing("prompt"))?;
    completion_prompt("prompt", prompt, w, true)
}

/// A prompt is a string, a list of token ids, or a batch of either; a batch is routed by
/// its first prompt (they usually share the prefix that matters).
fn completion_prompt(
    field: &str,
    prompt: &Value,
    w: &mut Writer,
    allow_batch: bool,
) -> Result<(), CanonError> {
    match prompt {
        Value::String(s) => {
            w.str(tag::PROMPT, s);
            Ok(())
        }
        Value::Array(items) if items.is_empty() => Err(wrong(field, "a non-empty prompt")),
        Value::Array(items) if items.iter().all(Value::is_number) => {
            let mut bytes = Vec::with_capacity(items.len() * 4);
            for (j, t) in items.iter().enumerate() {
                let id = t
                    .as_u64()
                    .filter(|id| *id <= u64::from(u32::MAX))
                    .ok_or_else(|| wrong(format!("{field}[{j}]"), "a token id (u32)"))?;
                bytes.extend_from_slice(&(id as u32).to_le_bytes());
            }
            w.record(tag::TOKENS, &bytes);
            Ok(())
        }
        Value::Array(items) if allow_batch => {
            for (j, item) in items.iter().enumerate() {
                if !(item.is_string() || item.is_array()) {
                    return Err(wrong(format!("{field}[{j}]"), "a string or token list"));
                }
            }
            completion_prompt(&format!("{field}[0]"), &items[0], w, false)
        }
        _ => Err(wrong(
            field,
            "a string, a list of strings, or a list of token ids",
        )),
    }
}

fn responses(obj: &Map<String, Value>, w: &mut Writer) -> Result<(), CanonError> {
    match obj.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => w.str(tag::SYSTEM, s),
        Some(_) => return Err(wrong("instructions", "a string")),
    }
    for f in ["tools", "previous_response_id", "reasoning"] {
        if let Some(v) = obj.get(f).filter(|v| !v.is_null()) {
            w.field(f, v);
        }
    }
    match obj.get("input") {
        None => Err(CanonError::Missing("input")),
        Some(Value::String(s)) => {
            w.str(tag::ROLE, "user");
            w.str(tag::TEXT, s);
            w.record(tag::END, &[]);
            Ok(())
        }
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let field = format!("input[{i}]");
                let o = item.as_object().ok_or_else(|| wrong(&field, "an object"))?;
                let ty = o.get("type").and_then(Value::as_str).unwrap_or("message");
                match ty {
                    "message" => {
                        let role = match o.get("role") {
                            Some(Value::String(r)) => r.as_str(),
                            None => "user",
                            Some(_) => return Err(wrong(format!("{field}.role"), "a string")),
                        };
                        w.str(tag::ROLE, role);
                        content(&format!("{field}.content"), o.get("content"), w)?;
                    }
                    "function_call_output" => {
                        w.str(tag::ROLE, "tool");
                        if let Some(Value::String(id)) = o.get("call_id") {
                            w.str(tag::TOOL_CALL_ID, id);
                        }
                        match o.get("output") {
                            Some(Value::String(s)) => w.str(tag::TEXT, s),
                            Some(v) => w.json(tag::PART, v),
                            None => {}
                        }
                    }
                    "reasoning" => {
                        w.str(tag::ROLE, "assistant");
                        w.json(tag::REASONING, item);
                    }
                    _ => {
                        // function_call and other items: kept whole, minus volatile ids.
                        let mut o = o.clone();
                        o.remove("id");
                        o.remove("status");
                        w.str(tag::ROLE, "assistant");
                        w.json(tag::TOOL_CALL, &Value::Object(o));
                    }
                }
                w.record(tag::END, &[]);
            }
            Ok(())
        }
        Some(_) => Err(wrong("input", "a string or an array")),
    }
}

fn messages(obj: &Map<String, Value>, w: &mut Writer) -> Result<(), CanonError> {
    match obj.get("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => w.str(tag::SYSTEM, s),
        Some(Value::Array(_)) => {
            w.str(tag::ROLE, "system");
            content("system", obj.get("system"), w)?;
            w.record(tag::END, &[]);
        }
        Some(_) => return Err(wrong("system", "a string or an array")),
    }
    if let Some(tools) = obj.get("tools").filter(|v| !v.is_null()) {
        let Value::Array(list) = tools else {
            return Err(wrong("tools", "an array"));
        };
        // cache_control marks where the client wants a cache breakpoint; not prompt text.
        let stripped: Vec<Value> = list
            .iter()
            .map(|t| match t {
                Value::Object(o) if o.contains_key("cache_control") => {
                    let mut o = o.clone();
                    o.remove("cache_control");
                    Value::Object(o)
                }
                other => other.clone(),
            })
            .collect();
        w.field("tools", &Value::Array(stripped));
    }
    let msgs = match obj.get("messages") {
        Some(Value::Array(a)) => a,
        Some(_) => return Err(wrong("messages", "an array")),
        None => return Err(CanonError::Missing("messages")),
    };
    for (i, m) in msgs.iter().enumerate() {
        let o = m
            .as_object()
            .ok_or_else(|| wrong(format!("messages[{i}]"), "an object"))?;
        match o.get("role") {
            Some(Value::String(r)) => w.str(tag::ROLE, r),
            Some(_) => return Err(wrong(format!("messages[{i}].role"), "a string")),
            None => return Err(CanonError::Missing("messages[].role")),
        }
        let field = format!("messages[{i}].content");
        match o.get("content") {
            Some(Value::Array(blocks)) => {
                for (j, b) in blocks.iter().enumerate() {
                    let bo = b
                        .as_object()
                        .ok_or_else(|| wrong(format!("{field}[{j}]"), "an object"))?;
                    let ty = bo.get("type").and_then(Value::as_str).unwrap_or_default();
                    match ty {
                        "text" => match bo.get("text") {
                            Some(Value::String(s)) => w.str(tag::TEXT, s),
                            _ => return Err(wrong(format!("{field}[{j}].text"), "a string")),
                        },
                        "thinking" => match bo.get("thinking") {
                            Some(Value::String(s)) => w.str(tag::REASONING, s),
                            _ => part(bo, w),
                        },
                        "tool_use" => part(bo, w),
                        "tool_result" => {
                            if let Some(Value::String(id)) = bo.get("tool_use_id") {
                                w.str(tag::TOOL_CALL_ID, id);
                            }
                            content(&format!("{field}[{j}].content"), bo.get("content"), w)?;
                        }
                        _ => part(bo, w),
                    }
                }
            }
            other => content(&field, other, w)?,
        }
        w.record(tag::END, &[]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canon(ep: Endpoint, s: &str) -> Vec<u8> {
        canonicalize(ep, &serde_json::from_str(s).unwrap())
            .unwrap()
            .bytes
    }

    #[test]
    fn key_order_whitespace_and_escaping_do_not_matter() {
        let a = r#"{"model":"m","messages":[{"role":"user","content":"h\u00e9llo"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"a":1,"b":2}}}]}"#;
        let b = "{ \"tools\" : [ { \"function\" : { \"parameters\" : {\"b\":2,\"a\":1}, \"name\":\"f\"}, \"type\":\"function\" } ],\n \"messages\":[{\"content\":\"héllo\",\"role\":\"user\"}], \"model\":\"m\" }";
        assert_eq!(canon(Endpoint::Chat, a), canon(Endpoint::Chat, b));
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
