//! `KvIndex`: the public face of the tree. Maps engine hashes to nodes per
//! stream, picks the shard of a chain by its root block, takes the locks in
//! one order (stream state, then shard), bounds memory, answers
//! `prefix_depths`, and keeps pending prefixes.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::time::Duration;

use hashbrown::HashTable;
use router_types::{BlockHash, DpRank, PageDigest, Tier, WorkerKey, WorkerUrl};

use crate::adapters::Adapters;
use crate::lookahead::Lookaheads;
use crate::pending::Pending;
use crate::shard::{Evicted, NO_PARENT, Shard, TICK_MASK, TierBits, mix};
use crate::{Clock, StreamId, WorkerId};

mod groups;
mod snapshot;
pub use groups::{GroupBlocks, reusable_prefix};
pub use snapshot::{ExportedBlock, ImportError};

/// Default number of shards (the reference router's).
pub const DEFAULT_SHARDS: usize = 32;
/// Default bound on pending credits (hash, worker) kept at once.
pub const DEFAULT_PENDING_MAX_ENTRIES: usize = 1 << 20;
/// Longest chain one `store` takes (the event decoder's limit).
pub const MAX_CHAIN_BLOCKS: usize = 65_536;
/// Most KV-cache groups one (worker, rank) may publish (a hybrid model has a few; a publisher
/// naming more cannot take stream ids from the others).
pub const MAX_GROUPS: usize = 32;

/// How the index is sized and what it remembers.
#[derive(Debug, Clone)]
pub struct IndexConfig {
    /// Number of shards; a chain lives in the shard of its root block.
    pub shards: NonZeroUsize,
    /// Upper bound on nodes; least recently used tails go first. `None`: unbounded.
    pub max_nodes: Option<NonZeroUsize>,
    /// How long a routing decision credits the chosen worker. `None`: off.
    pub pending_ttl: Option<Duration>,
    /// Upper bound on pending (block, worker) credits.
    pub pending_max_entries: usize,
}

/// One block of a chain to store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredBlock {
    /// The engine's hash, as `EngineBlockHash::key()`.
    pub engine: u64,
    /// The router's chain digest after this block. The block's router hash is
    /// its first eight bytes (`BlockHash::from_digest`): namespaces (LoRA,
    /// cache salt) enter the chain through its prior, never after it.
    pub digest: PageDigest,
}

// === impl StoredBlock ===

impl StoredBlock {
    /// The router's hash of the block.
    pub fn hash(&self) -> BlockHash {
        BlockHash::from_digest(&self.digest)
    }
}

/// A block a new chain continues from, found by its engine hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    /// The router's hash of the parent block.
    pub hash: BlockHash,
    /// The digest the child chain continues from.
    pub digest: PageDigest,
    loc: Loc,
}

/// What a store changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreOutcome {
    /// Nodes created.
    pub new_nodes: usize,
    /// (node, stream) holdings created.
    pub new_holdings: usize,
    /// Nodes evicted to stay under the bound.
    pub evicted: usize,
}

/// Which tiers count for a match, and how much.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MatchOptions {
    /// Tiers that count (bit `Tier as u8`); all by default.
    pub tiers: u8,
    /// Weight of a block by its best tier, for `WorkerMatch::weighted`.
    pub weights: [f32; 4],
    /// Count pending prefixes (when enabled in the config).
    pub include_pending: bool,
}

/// How many leading blocks of a query one worker holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkerMatch {
    /// The worker.
    pub worker: WorkerId,
    /// Contiguous leading blocks held (max over its ranks, and over pending credit).
    pub blocks: u32,
    /// The same blocks, each weighted by its best tier (events only).
    pub weighted: f32,
    /// The rank holding the most blocks, if any rank holds one.
    pub rank: Option<DpRank>,
    /// Leading blocks credited as pending.
    pub pending_blocks: u32,
}

/// Sizes and counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Live nodes.
    pub nodes: usize,
    /// (node, stream) holdings.
    pub holdings: usize,
    /// Registered, not removed streams.
    pub streams: usize,
    /// Nodes evicted by the bound, since start.
    pub evicted_nodes: u64,
    /// Pending credits held.
    pub pending: usize,
    /// Bytes allocated by the index.
    pub memory_bytes: usize,
}

