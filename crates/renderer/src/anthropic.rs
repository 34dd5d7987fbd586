//! Anthropic's Messages API (`POST /v1/messages`) as the engines see it: the
//! OpenAI chat request SGLang makes of a Messages request (its
//! `AnthropicServing._convert_to_chat_completion_request`, sglang 0.5.23), or
//! vLLM (`vllm.rs`), so the router renders, tokenizes and hashes the prompt
//! the engine will. Pinned by `tests/fixtures/anthropic/{sglang,vllm}_chat.json`,
//! made by the engines' own conversions (their generator beside them).
//!
//! What depends on SGLang's configuration is taken as a server without a
//! reasoning parser has it: prior `thinking` blocks are dropped (SGLang drops
//! them too unless its reasoning parser reads them), and a request asking for
//! `thinking` is rendered without it. Mid-conversation `system` messages stay
//! in place when the chat template takes them there, else they join the
//! leading system message (each engine's own probe of the template:
//! [`crate::Renderer::anthropic_chat`]).

use serde_json::{Map, Value as Json, json};

use crate::RenderError;
use crate::pyjson::{self, DumpOptions};

mod vllm;

/// The engine whose conversion of a Messages request to a chat the router mirrors (SGLang
/// Model Gateway's `--backend`): each turns the same request into a slightly different chat.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Backend {
    /// SGLang 0.5.23.
    #[default]
    Sglang,
    /// vLLM 0.33.0.
    Vllm,
}

/// The OpenAI chat request (`messages`, and `tools` when any) `backend` makes of the Anthropic
/// Messages request `body`; `inline_system` whether the engine leaves a system message after
/// the first turn in place (else it joins the leading one). A body SGLang refuses is refused
/// here too; vLLM's refusals are its own to answer.
pub fn chat_of(body: &Json, backend: Backend, inline_system: bool) -> Result<Json, RenderError> {
    match backend {
        Backend::Sglang => sglang_chat_of(body, inline_system),
        Backend::Vllm => vllm::chat_of(body, !inline_system),
    }
}

fn sglang_chat_of(body: &Json, inline_system: bool) -> Result<Json, RenderError> {
    let obj = body.as_object().ok_or_else(|| invalid("the request body must be a JSON object"))?;
    let messages = match obj.get("messages") {
        Some(Json::Array(m)) => m,
        _ => return Err(invalid("`messages` must be an array")),
    };
    let mut out: Vec<Json> = Vec::with_capacity(messages.len() + 1);

    // The system prompt: the request's, then (when the template cannot place them) the inline ones.
    let mut system: Vec<String> = Vec::new();
    match obj.get("system") {
        None | Some(Json::Null) => {}
        Some(Json::String(s)) if !s.trim().is_empty() => system.push(s.clone()),
        Some(Json::String(_)) => {}
        Some(Json::Array(blocks)) => {
            for b in blocks {
                if kind(b)? == "text"
                    && let Some(t) = text(b)?.filter(|t| !t.is_empty())
                {
                    system.push(t.to_string());
                }
            }
        }
        Some(_) => return Err(invalid("`system` must be a string or an array of blocks")),
    }
    if !inline_system {
        for m in messages.iter().filter(|m| role(m).is_ok_and(|r| r == "system")) {
            if let Some(t) = system_text(content(m)?)? {
                system.push(t);
            }
        }
    }
    if !system.is_empty() {
        out.push(json!({"role": "system", "content": system.join("\n")}));
    }

    for m in messages {
        let role = role(m)?;
        if role == "system" && !inline_system {
            continue;
        }
        let Some(blocks) = blocks_or_text(m, role, &mut out)? else { continue };
        let mut parts: Vec<Json> = Vec::new();
        let mut calls: Vec<Json> = Vec::new();
        if role == "assistant" && blocks.iter().any(|b| kind(b).is_ok_and(|k| k == "redacted_thinking")) {
            return Err(invalid("Anthropic redacted_thinking history is not supported"));
        }
        for b in blocks {
            match kind(b)? {
                // Prior reasoning: dropped without a reasoning parser (module doc).
                "thinking" | "redacted_thinking" => {}
                "text" => {
                    if let Some(t) = text(b)? {
                        parts.push(json!({"type": "text", "text": t}));
                    }
                }
                "image" => parts.extend(image_part(b.get("source"))),
                "search_result" => {
                    let t = search_text(b);
                    if !t.is_empty() {
                        parts.push(json!({"type": "text", "text": t}));
                    }
                }
                "tool_use" => calls.push(tool_call(b)?),
                "tool_result" => {
                    let (contents, joined) = tool_result(b.get("content"));
                    let id = [b.get("tool_use_id"), b.get("id")]
                        .into_iter()
                        .flatten()
                        .filter_map(Json::as_str)
                        .find(|s| !s.is_empty())
                        .unwrap_or("");
                    if role == "user" {
                        flush_user(&mut out, &mut parts);
                        for c in contents {
                            out.push(json!({"role": "tool", "content": c, "tool_call_id": id}));
                        }
                    } else {
                        parts.push(json!({"type": "text", "text": format!("Tool result: {joined}")}));
                    }
                }
                "tool_reference" => {}
                other => return Err(invalid(&format!("unknown content block type `{other}`"))),
            }
        }
        let mut msg = Map::new();
        msg.insert("role".into(), role.into());
        let had_parts = !parts.is_empty();
        if had_parts {
            msg.insert("content".into(), collapse(parts));
        }
        if !calls.is_empty() {
            msg.insert("tool_calls".into(), Json::Array(calls));
        } else if !had_parts {
            if role == "user" {
                continue; // a user turn of tool results only: its tool messages are out
            }
            msg.insert("content".into(), "".into()); // an empty assistant turn keeps its place
        }
        out.push(Json::Object(msg));
    }

    let mut chat = Map::new();
    chat.insert("messages".into(), Json::Array(out));
    let tools = tools(obj.get("tools"), Backend::Sglang)?;
    if !tools.is_empty() {
        chat.insert("tools".into(), Json::Array(tools));
    }
    Ok(Json::Object(chat))
}

