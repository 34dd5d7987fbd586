//! A KV-event publisher in the engines' format: a PUB socket for the live
//! stream (3 frames: topic, seq, payload), a ROUTER socket answering replay
//! requests from a ring buffer of the last batches. The simulated engine and
//! the tests use it; it also has the fault knobs they need (drop batches from
//! the live stream only, corrupt them on the live stream only, restart with
//! seq back to 0, crash and come back, take the replay socket down a while).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use router_types::EventBatch;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tracing::debug;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::replay::{END_SEQ, parse_seq};
use crate::wire::{EventForm, encode_batch};

/// Default number of batches kept for replay (the engines' default).
pub const DEFAULT_BUFFER_STEPS: usize = 10_000;
/// What [`Publisher::corrupt_next`] sends live: msgpack's reserved marker, never valid.
const CORRUPTED: &[u8] = &[0xc1];

/// Where and how to publish.
#[derive(Debug, Clone)]
pub struct PublisherConfig {
    /// PUB endpoint to bind, e.g. `tcp://127.0.0.1:0` (port 0: any free port).
    pub endpoint: String,
    /// ROUTER endpoint to bind for replay, if any.
    pub replay_endpoint: Option<String>,
    /// Topic frame of every message.
    pub topic: String,
    /// Batches kept for replay.
    pub buffer_steps: usize,
    /// Event layout.
    pub form: EventForm,
}

/// Why a publisher could not start or send.
#[derive(Debug, thiserror::Error)]
#[error("kv event publisher: {0}")]
pub struct PublisherError(String);

/// A running publisher. Dropping it stops the replay task.
pub struct Publisher {
    pub_socket: Mutex<PubSocket>,
    endpoint: String,
    replay_endpoint: Option<String>,
    state: Arc<Shared>,
    config: PublisherConfig,
    cancel: CancellationToken,
    /// The replay task's own token (a child of `cancel`): `replay_down` stops it.
    replay_task: std::sync::Mutex<CancellationToken>,
}

#[derive(Debug)]
struct Shared {
    topic: Bytes,
    seq: AtomicU64,
    buffer: Mutex<VecDeque<(u64, Bytes)>>,
    drop_next: AtomicUsize,
    corrupt_next: AtomicUsize,
}

// === impl PublisherConfig ===

impl PublisherConfig {
    /// Loopback PUB and replay sockets on free ports, engine defaults otherwise.
    pub fn loopback() -> Self {
        Self {
            endpoint: "tcp://127.0.0.1:0".into(),
            replay_endpoint: Some("tcp://127.0.0.1:0".into()),
            topic: String::new(),
            buffer_steps: DEFAULT_BUFFER_STEPS,
            form: EventForm::Map,
        }
    }
}

// === impl Publisher ===

impl Publisher {
    /// Binds the sockets and starts answering replays.
    pub async fn bind(config: PublisherConfig) -> Result<Self, PublisherError> {
        let mut pub_socket = PubSocket::new();
        let endpoint = pub_socket.bind(&config.endpoint).await.map_err(|e| PublisherError(e.to_string()))?.to_string();
        let state = Arc::new(Shared {
            topic: Bytes::from(config.topic.clone().into_bytes()),
            seq: AtomicU64::new(0),
            buffer: Mutex::new(VecDeque::new()),
            drop_next: AtomicUsize::new(0),
            corrupt_next: AtomicUsize::new(0),
        });
        let cancel = CancellationToken::new();
        let replay_task = cancel.child_token();
        let replay_endpoint = match &config.replay_endpoint {
            Some(ep) => {
                let mut router = RouterSocket::new();
                let bound = router.bind(ep).await.map_err(|e| PublisherError(e.to_string()))?.to_string();
                tokio::spawn(serve_replays(router, state.clone(), replay_task.clone()));
                Some(bound)
            }
            None => None,
        };
        let replay_task = std::sync::Mutex::new(replay_task);
        Ok(Self { pub_socket: Mutex::new(pub_socket), endpoint, replay_endpoint, state, config, cancel, replay_task })
    }

    /// The bound PUB endpoint (with the real port).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The bound replay endpoint.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// Publishes a batch; returns its seq.
    pub async fn publish(&self, batch: &EventBatch) -> Result<u64, PublisherError> {
        self.publish_raw(Bytes::from(encode_batch(batch, self.config.form))).await
    }

