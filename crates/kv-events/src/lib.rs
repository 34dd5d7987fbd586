//! KV events from SGLang and vLLM engines: the wire format (decode and encode,
//! pure functions), sequence tracking, the replay client, the per-stream ZMQ
//! subscriber, and a publisher in the engines' format for the simulated
//! engine and the tests.
//!
//! Workers are not trusted: whatever their answers control is bounded, with a
//! named default for each bound, so that one broken or hostile worker costs
//! the router a bounded amount of memory, time and tasks, and never a silently
//! wrong index.
//!
//! | what a worker controls            | bound                                                        |
//! |-----------------------------------|--------------------------------------------------------------|
//! | streams (`dp_size`, /server_info) | [`discovery::MAX_DP_SIZE`], else [`DiscoveryError::TooManyRanks`] |
//! | the /server_info body             | [`discovery::MAX_SERVER_INFO_BYTES`]                         |
//! | one batch's payload               | [`wire::DEFAULT_MAX_PAYLOAD_BYTES`], list lengths, nesting   |
//! | one replay                        | [`replay::DEFAULT_REPLAY_TIMEOUT`], [`replay::DEFAULT_MAX_REPLAY_BATCHES`], [`replay::DEFAULT_MAX_REPLAY_BYTES`] |
//! | live batches held during a replay | [`subscriber::DEFAULT_LIVE_HOLD_BATCHES`], [`subscriber::DEFAULT_LIVE_HOLD_BYTES`] |
//! | replays asked of a failing socket | none within [`subscriber::DEFAULT_REPLAY_BACKOFF`]           |
//! | one ZMQ frame, message, frames per message | `zeromq::MAX_FRAME_BYTES`, `MAX_MESSAGE_BYTES`, `MAX_MESSAGE_FRAMES` (vendored patch) |
//!
//! What cannot be recovered (a gap no replay fills, a batch that decodes in no
//! copy) resets the stream ([`StreamUpdate::Reset`]) and is counted in
//! [`EventMetrics`]. Below this crate, the ZMTP codec bounds one frame, one
//! message and its frame count (`zeromq::MAX_FRAME_BYTES` and friends): upstream
//! `zeromq` 0.7 reserved whatever a frame header claimed, so 9 bytes claiming
//! 2^40 aborted the process; the workspace builds a patched copy
//! (`vendor/zeromq/PATCHES.md`), and `tests/zmq_frame_bound.rs` holds it to that.

#[cfg(feature = "net")]
pub mod discovery;
mod extra_keys;
#[cfg(feature = "net")]
pub mod metrics;
mod msgpack;
#[cfg(feature = "net")]
pub mod publisher;
#[cfg(feature = "net")]
pub mod replay;
pub mod seq;
#[cfg(feature = "net")]
pub mod subscriber;
pub mod wire;

#[cfg(feature = "net")]
pub use discovery::{
    DiscoveryError, ExplicitEndpoints, WorkerEvents, discover, explicit_streams, parse_server_info, parse_worker_flag,
    read_server_info,
};
#[cfg(feature = "net")]
pub use metrics::{EventMetrics, ReplayOutcome, StreamHistory};
#[cfg(feature = "net")]
pub use publisher::{Publisher, PublisherConfig, PublisherError};
pub use seq::{SeqAction, SeqTracker};
#[cfg(feature = "net")]
pub use subscriber::{
    StreamEndpoints, StreamMessage, StreamUpdate, SubscriberConfig, spawn_subscriber, spawn_subscriber_after,
};
pub use wire::{Decoded, EventForm, Limits, decode_batch, encode_batch};

/// Why a payload could not be decoded. Never a panic: every malformed,
/// truncated or oversized input maps to one of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The payload ended inside an item.
    #[error("payload truncated at byte {at}")]
    Truncated {
        /// Byte offset where more was expected.
        at: usize,
    },
    /// An item has the wrong type or an impossible value.
    #[error("malformed payload at byte {at}: {what}")]
    Malformed {
        /// Byte offset just after the offending item.
        at: usize,
        /// What was expected.
        what: &'static str,
    },
    /// A list, or the payload itself, is longer than the decoder allows.
    #[error("{what}: {len}, more than the limit of {limit}")]
    TooLong {
        /// Which list (`block_hashes`, `token_ids`) or `payload bytes`.
        what: &'static str,
        /// Its declared length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// An error inside one event of the batch.
    #[error("event {index}: {source}")]
    InEvent {
        /// The event's position in the batch.
        index: usize,
        /// What went wrong.
        source: Box<WireError>,
    },
}

// === impl WireError ===

impl WireError {
    /// A stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            WireError::Truncated { .. } => "truncated",
            WireError::Malformed { .. } => "malformed",
            WireError::TooLong { .. } => "too_long",
            WireError::InEvent { source, .. } => source.kind(),
        }
    }

    pub(crate) fn in_event(self, index: usize) -> Self {
        WireError::InEvent { index, source: Box::new(self) }
    }
}
