//! One shard of the tree: a slab of nodes, a hash table from block hash to
//! slot, parent links and child counts, holdings per stream with tier bits,
//! and sampled-LRU eviction of leaves.
//!
//! A shard knows nothing about engine hashes or workers; `index.rs` maps
//! those to (shard, slot) and takes the locks.

use std::sync::atomic::{AtomicU32, Ordering};

use hashbrown::HashTable;
use router_types::{BlockHash, PageDigest};

use crate::StreamId;

/// `parent` of a root node.
pub(crate) const NO_PARENT: u32 = u32::MAX;
/// `parent` of a free slot.
const VACANT: u32 = u32::MAX - 1;
/// Leaves compared per eviction (Redis-style approximate LRU)...
const EVICTION_LEAVES: usize = 16;
/// ...out of at most this many random slots.
const EVICTION_PROBES: usize = 128;

/// A tier bitset: bit `Tier as u8`.
pub(crate) type TierBits = u8;

/// One stream holding a node, in some tiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Holding {
    pub(crate) stream: StreamId,
    pub(crate) tiers: TierBits,
}

/// Who holds a node. One holder inline (the common case), more on the heap.
#[derive(Debug, Default)]
pub(crate) enum Holders {
    #[default]
    Empty,
    One(Holding),
    // Boxed on purpose: a thin pointer keeps `Holders` at 16 bytes in every
    // node; an inline `Vec` would make all nodes 8 bytes larger for the rare shared one.
    #[allow(clippy::box_collection)]
    Many(Box<Vec<Holding>>),
}

/// One block: its hash, the digest its children continue from, its place in the tree.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) hash: BlockHash,
    pub(crate) digest: PageDigest,
    pub(crate) parent: u32,
    pub(crate) children: u32,
    /// Logical time of the last store or match that touched it.
    pub(crate) last_used: AtomicU32,
    /// Bumped whenever the slot is reused, so stale references can be detected.
    pub(crate) generation: u16,
    pub(crate) holders: Holders,
}

/// A shard: nodes by slot, slots by hash.
#[derive(Debug, Default)]
pub(crate) struct Shard {
    nodes: Vec<Node>,
    free: Vec<u32>,
    table: HashTable<u32>,
    live: usize,
    rng: u64,
}

/// What an eviction took away: the streams that lost a holding.
#[derive(Debug, Default)]
pub(crate) struct Evicted {
    pub(crate) nodes: usize,
    pub(crate) lost: Vec<StreamId>,
}

