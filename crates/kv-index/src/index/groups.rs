//! Hybrid models: a (worker, rank)'s KV-cache groups (full attention, sliding
//! window, Mamba state), each its own stream of holdings, and the prefix its
//! engine can reuse of a prompt, found as vLLM's scheduler finds it
//! (`HybridKVCacheCoordinator.find_longest_cache_hit`): the longest every
//! group can serve ([`reusable_prefix`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use hashbrown::HashTable;
use router_types::{BlockHash, GroupKind};

use super::{Active, IndexError, KvIndex, MAX_GROUPS, MatchOptions, StreamSlot};
use crate::StreamId;
use crate::shard::NO_PARENT;

/// What a group keeps, in blocks of its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupBlocks {
    /// Every block from the start.
    Full,
    /// The last `blocks` blocks before the prefix's end (vLLM: `cdiv(window - 1, block_size)`).
    Window {
        /// Contiguous blocks a hit needs.
        blocks: u32,
    },
    /// The block at the prefix's end.
    State,
}

// === impl GroupBlocks ===

impl GroupBlocks {
    /// The group `kind` with blocks of `block_size` tokens.
    pub fn of(kind: GroupKind, block_size: u32) -> GroupBlocks {
        match kind {
            GroupKind::Full => GroupBlocks::Full,
            GroupKind::SlidingWindow { window } => {
                GroupBlocks::Window { blocks: window.saturating_sub(1).div_ceil(block_size.max(1)) }
            }
            GroupKind::State => GroupBlocks::State,
        }
    }

    fn pack(self) -> u64 {
        match self {
            GroupBlocks::Full => 0,
            GroupBlocks::Window { blocks } => 1 << 32 | u64::from(blocks),
            GroupBlocks::State => 2 << 32,
        }
    }

    fn unpack(v: u64) -> GroupBlocks {
        match v >> 32 {
            1 => GroupBlocks::Window { blocks: v as u32 },
            2 => GroupBlocks::State,
            _ => GroupBlocks::Full,
        }
    }
}

/// The longest prefix (in blocks, at most `max`) an engine can reuse when its groups hold
/// what `groups` says (`held(i)`: the group holds the prompt's block `i`). Groups of one kind are
/// looked up together (a block counts when each holds it), full attention first, the others
/// each cutting the candidate until none does: vLLM's `HybridKVCacheCoordinator` over its
/// managers' `find_longest_cache_hit` (one block size, no EAGLE drop, no partial blocks;
/// `crates/kv-index/tests/behaviour/hybrid.rs` checks it against vLLM's own code).
pub fn reusable_prefix<F: Fn(usize) -> bool>(max: usize, groups: &[(GroupBlocks, F)]) -> usize {
    let mut kinds: Vec<GroupBlocks> = Vec::with_capacity(groups.len());
    for (kind, _) in groups {
        if !kinds.contains(kind) {
            kinds.push(*kind);
        }
    }
    kinds.sort_by_key(|k| *k != GroupBlocks::Full);
    let held = |kind: GroupBlocks, i: usize| groups.iter().filter(|(k, _)| *k == kind).all(|(_, h)| h(i));
    // Full attention is downward-closed: its run from the start is found once.
    let full = kinds.contains(&GroupBlocks::Full).then(|| (0..max).take_while(|&i| held(GroupBlocks::Full, i)).count());
    let mut hit = max;
    loop {
        let mut candidate = hit;
        for &kind in &kinds {
            candidate = match kind {
                GroupBlocks::Full => candidate.min(full.unwrap_or(candidate)),
                GroupBlocks::Window { blocks } => window_hit(candidate, blocks as usize, |i| held(kind, i)),
                GroupBlocks::State => (0..candidate).rev().find(|&i| held(kind, i)).map_or(0, |i| i + 1),
            };
        }
        if candidate >= hit {
            return hit;
        }
        hit = candidate;
    }
}

/// A sliding-window group's hit within `max` blocks: the end of the rightmost run of `need`
/// held blocks, else the run held from the start (vLLM's `SlidingWindowManager`).
fn window_hit(max: usize, need: usize, held: impl Fn(usize) -> bool) -> usize {
    let mut run = 0;
    for i in (0..max).rev() {
        if held(i) {
            run += 1;
            if run >= need {
                return i + run;
            }
        } else {
            run = 0;
        }
    }
    run
}

/// The sub-streams of a (worker, rank) whose engine publishes several groups.
#[derive(Debug, Default)]
pub(super) struct Family {
    /// Group index → its stream (the primary stream holds group 0 and events without one).
    pub(super) members: Vec<(u32, StreamId)>,
}

// === impl KvIndex ===

