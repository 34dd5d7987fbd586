//! The replay client: asks a publisher's ROUTER socket for the batches from a
//! sequence number on. A fresh DEALER per request (the `zeromq` crate's DEALER
//! does not reconnect); 3- and 4-frame replies both accepted; `END_SEQ` ends it.

use std::time::Duration;

use bytes::Bytes;
use tokio::time::{Instant, timeout_at};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// `-1` as 8 big-endian bytes: ends a replay; on the live stream, a reset.
pub const END_SEQ: u64 = u64::MAX;
/// Most batches one replay returns (the engines buffer 10,000 by default).
pub const MAX_REPLAY_BATCHES: usize = 100_000;

/// Why a replay produced nothing usable.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// Connecting or sending failed.
    #[error("replay socket: {0}")]
    Socket(String),
    /// No `END_SEQ` before the deadline.
    #[error("replay timed out after {0:?}")]
    Timeout(Duration),
}

/// Parses an 8-byte big-endian sequence frame.
pub fn parse_seq(frame: &[u8]) -> Option<u64> {
    let bytes: [u8; 8] = frame.try_into().ok()?;
    Some(u64::from_be_bytes(bytes))
}

/// Fetches the buffered batches with seq ≥ `from` as `(seq, payload)`, in the
/// publisher's order, within `limit` of time.
pub async fn fetch(endpoint: &str, from: u64, limit: Duration) -> Result<Vec<(u64, Bytes)>, ReplayError> {
    let deadline = Instant::now() + limit;
    let mut dealer = DealerSocket::new();
    match timeout_at(deadline, dealer.connect(endpoint)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(ReplayError::Socket(e.to_string())),
        Err(_) => return Err(ReplayError::Timeout(limit)),
    }
    let request = ZmqMessage::try_from(vec![Bytes::new(), Bytes::copy_from_slice(&from.to_be_bytes())])
        .map_err(|e| ReplayError::Socket(e.to_string()))?;
    match timeout_at(deadline, dealer.send(request)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(ReplayError::Socket(e.to_string())),
        Err(_) => return Err(ReplayError::Timeout(limit)),
    }
    let mut out = Vec::new();
    loop {
        let message = match timeout_at(deadline, dealer.recv()).await {
            Ok(Ok(m)) => m,
            Ok(Err(e)) => return Err(ReplayError::Socket(e.to_string())),
            Err(_) => return Err(ReplayError::Timeout(limit)),
        };
        let frames = message.into_vec();
        // ["", topic, seq, payload] (current) or ["", seq, payload] (older engines).
        let (seq_frame, payload) = match frames.as_slice() {
            [_, _, seq, payload] => (seq, payload),
            [_, seq, payload] => (seq, payload),
            _ => continue,
        };
        let Some(seq) = parse_seq(seq_frame) else { continue };
        if seq == END_SEQ {
            return Ok(out);
        }
        if out.len() < MAX_REPLAY_BATCHES {
            out.push((seq, payload.clone()));
        }
    }
}
