//! The KV-event wire format of SGLang and vLLM: pure functions from msgpack
//! bytes to `EventBatch` and back. No sockets, no clocks.
//!
//! Accepted (`../shared/docs/reference.md` §1): a batch `[ts, events, dp_rank,
//! ...extra]`; events as maps with a `"type"` key (SGLang ≥ 0.5.22, vLLM ≥ 0.24)
//! or as positional arrays `["BlockStored", hashes, parent, token_ids,
//! block_size, lora_id, medium, lora_name, ...]` (older engines); hashes as
//! signed or unsigned 64-bit integers or raw bytes; `token_ids` as scalars or
//! bigram pairs. Unknown keys are ignored; an unknown event type skips that
//! event and is counted.
//!
//! Bounded, because the bytes come from a worker: a payload longer than
//! [`Limits::max_payload_bytes`] is refused before it is parsed; every list
//! length is checked against the limits and against the bytes left before
//! anything is allocated (a prefix claiming 2^32 items in a short payload is an
//! error, not an allocation), so what one batch allocates is a bounded multiple
//! of its size (a one-byte token becomes a `u64`); nesting is capped.

use router_types::opaque::vllm_salt;
use router_types::{DpRank, EngineBlockHash, EventBatch, GroupKind, KvEvent, Namespace, StoredBlocks, Tier};

use crate::WireError;
use crate::extra_keys::{read_extra_keys, read_lookahead};
use crate::msgpack::{Item, Reader, Writer};

/// Largest `block_hashes` list one event may carry by default.
pub const DEFAULT_MAX_HASHES: usize = 65_536;
/// Largest `token_ids` list one event may carry by default.
pub const DEFAULT_MAX_TOKENS: usize = 1_048_576;
/// Largest payload one batch may have by default: room for one event at the
/// token limit in bigram pairs (about 11 bytes a pair), with margin.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 16 * 1024 * 1024;

/// Decoder limits, checked before allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most hashes in one event.
    pub max_hashes: usize,
    /// Most tokens in one event.
    pub max_tokens: usize,
    /// Most bytes in one batch's payload.
    pub max_payload_bytes: usize,
}

/// A decoded batch and what was skipped in it.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// The events understood, in order.
    pub batch: EventBatch,
    /// Events of an unknown type (or medium) that were skipped.
    pub unknown_events: usize,
}

/// How events are laid out when encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventForm {
    /// Maps with a `"type"` key (current SGLang and vLLM).
    Map,
    /// Positional arrays (vLLM ≤ 0.23, older SGLang).
    Positional,
}

/// The fields an event may carry, whatever its layout.
#[derive(Debug, Default)]
struct Fields {
    kind: Option<String>,
    hashes: Vec<EngineBlockHash>,
    parent: Option<EngineBlockHash>,
    tokens: Vec<u64>,
    bigram: bool,
    block_size: u32,
    medium: Option<String>,
    lora_name: Option<String>,
    cache_salt: Option<String>,
    group_idx: Option<u32>,
    spec_kind: Option<String>,
    sliding_window: Option<u32>,
    opaque_keys: Vec<Option<Box<[u8]>>>,
    /// The strings of the first block's `extra_keys` (vLLM's LoRA name, then its cache salt).
    first_block_strings: Vec<String>,
    lookahead: Vec<Box<[u64]>>,
}

// === impl Limits ===

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_hashes: DEFAULT_MAX_HASHES,
            max_tokens: DEFAULT_MAX_TOKENS,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
        }
    }
}

