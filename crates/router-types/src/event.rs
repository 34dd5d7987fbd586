//! The normalized KV event: what either engine's wire format decodes into and
//! what the index applies. Decoding and encoding live in `kv-events`.

use serde::{Deserialize, Serialize};

use crate::{DpRank, Namespace, Tier};

/// A block hash exactly as an engine published it. SGLang sends signed
/// 64-bit values, vLLM unsigned 64-bit values or raw digest bytes; the
/// router keeps them opaque and uses them only to find parents and removals.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EngineBlockHash {
    /// A signed 64-bit hash (SGLang).
    I64(i64),
    /// An unsigned 64-bit hash above `i64::MAX` (vLLM).
    U64(u64),
    /// Raw digest bytes (vLLM with integer hashes turned off).
    Bytes(Box<[u8]>),
}

// === impl EngineBlockHash ===

impl EngineBlockHash {
    /// A 64-bit key for per-stream maps: the value's bits for integer hashes,
    /// FNV-1a over the bytes for digest hashes.
    pub fn key(&self) -> u64 {
        match self {
            EngineBlockHash::I64(v) => *v as u64,
            EngineBlockHash::U64(v) => *v,
            EngineBlockHash::Bytes(b) => {
                let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                for byte in b.iter() {
                    h ^= u64::from(*byte);
                    h = h.wrapping_mul(0x0100_0000_01b3);
                }
                h
            }
        }
    }
}

/// The payload of a `BlockStored` event: one or more chained blocks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredBlocks {
    /// The engine's hash of each block, in chain order.
    pub block_hashes: Vec<EngineBlockHash>,
    /// The engine hash of the block this chain continues, if any.
    pub parent: Option<EngineBlockHash>,
    /// All tokens of all blocks, concatenated. For bigram engines this is the
    /// raw sequence the pairs were built from (one longer than the positions).
    pub token_ids: Vec<u64>,
    /// True when the engine sent `[t_i, t_i+1]` pairs (EAGLE-style bigram keys).
    pub bigram: bool,
    /// Tokens per block as the engine stated it.
    pub block_size: u32,
    /// Storage tier of the blocks.
    pub tier: Tier,
    /// LoRA adapter and cache salt the blocks belong to.
    pub namespace: Namespace,
    /// KV cache group (hybrid models); `None` when the engine sent none.
    pub group_idx: Option<u32>,
    /// What that group keeps (vLLM's `kv_cache_spec_kind`); `None` when the engine sent none.
    pub group_kind: Option<GroupKind>,
    /// Per block (empty: none), what its engine hash covers besides its tokens and namespace
    /// that the router cannot compute from a request: vLLM's `extra_keys` multimodal
    /// `(identifier, offset)` pairs and prompt-embedding digests, in a canonical form
    /// ([`crate::opaque`]; `kv_events` and `engine_grpc` decode them). The router's chain folds
    /// them in, so a prompt without those inputs never matches the blocks.
    pub opaque_keys: Vec<Option<Box<[u8]>>>,
    /// Per block (empty: none), the tokens after it that its engine hash also covers: vLLM's
    /// lookahead hashing (`lookahead_token_ids`, on with EAGLE or MTP drafting), every block's
    /// list of the same length, at most [`MAX_LOOKAHEAD_TOKENS`] (`kv_events` checks). The
    /// router's digest of the block covers them (`renderer::lookahead::lookahead_digest`), as a
    /// request's chain for such a worker does.
    #[serde(default)]
    pub lookahead: Vec<Box<[u64]>>,
}

/// The longest lookahead a block's hash may cover (vLLM's `num_hash_lookahead_tokens`: 1 for
/// EAGLE, the draft length for MTP): the decoders refuse longer ones, the index keeps a
/// worker's in one bit of a `u64`.
pub const MAX_LOOKAHEAD_TOKENS: usize = 64;

/// What one KV-cache group of a model keeps of a prompt, as vLLM's events say it
/// (`kv_cache_spec_kind`, `kv_cache_spec_sliding_window`). A hybrid model has groups of several
/// kinds; what its engine can reuse of a prompt is the prefix every group can serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GroupKind {
    /// Every block from the prompt's start (full attention; MLA, chunked-local and sink
    /// attention are looked up the same way).
    Full,
    /// The blocks of the last `window` tokens before the reused prefix's end (sliding-window
    /// attention).
    SlidingWindow {
        /// The window, in tokens.
        window: u32,
    },
    /// The recurrent state at the end of the reused prefix only (Mamba and other
    /// state-space layers).
    State,
}

// === impl StoredBlocks ===

impl StoredBlocks {
    /// Blocks of plain tokens on the device: no KV-cache group, namespace, extra keys or
    /// lookahead (SGLang's publisher, and vLLM's for a request without LoRA or multimodal inputs).
    pub fn plain(
        block_hashes: Vec<EngineBlockHash>,
        parent: Option<EngineBlockHash>,
        token_ids: Vec<u64>,
        block_size: u32,
    ) -> Self {
        Self {
            block_hashes,
            parent,
            token_ids,
            bigram: false,
            block_size,
            tier: Tier::Device,
            namespace: Namespace::default(),
            group_idx: None,
            group_kind: None,
            opaque_keys: Vec::new(),
            lookahead: Vec::new(),
        }
    }

    /// The lookahead every block's hash covers (vLLM's `num_hash_lookahead_tokens`): 0 without.
    pub fn lookahead_len(&self) -> usize {
        self.lookahead.first().map_or(0, |t| t.len())
    }
}

// === impl GroupKind ===

impl GroupKind {
    /// The kind vLLM names `kind` (`KVCacheSpecKind`'s values), with its sliding window in
    /// tokens; `None` for a kind no prefix is reused from (cross or encoder-only attention), an
    /// unknown one, or a sliding window without its size.
    pub fn from_vllm(kind: &str, sliding_window: Option<u32>) -> Option<GroupKind> {
        match kind {
            "full_attention" | "mla_attention" | "sink_full_attention" | "chunked_local_attention" => {
                Some(GroupKind::Full)
            }
            "sliding_window" | "sliding_window_mla" => sliding_window.map(|window| GroupKind::SlidingWindow { window }),
            "mamba" => Some(GroupKind::State),
            _ => None,
        }
    }

    /// vLLM's name of the kind, as its events carry it.
    pub fn vllm_name(self) -> &'static str {
        match self {
            GroupKind::Full => "full_attention",
            GroupKind::SlidingWindow { .. } => "sliding_window",
            GroupKind::State => "mamba",
        }
    }
}

/// One cache event from one (worker, rank).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum KvEvent {
    /// Blocks entered the cache in `tier`.
    Stored(StoredBlocks),
    /// Blocks left the cache in `tier`.
    Removed {
        /// Engine hashes of the removed blocks.
        block_hashes: Vec<EngineBlockHash>,
        /// The tier they left.
        tier: Tier,
        /// KV cache group, if the engine sent one.
        group_idx: Option<u32>,
    },
    /// The whole cache of this rank was cleared.
    AllCleared,
}

/// One published batch: the events of one scheduler step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EventBatch {
    /// Publisher wall-clock time, seconds since the Unix epoch.
    pub ts: f64,
    /// The events, in order.
    pub events: Vec<KvEvent>,
    /// The publishing rank, when the engine states it.
    pub dp_rank: Option<DpRank>,
}
