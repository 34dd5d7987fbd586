//! KV events between the wire (`KvEventBatch`) and the router's normalized
//! form (`router_types::EventBatch`), both ways: a subscriber reads the one,
//! a simulated engine writes it from the other. Bounded on read: a batch
//! with more events or tokens than a step could hold is refused whole.

use router_types::{DpRank, EngineBlockHash, EventBatch, KvEvent, Namespace, StoredBlocks, Tier};

use crate::proto::{KvBlock, KvBlocksRemoved, KvBlocksStored, KvCacheCleared, KvCacheEvent, KvEventBatch, KvEventData};

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
                tokens += s.blocks.iter().map(|b| b.token_ids.len()).sum::<usize>();
                if tokens > MAX_TOKENS {
                    return Err(BadBatch::TooManyTokens(tokens));
                }
                let level = s.blocks[0].cache_level;
                events.push(KvEvent::Stored(StoredBlocks {
                    block_hashes: s.blocks.iter().map(|b| EngineBlockHash::I64(b.block_hash)).collect(),
                    parent: s.parent_block_hash.map(EngineBlockHash::I64),
                    token_ids: s.blocks.iter().flat_map(|b| b.token_ids.iter().map(|t| u64::from(*t))).collect(),
                    bigram: false,
                    block_size: u32::try_from(size).unwrap_or(0),
                    tier: tier_of(s.tier, level),
                    namespace: Namespace { lora_name: s.lora_name.clone(), cache_salt: s.cache_salt.clone() },
                    group_idx: s.group_idx,
                    group_kind: None,
                    opaque_keys: Vec::new(),
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
                        .map(|(h, tokens)| KvBlock {
                            block_hash: hash(h),
                            token_ids: tokens.iter().map(|t| *t as u32).collect(),
                            block_size: s.block_size as i32,
                            ..Default::default()
                        })
                        .collect();
                    KvEventData::Stored(KvBlocksStored {
                        blocks,
                        parent_block_hash: s.parent.as_ref().map(hash),
                        tier: Some(tier_value(s.tier)),
                        group_idx: s.group_idx,
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
