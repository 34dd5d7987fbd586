//! Sequence tracking for one (worker, rank) stream: a pure state machine that
//! says, for each live batch, whether to apply it, repair a gap first, reset
//! the stream (publisher restart), or drop a duplicate.

/// What to do with a live batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqAction {
    /// In order: apply it.
    Apply,
    /// Batches `from..to` are missing: fetch them by replay, then apply this one.
    Gap {
        /// First missing seq.
        from: u64,
        /// The live batch's seq (exclusive end of the gap).
        to: u64,
    },
    /// The publisher restarted (seq went back, or END_SEQ on the live stream):
    /// clear the stream, then treat this batch as the first of a new stream.
    Reset,
}

/// The seq state of one stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SeqTracker {
    /// The next seq expected; `None` before the first batch of a subscription.
    next: Option<u64>,
}

// === impl SeqTracker ===

impl SeqTracker {
    /// A tracker for a new subscription.
    pub fn new() -> Self {
        Self::default()
    }

    /// A tracker resuming a stream whose batches up to `seq` are applied
    /// already (from a peer's snapshot): the next batch expected is `seq + 1`.
    pub fn resuming_after(seq: u64) -> Self {
        Self { next: Some(seq.saturating_add(1)) }
    }

    /// The next seq expected, if any batch was seen.
    pub fn next(&self) -> Option<u64> {
        self.next
    }

    /// Classifies a live batch with sequence number `seq`. Does not advance:
    /// call [`SeqTracker::applied`] for every batch actually applied.
    pub fn on_live(&self, seq: u64) -> SeqAction {
        match self.next {
            // A subscriber that joins late first sees seq > 0: ask for the start.
            None if seq == 0 => SeqAction::Apply,
            None => SeqAction::Gap { from: 0, to: seq },
            Some(n) if seq == n => SeqAction::Apply,
            Some(n) if seq > n => SeqAction::Gap { from: n, to: seq },
            Some(_) => SeqAction::Reset,
        }
    }

    /// True if a replayed batch `seq` is the next one to apply: replayed
    /// batches before the cursor (already applied) or at or after the live
    /// batch that revealed the gap are dropped, never taken for a restart.
    pub fn wants_replayed(&self, seq: u64, live: u64) -> bool {
        seq < live && self.next.is_none_or(|n| seq >= n)
    }

    /// Records that `seq` was applied.
    pub fn applied(&mut self, seq: u64) {
        self.next = Some(seq + 1);
    }

    /// Forgets everything (after a reset): the next batch starts a new stream.
    pub fn reset(&mut self) {
        self.next = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_gap_and_restart() {
        let mut t = SeqTracker::new();
        assert_eq!(t.on_live(0), SeqAction::Apply);
        t.applied(0);
        assert_eq!(t.on_live(1), SeqAction::Apply);
        t.applied(1);
        assert_eq!(t.on_live(4), SeqAction::Gap { from: 2, to: 4 });
        assert!(!t.wants_replayed(1, 4), "already applied");
        assert!(t.wants_replayed(2, 4));
        t.applied(2);
        t.applied(3);
        assert!(!t.wants_replayed(4, 4), "the live batch itself comes live");
        assert!(!t.wants_replayed(5, 4));
        t.applied(4);
        assert_eq!(t.on_live(0), SeqAction::Reset);
        t.reset();
        assert_eq!(t.on_live(0), SeqAction::Apply);
    }

    #[test]
    fn late_joiner_replays_from_zero() {
        let t = SeqTracker::new();
        assert_eq!(t.on_live(7), SeqAction::Gap { from: 0, to: 7 });
        assert!(t.wants_replayed(0, 7));
    }
}
