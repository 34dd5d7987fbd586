//! OpenAI chat-completions requests → the variables of a chat template, the
//! way SGLang's Jinja path and transformers' `apply_chat_template` build them.
//!
//! Owns: message normalization (null keys dropped, null content → `""`,
//! content parts flattened or kept by the template's content format), tools,
//! the generation-prompt flags, `chat_template_kwargs`, and the
//! `continue_final_message` cut. Does not own tokenization.

use serde::Deserialize;
use serde_json::{Map, Value as Json};

use crate::RenderError;
use crate::template::ContentFormat;

/// The parts of a chat-completions body that change the prompt. Every other
/// field (sampling, stream, ...) is ignored here.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ChatRequest {
    /// The conversation; each message keeps all its keys (`name`,
    /// `tool_calls`, `reasoning_content`, ...) for the template.
    pub messages: Vec<Map<String, Json>>,
    /// Tool definitions as sent (`{"type": "function", "function": {...}}`).
    #[serde(default)]
    pub tools: Option<Vec<Json>>,
    /// Append the assistant header (default true).
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    /// Leave the last (assistant) message open for the model to continue (default false).
    #[serde(default)]
    pub continue_final_message: Option<bool>,
    /// Extra template variables (`enable_thinking`, ...).
    #[serde(default)]
    pub chat_template_kwargs: Option<Map<String, Json>>,
    /// vLLM's per-request multimodal processor options (they change images' placeholders and
    /// identifiers).
    #[serde(default)]
    pub mm_processor_kwargs: Option<Map<String, Json>>,
    /// vLLM's per-request media loading options (idem).
    #[serde(default)]
    pub media_io_kwargs: Option<Map<String, Json>>,
}

/// The template's variables and what to do with its output.
#[derive(Debug, Clone)]
pub(crate) struct TemplateInput {
    pub(crate) vars: Map<String, Json>,
    /// The final message's text to cut after, when continuing it.
    pub(crate) continue_text: Option<String>,
}

// === impl ChatRequest ===

impl ChatRequest {
    /// The request carries multimodal processor or media options.
    pub fn has_mm_options(&self) -> bool {
        [&self.mm_processor_kwargs, &self.media_io_kwargs].iter().any(|o| o.as_ref().is_some_and(|m| !m.is_empty()))
    }

    /// Parses a request body; an error names the field that is wrong.
    pub fn from_json(body: &[u8]) -> Result<Self, RenderError> {
        // serde_json checks UTF-8 only in the strings it keeps: a body with
        // invalid bytes in a field it skips would pass here and be refused by
        // the engine (found by the `chat_render` fuzz target).
        if let Err(e) = std::str::from_utf8(body) {
            return Err(RenderError::InvalidRequest(format!("chat request: not UTF-8 at byte {}", e.valid_up_to())));
        }
        let req: ChatRequest =
            serde_json::from_slice(body).map_err(|e| RenderError::InvalidRequest(format!("chat request: {e}")))?;
        req.validate()?;
        Ok(req)
    }

    /// Parses an already-decoded JSON body.
    pub fn from_value(body: &Json) -> Result<Self, RenderError> {
        let req =
            ChatRequest::deserialize(body).map_err(|e| RenderError::InvalidRequest(format!("chat request: {e}")))?;
        req.validate()?;
        Ok(req)
    }

    fn validate(&self) -> Result<(), RenderError> {
        if self.messages.is_empty() {
            return Err(RenderError::InvalidRequest("`messages` must not be empty".into()));
        }
        for (i, m) in self.messages.iter().enumerate() {
            match m.get("role") {
                Some(Json::String(_)) => {}
                _ => {
                    return Err(RenderError::InvalidRequest(format!("messages[{i}].role must be a string")));
                }
            }
            match m.get("content") {
                None | Some(Json::Null | Json::String(_) | Json::Array(_)) => {}
                Some(_) => {
                    return Err(RenderError::InvalidRequest(format!(
                        "messages[{i}].content must be a string, an array of parts or null"
                    )));
                }
            }
        }
        if self.continue_final_message == Some(true) && self.add_generation_prompt == Some(true) {
            return Err(RenderError::InvalidRequest(
                "continue_final_message and add_generation_prompt cannot both be true".into(),
            ));
        }
        Ok(())
    }

    /// The final message's text, which `continue_final_message` leaves open (string contents
    /// only: the direct ChatML rendering takes no others).
    pub(crate) fn final_text(&self) -> Result<String, RenderError> {
        match self.messages.last().and_then(|m| m.get("content")) {
            Some(Json::String(s)) => Ok(s.clone()),
            // As the template's variables have it: a null or absent content is "".
            None | Some(Json::Null) => Ok(String::new()),
            Some(_) => Err(RenderError::InvalidRequest("continue_final_message: content parts".into())),
        }
    }

    /// The template variables for this request (special tokens are added by the caller).
    pub(crate) fn template_input(&self, format: ContentFormat) -> Result<TemplateInput, RenderError> {
        let messages: Vec<Json> = self.messages.iter().map(|m| Json::Object(normalize_message(m, format))).collect();
        let continuing = self.continue_final_message.unwrap_or(false);
        let continue_text = if continuing { Some(final_text(&messages)?) } else { None };

        let mut vars = Map::new();
        if let Some(kwargs) = &self.chat_template_kwargs {
            for (k, v) in kwargs {
                vars.insert(k.clone(), v.clone());
            }
        }
        vars.insert("messages".into(), Json::Array(messages));
        vars.insert("tools".into(), self.tools.clone().map_or(Json::Null, Json::Array));
        vars.insert("documents".into(), Json::Null);
        let agp = if continuing { false } else { self.add_generation_prompt.unwrap_or(true) };
        vars.insert("add_generation_prompt".into(), Json::Bool(agp));
        Ok(TemplateInput { vars, continue_text })
    }
}

