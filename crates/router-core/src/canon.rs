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

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use std::borrow::Cow;

/// Bumped whenever the canonical byte layout changes.
pub const FORMAT_VERSION: u32 = 2;

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
    /// The body is not JSON at all.
    #[error("request body is not valid JSON: {0}")]
    Json(String),
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
    /// A field's structure does not parse.
    #[error("'{field}' is invalid: {message}")]
    Invalid {
        /// Dotted path of the field.
        field: String,
        /// The parser's words.
        message: String,
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
pub const CHAT_PROMPT_FIELDS: &[&str] = &[
    "tools",
    "functions",
    "documents",
    "chat_template",
    "chat_template_kwargs",
    "reasoning_effort",
];

type Raw<'a> = &'a RawValue;

/// Every field any endpoint needs, parsed in one pass over the body. Big strings stay as
/// borrowed raw JSON: the request path never copies or unescapes a 150 KB prompt.
#[derive(Deserialize)]
struct Body<'a> {
    #[serde(borrow, default)]
    model: Option<Raw<'a>>,
    #[serde(borrow, default)]
    stream: Option<Raw<'a>>,
    #[serde(borrow, default)]
    session_params: Option<Raw<'a>>,
    #[serde(borrow, default)]
    messages: Option<Vec<Msg<'a>>>,
    #[serde(borrow, default)]
    tools: Option<Raw<'a>>,
    #[serde(borrow, default)]
    functions: Option<Raw<'a>>,
    #[serde(borrow, default)]
    documents: Option<Raw<'a>>,
    #[serde(borrow, default)]
    chat_template: Option<Raw<'a>>,
    #[serde(borrow, default)]
    chat_template_kwargs: Option<Raw<'a>>,
    #[serde(borrow, default)]
    reasoning_effort: Option<Raw<'a>>,
    #[serde(borrow, default)]
    prompt: Option<Raw<'a>>,
    #[serde(borrow, default)]
    instructions: Option<Raw<'a>>,
    #[serde(borrow, default)]
    input: Option<Raw<'a>>,
    #[serde(borrow, default)]
    previous_response_id: Option<Raw<'a>>,
    #[serde(borrow, default)]
    reasoning: Option<Raw<'a>>,
    #[serde(borrow, default)]
    system: Option<Raw<'a>>,
}

impl<'a> Body<'a> {
    fn chat_field(&self, name: &str) -> Option<Raw<'a>> {
        match name {
            "tools" => self.tools,
            "functions" => self.functions,
            "documents" => self.documents,
            "chat_template" => self.chat_template,
            "chat_template_kwargs" => self.chat_template_kwargs,
            "reasoning_effort" => self.reasoning_effort,
            _ => None,
        }
    }
}

/// One chat message (also Anthropic messages and Responses message items).
#[derive(Deserialize)]
struct Msg<'a> {
    #[serde(borrow, default)]
    role: Option<Raw<'a>>,
    #[serde(borrow, default)]
    name: Option<Raw<'a>>,
    #[serde(borrow, default)]
    content: Option<Raw<'a>>,
    #[serde(borrow, default)]
    reasoning_content: Option<Raw<'a>>,
    #[serde(borrow, default)]
    reasoning: Option<Raw<'a>>,
    #[serde(borrow, default)]
    thinking: Option<Raw<'a>>,
    #[serde(borrow, default)]
    tool_calls: Option<Raw<'a>>,
    #[serde(borrow, default)]
    function_call: Option<Raw<'a>>,
    #[serde(borrow, default)]
    tool_call_id: Option<Raw<'a>>,
}

/// A content part or block: its type, its text, and the raw whole for other kinds.
#[derive(Deserialize)]
struct Part<'a> {
    #[serde(rename = "type", borrow, default)]
    ty: Option<Raw<'a>>,
    #[serde(borrow, default)]
    text: Option<Raw<'a>>,
    #[serde(borrow, default)]
    thinking: Option<Raw<'a>>,
    #[serde(borrow, default)]
    tool_use_id: Option<Raw<'a>>,
    #[serde(borrow, default)]
    content: Option<Raw<'a>>,
    #[serde(borrow, default)]
    call_id: Option<Raw<'a>>,
    #[serde(borrow, default)]
    output: Option<Raw<'a>>,
    #[serde(borrow, default)]
    role: Option<Raw<'a>>,
}

fn first_byte(r: Raw<'_>) -> u8 {
    r.get().as_bytes().first().copied().unwrap_or(b' ')
}

