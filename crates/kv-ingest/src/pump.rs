//! The pump: applies each stream's batches to the index, strictly in seq
//! order and never twice. A `BlockStored` is indexed by the router's own hash
//! of its `token_ids` (the SGLang page chain, continued from the parent's
//! digest or started from the namespace prior); the engine's hashes are kept
//! only as keys for parents and removals.
//!
//! ```text
//! subscribers ──bounded mpsc (seq-ordered per stream)──► Pump::run ──► KvIndex
//! ```

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use kv_events::{StreamMessage, StreamUpdate};

use crate::snapshot::{GroupSnapshot, IndexSnapshot, StreamSnapshot};
use crate::vllm_check::{self, VllmHashes};
use kv_index::{GroupBlocks, KvIndex, StoredBlock, StreamId};
use renderer::hash::namespace_prior;
use renderer::{HashMode, PageDigest, PageHasher};
use router_types::{BlockHash, EngineBlockHash, EventBatch, KvEvent, StoredBlocks, WorkerKey};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use router_types::metrics::Histogram;

/// How one stream's blocks are hashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamHashing {
    /// The engine's page size, used when an event states none.
    pub page_size: NonZeroUsize,
    /// Unigram or bigram (EAGLE) keys.
    pub mode: HashMode,
    /// True for SGLang streams, whose engine hashes should equal the router's.
    pub engine_hash_is_router_hash: bool,
}

/// What the pump counted.
#[derive(Debug)]
pub struct PumpMetrics {
    /// Batches applied.
    pub batches: AtomicU64,
    /// Batches dropped because their seq was not after the last applied one.
    pub duplicates: AtomicU64,
    /// Events applied, by kind.
    pub stored: AtomicU64,
    /// ...
    pub removed: AtomicU64,
    /// ...
    pub cleared: AtomicU64,
    /// Stores skipped: their parent is not indexed for that stream.
    pub orphan_stores: AtomicU64,
    /// Stores skipped: token count does not match the hashes and block size.
    pub malformed_stores: AtomicU64,
    /// Stores skipped: the index refused them (evicted parent, too long).
    pub rejected_stores: AtomicU64,
    /// Stored blocks whose SGLang engine hash differs from the router's, or whose vLLM hash
    /// differs from vLLM's own of the tokens and keys published with it: a wrong page size,
    /// tokenizer, namespace or key.
    pub hash_mismatches: AtomicU64,
    /// vLLM blocks whose published hash was checked (a stream's chain-starting stores, or all
    /// with byte hashes; without a LoRA adapter).
    pub hashes_checked: AtomicU64,
    /// Streams whose hashes are not vLLM's default ones (another algorithm or seed): not checked.
    pub hash_unchecked_streams: AtomicU64,
    /// Streams reset (publisher restarts).
    pub resets: AtomicU64,
    /// Batches from streams the pump was not told about.
    pub unknown_streams: AtomicU64,
    /// Seconds from a batch's publish time to its application.
    pub lag_seconds: Histogram,
}

/// A change to the set of streams while the pump runs.
#[derive(Debug)]
pub enum PumpControl {
    /// Register a stream before its subscriber starts, seeded from a peer's
    /// snapshot of it when given; the result is sent back: the seq the stream
    /// resumes after (`None`: it starts empty).
    AddStream(
        WorkerKey,
        StreamHashing,
        Option<StreamSnapshot>,
        tokio::sync::oneshot::Sender<Result<Option<u64>, String>>,
    ),
    /// Take a snapshot of every stream with applied batches, between two batches, within a
    /// number of blocks (streams beyond are left out whole, and counted).
    Snapshot(usize, tokio::sync::oneshot::Sender<TakenSnapshot>),
    /// Forget a stream (its worker left): its batches still queued are dropped as unknown, and
    /// its id in the index is retired (free for a later stream).
    RemoveStream(WorkerKey),
    /// Fault injection for tests: apply nothing until the sender is dropped (a pump too slow
    /// for its subscribers: their channel fills). Always compiled: a test-only feature would
    /// give the release build of every crate above this one a second feature set.
    Stall(tokio::sync::oneshot::Receiver<()>),
}

/// A snapshot the pump took.
#[derive(Debug, Clone, Default)]
pub struct TakenSnapshot {
    /// The streams in it.
    pub snapshot: IndexSnapshot,
    /// Streams left out: over the block bound.
    pub left_out: usize,
}

/// Applies stream messages to the index.
#[derive(Debug)]
pub struct Pump {
    index: Arc<KvIndex>,
    streams: HashMap<WorkerKey, StreamState>,
    metrics: Arc<PumpMetrics>,
}

