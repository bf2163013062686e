//! The validating scanner: one pass over the bytes, checking grammar, escapes, control
//! characters and UTF-8, and producing the flat pre-order node list. Strings are scanned a
//! block at a time for the bytes that end a plain run.

use super::strings::hex4;
use super::tree::{Kind, Nodes, ParseError, DECODE, ESCAPED, OFFSET_BITS, PLAIN_INT};

/// Deepest nesting accepted (serde_json's default recursion limit).
const MAX_DEPTH: u32 = 128;

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

/// Parses and validates `src` (one JSON value, surrounding whitespace allowed) into its
/// nodes, in pre-order. With `wanted`, members of a top-level object whose names are not
/// in it are validated and skipped, not indexed: a field the router never reads costs no
/// memory however many values it holds.
pub(super) fn parse(src: &[u8], wanted: Option<&[&str]>) -> Result<Nodes, ParseError> {
    if src.len() >= 1 << OFFSET_BITS {
        return Err(ParseError::Syntax {
            message: "document too large (64 MiB at most)",
            at: 0,
        });
    }
    let mut p = Parser {
        src,
        pos: 0,
        depth: 0,
        nodes: Nodes::for_document(src.len()),
        skipping: 0,
        wanted,
    };
    p.value()?;
    p.ws();
    if p.pos != src.len() {
        return Err(p.err("trailing characters"));
    }
    Ok(p.nodes)
}

struct Parser<'a> {
    src: &'a [u8],
    pos: usize,
    depth: u32,
    nodes: Nodes,
    /// Depth of skipped values being validated (nothing is indexed while above 0).
    skipping: u32,
    wanted: Option<&'a [&'a str]>,
}

/// Returned by [`Parser::push`] for a value that was skipped.
const SKIPPED: usize = usize::MAX;

impl Parser<'_> {
    fn err(&self, message: &'static str) -> ParseError {
        ParseError::Syntax {
            message,
            at: self.pos,
        }
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.src.get(self.pos) {
            self.pos += 1;
        }
    }

    fn push(&mut self, kind: Kind, flags: u8, start: usize) -> Result<usize, ParseError> {
        if self.skipping > 0 {
            return Ok(SKIPPED);
        }
        if self.nodes.len() >= self.nodes.limit() {
            return Err(ParseError::TooManyValues {
                limit: self.nodes.limit(),
            });
        }
        Ok(self.nodes.push(kind, flags, start as u32, self.pos as u32))
    }

    /// Whether the member named by the key string at `src[key_start..self.pos]` is to be
    /// indexed: always below the top level; at the top, when it is wanted (a key written
    /// with escapes is indexed, to be compared decoded).
    fn indexed(&self, key_start: usize, key_flags: u8) -> bool {
        match self.wanted {
            Some(names) if self.depth == 1 && key_flags & ESCAPED == 0 => {
                let key = &self.src[key_start + 1..self.pos - 1];
                names.iter().any(|n| n.as_bytes() == key)
            }
            _ => true,
        }
    }

    fn value(&mut self) -> Result<(), ParseError> {
        self.ws();
        let start = self.pos;
        match self.src.get(self.pos) {
            None => Err(self.err("EOF while parsing a value")),
            Some(b'{') => self.container(Kind::Obj),
            Some(b'[') => self.container(Kind::Arr),
            Some(b'"') => {
                let flags = self.string()?;
                self.push(Kind::Str, flags, start)?;
                Ok(())
            }
            Some(b't') => self.literal(b"true", Kind::Bool),
            Some(b'f') => self.literal(b"false", Kind::Bool),
            Some(b'n') => self.literal(b"null", Kind::Null),
            Some(b'-' | b'0'..=b'9') => {
                let flags = self.number()?;
                self.push(Kind::Num, flags, start)?;
                Ok(())
            }
            Some(_) => Err(self.err("expected value")),
        }
    }

    fn literal(&mut self, word: &'static [u8], kind: Kind) -> Result<(), ParseError> {
        let start = self.pos;
        if self.src.get(start..start + word.len()) != Some(word) {
            return Err(self.err("expected value"));
        }
        self.pos += word.len();
        self.push(kind, 0, start)?;
        Ok(())
    }

    fn digits(&mut self) -> usize {
        let from = self.pos;
        while let Some(b'0'..=b'9') = self.src.get(self.pos) {
            self.pos += 1;
        }
        self.pos - from
    }

    fn number(&mut self) -> Result<u8, ParseError> {
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
    fn string(&mut self) -> Result<u8, ParseError> {
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

    fn container(&mut self, kind: Kind) -> Result<(), ParseError> {
        if self.depth >= MAX_DEPTH {
            return Err(self.err("recursion limit exceeded"));
        }
        self.depth += 1;
        let start = self.pos;
        let idx = self.push(kind, 0, start)?;
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
                    let keep = self.indexed(key_start, flags);
                    if keep {
                        self.push(Kind::Str, flags, key_start)?;
                    }
                    self.ws();
                    if self.src.get(self.pos) != Some(&b':') {
                        return Err(self.err("expected ':'"));
                    }
                    self.pos += 1;
                    if !keep {
                        self.skipping += 1;
                        let r = self.value();
                        self.skipping -= 1;
                        r?;
                        self.ws();
                        match self.src.get(self.pos) {
                            Some(b',') => {
                                self.pos += 1;
                                continue;
                            }
                            Some(c) if *c == close => {
                                self.pos += 1;
                                break;
                            }
                            None => return Err(self.err("EOF while parsing a list or object")),
                            Some(_) => return Err(self.err("expected ',' or a closing bracket")),
                        }
                    }
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
        if idx != SKIPPED {
            let after = self.nodes.len() as u32;
            self.nodes.close(idx, after);
        }
        self.depth -= 1;
        Ok(())
    }
}
