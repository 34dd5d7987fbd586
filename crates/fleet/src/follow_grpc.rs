//! Following a gRPC worker's KV events: its service's `SubscribeKvEvents`
//! stream instead of ZMQ. Each data-parallel rank is a stream of the pump,
//! registered when its first batch comes; batches go to the pump in their
//! order, a batch that skips a sequence number resets its rank first (what
//! was missed is unknowable), and a broken stream resets every rank and
//! subscribes again from zero (the engine replays what it kept). Never a
//! silent divergence: the index holds less, never what the engine dropped.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use engine_grpc::Engine;
use kv_events::{Decoded, StreamMessage, StreamUpdate};
use kv_ingest::{PumpControl, StreamHashing};
use renderer::HashMode;
use router_types::{DpRank, WorkerKey};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::{Events, EventsSide, Fleet, MAX_DP_SIZE, Worker};

/// First and longest wait before subscribing again.
const BACKOFF_INITIAL: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Longest a subscription may take to start, and a server-info ask.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// Finds the worker's page size, then follows its events under its tasks until it leaves.
pub(crate) async fn follow(fleet: &Arc<Fleet>, ev: &EventsSide, worker: &Arc<Worker>) {
    let Some(engine) = worker.engine().cloned() else { return };
    let mut backoff = BACKOFF_INITIAL;
    // Its page size from its server args (the HTTP path reads `/server_info`), asked until it answers.
    let found = loop {
        let asked = tokio::select! {
            biased;
            () = worker.cancel.cancelled() => return,
            r = engine.server_info(ATTEMPT_TIMEOUT) => r,
        };
        match asked {
            Ok(info) => break crate::grpc::page_size(&info),
            Err(e) => {
                tracing::debug!(worker = %worker.url, error = %e, "kv events: gRPC worker not reachable yet");
                if !sleep(&worker.cancel, &mut backoff).await {
                    return;
                }
            }
        }
    };
    let Some(block_size) = fleet.pool_block_size(ev, worker, found) else { return };
    let hashing = StreamHashing {
        page_size: NonZeroUsize::new(block_size).unwrap_or(NonZeroUsize::MIN),
        mode: HashMode::Unigram,
        // SGLang's scheduler service relays SGLang's hashes: the router's own.
        engine_hash_is_router_hash: true,
    };
    let generation = worker.cancel.child_token();
    *worker.subscriptions.lock().unwrap_or_else(|p| p.into_inner()) = generation.clone();
    let follower = Follower {
        engine,
        worker: worker.clone(),
        tx: ev.tx.clone(),
        control: ev.control.clone(),
        hashing,
        ranks: HashMap::new(),
    };
    worker.tasks.spawn(follower.run(generation));
    ev.hash_modes.add(hashing.mode);
    info!(worker = %worker.url, block_size, "kv events: following gRPC worker");
    worker.set_events(Events::Followed { streams: 1 });
    worker.discovered();
}

/// Waits `backoff` (doubled for next time, up to the most); false when `cancel` fired first.
async fn sleep(cancel: &CancellationToken, backoff: &mut Duration) -> bool {
    let wait = *backoff;
    *backoff = (*backoff * 2).min(BACKOFF_MAX);
    tokio::select! {
        () = cancel.cancelled() => false,
        () = tokio::time::sleep(wait) => true,
    }
}

/// One gRPC worker's subscription and its ranks' cursors.
struct Follower {
    engine: Arc<Engine>,
    worker: Arc<Worker>,
    tx: tokio::sync::mpsc::Sender<StreamMessage>,
    control: tokio::sync::mpsc::Sender<PumpControl>,
    hashing: StreamHashing,
    /// Each rank registered with the pump: the last sequence number applied, if any.
    ranks: HashMap<u32, Option<u64>>,
}