fn invalid(message: &str) -> RenderError {
    RenderError::InvalidRequest(format!("messages request: {message}"))
}

fn role(m: &Json) -> Result<&str, RenderError> {
    match m.get("role").and_then(Json::as_str) {
        Some(r @ ("user" | "assistant" | "system")) => Ok(r),
        _ => Err(invalid("every message's `role` must be user, assistant or system")),
    }
}

fn content(m: &Json) -> Result<&Json, RenderError> {
    match m.get("content") {
        Some(c @ (Json::String(_) | Json::Array(_))) => Ok(c),
        _ => Err(invalid("every message's `content` must be a string or an array of blocks")),
    }
}

/// A message's content blocks; a string content is its message as it is, pushed to `out`.
fn blocks_or_text<'m>(m: &'m Json, role: &str, out: &mut Vec<Json>) -> Result<Option<&'m Vec<Json>>, RenderError> {
    match content(m)? {
        Json::Array(blocks) => Ok(Some(blocks)),
        text => {
            out.push(json!({"role": role, "content": text}));
            Ok(None)
        }
    }
}

fn kind(block: &Json) -> Result<&str, RenderError> {
    block.get("type").and_then(Json::as_str).ok_or_else(|| invalid("every content block needs a string `type`"))
}

/// A text block's text (SGLang's `TextBlock.text` is required: an absent one is refused).
fn text(block: &Json) -> Result<Option<&str>, RenderError> {
    match block.get("text") {
        Some(Json::String(t)) => Ok(Some(t)),
        _ => Err(invalid("a text block needs a string `text`")),
    }
}

/// One text part alone is the message's string content; else the parts.
fn collapse(mut parts: Vec<Json>) -> Json {
    if parts.len() == 1 && parts[0].get("type").and_then(Json::as_str) == Some("text") {
        parts.swap_remove(0).get_mut("text").map(Json::take).unwrap_or_default()
    } else {
        Json::Array(parts)
    }
}

/// The parts gathered before a tool result, as one user message (wire order kept).
fn flush_user(out: &mut Vec<Json>, parts: &mut Vec<Json>) {
    if !parts.is_empty() {
        out.push(json!({"role": "user", "content": collapse(std::mem::take(parts))}));
    }
}

