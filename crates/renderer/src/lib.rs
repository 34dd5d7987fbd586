//! The renderer: a request in, exactly the token ids and SGLang page hashes
//! the engine will compute out. One token off and every later hash misses,
//! so each step mirrors the engines' own code and is pinned by golden tests
//! (`tests/fixtures/`, generated from SGLang and transformers).
//!
//! ```text
//! chat request ──chat.rs──► template vars ──template.rs──► text
//!      text ──tokenizer.rs (segment cache)──► token ids ──hash.rs──► block hashes
//! ```

pub mod anthropic;
mod builtin;
#[cfg(feature = "bundle")]
pub mod bundle;
mod chain_memo;
mod chat;
mod chatml;
pub mod detok;
mod error;
mod fast_bpe;
mod gpt_split;
pub mod hash;
pub mod lookahead;
mod model;
mod prompt;
mod pyjson;
mod strftime;
pub mod vision;
pub mod vllm_hash;
pub use strftime::strftime;
mod template;
mod tokenizer;

use std::path::Path;

use minijinja::Value;
use serde_json::{Map, Value as Json};

pub use builtin::{BUILTIN_CHAT_TEMPLATE, BUILTIN_SPECIAL_TOKENS, builtin_tokenizer_json};
pub use chain_memo::{ChainMemo, ChainMemoStats, DEFAULT_CHAIN_MEMO_PAGES};
pub use chat::ChatRequest;
pub use error::RenderError;
pub use fast_bpe::DEFAULT_WORD_CACHE_BYTES;
pub use hash::{HashError, HashMode, PageDigest, PageHasher};
pub use model::{ChatTemplates, ModelConfig};
pub use prompt::{Prompt, token_ids};

/// Python's `json.dumps(value, ensure_ascii=...)` of a JSON value (`", "` and `": "`
/// separators, keys in their order): what an engine's Python code writes.
pub fn python_json(value: &serde_json::Value, ensure_ascii: bool) -> String {
    let mut opts = pyjson::DumpOptions::new(None);
    opts.ensure_ascii = ensure_ascii;
    pyjson::dumps(&minijinja::Value::from(minijinja::value::Serde(value)), &opts).unwrap_or_else(|_| value.to_string())
}
pub use template::{ChatTemplate, ContentFormat, detect_content_format};
pub use tokenizer::{
    CacheBounds, CacheStats, DEFAULT_SEGMENT_CACHE_BYTES, DEFAULT_SEGMENT_CACHE_ENTRIES, SEGMENT_ENTRY_BYTES,
    TextTokenizer,
};

/// A rendered chat: the prompt text, its token ids and its images.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// The prompt as the template produced it.
    pub text: String,
    /// The ids the engine will see (`add_special_tokens = false`), each image's placeholder
    /// expanded as the engine expands it (a model with [`vision::VisionConfig`]).
    pub token_ids: Vec<u32>,
    /// The images, in order (empty without a vision config or images).
    pub mm: Vec<vision::MmItem>,
}

/// Tokenizer, chat templates and special tokens of one model.
#[derive(Debug)]
pub struct Renderer {
    tokenizer: TextTokenizer,
    config: ModelConfig,
    /// The built-in byte-level model (the router was given no tokenizer): it knows
    /// nothing of the engine's vocabulary.
    builtin: bool,
    /// The engine whose conversions it mirrors.
    backend: anthropic::Backend,
    /// The model's image settings, when it is a vision model the router expands images for.
    vision: Option<vision::VisionConfig>,
}

// === impl Renderer ===

impl Renderer {
    /// Loads a model directory (`tokenizer.json` required); `chat_template`
    /// overrides the directory's template.
    pub fn from_dir(dir: &Path, chat_template: Option<&Path>) -> Result<Self, RenderError> {
        Self::from_dir_with(dir, chat_template, CacheBounds::default())
    }

    /// [`Renderer::from_dir`] with the tokenizer's caches bounded by `bounds`.
    pub fn from_dir_with(dir: &Path, chat_template: Option<&Path>, bounds: CacheBounds) -> Result<Self, RenderError> {
        let tokenizer = TextTokenizer::from_file_with(&dir.join("tokenizer.json"), bounds)?;
        let config = ModelConfig::load(dir, chat_template)?;
        let vision = vision::VisionConfig::load(dir, tokenizer.token_to_id("<|image_pad|>"));
        Ok(Self { vision, ..Self::new(tokenizer, config) })
    }

    /// The same tokenizer with the chat template at `path` (`--chat-template` over the built-in
    /// model, which has no directory to name it).
    pub fn with_chat_template(mut self, path: &Path) -> Result<Self, RenderError> {
        self.config.templates = ChatTemplates::single(ChatTemplate::new(&model::read_text(path)?)?);
        Ok(self)
    }

