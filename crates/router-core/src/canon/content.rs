//! Message content, shared by the chat, Responses and Anthropic dialects.

use super::fields::{str_of, Part};
use super::format::{is_str, tag, wrong, CanonError, Field, Sink, Writer};
use crate::json::{Kind, Val};
use std::borrow::Cow;

/// Message content: a string, null, or a list of parts. Text parts become text records, so
/// `"hi"` and `[{"type":"text","text":"hi"}]` are the same prompt; other parts (images,
/// audio, files) are kept as canonical JSON, minus Anthropic's `cache_control` markers.
pub(crate) fn content(
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
pub(crate) fn other_part(
    p: Val<'_>,
    field: Field<'_>,
    w: &mut Writer<impl Sink>,
) -> Result<(), CanonError> {
    w.json(tag::PART, p, field, &["cache_control"])
}