/// A system message's text: trimmed, its text blocks trimmed and joined; `None` when empty.
fn system_text(content: &Json) -> Result<Option<String>, RenderError> {
    let texts: Vec<&str> = match content {
        Json::String(s) => vec![s.trim()],
        Json::Array(blocks) => blocks
            .iter()
            .filter(|b| b.get("type").and_then(Json::as_str) == Some("text"))
            .map(|b| b.get("text").and_then(Json::as_str).unwrap_or("").trim())
            .collect(),
        _ => Vec::new(),
    };
    let joined: Vec<&str> = texts.into_iter().filter(|t| !t.is_empty()).collect();
    Ok((!joined.is_empty()).then(|| joined.join("\n")))
}

/// An image block's source as an OpenAI `image_url` part (none for an empty one).
fn image_part(source: Option<&Json>) -> Option<Json> {
    let source = source?.as_object()?;
    let url = match source.get("type").and_then(Json::as_str) {
        Some("base64") => {
            let data = source.get("data").and_then(Json::as_str).filter(|d| !d.is_empty())?;
            let media = source.get("media_type").and_then(Json::as_str).unwrap_or("image/png");
            format!("data:{media};base64,{data}")
        }
        _ => source.get("url").and_then(Json::as_str).filter(|u| !u.is_empty())?.to_string(),
    };
    Some(json!({"type": "image_url", "image_url": {"url": url}}))
}

/// A search result as text: title, source, content lines.
fn search_text(item: &Json) -> String {
    let mut lines = Vec::new();
    if let Some(t) = item.get("title").and_then(Json::as_str).filter(|t| !t.is_empty()) {
        lines.push(format!("Title: {t}"));
    }
    match item.get("source") {
        Some(Json::Object(s)) => {
            let t =
                [s.get("url"), s.get("text")].into_iter().flatten().filter_map(Json::as_str).find(|t| !t.is_empty());
            if let Some(t) = t {
                lines.push(format!("Source: {t}"));
            }
        }
        Some(Json::String(s)) if !s.is_empty() => lines.push(format!("Source: {s}")),
        _ => {}
    }
    let content: Vec<&str> = match item.get("content") {
        Some(Json::String(s)) => vec![s.as_str()],
        Some(Json::Array(parts)) => parts
            .iter()
            .filter(|p| p.get("type").and_then(Json::as_str) == Some("text"))
            .filter_map(|p| p.get("text").and_then(Json::as_str))
            .filter(|t| !t.is_empty())
            .collect(),
        _ => Vec::new(),
    };
    if !content.is_empty() {
        lines.push(format!("Content: {}", content.join("\n")));
    }
    lines.join("\n")
}

/// A `tool_use` block as an OpenAI tool call; its input as Python's `json.dumps` writes it.
fn tool_call(b: &Json) -> Result<Json, RenderError> {
    let id = b.get("id").and_then(Json::as_str).ok_or_else(|| invalid("a tool_use block needs a string `id`"))?;
    let name = b.get("name").and_then(Json::as_str).ok_or_else(|| invalid("a tool_use block needs a string `name`"))?;
    let input = match b.get("input") {
        None | Some(Json::Null) => Json::Object(Map::new()),
        Some(i @ Json::Object(_)) => i.clone(),
        Some(_) => return Err(invalid("a tool_use block's `input` must be an object")),
    };
    let mut opts = DumpOptions::new(None);
    opts.ensure_ascii = true;
    let arguments =
        pyjson::dumps(&minijinja::Value::from(minijinja::value::Serde(&input)), &opts).map_err(|e| invalid(&e))?;
    let id = if id.is_empty() { "call_0" } else { id };
    Ok(json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}))
}

