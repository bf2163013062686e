//! OpenAI `/v1/completions`: a prompt string or token ids (a batch routes by its first).

use super::fields::Body;
use super::format::{tag, wrong, CanonError, Field, Sink, Writer};
use crate::json::{Kind, Val};

pub(crate) fn write(b: &Body<'_>, w: &mut Writer<impl Sink>) -> Result<(), CanonError> {
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
