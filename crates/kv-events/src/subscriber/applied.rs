//! The digests of the last batches a stream applied, by seq: after a
//! reconnect, the catch-up replay is compared with them. A publisher that
//! restarted numbers its batches from 0 again, so a replayed batch at a seq
//! already applied, with other bytes, shows a restart the seqs alone cannot
//! (the new publisher's first batches lost, its next one looking like the
//! next in order). A publisher that went on replays the same bytes: its
//! buffer keeps each payload as sent (SGLang, vLLM).

use std::collections::VecDeque;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};

/// Batches remembered per stream: a restart shows as soon as the new
/// publisher's replay overlaps any of them. One that published fewer
/// batches than the oldest remembered seq is caught by the seq going back.
pub(super) const APPLIED_LOG_BATCHES: usize = 16;

/// `(seq, digest of the payload)` of the last batches applied, oldest first.
#[derive(Debug, Default)]
pub(super) struct AppliedLog {
    entries: VecDeque<(u64, u64)>,
}

// === impl AppliedLog ===

impl AppliedLog {
    /// Remembers that `seq` was applied with `payload`.
    pub(super) fn record(&mut self, seq: u64, payload: &[u8]) {
        if self.entries.len() == APPLIED_LOG_BATCHES {
            self.entries.pop_front();
        }
        self.entries.push_back((seq, digest(payload)));
    }

    /// Forgets everything (the stream was reset: its seqs start over).
    pub(super) fn clear(&mut self) {
        self.entries.clear();
    }

    /// The oldest seq remembered.
    pub(super) fn oldest(&self) -> Option<u64> {
        self.entries.front().map(|(s, _)| *s)
    }

    /// True when `seq` was applied with other bytes than `payload`.
    pub(super) fn differs(&self, seq: u64, payload: &[u8]) -> bool {
        self.entries.iter().any(|(s, d)| *s == seq && *d != digest(payload))
    }
}

/// A 64-bit digest; keys are fixed, so equal bytes give equal digests.
fn digest(payload: &[u8]) -> u64 {
    BuildHasherDefault::<DefaultHasher>::default().hash_one(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_bytes_at_an_applied_seq_differ_and_the_log_is_bounded() {
        let mut log = AppliedLog::default();
        log.record(0, b"old zero");
        assert!(!log.differs(0, b"old zero"), "the same batch replayed");
        assert!(log.differs(0, b"new zero"), "another batch at seq 0");
        assert!(!log.differs(1, b"anything"), "a seq never applied proves nothing");
        for s in 1..=APPLIED_LOG_BATCHES as u64 {
            log.record(s, &s.to_le_bytes());
        }
        assert_eq!(log.oldest(), Some(1), "seq 0 fell out");
        assert!(!log.differs(0, b"new zero"));
        log.clear();
        assert_eq!(log.oldest(), None);
    }
}