/// Drops null-valued keys, turns null content into `""`, and flattens or keeps content parts.
fn normalize_message(message: &Map<String, Json>, format: ContentFormat) -> Map<String, Json> {
    let mut out = Map::with_capacity(message.len());
    for (k, v) in message {
        if k == "content" {
            out.insert(k.clone(), normalize_content(v, format));
        } else if !v.is_null() {
            out.insert(k.clone(), v.clone());
        }
    }
    if !out.contains_key("content") {
        out.insert("content".into(), Json::String(String::new()));
    }
    out
}

fn normalize_content(content: &Json, format: ContentFormat) -> Json {
    let Json::Array(parts) = content else {
        return if content.is_null() { Json::String(String::new()) } else { content.clone() };
    };
    let is_text = |p: &Json| matches!(p.get("type").and_then(Json::as_str), Some("text" | "input_text"));
    match format {
        ContentFormat::String => {
            let texts: Vec<&str> =
                parts.iter().filter(|p| is_text(p)).filter_map(|p| p.get("text")?.as_str()).collect();
            Json::String(texts.join(" "))
        }
        ContentFormat::OpenAi => Json::Array(
            parts
                .iter()
                .filter_map(|p| match p.get("type").and_then(Json::as_str) {
                    Some("text" | "input_text") => Some(serde_json::json!({"type": "text", "text": p.get("text")?})),
                    Some("image_url" | "input_image") => Some(serde_json::json!({"type": "image"})),
                    Some("video_url") => Some(serde_json::json!({"type": "video"})),
                    Some("audio_url") => Some(serde_json::json!({"type": "audio"})),
                    _ => None,
                })
                .collect(),
        ),
    }
}

/// The text of the final message, which `continue_final_message` leaves open.
fn final_text(messages: &[Json]) -> Result<String, RenderError> {
    let last = messages.last().and_then(|m| m.get("content"));
    match last {
        Some(Json::String(s)) => Ok(s.clone()),
        Some(Json::Array(parts)) => {
            parts.iter().rev().find_map(|p| p.get("text").and_then(Json::as_str)).map(str::to_string).ok_or_else(|| {
                RenderError::InvalidRequest("continue_final_message: the final message has no text".into())
            })
        }
        _ => Err(RenderError::InvalidRequest("continue_final_message: the final message has no content".into())),
    }
}

/// transformers' cut for `continue_final_message`: end the prompt right after
/// the final message's text, keeping its trailing whitespace only if the
/// template kept it.
pub(crate) fn cut_after_final_message(rendered: &str, final_message: &str) -> Result<String, RenderError> {
    let stripped = final_message.trim();
    let Some(loc) = rendered.rfind(stripped) else {
        return Err(RenderError::InvalidRequest(
            "continue_final_message is set but the final message does not appear in the rendered chat".into(),
        ));
    };
    let lstripped = final_message.trim_start();
    let end =
        if rendered[loc..].starts_with(lstripped) && rendered.get(loc..loc + lstripped.len()) == Some(final_message) {
            loc + lstripped.len()
        } else {
            loc + stripped.len()
        };
    Ok(rendered[..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(json: serde_json::Value) -> ChatRequest {
        ChatRequest::from_value(&json).unwrap()
    }

    #[test]
    fn nulls_are_dropped_and_parts_joined_for_string_templates() {
        let r = req(serde_json::json!({"messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "b"}], "name": null},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "1"}]}
        ]}));
        let input = r.template_input(ContentFormat::String).unwrap();
        assert_eq!(
            input.vars["messages"],
            serde_json::json!([{"role": "user", "content": "a b"}, {"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}])
        );
        assert_eq!(input.vars["add_generation_prompt"], true);
        assert_eq!(input.vars["tools"], Json::Null);
        let input = r.template_input(ContentFormat::OpenAi).unwrap();
        assert_eq!(
            input.vars["messages"][0]["content"],
            serde_json::json!([{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}])
        );
    }

    #[test]
    fn bad_requests_name_the_field() {
        let err = ChatRequest::from_json(br#"{"messages": [{"content": "x"}]}"#).unwrap_err();
        assert!(err.to_string().contains("messages[0].role"), "{err}");
        let err = ChatRequest::from_json(br#"{"messages": []}"#).unwrap_err();
        assert!(err.to_string().contains("must not be empty"));
        let err = ChatRequest::from_json(b"{not json").unwrap_err();
        assert_eq!(err.kind(), "invalid_request");
        let err = ChatRequest::from_json(br#"{"messages": [{"role": "user", "content": 5}]}"#).unwrap_err();
        assert!(err.to_string().contains("messages[0].content"));
        // Invalid UTF-8 in a field the request type skips (found by the chat_render fuzz target).
        let err = ChatRequest::from_json(
            b"{\"model\": \"aut\x91\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
        )
        .unwrap_err();
        assert!(err.to_string().contains("not UTF-8 at byte 14"), "{err}");
    }

    #[test]
    fn continue_final_message_cuts_after_the_text() {
        // The template trimmed the trailing space: cut after the stripped text.
        let rendered = "<u>hi</u><a>Once upon</a>";
        assert_eq!(cut_after_final_message(rendered, "Once upon ").unwrap(), "<u>hi</u><a>Once upon");
        // The template kept it: keep it too.
        let rendered = "<a>Once upon </a>";
        assert_eq!(cut_after_final_message(rendered, "Once upon ").unwrap(), "<a>Once upon ");
        assert!(cut_after_final_message("<a></a>", "missing").is_err());
    }
}
