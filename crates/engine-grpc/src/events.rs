//! KV events between the wire (`KvEventBatch`) and the router's normalized
//! form (`router_types::EventBatch`), both ways: a subscriber reads the one,
//! a simulated engine writes it from the other. Bounded on read: a batch
//! with more events or tokens than a step could hold is refused whole.

use router_types::opaque::{OpaqueKey, OpaqueKeys, Part, opaque_keys, vllm_salt};
use router_types::{DpRank, EngineBlockHash, EventBatch, GroupKind, KvEvent, Namespace, StoredBlocks, Tier};

use crate::proto::{
    ExtraKey, KvBlock, KvBlockExtraKey, KvBlocksRemoved, KvBlocksStored, KvCacheCleared, KvCacheEvent, KvEventBatch,
    KvEventData, KvMultimodalKey,
};

/// The most events one batch may carry.
pub const MAX_EVENTS: usize = 65_536;
/// The most tokens one batch's stores may carry in all.
pub const MAX_TOKENS: usize = 16 << 20;

/// `KvCacheTier`'s values (and `cache_level`'s: 0 device, 1 host, 2 disk, 3 external).
fn tier_of(tier: Option<i32>, cache_level: Option<i32>) -> Tier {
    match (tier, cache_level) {
        (Some(2), _) | (None | Some(0), Some(1)) => Tier::Host,
        (Some(3), _) | (None | Some(0), Some(2)) => Tier::Disk,
        (Some(4), _) | (None | Some(0), Some(3)) => Tier::External,
        _ => Tier::Device,
    }
}

fn tier_value(tier: Tier) -> i32 {
    match tier {
        Tier::Device => 1,
        Tier::Host => 2,
        Tier::Disk => 3,
        Tier::External => 4,
    }
}

/// Why a batch was refused whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadBatch {
    #[error("a batch of {0} events (at most {MAX_EVENTS})")]
    TooManyEvents(usize),
    #[error("a batch of {0} tokens (at most {MAX_TOKENS})")]
    TooManyTokens(usize),
    #[error("a store whose blocks differ in size")]
    MixedBlockSizes,
    #[error("dp rank {0} is not a rank")]
    BadRank(i32),
}

/// The router's form of `batch`, and the events it skipped (remote blocks, an empty event).
pub fn to_router(batch: &KvEventBatch) -> Result<(EventBatch, usize), BadBatch> {
    if batch.events.len() > MAX_EVENTS {
        return Err(BadBatch::TooManyEvents(batch.events.len()));
    }
    let dp_rank = match batch.dp_rank {
        None => None,
        Some(r) => Some(DpRank(u32::try_from(r).map_err(|_| BadBatch::BadRank(r))?)),
    };
    let (mut events, mut skipped, mut tokens) = (Vec::with_capacity(batch.events.len()), 0, 0usize);
    for e in &batch.events {
        match &e.data {
            Some(KvEventData::Stored(s)) if s.locality != Some(2) && !s.blocks.is_empty() => {
                let size = s.blocks[0].block_size;
                if s.blocks.iter().any(|b| b.block_size != size) {
                    return Err(BadBatch::MixedBlockSizes);
                }
                // Tokens and extra keys, against one bound.
                tokens += s.blocks.iter().map(|b| b.token_ids.len() + b.extra_keys.len()).sum::<usize>();
                if tokens > MAX_TOKENS {
                    return Err(BadBatch::TooManyTokens(tokens));
                }
                let level = s.blocks[0].cache_level;
                let (opaque_keys, salt) = extra_keys(&s.blocks, s.lora_name.is_some());
                events.push(KvEvent::Stored(StoredBlocks {
                    block_hashes: s.blocks.iter().map(|b| EngineBlockHash::I64(b.block_hash)).collect(),
                    parent: s.parent_block_hash.map(EngineBlockHash::I64),
                    token_ids: s.blocks.iter().flat_map(|b| b.token_ids.iter().map(|t| u64::from(*t))).collect(),
                    bigram: false,
                    block_size: u32::try_from(size).unwrap_or(0),
                    tier: tier_of(s.tier, level),
                    namespace: Namespace { lora_name: s.lora_name.clone(), cache_salt: s.cache_salt.clone().or(salt) },
                    group_idx: s.group_idx,
                    group_kind: s
                        .kv_cache_spec_kind
                        .as_deref()
                        .and_then(|k| GroupKind::from_vllm(k, s.kv_cache_spec_sliding_window)),
                    opaque_keys,
                    lookahead: Vec::new(),
                }));
            }
            Some(KvEventData::Removed(r)) if r.locality != Some(2) => events.push(KvEvent::Removed {
                block_hashes: r.block_hashes.iter().map(|h| EngineBlockHash::I64(*h)).collect(),
                tier: tier_of(r.tier, r.cache_level),
                group_idx: r.group_idx,
            }),
            Some(KvEventData::Cleared(_)) => events.push(KvEvent::AllCleared),
            _ => skipped += 1,
        }
    }
    Ok((EventBatch { ts: batch.timestamp, events, dp_rank }, skipped))
}