/// Why a write was not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    /// The stream was never registered or its worker was removed.
    #[error("unknown or removed stream")]
    UnknownStream,
    /// 65,535 streams were registered already.
    #[error("too many streams registered (at most 65535)")]
    TooManyStreams,
    /// A chain longer than `MAX_CHAIN_BLOCKS`.
    #[error("chain of {0} blocks is longer than 65536")]
    ChainTooLong(usize),
    /// The parent block is no longer in the index (evicted or cleared).
    #[error("parent block is no longer indexed")]
    ParentGone,
    /// A (worker, rank) published more KV-cache groups than `MAX_GROUPS`.
    #[error("more than {} KV-cache groups on one (worker, rank)", MAX_GROUPS)]
    TooManyGroups,
    /// A lookahead longer than `MAX_LOOKAHEAD_TOKENS`.
    #[error("a lookahead of {0} tokens is longer than {max}", max = router_types::MAX_LOOKAHEAD_TOKENS)]
    LookaheadTooLong(usize),
}

/// The index.
#[derive(Debug)]
pub struct KvIndex {
    shards: Box<[RwLock<Shard>]>,
    max_per_shard: usize,
    layout: Layout,
    registry: RwLock<Registry>,
    pending: Option<RwLock<Pending>>,
    clock: Arc<dyn Clock>,
    tick: AtomicU32,
    evicted: AtomicU64,
    adapters: Adapters,
    lookaheads: Lookaheads,
    /// Some (worker, rank) publishes several KV-cache groups, or a group that is not full
    /// attention: matches read its groups together (`groups`).
    hybrid: AtomicBool,
    /// Those (worker, rank)s' primary streams.
    families: RwLock<Vec<StreamId>>,
}

#[derive(Debug, Default)]
struct Registry {
    streams: Vec<Arc<StreamSlot>>,
    /// Ids of retired streams, given to the next registrations.
    free: Vec<StreamId>,
    by_key: HashMap<WorkerKey, StreamId>,
    workers: Vec<WorkerUrl>,
    worker_ids: HashMap<WorkerUrl, WorkerId>,
}

#[derive(Debug)]
struct StreamSlot {
    key: WorkerKey,
    worker: WorkerId,
    removed: AtomicBool,
    /// Its id is on the free list (set once).
    retired: AtomicBool,
    /// (node, stream) holdings of this stream; the engine map may hold more (stale) entries.
    live: AtomicUsize,
    engine: Mutex<HashTable<EngineEntry>>,
    /// What its KV-cache group keeps (`groups::GroupBlocks`, packed; 0: full attention).
    kind: AtomicU64,
    /// Its (worker, rank)'s other groups' streams (a primary stream's).
    family: Mutex<groups::Family>,
    /// The primary stream of its (worker, rank), for a group's own stream.
    primary: Option<StreamId>,
}

/// A stream still matching during `prefix_depths`.
#[derive(Debug, Clone, Copy)]
struct Active {
    stream: StreamId,
    depth: u32,
    weighted: f32,
    /// The weight it gained at the last block it matched.
    last_weight: f32,
}

// === impl Active ===

impl Active {
    /// Applies `run` blocks whose holders equal the last matched block's: every
    /// stream that matched that block (depth == `matched`) matches them too.
    fn advance_run(active: &mut [Active], matched: u32, run: u32) {
        if run == 0 {
            return;
        }
        for a in active.iter_mut().filter(|a| a.depth == matched) {
            a.depth += run;
            a.weighted += run as f32 * a.last_weight;
        }
    }
}

/// Engine hash → node in 12 bytes: the key, and `shard | slot | generation`
/// packed by the index's `Layout`. Validated on use: the slot must be live
/// with the same (low 8 bits of) generation and held by the stream.
#[derive(Debug, Clone, Copy)]
struct EngineEntry {
    engine: [u32; 2],
    loc: u32,
}

/// Where a node is: unpacked `EngineEntry::loc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Loc {
    shard: u16,
    slot: u32,
    generation: u8,
}

/// How `loc` is packed: shard in the high bits, then slot, then 8 bits of generation.
#[derive(Debug, Clone, Copy)]
struct Layout {
    slot_bits: u32,
}

// === impl EngineEntry ===

impl EngineEntry {
    fn engine(&self) -> u64 {
        u64::from(self.engine[0]) | (u64::from(self.engine[1]) << 32)
    }
}

// === impl Layout ===

impl Layout {
    fn new(shards: usize) -> Self {
        let shard_bits = usize::BITS - (shards - 1).leading_zeros();
        Self { slot_bits: 24 - shard_bits.min(16) }
    }

    /// Slots a shard may use.
    fn slots_per_shard(&self) -> usize {
        1 << self.slot_bits
    }