/// Spreads a block hash over 64 bits (hashes from tests use tiny alphabets).
#[inline]
pub(crate) fn mix(hash: BlockHash) -> u64 {
    let x = (hash.0 as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^ (x >> 29)
}

// === impl Holders ===

impl Holders {
    pub(crate) fn as_slice(&self) -> &[Holding] {
        match self {
            Holders::Empty => &[],
            Holders::One(h) => std::slice::from_ref(h),
            Holders::Many(v) => v,
        }
    }

    fn get_mut(&mut self, stream: StreamId) -> Option<&mut Holding> {
        match self {
            Holders::Empty => None,
            Holders::One(h) => (h.stream == stream).then_some(h),
            Holders::Many(v) => v.iter_mut().find(|h| h.stream == stream),
        }
    }

    fn push(&mut self, holding: Holding) {
        *self = match std::mem::take(self) {
            Holders::Empty => Holders::One(holding),
            Holders::One(h) => Holders::Many(Box::new(vec![h, holding])),
            Holders::Many(mut v) => {
                v.push(holding);
                Holders::Many(v)
            }
        };
    }

    fn remove(&mut self, stream: StreamId) {
        *self = match std::mem::take(self) {
            Holders::One(h) if h.stream == stream => Holders::Empty,
            Holders::Many(mut v) => {
                v.retain(|h| h.stream != stream);
                match v.len() {
                    0 => Holders::Empty,
                    1 => Holders::One(v[0]),
                    _ => Holders::Many(v),
                }
            }
            other => other,
        };
    }

    fn heap_bytes(&self) -> usize {
        match self {
            Holders::Many(v) => {
                std::mem::size_of::<Vec<Holding>>() + v.capacity() * std::mem::size_of::<Holding>()
            }
            _ => 0,
        }
    }
}

// === impl Shard ===

impl Shard {
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            rng: seed | 1,
            ..Self::default()
        }
    }

    /// Number of live nodes.
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// The slot of `hash`, if present.
    #[inline]
    pub(crate) fn find(&self, hash: BlockHash) -> Option<u32> {
        let nodes = &self.nodes;
        self.table
            .find(mix(hash), |&slot| nodes[slot as usize].hash == hash)
            .copied()
    }

    #[inline]
    pub(crate) fn node(&self, slot: u32) -> &Node {
        &self.nodes[slot as usize]
    }

    /// True if `slot` holds a live node of this generation.
    pub(crate) fn is_live(&self, slot: u32, generation: u16) -> bool {
        self.nodes
            .get(slot as usize)
            .is_some_and(|n| n.parent != VACANT && n.generation == generation)
    }

    /// The slot of `hash` under `parent`, creating the node if needed.
    pub(crate) fn get_or_insert(
        &mut self,
        parent: u32,
        hash: BlockHash,
        digest: &PageDigest,
        now: u32,
    ) -> (u32, bool) {
        if let Some(slot) = self.find(hash) {
            return (slot, false);
        }
        let node = Node {
            hash,
            digest: *digest,
            parent,
            children: 0,
            last_used: AtomicU32::new(now),
            generation: 0,
            holders: Holders::Empty,
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                let generation = self.nodes[slot as usize].generation.wrapping_add(1);
                self.nodes[slot as usize] = Node { generation, ..node };
                slot
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        let nodes = &self.nodes;
        self.table
            .insert_unique(mix(hash), slot, |&s| mix(nodes[s as usize].hash));
        if parent != NO_PARENT {
            self.nodes[parent as usize].children += 1;
        }
        self.live += 1;
        (slot, true)
    }

    /// Adds `tiers` for `stream` on `slot`; true if the stream did not hold it before.
    pub(crate) fn hold(&mut self, slot: u32, stream: StreamId, tiers: TierBits, now: u32) -> bool {
        let node = &mut self.nodes[slot as usize];
        node.last_used.store(now, Ordering::Relaxed);
        match node.holders.get_mut(stream) {
            Some(h) => {
                h.tiers |= tiers;
                false
            }
            None => {
                node.holders.push(Holding { stream, tiers });
                true
            }
        }
    }

    /// Clears `tiers` of `stream` on `slot`; true if the stream now holds it in
    /// no tier (its holding is gone). Prunes nodes left empty.
    pub(crate) fn release(&mut self, slot: u32, stream: StreamId, tiers: TierBits) -> bool {
        let node = &mut self.nodes[slot as usize];
        let gone = match node.holders.get_mut(stream) {
            Some(h) => {
                h.tiers &= !tiers;
                h.tiers == 0
            }
            None => return false,
        };
        if gone {
            node.holders.remove(stream);
            self.prune(slot);
        }
        gone
    }

    /// Removes `slot` and then its ancestors while they hold nothing and have no children.
    fn prune(&mut self, mut slot: u32) {
        loop {
            let node = &self.nodes[slot as usize];
            if node.children > 0 || !node.holders.as_slice().is_empty() || node.parent == VACANT {
                return;
            }
            let parent = node.parent;
            self.free_slot(slot);
            if parent == NO_PARENT {
                return;
            }
            self.nodes[parent as usize].children -= 1;
            slot = parent;
        }
    }

    fn free_slot(&mut self, slot: u32) {
        let hash = self.nodes[slot as usize].hash;
        if let Ok(entry) = self.table.find_entry(mix(hash), |&s| s == slot) {
            entry.remove();
        }
        let node = &mut self.nodes[slot as usize];
        node.parent = VACANT;
        node.children = 0;
        node.holders = Holders::Empty;
        self.free.push(slot);
        self.live -= 1;
    }

    /// Evicts least-recently-used leaves until at most `max` nodes remain.
    /// `now` is the current tick: ages are wrapping differences from it.
    pub(crate) fn evict_to(&mut self, max: usize, now: u32, out: &mut Evicted) {
        while self.live > max {
            let Some(victim) = self.pick_victim(now) else {
                return;
            };
            let holders = std::mem::take(&mut self.nodes[victim as usize].holders);
            out.lost.extend(holders.as_slice().iter().map(|h| h.stream));
            out.nodes += 1;
            self.prune(victim);
        }
    }

    /// The oldest of a sample of leaves; a full scan if the sample found none.
    fn pick_victim(&mut self, now: u32) -> Option<u32> {
        let n = self.nodes.len();
        if n == 0 {
            return None;
        }
        let mut best: Option<(u32, u32)> = None;
        // (slot, age): the oldest wins; wrapping ages survive tick overflow.
        let consider = |best: &mut Option<(u32, u32)>, slot: u32, node: &Node| {
            if node.parent != VACANT && node.children == 0 {
                let age = now.wrapping_sub(node.last_used.load(Ordering::Relaxed));
                if best.is_none_or(|(_, b)| age > b) {
                    *best = Some((slot, age));
                }
            }
        };
        let mut leaves = 0;
        for _ in 0..EVICTION_PROBES {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let slot = (self.rng % n as u64) as u32;
            let node = &self.nodes[slot as usize];
            if node.parent != VACANT && node.children == 0 {
                consider(&mut best, slot, node);
                leaves += 1;
                if leaves == EVICTION_LEAVES {
                    break;
                }
            }
        }
        if best.is_none() {
            for (slot, node) in self.nodes.iter().enumerate() {
                consider(&mut best, slot as u32, node);
            }
        }
        best.map(|(slot, _)| slot)
    }

    /// Bytes allocated by this shard.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.free.capacity() * 4
            + self.table.allocation_size()
            + self
                .nodes
                .iter()
                .map(|n| n.holders.heap_bytes())
                .sum::<usize>()
    }

    /// Number of (node, stream) holdings, for tests and stats.
    pub(crate) fn holdings(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.parent != VACANT)
            .map(|n| n.holders.as_slice().len())
            .sum()
    }
}
