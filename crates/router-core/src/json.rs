//! A validating JSON reader for the request path.
//!
//! It checks the whole body in one pass (grammar, escapes, control characters, UTF-8) and
//! records every value as a span of the input, without copying or unescaping anything. A
//! 150 KB prompt is scanned 32 bytes at a time for the three bytes that end a plain run (`"`,
//! `\`, control characters); strings remember whether they hold an escape that the canonical
//! form spells differently (`\uXXXX`, `\/`), so nearly every string is later copied as is.
//!
//! Canonical forms match serde_json's writer byte for byte (compact, keys sorted, the same
//! escapes), so fingerprints do not change with this reader; `tests/canon_reference.rs`
//! checks that against the serde_json implementation this replaced.

use std::borrow::Cow;

/// Deepest nesting accepted (serde_json's default recursion limit).
const MAX_DEPTH: u32 = 128;

/// What a value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Null,
    Bool,
    Num,
    Str,
    Arr,
    Obj,
}

/// String flags.
const ESCAPED: u8 = 1;
/// Holds `\uXXXX` or `\/`: the canonical spelling differs from the input.
const DECODE: u8 = 2;
/// Number flag: digits only (no sign, fraction or exponent).
const PLAIN_INT: u8 = 4;

#[derive(Debug, Clone, Copy)]
struct Node {
    kind: Kind,
    flags: u8,
    /// Byte span of the value in the input.
    start: u32,
    end: u32,
    /// Index of the first node after this value's subtree.
    after: u32,
}

/// A syntax error, with the byte offset where it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SyntaxError {
    pub(crate) message: &'static str,
    pub(crate) at: usize,
}

impl std::fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at byte {}", self.message, self.at)
    }
}

/// A string that does not decode to Unicode text (a lone surrogate escape).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecodeError(pub(crate) &'static str);

/// A parsed document: the input and a flat, pre-order list of its values.
pub(crate) struct Doc<'a> {
    src: &'a [u8],
    nodes: Vec<Node>,
}

impl<'a> Doc<'a> {
    /// Parses and validates `src` (one JSON value, surrounding whitespace allowed).
    pub(crate) fn parse(src: &'a [u8]) -> Result<Doc<'a>, SyntaxError> {
        if src.len() > u32::MAX as usize {
            return Err(SyntaxError {
                message: "document too large",
                at: 0,
            });
        }
        let mut p = Parser {
            src,
            pos: 0,
            depth: 0,
            // Agent bodies hold few, long values; this avoids most regrowth.
            nodes: Vec::with_capacity(64 + src.len() / 512),
        };
        p.value()?;
        p.ws();
        if p.pos != src.len() {
            return Err(p.err("trailing characters"));
        }
        Ok(Doc {
            src,
            nodes: p.nodes,
        })
    }

    /// The top-level value.
    pub(crate) fn root(&self) -> Val<'_> {
        Val {
            src: self.src,
            nodes: &self.nodes,
            i: 0,
        }
    }
}

/// One value of a [`Doc`].
#[derive(Clone, Copy)]
pub(crate) struct Val<'d> {
    src: &'d [u8],
    nodes: &'d [Node],
    i: usize,
}

impl<'d> Val<'d> {
    fn node(&self) -> Node {
        self.nodes[self.i]
    }

