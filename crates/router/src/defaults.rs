//! Every default of the command line, named and documented in one place.

/// Page size assumed for workers that do not advertise one (vLLM's default block size).
pub(crate) const KV_EVENTS_BLOCK_SIZE: std::num::NonZeroUsize = std::num::NonZeroUsize::new(16).unwrap();
/// Milliseconds between two lines of `sgl-router kv-events`.
pub(crate) const WATCH_INTERVAL_MS: u64 = 1000;
