//! `smg.grpc.common`: KV cache events and the engine's pushed load records
//! (`SubscribeKvEvents`), the tokenizer's artifacts (`GetTokenizer`).

/// `GetTokenizerRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetTokenizerRequest {}

/// `GetTokenizerChunk`: the tokenizer's files as one zip, in chunks; the last carries its SHA-256.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetTokenizerChunk {
    #[prost(bytes = "vec", tag = "1")]
    pub data: Vec<u8>,
    #[prost(string, tag = "2")]
    pub sha256: String,
}

/// `SubscribeKvEventsRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SubscribeKvEventsRequest {
    /// Resume after this sequence number (0: from the current state).
    #[prost(uint64, tag = "1")]
    pub start_sequence_number: u64,
    /// Load records before the publisher's first batch (`load_only` batches numbered 0).
    #[prost(bool, tag = "2")]
    pub load_records_before_first_batch: bool,
}

/// `KvEventBatch`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KvEventBatch {
    #[prost(uint64, tag = "1")]
    pub sequence_number: u64,
    #[prost(double, tag = "2")]
    pub timestamp: f64,
    #[prost(message, repeated, tag = "3")]
    pub events: Vec<KvCacheEvent>,
    #[prost(int32, optional, tag = "4")]
    pub dp_rank: Option<i32>,
    /// Set on each chunk of a relay's state snapshot.
    #[prost(message, optional, tag = "7")]
    pub snapshot: Option<KvSnapshotChunk>,
    /// The engine's load as the servicer knew it when it sent the batch.
    #[prost(message, optional, tag = "8")]
    pub load: Option<EngineLoad>,
}

/// `EngineLoad`: the routing core of the servicer's load record.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EngineLoad {
    #[prost(uint32, tag = "1")]
    pub running_requests: u32,
    #[prost(uint32, tag = "2")]
    pub waiting_requests: u32,
    /// Prompt tokens of waiting requests not served from the prefix cache.
    #[prost(uint32, optional, tag = "3")]
    pub waiting_uncached_tokens: Option<u32>,
    #[prost(double, tag = "4")]
    pub token_usage: f64,
    #[prost(double, tag = "5")]
    pub gen_throughput: f64,
    #[prost(uint32, tag = "6")]
    pub max_running_requests: u32,
    #[prost(uint32, tag = "7")]
    pub age_ms: u32,
    /// Monotonic per stream.
    #[prost(uint64, tag = "8")]
    pub sample: u64,
    /// The batch carries no events and repeats the stream's last sequence number.
    #[prost(bool, tag = "9")]
    pub load_only: bool,
}

/// `KvSnapshotChunk`: one chunk of a relay's state snapshot.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KvSnapshotChunk {
    #[prost(uint32, tag = "1")]
    pub index: u32,
    #[prost(uint32, tag = "2")]
    pub count: u32,
    #[prost(uint64, tag = "3")]
    pub blocks: u64,
    #[prost(uint64, tag = "4")]
    pub unknown_before: u64,
}

/// `KvCacheEvent`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KvCacheEvent {
    #[prost(uint64, tag = "1")]
    pub event_id: u64,
    #[prost(oneof = "KvEventData", tags = "2, 3, 4")]
    pub data: Option<KvEventData>,
}

/// `KvCacheEvent.data`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum KvEventData {
    #[prost(message, tag = "2")]
    Stored(KvBlocksStored),
    #[prost(message, tag = "3")]
    Removed(KvBlocksRemoved),
    #[prost(message, tag = "4")]
    Cleared(KvCacheCleared),
}

/// `KvBlocksStored`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KvBlocksStored {
    #[prost(message, repeated, tag = "1")]
    pub blocks: Vec<KvBlock>,
    #[prost(int64, optional, tag = "2")]
    pub parent_block_hash: Option<i64>,
    /// `KvCacheTier`: 1 device, 2 host, 3 disk, 4 external.
    #[prost(int32, optional, tag = "3")]
    pub tier: Option<i32>,
    #[prost(string, optional, tag = "4")]
    pub medium: Option<String>,
    #[prost(uint32, optional, tag = "5")]
    pub group_idx: Option<u32>,
    /// vLLM's `kv_cache_spec_kind` of the group.
    #[prost(string, optional, tag = "6")]
    pub kv_cache_spec_kind: Option<String>,
    /// Its sliding window, in tokens.
    #[prost(uint32, optional, tag = "7")]
    pub kv_cache_spec_sliding_window: Option<u32>,
    /// `KvCacheLocality`: 1 local, 2 remote.
    #[prost(int32, optional, tag = "8")]
    pub locality: Option<i32>,
    #[prost(string, optional, tag = "11")]
    pub lora_name: Option<String>,
    #[prost(string, optional, tag = "12")]
    pub cache_salt: Option<String>,
}

/// `KvBlock`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KvBlock {
    #[prost(int64, tag = "1")]
    pub block_hash: i64,
    #[prost(uint32, repeated, tag = "2")]
    pub token_ids: Vec<u32>,
    #[prost(int32, tag = "3")]
    pub block_size: i32,
    #[prost(int64, optional, tag = "4")]
    pub lora_id: Option<i64>,
    #[prost(int32, optional, tag = "5")]
    pub cache_level: Option<i32>,
    /// vLLM's `extra_keys` of the block, untagged.
    #[prost(message, repeated, tag = "6")]
    pub extra_keys: Vec<KvBlockExtraKey>,
}

/// `KvBlockExtraKey`: one entry of vLLM's per-block `extra_keys` (a LoRA name or cache salt as
/// text, a multimodal item as (identifier, offset), a digest as bytes).
#[derive(Clone, PartialEq, prost::Message)]
pub struct KvBlockExtraKey {
    #[prost(oneof = "ExtraKey", tags = "1, 2, 3, 4")]
    pub key: Option<ExtraKey>,
}

/// `KvBlockExtraKey.key`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum ExtraKey {
    #[prost(string, tag = "1")]
    Text(String),
    #[prost(bytes, tag = "2")]
    Blob(Vec<u8>),
    #[prost(int64, tag = "3")]
    Number(i64),
    #[prost(message, tag = "4")]
    Multimodal(KvMultimodalKey),
}

/// `KvMultimodalKey`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KvMultimodalKey {
    #[prost(string, tag = "1")]
    pub identifier: String,
    #[prost(int64, tag = "2")]
    pub offset: i64,
}

/// `KvBlocksRemoved`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KvBlocksRemoved {
    #[prost(int64, repeated, tag = "1")]
    pub block_hashes: Vec<i64>,
    #[prost(int32, optional, tag = "2")]
    pub cache_level: Option<i32>,
    #[prost(int32, optional, tag = "3")]
    pub tier: Option<i32>,
    #[prost(string, optional, tag = "4")]
    pub medium: Option<String>,
    #[prost(uint32, optional, tag = "5")]
    pub group_idx: Option<u32>,
    #[prost(int32, optional, tag = "6")]
    pub locality: Option<i32>,
}

/// `KvCacheCleared`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KvCacheCleared {
    #[prost(string, optional, tag = "1")]
    pub ownership: Option<String>,
}

/// `FlushCacheRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct FlushCacheRequest {
    #[prost(float, tag = "1")]
    pub timeout_s: f32,
}

/// `FlushCacheResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct FlushCacheResponse {
    #[prost(bool, tag = "1")]
    pub success: bool,
    #[prost(string, tag = "2")]
    pub message: String,
}
