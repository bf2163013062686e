//! String and number spelling: decoding escapes to text, re-escaping to serde_json's
//! canonical form, and serde_json's spelling of numbers.

use super::tree::{DecodeError, PLAIN_INT};

/// serde_json's spelling of a number: integers that fit 64 bits as written, everything
/// else through its own parser and formatter so the digits match exactly.
pub(super) fn write_number(raw: &[u8], flags: u8, out: &mut Vec<u8>) -> Result<(), DecodeError> {
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

pub(super) fn hex4(b: &[u8]) -> Option<u32> {
    let mut v = 0u32;
    for &c in b.get(..4)? {
        v = v * 16 + (c as char).to_digit(16)?;
    }
    Some(v)
}

/// Decodes a validated string body into `out`: as UTF-8 text, or (`canonical`) re-escaped
/// the way serde_json writes strings (`\"`, `\\`, `\b \f \n \r \t`, other control characters
/// as lowercase `\u00xx`, everything else literal).
pub(super) fn decode(inner: &[u8], out: &mut Vec<u8>, canonical: bool) -> Result<(), DecodeError> {
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
