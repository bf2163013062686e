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

use crate::fingerprint::{FingerprintConfig, Fingerprints};
use crate::json::{DecodeError, Doc, Kind, Val};
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

/// Builds a field path for an error message, only when there is an error.
type Field<'f> = &'f dyn Fn() -> String;

fn invalid(field: String, e: DecodeError) -> CanonError {
    CanonError::Invalid {
        field,
        message: e.0.to_owned(),
    }
}

/// Reads the members named in `names` from an object. A null member counts as absent and a
/// repeated name is refused, as the serde-derived structs this replaced did.
fn fields<'d, const N: usize>(
    obj: Val<'d>,
    names: &[&str; N],
    field: Field<'_>,
) -> Result<[Option<Val<'d>>; N], CanonError> {
    let mut out = [None; N];
    let mut seen = [false; N];
    for (k, v) in obj.members() {
        let key = k.text().map_err(|e| invalid(field(), e))?;
        if let Some(j) = names.iter().position(|n| *n == key) {
            if seen[j] {
                return Err(CanonError::Invalid {
                    field: field(),
                    message: format!("duplicate field `{}`", names[j]),
                });
            }
            seen[j] = true;
            if !v.is_null() {
                out[j] = Some(v);
            }
        }
    }
    Ok(out)
}

/// Every top-level field any endpoint needs. Big strings stay spans of the body: the request
/// path never unescapes a 150 KB prompt.
struct Body<'d> {
    model: Option<Val<'d>>,
    stream: Option<Val<'d>>,
    session_params: Option<Val<'d>>,
    messages: Option<Vec<Msg<'d>>>,
    tools: Option<Val<'d>>,
    functions: Option<Val<'d>>,
    documents: Option<Val<'d>>,
    chat_template: Option<Val<'d>>,
    chat_template_kwargs: Option<Val<'d>>,
    reasoning_effort: Option<Val<'d>>,
    prompt: Option<Val<'d>>,
    instructions: Option<Val<'d>>,
    input: Option<Val<'d>>,
    previous_response_id: Option<Val<'d>>,
    reasoning: Option<Val<'d>>,
    system: Option<Val<'d>>,
}