/// Decodes one published batch.
pub fn decode_batch(payload: &[u8], limits: &Limits) -> Result<Decoded, WireError> {
    if payload.len() > limits.max_payload_bytes {
        return Err(WireError::TooLong { what: "payload bytes", len: payload.len(), limit: limits.max_payload_bytes });
    }
    let mut r = Reader::new(payload);
    let n = match r.next()? {
        Item::Array(n) if n >= 2 => n,
        _ => return Err(WireError::Malformed { at: r.pos(), what: "a batch must be an array [ts, events, dp_rank]" }),
    };
    let ts = match r.next()? {
        Item::Float(f) => f,
        Item::Uint(u) => u as f64,
        Item::Int(i) => i as f64,
        _ => return Err(WireError::Malformed { at: r.pos(), what: "batch ts must be a number" }),
    };
    let events_len = match r.next()? {
        Item::Array(n) => n,
        _ => return Err(WireError::Malformed { at: r.pos(), what: "batch events must be an array" }),
    };
    let mut events = Vec::with_capacity(events_len.min(1024));
    let mut unknown_events = 0;
    for index in 0..events_len {
        match decode_event(&mut r, limits).map_err(|e| e.in_event(index))? {
            Some(event) => events.push(event),
            None => unknown_events += 1,
        }
    }
    let dp_rank = if n >= 3 {
        match r.next()? {
            Item::Nil => None,
            Item::Uint(u) => Some(DpRank(
                u32::try_from(u).map_err(|_| WireError::Malformed { at: r.pos(), what: "dp_rank too large" })?,
            )),
            _ => return Err(WireError::Malformed { at: r.pos(), what: "dp_rank must be an integer or nil" }),
        }
    } else {
        None
    };
    for _ in 3..n {
        r.skip()?; // newer engines may append fields
    }
    Ok(Decoded { batch: EventBatch { ts, events, dp_rank }, unknown_events })
}

/// One event; `None` if its type is unknown (it is skipped whole).
fn decode_event(r: &mut Reader<'_>, limits: &Limits) -> Result<Option<KvEvent>, WireError> {
    let fields = match r.next()? {
        Item::Map(n) => {
            let mut f = Fields::default();
            for i in 0..n {
                let key = match r.next()? {
                    Item::Str(k) => k,
                    _ => return Err(WireError::Malformed { at: r.pos(), what: "event map keys must be strings" }),
                };
                if key == "type" {
                    f.kind = Some(read_str(r, "type")?.unwrap_or_default());
                    if i == 0 && !is_known(f.kind.as_deref()) {
                        // Unknown type first (msgspec tags come first): skip the rest untouched.
                        for _ in 1..n {
                            r.skip()?;
                            r.skip()?;
                        }
                        return Ok(None);
                    }
                    continue;
                }
                read_field(r, key, &mut f, limits)?;
            }
            f
        }
        Item::Array(0) => return Err(WireError::Malformed { at: r.pos(), what: "empty positional event" }),
        Item::Array(n) => {
            let mut f = Fields { kind: read_str(r, "type")?, ..Fields::default() };
            let order: &[&str] = match f.kind.as_deref() {
                Some("BlockStored") => {
                    &["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"]
                }
                Some("BlockRemoved") => &["block_hashes", "medium"],
                _ => &[],
            };
            for i in 1..n {
                match order.get(i - 1) {
                    Some(key) => read_field(r, key, &mut f, limits)?,
                    None => r.skip()?,
                }
            }
            f
        }
        _ => return Err(WireError::Malformed { at: r.pos(), what: "an event must be a map or an array" }),
    };
    let tier = match Tier::from_medium(fields.medium.as_deref()) {
        Some(t) => t,
        None => return Ok(None), // a storage medium we do not model
    };
    Ok(match fields.kind.as_deref() {
        Some("BlockStored") => Some(KvEvent::Stored(StoredBlocks {
            block_hashes: fields.hashes,
            parent: fields.parent,
            token_ids: fields.tokens,
            bigram: fields.bigram,
            block_size: fields.block_size,
            tier,
            namespace: Namespace {
                cache_salt: fields
                    .cache_salt
                    .or_else(|| vllm_salt(&fields.first_block_strings, fields.lora_name.is_some())),
                lora_name: fields.lora_name,
            },
            group_idx: fields.group_idx,
            group_kind: fields.spec_kind.as_deref().and_then(|k| GroupKind::from_vllm(k, fields.sliding_window)),
            opaque_keys: fields.opaque_keys,
            lookahead: fields.lookahead,
        })),
        Some("BlockRemoved") => {
            Some(KvEvent::Removed { block_hashes: fields.hashes, tier, group_idx: fields.group_idx })
        }
        Some("AllBlocksCleared") => Some(KvEvent::AllCleared),
        _ => None,
    })
}

