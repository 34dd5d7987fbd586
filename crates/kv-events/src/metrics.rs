//! Counters owned by the subscriber side. Plain atomics: the router exports
//! them in Prometheus text; labels come from closed sets (outcome, kind).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use router_types::WorkerKey;

/// What the subscribers counted.
#[derive(Debug, Default)]
pub struct EventMetrics {
    /// Batches decoded and handed to the pump.
    pub batches: AtomicU64,
    /// Payloads that failed to decode (the batch is lost; counted per kind below).
    pub decode_errors: AtomicU64,
    /// ... of which truncated.
    pub decode_truncated: AtomicU64,
    /// ... of which malformed.
    pub decode_malformed: AtomicU64,
    /// ... of which over the length limits.
    pub decode_too_long: AtomicU64,
    /// Events of unknown type or medium, skipped.
    pub unknown_events: AtomicU64,
    /// Live messages without 3 frames or with a bad seq frame.
    pub malformed_frames: AtomicU64,
    /// Gaps fully repaired by replay.
    pub replay_repaired: AtomicU64,
    /// Gaps partly repaired (the publisher's buffer no longer had everything).
    pub replay_incomplete: AtomicU64,
    /// Replays that failed (timeout, connection) or gaps with no replay endpoint.
    pub replay_failed: AtomicU64,
    /// Publisher restarts detected (seq regression or END_SEQ live).
    pub resets: AtomicU64,
    /// Times the channel to the pump was full and the subscriber waited.
    pub channel_full_waits: AtomicU64,
    /// Connection attempts that failed.
    pub connect_failures: AtomicU64,
    connected: Mutex<HashMap<WorkerKey, bool>>,
}

/// Which replay outcome to count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayOutcome {
    /// Every missing batch arrived.
    Repaired,
    /// Some missing batches were no longer buffered.
    Incomplete,
    /// The replay did not answer.
    Failed,
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
        self.connected.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone(), up);
    }

    /// Whether each stream's subscriber is connected now.
    pub fn connected(&self) -> Vec<(WorkerKey, bool)> {
        let map = self.connected.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<_> = map.iter().map(|(k, v)| (k.clone(), *v)).collect();
        out.sort();
        out
    }

    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