impl Follower {
    async fn run(mut self, cancel: CancellationToken) {
        let mut backoff = BACKOFF_INITIAL;
        loop {
            let subscribed = tokio::select! {
                () = cancel.cancelled() => return,
                s = self.engine.subscribe_kv_events(0, ATTEMPT_TIMEOUT) => s,
            };
            let mut stream = match subscribed {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(worker = %self.worker.url, error = %e, "kv events: gRPC subscription failed");
                    if !sleep(&cancel, &mut backoff).await {
                        return;
                    }
                    continue;
                }
            };
            loop {
                let next = tokio::select! {
                    () = cancel.cancelled() => return,
                    b = stream.next() => b,
                };
                match next {
                    Ok(Some(batch)) => {
                        backoff = BACKOFF_INITIAL;
                        if !self.take(batch).await {
                            return;
                        }
                    }
                    // Ended, cleanly or not: a subscription has no end of its own.
                    ended => {
                        let why = ended.err().map_or_else(|| "the stream ended".to_owned(), |e| e.to_string());
                        warn!(worker = %self.worker.url, error = %why, "kv events: gRPC event stream ended; every rank reset, subscribing again");
                        break;
                    }
                }
            }
            // What happened while no stream was open is unknown: every rank starts over.
            for rank in self.ranks.keys().copied().collect::<Vec<_>>() {
                if !self.reset(rank).await {
                    return;
                }
            }
            if !sleep(&cancel, &mut backoff).await {
                return;
            }
        }
    }

    /// One batch: its rank registered, a gap reset, the batch to the pump. False: the pump is gone.
    async fn take(&mut self, batch: engine_grpc::proto::KvEventBatch) -> bool {
        if let Some(load) = &batch.load {
            // The servicer's pushed load: the same figures a `GetLoads` poll gives.
            self.worker.set_reported_requests(load.running_requests.saturating_add(load.waiting_requests));
            if let Some(uncached) = load.waiting_uncached_tokens {
                self.worker.set_reported_uncached_tokens(u64::from(uncached));
            }
            if load.load_only {
                return true;
            }
        }
        let rank = u32::try_from(batch.dp_rank.unwrap_or(0)).unwrap_or(u32::MAX);
        if rank >= MAX_DP_SIZE {
            warn!(worker = %self.worker.url, rank, "kv events: a batch of a rank past the bound, skipped");
            return true;
        }
        if !self.ranks.contains_key(&rank) && !self.register(rank).await {
            return false;
        }
        let seq = batch.sequence_number;
        let last = self.ranks.get(&rank).copied().flatten();
        match last {
            Some(l) if seq <= l => return true,
            Some(l) if seq != l + 1 => {
                warn!(worker = %self.worker.url, rank, after = l, got = seq, "kv events: gRPC stream skipped batches; rank reset");
                if !self.reset(rank).await {
                    return false;
                }
            }
            _ => {}
        }
        let key = self.key(rank);
        let update = match engine_grpc::events::to_router(&batch) {
            Ok((batch, unknown_events)) => StreamUpdate::Batch(Decoded { batch, unknown_events }),
            Err(e) => {
                // Refused whole: what it changed is unknown, so the rank starts over.
                warn!(worker = %self.worker.url, rank, seq, error = %e, "kv events: bad gRPC batch; rank reset");
                self.ranks.insert(rank, None);
                StreamUpdate::Reset
            }
        };
        if matches!(update, StreamUpdate::Batch(_)) {
            self.ranks.insert(rank, Some(seq));
        }
        self.tx.send(StreamMessage { key, seq, update }).await.is_ok()
    }

    fn key(&self, rank: u32) -> WorkerKey {
        WorkerKey { worker: self.worker.url.clone(), rank: DpRank(rank) }
    }

    /// Registers `rank`'s stream with the pump (and under the worker, to be removed with it).
    async fn register(&mut self, rank: u32) -> bool {
        let key = self.key(rank);
        let (done, registered) = tokio::sync::oneshot::channel();
        if self.control.send(PumpControl::AddStream(key.clone(), self.hashing, None, done)).await.is_err() {
            return false;
        }
        match registered.await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => warn!(stream = %key, error = %e, "kv events: gRPC stream not registered"),
            Err(_) => return false,
        }
        self.worker.streams.lock().unwrap_or_else(|p| p.into_inner()).push(key.clone());
        if self.worker.cancel.is_cancelled() {
            // Removed meanwhile: the removal may have looked before this stream was listed.
            let _ = self.control.send(PumpControl::RemoveStream(key)).await;
            return false;
        }
        self.ranks.insert(rank, None);
        true
    }

    /// Drops what the index holds of `rank`.
    async fn reset(&mut self, rank: u32) -> bool {
        self.ranks.insert(rank, None);
        let message = StreamMessage { key: self.key(rank), seq: 0, update: StreamUpdate::Reset };
        self.tx.send(message).await.is_ok()
    }
}
