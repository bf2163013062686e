//! Anthropic `/v1/messages`: system, tools (without cache-control markers), then the
//! messages and their content blocks.

use super::content::{content, other_part};
use super::fields::{role_of, str_of, Body, Part};
use super::format::{invalid, is_str, tag, wrong, CanonError, Sink, Writer};
use crate::json::Kind;
use std::borrow::Cow;

pub(crate) fn write(b: &Body<'_>, w: &mut Writer<impl Sink>) -> Result<(), CanonError> {
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
