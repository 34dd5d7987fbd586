//! How a subscriber recovers what the live stream did not deliver: catch-up
//! on (re)connect, gap repair, and undecodable batches; and the one place that
//! asks the replay socket, holding live batches meanwhile and backing off from
//! an endpoint that failed. Whatever cannot be recovered ends in a reset of a
//! stream that holds state, never in a silent skip.

use bytes::Bytes;
use tokio::time::Instant;
use tracing::{debug, info, warn};
use zeromq::{SocketRecv, SubSocket, ZmqMessage, ZmqResult};

use super::{Closed, ResetCause, Subscriber};
use crate::metrics::{EventMetrics, ReplayOutcome};
use crate::replay::{ReplayError, fetch_range};
use crate::wire::decode_batch;

/// No replay to work with: none configured, the endpoint backing off, or it
/// failed. Already counted and logged when returned.
pub(super) struct NoReplay;

// === impl Subscriber ===

impl Subscriber {
    /// Replays everything the publisher buffered from our cursor on, and from
    /// the last batches we applied: one of those replayed with other bytes, or
    /// a replay that ends before our cursor, means the publisher restarted
    /// meanwhile.
    pub(super) async fn catch_up(&mut self, sub: &mut SubSocket) -> Result<(), Closed> {
        if self.stream.replay_endpoint.is_none() {
            return Ok(());
        }
        // A new connection: the publisher (and its replay socket) may be a new process.
        self.replay_suspended_until = None;
        let from = self.tracker.next().unwrap_or(0);
        let ask = self.applied.oldest().map_or(from, |oldest| oldest.min(from));
        // On failure the next live batch shows whether anything was missed.
        let Ok(mut batches) = self.replay(sub, ask, None).await? else { return Ok(()) };
        debug!(from, ask, got = batches.len(), "kv events: catch-up replay");
        if let Some((seq, _)) = batches.iter().find(|(s, p)| self.applied.differs(*s, p)) {
            warn!(seq, "kv events: the publisher's batch at an applied seq differs: it restarted");
            // Everything the new publisher holds: its first batches came before `ask`.
            let all = match self.replay(sub, 0, None).await? {
                Ok(all) if !all.is_empty() => all,
                _ => batches,
            };
            return self.start_over(all, ResetCause::Rewritten).await;
        }
        batches.retain(|(s, _)| *s >= from);
        let Some(&(last, _)) = batches.last() else {
            // Nothing at or after our cursor. If we had a cursor, ask from 0 to tell an idle
            // publisher from a restarted one.
            if from > 0
                && let Ok(all) = self.replay(sub, 0, None).await?
                && all.last().is_some_and(|(s, _)| *s + 1 < from)
            {
                return self.start_over(all, ResetCause::Restart).await;
            }
            return Ok(());
        };
        if from > 0 && last < from {
            self.reset(last, ResetCause::Restart).await?;
        }
        self.apply_replayed(batches, from, None, true).await?;
        Ok(())
    }

    /// The publisher restarted: resets the stream and applies `batches`
    /// (non-empty: everything the new publisher holds, in order) from the first.
    async fn start_over(&mut self, batches: Vec<(u64, Bytes)>, cause: ResetCause) -> Result<(), Closed> {
        let first = batches[0].0;
        self.reset(first, cause).await?;
        self.apply_replayed(batches, first, None, true).await?;
        Ok(())
    }

    /// Fetches `from..to` from the replay socket and emits what arrives, in
    /// order. A gap it cannot fill resets the stream if the stream holds state
    /// (a late joiner, holding nothing, just starts where the replay starts).
    pub(super) async fn repair(&mut self, sub: &mut SubSocket, from: u64, to: u64) -> Result<(), Closed> {
        let held_state = self.tracker.next().is_some();
        let Ok(batches) = self.replay(sub, from, Some(to)).await? else {
            if held_state {
                self.reset(to, ResetCause::Gap).await?;
            }
            return Ok(());
        };
        let got = batches.len();
        let mut complete = self.apply_replayed(batches, from, Some(to), false).await?;
        // The replay ended before the live batch: the rest of the gap is lost too.
        match self.tracker.next() {
            Some(n) if n < to => {
                complete = false;
                self.reset(to, ResetCause::Gap).await?;
            }
            None => complete = false,
            Some(_) => {}
        }
        let outcome = if complete { ReplayOutcome::Repaired } else { ReplayOutcome::Incomplete };
        debug!(from, to, got, ?outcome, "kv events: replay");
        self.metrics.replay(outcome);
        Ok(())
    }

    /// Emits replayed batches below `until` in order, skipping those already
    /// applied. Buffers hold the newest batches, so a hole is at the start: one
    /// before a batch resets a stream that holds state. Returns whether there
    /// was no hole. `record` keeps them to recognize their live duplicates.
    async fn apply_replayed(
        &mut self,
        batches: Vec<(u64, Bytes)>,
        from: u64,
        until: Option<u64>,
        record: bool,
    ) -> Result<bool, Closed> {
        if record {
            self.caught_up.clear();
        }
        let mut complete = true;
        for (seq, payload) in batches {
            if until.is_some_and(|u| seq >= u) {
                break;
            }
            match self.tracker.next() {
                Some(n) if seq < n => continue,
                Some(n) if seq > n => {
                    complete = false;
                    self.reset(seq, ResetCause::Gap).await?;
                }
                None if seq > from => complete = false,
                _ => {}
            }
            self.emit_replayed(seq, &payload).await?;
            if record {
                self.caught_up.push((seq, payload));
            }
        }
        Ok(complete)
    }