    /// Builds from parts (the built-in tokenizer, tests).
    pub fn new(tokenizer: TextTokenizer, config: ModelConfig) -> Self {
        Self { tokenizer, config, builtin: false, backend: anthropic::Backend::Sglang, vision: None }
    }

    /// The largest token id a prompt's `input_ids` may hold, plus one: the tokenizer's
    /// vocabulary, or with the built-in model (no tokenizer given: the engine's vocabulary is
    /// unknown here) any 32-bit id, left for the engine to judge.
    pub fn prompt_vocab_size(&self) -> usize {
        if self.builtin { 1 << 32 } else { self.tokenizer.vocab_size() }
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }

    /// The same renderer, expanding images by `vision` (tests; a directory's
    /// `preprocessor_config.json` gives it otherwise).
    pub fn with_vision(mut self, vision: Option<vision::VisionConfig>) -> Self {
        self.vision = vision;
        self
    }

    /// The model's image settings, if images are expanded.
    pub fn vision(&self) -> Option<&vision::VisionConfig> {
        self.vision.as_ref()
    }

    /// The engine whose conversions this renderer mirrors (its Anthropic Messages requests).
    pub fn backend(&self) -> anthropic::Backend {
        self.backend
    }

    /// The same renderer, mirroring `backend`'s conversions.
    pub fn with_backend(mut self, backend: anthropic::Backend) -> Self {
        self.backend = backend;
        self
    }

    /// The chat the engine makes of the Anthropic Messages request `body`, by its own rule for
    /// system messages after the first turn: SGLang keeps them in place when its default
    /// template shows them there; vLLM unless one of its templates raises on them.
    pub fn anthropic_chat(&self, body: &Json) -> Result<Json, RenderError> {
        let t = &self.config.templates;
        let inline = match self.backend {
            anthropic::Backend::Sglang => t.select(false).is_some_and(ChatTemplate::supports_inline_system),
            anthropic::Backend::Vllm => {
                t.default.is_some()
                    && [&t.default, &t.tool_use].into_iter().flatten().all(ChatTemplate::takes_inline_system)
            }
        };
        anthropic::chat_of(body, self.backend, inline)
    }

    /// The chat template's output for `req`.
    pub fn render_text(&self, req: &ChatRequest) -> Result<String, RenderError> {
        let has_tools = req.tools.as_ref().is_some_and(|t| !t.is_empty());
        let template = self.config.templates.select(has_tools).ok_or(RenderError::MissingTemplate)?;
        // The built-in ChatML template, for a request it renders alike, without the template engine.
        if template.is_builtin_chatml()
            && let Some(text) = chatml::render(req)
        {
            return match req.continue_final_message {
                Some(true) => chat::cut_after_final_message(&text, &req.final_text()?),
                _ => Ok(text),
            };
        }
        self.templated(template, req)
    }

    /// [`Renderer::render_text`] through the template engine, whatever the template.
    #[cfg(test)]
    pub(crate) fn render_text_templated(&self, req: &ChatRequest) -> Result<String, RenderError> {
        let has_tools = req.tools.as_ref().is_some_and(|t| !t.is_empty());
        let template = self.config.templates.select(has_tools).ok_or(RenderError::MissingTemplate)?;
        self.templated(template, req)
    }

    /// `req` rendered by `template` with the template engine.
    fn templated(&self, template: &ChatTemplate, req: &ChatRequest) -> Result<String, RenderError> {
        let input = req.template_input(template.content_format())?;
        let mut vars: Map<String, Json> = self.config.special_tokens.clone();
        vars.extend(input.vars);
        let text = template.render(Value::from(minijinja::value::Serde(&vars)))?;
        match input.continue_text {
            Some(last) => chat::cut_after_final_message(&text, &last),
            None => Ok(text),
        }
    }

    /// Renders and tokenizes a chat request as the engine does.
    pub fn render_chat(&self, req: &ChatRequest) -> Result<Rendered, RenderError> {
        let text = self.render_text(req)?;
        let mut token_ids = self.tokenizer.encode(&text, false)?;
        let mm = match &self.vision {
            Some(v) => v.expand(&req.messages, req.has_mm_options(), &mut token_ids),
            None => Vec::new(),
        };
        Ok(Rendered { text, token_ids, mm })
    }

    /// Token ids of a non-chat prompt (text gets the tokenizer's special tokens, like the engines).
    pub fn prompt_tokens(&self, prompt: &Prompt) -> Result<Vec<u32>, RenderError> {
        match prompt {
            Prompt::Text(text) => self.tokenizer.encode(text, true),
            Prompt::Tokens(ids) => Ok(ids.clone()),
        }
    }
}
