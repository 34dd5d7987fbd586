//! Loading a model directory the way transformers does: `tokenizer.json`,
//! `tokenizer_config.json` (chat template as a string or a list of named
//! templates, special tokens as strings or `{"content": ...}` objects), and
//! `chat_template.jinja` / `chat_template.json` beside them.

use std::path::Path;

use serde_json::{Map, Value as Json};

use crate::RenderError;
use crate::template::ChatTemplate;

/// The template variables transformers adds from the special-tokens map.
const SPECIAL_TOKEN_KEYS: [&str; 7] =
    ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];

/// The chat templates of a model: one default, optionally a `tool_use` variant.
#[derive(Debug, Default)]
pub struct ChatTemplates {
    /// Used unless the request has tools and `tool_use` exists.
    pub default: Option<ChatTemplate>,
    /// transformers picks this one when the request carries tools.
    pub tool_use: Option<ChatTemplate>,
}

/// What a model directory provides besides the tokenizer.
#[derive(Debug, Default)]
pub struct ModelConfig {
    /// The chat templates found.
    pub templates: ChatTemplates,
    /// `bos_token`, `eos_token`, ... as template variables.
    pub special_tokens: Map<String, Json>,
}

// === impl ChatTemplates ===

impl ChatTemplates {
    /// One template for every request.
    pub fn single(template: ChatTemplate) -> Self {
        Self { default: Some(template), tool_use: None }
    }

    /// transformers' choice: `tool_use` when tools are given and it exists, else the default.
    pub fn select(&self, has_tools: bool) -> Option<&ChatTemplate> {
        match (&self.tool_use, has_tools) {
            (Some(t), true) => Some(t),
            _ => self.default.as_ref().or(self.tool_use.as_ref()),
        }
    }
}

// === impl ModelConfig ===

impl ModelConfig {
    /// Reads `dir`; `chat_template` (a file) overrides any template found there.
    pub fn load(dir: &Path, chat_template: Option<&Path>) -> Result<Self, RenderError> {
        let config_path = dir.join("tokenizer_config.json");
        let config: Map<String, Json> = match std::fs::read(&config_path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| RenderError::load(&config_path, e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Map::new(),
            Err(e) => return Err(RenderError::load(&config_path, e)),
        };
        let mut special_tokens = Map::new();
        for key in SPECIAL_TOKEN_KEYS {
            if let Some(text) = config.get(key).and_then(token_text) {
                special_tokens.insert(key.to_string(), Json::String(text));
            }
        }
        let templates = if let Some(path) = chat_template {
            ChatTemplates::single(ChatTemplate::new(&read_text(path)?)?)
        } else if let Some(src) = read_optional(&dir.join("chat_template.jinja"))? {
            ChatTemplates::single(ChatTemplate::new(&src)?)
        } else if let Some(t) = config.get("chat_template") {
            parse_templates(t, &config_path)?
        } else if let Some(src) = read_optional(&dir.join("chat_template.json"))? {
            let path = dir.join("chat_template.json");
            let doc: Json = serde_json::from_str(&src).map_err(|e| RenderError::load(&path, e))?;
            match doc.get("chat_template") {
                Some(t) => parse_templates(t, &path)?,
                None => ChatTemplates::default(),
            }
        } else {
            ChatTemplates::default()
        };
        Ok(Self { templates, special_tokens })
    }
}

/// A special token given as `"<s>"` or as `{"content": "<s>", ...}`.
fn token_text(v: &Json) -> Option<String> {
    match v {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_string),
        _ => None,
    }
}

fn parse_templates(value: &Json, path: &Path) -> Result<ChatTemplates, RenderError> {
    match value {
        Json::String(src) => Ok(ChatTemplates::single(ChatTemplate::new(src)?)),
        Json::Array(list) => {
            let mut out = ChatTemplates::default();
            for entry in list {
                let name = entry.get("name").and_then(Json::as_str);
                let src = entry.get("template").and_then(Json::as_str);
                match (name, src) {
                    (Some("default"), Some(src)) => out.default = Some(ChatTemplate::new(src)?),
                    (Some("tool_use"), Some(src)) => out.tool_use = Some(ChatTemplate::new(src)?),
                    (Some(_), Some(_)) => {}
                    _ => {
                        return Err(RenderError::load(path, "chat_template entries need `name` and `template`"));
                    }
                }
            }
            Ok(out)
        }
        Json::Null => Ok(ChatTemplates::default()),
        _ => Err(RenderError::load(path, "chat_template must be a string or a list of named templates")),
    }
}

pub(crate) fn read_text(path: &Path) -> Result<String, RenderError> {
    std::fs::read_to_string(path).map_err(|e| RenderError::load(path, e))
}

fn read_optional(path: &Path) -> Result<Option<String>, RenderError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(RenderError::load(path, e)),
    }
}