#[derive(Debug)]
struct StreamState {
    id: StreamId,
    hashing: StreamHashing,
    /// Last applied seq; `None` after a reset.
    cursor: Option<u64>,
    /// Its KV-cache groups as the index was told of them (the index is asked once a group).
    groups: Vec<Group>,
}

/// One KV-cache group of a stream: its own stream in the index, and the kind last given it.
#[derive(Debug, Clone, Copy)]
struct Group {
    idx: u32,
    stream: StreamId,
    kind: Option<GroupBlocks>,
    /// What its stores have shown of vLLM's hashes.
    vllm: VllmHashes,
}

/// Buckets of the event lag histogram: engines publish every scheduler step
/// (milliseconds); seconds of lag mean a stalled pump or a clock skew.
pub const LAG_BUCKETS: [f64; 10] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0];

// === impl PumpMetrics ===

impl Default for PumpMetrics {
    fn default() -> Self {
        Self {
            batches: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            stored: AtomicU64::new(0),
            removed: AtomicU64::new(0),
            cleared: AtomicU64::new(0),
            orphan_stores: AtomicU64::new(0),
            malformed_stores: AtomicU64::new(0),
            rejected_stores: AtomicU64::new(0),
            hash_mismatches: AtomicU64::new(0),
            hashes_checked: AtomicU64::new(0),
            hash_unchecked_streams: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            unknown_streams: AtomicU64::new(0),
            lag_seconds: Histogram::new(&LAG_BUCKETS),
        }
    }
}

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

// === impl Pump ===

impl Pump {
    /// A pump writing into `index`.
    pub fn new(index: Arc<KvIndex>, metrics: Arc<PumpMetrics>) -> Self {
        Self { index, streams: HashMap::new(), metrics }
    }

    /// Registers a stream and how to hash its blocks.
    pub fn add_stream(&mut self, key: WorkerKey, hashing: StreamHashing) -> Result<(), kv_index::IndexError> {
        self.add_seeded(key, hashing, None).map(|_| ())
    }

    /// Registers a stream, with the holdings and seq of a peer's snapshot of
    /// it when they were hashed alike; returns the seq it resumes after.
    pub fn add_seeded(
        &mut self,
        key: WorkerKey,
        hashing: StreamHashing,
        seed: Option<StreamSnapshot>,
    ) -> Result<Option<u64>, kv_index::IndexError> {
        let id = self.index.stream(&key)?;
        let (mut cursor, mut groups) = (None, Vec::new());
        if let Some(seed) = seed {
            let alike =
                seed.page_size as usize == hashing.page_size.get() && seed.bigram == (hashing.mode == HashMode::Bigram);
            if !alike {
                warn!(stream = %key, page_size = seed.page_size, bigram = seed.bigram, "kv pump: peer snapshot hashed otherwise, not used");
            } else {
                // The stream may hold blocks of an earlier life (its groups' too): the snapshot
                // replaces them.
                let _ = self.index.clear_stream(id);
                // The engine's lookahead: requests are chained for it before its next store.
                let imported = self.index.note_lookahead(id, usize::from(seed.lookahead)).map_err(|e| e.to_string());
                match imported.and_then(|()| self.import_seed(id, &seed)) {
                    Ok((held, imported)) => {
                        info!(stream = %key, seq = seed.seq, blocks = held, groups = imported.len(), "kv pump: stream seeded from a peer's snapshot");
                        cursor = Some(seed.seq);
                        groups = imported;
                    }
                    Err(e) => {
                        warn!(stream = %key, error = %e, "kv pump: peer snapshot not imported");
                        let _ = self.index.clear_stream(id);
                    }
                }
            }
        }
        self.streams.insert(key, StreamState { id, hashing, cursor, groups });
        Ok(cursor)
    }

    /// A peer's snapshot of a stream into its index stream `id` (cleared): group 0's holdings
    /// and kind, then each other KV-cache group's, in a stream of its own. The blocks held, and
    /// the groups as the pump then knows them.
    fn import_seed(&self, id: StreamId, seed: &StreamSnapshot) -> Result<(usize, Vec<Group>), String> {
        let mut held = self.index.import_stream(id, &seed.blocks).map_err(|e| e.to_string())?;
        let mut groups = Vec::with_capacity(seed.groups.len() + 1);
        if let Some(kind) = seed.kind {
            self.index.set_group_kind(id, kind).map_err(|e| e.to_string())?;
            groups.push(Group { idx: 0, stream: id, kind: Some(kind), vllm: VllmHashes::Unknown });
        }
        for g in &seed.groups {
            let stream = self.index.group_stream(id, g.idx).map_err(|e| format!("group {}: {e}", g.idx))?;
            if let Some(kind) = g.kind {
                self.index.set_group_kind(stream, kind).map_err(|e| e.to_string())?;
            }
            held += self.index.import_stream(stream, &g.blocks).map_err(|e| format!("group {}: {e}", g.idx))?;
            groups.push(Group { idx: g.idx, stream, kind: g.kind, vllm: VllmHashes::Unknown });
        }
        Ok((held, groups))
    }

