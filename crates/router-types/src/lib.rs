//! The router's shared vocabulary: identifiers, hashes, storage tiers and the
//! normalized KV event that every layer speaks.
//!
//! This crate owns no behaviour beyond parsing and formatting; it depends on
//! `serde` only so that every other crate can use it.

mod event;
mod ids;
pub mod metrics;
mod rng;

pub use event::{EngineBlockHash, EventBatch, KvEvent, StoredBlocks};
pub use ids::{
    BlockHash, Bootstrap, DpRank, Load, Namespace, PageDigest, PoolId, Role, Tier, TokenCount, UrlError, WorkerId,
    WorkerKey, WorkerUrl,
};
pub use rng::SplitMix;
