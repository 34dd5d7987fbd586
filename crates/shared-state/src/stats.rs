//! The backend's counters (atomics written by callers and connection tasks) and the [`Stats`]
//! snapshot read from them. Not metric registration: the router exports these as it likes.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::Error;

/// A snapshot of a backend's counters, all monotonic since [`Backend::start`](crate::Backend::start)
/// except `up`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Whether the command connection is up.
    pub up: bool,
    /// Commands handed to a connection (each command of a pipeline counts).
    pub commands: u64,
    /// `cmd`/`pipeline` calls that failed with [`Error::Down`].
    pub errors_down: u64,
    /// ... with [`Error::Timeout`].
    pub errors_timeout: u64,
    /// ... with [`Error::Busy`].
    pub errors_busy: u64,
    /// ... with [`Error::Protocol`].
    pub errors_protocol: u64,
    /// ... with [`Error::Io`].
    pub errors_io: u64,
    /// Command connections made (setup done).
    pub connects: u64,
    /// Command connection attempts that failed (connect, TLS, `AUTH`, `SELECT`).
    pub connect_failures: u64,
    /// Command connections lost.
    pub disconnects: u64,
    /// Subscription connections made and subscribed (the first and every resubscription).
    pub pubsub_connects: u64,
    /// Messages delivered to subscription queues.
    pub pubsub_messages: u64,
    /// Messages dropped because a subscription's queue was full.
    pub pubsub_dropped: u64,
}

/// The live counters behind [`Stats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) commands: AtomicU64,
    errors_down: AtomicU64,
    errors_timeout: AtomicU64,
    errors_busy: AtomicU64,
    errors_protocol: AtomicU64,
    errors_io: AtomicU64,
    pub(crate) connects: AtomicU64,
    pub(crate) connect_failures: AtomicU64,
    pub(crate) disconnects: AtomicU64,
    pub(crate) pubsub_connects: AtomicU64,
    pub(crate) pubsub_messages: AtomicU64,
    pub(crate) pubsub_dropped: AtomicU64,
}

// === impl Counters ===

impl Counters {
    /// Counts a failed call by its error's kind (caller errors are not counted).
    pub(crate) fn error(&self, e: &Error) {
        let counter = match e {
            Error::Down => &self.errors_down,
            Error::Timeout => &self.errors_timeout,
            Error::Busy => &self.errors_busy,
            Error::Protocol(_) => &self.errors_protocol,
            Error::Io(_) => &self.errors_io,
            _ => return,
        };
        bump(counter, 1);
    }

    pub(crate) fn snapshot(&self, up: bool) -> Stats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            up,
            commands: get(&self.commands),
            errors_down: get(&self.errors_down),
            errors_timeout: get(&self.errors_timeout),
            errors_busy: get(&self.errors_busy),
            errors_protocol: get(&self.errors_protocol),
            errors_io: get(&self.errors_io),
            connects: get(&self.connects),
            connect_failures: get(&self.connect_failures),
            disconnects: get(&self.disconnects),
            pubsub_connects: get(&self.pubsub_connects),
            pubsub_messages: get(&self.pubsub_messages),
            pubsub_dropped: get(&self.pubsub_dropped),
        }
    }
}

pub(crate) fn bump(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}