fn is_known(kind: Option<&str>) -> bool {
    matches!(kind, Some("BlockStored" | "BlockRemoved" | "AllBlocksCleared"))
}

fn read_field(r: &mut Reader<'_>, key: &str, f: &mut Fields, limits: &Limits) -> Result<(), WireError> {
    match key {
        "block_hashes" => {
            let n = match r.next()? {
                Item::Array(n) => n,
                _ => return Err(WireError::Malformed { at: r.pos(), what: "block_hashes must be an array" }),
            };
            if n > limits.max_hashes {
                return Err(WireError::TooLong { what: "block_hashes", len: n, limit: limits.max_hashes });
            }
            f.hashes = (0..n).map(|_| read_hash(r)).collect::<Result<_, _>>()?;
        }
        "parent_block_hash" => {
            f.parent = match r.next()? {
                Item::Nil => None,
                item => Some(hash_of(item, r.pos())?),
            }
        }
        "token_ids" => read_tokens(r, f, limits)?,
        "block_size" => {
            f.block_size = match r.next()? {
                Item::Uint(u) => {
                    u32::try_from(u).map_err(|_| WireError::Malformed { at: r.pos(), what: "block_size too large" })?
                }
                Item::Nil => 0,
                _ => return Err(WireError::Malformed { at: r.pos(), what: "block_size must be an integer" }),
            }
        }
        "medium" => f.medium = read_str(r, "medium")?,
        "lora_name" => f.lora_name = read_str(r, "lora_name")?,
        "cache_salt" => f.cache_salt = read_str(r, "cache_salt")?,
        "group_idx" => f.group_idx = read_u32(r, "group_idx")?,
        "kv_cache_spec_kind" => f.spec_kind = read_str(r, "kv_cache_spec_kind")?,
        "kv_cache_spec_sliding_window" => f.sliding_window = read_u32(r, "kv_cache_spec_sliding_window")?,
        "extra_keys" => f.opaque_keys = read_extra_keys(r, limits.max_hashes, &mut f.first_block_strings)?,
        "lookahead_token_ids" => f.lookahead = read_lookahead(r, limits.max_hashes)?,
        _ => r.skip()?, // lora_id, session_id, and whatever engines add next
    }
    Ok(())
}

/// A `u32` field or nil (`group_idx`, `kv_cache_spec_sliding_window`).
fn read_u32(r: &mut Reader<'_>, what: &'static str) -> Result<Option<u32>, WireError> {
    let (too_large, not_integer) = match what {
        "group_idx" => ("group_idx too large", "group_idx must be an integer"),
        _ => ("kv_cache_spec_sliding_window too large", "kv_cache_spec_sliding_window must be an integer"),
    };
    match r.next()? {
        Item::Nil => Ok(None),
        Item::Uint(u) => Ok(Some(u32::try_from(u).map_err(|_| WireError::Malformed { at: r.pos(), what: too_large })?)),
        _ => Err(WireError::Malformed { at: r.pos(), what: not_integer }),
    }
}

fn read_str(r: &mut Reader<'_>, what: &'static str) -> Result<Option<String>, WireError> {
    match r.next()? {
        Item::Nil => Ok(None),
        Item::Str(s) => Ok(Some(s.to_string())),
        _ => Err(WireError::Malformed { at: r.pos(), what: field_must_be_string(what) }),
    }
}

