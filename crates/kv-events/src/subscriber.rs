//! One SUB task per (worker, dp rank): connect with backoff, receive 3-frame
//! messages, track the sequence, repair gaps by replay, detect publisher
//! restarts, decode, and hand ordered batches to the pump over a bounded
//! channel. The socket loop frames, checks seq, backs off and hands off;
//! everything about bytes is in `wire`, everything about seqs in `seq`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use router_types::WorkerKey;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use zeromq::{Socket, SocketEvent, SocketRecv, SubSocket};

use crate::metrics::{EventMetrics, ReplayOutcome};
use crate::replay::{END_SEQ, fetch, parse_seq};
use crate::seq::{SeqAction, SeqTracker};
use crate::wire::{Decoded, Limits, decode_batch};

/// Default first reconnect delay.
pub const DEFAULT_BACKOFF_INITIAL: Duration = Duration::from_millis(50);
/// Default longest reconnect delay.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Default time a replay may take.
pub const DEFAULT_REPLAY_TIMEOUT: Duration = Duration::from_secs(2);

/// Where one stream publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamEndpoints {
    /// The (worker, rank) this stream belongs to.
    pub key: WorkerKey,
    /// The PUB endpoint, `tcp://host:port`.
    pub endpoint: String,
    /// The replay ROUTER endpoint, if the publisher has one.
    pub replay_endpoint: Option<String>,
    /// Topic prefix to subscribe to (engines default to empty).
    pub topic: String,
}

/// Tuning of every subscriber.
#[derive(Debug, Clone, Copy)]
pub struct SubscriberConfig {
    /// Decoder limits.
    pub limits: Limits,
    /// First reconnect delay, doubled up to `backoff_max`.
    pub backoff_initial: Duration,
    /// Longest reconnect delay.
    pub backoff_max: Duration,
    /// Time a replay may take.
    pub replay_timeout: Duration,
}

/// What a subscriber sends the pump, in seq order per stream.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamMessage {
    /// The stream.
    pub key: WorkerKey,
    /// The batch's seq (for a reset, the seq that revealed it).
    pub seq: u64,
    /// The update.
    pub update: StreamUpdate,
}

/// One update of a stream.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamUpdate {
    /// The publisher restarted: forget everything this stream holds.
    Reset,
    /// A decoded batch, to apply.
    Batch(Decoded),
}

// === impl SubscriberConfig ===

impl Default for SubscriberConfig {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            backoff_initial: DEFAULT_BACKOFF_INITIAL,
            backoff_max: DEFAULT_BACKOFF_MAX,
            replay_timeout: DEFAULT_REPLAY_TIMEOUT,
        }
    }
}

/// Starts the subscriber task of one stream. It runs until `cancel` fires or
/// the pump's channel closes, and logs why it exited.
pub fn spawn_subscriber(
    stream: StreamEndpoints,
    config: SubscriberConfig,
    tx: mpsc::Sender<StreamMessage>,
    metrics: Arc<EventMetrics>,
    cancel: CancellationToken,
) -> JoinHandle<()> {
    let task = Subscriber { stream, config, tx, metrics, cancel, tracker: SeqTracker::new(), caught_up: Vec::new() };
    tokio::spawn(task.run())
}

struct Subscriber {
    stream: StreamEndpoints,
    config: SubscriberConfig,
    tx: mpsc::Sender<StreamMessage>,
    metrics: Arc<EventMetrics>,
    cancel: CancellationToken,
    tracker: SeqTracker,
    /// The batches a catch-up replay applied: a live batch with the same seq
    /// and the same bytes was queued in the socket meanwhile (a duplicate); a
    /// different one at an old seq is a restart.
    caught_up: Vec<(u64, Bytes)>,
}

/// The pump went away: stop.
struct Closed;

// === impl Subscriber ===

