//! The embedding pool: one dispatcher thread that takes queued texts in
//! batches and runs the model on its own threads (a rayon pool of
//! `threads`, so candle's matrix products never run on the serving
//! runtime), a bounded queue (full: [`EmbedError::Busy`] at once), a bounded
//! LRU cache keyed by a per-process keyed hash of the text, and counters.
//! Owns the queue, the cache and the threads; a dropped pool stops them.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lru::LruCache;
use tokio::sync::oneshot;

use crate::{EmbedError, Embedded, Encoder};

/// How the pool runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Threads the model's arithmetic runs on.
    pub threads: usize,
    /// Texts waiting at most; one more is refused at once.
    pub queue: usize,
    /// Texts embedded together at most.
    pub batch: usize,
    /// Embeddings kept (0: none).
    pub cache_entries: usize,
    /// How long a caller waits for its embedding.
    pub timeout: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig { threads: 1, queue: 64, batch: 8, cache_entries: 10_000, timeout: Duration::from_millis(2_000) }
    }
}

/// An embedding and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Lookup {
    /// The embedding.
    pub embedded: Embedded,
    /// Found in the cache.
    pub cached: bool,
}

/// The pool's counters (monotonic since start).
#[derive(Debug, Default)]
pub struct Stats {
    /// Embeddings asked for.
    pub requests: AtomicU64,
    /// Answered from the cache.
    pub cache_hits: AtomicU64,
    /// Refused: the queue was full.
    pub busy: AtomicU64,
    /// Given up on: no answer within the timeout.
    pub timeouts: AtomicU64,
    /// Failed (tokenizer or model).
    pub errors: AtomicU64,
    /// Computed by the model.
    pub computed: AtomicU64,
    /// Computed from a truncated text.
    pub truncated: AtomicU64,
    /// Model runs (each embeds a batch).
    pub batches: AtomicU64,
    /// Time in the model, in microseconds.
    pub compute_micros: AtomicU64,
}

/// The pool (cheap to clone: one queue, cache and thread behind it).
#[derive(Debug, Clone)]
pub struct EmbedPool {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    encoder: Arc<Encoder>,
    jobs: SyncSender<Job>,
    cache: Option<Mutex<LruCache<u64, Embedded>>>,
    keys: ahash::RandomState,
    stats: Arc<Stats>,
    config: PoolConfig,
    waiting: Arc<AtomicU64>,
}

#[derive(Debug)]
struct Job {
    text: String,
    key: u64,
    reply: oneshot::Sender<Result<Embedded, EmbedError>>,
}

// === impl EmbedPool ===

impl EmbedPool {
    /// Starts the pool's threads for `encoder`.
    pub fn new(encoder: Arc<Encoder>, config: PoolConfig) -> Result<EmbedPool, EmbedError> {
        let config = PoolConfig {
            threads: config.threads.max(1),
            queue: config.queue.max(1),
            batch: config.batch.max(1),
            ..config
        };
        let (jobs, rx) = sync_channel(config.queue);
        let stats = Arc::new(Stats::default());
        let waiting = Arc::new(AtomicU64::new(0));
        let cache = NonZeroUsize::new(config.cache_entries).map(|n| Mutex::new(LruCache::new(n)));
        let inner = Arc::new(Inner {
            encoder: encoder.clone(),
            jobs,
            cache,
            keys: ahash::RandomState::new(),
            stats: stats.clone(),
            config,
            waiting: waiting.clone(),
        });
        let run = Runner::new(config.threads)?;
        let pool = EmbedPool { inner };
        let weak = Arc::downgrade(&pool.inner);
        std::thread::Builder::new()
            .name("embed-dispatch".into())
            .spawn(move || dispatch(rx, &encoder, &run, &stats, &waiting, config.batch, &weak))
            .map_err(|e| EmbedError::Model(format!("cannot start the embedding thread: {e}")))?;
        Ok(pool)
    }

    /// The model.
    pub fn encoder(&self) -> &Arc<Encoder> {
        &self.inner.encoder
    }

    /// How it runs.
    pub fn config(&self) -> PoolConfig {
        self.inner.config
    }

    /// The counters.
    pub fn stats(&self) -> &Stats {
        &self.inner.stats
    }

    /// Texts in the queue or being embedded now.
    pub fn waiting(&self) -> u64 {
        self.inner.waiting.load(Ordering::Relaxed)
    }

    /// Cached embeddings now.
    pub fn cached(&self) -> usize {
        self.inner.cache.as_ref().map_or(0, |c| c.lock().unwrap_or_else(|p| p.into_inner()).len())
    }