impl KvIndex {
    /// The stream of group `group` of `primary`'s (worker, rank): `primary` itself for group 0,
    /// else a stream of its own, registered on first use (forgotten, cleared and retired with
    /// `primary`). Once a (worker, rank) has two groups, matches read them together.
    pub fn group_stream(&self, primary: StreamId, group: u32) -> Result<StreamId, IndexError> {
        if group == 0 {
            return Ok(primary);
        }
        let slot = self.slot(primary)?;
        let known = |family: &Family| family.members.iter().find(|(g, _)| *g == group).map(|&(_, id)| id);
        if let Some(id) = known(&slot.family.lock().unwrap_or_else(|p| p.into_inner())) {
            return Ok(id);
        }
        let member = Arc::new(StreamSlot {
            key: slot.key.clone(),
            worker: slot.worker,
            removed: AtomicBool::new(false),
            retired: AtomicBool::new(false),
            live: AtomicUsize::new(0),
            engine: std::sync::Mutex::new(HashTable::new()),
            kind: AtomicU64::new(0),
            family: Default::default(),
            primary: Some(primary),
        });
        // The registry's lock before the family's, as every reader takes them.
        let mut reg = self.registry.write().unwrap_or_else(|p| p.into_inner());
        let mut family = slot.family.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(id) = known(&family) {
            return Ok(id);
        }
        if family.members.len() + 1 >= MAX_GROUPS {
            return Err(IndexError::TooManyGroups);
        }
        let id = Self::take_id(&mut reg, member)?;
        family.members.push((group, id));
        drop((family, reg));
        self.note_family(primary);
        Ok(id)
    }

    /// `primary`'s (worker, rank) is read as a hybrid model's from now on.
    fn note_family(&self, primary: StreamId) {
        let mut families = self.families.write().unwrap_or_else(|p| p.into_inner());
        if !families.contains(&primary) {
            families.push(primary);
        }
        self.hybrid.store(true, Ordering::Release);
    }

    /// Says what `stream`'s group keeps (from its engine's events).
    pub fn set_group_kind(&self, stream: StreamId, kind: GroupBlocks) -> Result<(), IndexError> {
        let slot = self.slot(stream)?;
        if slot.kind.swap(kind.pack(), Ordering::Relaxed) != kind.pack() && kind != GroupBlocks::Full {
            self.note_family(slot.primary.unwrap_or(stream));
        }
        Ok(())
    }

    /// The streams of `primary`'s other groups.
    pub(super) fn members(&self, primary: &StreamSlot) -> Vec<StreamId> {
        primary.family.lock().unwrap_or_else(|p| p.into_inner()).members.iter().map(|(_, id)| *id).collect()
    }

    /// `active` (each stream's contiguous depth) with every hybrid (worker, rank) read as its
    /// engine reads it: its groups' streams replaced by one entry on the primary stream, as deep
    /// as [`reusable_prefix`] says.
    pub(super) fn hybrid_depths(
        &self,
        hashes: &[BlockHash],
        opts: &MatchOptions,
        mut active: Vec<Active>,
    ) -> Vec<Active> {
        let reg = self.registry();
        let shard = self.shards[self.shard_index(hashes[0])].read().unwrap_or_else(|p| p.into_inner());
        // The chain's nodes, as far as they go.
        let mut chain = Vec::new();
        let mut prev = NO_PARENT;
        for hash in hashes {
            let Some(slot) = shard.find(*hash) else { break };
            if shard.node(slot).parent != prev {
                break;
            }
            chain.push(slot);
            prev = slot;
        }
        // Only the (worker, rank)s that publish several groups or a group that is not full
        // attention (a stream id retired meanwhile is skipped: its family is empty or it is
        // removed).
        let families = self.families.read().unwrap_or_else(|p| p.into_inner());
        for &primary in families.iter() {
            let Some(slot) = reg.streams.get(primary.index()) else { continue };
            let kind = GroupBlocks::unpack(slot.kind.load(Ordering::Relaxed));
            let members = self.members(slot);
            if slot.primary.is_some()
                || slot.removed.load(Ordering::Relaxed)
                || (members.is_empty() && kind == GroupBlocks::Full)
            {
                continue;
            }
            let mut streams = vec![(kind, primary)];
            streams.extend(members.iter().filter_map(|&id| {
                let m = reg.streams.get(id.index())?;
                Some((GroupBlocks::unpack(m.kind.load(Ordering::Relaxed)), id))
            }));
            // With full attention among its groups and none of its streams holding the first
            // block, it can reuse nothing: no walk.
            let in_active = |id: StreamId| active.iter().any(|a| a.stream == id);
            if streams.iter().any(|(k, _)| *k == GroupBlocks::Full) && !streams.iter().any(|(_, id)| in_active(*id)) {
                continue;
            }
            // Which of the chain's blocks each group holds (in a tier that counts).
            let holds: Vec<(GroupBlocks, Vec<bool>)> = streams
                .iter()
                .map(|&(kind, id)| {
                    let held = chain
                        .iter()
                        .map(|&node| {
                            shard.holders(node).any(|h| u32::from(h.stream) == id.0 && h.tiers & opts.tiers != 0)
                        })
                        .collect();
                    (kind, held)
                })
                .collect();
            let groups: Vec<(GroupBlocks, _)> =
                holds.iter().map(|(kind, held)| (*kind, |i: usize| held.get(i).copied().unwrap_or(false))).collect();
            let depth = reusable_prefix(chain.len(), &groups) as u32;
            let weight =
                active.iter().find(|a| a.stream == primary).map_or(1.0, |a| a.weighted / a.depth.max(1) as f32);
            active.retain(|a| a.stream != primary && !members.contains(&a.stream));
            if depth > 0 {
                active.push(Active { stream: primary, depth, weighted: weight * depth as f32, last_weight: weight });
            }
        }
        active
    }
}