impl Subscriber {
    #[tracing::instrument(name = "kv_subscriber", skip_all, fields(worker = %self.stream.key.worker, dp_rank = %self.stream.key.rank))]
    async fn run(mut self) {
        let mut backoff = self.config.backoff_initial;
        let why = 'outer: loop {
            let mut sub = SubSocket::new();
            // The socket reconnects by itself (a restarted engine rebinds the same
            // port); its monitor tells us when, so we can catch up by replay.
            let mut monitor = sub.monitor();
            let mut monitor_alive = true;
            // The monitor also reports the connection we just made: only later ones are reconnects.
            let mut first_connect_seen = false;
            let connected = tokio::select! {
                biased;
                _ = self.cancel.cancelled() => break 'outer "cancelled",
                r = tokio::time::timeout(self.config.backoff_max, sub.connect(&self.stream.endpoint)) => matches!(r, Ok(Ok(()))),
            };
            if !connected || sub.subscribe(&self.stream.topic).await.is_err() {
                EventMetrics::inc(&self.metrics.connect_failures);
                debug!(endpoint = %self.stream.endpoint, ?backoff, "kv events: connect failed, backing off");
                tokio::select! {
                    biased;
                    _ = self.cancel.cancelled() => break 'outer "cancelled",
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(self.config.backoff_max);
                continue;
            }
            info!(endpoint = %self.stream.endpoint, "kv events: subscribed");
            self.metrics.set_connected(&self.stream.key, true);
            backoff = self.config.backoff_initial;
            // PUB drops what was sent before our subscription arrived, and an
            // idle engine may send nothing more for a long time: catch up now.
            if self.catch_up().await.is_err() {
                break 'outer "pump channel closed";
            }
            loop {
                let message = tokio::select! {
                    biased;
                    _ = self.cancel.cancelled() => break 'outer "cancelled",
                    event = monitor.next(), if monitor_alive => {
                        match event {
                            Some(SocketEvent::Connected(..)) if !first_connect_seen => first_connect_seen = true,
                            Some(SocketEvent::Connected(..)) => {
                                info!("kv events: reconnected, catching up");
                                self.metrics.set_connected(&self.stream.key, true);
                                if self.catch_up().await.is_err() {
                                    break 'outer "pump channel closed";
                                }
                            }
                            Some(SocketEvent::Disconnected(_)) => {
                                warn!("kv events: publisher disconnected; the socket reconnects");
                                self.metrics.set_connected(&self.stream.key, false);
                            }
                            Some(_) => {}
                            None => monitor_alive = false, // keep receiving without it
                        }
                        continue;
                    }
                    m = sub.recv() => m,
                };
                match message {
                    Ok(m) => {
                        if self.on_message(m.into_vec()).await.is_err() {
                            break 'outer "pump channel closed";
                        }
                    }
                    Err(e) => {
                        warn!(error = %e, "kv events: receive failed, reconnecting");
                        self.metrics.set_connected(&self.stream.key, false);
                        break;
                    }
                }
            }
        };
        self.metrics.set_connected(&self.stream.key, false);
        info!(reason = why, "kv events: subscriber exited");
    }

    async fn on_message(&mut self, frames: Vec<Bytes>) -> Result<(), Closed> {
        let [_topic, seq, payload] = frames.as_slice() else {
            EventMetrics::inc(&self.metrics.malformed_frames);
            return Ok(());
        };
        let Some(seq) = parse_seq(seq) else {
            EventMetrics::inc(&self.metrics.malformed_frames);
            return Ok(());
        };
        if seq == END_SEQ {
            self.caught_up.clear();
            return self.reset(seq).await;
        }
        if !self.caught_up.is_empty() {
            let duplicate = self.caught_up.iter().any(|(s, p)| *s == seq && p == payload);
            if duplicate {
                return Ok(()); // already applied by the catch-up replay
            }
            self.caught_up.clear();
        }
        match self.tracker.on_live(seq) {
            SeqAction::Apply => self.emit(seq, payload).await,
            SeqAction::Gap { from, to } => {
                self.repair(from, to).await?;
                self.emit(seq, payload).await
            }
            SeqAction::Reset => {
                self.reset(seq).await?;
                if let SeqAction::Gap { from, to } = self.tracker.on_live(seq) {
                    self.repair(from, to).await?;
                }
                self.emit(seq, payload).await
            }
        }
    }

