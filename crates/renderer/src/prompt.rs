//! Prompts that are not chats: completions text, token-array prompts and
//! SGLang `/generate` `input_ids`, validated before they reach the hasher.

use serde_json::Value as Json;

use crate::RenderError;

/// A non-chat prompt as the client sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Text to tokenize (with the tokenizer's special tokens, as engines do).
    Text(String),
    /// Token ids passed through unchanged.
    Tokens(Vec<u32>),
}

// === impl Prompt ===

impl Prompt {
    /// `/v1/completions` `prompt`: a string, a token array, or a batch of one of them.
    pub fn from_completions(prompt: &Json, vocab_size: usize) -> Result<Self, RenderError> {
        match prompt {
            Json::String(s) => Ok(Prompt::Text(s.clone())),
            Json::Array(items) if items.first().is_some_and(Json::is_number) || items.is_empty() => {
                Ok(Prompt::Tokens(token_ids(items, vocab_size)?))
            }
            Json::Array(items) if items.len() == 1 => Self::from_completions(&items[0], vocab_size),
            Json::Array(_) => {
                Err(RenderError::InvalidRequest("batched prompts are not supported; send one prompt".into()))
            }
            _ => Err(RenderError::InvalidRequest("`prompt` must be a string or an array of token ids".into())),
        }
    }

    /// SGLang `/generate`: `input_ids` wins over `text`; one of them is required.
    pub fn from_generate(body: &Json, vocab_size: usize) -> Result<Self, RenderError> {
        match (body.get("input_ids"), body.get("text")) {
            (Some(Json::Array(ids)), _) => Ok(Prompt::Tokens(token_ids(ids, vocab_size)?)),
            (Some(Json::Null) | None, Some(Json::String(s))) => Ok(Prompt::Text(s.clone())),
            (Some(Json::Null) | None, None | Some(Json::Null)) => {
                Err(RenderError::InvalidRequest("`/generate` needs `text` or `input_ids`".into()))
            }
            (Some(_), _) => Err(RenderError::InvalidRequest("`input_ids` must be an array of token ids".into())),
            (_, Some(_)) => Err(RenderError::InvalidRequest("`text` must be a string".into())),
        }
    }
}

/// Validates a JSON array of token ids against the vocabulary.
pub fn token_ids(items: &[Json], vocab_size: usize) -> Result<Vec<u32>, RenderError> {
    items
        .iter()
        .enumerate()
        .map(|(position, v)| {
            let id: i128 = match v {
                Json::Number(n) => match (n.as_u64(), n.as_i64()) {
                    (Some(u), _) => i128::from(u),
                    (None, Some(i)) => i128::from(i),
                    _ => {
                        return Err(RenderError::InvalidRequest(format!(
                            "token at position {position} is not an integer"
                        )));
                    }
                },
                _ => {
                    return Err(RenderError::InvalidRequest(format!("token at position {position} is not an integer")));
                }
            };
            if id < 0 || id >= vocab_size as i128 {
                return Err(RenderError::TokenOutOfRange { id, position, vocab_size });
            }
            Ok(id as u32)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn completions_prompts() {
        assert_eq!(Prompt::from_completions(&json!("hi"), 10).unwrap(), Prompt::Text("hi".into()));
        assert_eq!(Prompt::from_completions(&json!([1, 2]), 10).unwrap(), Prompt::Tokens(vec![1, 2]));
        assert_eq!(Prompt::from_completions(&json!([[3]]), 10).unwrap(), Prompt::Tokens(vec![3]));
        assert!(matches!(
            Prompt::from_completions(&json!([1, 10]), 10),
            Err(RenderError::TokenOutOfRange { id: 10, position: 1, vocab_size: 10 })
        ));
        assert!(matches!(Prompt::from_completions(&json!([-1]), 10), Err(RenderError::TokenOutOfRange { .. })));
        assert!(Prompt::from_completions(&json!(["a", "b"]), 10).is_err());
        assert!(Prompt::from_completions(&json!({"x": 1}), 10).is_err());
        assert!(Prompt::from_completions(&json!([1.5]), 10).is_err());
    }

    #[test]
    fn generate_prompts() {
        assert_eq!(Prompt::from_generate(&json!({"text": "a"}), 10).unwrap(), Prompt::Text("a".into()));
        assert_eq!(
            Prompt::from_generate(&json!({"text": "a", "input_ids": [4]}), 10).unwrap(),
            Prompt::Tokens(vec![4])
        );
        assert!(Prompt::from_generate(&json!({}), 10).is_err());
        assert!(Prompt::from_generate(&json!({"input_ids": "x"}), 10).is_err());
    }
}
