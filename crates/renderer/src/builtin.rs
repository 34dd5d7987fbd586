//! The built-in model: a byte-level tokenizer (one token per UTF-8 byte, ids
//! 0..=255, then three ChatML special tokens) and a ChatML template. Router and
//! simulated engines share it when no `--tokenizer-path` is given, so the demo
//! and the tests need no download.

use serde_json::{Map, Value as Json, json};

use crate::{CacheBounds, ChatTemplate, ChatTemplates, ModelConfig, RenderError, Renderer, TextTokenizer};

/// The special tokens after the 256 byte tokens, in id order.
pub const BUILTIN_SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// The built-in ChatML template (tools listed in a system preamble).
pub const BUILTIN_CHAT_TEMPLATE: &str = r#"{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- '# Tools\n' }}
{%- for tool in tools %}{{- tool | tojson + '\n' }}{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role != 'system' or not loop.first %}
{{- '<|im_start|>' + message.role + '\n' + message.content }}
{%- if message.tool_calls %}{%- for call in message.tool_calls %}{{- '\n<tool_call>\n' + call.function | tojson + '\n</tool_call>' }}{%- endfor %}{%- endif %}
{{- '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"#;

/// The `tokenizer.json` document of the built-in tokenizer.
pub fn builtin_tokenizer_json() -> String {
    let mut vocab = Map::new();
    for (id, c) in crate::fast_bpe::byte_chars().into_iter().enumerate() {
        vocab.insert(c.to_string(), json!(id));
    }
    let added: Vec<Json> = BUILTIN_SPECIAL_TOKENS
        .iter()
        .enumerate()
        .map(|(i, t)| {
            vocab.insert((*t).to_string(), json!(256 + i));
            json!({"id": 256 + i, "content": t, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": []}
    })
    .to_string()
}

// === impl Renderer ===

impl Renderer {
    /// The built-in byte-level model with its ChatML template.
    pub fn builtin() -> Result<Self, RenderError> {
        Self::builtin_with(CacheBounds::default())
    }

    /// [`Renderer::builtin`] with the tokenizer's caches bounded by `bounds`.
    pub fn builtin_with(bounds: CacheBounds) -> Result<Self, RenderError> {
        let tokenizer = TextTokenizer::from_bytes_with(builtin_tokenizer_json().as_bytes(), bounds)?;
        let mut special_tokens = Map::new();
        special_tokens.insert("eos_token".into(), Json::String("<|im_end|>".into()));
        let config =
            ModelConfig { templates: ChatTemplates::single(ChatTemplate::new(BUILTIN_CHAT_TEMPLATE)?), special_tokens };
        Ok(Renderer { builtin: true, ..Renderer::new(tokenizer, config) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ChatRequest;

    #[test]
    fn one_token_per_byte_and_specials_whole() {
        let r = Renderer::builtin().unwrap();
        let t = r.tokenizer();
        assert_eq!(t.vocab_size(), 259);
        assert_eq!(t.encode("Aé", false).unwrap(), vec![65, 0xc3, 0xa9]);
        assert_eq!(t.encode("<|im_start|>a<|im_end|>", false).unwrap(), vec![257, 97, 258]);
        assert_eq!(t.decode(&[72, 105, 0xc3, 0xa9], false).unwrap(), "Hié");
    }

    #[test]
    fn renders_chatml() {
        let r = Renderer::builtin().unwrap();
        let req = ChatRequest::from_value(&json!({"messages": [
            {"role": "system", "content": "S"}, {"role": "user", "content": "hi"}
        ]}))
        .unwrap();
        let out = r.render_chat(&req).unwrap();
        assert_eq!(
            out.text,
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(out.token_ids[0], 257);
        // Three starts and two ends are one token each; every other byte is one token.
        let specials = 3 * "<|im_start|>".len() + 2 * "<|im_end|>".len();
        assert_eq!(out.token_ids.len(), out.text.len() - specials + 5);
    }
}