fn field_must_be_string(what: &'static str) -> &'static str {
    match what {
        "type" => "event type must be a string",
        "medium" => "medium must be a string or nil",
        "lora_name" => "lora_name must be a string or nil",
        "kv_cache_spec_kind" => "kv_cache_spec_kind must be a string or nil",
        _ => "cache_salt must be a string or nil",
    }
}

fn read_hash(r: &mut Reader<'_>) -> Result<EngineBlockHash, WireError> {
    let item = r.next()?;
    hash_of(item, r.pos())
}

fn hash_of(item: Item<'_>, at: usize) -> Result<EngineBlockHash, WireError> {
    match item {
        Item::Uint(u) if u <= i64::MAX as u64 => Ok(EngineBlockHash::I64(u as i64)),
        Item::Uint(u) => Ok(EngineBlockHash::U64(u)),
        Item::Int(i) => Ok(EngineBlockHash::I64(i)),
        Item::Bin(b) if !b.is_empty() && b.len() <= 64 => Ok(EngineBlockHash::Bytes(b.into())),
        _ => Err(WireError::Malformed { at, what: "a block hash must be an integer or 1..=64 bytes" }),
    }
}

fn token(item: Item<'_>, at: usize) -> Result<u64, WireError> {
    match item {
        Item::Uint(u) => Ok(u),
        _ => Err(WireError::Malformed { at, what: "token ids must be non-negative integers" }),
    }
}

fn read_tokens(r: &mut Reader<'_>, f: &mut Fields, limits: &Limits) -> Result<(), WireError> {
    let n = match r.next()? {
        Item::Array(n) => n,
        Item::Nil => return Ok(()),
        _ => return Err(WireError::Malformed { at: r.pos(), what: "token_ids must be an array" }),
    };
    if n > limits.max_tokens {
        return Err(WireError::TooLong { what: "token_ids", len: n, limit: limits.max_tokens });
    }
    let mut tokens = Vec::with_capacity(n + 1);
    for i in 0..n {
        match r.next()? {
            Item::Array(2) => {
                // A bigram pair [t_i, t_i+1]: pairs chain, so keep the first of each and the last second.
                let a = token(r.next()?, r.pos())?;
                let b = token(r.next()?, r.pos())?;
                if i == 0 {
                    f.bigram = true;
                    tokens.push(a);
                } else if !f.bigram || tokens.last() != Some(&a) {
                    return Err(WireError::Malformed { at: r.pos(), what: "bigram token pairs do not chain" });
                }
                tokens.push(b);
            }
            item if !f.bigram => tokens.push(token(item, r.pos())?),
            _ => return Err(WireError::Malformed { at: r.pos(), what: "token_ids mix scalars and pairs" }),
        }
    }
    f.tokens = tokens;
    Ok(())
}

/// Encodes a batch as the engines publish it.
pub fn encode_batch(batch: &EventBatch, form: EventForm) -> Vec<u8> {
    let mut w = Writer::default();
    w.array(3);
    w.float(batch.ts);
    w.array(batch.events.len());
    for event in &batch.events {
        encode_event(&mut w, event, form);
    }
    match batch.dp_rank {
        Some(r) => w.uint(u64::from(r.0)),
        None => w.nil(),
    }
    w.buf
}

fn medium(tier: Tier) -> &'static str {
    match tier {
        Tier::Device => "GPU",
        Tier::Host => "CPU_PINNED",
        Tier::Disk => "DISK",
        Tier::External => "EXTERNAL",
    }
}

fn write_hash(w: &mut Writer, h: &EngineBlockHash) {
    match h {
        EngineBlockHash::I64(v) => w.int(*v),
        EngineBlockHash::U64(v) => w.uint(*v),
        EngineBlockHash::Bytes(b) => w.bin(b),
    }
}

fn write_tokens(w: &mut Writer, s: &StoredBlocks) {
    if s.bigram {
        let pairs = s.token_ids.len().saturating_sub(1);
        w.array(pairs);
        for p in s.token_ids.windows(2) {
            w.array(2);
            w.uint(p[0]);
            w.uint(p[1]);
        }
    } else {
        w.array(s.token_ids.len());
        for t in &s.token_ids {
            w.uint(*t);
        }
    }
}