/// Decodes a small raw value into `T`, naming `field` in the error.
fn small<'a, T: Deserialize<'a>>(r: Raw<'a>, field: &str) -> Result<T, CanonError> {
    serde_json::from_str(r.get()).map_err(|e| CanonError::Invalid {
        field: field.to_owned(),
        message: e.to_string(),
    })
}

fn small_str(r: Raw<'_>, field: &str) -> Result<String, CanonError> {
    if first_byte(r) != b'"' {
        return Err(wrong(field, "a string"));
    }
    small::<String>(r, field)
}

/// The canonical form of a JSON string value: its content as serde_json would escape it.
/// The common escapes (`\n \t \" \\ ...`) are already in that form, so the raw bytes are
/// used as they are; only `\uXXXX` and `\/` need decoding and re-escaping.
fn text_of<'a>(r: Raw<'a>, field: &str) -> Result<Cow<'a, [u8]>, CanonError> {
    let raw = r.get().as_bytes();
    if raw.len() < 2 || raw[0] != b'"' {
        return Err(wrong(field, "a string"));
    }
    let inner = &raw[1..raw.len() - 1];
    // An escaped backslash followed by `u` or `/` also takes the slow path; decoding keeps
    // it as it is, so the result is the same.
    let needs_decoding = memchr::memmem::find(inner, b"\\u").is_some()
        || memchr::memmem::find(inner, b"\\/").is_some();
    if !needs_decoding {
        return Ok(Cow::Borrowed(inner));
    }
    let s: String = small(r, field)?;
    let e = serde_json::to_string(&s).unwrap_or_default();
    Ok(Cow::Owned(e.as_bytes()[1..e.len() - 1].to_vec()))
}

/// Canonical JSON of a raw value: serde_json's map is ordered by key and its writer is
/// compact, so key order, whitespace and escaping of the input do not matter.
fn json_of(r: Raw<'_>, field: &str) -> Result<Vec<u8>, CanonError> {
    let v: Value = small(r, field)?;
    Ok(serde_json::to_vec(&v).unwrap_or_default())
}

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

    fn text(&mut self, tag: u8, r: Raw<'_>, field: &str) -> Result<(), CanonError> {
        let t = text_of(r, field)?;
        self.record(tag, &t);
        Ok(())
    }

    fn json(&mut self, tag: u8, r: Raw<'_>, field: &str) -> Result<(), CanonError> {
        let j = json_of(r, field)?;
        self.record(tag, &j);
        Ok(())
    }

    fn field(&mut self, name: &str, r: Raw<'_>) -> Result<(), CanonError> {
        let j = json_of(r, name)?;
        let mut s = Vec::with_capacity(name.len() + 1 + j.len());
        s.extend_from_slice(name.as_bytes());
        s.push(0);
        s.extend_from_slice(&j);
        self.record(tag::FIELD, &s);
        Ok(())
    }

    fn end(&mut self) {
        self.record(tag::END, &[]);
    }
}

/// Produces the canonical prompt of a parsed body (re-serializes it; tests and tools).
pub fn canonicalize(endpoint: Endpoint, body: &Value) -> Result<CanonicalPrompt, CanonError> {
    canonicalize_json(endpoint, &serde_json::to_vec(body).unwrap_or_default())
}

/// Produces the canonical prompt straight from the request bytes, in one pass.
pub fn canonicalize_json(endpoint: Endpoint, body: &[u8]) -> Result<CanonicalPrompt, CanonError> {
    let start = body.iter().position(|b| !b.is_ascii_whitespace());
    match start.map(|i| body[i]) {
        Some(b'{') => {}
        Some(_) => {
            // Valid JSON of another type is a 400 of its own; invalid JSON says why.
            return match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
                Ok(_) => Err(CanonError::NotAnObject),
                Err(e) => Err(CanonError::Json(e.to_string())),
            };
        }
        None => return Err(CanonError::Json("empty body".into())),
    }
    let b: Body<'_> = serde_json::from_slice(body).map_err(|e| {
        if e.is_data() {
            CanonError::Invalid {
                field: "body".into(),
                message: e.to_string(),
            }
        } else {
            CanonError::Json(e.to_string())
        }
    })?;
    let model = match b.model {
        None => String::new(),
        Some(r) if r.get() == "null" => String::new(),
        Some(r) => small_str(r, "model")?,
    };
    let stream = match b.stream.map(RawValue::get) {
        None | Some("null") | Some("false") => false,
        Some("true") => true,
        Some(_) => return Err(wrong("stream", "a boolean")),
    };
    let session_id = session_id(b.session_params)?;
    let mut w = Writer {
        out: Vec::with_capacity(body.len()),
    };
    match endpoint {
        Endpoint::Chat => chat(&b, &mut w)?,
        Endpoint::Completions => completions(&b, &mut w)?,
        Endpoint::Responses => responses(&b, &mut w)?,
        Endpoint::Messages => messages(&b, &mut w)?,
    }
    Ok(CanonicalPrompt {
        model,
        bytes: w.out,
        session_id,
        stream,
    })
}

