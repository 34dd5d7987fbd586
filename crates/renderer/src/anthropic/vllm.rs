//! The chat vLLM makes of a Messages request (`AnthropicServingMessages.
//! to_chat_completion_request`, vllm 0.33.0), where it differs from SGLang's:
//! system texts joined with nothing and Claude Code's per-request
//! `x-anthropic-billing-header` block left out (it would defeat prefix
//! caching), empty text blocks dropped, prior thinking kept as `reasoning`, a
//! tool result's text joined by newlines with its images in a user message
//! after it and its tool references in a tool message of their own, an
//! assistant's tool result as Python prints its content. Pinned by
//! `tests/fixtures/anthropic/vllm_chat.json`, made by vLLM's own code.

use serde_json::{Map, Value as Json, json};

use super::{blocks_or_text, content, invalid, kind, role, tool_call, tools};
use crate::RenderError;
use crate::pyjson;

/// The block Claude Code puts first in its system prompt, different in every request.
const BILLING_HEADER: &str = "x-anthropic-billing-header";

/// `merge_inline_system`: the template refuses a system message after the first turn.
pub(super) fn chat_of(body: &Json, merge_inline_system: bool) -> Result<Json, RenderError> {
    let obj = body.as_object().ok_or_else(|| invalid("the request body must be a JSON object"))?;
    let messages = match obj.get("messages") {
        Some(Json::Array(m)) => m,
        _ => return Err(invalid("`messages` must be an array")),
    };
    let mut out: Vec<Json> = Vec::with_capacity(messages.len() + 1);

    let mut system = String::new();
    match obj.get("system") {
        None | Some(Json::Null) => {}
        Some(Json::String(s)) => system.push_str(s),
        Some(Json::Array(blocks)) => {
            for b in blocks {
                if kind(b)? == "text"
                    && let Some(t) = b.get("text").and_then(Json::as_str)
                    && !t.is_empty()
                    && !t.starts_with(BILLING_HEADER)
                {
                    system.push_str(t);
                }
            }
        }
        Some(_) => return Err(invalid("`system` must be a string or an array of blocks")),
    }
    if merge_inline_system {
        for m in messages.iter().filter(|m| role(m).is_ok_and(|r| r == "system")) {
            system.push_str(&system_text(content(m)?).unwrap_or_default());
        }
    }
    if !system.is_empty() {
        out.push(json!({"role": "system", "content": system}));
    }

    for m in messages {
        let role = role(m)?;
        if role == "system" {
            if !merge_inline_system && let Some(t) = system_text(content(m)?) {
                out.push(json!({"role": "system", "content": t}));
            }
            continue;
        }
        let Some(blocks) = blocks_or_text(m, role, &mut out)? else { continue };
        let (mut parts, mut calls, mut reasoning) = (Vec::new(), Vec::new(), String::new());
        let mut has_reasoning = false;
        for b in blocks {
            match kind(b)? {
                "text" => {
                    if let Some(t) = b.get("text").and_then(Json::as_str).filter(|t| !t.is_empty()) {
                        parts.push(json!({"type": "text", "text": t}));
                    }
                }
                "image" => {
                    // A source Python finds false (none, or an empty object) adds nothing.
                    if let Some(source) = b.get("source").filter(|s| s.as_object().is_some_and(|o| !o.is_empty())) {
                        parts.push(json!({"type": "image_url", "image_url": {"url": image_url(source)}}));
                    }
                }
                "thinking" => {
                    if let Some(t) = b.get("thinking").and_then(Json::as_str) {
                        reasoning.push_str(t);
                        has_reasoning = true;
                    }
                }
                // Tool additions and removals change the tool list, which is not followed here.
                "redacted_thinking" | "tool_reference" | "tool_addition" | "tool_removal" => {}
                "tool_use" => calls.push(tool_call(b)?),
                "tool_result" if role == "user" => user_tool_result(b, &mut out),
                "tool_result" => {
                    let text = match b.get("content") {
                        None | Some(Json::Null) => String::new(),
                        Some(Json::String(s)) => s.clone(),
                        Some(Json::Array(a)) if a.is_empty() => String::new(),
                        Some(other) => python_str(other),
                    };
                    parts.push(json!({"type": "text", "text": format!("Tool result: {text}")}));
                }
                other => return Err(invalid(&format!("unknown content block type `{other}`"))),
            }
        }
        let mut msg = Map::new();
        msg.insert("role".into(), role.into());
        if has_reasoning {
            msg.insert("reasoning".into(), reasoning.into());
        }
        if !calls.is_empty() {
            msg.insert("tool_calls".into(), Json::Array(calls));
        }
        if !parts.is_empty() {
            msg.insert("content".into(), super::collapse(parts));
        }
        if role != "user" || msg.contains_key("content") {
            out.push(Json::Object(msg));
        }
    }

    let mut chat = Map::new();
    chat.insert("messages".into(), Json::Array(out));
    let tools = tools(obj.get("tools"), super::Backend::Vllm)?;
    if !tools.is_empty() {
        chat.insert("tools".into(), Json::Array(tools));
    }
    Ok(Json::Object(chat))
}

