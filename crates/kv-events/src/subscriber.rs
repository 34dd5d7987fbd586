//! One SUB task per (worker, dp rank): connect with backoff, receive 3-frame
//! messages, track the sequence, repair gaps by replay, detect publisher
//! restarts, decode, and hand ordered batches to the pump over a bounded
//! channel. The socket loop frames, checks seq, backs off and hands off;
//! everything about bytes is in `wire`, everything about seqs in `seq`, how a
//! gap or a bad batch is recovered in `subscriber/recovery`.
//!
//! The invariant: the pump never applies a batch unless every earlier batch of
//! the stream was applied too, since the last [`StreamUpdate::Reset`]. A gap
//! the replay cannot fill and a batch that decodes in no copy both end in a
//! reset (the pump drops the stream's blocks) rather than a silent skip: an
//! index that lacks blocks routes a little worse; one that keeps blocks the
//! engine evicted routes to cold caches.
//!
//! Bounded, because the worker on the other side is not trusted: a replay has
//! a short deadline ([`DEFAULT_REPLAY_TIMEOUT`]) and size limits; while it runs
//! live batches are read and held (at most [`DEFAULT_LIVE_HOLD_BATCHES`] and
//! [`DEFAULT_LIVE_HOLD_BYTES`], beyond which they are dropped, counted, and
//! repaired as a gap later) instead of left to the publisher's high-water mark;
//! a replay endpoint that failed is not asked again for
//! [`DEFAULT_REPLAY_BACKOFF`], its gaps reset at once; a payload over
//! [`Limits::max_payload_bytes`] is not decoded.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use router_types::WorkerKey;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use zeromq::{Socket, SocketEvent, SocketRecv, SubSocket};

use crate::metrics::EventMetrics;
use crate::replay::{DEFAULT_MAX_REPLAY_BATCHES, DEFAULT_MAX_REPLAY_BYTES, END_SEQ, ReplayLimits, parse_seq};
use crate::seq::{SeqAction, SeqTracker};
use crate::wire::{Decoded, Limits};

mod applied;
mod recovery;

pub use crate::replay::DEFAULT_REPLAY_TIMEOUT;

/// Default first reconnect delay.
pub const DEFAULT_BACKOFF_INITIAL: Duration = Duration::from_millis(50);
/// Default longest reconnect delay.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Default time a failed replay endpoint is left alone: an endpoint that did
/// not answer is likely down (an engine restarting takes longer than this), and
/// asking it at every gap would cost a replay deadline each time.
pub const DEFAULT_REPLAY_BACKOFF: Duration = Duration::from_secs(5);
/// Default number of live batches held while a replay runs: a replay deadline
/// of engine steps at a few hundred steps a second, with margin.
pub const DEFAULT_LIVE_HOLD_BATCHES: usize = 1024;
/// Default bytes of live batches held while a replay runs.
pub const DEFAULT_LIVE_HOLD_BYTES: usize = 64 * 1024 * 1024;

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

/// Tuning of every subscriber. Build it from `Default` and override fields:
/// fields may be added.
#[derive(Debug, Clone, Copy)]
pub struct SubscriberConfig {
    /// Decoder limits.
    pub limits: Limits,
    /// First reconnect delay, doubled up to `backoff_max`.
    pub backoff_initial: Duration,
    /// Longest reconnect delay.
    pub backoff_max: Duration,
    /// Time a whole replay may take (connect, request, every reply).
    pub replay_timeout: Duration,
    /// After a replay failed, how long gaps reset without asking again.
    pub replay_backoff: Duration,
    /// Most messages one replay may return; past it the replay is refused.
    pub max_replay_batches: usize,
    /// Most payload bytes one replay may hold; past it the replay is refused.
    pub max_replay_bytes: usize,
    /// Most live batches held while a replay runs; more are dropped (a gap).
    pub live_hold_batches: usize,
    /// Most bytes of live batches held while a replay runs.
    pub live_hold_bytes: usize,
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
    /// Forget everything this stream holds: the publisher restarted, or a gap
    /// or an undecodable batch made the stream's state unknowable.
    Reset,
    /// A decoded batch, to apply.
    Batch(Decoded),
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
    /// What the last batches applied were, for a reconnect's replay to compare with.
    applied: applied::AppliedLog,
    /// Live messages read while a replay ran, handled before the socket's next.
    held: VecDeque<Vec<Bytes>>,
    /// Bytes in `held`.
    held_bytes: usize,
    /// A receive error met while holding; acted on once `held` is drained.
    live_error: Option<String>,
    /// Until when the replay endpoint, having failed, is not asked.
    replay_suspended_until: Option<Instant>,
    /// Resumed from a peer's snapshot and no batch applied since: a reset now
    /// means the snapshot was too old for what the publisher still holds.
    seeded: bool,
    /// No batch applied yet since the task started from nothing: the first
    /// one's seq is how many batches of the stream's history were missed.
    fresh: bool,
    /// Reset for a publisher restart and no batch applied since: the first
    /// one's seq is how many of the new publisher's batches were missed.
    restarted: bool,
}