/// A tool result's content: the tool messages' contents (text alone as a string; runs of
/// tool references apart, as GLM's templates want them) and its text joined.
fn tool_result(content: Option<&Json>) -> (Vec<Json>, String) {
    let items = match content {
        Some(Json::Array(items)) => items,
        Some(Json::String(s)) => return (vec![Json::String(s.clone())], s.clone()),
        Some(Json::Null) | None => return (vec![Json::String(String::new())], String::new()),
        Some(other) => {
            let s = other.to_string();
            return (vec![Json::String(s.clone())], s);
        }
    };
    let (mut parts, mut texts) = (Vec::new(), Vec::new());
    for item in items {
        match item.get("type").and_then(Json::as_str) {
            Some("text") => {
                if let Some(t) = item.get("text").and_then(Json::as_str).filter(|t| !t.is_empty()) {
                    texts.push(t.to_string());
                    parts.push(json!({"type": "text", "text": t}));
                }
            }
            Some("image") => parts.extend(image_part(item.get("source"))),
            Some("tool_reference") => parts.extend(tool_reference(item)),
            Some("search_result") => {
                let t = search_text(item);
                if !t.is_empty() {
                    parts.push(json!({"type": "text", "text": t}));
                    texts.push(t);
                }
            }
            _ => {}
        }
    }
    let is_ref = |p: &Json| p.get("type").and_then(Json::as_str) == Some("tool_reference");
    let mut groups: Vec<Vec<Json>> = Vec::new();
    for p in parts {
        match groups.last_mut() {
            Some(g) if is_ref(&g[0]) == is_ref(&p) => g.push(p),
            _ => groups.push(vec![p]),
        }
    }
    let mut contents: Vec<Json> = groups
        .into_iter()
        .map(|g| {
            if g.len() == 1 && !is_ref(&g[0]) && g[0].get("type").and_then(Json::as_str) == Some("text") {
                g[0]["text"].clone()
            } else {
                Json::Array(g)
            }
        })
        .collect();
    if contents.is_empty() {
        contents.push(Json::String(String::new()));
    }
    (contents, texts.join("\n"))
}

/// A tool reference inside a tool result, by its name (Anthropic's `tool_name`, or `name`), as
/// the templates that expand them want it; none without a name.
fn tool_reference(item: &Json) -> Option<Json> {
    let name = [item.get("tool_name"), item.get("name")].into_iter().flatten().filter_map(Json::as_str);
    let name = name.into_iter().find(|n| !n.is_empty())?;
    Some(json!({"type": "tool_reference", "name": name}))
}

/// The custom tools as OpenAI function tools; Anthropic's server tools (web search, computer,
/// bash, text editor: no schema) are left out, as SGLang leaves them (vLLM refuses them). SGLang
/// always writes a description and `strict`; vLLM only the fields the tool has.
fn tools(tools: Option<&Json>, backend: Backend) -> Result<Vec<Json>, RenderError> {
    let list = match tools {
        None | Some(Json::Null) => return Ok(Vec::new()),
        Some(Json::Array(l)) => l,
        Some(_) => return Err(invalid("`tools` must be an array")),
    };
    let mut out = Vec::new();
    for t in list {
        let kind = t.get("type").and_then(Json::as_str).unwrap_or("custom");
        let server = ["web_search_", "computer_", "bash_", "text_editor_"].iter().any(|p| kind.starts_with(p));
        if server && backend == Backend::Sglang {
            continue;
        }
        let name = t.get("name").and_then(Json::as_str).ok_or_else(|| invalid("a tool needs a string `name`"))?;
        let mut schema = match t.get("input_schema") {
            Some(Json::Object(s)) => s.clone(),
            _ => return Err(invalid("a custom tool needs an object `input_schema`")),
        };
        if !schema.contains_key("type") {
            schema.insert("type".into(), "object".into());
        }
        let mut function = Map::new();
        function.insert("name".into(), name.into());
        let description = t.get("description").and_then(Json::as_str);
        let strict = t.get("strict").and_then(Json::as_bool);
        match backend {
            Backend::Sglang => {
                function.insert("description".into(), description.unwrap_or("").into());
                function.insert("parameters".into(), Json::Object(schema));
                function.insert("strict".into(), strict.unwrap_or(false).into());
            }
            Backend::Vllm => {
                if let Some(d) = description {
                    function.insert("description".into(), d.into());
                }
                function.insert("parameters".into(), Json::Object(schema));
                if let Some(s) = strict {
                    function.insert("strict".into(), s.into());
                }
            }
        }
        let defer = t.get("defer_loading").and_then(Json::as_bool);
        if let Some(d) = defer {
            function.insert("defer_loading".into(), d.into());
        }
        let mut tool = Map::new();
        tool.insert("type".into(), "function".into());
        tool.insert("function".into(), Json::Object(function));
        if let Some(d) = defer.filter(|_| backend == Backend::Sglang) {
            tool.insert("defer_loading".into(), d.into());
        }
        out.push(Json::Object(tool));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