    /// Publishes an already-encoded payload (any bytes: fault injection); returns its seq.
    pub async fn publish_raw(&self, payload: Bytes) -> Result<u64, PublisherError> {
        let mut socket = self.pub_socket.lock().await;
        let seq = self.state.seq.fetch_add(1, Ordering::SeqCst);
        {
            let mut buffer = self.state.buffer.lock().await;
            buffer.push_back((seq, payload.clone()));
            while buffer.len() > self.config.buffer_steps {
                buffer.pop_front();
            }
        }
        let dropped =
            self.state.drop_next.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        if dropped {
            debug!(seq, "publisher: batch kept for replay but not sent live");
            return Ok(seq);
        }
        let corrupted =
            self.state.corrupt_next.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        let payload = if corrupted {
            debug!(seq, "publisher: batch kept for replay intact but sent live corrupted");
            Bytes::from_static(CORRUPTED)
        } else {
            payload
        };
        let message =
            ZmqMessage::try_from(vec![self.state.topic.clone(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload])
                .map_err(|e| PublisherError(e.to_string()))?;
        socket.send(message).await.map_err(|e| PublisherError(e.to_string()))?;
        Ok(seq)
    }

    /// The next `n` batches are buffered for replay but not sent live.
    pub fn drop_next(&self, n: usize) {
        self.state.drop_next.store(n, Ordering::SeqCst);
    }

    /// The next `n` batches are buffered for replay intact but sent live as
    /// bytes that do not decode (as if corrupted on the way).
    pub fn corrupt_next(&self, n: usize) {
        self.state.corrupt_next.store(n, Ordering::SeqCst);
    }

    /// Starts over as a restarted engine would: seq back to 0, replay buffer empty.
    pub async fn restart(&self) {
        let _socket = self.pub_socket.lock().await;
        self.state.seq.store(0, Ordering::SeqCst);
        self.state.buffer.lock().await.clear();
    }

    /// Dies and comes back as a crashed engine's publisher does: its PUB
    /// socket closed (every subscriber's connection drops), then, `down`
    /// later, bound again at the same endpoint with seq 0 and an empty replay
    /// buffer. The replay socket stays up.
    pub async fn crash(&self, down: std::time::Duration) -> Result<(), PublisherError> {
        let mut socket = self.pub_socket.lock().await;
        let old = std::mem::replace(&mut *socket, PubSocket::new());
        drop(old.close().await);
        self.state.seq.store(0, Ordering::SeqCst);
        self.state.buffer.lock().await.clear();
        tokio::time::sleep(down).await;
        let mut last = None;
        for _ in 0..50 {
            match socket.bind(&self.endpoint).await {
                Ok(_) => return Ok(()),
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        Err(PublisherError(format!("rebinding {}: {last:?}", self.endpoint)))
    }

    /// The replay socket goes down (closed: connections refused) and comes
    /// back `down` later at the same endpoint, its buffer intact; the live
    /// stream goes on meanwhile. Without a replay socket, does nothing.
    pub async fn replay_down(&self, down: std::time::Duration) -> Result<(), PublisherError> {
        let Some(endpoint) = self.replay_endpoint.clone() else { return Ok(()) };
        let old = std::mem::replace(
            &mut *self.replay_task.lock().unwrap_or_else(|p| p.into_inner()),
            self.cancel.child_token(),
        );
        old.cancel();
        tokio::time::sleep(down).await;
        let mut last = None;
        for _ in 0..50 {
            let mut router = RouterSocket::new();
            match router.bind(&endpoint).await {
                Ok(_) => {
                    let task = self.replay_task.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    tokio::spawn(serve_replays(router, self.state.clone(), task));
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        Err(PublisherError(format!("rebinding {endpoint}: {last:?}")))
    }

    /// The seq the next batch gets (batches published since the last restart).
    pub fn next_seq(&self) -> u64 {
        self.state.seq.load(Ordering::SeqCst)
    }

    /// Batches still to be dropped from the live stream (`drop_next`).
    pub fn pending_drops(&self) -> usize {
        self.state.drop_next.load(Ordering::SeqCst)
    }

    /// Sends `END_SEQ` on the live stream (a publisher announcing its end).
    pub async fn send_end(&self) -> Result<(), PublisherError> {
        let message = ZmqMessage::try_from(vec![
            self.state.topic.clone(),
            Bytes::copy_from_slice(&END_SEQ.to_be_bytes()),
            Bytes::new(),
        ])
        .map_err(|e| PublisherError(e.to_string()))?;
        self.pub_socket.lock().await.send(message).await.map_err(|e| PublisherError(e.to_string()))
    }
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("endpoint", &self.endpoint)
            .field("replay_endpoint", &self.replay_endpoint)
            .finish()
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Answers `[identity, "", start_seq]` with every buffered batch from
/// `start_seq` on as `[identity, "", topic, seq, payload]`, then `END_SEQ`.
async fn serve_replays(mut router: RouterSocket, state: Arc<Shared>, cancel: CancellationToken) {
    loop {
        let request = tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                drop(router.close().await);
                return;
            }
            r = router.recv() => match r {
                Ok(m) => m.into_vec(),
                Err(_) => continue,
            },
        };
        let (identity, start) = match request.as_slice() {
            [identity, _, start] => (identity.clone(), parse_seq(start)),
            [identity, start] => (identity.clone(), parse_seq(start)),
            _ => continue,
        };
        let Some(start) = start else { continue };
        let batches: Vec<(u64, Bytes)> =
            state.buffer.lock().await.iter().filter(|(seq, _)| *seq >= start).cloned().collect();
        for (seq, payload) in batches {
            let frames = vec![
                identity.clone(),
                Bytes::new(),
                state.topic.clone(),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                payload,
            ];
            if let Ok(m) = ZmqMessage::try_from(frames) {
                let _ = router.send(m).await;
            }
        }
        let end =
            vec![identity, Bytes::new(), Bytes::new(), Bytes::copy_from_slice(&END_SEQ.to_be_bytes()), Bytes::new()];
        if let Ok(m) = ZmqMessage::try_from(end) {
            let _ = router.send(m).await;
        }
    }
}
