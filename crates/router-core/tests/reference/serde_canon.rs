//! The serde_json-based canonicalizer that `router_core::canon` replaced, kept verbatim (bar
//! imports) as the oracle for `canon_reference.rs`: the new reader must produce the same
//! canonical bytes for every body both accept, so fingerprints did not change.
#![allow(dead_code)]

use router_core::{CanonError, CanonicalPrompt, Endpoint};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use std::borrow::Cow;

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
