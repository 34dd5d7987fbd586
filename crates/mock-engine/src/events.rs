//! Each rank's KV event queue. Batches are queued under the cache lock, so
//! they leave in the order the cache changed, each after the configured
//! delay; the publisher's restarts and crashes pass through the same queue,
//! so a batch of the cache before a restart is published before it, never
//! as a batch of the new cache (as an engine's single scheduler thread
//! orders them).

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kv_events::Publisher;
use router_types::{EventBatch, KvEvent};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// What the queue's task does next.
#[derive(Debug)]
enum Item {
    /// Publish a batch at `due`.
    Batch(Instant, EventBatch),
    /// Seq back to 0 and the replay buffer emptied, sockets kept.
    Restart(oneshot::Sender<()>),
    /// Optionally `END_SEQ` first, then the PUB socket closed for a while and
    /// bound again (seq 0, replay buffer emptied).
    Crash { down: Duration, graceful: bool, done: oneshot::Sender<()> },
}

/// The sending side; the task stops when the engine (every sender) is gone.
#[derive(Debug, Clone)]
pub(crate) struct EventQueue {
    tx: mpsc::UnboundedSender<Item>,
    /// Items queued and not yet done.
    pending: Arc<AtomicUsize>,
    /// The blocks its published batches tell a subscriber that follows
    /// them all the cache holds: a check of the engine's own events.
    told: Arc<Mutex<HashSet<u64>>>,
}

// === impl EventQueue ===

impl EventQueue {
    /// Starts the task publishing through `publisher`. Unbounded: it holds at
    /// most one batch per request in flight, and the events of a flush.
    pub(crate) fn spawn(publisher: Arc<Publisher>) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<Item>();
        let pending = Arc::new(AtomicUsize::new(0));
        let done_one = pending.clone();
        let told = Arc::new(Mutex::new(HashSet::new()));
        let telling = told.clone();
        tokio::spawn(async move {
            while let Some(item) = rx.recv().await {
                match item {
                    Item::Batch(due, batch) => {
                        tokio::time::sleep_until(due).await;
                        tell(&mut telling.lock().unwrap_or_else(|p| p.into_inner()), &batch);
                        if let Err(e) = publisher.publish(&batch).await {
                            tracing::warn!(error = %e, "mock engine: event publish failed");
                        }
                    }
                    Item::Restart(done) => {
                        telling.lock().unwrap_or_else(|p| p.into_inner()).clear();
                        publisher.restart().await;
                        let _ = done.send(());
                    }
                    Item::Crash { down, graceful, done } => {
                        telling.lock().unwrap_or_else(|p| p.into_inner()).clear();
                        if graceful && let Err(e) = publisher.send_end().await {
                            tracing::warn!(error = %e, "mock engine: END_SEQ failed");
                        }
                        if let Err(e) = publisher.crash(down).await {
                            tracing::warn!(error = %e, "mock engine: publisher did not come back");
                        }
                        let _ = done.send(());
                    }
                }
                done_one.fetch_sub(1, Ordering::SeqCst);
            }
        });
        Self { tx, pending, told }
    }

    /// What its published batches say the cache holds.
    pub(crate) fn told(&self) -> HashSet<u64> {
        self.told.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Items queued and not yet done (published, or the restart finished).
    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
    }

    fn send(&self, item: Item) {
        self.pending.fetch_add(1, Ordering::SeqCst);
        if self.tx.send(item).is_err() {
            self.pending.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Queues a batch, published after `delay`.
    pub(crate) fn batch(&self, delay: Duration, batch: EventBatch) {
        self.send(Item::Batch(Instant::now() + delay, batch));
    }

    /// Queues a restart of the publisher; resolves once it is done.
    pub(crate) fn restart(&self) -> oneshot::Receiver<()> {
        let (done, rx) = oneshot::channel();
        self.send(Item::Restart(done));
        rx
    }

    /// Queues a crash of the publisher; resolves once it is back.
    pub(crate) fn crash(&self, down: Duration, graceful: bool) -> oneshot::Receiver<()> {
        let (done, rx) = oneshot::channel();
        self.send(Item::Crash { down, graceful, done });
        rx
    }
}

/// Applies a batch to the set of blocks it tells of.
fn tell(told: &mut HashSet<u64>, batch: &EventBatch) {
    for event in &batch.events {
        match event {
            KvEvent::Stored(s) => told.extend(s.block_hashes.iter().map(|h| h.key())),
            KvEvent::Removed { block_hashes, .. } => {
                for h in block_hashes {
                    told.remove(&h.key());
                }
            }
            KvEvent::AllCleared => told.clear(),
        }
    }
}
