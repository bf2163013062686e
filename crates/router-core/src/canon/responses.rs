//! OpenAI `/v1/responses`: instructions, prompt-shaping fields, then the input items.

use super::content::content;
use super::fields::{str_of, Body, Part};
use super::format::{is_str, tag, wrong, CanonError, Sink, Writer};
use crate::json::Kind;
use std::borrow::Cow;

pub(crate) fn write(b: &Body<'_>, w: &mut Writer<impl Sink>) -> Result<(), CanonError> {
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
