//! A worker's circuit breaker (SGLang Model Gateway's `--cb-*` flags):
//! closed while requests to the worker succeed; open, out of rotation, once
//! `failure_threshold` of them failed in a row within `window`; half-open,
//! back in rotation on trial, after `timeout`; closed again after
//! `success_threshold` successes in a row, open again at the first failure.
//!
//! A failure is an answer the worker could not give: it could not be reached,
//! it timed out, it died mid-answer, or it answered 5xx. Any other answer (a
//! 4xx is the client's mistake, answered by a working worker) is a success. The closed state costs one atomic load
//! per routing decision and one per answer.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tracing::{info, warn};

/// The breaker's knobs, with SGLang Model Gateway's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Off: every worker's breaker stays closed (`--disable-circuit-breaker`).
    pub enabled: bool,
    /// Failures in a row that open it (`--cb-failure-threshold`).
    pub failure_threshold: u32,
    /// Successes in a row, half-open, that close it (`--cb-success-threshold`).
    pub success_threshold: u32,
    /// How long it stays open before a trial (`--cb-timeout-duration-secs`).
    pub timeout: Duration,
    /// Failures in a row count only within this long of the first of them
    /// (`--cb-window-duration-secs`): rare failures never add up to an opening.
    pub window: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            failure_threshold: 10,
            success_threshold: 3,
            timeout: Duration::from_secs(60),
            window: Duration::from_secs(120),
        }
    }
}

/// Where a breaker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Requests flow.
    Closed,
    /// Out of rotation until its timeout passes.
    Open,
    /// In rotation on trial.
    HalfOpen,
}

impl BreakerState {
    /// A stable label (metrics, `/workers`).
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }

    /// Its value in the `router_worker_circuit_state` gauge.
    pub fn code(self) -> u64 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::Open => 1,
            BreakerState::HalfOpen => 2,
        }
    }
}

const CLOSED: u8 = 0;
const OPEN: u8 = 1;
const HALF_OPEN: u8 = 2;

/// One worker's breaker.
#[derive(Debug)]
pub(crate) struct Breaker {
    config: BreakerConfig,
    state: AtomicU8,
    /// Failures in a row (closed) or successes in a row (half-open).
    run: AtomicU32,
    /// When the current run of failures began, or when it opened.
    since: Mutex<Instant>,
    /// Times it opened.
    pub(crate) opened: AtomicU64,
}

impl Breaker {
    pub(crate) fn new(config: BreakerConfig) -> Self {
        Self {
            config,
            state: AtomicU8::new(CLOSED),
            run: AtomicU32::new(0),
            since: Mutex::new(Instant::now()),
            opened: AtomicU64::new(0),
        }
    }

    fn since(&self) -> std::sync::MutexGuard<'_, Instant> {
        self.since.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where it is now (an open breaker past its timeout is half-open).
    pub(crate) fn state(&self) -> BreakerState {
        match self.state.load(Ordering::Acquire) {
            CLOSED => BreakerState::Closed,
            HALF_OPEN => BreakerState::HalfOpen,
            _ if self.since().elapsed() >= self.config.timeout => BreakerState::HalfOpen,
            _ => BreakerState::Open,
        }
    }

    /// Whether requests may go to the worker; an open breaker whose timeout
    /// passed turns half-open here.
    pub(crate) fn allows(&self, url: &dyn std::fmt::Display) -> bool {
        match self.state.load(Ordering::Acquire) {
            CLOSED | HALF_OPEN => true,
            _ => {
                let since = self.since();
                if since.elapsed() < self.config.timeout {
                    return false;
                }
                if self.state.compare_exchange(OPEN, HALF_OPEN, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    self.run.store(0, Ordering::Relaxed);
                    info!(worker = %url, "circuit breaker half-open: the worker is back on trial");
                }
                true
            }
        }
    }

