//! KV-event ingestion: the pump that turns every stream's ordered batches
//! into index writes (see [`pump`]). Owns the per-stream cursors and the
//! pump's counters; does not own the streams (the fleet registers and
//! unregisters them) or the index (shared, synchronous).

pub mod pump;
pub mod snapshot;
mod vllm_check;

pub use pump::{LAG_BUCKETS, Pump, PumpControl, PumpMetrics, StreamHashing, TakenSnapshot};
pub use snapshot::{GroupSnapshot, IndexSnapshot, SnapshotError, SnapshotLimits, StreamSnapshot};
