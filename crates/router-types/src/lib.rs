//! The router's shared vocabulary: identifiers, hashes, storage tiers and the
//! normalized KV event that every layer speaks.
//!
//! This crate owns no behaviour beyond parsing and formatting; it depends on
//! `serde` only so that every other crate can use it.

mod event;
mod ids;
pub mod metrics;
pub mod opaque;
mod rng;

pub use event::{EngineBlockHash, EventBatch, GroupKind, KvEvent, MAX_LOOKAHEAD_TOKENS, StoredBlocks};
pub use ids::{
    BlockHash, Bootstrap, DpRank, Load, Namespace, PageDigest, PoolId, Role, Tier, TokenCount, UrlError, Warmup,
    WorkerId, WorkerKey, WorkerUrl,
};
pub use rng::SplitMix;

/// The prefill rate (prompt tokens a second) a pool is assumed to have when its config states
/// none: an 8B model on one GPU.
pub const DEFAULT_PREFILL_TOKENS_PER_S: f64 = 20_000.0;
