//! One shard of the tree: a slab of 64-byte nodes, a hash table from block
//! hash to slot, parent links, child counts, the set of leaves, holdings per
//! stream with tier bits, and CLOCK eviction of least recently used leaves.
//!
//! A shard knows nothing about engine hashes or workers; `index.rs` maps
//! those to (shard, slot) and takes the locks.

use std::sync::atomic::{AtomicU32, Ordering};

use hashbrown::HashTable;
use router_types::{BlockHash, PageDigest};

/// `parent` of a root node.
pub(crate) const NO_PARENT: u32 = u32::MAX;
/// `parent` of a free slot.
const VACANT: u32 = u32::MAX - 1;
/// `links` flag: the node is a leaf (else the low bits count its children).
const LEAF: u32 = 1 << 31;
/// `links` flag of a slot, kept while it is free and reused: `leaves` holds it (once). The
/// list is not kept exact: a leaf that gets a child or is freed stays listed until the CLOCK
/// hand passes it and drops it, so neither touches the list or another node (a position kept
/// per node made every freed leaf rewrite the node moved into its place: a random read and
/// write each, on the path that applies an engine's removals).
const LISTED: u32 = 1 << 30;
/// `links` bits counting children.
const CHILDREN: u32 = LISTED - 1;
/// `last_used` bit set by the CLOCK hand as it passes; a touch (store or
/// match) writes a fresh tick with the bit clear, marking the node referenced.
const PASSED: u32 = 1 << 31;
/// Ticks use the low 31 bits.
pub(crate) const TICK_MASK: u32 = PASSED - 1;

/// A tier bitset: bit `Tier as u8`.
pub(crate) type TierBits = u8;

/// One stream holding a node, in some tiers (`tiers == 0`: nobody).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Holding {
    pub(crate) stream: u16,
    pub(crate) tiers: TierBits,
}

/// A `Holding` packed in a `u32` (stream in the high half, tiers in the low
/// byte): holder lists compare with one `memcmp`.
type Packed = u32;

// === impl Holding ===

impl Holding {
    #[inline]
    fn pack(self) -> Packed {
        (u32::from(self.stream) << 16) | u32::from(self.tiers)
    }

    #[inline]
    fn unpack(p: Packed) -> Self {
        Holding { stream: (p >> 16) as u16, tiers: p as u8 }
    }
}

/// One block: 56 bytes. The digest its children continue from (its block
/// hash is the digest's first eight bytes), its place in the tree, its first
/// holder inline and any others in `overflow`.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) digest: PageDigest,
    pub(crate) parent: u32,
    /// `LEAF` or the number of children, and `LISTED`.
    links: u32,
    /// Logical time of the last store or match that touched it.
    pub(crate) last_used: AtomicU32,
    /// Bumped whenever the slot is reused, so stale references can be detected.
    pub(crate) generation: u16,
    first: Packed,
    /// Index into `Shard::overflow` (0: none).
    more: u32,
}

/// Nodes per slab chunk: growth wastes at most one chunk per shard.
const CHUNK: usize = 1024;

/// Nodes by slot, in fixed chunks (a `Vec` doubling would waste up to half).
#[derive(Debug, Default)]
pub(crate) struct Slab {
    chunks: Vec<Vec<Node>>,
    len: usize,
}

/// A shard: nodes by slot, slots by hash.
#[derive(Debug)]
pub(crate) struct Shard {
    nodes: Slab,
    free: Vec<u32>,
    table: HashTable<u32>,
    leaves: Vec<u32>,
    /// Holders beyond the first, per node that has them (slot 0 unused).
    overflow: Vec<Vec<Packed>>,
    free_overflow: Vec<u32>,
    live: usize,
    /// CLOCK hand over `leaves`.
    hand: usize,
}

/// What an eviction took away: the streams that lost a holding.
#[derive(Debug, Default)]
pub(crate) struct Evicted {
    pub(crate) nodes: usize,
    pub(crate) lost: Vec<u16>,
}

/// Iterates the holders of one node.
pub(crate) struct Holders<'a> {
    first: Option<Packed>,
    rest: std::slice::Iter<'a, Packed>,
}

