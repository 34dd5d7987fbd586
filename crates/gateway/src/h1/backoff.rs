//! How the accept loop waits after a failed `accept` (out of descriptors, out
//! of memory; one client's connection reset before it was taken is no reason
//! to wait): twice as long after each failure in a row, from 10 ms up to 1 s,
//! back to the start after a success; one warning per burst of failures and a
//! summary at most every 10 s while it lasts, never a line per failure.

use std::time::{Duration, Instant};

const FIRST: Duration = Duration::from_millis(10);
const LAST: Duration = Duration::from_secs(1);
const REPORT_EVERY: Duration = Duration::from_secs(10);

/// The failures in a row, and what was said of them.
#[derive(Debug, Default)]
pub(super) struct Backoff {
    /// Failures since the last success.
    failures: u64,
    /// Failures not reported yet, and when the last report was.
    unreported: u64,
    reported: Option<Instant>,
}

/// What the loop does after a failure.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Pause {
    /// How long to wait before accepting again.
    pub wait: Duration,
    /// Failures to report now (the first of a burst, then a summary every 10 s): 0 says nothing.
    pub report: u64,
}

/// Whether an accept error concerns one connection only (the client reset or aborted it before
/// it was taken), not the listener: the loop takes the next at once.
pub(super) fn per_connection(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset, Interrupted};
    matches!(e.kind(), ConnectionAborted | ConnectionReset | ConnectionRefused | Interrupted)
}

impl Backoff {
    /// One more failure at `now`: how long to wait, and what to say.
    pub(super) fn failed(&mut self, now: Instant) -> Pause {
        self.failures += 1;
        self.unreported += 1;
        let shift = u32::try_from(self.failures - 1).unwrap_or(u32::MAX).min(7);
        let wait = (FIRST * (1 << shift)).min(LAST);
        let due = self.reported.is_none_or(|at| now.saturating_duration_since(at) >= REPORT_EVERY);
        let report = if due { std::mem::take(&mut self.unreported) } else { 0 };
        if due {
            self.reported = Some(now);
        }
        Pause { wait, report }
    }

    /// An accept succeeded: the next failure starts a new burst (a summary still waits its 10 s).
    pub(super) fn succeeded(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_a_second_and_a_burst_is_reported_once_then_every_ten_seconds() {
        let mut b = Backoff::default();
        let t0 = Instant::now();
        let waits: Vec<u64> = (0..9).map(|_| b.failed(t0).wait.as_millis() as u64).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.succeeded();
        assert_eq!(b.failed(t0).wait, FIRST, "a success starts over");
        let mut b = Backoff::default();
        assert_eq!(b.failed(t0).report, 1, "the first failure is said");
        let said: u64 = (1..100).map(|i| b.failed(t0 + Duration::from_millis(i * 50)).report).sum();
        assert_eq!(said, 0, "the next 5 s of failures are not");
        let summary = b.failed(t0 + REPORT_EVERY);
        assert_eq!(summary.report, 100, "then a summary of those 99 and this one");
    }

    #[test]
    fn a_connection_reset_before_it_was_taken_is_no_reason_to_wait() {
        use std::io::{Error, ErrorKind};
        assert!(per_connection(&Error::from(ErrorKind::ConnectionAborted)));
        assert!(per_connection(&Error::from(ErrorKind::ConnectionReset)));
        assert!(!per_connection(&Error::from_raw_os_error(24)), "EMFILE: out of descriptors");
        assert!(!per_connection(&Error::from(ErrorKind::OutOfMemory)));
    }
}