fn session_id(p: Option<Raw<'_>>) -> Result<Option<String>, CanonError> {
    let Some(p) = p.filter(|p| p.get() != "null") else {
        return Ok(None);
    };
    if first_byte(p) != b'{' {
        return Err(wrong("session_params", "an object"));
    }
    let v: Value = small(p, "session_params")?;
    match v.get("session_id") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
        Some(Value::String(_)) => Ok(None),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(_) => Err(wrong("session_params.session_id", "a string")),
    }
}

fn role_of(m: &Msg<'_>, field: &str) -> Result<String, CanonError> {
    match m.role {
        Some(r) => small_str(r, &format!("{field}.role")),
        None => Err(CanonError::Missing("messages[].role")),
    }
}

fn is_system_role(role: &str) -> bool {
    role == "system" || role == "developer"
}

fn chat(b: &Body<'_>, w: &mut Writer) -> Result<(), CanonError> {
    let raw = b.messages.as_ref().ok_or(CanonError::Missing("messages"))?;
    let mut msgs = Vec::with_capacity(raw.len());
    for (i, m) in raw.iter().enumerate() {
        let role = role_of(m, &format!("messages[{i}]"))?;
        msgs.push((role, m));
    }
    // Leading system/developer turns are rendered first by every template; a system turn in
    // the middle stays where it is.
    let lead = msgs.iter().take_while(|(r, _)| is_system_role(r)).count();
    for (i, (role, m)) in msgs[..lead].iter().enumerate() {
        chat_message(i, role, m, w)?;
    }
    for f in CHAT_PROMPT_FIELDS {
        if let Some(r) = b.chat_field(f).filter(|r| r.get() != "null") {
            w.field(f, r)?;
        }
    }
    for (i, (role, m)) in msgs.iter().enumerate().skip(lead) {
        chat_message(i, role, m, w)?;
    }
    Ok(())
}

fn chat_message(i: usize, role: &str, m: &Msg<'_>, w: &mut Writer) -> Result<(), CanonError> {
    w.record(tag::ROLE, role.as_bytes());
    if let Some(n) = m.name.filter(|n| n.get() != "null") {
        w.text(tag::NAME, n, &format!("messages[{i}].name"))?;
    }
    content(&format!("messages[{i}].content"), m.content, w)?;
    for r in [m.reasoning_content, m.reasoning, m.thinking]
        .into_iter()
        .flatten()
    {
        match first_byte(r) {
            b'n' => {}
            b'"' => w.text(tag::REASONING, r, "reasoning")?,
            _ => w.json(tag::REASONING, r, "reasoning")?,
        }
    }
    if let Some(tc) = m.tool_calls.filter(|r| r.get() != "null") {
        let calls: Vec<Raw<'_>> = if first_byte(tc) == b'[' {
            small(tc, &format!("messages[{i}].tool_calls"))?
        } else {
            return Err(wrong(format!("messages[{i}].tool_calls"), "an array"));
        };
        for (j, c) in calls.iter().enumerate() {
            if first_byte(c) != b'{' {
                return Err(wrong(format!("messages[{i}].tool_calls[{j}]"), "an object"));
            }
            w.json(tag::TOOL_CALL, c, "tool_calls")?;
        }
    }
    if let Some(fc) = m.function_call.filter(|r| r.get() != "null") {
        w.json(tag::TOOL_CALL, fc, "function_call")?;
    }
    if let Some(id) = m.tool_call_id.filter(|r| r.get() != "null") {
        w.text(
            tag::TOOL_CALL_ID,
            id,
            &format!("messages[{i}].tool_call_id"),
        )?;
    }
    w.end();
    Ok(())
}

