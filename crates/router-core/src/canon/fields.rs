//! Field readers: the members each dialect needs, read from the document as spans (a big
//! string is never unescaped or copied here), with the same refusals as serde-derived
//! structs (a repeated member, a wrong type).

use super::format::{invalid, is_str, wrong, CanonError, Field};
use crate::json::{Kind, Val};
use std::borrow::Cow;

/// Reads the members named in `names` from an object. A null member counts as absent and a
/// repeated name is refused, as the serde-derived structs this replaced did.
fn fields<'d, const N: usize>(
    obj: Val<'d>,
    names: &[&str; N],
    field: Field<'_>,
) -> Result<[Option<Val<'d>>; N], CanonError> {
    let mut out = [None; N];
    let mut seen = [false; N];
    for (k, v) in obj.members() {
        let key = k.text().map_err(|e| invalid(field(), e))?;
        if let Some(j) = names.iter().position(|n| *n == key) {
            if seen[j] {
                return Err(CanonError::Invalid {
                    field: field(),
                    message: format!("duplicate field `{}`", names[j]),
                });
            }
            seen[j] = true;
            if !v.is_null() {
                out[j] = Some(v);
            }
        }
    }
    Ok(out)
}

/// Every top-level member any dialect reads; the JSON reader indexes only these (the rest
/// of a body is validated, never indexed).
pub(crate) const BODY_FIELDS: [&str; 16] = [
    "model",
    "stream",
    "session_params",
    "messages",
    "tools",
    "functions",
    "documents",
    "chat_template",
    "chat_template_kwargs",
    "reasoning_effort",
    "prompt",
    "instructions",
    "input",
    "previous_response_id",
    "reasoning",
    "system",
];

/// Every top-level field any endpoint needs. Big strings stay spans of the body: the request
/// path never unescapes a 150 KB prompt.
pub(crate) struct Body<'d> {
    pub(crate) model: Option<Val<'d>>,
    pub(crate) stream: Option<Val<'d>>,
    pub(crate) session_params: Option<Val<'d>>,
    pub(crate) messages: Option<Vec<Msg<'d>>>,
    pub(crate) tools: Option<Val<'d>>,
    pub(crate) functions: Option<Val<'d>>,
    pub(crate) documents: Option<Val<'d>>,
    pub(crate) chat_template: Option<Val<'d>>,
    pub(crate) chat_template_kwargs: Option<Val<'d>>,
    pub(crate) reasoning_effort: Option<Val<'d>>,
    pub(crate) prompt: Option<Val<'d>>,
    pub(crate) instructions: Option<Val<'d>>,
    pub(crate) input: Option<Val<'d>>,
    pub(crate) previous_response_id: Option<Val<'d>>,
    pub(crate) reasoning: Option<Val<'d>>,
    pub(crate) system: Option<Val<'d>>,
}

impl<'d> Body<'d> {
    pub(crate) fn read(root: Val<'d>) -> Result<Body<'d>, CanonError> {
        let [model, stream, session_params, messages, tools, functions, documents, chat_template, chat_template_kwargs, reasoning_effort, prompt, instructions, input, previous_response_id, reasoning, system] =
            fields(root, &BODY_FIELDS, &|| "body".to_owned())?;
        // Messages are checked for every endpoint: a body with broken messages is broken.
        let messages = match messages {
            None => None,
            Some(m) if m.kind() == Kind::Arr => Some(
                m.items()
                    .enumerate()
                    .map(|(i, v)| Msg::read(v, i))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            Some(_) => return Err(wrong("messages", "an array")),
        };
        Ok(Body {
            model,
            stream,
            session_params,
            messages,
            tools,
            functions,
            documents,
            chat_template,
            chat_template_kwargs,
            reasoning_effort,
            prompt,
            instructions,
            input,
            previous_response_id,
            reasoning,
            system,
        })
    }

    pub(crate) fn chat_field(&self, name: &str) -> Option<Val<'d>> {
        match name {
            "tools" => self.tools,
            "functions" => self.functions,
            "documents" => self.documents,
            "chat_template" => self.chat_template,
            "chat_template_kwargs" => self.chat_template_kwargs,
            "reasoning_effort" => self.reasoning_effort,
            _ => None,
        }
    }
}

/// One chat message (also Anthropic messages).
pub(crate) struct Msg<'d> {
    pub(crate) role: Option<Val<'d>>,
    pub(crate) name: Option<Val<'d>>,
    pub(crate) content: Option<Val<'d>>,
    pub(crate) reasoning_content: Option<Val<'d>>,
    pub(crate) reasoning: Option<Val<'d>>,
    pub(crate) thinking: Option<Val<'d>>,
    pub(crate) tool_calls: Option<Val<'d>>,
    pub(crate) function_call: Option<Val<'d>>,
    pub(crate) tool_call_id: Option<Val<'d>>,
}

impl<'d> Msg<'d> {
    pub(crate) fn read(v: Val<'d>, i: usize) -> Result<Msg<'d>, CanonError> {
        if v.kind() != Kind::Obj {
            return Err(wrong(format!("messages[{i}]"), "an object"));
        }
        let [role, name, content, reasoning_content, reasoning, thinking, tool_calls, function_call, tool_call_id] =
            fields(
                v,
                &[
                    "role",
                    "name",
                    "content",
                    "reasoning_content",
                    "reasoning",
                    "thinking",
                    "tool_calls",
                    "function_call",
                    "tool_call_id",
                ],
                &|| format!("messages[{i}]"),
            )?;
        Ok(Msg {
            role,
            name,
            content,
            reasoning_content,
            reasoning,
            thinking,
            tool_calls,
            function_call,
            tool_call_id,
        })
    }
}

/// A content part or block, or a Responses input item.
pub(crate) struct Part<'d> {
    pub(crate) ty: Option<Val<'d>>,
    pub(crate) text: Option<Val<'d>>,
    pub(crate) thinking: Option<Val<'d>>,
    pub(crate) tool_use_id: Option<Val<'d>>,
    pub(crate) content: Option<Val<'d>>,
    pub(crate) call_id: Option<Val<'d>>,
    pub(crate) output: Option<Val<'d>>,
    pub(crate) role: Option<Val<'d>>,
}

impl<'d> Part<'d> {
    pub(crate) fn read(v: Val<'d>, field: Field<'_>) -> Result<Part<'d>, CanonError> {
        let [ty, text, thinking, tool_use_id, content, call_id, output, role] = fields(
            v,
            &[
                "type",
                "text",
                "thinking",
                "tool_use_id",
                "content",
                "call_id",
                "output",
                "role",
            ],
            field,
        )?;
        Ok(Part {
            ty,
            text,
            thinking,
            tool_use_id,
            content,
            call_id,
            output,
            role,
        })
    }
}

/// A string's decoded text.
pub(crate) fn str_of<'d>(v: Val<'d>, field: Field<'_>) -> Result<Cow<'d, str>, CanonError> {
    if !is_str(&v) {
        return Err(wrong(field(), "a string"));
    }
    v.text().map_err(|e| invalid(field(), e))
}

pub(crate) fn role_of<'d>(m: &Msg<'d>, field: Field<'_>) -> Result<Cow<'d, str>, CanonError> {
    match m.role {
        Some(r) => str_of(r, &|| format!("{}.role", field())),
        None => Err(CanonError::Missing("messages[].role")),
    }
}

pub(crate) fn is_system_role(role: &str) -> bool {
    role == "system" || role == "developer"
}
