//! A small async client for the Redis protocol (RESP2: Redis and Valkey), which router replicas
//! use for the state they share (`--shared-state redis://HOST:PORT[/DB]`).
//!
//! ```text
//!  Backend::cmd / pipeline ──try_send──► link (one TCP/TLS connection)
//!    (encode, in-flight cap,              writer: coalesce, push Pending, write
//!     deadline)          ◄──oneshot──     reader: bounded buffer → Decoder → FIFO Pending
//!  Backend::subscribe ──► its own connection, SUBSCRIBE, try_send to a bounded queue
//! ```
//!
//! Invariants: a caller never waits for a connection (disconnected ⇒ [`Error::Down`] at once),
//! never waits past its deadline ([`Error::Timeout`], after which the connection is dropped so
//! a late reply can never be matched to another command), and never queues beyond
//! [`Options::max_in_flight`] ([`Error::Busy`]). A peer costs at most
//! [`Options::max_reply_bytes`] per reply whatever lengths it claims: garbage is
//! [`Error::Protocol`] and a new connection. No knowledge of the router.

mod backend;
mod conn;
mod error;
mod link;
mod pubsub;
mod resp;
mod stats;
mod target;
#[cfg(test)]
mod test_support;
/// A throwaway `redis-server` for tests (this crate's and others'). Always compiled, as a
/// test-only feature would give the release build of every crate above this one a second
/// feature set (the wheel after the embeddings tests rebuilt them all).
pub mod testing;

use std::time::Duration;

use bytes::Bytes;

pub use backend::Backend;
pub use error::Error;
pub use stats::Stats;
pub use target::{DEFAULT_PORT, Target};

/// Default [`Options::connect_timeout`].
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default [`Options::command_timeout`]: shared state is an optimisation, a slow store must not
/// hold a request for long.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_millis(250);
/// Default [`Options::max_reply_bytes`]: 16 MiB.
pub const DEFAULT_MAX_REPLY_BYTES: usize = 16 << 20;
/// Default [`Options::max_in_flight`].
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;
/// Default [`Options::reconnect_min`].
pub const DEFAULT_RECONNECT_MIN: Duration = Duration::from_millis(100);
/// Default [`Options::reconnect_max`].
pub const DEFAULT_RECONNECT_MAX: Duration = Duration::from_secs(2);
/// Default [`Options::ping_interval`].
pub const DEFAULT_PING_INTERVAL: Duration = Duration::from_secs(5);
/// Deepest array nesting accepted in a reply (a top-level array is depth 1).
pub const MAX_DEPTH: usize = 8;

/// How a [`Backend`] talks to its server. `Default` gives the `DEFAULT_*` values.
#[derive(Debug, Clone)]
pub struct Options {
    /// Deadline for one connection's setup: TCP connect, TLS, `AUTH`, `SELECT`, `CLIENT SETNAME`.
    pub connect_timeout: Duration,
    /// Deadline for one [`Backend::cmd`] or [`Backend::pipeline`] call, queueing included.
    pub command_timeout: Duration,
    /// Largest reply accepted, counted as its payload (bulk and simple strings, error
    /// messages) plus 8 bytes per array element. A bulk string longer than this or an array
    /// claiming more than `max_reply_bytes / 8` elements is refused from its header, before
    /// anything is reserved for it; so is nesting deeper than [`MAX_DEPTH`], or a reply whose
    /// parts add up to more. Refused means [`Error::Protocol`] and a new connection.
    pub max_reply_bytes: usize,
    /// Commands sent or queued and not yet answered; one more is [`Error::Busy`] at once.
    pub max_in_flight: usize,
    /// First pause before reconnecting; doubles per failed attempt up to `reconnect_max`.
    pub reconnect_min: Duration,
    /// Longest pause between reconnect attempts.
    pub reconnect_max: Duration,
    /// A subscription idle this long sends `PING`; no answer within `command_timeout` drops
    /// the connection (a server gone without a FIN is noticed, not waited on forever).
    pub ping_interval: Duration,
    /// TLS client configuration for `rediss://`; `None` trusts the system's roots.
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

/// One RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// A null bulk string (`$-1`) or null array (`*-1`).
    Nil,
    /// `:<i64>`.
    Int(i64),
    /// `+<text>` (always UTF-8; anything else is a protocol error).
    Simple(String),
    /// `$<len>` and that many bytes, binary-safe.
    Bulk(Bytes),
    /// `*<n>` and that many replies.
    Array(Vec<Reply>),
    /// `-<message>`: the server refused the command (not a transport failure).
    Error(String),
}

/// One pub/sub message from a [`Backend::subscribe`] subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The channel it was published on.
    pub channel: Bytes,
    /// What was published.
    pub payload: Bytes,
}

// === impl Options ===

impl Default for Options {
    fn default() -> Self {
        Self {
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            max_reply_bytes: DEFAULT_MAX_REPLY_BYTES,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            reconnect_min: DEFAULT_RECONNECT_MIN,
            reconnect_max: DEFAULT_RECONNECT_MAX,
            ping_interval: DEFAULT_PING_INTERVAL,
            tls: None,
        }
    }
}

// === impl Reply ===

impl Reply {
    /// The bytes of a bulk or simple string.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Reply::Bulk(b) => Some(b),
            Reply::Simple(s) => Some(s.as_bytes()),
            _ => None,
        }
    }

    /// The integer of an `Int` reply.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// Whether this is `+OK`.
    pub fn is_ok(&self) -> bool {
        matches!(self, Reply::Simple(s) if s == "OK")
    }
}
