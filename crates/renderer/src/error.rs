//! The renderer's one error type, with a stable `kind()` per variant and the
//! side (client or server configuration) each error belongs to.

use std::path::PathBuf;

/// Everything that can go wrong turning a request into tokens and hashes.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// The request body is not what the route expects (a client error).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A token id in pre-tokenized input is outside the vocabulary or negative.
    #[error("token id {id} at position {position} is out of range (vocabulary size {vocab_size})")]
    TokenOutOfRange {
        /// The offending id, as given.
        id: i128,
        /// Its index in the input.
        position: usize,
        /// The tokenizer's vocabulary size including added tokens.
        vocab_size: usize,
    },
    /// The chat template called `raise_exception` (the request is not renderable: a client error).
    #[error("chat template rejected the request: {message} (template line {line})")]
    TemplateRaised {
        /// The message the template raised.
        message: String,
        /// 1-based line of the template where it was raised (0 if unknown).
        line: usize,
    },
    /// The chat template failed to compile or to render.
    #[error("chat template error at line {line}: {message}")]
    Template {
        /// What went wrong, as minijinja reports it.
        message: String,
        /// 1-based line of the template (0 if unknown).
        line: usize,
    },
    /// No chat template is configured for a chat request.
    #[error("no chat template: the tokenizer directory has none and no --chat-template was given")]
    MissingTemplate,
    /// A model file could not be read or parsed.
    #[error("cannot load {path}: {message}")]
    Load {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The tokenizer failed on the input.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    /// The page-hash chain rejected the tokens.
    #[error(transparent)]
    Hash(#[from] crate::hash::HashError),
}

// === impl RenderError ===

impl RenderError {
    /// A stable label for metrics, logs and the JSON `error.type`.
    pub fn kind(&self) -> &'static str {
        match self {
            RenderError::InvalidRequest(_) => "invalid_request",
            RenderError::TokenOutOfRange { .. } => "token_out_of_range",
            RenderError::TemplateRaised { .. } => "template_raised",
            RenderError::Template { .. } => "template_error",
            RenderError::MissingTemplate => "missing_template",
            RenderError::Load { .. } => "load_error",
            RenderError::Tokenizer(_) => "tokenizer_error",
            RenderError::Hash(_) => "hash_error",
        }
    }

    /// True when the client's request caused it (HTTP 400), false for the
    /// router's own configuration or a bug (HTTP 500).
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            RenderError::InvalidRequest(_)
                | RenderError::TokenOutOfRange { .. }
                | RenderError::TemplateRaised { .. }
                | RenderError::Hash(_)
        )
    }

    pub(crate) fn load(path: impl Into<PathBuf>, message: impl ToString) -> Self {
        RenderError::Load { path: path.into(), message: message.to_string() }
    }
}
