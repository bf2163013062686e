//! OpenAI `/v1/chat/completions`: leading system turns, the template-rendered fields, then
//! the conversation.

use super::content::content;
use super::fields::{is_system_role, role_of, Body, Msg};
use super::format::{is_str, tag, wrong, CanonError, Sink, Writer};
use crate::json::Kind;

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

pub(crate) fn write(b: &Body<'_>, w: &mut Writer<impl Sink>) -> Result<(), CanonError> {
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