impl<'d> Body<'d> {
    fn read(root: Val<'d>) -> Result<Body<'d>, CanonError> {
        let [model, stream, session_params, messages, tools, functions, documents, chat_template, chat_template_kwargs, reasoning_effort, prompt, instructions, input, previous_response_id, reasoning, system] =
            fields(
                root,
                &[
                    "model",
                    "stream",
                    "session_params",
                    "messages",
                    "tools",
                    "functions",
                    "documents",
                    "chat_template",
                    "chat_template_kwargs",
                    "reasoning_effort",
                    "prompt",
                    "instructions",
                    "input",
                    "previous_response_id",
                    "reasoning",
                    "system",
                ],
                &|| "body".to_owned(),
            )?;
        // Messages are checked for every endpoint: a body with broken messages is broken.
        let messages = match messages {
            None => None,
            Some(m) if m.kind() == Kind::Arr => Some(
                m.items()
                    .enumerate()
                    .map(|(i, v)| Msg::read(v, i))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            Some(_) => return Err(wrong("messages", "an array")),
        };
        Ok(Body {
            model,
            stream,
            session_params,
            messages,
            tools,
            functions,
            documents,
            chat_template,
            chat_template_kwargs,
            reasoning_effort,
            prompt,
            instructions,
            input,
            previous_response_id,
            reasoning,
            system,
        })
    }

    fn chat_field(&self, name: &str) -> Option<Val<'d>> {
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

/// One chat message (also Anthropic messages).
struct Msg<'d> {
    role: Option<Val<'d>>,
    name: Option<Val<'d>>,
    content: Option<Val<'d>>,
    reasoning_content: Option<Val<'d>>,
    reasoning: Option<Val<'d>>,
    thinking: Option<Val<'d>>,
    tool_calls: Option<Val<'d>>,
    function_call: Option<Val<'d>>,
    tool_call_id: Option<Val<'d>>,
}

impl<'d> Msg<'d> {
    fn read(v: Val<'d>, i: usize) -> Result<Msg<'d>, CanonError> {
        if v.kind() != Kind::Obj {
            return Err(wrong(format!("messages[{i}]"), "an object"));
        }
        let [role, name, content, reasoning_content, reasoning, thinking, tool_calls, function_call, tool_call_id] =
            fields(
                v,
                &[
                    "role",
                    "name",
                    "content",
                    "reasoning_content",
                    "reasoning",
                    "thinking",
                    "tool_calls",
                    "function_call",
                    "tool_call_id",
                ],
                &|| format!("messages[{i}]"),
            )?;
        Ok(Msg {
            role,
            name,
            content,
            reasoning_content,
            reasoning,
            thinking,
            tool_calls,
            function_call,
            tool_call_id,
        })
    }
}

/// A content part or block, or a Responses input item.
struct Part<'d> {
    ty: Option<Val<'d>>,
    text: Option<Val<'d>>,
    thinking: Option<Val<'d>>,
    tool_use_id: Option<Val<'d>>,
    content: Option<Val<'d>>,
    call_id: Option<Val<'d>>,
    output: Option<Val<'d>>,
    role: Option<Val<'d>>,
}

impl<'d> Part<'d> {
    fn read(v: Val<'d>, field: Field<'_>) -> Result<Part<'d>, CanonError> {
        let [ty, text, thinking, tool_use_id, content, call_id, output, role] = fields(
            v,
            &[
                "type",
                "text",
                "thinking",
                "tool_use_id",
                "content",
                "call_id",
                "output",
                "role",
            ],
            field,
        )?;
        Ok(Part {
            ty,
            text,
            thinking,
            tool_use_id,
            content,
            call_id,
            output,
            role,
        })
    }
}

fn is_str(v: &Val<'_>) -> bool {
    v.kind() == Kind::Str
}

/// A string's decoded text.
fn str_of<'d>(v: Val<'d>, field: Field<'_>) -> Result<Cow<'d, str>, CanonError> {
    if !is_str(&v) {
        return Err(wrong(field(), "a string"));
    }
    v.text().map_err(|e| invalid(field(), e))
}

/// Where canonical bytes go: a buffer (tests, tools) or straight into the fingerprint
/// chain (the request path), so a 150 KB prompt is never copied out of the body.
pub(crate) trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

struct Writer<S> {
    sink: S,
    /// Reused for the records whose canonical bytes differ from the input's.
    scratch: Vec<u8>,
}

impl<S: Sink> Writer<S> {
    fn record(&mut self, tag: u8, bytes: &[u8]) {
        // Lengths above 4 GiB cannot occur: bodies are limited far below that.
        let mut head = [tag, 0, 0, 0, 0];
        head[1..].copy_from_slice(&(bytes.len() as u32).to_le_bytes());
        self.sink.put(&head);
        self.sink.put(bytes);
    }

    /// Builds a record's bytes in the scratch buffer, then writes it.
    fn built(
        &mut self,
        tag: u8,
        build: impl FnOnce(&mut Vec<u8>) -> Result<(), CanonError>,
    ) -> Result<(), CanonError> {
        let mut buf = std::mem::take(&mut self.scratch);
        buf.clear();
        let r = build(&mut buf);
        if r.is_ok() {
            self.record(tag, &buf);
        }
        self.scratch = buf;
        r
    }

    /// A string as its canonical spelling (serde_json's escapes): nearly always the input's
    /// own bytes.
    fn text(&mut self, tag: u8, v: Val<'_>, field: Field<'_>) -> Result<(), CanonError> {
        if !is_str(&v) {
            return Err(wrong(field(), "a string"));
        }
        if let Some(same) = v.canonical_as_written() {
            self.record(tag, same);
            return Ok(());
        }
        self.built(tag, |out| v.write_str(out).map_err(|e| invalid(field(), e)))
    }

    /// Canonical JSON: compact, keys sorted, so key order, whitespace and escaping of the
    /// input do not matter.
    fn json(
        &mut self,
        tag: u8,
        v: Val<'_>,
        field: Field<'_>,
        skip: &[&str],
    ) -> Result<(), CanonError> {
        self.built(tag, |out| {
            v.write_json(out, skip).map_err(|e| invalid(field(), e))
        })
    }

    fn field(&mut self, name: &str, v: Val<'_>) -> Result<(), CanonError> {
        self.built(tag::FIELD, |out| {
            out.extend_from_slice(name.as_bytes());
            out.push(0);
            v.write_json(out, &[])
                .map_err(|e| invalid(name.to_owned(), e))
        })
    }

