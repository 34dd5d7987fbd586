//! A stream's holdings out of the index and back in: what a router replica
//! gives a sibling that starts late. An export lists every block the stream
//! holds (engine hash, digest, tiers) and, once each, the ancestors it does
//! not hold, parents before children, so that an import rebuilds the same
//! chains in another index. Both take the stream's map, then one shard at a
//! time (the index's lock order).

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use router_types::PageDigest;

use super::{KvIndex, Loc};
use crate::shard::{Evicted, NO_PARENT, TICK_MASK};
use crate::{IndexError, StreamId};

/// One block of an exported stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportedBlock {
    /// The router's chain digest after this block (its hash is the first eight bytes).
    pub digest: PageDigest,
    /// The parent's place in the same export (always earlier), `None` for a root.
    pub parent: Option<u32>,
    /// The engine's hash of the block (`EngineBlockHash::key`), when the stream holds it.
    pub engine: Option<u64>,
    /// Tiers the stream holds it in (bit `Tier as u8`); 0 for an ancestor it does not hold.
    pub tiers: u8,
}

/// Why an export cannot be imported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImportError {
    /// The stream is not registered.
    #[error(transparent)]
    Index(#[from] IndexError),
    /// A block's parent is not an earlier block.
    #[error("block {0}: its parent is not an earlier block")]
    BadParent(usize),
    /// A held block without an engine hash, or an engine hash on a block not held.
    #[error("block {0}: held blocks carry an engine hash, and only they")]
    BadHolding(usize),
    /// An ancestor not held that no block continues.
    #[error("block {0}: a block not held must have a child")]
    Dangling(usize),
}

impl KvIndex {
    /// Every block `stream` holds, with the ancestors it does not hold, parents first.
    pub fn export_stream(&self, stream: StreamId) -> Result<Vec<ExportedBlock>, IndexError> {
        let slot = self.slot(stream)?;
        let sid = stream.0 as u16;
        let map = slot.engine.lock().unwrap_or_else(|p| p.into_inner());
        let mut by_shard: HashMap<u16, Vec<(u64, Loc)>> = HashMap::new();
        for e in map.iter() {
            let loc = self.layout.unpack(e);
            by_shard.entry(loc.shard).or_default().push((e.engine(), loc));
        }
        let mut out = Vec::new();
        let mut shards: Vec<_> = by_shard.into_iter().collect();
        shards.sort_unstable_by_key(|(s, _)| *s);
        for (shard_ix, entries) in shards {
            let shard = self.shards[shard_ix as usize].read().unwrap_or_else(|p| p.into_inner());
            // Slot -> its place in `out`, for the nodes of this shard exported so far.
            let mut placed: HashMap<u32, u32> = HashMap::new();
            let mut path = Vec::new();
            for (engine, loc) in entries {
                if !shard.is_live(loc.slot, loc.generation) {
                    continue; // stale entry (evicted)
                }
                let Some(tiers) = shard.holders(loc.slot).find(|h| h.stream == sid).map(|h| h.tiers) else {
                    continue;
                };
                // The ancestors not placed yet, nearest first.
                path.clear();
                let mut up = shard.node(loc.slot).parent;
                while up != NO_PARENT && !placed.contains_key(&up) {
                    path.push(up);
                    up = shard.node(up).parent;
                }
                let mut parent = (up != NO_PARENT).then(|| placed[&up]);
                for &a in path.iter().rev() {
                    let ix = out.len() as u32;
                    out.push(ExportedBlock { digest: shard.node(a).digest, parent, engine: None, tiers: 0 });
                    placed.insert(a, ix);
                    parent = Some(ix);
                }
                let ix = out.len() as u32;
                out.push(ExportedBlock { digest: shard.node(loc.slot).digest, parent, engine: Some(engine), tiers });
                // A held node placed as an ancestor earlier keeps that place for its children;
                // this record adds its holding and engine hash.
                placed.entry(loc.slot).or_insert(ix);
            }
        }
        Ok(out)
    }

    /// Checks an export: parents earlier, engine hashes exactly on held blocks, no dangling ancestor.
    pub fn check_export(blocks: &[ExportedBlock]) -> Result<(), ImportError> {
        let mut has_child = vec![false; blocks.len()];
        for (i, b) in blocks.iter().enumerate() {
            if let Some(p) = b.parent {
                if p as usize >= i {
                    return Err(ImportError::BadParent(i));
                }
                has_child[p as usize] = true;
            }
            if b.engine.is_some() != (b.tiers != 0) || b.tiers & !0b1111 != 0 {
                return Err(ImportError::BadHolding(i));
            }
        }
        match blocks.iter().zip(&has_child).position(|(b, c)| b.tiers == 0 && !c) {
            Some(i) => Err(ImportError::Dangling(i)),
            None => Ok(()),
        }
    }

    /// Adds an export's holdings to `stream` (checked first). Chains land in
    /// the shard of their root, each shard's under one write lock; the bound
    /// on nodes is kept afterwards, as after a store.
    pub fn import_stream(&self, stream: StreamId, blocks: &[ExportedBlock]) -> Result<usize, ImportError> {
        Self::check_export(blocks)?;
        let slot = self.slot(stream)?;
        let sid = stream.0 as u16;
        // Each block's shard: its root's.
        let mut shard_of = Vec::with_capacity(blocks.len());
        for b in blocks {
            let s = match b.parent {
                Some(p) => shard_of[p as usize],
                None => self.shard_index(router_types::BlockHash::from_digest(&b.digest)),
            };
            shard_of.push(s);
        }
        let mut order: Vec<usize> = (0..blocks.len()).collect();
        order.sort_by_key(|&i| shard_of[i]); // stable: parents stay before children
        let now = self.tick.fetch_add(1, Ordering::Relaxed) & TICK_MASK;
        let mut slots = vec![NO_PARENT; blocks.len()];
        let mut held = 0;
        let mut evicted = Evicted::default();
        let mut map = slot.engine.lock().unwrap_or_else(|p| p.into_inner());
        let mut i = 0;
        while i < order.len() {
            let shard_ix = shard_of[order[i]];
            let mut shard = self.shards[shard_ix].write().unwrap_or_else(|p| p.into_inner());
            while i < order.len() && shard_of[order[i]] == shard_ix {
                let b = &blocks[order[i]];
                let parent = b.parent.map_or(NO_PARENT, |p| slots[p as usize]);
                let (node, created) = shard.get_or_insert(parent, &b.digest, now);
                slots[order[i]] = node;
                if let Some(engine) = b.engine {
                    if shard.hold(node, sid, b.tiers, now, !created) {
                        held += 1;
                        slot.live.fetch_add(1, Ordering::Relaxed);
                    }
                    let loc = Loc { shard: shard_ix as u16, slot: node, generation: shard.node(node).generation as u8 };
                    self.record_engine(&mut map, engine, loc);
                }
                i += 1;
            }
            if shard.len() > self.max_per_shard {
                shard.evict_to(self.max_per_shard, now, &mut evicted);
            }
        }
        drop(map);
        self.account_evicted(evicted);
        Ok(held)
    }
}
