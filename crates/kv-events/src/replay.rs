//! The replay client: asks a publisher's ROUTER socket for the batches from a
//! sequence number on. A fresh DEALER per request (the `zeromq` crate's DEALER
//! does not reconnect); 3- and 4-frame replies both accepted; `END_SEQ` ends it.
//!
//! Everything a replay holds is bounded by [`ReplayLimits`]: a deadline for the
//! whole exchange, a number of messages and a number of payload bytes. The
//! publisher (a worker, not trusted) decides how much it sends; past a limit
//! the replay is refused whole ([`ReplayError::OverLimit`]) rather than cut
//! short, because a truncated replay would leave a hole the caller cannot see.
//! It does not decode payloads (that is `wire`) nor decide what a failed
//! replay means for the stream (that is `subscriber`).

use std::time::Duration;

use bytes::Bytes;
use tokio::time::{Instant, timeout_at};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// `-1` as 8 big-endian bytes: ends a replay; on the live stream, a reset.
pub const END_SEQ: u64 = u64::MAX;
/// Default number of messages one replay may return: the engines' default
/// replay buffer (10,000 batches), so a healthy engine's whole buffer fits.
pub const DEFAULT_MAX_REPLAY_BATCHES: usize = 10_000;
/// Default payload bytes one replay may hold: 10,000 batches of 25 KiB, well
/// above what an engine step publishes, far below what would hurt the router.
pub const DEFAULT_MAX_REPLAY_BYTES: usize = 256 * 1024 * 1024;
/// Default time a whole replay may take. Short: the subscriber holds live
/// batches meanwhile, and a gap it cannot fill this fast it resets instead.
pub const DEFAULT_REPLAY_TIMEOUT: Duration = Duration::from_millis(500);

/// How much of a replay is read before it is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayLimits {
    /// Most messages read (well-formed or not, the `END_SEQ` excluded).
    pub max_batches: usize,
    /// Most payload bytes kept.
    pub max_bytes: usize,
    /// Deadline of the whole exchange: connect, request, every reply.
    pub timeout: Duration,
}

/// Why a replay produced nothing usable.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// Connecting or sending failed.
    #[error("replay socket: {0}")]
    Socket(String),
    /// No `END_SEQ` before the deadline.
    #[error("replay timed out after {0:?}")]
    Timeout(Duration),
    /// The publisher sent more than the limits allow.
    #[error("replay sent more {what} than the limit of {limit}")]
    OverLimit {
        /// `"batches"` or `"bytes"`.
        what: &'static str,
        /// The limit.
        limit: usize,
    },
}

// === impl ReplayLimits ===

impl Default for ReplayLimits {
    fn default() -> Self {
        Self {
            max_batches: DEFAULT_MAX_REPLAY_BATCHES,
            max_bytes: DEFAULT_MAX_REPLAY_BYTES,
            timeout: DEFAULT_REPLAY_TIMEOUT,
        }
    }
}

// === impl ReplayError ===

impl ReplayError {
    /// A stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            ReplayError::Socket(_) => "socket",
            ReplayError::Timeout(_) => "timeout",
            ReplayError::OverLimit { .. } => "over_limit",
        }
    }
}

/// Parses an 8-byte big-endian sequence frame.
pub fn parse_seq(frame: &[u8]) -> Option<u64> {
    let bytes: [u8; 8] = frame.try_into().ok()?;
    Some(u64::from_be_bytes(bytes))
}

/// Fetches the buffered batches with seq ≥ `from` as `(seq, payload)`, in the
/// publisher's order, within `limit` of time and the default size limits.
pub async fn fetch(endpoint: &str, from: u64, limit: Duration) -> Result<Vec<(u64, Bytes)>, ReplayError> {
    fetch_range(endpoint, from, None, &ReplayLimits { timeout: limit, ..ReplayLimits::default() }).await
}

/// Fetches the buffered batches with `from ≤ seq < until` (no upper end if
/// `until` is `None`) as `(seq, payload)`, in the publisher's order. Stops
/// reading at the first batch at or past `until`: the rest is not needed and
/// does not count against the limits.
pub async fn fetch_range(
    endpoint: &str,
    from: u64,
    until: Option<u64>,
    limits: &ReplayLimits,
) -> Result<Vec<(u64, Bytes)>, ReplayError> {
    let deadline = Instant::now() + limits.timeout;
    let timed_out = || ReplayError::Timeout(limits.timeout);
    let mut dealer = DealerSocket::new();
    match timeout_at(deadline, dealer.connect(endpoint)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(ReplayError::Socket(e.to_string())),
        Err(_) => return Err(timed_out()),
    }
    let request = ZmqMessage::try_from(vec![Bytes::new(), Bytes::copy_from_slice(&from.to_be_bytes())])
        .map_err(|e| ReplayError::Socket(e.to_string()))?;
    match timeout_at(deadline, dealer.send(request)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(ReplayError::Socket(e.to_string())),
        Err(_) => return Err(timed_out()),
    }
    let mut out = Vec::new();
    let (mut messages, mut bytes) = (0usize, 0usize);
    loop {
        let message = match timeout_at(deadline, dealer.recv()).await {
            Ok(Ok(m)) => m,
            Ok(Err(e)) => return Err(ReplayError::Socket(e.to_string())),
            Err(_) => return Err(timed_out()),
        };
        let frames = message.into_vec();
        // ["", topic, seq, payload] (current) or ["", seq, payload] (older engines).
        let parsed = match frames.as_slice() {
            [_, _, seq, payload] | [_, seq, payload] => parse_seq(seq).map(|s| (s, payload)),
            _ => None,
        };
        if let Some((seq, _)) = parsed
            && (seq == END_SEQ || until.is_some_and(|u| seq >= u))
        {
            return Ok(out);
        }
        // Malformed messages count too: a flood of them ends the replay as surely as batches do.
        messages += 1;
        if messages > limits.max_batches {
            return Err(ReplayError::OverLimit { what: "batches", limit: limits.max_batches });
        }
        if let Some((seq, payload)) = parsed {
            bytes = bytes.saturating_add(payload.len());
            if bytes > limits.max_bytes {
                return Err(ReplayError::OverLimit { what: "bytes", limit: limits.max_bytes });
            }
            out.push((seq, payload.clone()));
        }
    }
}
