//! What this router sent a worker since its engine's last load report, and the throughput
//! that report gave: the load policies' expected wait adds the one to the reported queue and
//! divides by the other (a report is stale between polls: without the requests sent since,
//! every request of a poll interval would go to the worker that reported least).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The tally since a worker's last report (reset by each new one).
#[derive(Debug, Default)]
pub struct SincePoll {
    requests: AtomicU32,
    tokens: AtomicU64,
    unknown: AtomicU32,
    /// Tokens a second the report said it generates (over its ranks, rounded; 0: none).
    throughput: AtomicU32,
}

/// A snapshot of a [`SincePoll`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sent {
    /// Requests sent since the report.
    pub requests: u32,
    /// Their uncached prompt tokens, of those whose prompt was counted.
    pub tokens: u64,
    /// Those whose prompt was not counted (the router did not tokenize it).
    pub unknown: u32,
    /// The report's generation throughput, tokens a second (0: not reported).
    pub throughput: u32,
}

impl SincePoll {
    /// A request went to the worker, its uncached prompt `tokens` if counted.
    pub(crate) fn sent(&self, tokens: Option<u64>) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        match tokens {
            Some(t) => {
                self.tokens.fetch_add(t, Ordering::Relaxed);
            }
            None => {
                self.unknown.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A new report (its throughput, tokens a second): it counts what was sent before it.
    pub(crate) fn reported(&self, throughput: f64) {
        let tps = if throughput.is_finite() { throughput.round().clamp(0.0, f64::from(u32::MAX)) as u32 } else { 0 };
        self.throughput.store(tps, Ordering::Relaxed);
        self.requests.store(0, Ordering::Relaxed);
        self.tokens.store(0, Ordering::Relaxed);
        self.unknown.store(0, Ordering::Relaxed);
    }

    /// What was sent since the last report, and its throughput.
    pub fn get(&self) -> Sent {
        Sent {
            requests: self.requests.load(Ordering::Relaxed),
            tokens: self.tokens.load(Ordering::Relaxed),
            unknown: self.unknown.load(Ordering::Relaxed),
            throughput: self.throughput.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_starts_the_tally_afresh_and_keeps_its_throughput() {
        let s = SincePoll::default();
        s.sent(Some(300));
        s.sent(None);
        s.sent(Some(0));
        assert_eq!(s.get(), Sent { requests: 3, tokens: 300, unknown: 1, throughput: 0 });
        s.reported(1234.6);
        assert_eq!(s.get(), Sent { requests: 0, tokens: 0, unknown: 0, throughput: 1235 });
        s.sent(None);
        s.reported(f64::NAN);
        assert_eq!(s.get(), Sent::default());
        s.reported(-5.0);
        assert_eq!(s.get().throughput, 0);
    }
}