/// Per block, its canonical keys (`StoredBlocks::opaque_keys`).
type PerBlock = Vec<Option<Box<[u8]>>>;

/// vLLM's per-block `extra_keys` as the msgpack wire's decoder keeps them: the keys a request
/// cannot show in the canonical form (`router_types::opaque`; none: empty), and the cache salt,
/// the first block's text after the LoRA name (vLLM keys the salt on a request's first block).
fn extra_keys(blocks: &[KvBlock], lora: bool) -> (PerBlock, Option<String>) {
    let texts: Vec<String> = blocks.first().map_or(Vec::new(), |b| {
        b.extra_keys
            .iter()
            .filter_map(|k| match &k.key {
                Some(ExtraKey::Text(t)) => Some(t.clone()),
                _ => None,
            })
            .take(2)
            .collect()
    });
    let salt = vllm_salt(&texts, lora);
    let keys: PerBlock = blocks
        .iter()
        .map(|b| {
            let mut canonical = OpaqueKeys::default();
            for key in &b.extra_keys {
                match &key.key {
                    Some(ExtraKey::Blob(digest)) => canonical.bytes(digest),
                    Some(ExtraKey::Number(v)) => canonical.int(*v),
                    Some(ExtraKey::Multimodal(m)) => {
                        canonical.tuple(&[Part::Str(&m.identifier), Part::Int(i128::from(m.offset))])
                    }
                    Some(ExtraKey::Text(_)) | None => {}
                }
            }
            canonical.finish()
        })
        .collect();
    let any = keys.iter().any(Option::is_some);
    (if any { keys } else { Vec::new() }, salt)
}

/// The wire form of a block's canonical keys (and the salt on a chain's first block).
fn wire_keys(canonical: Option<&[u8]>, salt: Option<&str>) -> Vec<KvBlockExtraKey> {
    let key = |k| KvBlockExtraKey { key: Some(k) };
    let mut out = Vec::new();
    for k in canonical.and_then(opaque_keys).unwrap_or_default() {
        match k {
            OpaqueKey::Tuple(_) => {
                if let Some((identifier, offset)) = k.multimodal() {
                    out.push(key(ExtraKey::Multimodal(KvMultimodalKey { identifier: identifier.to_owned(), offset })));
                }
            }
            OpaqueKey::Bytes(b) => out.push(key(ExtraKey::Blob(b.to_vec()))),
            OpaqueKey::Int(v) => out.push(key(ExtraKey::Number(i64::try_from(v).unwrap_or(0)))),
        }
    }
    // vLLM's order: multimodal items, the salt, prompt embeddings.
    if let Some(salt) = salt {
        let at = out.iter().position(|k| matches!(k.key, Some(ExtraKey::Blob(_)))).unwrap_or(out.len());
        out.insert(at, key(ExtraKey::Text(salt.to_owned())));
    }
    out
}