    fn at(&self, i: usize) -> Val<'d> {
        Val { i, ..*self }
    }

    pub(crate) fn kind(&self) -> Kind {
        self.node().kind
    }

    pub(crate) fn is_null(&self) -> bool {
        self.kind() == Kind::Null
    }

    /// The value's bytes as they appear in the input.
    pub(crate) fn raw(&self) -> &'d [u8] {
        let n = self.node();
        &self.src[n.start as usize..n.end as usize]
    }

    /// Children in order: array items, or object keys and values alternating.
    fn children(&self) -> Children<'d> {
        let n = self.node();
        Children {
            val: *self,
            next: self.i + 1,
            end: n.after as usize,
        }
    }

    /// Array items (empty for other kinds).
    pub(crate) fn items(&self) -> impl Iterator<Item = Val<'d>> {
        let arr = self.kind() == Kind::Arr;
        self.children().filter(move |_| arr)
    }

    /// Object members as (key, value) (empty for other kinds).
    pub(crate) fn members(&self) -> Members<'d> {
        Members {
            inner: self.children(),
            obj: self.kind() == Kind::Obj,
        }
    }

    /// A string's bytes between the quotes, escapes as written.
    fn inner(&self) -> &'d [u8] {
        let r = self.raw();
        &r[1..r.len() - 1]
    }

    /// A string's decoded text (borrowed when it has no escapes).
    pub(crate) fn text(&self) -> Result<Cow<'d, str>, DecodeError> {
        let n = self.node();
        let inner = self.inner();
        if n.flags & ESCAPED == 0 {
            // Validated as UTF-8 while parsing.
            return std::str::from_utf8(inner)
                .map(Cow::Borrowed)
                .map_err(|_| DecodeError("invalid UTF-8"));
        }
        let mut out = Vec::with_capacity(inner.len());
        decode(inner, &mut out, false)?;
        String::from_utf8(out)
            .map(Cow::Owned)
            .map_err(|_| DecodeError("invalid UTF-8"))
    }

    /// A string's bytes when they already are its canonical spelling (no `\uXXXX`, no `\/`).
    pub(crate) fn canonical_as_written(&self) -> Option<&'d [u8]> {
        (self.node().flags & DECODE == 0).then(|| self.inner())
    }

    /// Appends a string's canonical spelling (serde_json's escapes), without quotes.
    pub(crate) fn write_str(&self, out: &mut Vec<u8>) -> Result<(), DecodeError> {
        let inner = self.inner();
        if self.node().flags & DECODE == 0 {
            // Every other escape is already spelled as serde_json spells it.
            out.extend_from_slice(inner);
            return Ok(());
        }
        decode(inner, out, true)
    }

    /// Appends the value as serde_json would serialize it after parsing it into a `Value`:
    /// compact, object keys sorted and unique (the last duplicate wins), numbers normalized.
    /// Top-level keys in `skip` are left out.
    pub(crate) fn write_json(&self, out: &mut Vec<u8>, skip: &[&str]) -> Result<(), DecodeError> {
        match self.kind() {
            Kind::Null | Kind::Bool => out.extend_from_slice(self.raw()),
            Kind::Num => write_number(self.raw(), self.node().flags, out)?,
            Kind::Str => {
                out.push(b'"');
                self.write_str(out)?;
                out.push(b'"');
            }
            Kind::Arr => {
                out.push(b'[');
                for (k, v) in self.items().enumerate() {
                    if k > 0 {
                        out.push(b',');
                    }
                    v.write_json(out, &[])?;
                }
                out.push(b']');
            }
            Kind::Obj => {
                let mut members = Vec::new();
                for (k, v) in self.members() {
                    members.push((k.key_bytes()?, k, v));
                }
                // Stable: among equal keys the last one stays last, and it is the one kept.
                members.sort_by(|a, b| a.0.cmp(&b.0));
                out.push(b'{');
                let mut first = true;
                for (j, (key, k, v)) in members.iter().enumerate() {
                    if members.get(j + 1).is_some_and(|next| next.0 == *key) {
                        continue;
                    }
                    if skip.iter().any(|s| s.as_bytes() == key.as_ref()) {
                        continue;
                    }
                    if !first {
                        out.push(b',');
                    }
                    first = false;
                    out.push(b'"');
                    k.write_str(out)?;
                    out.extend_from_slice(b"\":");
                    v.write_json(out, &[])?;
                }
                out.push(b'}');
            }
        }
        Ok(())
    }

    /// A key's decoded bytes, for ordering and matching.
    fn key_bytes(&self) -> Result<Cow<'d, [u8]>, DecodeError> {
        Ok(match self.text()? {
            Cow::Borrowed(s) => Cow::Borrowed(s.as_bytes()),
            Cow::Owned(s) => Cow::Owned(s.into_bytes()),
        })
    }

    /// Whether this string (a key) decodes to `name`.
    pub(crate) fn key_is(&self, name: &str) -> bool {
        if self.node().flags & ESCAPED == 0 {
            return self.inner() == name.as_bytes();
        }
        self.text().is_ok_and(|t| t == name)
    }
}

/// Children of a container.
struct Children<'d> {
    val: Val<'d>,
    next: usize,
    end: usize,
}

impl<'d> Iterator for Children<'d> {
    type Item = Val<'d>;

    fn next(&mut self) -> Option<Val<'d>> {
        if self.next >= self.end {
            return None;
        }
        let v = self.val.at(self.next);
        self.next = v.node().after as usize;
        Some(v)
    }
}

/// Members of an object.
pub(crate) struct Members<'d> {
    inner: Children<'d>,
    obj: bool,
}