/// Spreads a block hash over 64 bits (hashes from tests use tiny alphabets).
#[inline]
pub(crate) fn mix(hash: BlockHash) -> u64 {
    let x = (hash.0 as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^ (x >> 29)
}

// === impl Holders ===

impl Iterator for Holders<'_> {
    type Item = Holding;

    #[inline]
    fn next(&mut self) -> Option<Holding> {
        self.first.take().or_else(|| self.rest.next().copied()).map(Holding::unpack)
    }
}

// === impl Slab ===

impl Slab {
    fn get(&self, slot: u32) -> Option<&Node> {
        self.chunks.get(slot as usize / CHUNK).and_then(|c| c.get(slot as usize % CHUNK))
    }

    fn push(&mut self, node: Node) -> u32 {
        if self.len.is_multiple_of(CHUNK) {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        if let Some(chunk) = self.chunks.last_mut() {
            chunk.push(node);
        }
        self.len += 1;
        (self.len - 1) as u32
    }

    fn iter(&self) -> impl Iterator<Item = &Node> {
        self.chunks.iter().flatten()
    }

    fn memory_bytes(&self) -> usize {
        self.chunks.capacity() * std::mem::size_of::<Vec<Node>>()
            + self.chunks.iter().map(|c| c.capacity() * std::mem::size_of::<Node>()).sum::<usize>()
    }
}

impl std::ops::Index<u32> for Slab {
    type Output = Node;

    #[inline]
    fn index(&self, slot: u32) -> &Node {
        &self.chunks[slot as usize / CHUNK][slot as usize % CHUNK]
    }
}

impl std::ops::IndexMut<u32> for Slab {
    #[inline]
    fn index_mut(&mut self, slot: u32) -> &mut Node {
        &mut self.chunks[slot as usize / CHUNK][slot as usize % CHUNK]
    }
}

// === impl Node ===

impl Node {
    /// The block hash: the digest's first eight bytes, big-endian, signed.
    #[inline]
    pub(crate) fn hash(&self) -> BlockHash {
        BlockHash::from_digest(&self.digest)
    }

    pub(crate) fn is_leaf(&self) -> bool {
        self.links & LEAF != 0
    }

    fn children(&self) -> u32 {
        if self.is_leaf() { 0 } else { self.links & CHILDREN }
    }
}

// === impl Shard ===

impl Default for Shard {
    fn default() -> Self {
        Self {
            nodes: Slab::default(),
            free: Vec::new(),
            table: HashTable::new(),
            leaves: Vec::new(),
            overflow: vec![Vec::new()],
            free_overflow: Vec::new(),
            live: 0,
            hand: 0,
        }
    }
}

impl Shard {
    /// Number of live nodes.
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// The slot of `hash`, if present.
    #[inline]
    pub(crate) fn find(&self, hash: BlockHash) -> Option<u32> {
        let nodes = &self.nodes;
        self.table.find(mix(hash), |&slot| nodes[slot].hash() == hash).copied()
    }

    #[inline]
    pub(crate) fn node(&self, slot: u32) -> &Node {
        &self.nodes[slot]
    }

    /// The holders of `slot`.
    #[inline]
    pub(crate) fn holders(&self, slot: u32) -> Holders<'_> {
        let node = &self.nodes[slot];
        Holders { first: (node.first != 0).then_some(node.first), rest: self.overflow[node.more as usize].iter() }
    }

    /// True if two nodes have exactly the same holders in the same tiers and order.
    #[inline]
    pub(crate) fn same_holders(&self, a: u32, b: u32) -> bool {
        let (na, nb) = (&self.nodes[a], &self.nodes[b]);
        if na.first != nb.first {
            return false;
        }
        let (a, b) = (&self.overflow[na.more as usize], &self.overflow[nb.more as usize]);
        a.len() == b.len() && (a.is_empty() || a == b)
    }

    /// True if `stream` holds `slot` in some tier.
    pub(crate) fn held_by(&self, slot: u32, stream: u16) -> bool {
        self.holders(slot).any(|h| h.stream == stream)
    }

