//! The canonical format and its writer: versioned records `tag (1 byte) | len (u32 LE) |
//! bytes`, the errors a body can produce, and the sink the records go to.

use crate::json::{DecodeError, Kind, Val};

/// Bumped whenever the canonical byte layout changes.
pub const FORMAT_VERSION: u32 = 2;

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
    /// More JSON values in the prompt's fields than a body this size may hold: reading
    /// them would cost memory out of proportion to the request.
    #[error("the request's prompt fields hold more than {limit} JSON values (one per 4 bytes of body, plus 4096)")]
    TooManyValues {
        /// The cap for this body.
        limit: usize,
    },
}

pub(crate) fn wrong(field: impl Into<String>, expected: &'static str) -> CanonError {
    CanonError::WrongType {
        field: field.into(),
        expected,
    }
}

pub(crate) fn invalid(field: String, e: DecodeError) -> CanonError {
    CanonError::Invalid {
        field,
        message: e.0.to_owned(),
    }
}

/// Record tags. Stable: part of the fingerprint format.
pub(crate) mod tag {
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

/// Builds a field path for an error message, only when there is an error.
pub(crate) type Field<'f> = &'f dyn Fn() -> String;

pub(crate) fn is_str(v: &Val<'_>) -> bool {
    v.kind() == Kind::Str
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

pub(crate) struct Writer<S> {
    pub(crate) sink: S,
    /// Reused for the records whose canonical bytes differ from the input's.
    pub(crate) scratch: Vec<u8>,
}

impl<S: Sink> Writer<S> {
    pub(crate) fn record(&mut self, tag: u8, bytes: &[u8]) {
        // Lengths above 4 GiB cannot occur: bodies are limited far below that.
        let mut head = [tag, 0, 0, 0, 0];
        head[1..].copy_from_slice(&(bytes.len() as u32).to_le_bytes());
        self.sink.put(&head);
        self.sink.put(bytes);
    }

    /// Builds a record's bytes in the scratch buffer, then writes it.
    pub(crate) fn built(
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
    pub(crate) fn text(&mut self, tag: u8, v: Val<'_>, field: Field<'_>) -> Result<(), CanonError> {
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
    pub(crate) fn json(
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

    pub(crate) fn field(&mut self, name: &str, v: Val<'_>) -> Result<(), CanonError> {
        self.built(tag::FIELD, |out| {
            out.extend_from_slice(name.as_bytes());
            out.push(0);
            v.write_json(out, &[])
                .map_err(|e| invalid(name.to_owned(), e))
        })
    }

    pub(crate) fn end(&mut self) {
        self.record(tag::END, &[]);
    }
}