    fn end(&mut self) {
        self.record(tag::END, &[]);
    }
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

/// What the request path needs from a body: the same as [`CanonicalPrompt`] but with the
/// fingerprints in place of the canonical bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptPrint {
    /// Model name (the fingerprint seed).
    pub model: String,
    /// Fingerprints of the canonical bytes.
    pub fingerprints: Fingerprints,
    /// `session_params.session_id` from the body, when present.
    pub session_id: Option<String>,
    /// Whether the client asked for a streamed response.
    pub stream: bool,
}

/// Canonicalizes and fingerprints in one pass, hashing the canonical bytes as they are
/// produced instead of collecting them. Equal to `cfg.fingerprint(model, canonical bytes)`.
pub fn fingerprint_json(
    endpoint: Endpoint,
    body: &[u8],
    cfg: &FingerprintConfig,
) -> Result<PromptPrint, CanonError> {
    let (head, chain) = canonical(endpoint, body, |model| cfg.chain(model))?;
    Ok(PromptPrint {
        model: head.model,
        fingerprints: chain.finish(),
        session_id: head.session_id,
        stream: head.stream,
    })
}

struct Head {
    model: String,
    session_id: Option<String>,
    stream: bool,
}

/// Validates `body` and writes its prompt's records, in prompt order, into the sink that
/// `sink` makes for the body's model.
fn canonical<S: Sink>(
    endpoint: Endpoint,
    body: &[u8],
    sink: impl FnOnce(&str) -> S,
) -> Result<(Head, S), CanonError> {
    let doc = Doc::parse(body).map_err(|e| {
        if body.iter().all(u8::is_ascii_whitespace) {
            CanonError::Json("empty body".into())
        } else {
            CanonError::Json(e.to_string())
        }
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
        Endpoint::Chat => chat(&b, &mut w)?,
        Endpoint::Completions => completions(&b, &mut w)?,
        Endpoint::Responses => responses(&b, &mut w)?,
        Endpoint::Messages => messages(&b, &mut w)?,
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

fn role_of<'d>(m: &Msg<'d>, field: Field<'_>) -> Result<Cow<'d, str>, CanonError> {
    match m.role {
        Some(r) => str_of(r, &|| format!("{}.role", field())),
        None => Err(CanonError::Missing("messages[].role")),
    }
}

fn is_system_role(role: &str) -> bool {
    role == "system" || role == "developer"
}

fn chat(b: &Body<'_>, w: &mut Writer<impl Sink>) -> Result<(), CanonError> {
    let msgs = b.messages.as_ref().ok_or(CanonError::Missing("messages"))?;
    let mut roles = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        roles.push(role_of(m, &|| format!("messages[{i}]"))?);
    }
    // Leading system/developer turns are rendered first by every template; a system turn in
    // the middle stays where it is.
    let lead = roles.iter().take_while(|r| is_system_role(r)).count();
    for (i, (role, m)) in roles.iter().zip(msgs).enumerate().take(lead) {
        chat_message(i, role, m, w)?;
    }
    for f in CHAT_PROMPT_FIELDS {
        if let Some(r) = b.chat_field(f) {
            w.field(f, r)?;
        }
    }
    for (i, (role, m)) in roles.iter().zip(msgs).enumerate().skip(lead) {
        chat_message(i, role, m, w)?;
    }
    Ok(())
}

fn chat_message(
    i: usize,
    role: &str,
    m: &Msg<'_>,
    w: &mut Writer<impl Sink>,
) -> Result<(), CanonError> {
    w.record(tag::ROLE, role.as_bytes());
    if let Some(n) = m.name {
        w.text(tag::NAME, n, &|| format!("messages[{i}].name"))?;
    }
    content(&|| format!("messages[{i}].content"), m.content, w)?;
    for r in [m.reasoning_content, m.reasoning, m.thinking]
        .into_iter()
        .flatten()
    {
        if is_str(&r) {
            w.text(tag::REASONING, r, &|| "reasoning".to_owned())?;
        } else {
            w.json(tag::REASONING, r, &|| "reasoning".to_owned(), &[])?;
        }
    }
    if let Some(tc) = m.tool_calls {
        if tc.kind() != Kind::Arr {
            return Err(wrong(format!("messages[{i}].tool_calls"), "an array"));
        }
        for (j, c) in tc.items().enumerate() {
            if c.kind() != Kind::Obj {
                return Err(wrong(format!("messages[{i}].tool_calls[{j}]"), "an object"));
            }
            w.json(tag::TOOL_CALL, c, &|| "tool_calls".to_owned(), &[])?;
        }
    }
    if let Some(fc) = m.function_call {
        w.json(tag::TOOL_CALL, fc, &|| "function_call".to_owned(), &[])?;
    }
    if let Some(id) = m.tool_call_id {
        w.text(tag::TOOL_CALL_ID, id, &|| {
            format!("messages[{i}].tool_call_id")
        })?;
    }
    w.end();
    Ok(())
}

/// Message content: a string, null, or a list of parts. Text parts become text records, so
/// `"hi"` and `[{"type":"text","text":"hi"}]` are the same prompt; other parts (images,
/// audio, files) are kept as canonical JSON, minus Anthropic's `cache_control` markers.
fn content(
    field: Field<'_>,
    v: Option<Val<'_>>,
    w: &mut Writer<impl Sink>,
) -> Result<(), CanonError> {
    let Some(v) = v else { return Ok(()) };
    match v.kind() {
        Kind::Null => Ok(()),
        Kind::Str => w.text(tag::TEXT, v, field),
        Kind::Arr => {
            for (j, p) in v.items().enumerate() {
                let pf = || format!("{}[{j}]", field());
                match p.kind() {
                    Kind::Str => w.text(tag::TEXT, p, &pf)?,
                    Kind::Obj => {
                        let part = Part::read(p, &pf)?;
                        let ty = match part.ty {
                            Some(t) if is_str(&t) => str_of(t, &pf)?,
                            _ => Cow::Borrowed(""),
                        };
                        match (ty.as_ref(), part.text) {
                            ("text" | "input_text" | "output_text" | "", Some(t)) if is_str(&t) => {
                                w.text(tag::TEXT, t, &|| format!("{}.text", pf()))?
                            }
                            ("text" | "input_text" | "output_text", Some(_)) => {
                                return Err(wrong(format!("{}.text", pf()), "a string"))
                            }
                            _ => other_part(p, &pf, w)?,
                        }
                    }
                    _ => return Err(wrong(pf(), "an object")),
                }
            }
            Ok(())
        }
        _ => Err(wrong(field(), "a string, an array or null")),
    }
}

/// A non-text part as canonical JSON, without `cache_control` (not prompt text).
fn other_part(p: Val<'_>, field: Field<'_>, w: &mut Writer<impl Sink>) -> Result<(), CanonError> {
    w.json(tag::PART, p, field, &["cache_control"])
}

fn completions(b: &Body<'_>, w: &mut Writer<impl Sink>) -> Result<(), CanonError> {
    let prompt = b.prompt.ok_or(CanonError::Missing("prompt"))?;
    completion_prompt(&|| "prompt".to_owned(), prompt, w, true)
}

/// A prompt is a string, a list of token ids, or a batch of either; a batch is routed by
/// its first prompt (they usually share the prefix that matters).
fn completion_prompt(
    field: Field<'_>,
    prompt: Val<'_>,
    w: &mut Writer<impl Sink>,
    allow_batch: bool,
) -> Result<(), CanonError> {
    match prompt.kind() {
        Kind::Str => w.text(tag::PROMPT, prompt, field),
        Kind::Arr => {
            let items: Vec<Val<'_>> = prompt.items().collect();
            let Some(first) = items.first() else {
                return Err(wrong(field(), "a non-empty prompt"));
            };
            if items.iter().all(|t| t.kind() == Kind::Num) {
                let mut bytes = Vec::with_capacity(items.len() * 4);
                for (j, t) in items.iter().enumerate() {
                    let id: u32 = std::str::from_utf8(t.raw())
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| wrong(format!("{}[{j}]", field()), "a token id (u32)"))?;
                    bytes.extend_from_slice(&id.to_le_bytes());
                }
                w.record(tag::TOKENS, &bytes);
                Ok(())
            } else if allow_batch {
                for (j, item) in items.iter().enumerate() {
                    if !matches!(item.kind(), Kind::Str | Kind::Arr) {
                        return Err(wrong(format!("{}[{j}]", field()), "a string or token list"));
                    }
                }
                completion_prompt(&|| format!("{}[0]", field()), *first, w, false)
            } else {
                Err(wrong(field(), "a string or a list of token ids"))
            }
        }
        _ => Err(wrong(
            field(),
            "a string, a list of strings, or a list of token ids",
        )),
    }
}

fn responses(b: &Body<'_>, w: &mut Writer<impl Sink>) -> Result<(), CanonError> {
    if let Some(i) = b.instructions {
        w.text(tag::SYSTEM, i, &|| "instructions".to_owned())?;
    }
    for (f, r) in [
        ("tools", b.tools),
        ("previous_response_id", b.previous_response_id),
        ("reasoning", b.reasoning),
    ] {
        if let Some(r) = r {
            w.field(f, r)?;
        }
    }
    let input = b.input.ok_or(CanonError::Missing("input"))?;
    match input.kind() {
        Kind::Str => {
            w.record(tag::ROLE, b"user");
            w.text(tag::TEXT, input, &|| "input".to_owned())?;
            w.end();
            Ok(())
        }
        Kind::Arr => {
            for (i, item) in input.items().enumerate() {
                let field = || format!("input[{i}]");
                if item.kind() != Kind::Obj {
                    return Err(wrong(field(), "an object"));
                }
                let p = Part::read(item, &field)?;
                let ty = match p.ty {
                    Some(t) => str_of(t, &|| format!("{}.type", field()))?,
                    None => Cow::Borrowed("message"),
                };
                match ty.as_ref() {
                    "message" => {
                        let role = match p.role {
                            Some(r) => str_of(r, &|| format!("{}.role", field()))?,
                            None => Cow::Borrowed("user"),
                        };
                        w.record(tag::ROLE, role.as_bytes());
                        content(&|| format!("{}.content", field()), p.content, w)?;
                    }
                    "function_call_output" => {
                        w.record(tag::ROLE, b"tool");
                        if let Some(id) = p.call_id.filter(is_str) {
                            w.text(tag::TOOL_CALL_ID, id, &|| format!("{}.call_id", field()))?;
                        }
                        match p.output {
                            Some(o) if is_str(&o) => {
                                w.text(tag::TEXT, o, &|| format!("{}.output", field()))?
                            }
                            Some(o) => {
                                w.json(tag::PART, o, &|| format!("{}.output", field()), &[])?
                            }
                            None => {}
                        }
                    }
                    "reasoning" => {
                        w.record(tag::ROLE, b"assistant");
                        w.json(tag::REASONING, item, &field, &[])?;
                    }
                    _ => {
                        // function_call and other items: kept whole, minus volatile ids.
                        w.record(tag::ROLE, b"assistant");
                        w.json(tag::TOOL_CALL, item, &field, &["id", "status"])?;
                    }
                }
                w.end();
            }
            Ok(())
        }
        _ => Err(wrong("input", "a string or an array")),
    }
}

fn messages(b: &Body<'_>, w: &mut Writer<impl Sink>) -> Result<(), CanonError> {
    if let Some(s) = b.system {
        match s.kind() {
            Kind::Str => w.text(tag::SYSTEM, s, &|| "system".to_owned())?,
            Kind::Arr => {
                w.record(tag::ROLE, b"system");
                content(&|| "system".to_owned(), Some(s), w)?;
                w.end();
            }
            _ => return Err(wrong("system", "a string or an array")),
        }
    }
    if let Some(tools) = b.tools {
        if tools.kind() != Kind::Arr {
            return Err(wrong("tools", "an array"));
        }
        // cache_control marks where the client wants a cache breakpoint; not prompt text.
        w.built(tag::FIELD, |out| {
            out.extend_from_slice(b"tools\0[");
            for (k, t) in tools.items().enumerate() {
                if k > 0 {
                    out.push(b',');
                }
                t.write_json(out, &["cache_control"])
                    .map_err(|e| invalid("tools".into(), e))?;
            }
            out.push(b']');
            Ok(())
        })?;
    }
    let msgs = b.messages.as_ref().ok_or(CanonError::Missing("messages"))?;
    for (i, m) in msgs.iter().enumerate() {
        let field = || format!("messages[{i}]");
        let role = role_of(m, &field)?;
        w.record(tag::ROLE, role.as_bytes());
        let cf = || format!("{}.content", field());
        match m.content {
            Some(c) if c.kind() == Kind::Arr => {
                for (j, blk) in c.items().enumerate() {
                    let bf = || format!("{}[{j}]", cf());
                    if blk.kind() != Kind::Obj {
                        return Err(wrong(bf(), "an object"));
                    }
                    let p = Part::read(blk, &bf)?;
                    let ty = match p.ty {
                        Some(t) if is_str(&t) => str_of(t, &bf)?,
                        _ => Cow::Borrowed(""),
                    };
                    match ty.as_ref() {
                        "text" => match p.text {
                            Some(t) if is_str(&t) => w.text(tag::TEXT, t, &bf)?,
                            _ => return Err(wrong(format!("{}.text", bf()), "a string")),
                        },
                        "thinking" => match p.thinking {
                            Some(t) if is_str(&t) => w.text(tag::REASONING, t, &bf)?,
                            _ => other_part(blk, &bf, w)?,
                        },
                        "tool_result" => {
                            if let Some(id) = p.tool_use_id.filter(is_str) {
                                w.text(tag::TOOL_CALL_ID, id, &bf)?;
                            }
                            content(&|| format!("{}.content", bf()), p.content, w)?;
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