    fn pack(&self, engine: u64, loc: Loc) -> EngineEntry {
        // With one shard the shard field has no bits (a shift by 32 is not a shift).
        let shard = u32::from(loc.shard).checked_shl(self.slot_bits + 8).unwrap_or(0);
        let packed = shard | (loc.slot << 8) | u32::from(loc.generation);
        EngineEntry { engine: [engine as u32, (engine >> 32) as u32], loc: packed }
    }

    fn unpack(&self, e: &EngineEntry) -> Loc {
        Loc {
            shard: e.loc.checked_shr(self.slot_bits + 8).unwrap_or(0) as u16,
            slot: (e.loc >> 8) & ((1 << self.slot_bits) - 1),
            generation: e.loc as u8,
        }
    }
}

fn tier_bit(tier: Tier) -> TierBits {
    1 << tier as u8
}

fn engine_hash(engine: u64) -> u64 {
    let x = engine.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^ (x >> 31)
}

// === impl IndexConfig ===

impl Default for IndexConfig {
    fn default() -> Self {
        Self {
            shards: NonZeroUsize::new(DEFAULT_SHARDS).unwrap_or(NonZeroUsize::MIN),
            max_nodes: None,
            pending_ttl: None,
            pending_max_entries: DEFAULT_PENDING_MAX_ENTRIES,
        }
    }
}

// === impl MatchOptions ===

impl Default for MatchOptions {
    fn default() -> Self {
        Self { tiers: 0b1111, weights: [1.0; 4], include_pending: true }
    }
}

impl MatchOptions {
    /// Only blocks in these tiers count.
    pub fn only(tiers: &[Tier]) -> Self {
        Self { tiers: tiers.iter().fold(0, |m, t| m | tier_bit(*t)), ..Self::default() }
    }
}

// === impl KvIndex ===

impl KvIndex {
    /// An empty index.
    pub fn new(config: IndexConfig, clock: Arc<dyn Clock>) -> Self {
        let n = config.shards.get().min(u16::MAX as usize);
        let shards = (0..n).map(|_| RwLock::new(Shard::default())).collect();
        let layout = Layout::new(n);
        // Room for one maximal chain above the bound, within the packed slot range.
        let hard_cap = layout.slots_per_shard().saturating_sub(MAX_CHAIN_BLOCKS).max(1);
        let max_per_shard = config.max_nodes.map_or(hard_cap, |m| m.get().div_ceil(n).min(hard_cap));
        let pending =
            config.pending_ttl.map(|ttl| RwLock::new(Pending::new(ttl.as_millis() as u64, config.pending_max_entries)));
        Self {
            shards,
            max_per_shard,
            layout,
            registry: RwLock::new(Registry::default()),
            pending,
            clock,
            tick: AtomicU32::new(0),
            hybrid: AtomicBool::new(false),
            families: RwLock::default(),
            evicted: AtomicU64::new(0),
            adapters: Adapters::default(),
            lookaheads: Lookaheads::default(),
        }
    }

    fn shard_index(&self, root: BlockHash) -> usize {
        (mix(root) >> 32) as usize % self.shards.len()
    }