    /// Every stream with applied batches at its cursor, within `max_blocks`.
    pub fn snapshot(&self, max_blocks: usize) -> TakenSnapshot {
        let mut taken = TakenSnapshot::default();
        let mut total = 0usize;
        let mut keys: Vec<&WorkerKey> = self.streams.keys().collect();
        keys.sort();
        for key in keys {
            let state = &self.streams[key];
            let Some(seq) = state.cursor else { continue };
            let Ok(blocks) = self.index.export_stream(state.id) else { continue };
            // A hybrid model's other KV-cache groups, each with its kind.
            let mut groups = Vec::new();
            for g in state.groups.iter().filter(|g| g.idx != 0) {
                let Ok(blocks) = self.index.export_stream(g.stream) else { continue };
                groups.push(GroupSnapshot { idx: g.idx, kind: g.kind, blocks });
            }
            let count = blocks.len() + groups.iter().map(|g| g.blocks.len()).sum::<usize>();
            if total + count > max_blocks {
                taken.left_out += 1;
                continue;
            }
            total += count;
            let kind = state.groups.iter().find(|g| g.idx == 0).and_then(|g| g.kind);
            taken.snapshot.streams.push(StreamSnapshot {
                key: key.clone(),
                seq,
                page_size: state.hashing.page_size.get() as u32,
                bigram: state.hashing.mode == HashMode::Bigram,
                lookahead: self.index.stream_lookahead(state.id) as u8,
                kind,
                blocks,
                groups,
            });
        }
        taken
    }

    /// Applies messages until the channel closes or `cancel` fires.
    pub async fn run(self, rx: mpsc::Receiver<StreamMessage>, cancel: CancellationToken) {
        let (_keep, control) = mpsc::channel(1);
        self.run_with_control(rx, control, cancel).await;
    }

    /// Like `run`, also taking streams registered while running (workers added later).
    pub async fn run_with_control(
        mut self,
        mut rx: mpsc::Receiver<StreamMessage>,
        mut control: mpsc::Receiver<PumpControl>,
        cancel: CancellationToken,
    ) {
        let why = loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => break "cancelled",
                Some(c) = control.recv() => match c {
                    PumpControl::AddStream(key, hashing, seed, done) => {
                        let _ = done.send(self.add_seeded(key, hashing, seed).map_err(|e| e.to_string()));
                    }
                    PumpControl::Snapshot(max_blocks, done) => {
                        let _ = done.send(self.snapshot(max_blocks));
                    }
                    PumpControl::RemoveStream(key) => {
                        if let Some(state) = self.streams.remove(&key) {
                            // Its last batch is applied: its id can serve a later stream.
                            if let Err(e) = self.index.retire_stream(state.id) {
                                warn!(stream = %key, error = %e, "kv pump: retiring the stream failed");
                            }
                        }
                    }
                    PumpControl::Stall(release) => {
                        let _ = release.await;
                    }
                },
                m = rx.recv() => match m {
                    Some(m) => self.apply(m),
                    None => break "all subscribers gone",
                },
            }
        };
        info!(reason = why, "kv pump exited");
    }

    /// Applies one message (also used directly by tests and the simulator).
    pub fn apply(&mut self, message: StreamMessage) {
        let Pump { index, streams, metrics } = self;
        let Some(state) = streams.get_mut(&message.key) else {
            inc(&metrics.unknown_streams);
            return;
        };
        match message.update {
            StreamUpdate::Reset => {
                inc(&metrics.resets);
                state.cursor = None;
                match index.clear_stream(state.id) {
                    Ok(n) => debug!(stream = %message.key, cleared = n, "kv pump: stream reset"),
                    Err(e) => warn!(stream = %message.key, error = %e, "kv pump: reset failed"),
                }
            }
            StreamUpdate::Batch(decoded) => {
                if state.cursor.is_some_and(|c| message.seq <= c) {
                    inc(&metrics.duplicates);
                    return;
                }
                state.cursor = Some(message.seq);
                let applier = Applier { index, metrics };
                applier.apply_batch(&message.key, (state.id, state.hashing, &mut state.groups), &decoded.batch);
            }
        }
    }
}