/// Why the stream is reset: the metric it counts in and the log field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ResetCause {
    /// Seq went back, or END_SEQ on the live stream.
    Restart,
    /// A gap no replay could fill while the stream held state.
    Gap,
    /// A batch that decoded in no copy.
    BadBatch,
    /// A reconnect's replay carried other bytes at a seq already applied: the
    /// publisher restarted, and its seqs caught up with ours unseen.
    Rewritten,
}

/// The pump went away, or cancellation: stop.
struct Closed;

// === impl SubscriberConfig ===

impl Default for SubscriberConfig {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            backoff_initial: DEFAULT_BACKOFF_INITIAL,
            backoff_max: DEFAULT_BACKOFF_MAX,
            replay_timeout: DEFAULT_REPLAY_TIMEOUT,
            replay_backoff: DEFAULT_REPLAY_BACKOFF,
            max_replay_batches: DEFAULT_MAX_REPLAY_BATCHES,
            max_replay_bytes: DEFAULT_MAX_REPLAY_BYTES,
            live_hold_batches: DEFAULT_LIVE_HOLD_BATCHES,
            live_hold_bytes: DEFAULT_LIVE_HOLD_BYTES,
        }
    }
}

impl SubscriberConfig {
    fn replay_limits(&self) -> ReplayLimits {
        ReplayLimits {
            max_batches: self.max_replay_batches,
            max_bytes: self.max_replay_bytes,
            timeout: self.replay_timeout,
        }
    }
}

// === impl ResetCause ===