    /// Decodes and sends a live batch. One that does not decode is asked of
    /// the replay socket once (the live frame may have been damaged); if that
    /// copy does not decode either, or there is none, the stream is reset.
    pub(super) async fn emit_live(&mut self, sub: &mut SubSocket, seq: u64, payload: &[u8]) -> Result<(), Closed> {
        let error = match decode_batch(payload, &self.config.limits) {
            Ok(decoded) => return self.apply(seq, payload, decoded).await,
            Err(e) => e,
        };
        warn!(seq, %error, kind = error.kind(), "kv events: undecodable batch, asking the replay socket for it");
        self.metrics.decode_error(error.kind());
        EventMetrics::inc(&self.metrics.undecodable_batches);
        if let Ok(copies) = self.replay(sub, seq, Some(seq + 1)).await?
            && let Some((_, copy)) = copies.iter().find(|(s, _)| *s == seq)
        {
            match decode_batch(copy, &self.config.limits) {
                Ok(decoded) => {
                    info!(seq, "kv events: the replayed copy of the undecodable batch decoded");
                    EventMetrics::inc(&self.metrics.bad_batches_replayed);
                    return self.apply(seq, copy, decoded).await;
                }
                Err(error) => {
                    warn!(seq, %error, kind = error.kind(), "kv events: the replayed copy is undecodable too");
                    self.metrics.decode_error(error.kind());
                }
            }
        }
        self.skip_bad(seq).await
    }

    /// Decodes and sends a replayed batch; there is no other copy to ask for.
    async fn emit_replayed(&mut self, seq: u64, payload: &[u8]) -> Result<(), Closed> {
        match decode_batch(payload, &self.config.limits) {
            Ok(decoded) => self.apply(seq, payload, decoded).await,
            Err(error) => {
                warn!(seq, %error, kind = error.kind(), "kv events: undecodable replayed batch");
                self.metrics.decode_error(error.kind());
                EventMetrics::inc(&self.metrics.undecodable_batches);
                self.skip_bad(seq).await
            }
        }
    }

    /// A batch that decodes in no copy: what it changed is unknown, so the
    /// stream starts over empty, right after it.
    async fn skip_bad(&mut self, seq: u64) -> Result<(), Closed> {
        self.reset(seq, ResetCause::BadBatch).await?;
        // Consumed: the next batch continues the emptied stream instead of
        // revealing a gap that would ask for this one again.
        self.tracker.applied(seq);
        Ok(())
    }

    /// Asks the replay socket for `from..until`, reading live batches into the
    /// hold buffer meanwhile so that the publisher does not drop them. A
    /// failure suspends the endpoint for `replay_backoff`.
    pub(super) async fn replay(
        &mut self,
        sub: &mut SubSocket,
        from: u64,
        until: Option<u64>,
    ) -> Result<Result<Vec<(u64, Bytes)>, NoReplay>, Closed> {
        let Some(endpoint) = self.stream.replay_endpoint.clone() else {
            warn!(from, ?until, "kv events: batches missing and no replay endpoint");
            self.metrics.replay(ReplayOutcome::Failed);
            return Ok(Err(NoReplay));
        };
        if let Some(t) = self.replay_suspended_until {
            if Instant::now() < t {
                debug!(from, ?until, "kv events: replay endpoint failed recently, not asking");
                self.metrics.replay(ReplayOutcome::Skipped);
                return Ok(Err(NoReplay));
            }
            self.replay_suspended_until = None;
        }
        let limits = self.config.replay_limits();
        let fetch = fetch_range(&endpoint, from, until, &limits);
        tokio::pin!(fetch);
        let result = loop {
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return Err(Closed),
                r = &mut fetch => break r,
                m = sub.recv(), if self.live_error.is_none() => self.hold(m),
            }
        };
        match result {
            Ok(batches) => Ok(Ok(batches)),
            Err(error) => {
                let backoff = self.config.replay_backoff;
                warn!(from, ?until, %error, kind = error.kind(), ?backoff, "kv events: replay failed, backing off");
                self.metrics.replay(match error {
                    ReplayError::Socket(_) => ReplayOutcome::Failed,
                    ReplayError::Timeout(_) => ReplayOutcome::TimedOut,
                    ReplayError::OverLimit { .. } => ReplayOutcome::OverLimit,
                });
                self.replay_suspended_until = Some(Instant::now() + backoff);
                Ok(Err(NoReplay))
            }
        }
    }

    /// Keeps a live message read during a replay, within the hold limits. A
    /// dropped one is a gap the next live batch reveals, repaired then.
    fn hold(&mut self, message: ZmqResult<ZmqMessage>) {
        let frames = match message {
            Ok(m) => m.into_vec(),
            Err(e) => {
                self.live_error = Some(e.to_string());
                return;
            }
        };
        let size: usize = frames.iter().map(Bytes::len).sum();
        if self.held.len() >= self.config.live_hold_batches
            || self.held_bytes.saturating_add(size) > self.config.live_hold_bytes
        {
            debug!(
                held = self.held.len(),
                held_bytes = self.held_bytes,
                "kv events: hold buffer full, live batch dropped"
            );
            EventMetrics::inc(&self.metrics.live_dropped);
            return;
        }
        EventMetrics::inc(&self.metrics.live_held);
        self.held_bytes += size;
        self.held.push_back(frames);
    }
}