fn write_opt_str(w: &mut Writer, s: Option<&str>) {
    match s {
        Some(s) => w.str(s),
        None => w.nil(),
    }
}

fn encode_event(w: &mut Writer, event: &KvEvent, form: EventForm) {
    match (event, form) {
        (KvEvent::Stored(s), EventForm::Map) => {
            let window = match s.group_kind {
                Some(GroupKind::SlidingWindow { window }) => Some(window),
                _ => None,
            };
            let extra = [
                s.namespace.lora_name.is_some(),
                s.namespace.cache_salt.is_some(),
                s.group_idx.is_some(),
                s.group_kind.is_some(),
                window.is_some(),
                !s.lookahead.is_empty(),
            ];
            w.map(7 + extra.iter().filter(|x| **x).count());
            w.str("type");
            w.str("BlockStored");
            w.str("block_hashes");
            w.array(s.block_hashes.len());
            s.block_hashes.iter().for_each(|h| write_hash(w, h));
            w.str("parent_block_hash");
            match &s.parent {
                Some(p) => write_hash(w, p),
                None => w.nil(),
            }
            w.str("token_ids");
            write_tokens(w, s);
            w.str("block_size");
            w.uint(u64::from(s.block_size));
            w.str("lora_id");
            w.nil();
            w.str("medium");
            w.str(medium(s.tier));
            if let Some(l) = &s.namespace.lora_name {
                w.str("lora_name");
                w.str(l);
            }
            if let Some(c) = &s.namespace.cache_salt {
                w.str("cache_salt");
                w.str(c);
            }
            if let Some(g) = s.group_idx {
                w.str("group_idx");
                w.uint(u64::from(g));
            }
            if let Some(kind) = s.group_kind {
                w.str("kv_cache_spec_kind");
                w.str(kind.vllm_name());
            }
            if let Some(window) = window {
                w.str("kv_cache_spec_sliding_window");
                w.uint(u64::from(window));
            }
            if !s.lookahead.is_empty() {
                w.str("lookahead_token_ids");
                w.array(s.lookahead.len());
                for tokens in &s.lookahead {
                    w.array(tokens.len());
                    tokens.iter().for_each(|t| w.uint(*t));
                }
            }
        }
        (KvEvent::Stored(s), EventForm::Positional) => {
            w.array(8);
            w.str("BlockStored");
            w.array(s.block_hashes.len());
            s.block_hashes.iter().for_each(|h| write_hash(w, h));
            match &s.parent {
                Some(p) => write_hash(w, p),
                None => w.nil(),
            }
            write_tokens(w, s);
            w.uint(u64::from(s.block_size));
            w.nil();
            w.str(medium(s.tier));
            write_opt_str(w, s.namespace.lora_name.as_deref());
        }
        (KvEvent::Removed { block_hashes, tier, group_idx }, EventForm::Map) => {
            w.map(3 + usize::from(group_idx.is_some()));
            w.str("type");
            w.str("BlockRemoved");
            w.str("block_hashes");
            w.array(block_hashes.len());
            block_hashes.iter().for_each(|h| write_hash(w, h));
            w.str("medium");
            w.str(medium(*tier));
            if let Some(g) = group_idx {
                w.str("group_idx");
                w.uint(u64::from(*g));
            }
        }
        (KvEvent::Removed { block_hashes, tier, .. }, EventForm::Positional) => {
            w.array(3);
            w.str("BlockRemoved");
            w.array(block_hashes.len());
            block_hashes.iter().for_each(|h| write_hash(w, h));
            w.str(medium(*tier));
        }
        (KvEvent::AllCleared, EventForm::Map) => {
            w.map(1);
            w.str("type");
            w.str("AllBlocksCleared");
        }
        (KvEvent::AllCleared, EventForm::Positional) => {
            w.array(1);
            w.str("AllBlocksCleared");
        }
    }
}