/// Message content: a string, null, or a list of parts. Text parts become text records, so
/// `"hi"` and `[{"type":"text","text":"hi"}]` are the same prompt; other parts (images,
/// audio, files) are kept as canonical JSON, minus Anthropic's `cache_control` markers.
fn content(field: &str, v: Option<Raw<'_>>, w: &mut Writer) -> Result<(), CanonError> {
    let Some(v) = v else { return Ok(()) };
    match first_byte(v) {
        b'n' if v.get() == "null" => Ok(()),
        b'"' => w.text(tag::TEXT, v, field),
        b'[' => {
            let parts: Vec<Raw<'_>> = small(v, field)?;
            for (j, p) in parts.iter().enumerate() {
                let pf = format!("{field}[{j}]");
                match first_byte(p) {
                    b'"' => w.text(tag::TEXT, p, &pf)?,
                    b'{' => {
                        let part: Part<'_> = small(p, &pf)?;
                        let ty = match part.ty {
                            Some(t) if first_byte(t) == b'"' => small_str(t, &pf)?,
                            _ => String::new(),
                        };
                        match (ty.as_str(), part.text) {
                            ("text" | "input_text" | "output_text" | "", Some(t))
                                if first_byte(t) == b'"' =>
                            {
                                w.text(tag::TEXT, t, &format!("{pf}.text"))?
                            }
                            ("text" | "input_text" | "output_text", Some(_)) => {
                                return Err(wrong(format!("{pf}.text"), "a string"))
                            }
                            _ => other_part(p, &pf, w)?,
                        }
                    }
                    _ => return Err(wrong(pf, "an object")),
                }
            }
            Ok(())
        }
        _ => Err(wrong(field, "a string, an array or null")),
    }
}

/// A non-text part as canonical JSON, without `cache_control` (not prompt text).
fn other_part(r: Raw<'_>, field: &str, w: &mut Writer) -> Result<(), CanonError> {
    let mut v: Value = small(r, field)?;
    if let Value::Object(o) = &mut v {
        o.remove("cache_control");
    }
    w.record(tag::PART, &serde_json::to_vec(&v).unwrap_or_default());
    Ok(())
}

fn completions(b: &Body<'_>, w: &mut Writer) -> Result<(), CanonError> {
    let prompt = b.prompt.ok_or(CanonError::Missing("prompt"))?;
    completion_prompt("prompt", prompt, w, true)
}

/// A prompt is a string, a list of token ids, or a batch of either; a batch is routed by
/// its first prompt (they usually share the prefix that matters).
fn completion_prompt(
    field: &str,
    prompt: Raw<'_>,
    w: &mut Writer,
    allow_batch: bool,
) -> Result<(), CanonError> {
    match first_byte(prompt) {
        b'"' => w.text(tag::PROMPT, prompt, field),
        b'[' => {
            let items: Vec<Raw<'_>> = small(prompt, field)?;
            if items.is_empty() {
                return Err(wrong(field, "a non-empty prompt"));
            }
            let numeric = |r: &Raw<'_>| matches!(first_byte(r), b'-' | b'0'..=b'9');
            if items.iter().all(numeric) {
                let mut bytes = Vec::with_capacity(items.len() * 4);
                for (j, t) in items.iter().enumerate() {
                    let id: u32 = t
                        .get()
                        .parse()
                        .map_err(|_| wrong(format!("{field}[{j}]"), "a token id (u32)"))?;
                    bytes.extend_from_slice(&id.to_le_bytes());
                }
                w.record(tag::TOKENS, &bytes);
                Ok(())
            } else if allow_batch {
                for (j, item) in items.iter().enumerate() {
                    if !matches!(first_byte(item), b'"' | b'[') {
                        return Err(wrong(format!("{field}[{j}]"), "a string or token list"));
                    }
                }
                completion_prompt(&format!("{field}[0]"), items[0], w, false)
            } else {
                Err(wrong(field, "a string or a list of token ids"))
            }
        }
        _ => Err(wrong(
            field,
            "a string, a list of strings, or a list of token ids",
        )),
    }
}

