//! Counters owned by the subscriber side. Plain atomics: the router exports
//! them in Prometheus text; labels come from closed sets (outcome, kind).
//!
//! Every way a stream's view can stop matching the engine's is counted here,
//! with what the subscriber did about it: a replay that filled the gap, or a
//! reset (by cause: publisher restart, unfillable gap, undecodable batch).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use router_types::WorkerKey;

/// What the subscribers counted.
#[derive(Debug, Default)]
pub struct EventMetrics {
    /// Batches decoded and handed to the pump.
    pub batches: AtomicU64,
    /// Payloads that failed to decode, live or replayed copies alike (a bad
    /// batch whose replayed copy is bad too counts twice; per kind below).
    pub decode_errors: AtomicU64,
    /// ... of which truncated.
    pub decode_truncated: AtomicU64,
    /// ... of which malformed.
    pub decode_malformed: AtomicU64,
    /// ... of which over the length limits.
    pub decode_too_long: AtomicU64,
    /// Batches whose first copy (live, or replayed for a gap) did not decode.
    /// Each ends in `bad_batches_replayed` or `bad_batch_resets`.
    pub undecodable_batches: AtomicU64,
    /// Undecodable live batches whose copy fetched by replay decoded.
    pub bad_batches_replayed: AtomicU64,
    /// Streams reset because a batch decoded in no copy (or replay was unavailable).
    pub bad_batch_resets: AtomicU64,
    /// Events of unknown type or medium, skipped.
    pub unknown_events: AtomicU64,
    /// Live messages without 3 frames or with a bad seq frame.
    pub malformed_frames: AtomicU64,
    /// Gaps fully repaired by replay.
    pub replay_repaired: AtomicU64,
    /// Gaps partly repaired (the publisher's buffer no longer had everything).
    pub replay_incomplete: AtomicU64,
    /// Replays that failed on the socket (any caller), or batches missing
    /// (a gap, an undecodable batch) with no replay endpoint to ask.
    pub replay_failed: AtomicU64,
    /// Replays that hit their deadline (any caller).
    pub replay_timeouts: AtomicU64,
    /// Replays refused for sending more batches or bytes than the limits (any caller).
    pub replay_over_limit: AtomicU64,
    /// Replays not asked because the endpoint failed within the replay backoff.
    pub replay_skipped: AtomicU64,
    /// Publisher restarts detected (seq regression or END_SEQ live).
    pub resets: AtomicU64,
    /// Streams reset because a gap could not be filled (replay failed,
    /// skipped or incomplete, or no replay endpoint) while the stream held state.
    pub gap_resets: AtomicU64,
    /// Publisher restarts seen only by a reconnect's replay: a batch at a seq
    /// already applied came back with other bytes.
    pub rewritten_resets: AtomicU64,
    /// Live batches read and held while a replay ran (not left in the socket).
    pub live_held: AtomicU64,
    /// Live batches dropped because the hold buffer was full (a gap, repaired later).
    pub live_dropped: AtomicU64,
    /// Times the channel to the pump was full and the subscriber waited.
    pub channel_full_waits: AtomicU64,
    /// Connection attempts that failed.
    pub connect_failures: AtomicU64,
    /// Connections to a publisher made again after it dropped (each followed
    /// by a catch-up replay).
    pub reconnects: AtomicU64,
    /// Batches of the streams' history this router never saw: published
    /// before it subscribed and no longer held by the publishers (the first
    /// applied seq of each stream started from nothing).
    pub history_missed_batches: AtomicU64,
    /// Streams resumed from a peer's snapshot: their first batch after the
    /// snapshot's seq followed on from it.
    pub snapshot_resumed: AtomicU64,
    /// Streams resumed from a peer's snapshot that had to be reset: the
    /// publisher no longer held the batches after the snapshot's seq, or restarted.
    pub snapshot_resets: AtomicU64,
    /// Each stream's connection to its publisher.
    links: Mutex<HashMap<WorkerKey, Link>>,
    history: Mutex<HashMap<WorkerKey, StreamHistory>>,
}