/// What applying a batch writes to: the index and the counters (apart from the streams' own
/// state, which the batch's stream lends it).
struct Applier<'a> {
    index: &'a KvIndex,
    metrics: &'a PumpMetrics,
}

impl Applier<'_> {
    fn apply_batch(
        &self,
        key: &WorkerKey,
        (id, hashing, groups): (StreamId, StreamHashing, &mut Vec<Group>),
        batch: &EventBatch,
    ) {
        inc(&self.metrics.batches);
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        if batch.ts > 0.0 {
            self.metrics.lag_seconds.observe((now - batch.ts).max(0.0));
        }
        for event in &batch.events {
            match event {
                KvEvent::Stored(s) => {
                    // A hybrid model's KV-cache groups: each its own stream, matched together.
                    let Some(group) = self.group(key, id, groups, s.group_idx) else { continue };
                    let kind = s.group_kind.map(|k| GroupBlocks::of(k, s.block_size.max(1)));
                    if let Some(kind) = kind.filter(|k| group.kind != Some(*k)) {
                        match self.index.set_group_kind(group.stream, kind) {
                            Ok(()) => group.kind = Some(kind),
                            Err(e) => debug!(stream = %key, error = %e, "kv pump: group kind not kept"),
                        }
                    }
                    self.store(key, (group.stream, &mut group.vllm), hashing, s)
                }
                KvEvent::Removed { block_hashes, tier, group_idx } => {
                    let Some(group) = self.group(key, id, groups, *group_idx) else { continue };
                    let keys: Vec<u64> = block_hashes.iter().map(EngineBlockHash::key).collect();
                    if self.index.remove(group.stream, &keys, *tier).is_ok() {
                        inc(&self.metrics.removed);
                    }
                }
                KvEvent::AllCleared => {
                    if self.index.clear_stream(id).is_ok() {
                        inc(&self.metrics.cleared);
                    }
                }
            }
        }
    }

    /// KV-cache group `group` of `key`'s stream `id` (`None`: group 0, whose stream is `id`),
    /// its index stream asked for the first time it is named.
    fn group<'g>(
        &self,
        key: &WorkerKey,
        id: StreamId,
        groups: &'g mut Vec<Group>,
        group: Option<u32>,
    ) -> Option<&'g mut Group> {
        let idx = group.unwrap_or(0);
        if let Some(at) = groups.iter().position(|g| g.idx == idx) {
            return groups.get_mut(at);
        }
        match self.index.group_stream(id, idx) {
            Ok(stream) => {
                groups.push(Group { idx, stream, kind: None, vllm: VllmHashes::Unknown });
                groups.last_mut()
            }
            Err(e) => {
                inc(&self.metrics.rejected_stores);
                warn!(stream = %key, group, error = %e, "kv pump: no stream for the KV-cache group, event skipped");
                None
            }
        }
    }

    fn store(
        &self,
        key: &WorkerKey,
        (id, vllm): (StreamId, &mut VllmHashes),
        hashing: StreamHashing,
        s: &StoredBlocks,
    ) {
        let page = NonZeroUsize::new(s.block_size as usize).unwrap_or(hashing.page_size);
        let mode = if s.bigram { HashMode::Bigram } else { hashing.mode };
        let hasher = PageHasher::new(page, mode);
        if hasher.page_count(s.token_ids.len()) != s.block_hashes.len() || s.block_hashes.is_empty() {
            inc(&self.metrics.malformed_stores);
            warn!(stream = %key, hashes = s.block_hashes.len(), tokens = s.token_ids.len(), block_size = page, "kv pump: store shape does not match, skipped");
            return;
        }
        let parent = match &s.parent {
            Some(p) => match self.index.parent(id, p.key()) {
                Some(found) => Some(found),
                None => {
                    inc(&self.metrics.orphan_stores);
                    debug!(stream = %key, "kv pump: parent not indexed, store skipped");
                    return;
                }
            },
            None => None,
        };
        if let Some(lora) = s.namespace.lora_name.as_deref() {
            self.index.note_adapter(lora);
        }
        let prior: Option<PageDigest> = match &parent {
            Some(p) => Some(p.digest),
            None => namespace_prior(s.namespace.lora_name.as_deref(), s.namespace.cache_salt.as_deref()),
        };
        let mut digests = Vec::with_capacity(s.block_hashes.len());
        if let Err(e) = keyed_digests(&hasher, s, prior, &mut digests) {
            inc(&self.metrics.malformed_stores);
            warn!(stream = %key, error = %e, "kv pump: tokens cannot be hashed, skipped");
            return;
        }
        // vLLM's lookahead hashing: requests are chained for this worker's lookahead too.
        if let Err(e) = self.index.note_lookahead(id, s.lookahead_len()) {
            inc(&self.metrics.rejected_stores);
            warn!(stream = %key, error = %e, "kv pump: lookahead not followed, store skipped");
            return;
        }
        if !hashing.engine_hash_is_router_hash {
            self.check_vllm(key, vllm, s, page.get());
        }
        let check = hashing.engine_hash_is_router_hash && s.namespace.lora_name.is_none();
        let blocks: Vec<StoredBlock> = s
            .block_hashes
            .iter()
            .zip(&digests)
            .map(|(engine, digest)| {
                if check
                    && !matches!(engine, EngineBlockHash::I64(v) if BlockHash(*v) == BlockHash::from_digest(digest))
                {
                    inc(&self.metrics.hash_mismatches);
                }
                StoredBlock { engine: engine.key(), digest: *digest }
            })
            .collect();
        match self.index.store(id, parent.as_ref(), &blocks, s.tier) {
            Ok(_) => inc(&self.metrics.stored),
            Err(e) => {
                inc(&self.metrics.rejected_stores);
                debug!(stream = %key, error = %e, "kv pump: store rejected");
            }
        }
    }

    /// Checks a vLLM store's published hashes against vLLM's own (`vllm_check`): a stream's
    /// first checkable store decides whether its hashes are vLLM's default ones; from then on
    /// every block that differs is a mismatch.
    fn check_vllm(&self, key: &WorkerKey, vllm: &mut VllmHashes, s: &StoredBlocks, page: usize) {
        if *vllm == VllmHashes::Other {
            return;
        }
        let Some((matched, blocks)) = vllm_check::check(s, page) else { return };
        match *vllm {
            VllmHashes::Unknown if matched == blocks => *vllm = VllmHashes::Default,
            VllmHashes::Unknown => {
                *vllm = VllmHashes::Other;
                inc(&self.metrics.hash_unchecked_streams);
                info!(stream = %key, "kv pump: block hashes are not vLLM's default sha256 ones (another algorithm or seed): not checked");
            }
            _ if matched < blocks => {
                self.metrics.hash_mismatches.fetch_add((blocks - matched) as u64, Ordering::Relaxed);
                warn!(stream = %key, blocks, mismatched = blocks - matched, "kv pump: vLLM block hashes differ from vLLM's own of the published tokens and keys");
            }
            _ => {}
        }
        self.metrics.hashes_checked.fetch_add(blocks as u64, Ordering::Relaxed);
    }
}