    fn registry(&self) -> RwLockReadGuard<'_, Registry> {
        self.registry.read().unwrap_or_else(|p| p.into_inner())
    }

    fn slot(&self, stream: StreamId) -> Result<Arc<StreamSlot>, IndexError> {
        let slot = self.registry().streams.get(stream.index()).cloned().ok_or(IndexError::UnknownStream)?;
        if slot.removed.load(Ordering::Acquire) {
            return Err(IndexError::UnknownStream);
        }
        Ok(slot)
    }

    /// Remembers a LoRA adapter name an engine's event carried.
    pub fn note_adapter(&self, name: &str) {
        self.adapters.note(name);
    }

    /// Whether some engine's event carried the LoRA adapter name `name`.
    pub fn knows_adapter(&self, name: &str) -> bool {
        self.adapters.contains(name)
    }

    /// Records the lookahead `stream`'s engine hashes its blocks with (vLLM's
    /// `num_hash_lookahead_tokens`; 0: none), so requests are chained for it too.
    pub fn note_lookahead(&self, stream: StreamId, len: usize) -> Result<(), IndexError> {
        if len == 0 && self.lookaheads.none() {
            return Ok(());
        }
        let worker = self.slot(stream)?.worker;
        if self.lookaheads.note(worker, len) { Ok(()) } else { Err(IndexError::LookaheadTooLong(len)) }
    }

    /// The lookaheads some worker hashes with, shortest first (none: one atomic load).
    pub fn lookaheads(&self) -> impl Iterator<Item = usize> + use<> {
        self.lookaheads.lengths()
    }

    /// The lookahead `worker`'s engine hashes with (0: none).
    pub fn lookahead_of(&self, worker: WorkerId) -> usize {
        self.lookaheads.of(worker)
    }

    /// The lookahead the engine of `stream`'s worker hashes with (0: none, or an unknown stream).
    pub fn stream_lookahead(&self, stream: StreamId) -> usize {
        if self.lookaheads.none() {
            return 0;
        }
        self.slot(stream).map_or(0, |slot| self.lookaheads.of(slot.worker))
    }

    /// The id of `url`, registering it on first use.
    pub fn worker_id(&self, url: &WorkerUrl) -> WorkerId {
        if let Some(id) = self.registry().worker_ids.get(url) {
            return *id;
        }
        let mut reg = self.registry.write().unwrap_or_else(|p| p.into_inner());
        if let Some(id) = reg.worker_ids.get(url) {
            return *id;
        }
        let id = WorkerId(reg.workers.len() as u32);
        reg.workers.push(url.clone());
        reg.worker_ids.insert(url.clone(), id);
        id
    }

    /// The URL of a worker id.
    pub fn worker_url(&self, id: WorkerId) -> Option<WorkerUrl> {
        self.registry().workers.get(id.index()).cloned()
    }

    /// The id of a (worker, rank) stream, registering it on first use, under
    /// the id of a retired stream if there is one. At most 65,535 streams are
    /// registered at once (holdings store 16-bit ids).
    pub fn stream(&self, key: &WorkerKey) -> Result<StreamId, IndexError> {
        if let Some(id) = self.registry().by_key.get(key) {
            return Ok(*id);
        }
        let worker = self.worker_id(&key.worker);
        let mut reg = self.registry.write().unwrap_or_else(|p| p.into_inner());
        if let Some(id) = reg.by_key.get(key) {
            return Ok(*id);
        }
        let slot = Arc::new(StreamSlot {
            key: key.clone(),
            worker,
            removed: AtomicBool::new(false),
            retired: AtomicBool::new(false),
            live: AtomicUsize::new(0),
            engine: Mutex::new(HashTable::new()),
            kind: AtomicU64::new(0),
            family: Mutex::default(),
            primary: None,
        });
        let id = Self::take_id(&mut reg, slot)?;
        reg.by_key.insert(key.clone(), id);
        Ok(id)
    }

    /// An id for `slot`: a retired stream's if there is one.
    fn take_id(reg: &mut Registry, slot: Arc<StreamSlot>) -> Result<StreamId, IndexError> {
        Ok(match reg.free.pop() {
            Some(id) => {
                reg.streams[id.index()] = slot;
                id
            }
            None if reg.streams.len() >= usize::from(u16::MAX) => return Err(IndexError::TooManyStreams),
            None => {
                reg.streams.push(slot);
                StreamId(reg.streams.len() as u32 - 1)
            }
        })
    }

    /// Forgets a stream for good and frees its id for a later registration:
    /// its key is unregistered, every holding it has ends (those its engine
    /// map lost track of too: a walk over every shard), and its map's memory
    /// is released. Returns the holdings that ended. Only the stream's writer
    /// (the pump) may call this, after its last write to the stream: the id
    /// may be handed out again at once. Retiring twice does nothing.
    pub fn retire_stream(&self, stream: StreamId) -> Result<usize, IndexError> {
        let slot = {
            let mut reg = self.registry.write().unwrap_or_else(|p| p.into_inner());
            let slot = reg.streams.get(stream.index()).cloned().ok_or(IndexError::UnknownStream)?;
            if slot.retired.load(Ordering::Acquire) {
                return Ok(0);
            }
            reg.by_key.retain(|_, id| *id != stream);
            slot.removed.store(true, Ordering::Release);
            slot
        };
        let mut ended = self.clear_slot(stream, &slot);
        for shard in self.shards.iter() {
            ended += shard.write().unwrap_or_else(|p| p.into_inner()).release_everywhere(stream.0 as u16);
        }
        *slot.engine.lock().unwrap_or_else(|p| p.into_inner()) = HashTable::new();
        slot.retired.store(true, Ordering::Release);
        self.registry.write().unwrap_or_else(|p| p.into_inner()).free.push(stream);
        // Its groups' streams go with it.
        self.families.write().unwrap_or_else(|p| p.into_inner()).retain(|id| *id != stream);
        let members = std::mem::take(&mut slot.family.lock().unwrap_or_else(|p| p.into_inner()).members);
        for (_, member) in members {
            ended += self.retire_stream(member)?;
        }
        Ok(ended)
    }

    /// The block `stream` published as `engine`, for continuing a chain under it.
    /// A KV-cache group's chain may continue under a block only another group of its
    /// (worker, rank) still holds (a sliding window let it go): that block is found there.
    pub fn parent(&self, stream: StreamId, engine: u64) -> Option<Parent> {
        let slot = self.slot(stream).ok()?;
        if let Some(found) = self.parent_in(stream, &slot, engine) {
            return Some(found);
        }
        let primary = slot.primary.unwrap_or(stream);
        let primary_slot = self.slot(primary).ok()?;
        let family = std::iter::once(primary).chain(self.members(&primary_slot));
        family.filter(|&id| id != stream).find_map(|id| {
            let member = self.slot(id).ok()?;
            self.parent_in(id, &member, engine)
        })
    }

    /// The block `stream` (whose slot is `slot`) published as `engine`, if it still holds it.
    fn parent_in(&self, stream: StreamId, slot: &StreamSlot, engine: u64) -> Option<Parent> {
        let map = slot.engine.lock().unwrap_or_else(|p| p.into_inner());
        let loc = self.layout.unpack(map.find(engine_hash(engine), |e| e.engine() == engine)?);
        drop(map);
        let shard = self.shards[loc.shard as usize].read().unwrap_or_else(|p| p.into_inner());
        if !shard.is_live(loc.slot, loc.generation) || !shard.held_by(loc.slot, stream.0 as u16) {
            return None;
        }
        let node = shard.node(loc.slot);
        Some(Parent { hash: node.hash(), digest: node.digest, loc })
    }

    /// Records that `stream` holds `blocks` (a chain, in order) in `tier`,
    /// under `parent` or as a new root chain. Idempotent.
    pub fn store(
        &self,
        stream: StreamId,
        parent: Option<&Parent>,
        blocks: &[StoredBlock],
        tier: Tier,
    ) -> Result<StoreOutcome, IndexError> {
        let slot = self.slot(stream)?;
        let Some(first) = blocks.first() else {
            return Ok(StoreOutcome::default());
        };
        if blocks.len() > MAX_CHAIN_BLOCKS {
            return Err(IndexError::ChainTooLong(blocks.len()));
        }
        let shard_ix = match parent {
            Some(p) => p.loc.shard as usize,
            None => self.shard_index(first.hash()),
        };
        // Ticks mark "touched" for CLOCK eviction and order a child against its parent.
        let now = self.tick.fetch_add(1, Ordering::Relaxed) & TICK_MASK;
        let mut outcome = StoreOutcome::default();
        let mut evicted = Evicted::default();
        {
            let mut map = slot.engine.lock().unwrap_or_else(|p| p.into_inner());
            let mut shard = self.shards[shard_ix].write().unwrap_or_else(|p| p.into_inner());
            let mut prev = match parent {
                Some(p) if shard.is_live(p.loc.slot, p.loc.generation) && shard.node(p.loc.slot).hash() == p.hash => {
                    p.loc.slot
                }
                Some(_) => return Err(IndexError::ParentGone),
                None => NO_PARENT,
            };
            for block in blocks {
                let (node, created) = shard.get_or_insert(prev, &block.digest, now);
                outcome.new_nodes += usize::from(created);
                if shard.hold(node, stream.0 as u16, tier_bit(tier), now, !created) {
                    outcome.new_holdings += 1;
                    slot.live.fetch_add(1, Ordering::Relaxed);
                }
                let loc = Loc { shard: shard_ix as u16, slot: node, generation: shard.node(node).generation as u8 };
                self.record_engine(&mut map, block.engine, loc);
                prev = node;
            }
            if shard.len() > self.max_per_shard {
                shard.evict_to(self.max_per_shard, now, &mut evicted);
            }
            drop(shard);
            if map.len() > 2 * slot.live.load(Ordering::Relaxed) + 1024 {
                self.sweep(stream, &mut map);
            }
        }
        outcome.evicted = evicted.nodes;
        self.account_evicted(evicted);
        Ok(outcome)
    }

    /// Counts an eviction and takes the holdings it ended off their streams.
    fn account_evicted(&self, evicted: Evicted) {
        if evicted.nodes == 0 {
            return;
        }
        self.evicted.fetch_add(evicted.nodes as u64, Ordering::Relaxed);
        let reg = self.registry();
        for lost in evicted.lost {
            if let Some(s) = reg.streams.get(lost as usize) {
                s.live.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Points `engine` at `loc` in a stream's engine map.
    fn record_engine(&self, map: &mut HashTable<EngineEntry>, engine: u64, loc: Loc) {
        let entry = self.layout.pack(engine, loc);
        match map.find_mut(engine_hash(engine), |e| e.engine() == engine) {
            Some(e) => *e = entry,
            None => {
                map.insert_unique(engine_hash(engine), entry, |e| engine_hash(e.engine()));
            }
        }
    }

    /// Drops engine-map entries whose node was evicted.
    fn sweep(&self, stream: StreamId, map: &mut HashTable<EngineEntry>) {
        map.retain(|e| {
            let loc = self.layout.unpack(e);
            let shard = self.shards[loc.shard as usize].read().unwrap_or_else(|p| p.into_inner());
            shard.is_live(loc.slot, loc.generation) && shard.held_by(loc.slot, stream.0 as u16)
        });
    }

    /// Records that `stream` no longer holds the blocks published as `engines`
    /// in `tier`. Unknown hashes are ignored. Returns the holdings that ended.
    pub fn remove(&self, stream: StreamId, engines: &[u64], tier: Tier) -> Result<usize, IndexError> {
        let slot = self.slot(stream)?;
        let mut map = slot.engine.lock().unwrap_or_else(|p| p.into_inner());
        let mut ended = 0;
        for &engine in engines {
            let Some(entry) = map.find(engine_hash(engine), |e| e.engine() == engine) else {
                continue;
            };
            let loc = self.layout.unpack(entry);
            let mut shard = self.shards[loc.shard as usize].write().unwrap_or_else(|p| p.into_inner());
            let gone =
                shard.is_live(loc.slot, loc.generation) && shard.release(loc.slot, stream.0 as u16, tier_bit(tier));
            let stale = !shard.is_live(loc.slot, loc.generation) || !shard.held_by(loc.slot, stream.0 as u16);
            drop(shard);
            if gone {
                ended += 1;
                slot.live.fetch_sub(1, Ordering::Relaxed);
            }
            if stale && let Ok(e) = map.find_entry(engine_hash(engine), |e| e.engine() == engine) {
                e.remove();
            }
        }
        Ok(ended)
    }

    /// Forgets everything `stream` holds (a publisher restart or `AllBlocksCleared`).
    /// A primary stream's groups are cleared with it (the engine cleared its whole cache).
    pub fn clear_stream(&self, stream: StreamId) -> Result<usize, IndexError> {
        let slot = self.slot(stream)?;
        let mut ended = self.clear_slot(stream, &slot);
        for member in self.members(&slot) {
            if let Ok(m) = self.slot(member) {
                ended += self.clear_slot(member, &m);
            }
        }
        Ok(ended)
    }

    fn clear_slot(&self, stream: StreamId, slot: &StreamSlot) -> usize {
        let mut map = slot.engine.lock().unwrap_or_else(|p| p.into_inner());
        let mut entries: Vec<Loc> = map.drain().map(|e| self.layout.unpack(&e)).collect();
        // Deepest first is not needed: release prunes only empty, childless nodes.
        entries.sort_unstable_by_key(|e| e.shard);
        let mut ended = 0;
        let mut i = 0;
        while i < entries.len() {
            let shard_ix = entries[i].shard;
            let mut shard = self.shards[shard_ix as usize].write().unwrap_or_else(|p| p.into_inner());
            while i < entries.len() && entries[i].shard == shard_ix {
                let e = entries[i];
                if shard.is_live(e.slot, e.generation) && shard.release(e.slot, stream.0 as u16, 0b1111) {
                    ended += 1;
                }
                i += 1;
            }
        }
        slot.live.store(0, Ordering::Relaxed);
        ended
    }

    /// Drops everything `url`'s streams hold but keeps the streams registered,
    /// so its subscribers keep feeding them if it comes back. Used when a
    /// worker has been down longer than the retention period. Returns how many
    /// (block, stream) holdings ended.
    pub fn clear_worker(&self, url: &WorkerUrl) -> usize {
        self.forget_worker(url, false)
    }

    /// Forgets a worker: all its streams and its pending credits. Its ids are
    /// not reused; registering it again starts fresh streams.
    pub fn remove_worker(&self, url: &WorkerUrl) {
        self.forget_worker(url, true);
    }

    /// Ends every holding of `url`'s streams and its pending credits; with
    /// `unregister`, its streams are also unregistered and marked removed.
    fn forget_worker(&self, url: &WorkerUrl, unregister: bool) -> usize {
        let (streams, worker) = {
            let mut reg = self.registry.write().unwrap_or_else(|p| p.into_inner());
            let mut ids: Vec<StreamId> =
                reg.by_key.iter().filter(|(k, _)| &k.worker == url).map(|(_, id)| *id).collect();
            // The streams of their KV-cache groups too.
            let members: Vec<StreamId> = ids.iter().flat_map(|id| self.members(&reg.streams[id.index()])).collect();
            ids.extend(members);
            if unregister {
                reg.by_key.retain(|k, _| &k.worker != url);
            }
            let streams: Vec<(StreamId, Arc<StreamSlot>)> =
                ids.into_iter().map(|id| (id, reg.streams[id.index()].clone())).collect();
            (streams, reg.worker_ids.get(url).copied())
        };
        let mut ended = 0;
        for (id, slot) in streams {
            if unregister {
                slot.removed.store(true, Ordering::Release);
            }
            ended += self.clear_slot(id, &slot);
        }
        if let (Some(pending), Some(worker)) = (&self.pending, worker) {
            pending.write().unwrap_or_else(|p| p.into_inner()).remove_worker(worker);
        }
        if let (true, Some(worker)) = (unregister, worker) {
            self.lookaheads.forget(worker);
        }
        ended
    }

    /// Credits `worker` with `hashes` for the pending TTL (no-op when off).
    pub fn credit_pending(&self, worker: WorkerId, hashes: &[BlockHash]) {
        if let Some(pending) = &self.pending {
            let now = self.clock.now_ms();
            pending.write().unwrap_or_else(|p| p.into_inner()).credit(worker, hashes, now);
        }
    }

    /// For each worker holding at least the first of `hashes` (a request's
    /// block chain), how many leading blocks it holds contiguously.
    pub fn prefix_depths(&self, hashes: &[BlockHash], opts: &MatchOptions) -> Vec<WorkerMatch> {
        if hashes.is_empty() {
            return Vec::new();
        }
        let mut active = self.match_streams(hashes, opts);
        if self.hybrid.load(Ordering::Acquire) {
            active = self.hybrid_depths(hashes, opts, active);
        }
        let mut out: Vec<WorkerMatch> = Vec::with_capacity(active.len());
        {
            let reg = self.registry();
            for Active { stream, depth, weighted, .. } in active {
                let Some(slot) = reg.streams.get(stream.index()) else { continue };
                if slot.removed.load(Ordering::Relaxed) {
                    continue;
                }
                let rank = Some(slot.key.rank);
                out.push(WorkerMatch { worker: slot.worker, blocks: depth, weighted, rank, pending_blocks: 0 });
            }
        }
        // One entry per worker: its best rank (deepest, then lowest rank id).
        out.sort_unstable_by(|a, b| a.worker.cmp(&b.worker).then(b.blocks.cmp(&a.blocks)).then(a.rank.cmp(&b.rank)));
        out.dedup_by_key(|m| m.worker);
        if opts.include_pending
            && let Some(pending) = &self.pending
        {
            let now = self.clock.now_ms();
            for (worker, depth) in pending.read().unwrap_or_else(|p| p.into_inner()).depths(hashes, now) {
                match out.iter_mut().find(|m| m.worker == worker) {
                    Some(m) => {
                        m.pending_blocks = depth;
                        m.blocks = m.blocks.max(depth);
                    }
                    None => out.push(WorkerMatch {
                        worker,
                        blocks: depth,
                        weighted: 0.0,
                        rank: None,
                        pending_blocks: depth,
                    }),
                }
            }
        }
        out
    }

    /// Per stream holding the first block: its contiguous depth along `hashes`.
    ///
    /// Cost: one hash lookup per matched block plus, per block whose holders
    /// differ from its parent's, one binary search per holder. Runs of blocks
    /// with identical holders (a prefix every worker caches) cost one
    /// comparison of the holder lists each.
    fn match_streams(&self, hashes: &[BlockHash], opts: &MatchOptions) -> Vec<Active> {
        let mut active: Vec<Active> = Vec::new();
        let shard = self.shards[self.shard_index(hashes[0])].read().unwrap_or_else(|p| p.into_inner());
        let now = self.tick.load(Ordering::Relaxed) & TICK_MASK;
        // Blocks fully matched so far, and blocks skipped as identical to their parent.
        let (mut matched, mut run) = (0u32, 0u32);
        let mut prev = NO_PARENT;
        for (i, hash) in hashes.iter().enumerate() {
            let Some(slot) = shard.find(*hash) else { break };
            let node = shard.node(slot);
            if node.parent != prev {
                break; // a foreign chain under the same hash: never seen in practice
            }
            // Readers on many cores: write the shared line only when it changes.
            if node.last_used.load(Ordering::Relaxed) != now {
                node.last_used.store(now, Ordering::Relaxed);
            }
            if i > 0 && shard.same_holders(slot, prev) {
                run += 1;
                prev = slot;
                continue;
            }
            Active::advance_run(&mut active, matched, run);
            matched += run;
            run = 0;
            let mut advanced = false;
            for h in shard.holders(slot) {
                let tiers = h.tiers & opts.tiers;
                if tiers == 0 {
                    continue;
                }
                let weight = opts.weights[tiers.trailing_zeros() as usize];
                let stream = StreamId(u32::from(h.stream));
                if i == 0 {
                    active.push(Active { stream, depth: 1, weighted: weight, last_weight: weight });
                    advanced = true;
                } else if let Ok(at) = active.binary_search_by_key(&stream, |a| a.stream)
                    && active[at].depth == matched
                {
                    let a = &mut active[at];
                    a.depth += 1;
                    a.weighted += weight;
                    a.last_weight = weight;
                    advanced = true;
                }
            }
            if !advanced {
                break;
            }
            if i == 0 {
                // Holders are unordered: sort once, then each later holder is a binary search.
                active.sort_unstable_by_key(|a| a.stream);
            }
            matched += 1;
            prev = slot;
        }
        Active::advance_run(&mut active, matched, run);
        active
    }

    /// Drops pending credits that expired (also done on every credit).
    pub fn expire_pending(&self) {
        if let Some(pending) = &self.pending {
            let now = self.clock.now_ms();
            pending.write().unwrap_or_else(|p| p.into_inner()).expire(now);
        }
    }

    /// Blocks each worker holds (its streams' holdings summed over its ranks),
    /// for the workers that have a live stream. O(streams).
    pub fn worker_blocks(&self) -> HashMap<WorkerId, usize> {
        let mut out = HashMap::new();
        for slot in &self.registry().streams {
            // A hybrid model's other groups hold the same blocks again: its primary group counts.
            if !slot.removed.load(Ordering::Relaxed) && slot.primary.is_none() {
                *out.entry(slot.worker).or_insert(0) += slot.live.load(Ordering::Relaxed);
            }
        }
        out
    }

    /// Sizes and counters. Walks every shard: O(nodes); call at scrape rate.
    pub fn stats(&self) -> IndexStats {
        let mut stats = IndexStats { evicted_nodes: self.evicted.load(Ordering::Relaxed), ..IndexStats::default() };
        for shard in self.shards.iter() {
            let shard = shard.read().unwrap_or_else(|p| p.into_inner());
            stats.nodes += shard.len();
            stats.holdings += shard.holdings();
            stats.memory_bytes += shard.memory_bytes();
        }
        let reg = self.registry();
        for slot in &reg.streams {
            if !slot.removed.load(Ordering::Relaxed) {
                stats.streams += 1;
            }
            let map = slot.engine.lock().unwrap_or_else(|p| p.into_inner());
            stats.memory_bytes += map.allocation_size() + std::mem::size_of::<StreamSlot>();
        }
        if let Some(pending) = &self.pending {
            let p = pending.read().unwrap_or_else(|p| p.into_inner());
            stats.pending = p.len();
            stats.memory_bytes += p.memory_bytes();
        }
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_round_trips() {
        for shards in [1usize, 2, 3, 32, 33, 4096] {
            let layout = Layout::new(shards);
            for (shard, slot, generation) in [
                (0, 0, 0),
                (shards - 1, layout.slots_per_shard() as u32 - 1, 255),
                (shards / 2, 12345 % layout.slots_per_shard() as u32, 7),
            ] {
                let loc = Loc { shard: shard as u16, slot, generation };
                let e = layout.pack(0xDEAD_BEEF_0123_4567, loc);
                assert_eq!(layout.unpack(&e), loc, "{shards} shards");
                assert_eq!(e.engine(), 0xDEAD_BEEF_0123_4567);
            }
        }
        assert_eq!(std::mem::size_of::<EngineEntry>(), 12);
    }
}