    /// Replays everything the publisher buffered from our cursor on. A replay
    /// that ends before our cursor means the publisher restarted meanwhile.
    async fn catch_up(&mut self) -> Result<(), Closed> {
        let Some(endpoint) = self.stream.replay_endpoint.clone() else { return Ok(()) };
        let from = self.tracker.next().unwrap_or(0);
        let batches = match fetch(&endpoint, from, self.config.replay_timeout).await {
            Ok(b) => b,
            Err(e) => {
                debug!(error = %e, "kv events: catch-up replay failed; waiting for live batches");
                return Ok(());
            }
        };
        let Some(&(last, _)) = batches.last() else {
            // Nothing at or after our cursor. If we had a cursor, ask from 0 to tell an idle
            // publisher from a restarted one.
            if from > 0
                && let Ok(all) = fetch(&endpoint, 0, self.config.replay_timeout).await
                && all.last().is_some_and(|(s, _)| *s + 1 < from)
            {
                self.reset(all[0].0).await?;
                return self.apply_replayed(all).await;
            }
            return Ok(());
        };
        if from > 0 && last < from {
            self.reset(last).await?;
        }
        self.apply_replayed(batches).await
    }

    async fn apply_replayed(&mut self, batches: Vec<(u64, Bytes)>) -> Result<(), Closed> {
        self.caught_up.clear();
        for (seq, payload) in batches {
            if self.tracker.next().is_none_or(|n| seq >= n) {
                self.emit(seq, &payload).await?;
                self.caught_up.push((seq, payload));
            }
        }
        Ok(())
    }

    async fn reset(&mut self, seq: u64) -> Result<(), Closed> {
        warn!(seq, expected = ?self.tracker.next(), "kv events: publisher restarted, resetting stream");
        EventMetrics::inc(&self.metrics.resets);
        self.tracker.reset();
        self.send(StreamMessage { key: self.stream.key.clone(), seq, update: StreamUpdate::Reset }).await
    }

    /// Fetches `from..to` from the replay socket and emits what arrives, in order.
    async fn repair(&mut self, from: u64, to: u64) -> Result<(), Closed> {
        let Some(endpoint) = self.stream.replay_endpoint.clone() else {
            warn!(from, to, "kv events: gap and no replay endpoint");
            self.metrics.replay(ReplayOutcome::Failed);
            return Ok(());
        };
        match fetch(&endpoint, from, self.config.replay_timeout).await {
            Ok(batches) => {
                let mut recovered = 0;
                for (seq, payload) in &batches {
                    if self.tracker.wants_replayed(*seq, to) {
                        self.emit(*seq, payload).await?;
                        recovered += 1;
                    }
                }
                // Buffers hold the newest batches: a hole can only be at the start.
                let complete = recovered == to - from;
                let outcome = if complete { ReplayOutcome::Repaired } else { ReplayOutcome::Incomplete };
                debug!(from, to, got = batches.len(), ?outcome, "kv events: replay");
                self.metrics.replay(outcome);
            }
            Err(e) => {
                warn!(from, to, error = %e, "kv events: replay failed");
                self.metrics.replay(ReplayOutcome::Failed);
            }
        }
        Ok(())
    }

    /// Decodes and sends one batch; its seq is consumed even if it fails to decode.
    async fn emit(&mut self, seq: u64, payload: &[u8]) -> Result<(), Closed> {
        self.tracker.applied(seq);
        match decode_batch(payload, &self.config.limits) {
            Ok(decoded) => {
                EventMetrics::inc(&self.metrics.batches);
                if decoded.unknown_events > 0 {
                    self.metrics
                        .unknown_events
                        .fetch_add(decoded.unknown_events as u64, std::sync::atomic::Ordering::Relaxed);
                }
                self.send(StreamMessage { key: self.stream.key.clone(), seq, update: StreamUpdate::Batch(decoded) })
                    .await
            }
            Err(e) => {
                warn!(seq, error = %e, kind = e.kind(), "kv events: undecodable batch dropped");
                self.metrics.decode_error(e.kind());
                Ok(())
            }
        }
    }

    /// Sends to the pump, counting the waits when the channel is full.
    async fn send(&self, message: StreamMessage) -> Result<(), Closed> {
        match self.tx.try_send(message) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(Closed),
            Err(mpsc::error::TrySendError::Full(message)) => {
                EventMetrics::inc(&self.metrics.channel_full_waits);
                tokio::select! {
                    biased;
                    _ = self.cancel.cancelled() => Err(Closed),
                    r = self.tx.send(message) => r.map_err(|_| Closed),
                }
            }
        }
    }
}