    /// The embedding of `text`: from the cache, else queued for the pool's
    /// thread and awaited (at most the configured timeout). The serving
    /// thread only hashes the text and copies it into the queue.
    pub async fn embed(&self, text: &str) -> Result<Lookup, EmbedError> {
        let inner = &self.inner;
        inner.stats.requests.fetch_add(1, Ordering::Relaxed);
        let key = inner.keys.hash_one(text);
        if let Some(embedded) = inner.cached(key) {
            inner.stats.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Lookup { embedded, cached: true });
        }
        let (reply, answer) = oneshot::channel();
        inner.waiting.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = inner.jobs.try_send(Job { text: text.to_owned(), key, reply }) {
            inner.waiting.fetch_sub(1, Ordering::Relaxed);
            return Err(match e {
                TrySendError::Full(_) => {
                    inner.stats.busy.fetch_add(1, Ordering::Relaxed);
                    EmbedError::Busy(inner.config.queue)
                }
                TrySendError::Disconnected(_) => EmbedError::Closed,
            });
        }
        match tokio::time::timeout(inner.config.timeout, answer).await {
            Ok(Ok(result)) => result.map(|embedded| Lookup { embedded, cached: false }),
            Ok(Err(_)) => Err(EmbedError::Closed),
            Err(_) => {
                inner.stats.timeouts.fetch_add(1, Ordering::Relaxed);
                Err(EmbedError::Timeout(inner.config.timeout.as_millis() as u64))
            }
        }
    }

    /// Embeds `texts` on the calling thread, in batches, through the cache
    /// (for configuration: examples and candidate phrases; not for requests).
    pub fn embed_now(&self, texts: &[&str]) -> Result<Vec<Embedded>, EmbedError> {
        let inner = &self.inner;
        let keys: Vec<u64> = texts.iter().map(|t| inner.keys.hash_one(t)).collect();
        let mut out: Vec<Option<Embedded>> = keys.iter().map(|&k| inner.cached(k)).collect();
        let missing: Vec<usize> = (0..texts.len()).filter(|&i| out[i].is_none()).collect();
        for chunk in missing.chunks(inner.config.batch.max(8)) {
            let batch: Vec<&str> = chunk.iter().map(|&i| texts[i]).collect();
            for (&i, e) in chunk.iter().zip(inner.encoder.embed_batch(&batch)?) {
                inner.store(keys[i], &e);
                out[i] = Some(e);
            }
        }
        Ok(out.into_iter().flatten().collect())
    }
}

// === impl Inner ===

impl Inner {
    fn cached(&self, key: u64) -> Option<Embedded> {
        self.cache.as_ref()?.lock().unwrap_or_else(|p| p.into_inner()).get(&key).cloned()
    }

    fn store(&self, key: u64, embedded: &Embedded) {
        if let Some(cache) = &self.cache {
            cache.lock().unwrap_or_else(|p| p.into_inner()).put(key, embedded.clone());
        }
    }
}

/// Where the model's arithmetic runs: a rayon pool of its own (candle's
/// matrix products split across the pool the calling code runs in).
#[derive(Debug)]
struct Runner {
    #[cfg(feature = "candle")]
    pool: rayon::ThreadPool,
}

impl Runner {
    fn new(threads: usize) -> Result<Runner, EmbedError> {
        #[cfg(feature = "candle")]
        {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("embed-{i}"))
                .build()
                .map_err(|e| EmbedError::Model(format!("cannot start the embedding threads: {e}")))?;
            Ok(Runner { pool })
        }
        #[cfg(not(feature = "candle"))]
        {
            let _ = threads;
            Ok(Runner {})
        }
    }

    fn run<T: Send>(&self, work: impl FnOnce() -> T + Send) -> T {
        #[cfg(feature = "candle")]
        return self.pool.install(work);
        #[cfg(not(feature = "candle"))]
        work()
    }
}

/// The dispatcher: a batch of what is queued (callers that gave up are
/// skipped), embedded together, answered and cached.
fn dispatch(
    rx: Receiver<Job>,
    encoder: &Encoder,
    run: &Runner,
    stats: &Stats,
    waiting: &AtomicU64,
    batch: usize,
    pool: &std::sync::Weak<Inner>,
) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        while jobs.len() < batch {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let queued = jobs.len() as u64;
        jobs.retain(|j| !j.reply.is_closed());
        if !jobs.is_empty() {
            let texts: Vec<&str> = jobs.iter().map(|j| j.text.as_str()).collect();
            let start = Instant::now();
            let result = run.run(|| encoder.embed_batch(&texts));
            stats.compute_micros.fetch_add(start.elapsed().as_micros() as u64, Ordering::Relaxed);
            stats.batches.fetch_add(1, Ordering::Relaxed);
            match result {
                Ok(embedded) => {
                    let inner = pool.upgrade();
                    for (job, e) in jobs.into_iter().zip(embedded) {
                        stats.computed.fetch_add(1, Ordering::Relaxed);
                        if e.truncated {
                            stats.truncated.fetch_add(1, Ordering::Relaxed);
                        }
                        if let Some(inner) = &inner {
                            inner.store(job.key, &e);
                        }
                        let _ = job.reply.send(Ok(e));
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, texts = jobs.len(), "embedding failed");
                    for job in jobs {
                        stats.errors.fetch_add(1, Ordering::Relaxed);
                        let _ = job.reply.send(Err(e.clone()));
                    }
                }
            }
        }
        waiting.fetch_sub(queued, Ordering::Relaxed);
    }
}