impl<'d> Iterator for Members<'d> {
    type Item = (Val<'d>, Val<'d>);

    fn next(&mut self) -> Option<(Val<'d>, Val<'d>)> {
        if !self.obj {
            return None;
        }
        let k = self.inner.next()?;
        let v = self.inner.next()?;
        Some((k, v))
    }
}

/// serde_json's spelling of a number: integers that fit 64 bits as written, everything
/// else through its own parser and formatter so the digits match exactly.
fn write_number(raw: &[u8], flags: u8, out: &mut Vec<u8>) -> Result<(), DecodeError> {
    // 19 digits always fit a u64.
    if flags & PLAIN_INT != 0 && raw.len() <= 19 {
        out.extend_from_slice(raw);
        return Ok(());
    }
    let n: serde_json::Number =
        serde_json::from_slice(raw).map_err(|_| DecodeError("number out of range"))?;
    out.extend_from_slice(n.to_string().as_bytes());
    Ok(())
}

fn hex4(b: &[u8]) -> Option<u32> {
    let mut v = 0u32;
    for &c in b.get(..4)? {
        v = v * 16 + (c as char).to_digit(16)?;
    }
    Some(v)
}

/// Decodes a validated string body into `out`: as UTF-8 text, or (`canonical`) re-escaped
/// the way serde_json writes strings (`\"`, `\\`, `\b \f \n \r \t`, other control characters
/// as lowercase `\u00xx`, everything else literal).
fn decode(inner: &[u8], out: &mut Vec<u8>, canonical: bool) -> Result<(), DecodeError> {
    let mut i = 0;
    while i < inner.len() {
        let Some(off) = memchr::memchr(b'\\', &inner[i..]) else {
            out.extend_from_slice(&inner[i..]);
            break;
        };
        out.extend_from_slice(&inner[i..i + off]);
        i += off;
        let e = inner.get(i + 1).copied().unwrap_or(b'\\');
        let c = match e {
            b'u' => {
                let hi = inner
                    .get(i + 2..)
                    .and_then(hex4)
                    .ok_or(DecodeError("invalid escape"))?;
                i += 6;
                match hi {
                    0xD800..=0xDBFF => {
                        let lo = if inner.get(i..i + 2) == Some(b"\\u") {
                            inner.get(i + 2..).and_then(hex4)
                        } else {
                            None
                        };
                        match lo {
                            Some(lo @ 0xDC00..=0xDFFF) => {
                                i += 6;
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            }
                            _ => return Err(DecodeError("lone leading surrogate in hex escape")),
                        }
                    }
                    0xDC00..=0xDFFF => {
                        return Err(DecodeError("lone trailing surrogate in hex escape"))
                    }
                    cp => cp,
                }
            }
            _ => {
                i += 2;
                match e {
                    b'b' => 0x08,
                    b'f' => 0x0C,
                    b'n' => 0x0A,
                    b'r' => 0x0D,
                    b't' => 0x09,
                    other => u32::from(other),
                }
            }
        };
        let ch = char::from_u32(c).ok_or(DecodeError("invalid escape"))?;
        if canonical {
            push_escaped(ch, out);
        } else {
            let mut buf = [0u8; 4];
            out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
        }
    }
    Ok(())
}

fn push_escaped(ch: char, out: &mut Vec<u8>) {
    match ch {
        '"' => out.extend_from_slice(b"\\\""),
        '\\' => out.extend_from_slice(b"\\\\"),
        '\u{08}' => out.extend_from_slice(b"\\b"),
        '\u{0C}' => out.extend_from_slice(b"\\f"),
        '\n' => out.extend_from_slice(b"\\n"),
        '\r' => out.extend_from_slice(b"\\r"),
        '\t' => out.extend_from_slice(b"\\t"),
        c if (c as u32) < 0x20 => {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            let b = c as usize;
            out.extend_from_slice(b"\\u00");
            out.push(HEX[b >> 4]);
            out.push(HEX[b & 15]);
        }
        c => {
            let mut buf = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        }
    }
}

/// 1 for a byte that ends a plain run of string text (`"`, `\\`, control characters), else 0.
#[inline(always)]
fn stop(x: u8) -> u8 {
    u8::from(x == b'"') | u8::from(x == b'\\') | u8::from(x < 0x20)
}

/// Bytes per scanned block.
const BLOCK: usize = 32;