    /// True if `slot` holds a live node of this generation (its low 8 bits).
    pub(crate) fn is_live(&self, slot: u32, generation: u8) -> bool {
        self.nodes.get(slot).is_some_and(|n| n.parent != VACANT && n.generation as u8 == generation)
    }

    /// The slot of the block with `digest` under `parent`, creating it if needed.
    pub(crate) fn get_or_insert(&mut self, parent: u32, digest: &PageDigest, now: u32) -> (u32, bool) {
        let hash = BlockHash::from_digest(digest);
        if let Some(slot) = self.find(hash) {
            return (slot, false);
        }
        let node = Node {
            digest: *digest,
            parent,
            links: LEAF,
            // New blocks start unreferenced: only a later use (a match, a repeated
            // store) earns a second chance, so one-off chains cannot push out hot ones.
            last_used: AtomicU32::new((now & TICK_MASK) | PASSED),
            generation: 0,
            first: 0,
            more: 0,
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                let old = &self.nodes[slot];
                let (generation, listed) = (old.generation.wrapping_add(1), old.links & LISTED);
                self.nodes[slot] = Node { generation, links: LEAF | listed, ..node };
                slot
            }
            None => self.nodes.push(node),
        };
        self.list_leaf(slot);
        let nodes = &self.nodes;
        self.table.insert_unique(mix(hash), slot, |&s| mix(nodes[s].hash()));
        if parent != NO_PARENT {
            self.add_child(parent);
        }
        self.live += 1;
        (slot, true)
    }

    fn add_child(&mut self, slot: u32) {
        let node = &mut self.nodes[slot];
        if node.is_leaf() {
            node.links = (node.links & LISTED) | 1;
        } else {
            node.links += 1;
        }
    }

    fn remove_child(&mut self, slot: u32) {
        let node = &mut self.nodes[slot];
        node.links -= 1;
        if node.links & CHILDREN == 0 {
            node.links = LEAF | (node.links & LISTED);
            self.list_leaf(slot);
        }
    }

    /// Puts a leaf in `leaves` unless it is there already.
    fn list_leaf(&mut self, slot: u32) {
        let node = &mut self.nodes[slot];
        if node.links & LISTED == 0 {
            node.links |= LISTED;
            self.leaves.push(slot);
        }
    }

    /// True if `leaves[at]` is a live leaf; if not, drops it from the list.
    fn listed_leaf(&mut self, at: usize) -> bool {
        let slot = self.leaves[at];
        let node = &mut self.nodes[slot];
        if node.parent != VACANT && node.is_leaf() {
            return true;
        }
        node.links &= !LISTED;
        self.leaves.swap_remove(at);
        false
    }

    /// Adds `tiers` for `stream` on `slot`; true if the stream did not hold it
    /// before. `touch` marks the node used (a store of a block that existed).
    pub(crate) fn hold(&mut self, slot: u32, stream: u16, tiers: TierBits, now: u32, touch: bool) -> bool {
        let node = &mut self.nodes[slot];
        if touch {
            node.last_used.store(now & TICK_MASK, Ordering::Relaxed);
        }
        if node.first != 0 && Holding::unpack(node.first).stream == stream {
            node.first |= Packed::from(tiers);
            return false;
        }
        let more = node.more as usize;
        if let Some(h) = self.overflow[more].iter_mut().find(|h| Holding::unpack(**h).stream == stream) {
            *h |= Packed::from(tiers);
            return false;
        }
        let holding = Holding { stream, tiers }.pack();
        let node = &mut self.nodes[slot];
        if node.first == 0 {
            node.first = holding;
        } else if more == 0 {
            let ix = match self.free_overflow.pop() {
                Some(ix) => ix,
                None => {
                    self.overflow.push(Vec::new());
                    (self.overflow.len() - 1) as u32
                }
            };
            self.overflow[ix as usize].push(holding);
            self.nodes[slot].more = ix;
        } else {
            self.overflow[more].push(holding);
        }
        true
    }

    /// Clears `tiers` of `stream` on `slot`; true if the stream now holds it in
    /// no tier (its holding is gone). Prunes nodes left empty.
    pub(crate) fn release(&mut self, slot: u32, stream: u16, tiers: TierBits) -> bool {
        let clear = !Packed::from(tiers);
        let node = &mut self.nodes[slot];
        let gone = if node.first != 0 && Holding::unpack(node.first).stream == stream {
            node.first &= clear;
            node.first & 0xff == 0
        } else {
            let more = node.more as usize;
            match self.overflow[more].iter_mut().find(|h| Holding::unpack(**h).stream == stream) {
                Some(h) => {
                    *h &= clear;
                    *h & 0xff == 0
                }
                None => return false,
            }
        };
        if gone {
            self.drop_holder(slot, stream);
            self.prune(slot);
        }
        gone
    }

    /// Ends every holding of `stream` in this shard (a walk over all nodes);
    /// returns how many ended.
    pub(crate) fn release_everywhere(&mut self, stream: u16) -> usize {
        let mut ended = 0;
        for slot in 0..self.nodes.len as u32 {
            if self.nodes[slot].parent != VACANT && self.held_by(slot, stream) && self.release(slot, stream, 0b1111) {
                ended += 1;
            }
        }
        ended
    }

    /// Removes `stream`'s (now tier-less) holding, refilling `first` from the overflow.
    fn drop_holder(&mut self, slot: u32, stream: u16) {
        let more = self.nodes[slot].more as usize;
        let first = self.nodes[slot].first;
        if first != 0 && Holding::unpack(first).stream == stream {
            self.nodes[slot].first = if more != 0 { self.overflow[more].remove(0) } else { 0 };
        } else if more != 0 {
            self.overflow[more].retain(|h| Holding::unpack(*h).stream != stream);
        }
        if more != 0 && self.overflow[more].is_empty() {
            self.overflow[more] = Vec::new();
            self.free_overflow.push(more as u32);
            self.nodes[slot].more = 0;
        }
    }

    /// Removes `slot` and then its ancestors while they hold nothing and have no children.
    fn prune(&mut self, mut slot: u32) {
        loop {
            let node = &self.nodes[slot];
            if node.parent == VACANT || node.children() > 0 || node.first != 0 || node.more != 0 {
                return;
            }
            let parent = node.parent;
            self.free_slot(slot);
            if parent == NO_PARENT {
                return;
            }
            self.remove_child(parent);
            slot = parent;
        }
    }

    /// Frees a childless node (it is a leaf).
    fn free_slot(&mut self, slot: u32) {
        let hash = self.nodes[slot].hash();
        if let Ok(entry) = self.table.find_entry(mix(hash), |&s| s == slot) {
            entry.remove();
        }
        let more = self.nodes[slot].more;
        if more != 0 {
            self.overflow[more as usize] = Vec::new();
            self.free_overflow.push(more);
        }
        let node = &mut self.nodes[slot];
        node.parent = VACANT;
        node.links &= LISTED;
        node.first = 0;
        node.more = 0;
        self.free.push(slot);
        self.live -= 1;
    }

    /// Evicts least recently used leaves until at most `max` nodes remain:
    /// CLOCK over the leaf set. A leaf touched (stored or matched) since the
    /// hand last passed gets a second chance; the hand clears its mark.
    /// Blocks created by the store at tick `now` are never its own victims.
    pub(crate) fn evict_to(&mut self, max: usize, now: u32, out: &mut Evicted) {
        let just_stored = (now & TICK_MASK) | PASSED;
        let mut spared = 0;
        while self.live > max && !self.leaves.is_empty() {
            if self.hand >= self.leaves.len() {
                self.hand = 0;
            }
            if !self.listed_leaf(self.hand) {
                continue; // no longer a leaf: dropped from the list, the last entry moved here
            }
            let slot = self.leaves[self.hand];
            let used = self.nodes[slot].last_used.load(Ordering::Relaxed);
            if used == just_stored {
                spared += 1;
                if spared > self.leaves.len() {
                    return; // only this store's blocks are left: exceed the bound for now
                }
                self.hand += 1;
                continue;
            }
            if used & PASSED == 0 {
                self.nodes[slot].last_used.fetch_or(PASSED, Ordering::Relaxed);
                self.hand += 1;
                continue;
            }
            out.lost.extend(self.holders(slot).map(|h| h.stream));
            out.nodes += 1;
            let node = &mut self.nodes[slot];
            node.first = 0;
            if node.more != 0 {
                let more = node.more;
                node.more = 0;
                self.overflow[more as usize] = Vec::new();
                self.free_overflow.push(more);
            }
            let parent = node.parent;
            // Frees the leaf (dropped from the list when the hand comes back to this place).
            self.prune(slot);
            // Tails first: a parent exposed as a leaf that was not touched after
            // its evicted child is as cold as it, and goes on the hand's next visit.
            if parent != NO_PARENT && self.nodes[parent].is_leaf() {
                let p = &self.nodes[parent].last_used;
                let age = (p.load(Ordering::Relaxed) & TICK_MASK).wrapping_sub(used & TICK_MASK) & TICK_MASK;
                let touched_after_child = age != 0 && age < PASSED / 2;
                if !touched_after_child {
                    p.fetch_or(PASSED, Ordering::Relaxed);
                }
            }
        }
    }

    /// Bytes allocated by this shard.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.nodes.memory_bytes()
            + (self.free.capacity() + self.leaves.capacity() + self.free_overflow.capacity()) * 4
            + self.table.allocation_size()
            + self.overflow.capacity() * std::mem::size_of::<Vec<Packed>>()
            + self.overflow.iter().map(|v| v.capacity() * std::mem::size_of::<Packed>()).sum::<usize>()
    }

    /// Number of (node, stream) holdings, for stats.
    pub(crate) fn holdings(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.parent != VACANT)
            .map(|n| usize::from(n.first != 0) + self.overflow[n.more as usize].len())
            .sum()
    }
}