/// An inline system message's text: a string as it is, text blocks joined with nothing;
/// the billing header left out either way; `None` when nothing is left.
fn system_text(content: &Json) -> Option<String> {
    let text = match content {
        Json::String(s) if s.starts_with(BILLING_HEADER) => return None,
        Json::String(s) => s.clone(),
        Json::Array(blocks) => blocks
            .iter()
            .filter(|b| b.get("type").and_then(Json::as_str) == Some("text"))
            .filter_map(|b| b.get("text").and_then(Json::as_str))
            .filter(|t| !t.is_empty() && !t.starts_with(BILLING_HEADER))
            .collect(),
        _ => return None,
    };
    (!text.is_empty()).then_some(text)
}

/// An image source as vLLM writes its URL: a `url` source's URL, else a base64 data URI.
fn image_url(source: &Json) -> String {
    let field = |k: &str, default: &str| source.get(k).and_then(Json::as_str).unwrap_or(default).to_string();
    if source.get("type").and_then(Json::as_str) == Some("url") {
        field("url", "")
    } else {
        format!("data:{};base64,{}", field("media_type", "image/jpeg"), field("data", ""))
    }
}

/// A user's tool result: a tool message of its text, then a user message of its images, then a
/// tool message of its tool references (each only when there are some, the first always).
fn user_tool_result(b: &Json, out: &mut Vec<Json>) {
    let id = b.get("tool_use_id").and_then(Json::as_str).unwrap_or("");
    let (mut texts, mut images, mut refs) = (Vec::new(), Vec::new(), Vec::new());
    let text = match b.get("content") {
        Some(Json::String(s)) => s.clone(),
        Some(Json::Array(items)) => {
            for item in items {
                match item.get("type").and_then(Json::as_str) {
                    Some("text") => texts.push(item.get("text").and_then(Json::as_str).unwrap_or("")),
                    Some("image") => {
                        let url = image_url(item.get("source").unwrap_or(&Json::Null));
                        if !url.is_empty() {
                            images.push(json!({"type": "image_url", "image_url": {"url": url}}));
                        }
                    }
                    Some("tool_reference") => refs.extend(super::tool_reference(item)),
                    _ => {}
                }
            }
            texts.join("\n")
        }
        _ => String::new(),
    };
    out.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
    if !images.is_empty() {
        out.push(json!({"role": "user", "content": images}));
    }
    if !refs.is_empty() {
        out.push(json!({"role": "tool", "tool_call_id": id, "content": refs}));
    }
}

/// Python's `str()` of a JSON value (its `repr` for lists and dicts).
fn python_str(v: &Json) -> String {
    let mut out = String::new();
    pyjson::py_str(&mut out, &minijinja::Value::from(minijinja::value::Serde(v)));
    out
}
