//! The router's view of every engine's KV cache: which (worker, dp rank)
//! holds which block, in which storage tier. Synchronous, no tokio: the event
//! pump writes, the request path reads. See `README.md` beside this crate for
//! the layout, the invariants and the cost of each operation.

mod adapters;
mod clock;
mod index;
mod lookahead;
mod pending;
mod shard;

pub use clock::{Clock, ManualClock, SystemClock};
pub use index::{
    DEFAULT_PENDING_MAX_ENTRIES, DEFAULT_SHARDS, ExportedBlock, GroupBlocks, ImportError, IndexConfig, IndexError,
    IndexStats, KvIndex, MAX_CHAIN_BLOCKS, MAX_GROUPS, MatchOptions, Parent, StoreOutcome, StoredBlock, WorkerMatch,
    reusable_prefix,
};

/// A registered (worker, dp rank) event stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub(crate) u32);

/// A registered worker (all its dp ranks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId(pub(crate) u32);

// === impl StreamId ===

impl StreamId {
    /// The raw id (dense, from 0), for per-stream arrays.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

// === impl WorkerId ===

impl WorkerId {
    /// The raw id (dense, from 0), for per-worker arrays.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}