/// The router's digests of a store's blocks, chained from `prior`: its tokens' pages, each block
/// whose engine hash covers keys a request cannot show (`StoredBlocks::opaque_keys`) folded
/// with them (`renderer::hash::keyed_digest`), so the chain differs from there on; each block
/// hashed with a lookahead digested with its lookahead tokens
/// (`renderer::lookahead::lookahead_digest`), as a request's chain for this worker is.
fn keyed_digests(
    hasher: &PageHasher,
    s: &StoredBlocks,
    prior: Option<PageDigest>,
    out: &mut Vec<PageDigest>,
) -> Result<(), String> {
    if s.opaque_keys.is_empty() && s.lookahead.is_empty() {
        return hasher.digests(&s.token_ids, prior.as_ref(), out).map_err(|e| e.to_string());
    }
    let blocks = s.block_hashes.len();
    if !s.opaque_keys.is_empty() && s.opaque_keys.len() != blocks || s.bigram {
        return Err(format!("{} extra keys for {blocks} blocks", s.opaque_keys.len()));
    }
    if !s.lookahead.is_empty() && s.lookahead.len() != blocks {
        return Err(format!("{} lookahead lists for {blocks} blocks", s.lookahead.len()));
    }
    let page = hasher.page_size();
    let mut state = prior;
    for i in 0..blocks {
        let tokens = &s.token_ids[(i * page).min(s.token_ids.len())..((i + 1) * page).min(s.token_ids.len())];
        if tokens.is_empty() {
            return Err("a block without tokens".into());
        }
        let mut digest = match s.lookahead.get(i) {
            Some(lookahead) => renderer::lookahead::lookahead_digest(state.as_ref(), tokens, lookahead),
            None => hasher.page_digest(&s.token_ids, i, state.as_ref()),
        }
        .map_err(|e| e.to_string())?;
        if let Some(Some(keys)) = s.opaque_keys.get(i) {
            digest = renderer::hash::keyed_digest(&digest, keys);
        }
        out.push(digest);
        state = Some(digest);
    }
    Ok(())
}