    /// A request to the worker got a good answer.
    pub(crate) fn succeeded(&self, url: &dyn std::fmt::Display) {
        if !self.config.enabled {
            return;
        }
        match self.state.load(Ordering::Acquire) {
            CLOSED if self.run.load(Ordering::Relaxed) != 0 => self.run.store(0, Ordering::Relaxed),
            CLOSED => {}
            HALF_OPEN => {
                let _since = self.since();
                let n = self.run.fetch_add(1, Ordering::Relaxed) + 1;
                if n >= self.config.success_threshold.max(1)
                    && self.state.compare_exchange(HALF_OPEN, CLOSED, Ordering::AcqRel, Ordering::Acquire).is_ok()
                {
                    self.run.store(0, Ordering::Relaxed);
                    info!(worker = %url, successes = n, "circuit breaker closed");
                }
            }
            // An answer from before it opened: no evidence either way.
            _ => {}
        }
    }

    /// A request to the worker failed on the worker's side.
    pub(crate) fn failed(&self, url: &dyn std::fmt::Display) {
        if !self.config.enabled {
            return;
        }
        let mut since = self.since();
        match self.state.load(Ordering::Acquire) {
            CLOSED => {
                // A run of failures older than the window starts over.
                let n = if self.run.load(Ordering::Relaxed) == 0 || since.elapsed() > self.config.window {
                    *since = Instant::now();
                    self.run.store(1, Ordering::Relaxed);
                    1
                } else {
                    self.run.fetch_add(1, Ordering::Relaxed) + 1
                };
                if n >= self.config.failure_threshold.max(1) {
                    self.open(&mut since);
                    warn!(worker = %url, failures = n, timeout_s = self.config.timeout.as_secs(), "circuit breaker open: the worker leaves rotation");
                }
            }
            HALF_OPEN => {
                self.open(&mut since);
                warn!(worker = %url, "circuit breaker open again: the trial failed");
            }
            _ => {}
        }
    }

    fn open(&self, since: &mut Instant) {
        *since = Instant::now();
        self.run.store(0, Ordering::Relaxed);
        self.state.store(OPEN, Ordering::Release);
        self.opened.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker(failures: u32, successes: u32, timeout_ms: u64, window_ms: u64) -> Breaker {
        Breaker::new(BreakerConfig {
            enabled: true,
            failure_threshold: failures,
            success_threshold: successes,
            timeout: Duration::from_millis(timeout_ms),
            window: Duration::from_millis(window_ms),
        })
    }

    #[test]
    fn opens_after_failures_in_a_row_and_recovers_half_open() {
        let b = breaker(3, 2, 50, 60_000);
        b.failed(&"w");
        b.failed(&"w");
        b.succeeded(&"w");
        b.failed(&"w");
        b.failed(&"w");
        assert_eq!(b.state(), BreakerState::Closed, "a success in between starts the run over");
        b.failed(&"w");
        assert_eq!(b.state(), BreakerState::Open);
        assert!(!b.allows(&"w"));
        assert_eq!(b.opened.load(Ordering::Relaxed), 1);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert!(b.allows(&"w"), "on trial after the timeout");
        b.succeeded(&"w");
        assert_eq!(b.state(), BreakerState::HalfOpen, "one success of two");
        b.succeeded(&"w");
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn a_failed_trial_opens_it_again() {
        let b = breaker(1, 5, 20, 60_000);
        b.failed(&"w");
        std::thread::sleep(Duration::from_millis(30));
        assert!(b.allows(&"w"));
        b.succeeded(&"w");
        b.failed(&"w");
        assert_eq!(b.state(), BreakerState::Open);
        assert!(!b.allows(&"w"));
        assert_eq!(b.opened.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn failures_spread_past_the_window_do_not_add_up() {
        let b = breaker(2, 1, 60_000, 20);
        b.failed(&"w");
        std::thread::sleep(Duration::from_millis(30));
        b.failed(&"w");
        assert_eq!(b.state(), BreakerState::Closed, "the first failure fell out of the window");
        b.failed(&"w");
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn a_disabled_breaker_never_opens() {
        let b = Breaker::new(BreakerConfig { enabled: false, failure_threshold: 1, ..BreakerConfig::default() });
        for _ in 0..10 {
            b.failed(&"w");
        }
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.allows(&"w"));
    }
}
