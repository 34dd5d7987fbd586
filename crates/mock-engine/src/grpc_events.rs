//! The engine's KV events as its gRPC service streams them
//! (`SubscribeKvEvents`): each rank's batches numbered from 1 on its own
//! counter, the last `keep` of each rank retained, so a subscriber from zero
//! gets the retained history and then the live batches, in order, with no gap
//! between them; one that falls behind the live stream by more than the
//! channel holds is ended (`DATA_LOSS`) and starts over.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use engine_grpc::proto::KvEventBatch;
use router_types::EventBatch;
use tokio::sync::broadcast;

/// Live batches a subscriber may be behind before it is ended.
const LIVE_DEPTH: usize = 4096;

/// Every rank's numbered batches: the retained history and the live channel.
#[derive(Debug)]
pub(crate) struct GrpcEvents {
    ranks: Vec<Mutex<RankLog>>,
    live: broadcast::Sender<Arc<KvEventBatch>>,
    keep: usize,
}

#[derive(Debug, Default)]
struct RankLog {
    next: u64,
    kept: VecDeque<Arc<KvEventBatch>>,
}

impl GrpcEvents {
    pub(crate) fn new(ranks: usize, keep: usize) -> Self {
        let ranks = (0..ranks.max(1)).map(|_| Mutex::new(RankLog { next: 1, kept: VecDeque::new() })).collect();
        Self { ranks, live: broadcast::channel(LIVE_DEPTH).0, keep: keep.max(1) }
    }

    /// Numbers `batch` on `rank`'s counter, keeps it, and sends it to the subscribers.
    pub(crate) fn record(&self, rank: usize, batch: &EventBatch) {
        let Some(log) = self.ranks.get(rank) else { return };
        let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
        let numbered = Arc::new(engine_grpc::events::from_router(log.next, batch));
        log.next += 1;
        log.kept.push_back(numbered.clone());
        while log.kept.len() > self.keep {
            log.kept.pop_front();
        }
        // Under the rank's lock: a subscriber sees its batches in their order.
        let _ = self.live.send(numbered);
    }

    /// The retained history of every rank, and the live batches from then on.
    pub(crate) fn subscribe(&self) -> (Vec<Arc<KvEventBatch>>, broadcast::Receiver<Arc<KvEventBatch>>) {
        let logs: Vec<_> = self.ranks.iter().map(|l| l.lock().unwrap_or_else(|p| p.into_inner())).collect();
        let history = logs.iter().flat_map(|l| l.kept.iter().cloned()).collect();
        // Subscribed while every rank is held: nothing falls between the history and the live.
        let live = self.live.subscribe();
        drop(logs);
        (history, live)
    }
}