/// A bit per byte of `block` that ends a plain run (`"`, `\\`, control characters); ORs
/// the block's bytes into `acc` (reduced once per string: non-ASCII means UTF-8 to check).
/// The compiler turns the byte loop into vector compares; the 0/1 bytes are packed eight at
/// a time with one multiply (bit k of the product's top byte is byte k of the word). No
/// horizontal reduction per block: escape-dense text (code) has a stop in most blocks.
#[inline]
fn stops(block: &[u8; BLOCK], acc: &mut [u8; BLOCK]) -> u32 {
    let mut flags = [0u8; BLOCK];
    for ((f, a), &x) in flags.iter_mut().zip(acc.iter_mut()).zip(block) {
        *f = stop(x);
        *a |= x;
    }
    let mut mask = 0u32;
    for (w, word) in flags.chunks_exact(8).enumerate() {
        let v = u64::from_le_bytes(word.try_into().unwrap_or_default());
        mask |= ((v.wrapping_mul(0x0102_0408_1020_4080) >> 56) as u32) << (w * 8);
    }
    mask
}

/// Bytes per window of the plain-text fast path.
const WINDOW: usize = 128;

/// Skips whole windows of `src` from `i` that hold no stop byte, ORing their bytes into
/// `seen`; returns where the first window with a stop (or the last partial one) starts.
/// One reduction per window instead of one per block: plain prose runs several times
/// faster, and the caller only tries it after stop-free blocks, so escape-dense text
/// (code) does not pay for windows that fail.
#[inline]
fn plain_windows(src: &[u8], mut i: usize, seen: &mut u8) -> usize {
    while let Some(w) = src.get(i..i + WINDOW) {
        let w: &[u8; WINDOW] = w.try_into().unwrap_or(&[b'"'; WINDOW]);
        let mut any = 0u8;
        let mut or = 0u8;
        for &x in w {
            any |= stop(x);
            or |= x;
        }
        if any != 0 {
            break;
        }
        *seen |= or;
        i += WINDOW;
    }
    i
}

struct Parser<'a> {
    src: &'a [u8],
    pos: usize,
    depth: u32,
    nodes: Vec<Node>,
}