fn responses(b: &Body<'_>, w: &mut Writer) -> Result<(), CanonError> {
    if let Some(i) = b.instructions.filter(|r| r.get() != "null") {
        w.text(tag::SYSTEM, i, "instructions")?;
    }
    for (f, r) in [
        ("tools", b.tools),
        ("previous_response_id", b.previous_response_id),
        ("reasoning", b.reasoning),
    ] {
        if let Some(r) = r.filter(|r| r.get() != "null") {
            w.field(f, r)?;
        }
    }
    let input = b.input.ok_or(CanonError::Missing("input"))?;
    match first_byte(input) {
        b'"' => {
            w.record(tag::ROLE, b"user");
            w.text(tag::TEXT, input, "input")?;
            w.end();
            Ok(())
        }
        b'[' => {
            let items: Vec<Raw<'_>> = small(input, "input")?;
            for (i, item) in items.iter().enumerate() {
                let field = format!("input[{i}]");
                if first_byte(item) != b'{' {
                    return Err(wrong(field, "an object"));
                }
                let p: Part<'_> = small(item, &field)?;
                let ty = match p.ty {
                    Some(t) => small_str(t, &format!("{field}.type"))?,
                    None => "message".to_owned(),
                };
                match ty.as_str() {
                    "message" => {
                        let role = match p.role {
                            Some(r) => small_str(r, &format!("{field}.role"))?,
                            None => "user".to_owned(),
                        };
                        w.record(tag::ROLE, role.as_bytes());
                        content(&format!("{field}.content"), p.content, w)?;
                    }
                    "function_call_output" => {
                        w.record(tag::ROLE, b"tool");
                        if let Some(id) = p.call_id.filter(|r| first_byte(r) == b'"') {
                            w.text(tag::TOOL_CALL_ID, id, &format!("{field}.call_id"))?;
                        }
                        match p.output {
                            Some(o) if first_byte(o) == b'"' => {
                                w.text(tag::TEXT, o, &format!("{field}.output"))?
                            }
                            Some(o) => w.json(tag::PART, o, &format!("{field}.output"))?,
                            None => {}
                        }
                    }
                    "reasoning" => {
                        w.record(tag::ROLE, b"assistant");
                        w.json(tag::REASONING, item, &field)?;
                    }
                    _ => {
                        // function_call and other items: kept whole, minus volatile ids.
                        let mut v: Value = small(item, &field)?;
                        if let Value::Object(o) = &mut v {
                            o.remove("id");
                            o.remove("status");
                        }
                        w.record(tag::ROLE, b"assistant");
                        w.record(tag::TOOL_CALL, &serde_json::to_vec(&v).unwrap_or_default());
                    }
                }
                w.end();
            }
            Ok(())
        }
        _ => Err(wrong("input", "a string or an array")),
    }
}

fn messages(b: &Body<'_>, w: &mut Writer) -> Result<(), CanonError> {
    if let Some(s) = b.system.filter(|r| r.get() != "null") {
        match first_byte(s) {
            b'"' => w.text(tag::SYSTEM, s, "system")?,
            b'[' => {
                w.record(tag::ROLE, b"system");
                content("system", Some(s), w)?;
                w.end();
            }
            _ => return Err(wrong("system", "a string or an array")),
        }
    }
    if let Some(tools) = b.tools.filter(|r| r.get() != "null") {
        if first_byte(tools) != b'[' {
            return Err(wrong("tools", "an array"));
        }
        // cache_control marks where the client wants a cache breakpoint; not prompt text.
        let mut list: Vec<Value> = small(tools, "tools")?;
        for t in &mut list {
            if let Value::Object(o) = t {
                o.remove("cache_control");
            }
        }
        let mut s = b"tools\0".to_vec();
        s.extend_from_slice(&serde_json::to_vec(&list).unwrap_or_default());
        w.record(tag::FIELD, &s);
    }
    let raw = b.messages.as_ref().ok_or(CanonError::Missing("messages"))?;
    for (i, m) in raw.iter().enumerate() {
        let field = format!("messages[{i}]");
        let role = role_of(m, &field)?;
        w.record(tag::ROLE, role.as_bytes());
        let cf = format!("{field}.content");
        match m.content {
            Some(c) if first_byte(c) == b'[' => {
                let blocks: Vec<Raw<'_>> = small(c, &cf)?;
                for (j, blk) in blocks.iter().enumerate() {
                    let bf = format!("{cf}[{j}]");
                    if first_byte(blk) != b'{' {
                        return Err(wrong(bf, "an object"));
                    }
                    let p: Part<'_> = small(blk, &bf)?;
                    let ty = match p.ty {
                        Some(t) if first_byte(t) == b'"' => small_str(t, &bf)?,
                        _ => String::new(),
                    };
                    match ty.as_str() {
                        "text" => match p.text {
                            Some(t) if first_byte(t) == b'"' => w.text(tag::TEXT, t, &bf)?,
                            _ => return Err(wrong(format!("{bf}.text"), "a string")),
                        },
                        "thinking" => match p.thinking {
                            Some(t) if first_byte(t) == b'"' => w.text(tag::REASONING, t, &bf)?,
                            _ => other_part(blk, &bf, w)?,
                        },
                        "tool_result" => {
                            if let Some(id) = p.tool_use_id.filter(|r| first_byte(r) == b'"') {
                                w.text(tag::TOOL_CALL_ID, id, &bf)?;
                            }
                            content(&format!("{bf}.content"), p.content, w)?;
                        }
                        _ => other_part(blk, &bf, w)?,
                    }
                }
            }
            other => content(&cf, other, w)?,
        }
        w.end();
    }
    Ok(())
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