impl ResetCause {
    fn as_str(self) -> &'static str {
        match self {
            ResetCause::Restart => "restart",
            ResetCause::Rewritten => "restart_replay",
            ResetCause::Gap => "gap",
            ResetCause::BadBatch => "bad_batch",
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
    spawn_subscriber_after(stream, config, tx, metrics, cancel, None)
}

/// Like [`spawn_subscriber`], for a stream whose batches up to `resume` are
/// applied already (a peer's snapshot): it replays from `resume + 1`, and a
/// publisher that no longer holds those batches (or restarted) resets the
/// stream, counted in [`EventMetrics::snapshot_resets`].
pub fn spawn_subscriber_after(
    stream: StreamEndpoints,
    config: SubscriberConfig,
    tx: mpsc::Sender<StreamMessage>,
    metrics: Arc<EventMetrics>,
    cancel: CancellationToken,
    resume: Option<u64>,
) -> JoinHandle<()> {
    if let Some(seq) = resume {
        metrics.set_history(&stream.key, crate::metrics::StreamHistory::Resumed { after: seq });
    }
    metrics.starting(&stream.key);
    let task = Subscriber {
        stream,
        config,
        tx,
        metrics,
        cancel,
        tracker: resume.map_or_else(SeqTracker::new, SeqTracker::resuming_after),
        caught_up: Vec::new(),
        applied: applied::AppliedLog::default(),
        held: VecDeque::new(),
        held_bytes: 0,
        live_error: None,
        replay_suspended_until: None,
        seeded: resume.is_some(),
        fresh: resume.is_none(),
        restarted: false,
    };
    tokio::spawn(task.run())
}

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
            self.live_error = None;
            backoff = self.config.backoff_initial;
            // PUB drops what was sent before our subscription arrived, and an
            // idle engine may send nothing more for a long time: catch up now.
            if self.catch_up(&mut sub).await.is_err() {
                break 'outer self.stop_reason();
            }
            loop {
                if self.cancel.is_cancelled() {
                    break 'outer "cancelled";
                }
                // What a replay held came before anything still in the socket.
                if let Some(frames) = self.held.pop_front() {
                    self.held_bytes -= frames.iter().map(Bytes::len).sum::<usize>();
                    if self.on_message(&mut sub, frames).await.is_err() {
                        break 'outer self.stop_reason();
                    }
                    continue;
                }
                if let Some(error) = self.live_error.take() {
                    warn!(%error, "kv events: receive failed, reconnecting");
                    self.metrics.set_connected(&self.stream.key, false);
                    break;
                }
                let message = tokio::select! {
                    biased;
                    _ = self.cancel.cancelled() => break 'outer "cancelled",
                    event = monitor.next(), if monitor_alive => {
                        match event {
                            Some(SocketEvent::Connected(..)) if !first_connect_seen => first_connect_seen = true,
                            Some(SocketEvent::Connected(..)) => {
                                info!("kv events: reconnected, catching up");
                                EventMetrics::inc(&self.metrics.reconnects);
                                self.metrics.set_connected(&self.stream.key, true);
                                if self.catch_up(&mut sub).await.is_err() {
                                    break 'outer self.stop_reason();
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
                        if self.on_message(&mut sub, m.into_vec()).await.is_err() {
                            break 'outer self.stop_reason();
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

    fn stop_reason(&self) -> &'static str {
        if self.cancel.is_cancelled() { "cancelled" } else { "pump channel closed" }
    }

    async fn on_message(&mut self, sub: &mut SubSocket, frames: Vec<Bytes>) -> Result<(), Closed> {
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
            return self.reset(seq, ResetCause::Restart).await;
        }
        if !self.caught_up.is_empty() {
            let duplicate = self.caught_up.iter().any(|(s, p)| *s == seq && p == payload);
            if duplicate {
                return Ok(()); // already applied by the catch-up replay
            }
            self.caught_up.clear();
        }
        match self.tracker.on_live(seq) {
            SeqAction::Apply => {}
            SeqAction::Gap { from, to } => self.repair(sub, from, to).await?,
            SeqAction::Reset => {
                self.reset(seq, ResetCause::Restart).await?;
                if let SeqAction::Gap { from, to } = self.tracker.on_live(seq) {
                    self.repair(sub, from, to).await?;
                }
            }
        }
        self.emit_live(sub, seq, payload).await
    }

    /// Tells the pump to forget the stream, and starts the seq over.
    async fn reset(&mut self, seq: u64, cause: ResetCause) -> Result<(), Closed> {
        warn!(seq, expected = ?self.tracker.next(), cause = cause.as_str(), "kv events: resetting stream");
        EventMetrics::inc(match cause {
            ResetCause::Restart => &self.metrics.resets,
            ResetCause::Rewritten => &self.metrics.rewritten_resets,
            ResetCause::Gap => &self.metrics.gap_resets,
            ResetCause::BadBatch => &self.metrics.bad_batch_resets,
        });
        if std::mem::take(&mut self.seeded) && cause != ResetCause::BadBatch {
            warn!(seq, "kv events: the peer's snapshot is older than what the publisher holds: stream reset");
            EventMetrics::inc(&self.metrics.snapshot_resets);
            self.metrics.set_history(&self.stream.key, crate::metrics::StreamHistory::SnapshotReset);
        }
        self.tracker.reset();
        self.applied.clear();
        self.restarted = matches!(cause, ResetCause::Restart | ResetCause::Rewritten);
        self.send(StreamMessage { key: self.stream.key.clone(), seq, update: StreamUpdate::Reset }).await
    }

    /// Sends a decoded batch (of `payload`) to the pump; `seq` is applied.
    async fn apply(&mut self, seq: u64, payload: &[u8], decoded: Decoded) -> Result<(), Closed> {
        self.applied.record(seq, payload);
        if std::mem::take(&mut self.seeded) {
            // The first batch after the snapshot's seq follows on from it: the stream resumed.
            EventMetrics::inc(&self.metrics.snapshot_resumed);
        }
        let (fresh, restarted) = (std::mem::take(&mut self.fresh), std::mem::take(&mut self.restarted));
        // The stream's batches 0..seq are gone: published before this router subscribed (fresh),
        // or by a restarted publisher before we saw it, and no replay gave them.
        if fresh || (restarted && seq > 0) {
            if fresh && seq > 0 {
                info!(missed = seq, "kv events: joined late: the stream's first batches are no longer held");
            } else if restarted {
                warn!(missed = seq, "kv events: the restarted publisher's first batches are lost");
            }
            self.metrics.history_missed_batches.fetch_add(seq, std::sync::atomic::Ordering::Relaxed);
            self.metrics.set_history(&self.stream.key, crate::metrics::StreamHistory::Missed { batches: seq });
        }
        self.tracker.applied(seq);
        EventMetrics::inc(&self.metrics.batches);
        if decoded.unknown_events > 0 {
            self.metrics.unknown_events.fetch_add(decoded.unknown_events as u64, std::sync::atomic::Ordering::Relaxed);
        }
        self.send(StreamMessage { key: self.stream.key.clone(), seq, update: StreamUpdate::Batch(decoded) }).await
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