impl Parser<'_> {
    fn err(&self, message: &'static str) -> SyntaxError {
        SyntaxError {
            message,
            at: self.pos,
        }
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.src.get(self.pos) {
            self.pos += 1;
        }
    }

    fn push(&mut self, kind: Kind, flags: u8, start: usize) -> usize {
        self.nodes.push(Node {
            kind,
            flags,
            start: start as u32,
            end: self.pos as u32,
            after: self.nodes.len() as u32 + 1,
        });
        self.nodes.len() - 1
    }

    fn value(&mut self) -> Result<(), SyntaxError> {
        self.ws();
        let start = self.pos;
        match self.src.get(self.pos) {
            None => Err(self.err("EOF while parsing a value")),
            Some(b'{') => self.container(Kind::Obj),
            Some(b'[') => self.container(Kind::Arr),
            Some(b'"') => {
                let flags = self.string()?;
                self.push(Kind::Str, flags, start);
                Ok(())
            }
            Some(b't') => self.literal(b"true", Kind::Bool),
            Some(b'f') => self.literal(b"false", Kind::Bool),
            Some(b'n') => self.literal(b"null", Kind::Null),
            Some(b'-' | b'0'..=b'9') => {
                let flags = self.number()?;
                self.push(Kind::Num, flags, start);
                Ok(())
            }
            Some(_) => Err(self.err("expected value")),
        }
    }

    fn literal(&mut self, word: &'static [u8], kind: Kind) -> Result<(), SyntaxError> {
        let start = self.pos;
        if self.src.get(start..start + word.len()) != Some(word) {
            return Err(self.err("expected value"));
        }
        self.pos += word.len();
        self.push(kind, 0, start);
        Ok(())
    }

    fn digits(&mut self) -> usize {
        let from = self.pos;
        while let Some(b'0'..=b'9') = self.src.get(self.pos) {
            self.pos += 1;
        }
        self.pos - from
    }

    fn number(&mut self) -> Result<u8, SyntaxError> {
        let mut plain = true;
        if self.src.get(self.pos) == Some(&b'-') {
            plain = false;
            self.pos += 1;
        }
        match self.src.get(self.pos) {
            Some(b'0') => {
                self.pos += 1;
                if let Some(b'0'..=b'9') = self.src.get(self.pos) {
                    return Err(self.err("invalid number"));
                }
            }
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.err("invalid number")),
        }
        if self.src.get(self.pos) == Some(&b'.') {
            plain = false;
            self.pos += 1;
            if self.digits() == 0 {
                return Err(self.err("invalid number"));
            }
        }
        if let Some(b'e' | b'E') = self.src.get(self.pos) {
            plain = false;
            self.pos += 1;
            if let Some(b'+' | b'-') = self.src.get(self.pos) {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return Err(self.err("invalid number"));
            }
        }
        Ok(if plain { PLAIN_INT } else { 0 })
    }

    /// Scans a string starting at its opening quote; leaves `pos` after the closing one.
    /// Whole blocks are classified at once and every escape in a block is handled from the
    /// block's bit mask, so escape-dense text (code: a `\n` every few dozen bytes) is not
    /// rescanned after each one.
    fn string(&mut self) -> Result<u8, SyntaxError> {
        let src = self.src;
        let body = self.pos + 1;
        let mut i = body;
        let mut flags = 0u8;
        let mut seen = 0u8;
        let mut acc = [0u8; BLOCK];
        // Stop-free blocks in a row: two of them suggest prose, worth a window at a time.
        let mut quiet = 0u32;
        let end = 'scan: loop {
            if quiet >= 2 {
                i = plain_windows(src, i, &mut seen);
                quiet = 0;
            }
            let mut mask = match src.get(i..i + BLOCK) {
                Some(b) => stops(b.try_into().unwrap_or(&[0; BLOCK]), &mut acc),
                None => {
                    // The last few bytes of the body, one at a time.
                    let mut m = 0u32;
                    for (k, &x) in src[i..].iter().enumerate() {
                        m |= u32::from(stop(x)) << k;
                        seen |= x;
                    }
                    if m == 0 {
                        self.pos = src.len();
                        return Err(self.err("EOF while parsing a string"));
                    }
                    m
                }
            };
            quiet = if mask == 0 { quiet + 1 } else { 0 };
            while mask != 0 {
                let p = i + mask.trailing_zeros() as usize;
                match src[p] {
                    b'"' => break 'scan p,
                    b'\\' => {
                        flags |= ESCAPED;
                        let len = match src.get(p + 1) {
                            Some(b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't') => 2,
                            Some(b'/') => {
                                flags |= DECODE;
                                2
                            }
                            Some(b'u') => {
                                if src.get(p + 2..p + 6).and_then(hex4).is_none() {
                                    self.pos = p;
                                    return Err(self.err("invalid \\u escape"));
                                }
                                flags |= DECODE;
                                6
                            }
                            None => {
                                self.pos = p;
                                return Err(self.err("EOF while parsing a string"));
                            }
                            Some(_) => {
                                self.pos = p;
                                return Err(self.err("invalid escape"));
                            }
                        };
                        let next = p + len;
                        if next - i >= BLOCK {
                            // The escape runs into the next block: classify from there.
                            i = next;
                            continue 'scan;
                        }
                        mask &= !((1u32 << (next - i)) - 1);
                    }
                    _ => {
                        self.pos = p;
                        return Err(self.err("control character (\\u0000-\\u001F) in a string"));
                    }
                }
            }
            i += BLOCK;
            if i >= src.len() {
                self.pos = src.len();
                return Err(self.err("EOF while parsing a string"));
            }
        };
        seen |= acc.iter().fold(0, |a, &x| a | x);
        // Bytes after the closing quote may have been ORed in too: at worst a needless check.
        if seen >= 0x80 {
            if let Err(e) = std::str::from_utf8(&src[body..end]) {
                self.pos = body + e.valid_up_to();
                return Err(self.err("invalid UTF-8 in a string"));
            }
        }
        self.pos = end + 1;
        Ok(flags)
    }

    fn container(&mut self, kind: Kind) -> Result<(), SyntaxError> {
        if self.depth >= MAX_DEPTH {
            return Err(self.err("recursion limit exceeded"));
        }
        self.depth += 1;
        let start = self.pos;
        let idx = self.push(kind, 0, start);
        let close = if kind == Kind::Obj { b'}' } else { b']' };
        self.pos += 1;
        self.ws();
        if self.src.get(self.pos) == Some(&close) {
            self.pos += 1;
        } else {
            loop {
                if kind == Kind::Obj {
                    self.ws();
                    let key_start = self.pos;
                    if self.src.get(self.pos) != Some(&b'"') {
                        return Err(self.err("key must be a string"));
                    }
                    let flags = self.string()?;
                    self.push(Kind::Str, flags, key_start);
                    self.ws();
                    if self.src.get(self.pos) != Some(&b':') {
                        return Err(self.err("expected ':'"));
                    }
                    self.pos += 1;
                }
                self.value()?;
                self.ws();
                match self.src.get(self.pos) {
                    Some(b',') => self.pos += 1,
                    Some(c) if *c == close => {
                        self.pos += 1;
                        break;
                    }
                    None => return Err(self.err("EOF while parsing a list or object")),
                    Some(_) => return Err(self.err("expected ',' or a closing bracket")),
                }
            }
        }
        let after = self.nodes.len() as u32;
        let n = &mut self.nodes[idx];
        n.end = self.pos as u32;
        n.after = after;
        self.depth -= 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon_json(s: &str) -> Result<String, String> {
        let d = Doc::parse(s.as_bytes()).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        d.root()
            .write_json(&mut out, &[])
            .map_err(|e| e.0.to_owned())?;
        Ok(String::from_utf8(out).unwrap())
    }

    fn serde_canon(s: &str) -> Result<String, String> {
        let v: serde_json::Value = serde_json::from_str(s).map_err(|e| e.to_string())?;
        Ok(serde_json::to_string(&v).unwrap())
    }

    #[test]
    fn canonical_json_matches_serde() {
        for s in [
            r#"{"b":1,"a":[true,false,null],"c":{"z":"x","y":-2.5e3}}"#,
            r#" { "a" : 1 , "a" : 2 } "#,
            r#"{"\u0062":1,"a":2,"b\"":3}"#,
            r#""a\/b\u00e9\u0001\n\"\\ \ud83d\ude00""#,
            r#"[0, -0, 1.0, 1e2, 12345678901234567890, 99999999999999999999999, -7]"#,
            r#"{"k":"\u2028\u007f"}"#,
            "[]",
            "{}",
        ] {
            assert_eq!(canon_json(s), serde_canon(s), "{s}");
        }
    }

    #[test]
    fn syntax_errors() {
        for s in [
            "",
            " ",
            "{",
            "[1,]",
            "{\"a\"}",
            "{\"a\":}",
            "01",
            "1.",
            "1e",
            "-",
            "tru",
            "nul",
            "\"abc",
            "\"\\x\"",
            "\"\\u12\"",
            "\"a\u{1}b\"",
            "[1] x",
            "{'a':1}",
            "{\"a\":1,}",
        ] {
            assert!(Doc::parse(s.as_bytes()).is_err(), "{s:?}");
            assert!(
                serde_json::from_str::<serde_json::Value>(s).is_err(),
                "serde accepts {s:?}"
            );
        }
        assert!(Doc::parse(b"\"\xff\"").is_err());
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert!(Doc::parse(deep.as_bytes()).is_err());
    }

    #[test]
    fn lone_surrogates_do_not_decode() {
        for s in [r#""\ud800""#, r#""\udc00""#, r#""\ud800\u0041""#] {
            let d = Doc::parse(s.as_bytes()).unwrap();
            assert!(d.root().text().is_err(), "{s}");
            assert!(serde_json::from_str::<String>(s).is_err());
        }
    }

    #[test]
    fn bad_bytes_are_found_at_any_offset() {
        // Blocks, windows after quiet blocks, and the tail each see the bad byte somewhere.
        for len in [
            1usize, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 200, 300, 511,
        ] {
            for pos in [0, 1, len / 3, len / 2, len - 1] {
                for lead in ["", "x\\n", "\\t\\\"y"] {
                    let mut b = format!("[\"{lead}{}\", 1]", "a".repeat(len)).into_bytes();
                    let at = 2 + lead.len() + pos;
                    assert!(Doc::parse(&b).is_ok());
                    b[at] = 0xff;
                    assert!(Doc::parse(&b).is_err(), "0xff at {pos} of {len}");
                    b[at] = 0x01;
                    assert!(Doc::parse(&b).is_err(), "0x01 at {pos} of {len}");
                    b[at] = 0xc3; // a lead byte with no continuation
                    assert!(Doc::parse(&b).is_err(), "lone lead at {pos} of {len}");
                }
            }
        }
    }

    #[test]
    fn long_strings_cross_blocks() {
        for n in [0usize, 1, 31, 32, 33, 64, 100] {
            let s = format!("\"{}\\n{}é\"", "a".repeat(n), "b".repeat(n));
            let d = Doc::parse(s.as_bytes()).unwrap();
            assert_eq!(
                d.root().text().unwrap(),
                format!("{}\n{}é", "a".repeat(n), "b".repeat(n))
            );
        }
    }
}