/// A digest whose block hash is `h` (tests).
#[cfg(test)]
pub(crate) fn digest(h: i64) -> PageDigest {
    let mut d = [0u8; 32];
    d[..8].copy_from_slice(&h.to_be_bytes());
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    /// A chain matched between stores survives a tiny shard churning through one-off chains.
    fn hot_chain_survives_churn() {
        let mut s = Shard::default();
        let mut tick = 0u32;
        let mut hot = Vec::new();
        let mut prev = NO_PARENT;
        for i in 0..8 {
            let (slot, _) = s.get_or_insert(prev, &digest(1000 + i), tick);
            s.hold(slot, 0, 1, tick, false);
            hot.push(slot);
            prev = slot;
        }
        for step in 0..200i64 {
            tick += 1;
            let mut prev = NO_PARENT;
            for i in 0..8 {
                let (slot, _) = s.get_or_insert(prev, &digest(step * 100 + i + 1_000_000), tick);
                s.hold(slot, 0, 1, tick, false);
                prev = slot;
            }
            let mut ev = Evicted::default();
            s.evict_to(64, tick, &mut ev);
            let alive = hot.iter().all(|&h| {
                s.node(h).hash().0 >= 1000 && s.node(h).hash().0 < 1008 && s.is_live(h, s.node(h).generation as u8)
            });
            assert!(alive, "hot chain lost a block at step {step}");
            assert!(s.len() <= 64);
            tick += 1;
            for &h in &hot {
                s.node(h).last_used.store(tick, Ordering::Relaxed);
            }
        }
    }

    #[test]
    fn a_node_is_56_bytes() {
        assert_eq!(std::mem::size_of::<Node>(), 56);
    }

    impl Shard {
        /// The live leaves, checking the list's invariants: every live leaf is listed, no slot
        /// twice, and a slot is marked listed exactly when it is in the list.
        fn live_leaves(&self) -> usize {
            let mut seen = std::collections::HashSet::new();
            for &slot in &self.leaves {
                assert!(seen.insert(slot), "slot {slot} listed twice");
                assert!(self.nodes[slot].links & LISTED != 0, "slot {slot} listed but not marked");
            }
            let mut leaves = 0;
            for slot in 0..self.nodes.len as u32 {
                let node = &self.nodes[slot];
                assert_eq!(node.links & LISTED != 0, seen.contains(&slot), "slot {slot}: mark and list disagree");
                if node.parent != VACANT && node.is_leaf() {
                    assert!(seen.contains(&slot), "live leaf {slot} not listed");
                    leaves += 1;
                }
            }
            leaves
        }
    }

    /// The leaf list stays sound through stores, removals, slot reuse and eviction.
    #[test]
    fn the_leaf_list_holds_every_leaf_once_through_churn() {
        let mut s = Shard::default();
        let mut rng = router_types::SplitMix::new(7);
        // (slot, generation): a slot freed and reused is another node.
        let mut chains: Vec<Vec<(u32, u8)>> = Vec::new();
        for round in 0..400u32 {
            // A chain of 1-6 blocks under a random earlier chain's node (or a root).
            let mut prev = match chains.get((rng.next_u64() % (chains.len() as u64 + 1)) as usize) {
                Some(c) if !c.is_empty() => c[(rng.next_u64() % c.len() as u64) as usize].0,
                _ => NO_PARENT,
            };
            let mut chain = Vec::new();
            for i in 0..1 + rng.next_u64() % 6 {
                let (slot, _) = s.get_or_insert(prev, &digest(i64::from(round) * 100 + i as i64), round);
                s.hold(slot, 1, 1, round, false);
                chain.push((slot, s.node(slot).generation as u8));
                prev = slot;
            }
            chains.push(chain);
            // Now and then the oldest chain released deepest first, as an engine evicts it.
            if round % 3 == 0 {
                let old = chains.remove(0);
                for &(slot, generation) in old.iter().rev() {
                    if s.is_live(slot, generation) {
                        s.release(slot, 1, 1);
                    }
                }
            }
            if round % 50 == 49 {
                let mut out = Evicted::default();
                s.evict_to(s.len() / 2, round + 1, &mut out);
            }
            chains.retain(|c| c.iter().all(|&(slot, generation)| s.is_live(slot, generation)));
            s.live_leaves();
        }
    }

    #[test]
    fn leaves_track_children() {
        let mut s = Shard::default();
        let (a, _) = s.get_or_insert(NO_PARENT, &digest(1), 0);
        let (b, _) = s.get_or_insert(a, &digest(2), 0);
        let (c, _) = s.get_or_insert(a, &digest(3), 0);
        assert!(!s.node(a).is_leaf() && s.node(b).is_leaf() && s.node(c).is_leaf());
        assert_eq!(s.live_leaves(), 2);
        for (slot, stream) in [(b, 1), (c, 2)] {
            s.hold(slot, stream, 1, 0, true);
        }
        s.hold(b, 7, 2, 0, true);
        assert_eq!(s.holders(b).count(), 2);
        assert!(s.release(b, 1, 1));
        assert_eq!(s.holders(b).collect::<Vec<_>>(), vec![Holding { stream: 7, tiers: 2 }]);
        assert!(s.release(b, 7, 2));
        assert_eq!(s.len(), 2, "b pruned, a keeps c");
        assert!(s.release(c, 2, 1));
        assert_eq!((s.len(), s.live_leaves()), (0, 0), "c, then a pruned");
    }
}
#[cfg(test)]
mod overflow_tests {
    use super::*;

    /// Slot 0 of the overflow table is the shared "no extra holders" list.
    #[test]
    fn overflow_zero_stays_empty() {
        let mut s = Shard::default();
        for w in 0..4u16 {
            let mut prev = NO_PARENT;
            for i in 0..32i64 {
                let (slot, _) = s.get_or_insert(prev, &digest(i64::from(w) * 1000 + i), 1);
                s.hold(slot, w, 1, 1, false);
                prev = slot;
            }
        }
        assert_eq!(s.overflow[0].len(), 0, "overflow[0] {:?}", &s.overflow[0][..s.overflow[0].len().min(10)]);
    }
}