/// A stream's connection to its publisher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    /// Its subscriber has not connected yet, since then.
    Connecting(std::time::Instant),
    Up,
    /// It lost its connection (or failed its first), since then.
    Down(std::time::Instant),
}

/// How a stream's history reached this router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamHistory {
    /// Started from nothing; the first batch applied was this seq, so this
    /// many batches were never seen (0: none missed).
    Missed {
        /// Batches missed.
        batches: u64,
    },
    /// Resumed from a peer's snapshot at this seq.
    Resumed {
        /// The snapshot's seq.
        after: u64,
    },
    /// Resumed from a peer's snapshot the publisher could not continue: reset.
    SnapshotReset,
}

/// Which replay outcome to count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayOutcome {
    /// Every missing batch arrived.
    Repaired,
    /// Some missing batches were no longer buffered.
    Incomplete,
    /// The replay socket failed, or there is none.
    Failed,
    /// The replay did not finish before its deadline.
    TimedOut,
    /// The replay sent more than the limits allow.
    OverLimit,
    /// Not asked: the endpoint failed within the replay backoff.
    Skipped,
}

// === impl EventMetrics ===

impl EventMetrics {
    pub(crate) fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn replay(&self, outcome: ReplayOutcome) {
        Self::inc(match outcome {
            ReplayOutcome::Repaired => &self.replay_repaired,
            ReplayOutcome::Incomplete => &self.replay_incomplete,
            ReplayOutcome::Failed => &self.replay_failed,
            ReplayOutcome::TimedOut => &self.replay_timeouts,
            ReplayOutcome::OverLimit => &self.replay_over_limit,
            ReplayOutcome::Skipped => &self.replay_skipped,
        });
    }

    pub(crate) fn decode_error(&self, kind: &str) {
        Self::inc(&self.decode_errors);
        Self::inc(match kind {
            "truncated" => &self.decode_truncated,
            "too_long" => &self.decode_too_long,
            _ => &self.decode_malformed,
        });
    }

    pub(crate) fn set_connected(&self, key: &WorkerKey, up: bool) {
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        let link = links.entry(key.clone()).or_insert_with(|| Link::Connecting(std::time::Instant::now()));
        *link = match (*link, up) {
            (_, true) => Link::Up,
            // Down since it was last up, or since its subscriber started.
            (Link::Connecting(since) | Link::Down(since), false) => Link::Down(since),
            (Link::Up, false) => Link::Down(std::time::Instant::now()),
        };
    }

    /// A subscriber starts on `key`: not connected yet, since now (unless it already was down).
    pub(crate) fn starting(&self, key: &WorkerKey) {
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        links.entry(key.clone()).or_insert_with(|| Link::Connecting(std::time::Instant::now()));
    }

    /// How long stream `key` has been without a connection to its publisher (`None`: connected,
    /// or unknown).
    pub fn down_for(&self, key: &WorkerKey) -> Option<std::time::Duration> {
        match self.links.lock().unwrap_or_else(|p| p.into_inner()).get(key)? {
            Link::Connecting(since) | Link::Down(since) => Some(since.elapsed()),
            Link::Up => None,
        }
    }

    /// Forgets a stream whose worker left (its connection gauge goes).
    pub fn forget(&self, key: &WorkerKey) {
        self.links.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
        self.history.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }

    pub(crate) fn set_history(&self, key: &WorkerKey, h: StreamHistory) {
        self.history.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone(), h);
    }

    /// How each stream's history reached this router (streams with no batch yet are absent).
    pub fn history(&self, key: &WorkerKey) -> Option<StreamHistory> {
        self.history.lock().unwrap_or_else(|p| p.into_inner()).get(key).copied()
    }

    /// Whether each stream's subscriber is connected now (one still making its first
    /// connection is not listed).
    pub fn connected(&self) -> Vec<(WorkerKey, bool)> {
        let map = self.links.lock().unwrap_or_else(|p| p.into_inner());
        let listed = map.iter().filter(|(_, l)| !matches!(l, Link::Connecting(_)));
        let mut out: Vec<_> = listed.map(|(k, l)| (k.clone(), *l == Link::Up)).collect();
        out.sort();
        out
    }

    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
