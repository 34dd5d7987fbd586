//! Sentence embeddings for model selection (`docs/model-routing.md` §3): a
//! sentence-transformers model (all-MiniLM-L6-v2) loaded from its directory
//! and run with candle on the CPU (the `candle` feature; without it, loading
//! works and every embedding reports [`EmbedError::NotBuilt`]), on a bounded
//! pool of threads off the serving runtime with a bounded cache by text
//! hash. Owns the model and its pool; knows nothing of signals or requests.
//!
//! ```text
//! EmbedPool::embed(text) ─cache hit─▶ Lookup
//!        │ miss: try_send (full: Busy)
//!        ▼
//! dispatcher thread ─batch─▶ Encoder::embed_batch (tokenize, cut, BERT, mean pool, L2)
//!        └─▶ reply (oneshot) + cache insert
//! ```

#[cfg(feature = "candle")]
mod bert;
mod encoder;
#[cfg(feature = "candle")]
mod int8;
mod pool;
pub mod testing;

use std::sync::Arc;

pub use encoder::{DEFAULT_MAX_SEQ_LENGTH, Encoder, MAX_BYTES_PER_TOKEN, Precision, Tokenized};
pub use pool::{EmbedPool, Lookup, PoolConfig, Stats};

/// One text's embedding.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedded {
    /// Unit length (cosine similarity is the dot product).
    pub vector: Arc<[f32]>,
    /// Tokens the tokenizer read, [CLS] and [SEP] included.
    pub tokens: usize,
    /// Part of the text was not read (see [`Tokenized::truncated`]).
    pub truncated: bool,
}

/// Why a text has no embedding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmbedError {
    /// The model directory could not be loaded.
    #[error("embedding model: {0}")]
    Load(String),
    /// The router was built without the `embed` feature.
    #[error("this build has no embedding model (build with --features embed)")]
    NotBuilt,
    /// The tokenizer failed.
    #[error("embedding tokenizer: {0}")]
    Tokenize(String),
    /// The model failed.
    #[error("embedding model: {0}")]
    Model(String),
    /// The pool's queue is full: the request is not waited for.
    #[error("the embedding pool is full ({0} waiting)")]
    Busy(usize),
    /// No answer within the pool's timeout.
    #[error("no embedding within {0} ms")]
    Timeout(u64),
    /// The pool has stopped.
    #[error("the embedding pool has stopped")]
    Closed,
}