/// The wire form of `batch`, numbered `seq`.
pub fn from_router(seq: u64, batch: &EventBatch) -> KvEventBatch {
    let hash = |h: &EngineBlockHash| h.key() as i64;
    let events = batch
        .events
        .iter()
        .map(|e| {
            let data = match e {
                KvEvent::Stored(s) => {
                    let size = s.block_size.max(1) as usize;
                    let blocks = s
                        .block_hashes
                        .iter()
                        .zip(s.token_ids.chunks(size))
                        .enumerate()
                        .map(|(i, (h, tokens))| KvBlock {
                            block_hash: hash(h),
                            token_ids: tokens.iter().map(|t| *t as u32).collect(),
                            block_size: s.block_size as i32,
                            extra_keys: wire_keys(
                                s.opaque_keys.get(i).and_then(|k| k.as_deref()),
                                s.namespace.cache_salt.as_deref().filter(|_| i == 0 && s.parent.is_none()),
                            ),
                            ..Default::default()
                        })
                        .collect();
                    let window = match s.group_kind {
                        Some(GroupKind::SlidingWindow { window }) => Some(window),
                        _ => None,
                    };
                    KvEventData::Stored(KvBlocksStored {
                        blocks,
                        parent_block_hash: s.parent.as_ref().map(hash),
                        tier: Some(tier_value(s.tier)),
                        group_idx: s.group_idx,
                        kv_cache_spec_kind: s.group_kind.map(|k| k.vllm_name().to_owned()),
                        kv_cache_spec_sliding_window: window,
                        lora_name: s.namespace.lora_name.clone(),
                        cache_salt: s.namespace.cache_salt.clone(),
                        ..Default::default()
                    })
                }
                KvEvent::Removed { block_hashes, tier, group_idx } => KvEventData::Removed(KvBlocksRemoved {
                    block_hashes: block_hashes.iter().map(hash).collect(),
                    tier: Some(tier_value(*tier)),
                    group_idx: *group_idx,
                    ..Default::default()
                }),
                KvEvent::AllCleared => KvEventData::Cleared(KvCacheCleared::default()),
            };
            KvCacheEvent { event_id: 0, data: Some(data) }
        })
        .collect();
    KvEventBatch {
        sequence_number: seq,
        timestamp: batch.ts,
        events,
        dp_rank: batch.dp_rank.map(|r| r.0 as i32),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_goes_to_the_wire_and_back_unchanged() {
        let batch = EventBatch {
            ts: 12.5,
            dp_rank: Some(DpRank(1)),
            events: vec![
                KvEvent::Stored(StoredBlocks {
                    block_hashes: vec![EngineBlockHash::I64(-7), EngineBlockHash::I64(9)],
                    parent: Some(EngineBlockHash::I64(3)),
                    token_ids: (0..8).collect(),
                    bigram: false,
                    block_size: 4,
                    tier: Tier::Host,
                    namespace: Namespace { lora_name: Some("a".into()), cache_salt: None },
                    group_idx: None,
                    group_kind: None,
                    opaque_keys: Vec::new(),
                    lookahead: Vec::new(),
                }),
                // vLLM's keys over gRPC: a multimodal item, a digest, a hybrid group's kind, the salt.
                KvEvent::Stored(StoredBlocks {
                    block_hashes: vec![EngineBlockHash::I64(11), EngineBlockHash::I64(12)],
                    parent: None,
                    token_ids: (0..8).collect(),
                    bigram: false,
                    block_size: 4,
                    tier: Tier::Device,
                    namespace: Namespace { lora_name: None, cache_salt: Some("tenant".into()) },
                    group_idx: Some(1),
                    group_kind: Some(GroupKind::SlidingWindow { window: 128 }),
                    opaque_keys: vec![None, {
                        let mut k = OpaqueKeys::default();
                        k.tuple(&[Part::Str("mm-abc"), Part::Int(-3)]);
                        k.bytes(&[7; 32]);
                        k.finish()
                    }],
                    lookahead: Vec::new(),
                }),
                KvEvent::Removed {
                    block_hashes: vec![EngineBlockHash::I64(3)],
                    tier: Tier::Device,
                    group_idx: Some(0),
                },
                KvEvent::AllCleared,
            ],
        };
        let wire = from_router(42, &batch);
        assert_eq!(wire.sequence_number, 42);
        assert_eq!(to_router(&wire).unwrap(), (batch, 0));
    }

    /// vLLM's `extra_keys` as its gRPC events carry them (`KvBlockExtraKey`, untagged): the LoRA
    /// name and the salt as text on the first block, multimodal items, digests; and the group's kind.
    #[test]
    fn vllms_extra_keys_and_group_kind_are_read_as_over_msgpack() {
        let key = |k| KvBlockExtraKey { key: Some(k) };
        let mm = |id: &str, offset| key(ExtraKey::Multimodal(KvMultimodalKey { identifier: id.into(), offset }));
        let block = |h, extra_keys| KvBlock {
            block_hash: h,
            token_ids: vec![1, 2],
            block_size: 2,
            extra_keys,
            ..Default::default()
        };
        let batch = KvEventBatch {
            events: vec![KvCacheEvent {
                event_id: 1,
                data: Some(KvEventData::Stored(KvBlocksStored {
                    blocks: vec![
                        block(
                            1,
                            vec![
                                key(ExtraKey::Text("sql".into())),
                                mm("img-1", 1),
                                key(ExtraKey::Text("tenant".into())),
                            ],
                        ),
                        block(
                            2,
                            vec![key(ExtraKey::Text("sql".into())), mm("img-1", -1), key(ExtraKey::Blob(vec![9; 32]))],
                        ),
                        block(3, vec![key(ExtraKey::Text("sql".into()))]),
                    ],
                    lora_name: Some("sql".into()),
                    kv_cache_spec_kind: Some("sliding_window".into()),
                    kv_cache_spec_sliding_window: Some(64),
                    ..Default::default()
                })),
            }],
            ..Default::default()
        };
        let (router, _) = to_router(&batch).unwrap();
        let KvEvent::Stored(s) = &router.events[0] else { panic!("{router:?}") };
        assert_eq!(s.namespace.cache_salt.as_deref(), Some("tenant"), "the first block's text after the LoRA name");
        assert_eq!(s.group_kind, Some(GroupKind::SlidingWindow { window: 64 }));
        let read = |i: usize| opaque_keys(s.opaque_keys[i].as_deref().unwrap()).unwrap();
        assert_eq!(read(0), [OpaqueKey::Tuple(vec![Part::Str("img-1"), Part::Int(1)])]);
        assert_eq!(read(1), [OpaqueKey::Tuple(vec![Part::Str("img-1"), Part::Int(-1)]), OpaqueKey::Bytes(&[9; 32])]);
        assert_eq!(s.opaque_keys[2], None, "the LoRA name alone is the namespace");
        // Without multimodal keys or digests nothing is kept, as over msgpack.
        let plain = KvEventBatch {
            events: vec![KvCacheEvent {
                event_id: 1,
                data: Some(KvEventData::Stored(KvBlocksStored {
                    blocks: vec![block(1, vec![key(ExtraKey::Text("tenant".into()))])],
                    ..Default::default()
                })),
            }],
            ..Default::default()
        };
        let (router, _) = to_router(&plain).unwrap();
        let KvEvent::Stored(s) = &router.events[0] else { panic!() };
        assert!(s.opaque_keys.is_empty());
        assert_eq!(s.namespace.cache_salt.as_deref(), Some("tenant"), "no LoRA: the first text is the salt");
    }

    #[test]
    fn remote_blocks_are_skipped_and_a_lying_batch_is_refused_whole() {
        let remote = KvEventBatch {
            events: vec![KvCacheEvent {
                event_id: 1,
                data: Some(KvEventData::Stored(KvBlocksStored {
                    blocks: vec![KvBlock { block_hash: 1, token_ids: vec![1], block_size: 1, ..Default::default() }],
                    locality: Some(2),
                    ..Default::default()
                })),
            }],
            ..Default::default()
        };
        assert_eq!(to_router(&remote).unwrap().1, 1);
        let mixed = KvEventBatch {
            events: vec![KvCacheEvent {
                event_id: 1,
                data: Some(KvEventData::Stored(KvBlocksStored {
                    blocks: vec![
                        KvBlock { block_hash: 1, token_ids: vec![1], block_size: 1, ..Default::default() },
                        KvBlock { block_hash: 2, token_ids: vec![1, 2], block_size: 2, ..Default::default() },
                    ],
                    ..Default::default()
                })),
            }],
            ..Default::default()
        };
        assert_eq!(to_router(&mixed), Err(BadBatch::MixedBlockSizes));
        let rank = KvEventBatch { dp_rank: Some(-1), ..Default::default() };
        assert_eq!(to_router(&rank), Err(BadBatch::BadRank(-1)));
    }
}
