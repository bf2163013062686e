//! A parsed document and its values: spans of the input, read without copying; canonical
//! re-serialization that matches serde_json byte for byte.

use super::scanner;
use super::strings::{decode, write_number};
use super::tree::{DecodeError, Kind, Node, Nodes, ParseError, DECODE, ESCAPED};
use std::borrow::Cow;

/// A parsed document: the input and a flat, pre-order list of its values.
pub(crate) struct Doc<'a> {
    src: &'a [u8],
    nodes: Nodes,
}

impl<'a> Doc<'a> {
    /// Parses and validates `src` (one JSON value, surrounding whitespace allowed).
    #[cfg(test)]
    pub(crate) fn parse(src: &'a [u8]) -> Result<Doc<'a>, ParseError> {
        let nodes = scanner::parse(src, None)?;
        Ok(Doc { src, nodes })
    }

    /// Like [`Doc::parse`], but a top-level object keeps only the members named in
    /// `wanted`; the others are validated and left out of the index.
    pub(crate) fn parse_members(src: &'a [u8], wanted: &[&str]) -> Result<Doc<'a>, ParseError> {
        let nodes = scanner::parse(src, Some(wanted))?;
        Ok(Doc { src, nodes })
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
    nodes: &'d Nodes,
    i: usize,
}

impl<'d> Val<'d> {
    #[inline]
    fn node(&self) -> Node {
        self.nodes.get(self.i)
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
