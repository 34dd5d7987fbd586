//! The simulated engine's core, independent of HTTP: turn a request into
//! tokens, admit it to a dp rank (cache lookup, FCFS prefill lane, cache
//! insert with eviction, KV events), pace decoding, release it; and the
//! fault knobs.

use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::MockEngineConfig;
use crate::cache::PagedCache;
use crate::events::EventQueue;
use kv_events::Publisher;
use renderer::{HashMode, PageHasher, Renderer};
use router_types::{BlockHash, EngineBlockHash, EventBatch, KvEvent, StoredBlocks, Tier};
use serde::{Deserialize, Serialize};

/// Fault knobs, set through `POST /admin/faults` or directly in tests.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Faults {
    /// The next N event batches are kept for replay but not sent live.
    pub drop_next_batches: usize,
    /// Restart the publishers now: seq back to 0, caches cleared.
    pub restart_publisher: bool,
    /// Delay every event batch by this many milliseconds.
    pub event_delay_ms: u64,
    /// The next N requests fail with HTTP 500 (or `fail_status`).
    pub fail_next: usize,
    /// The status of those failures (0: 500); 503 makes an overloaded engine.
    pub fail_status: u16,
    /// The next N requests never answer.
    pub hang_next: usize,
    /// The next N requests wait until [`Engine::release_held`] lets them go (a test's gate).
    pub hold_next: usize,
    /// The next N streamed requests die after their first chunk.
    pub die_mid_stream_next: usize,
    /// The next N streamed requests stop after their first chunk, the connection open, until
    /// [`Engine::release_held`] lets each go on (a wedged engine).
    pub wedge_mid_stream_next: usize,
    /// Requests added to every rank's reported queue in `/v1/loads` (an engine loaded by
    /// other routers' requests; 0: none).
    pub report_waiting_extra: u64,
    /// The KV-cache usage every rank reports in `/v1/loads`, 0 to 1 (an engine filled by
    /// other routers' requests; `None`: its own).
    pub report_token_usage: Option<f64>,
    /// The generation throughput (tokens a second) every rank reports in `/v1/loads` and
    /// `GetLoads` (`gen_throughput`; 0: none, as an idle engine reports).
    pub report_gen_throughput: f64,
    /// A vLLM prefill: the next N answers leave out `kv_transfer_params` (a broken prefill).
    pub drop_kv_params_next: usize,
    /// A vLLM prefill: the next answer's `kv_transfer_params` carry this many bytes of padding
    /// (a hostile or broken prefill; 0: none).
    pub bloat_kv_params_bytes: usize,
}

/// A fault that hits one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestFault {
    /// Answer this error status.
    Fail(u16),
    /// Never answer.
    Hang,
    /// Wait for [`Engine::release_held`].
    Hold,
    /// Stream one chunk, then break the connection.
    DieMidStream,
}

/// Why a request cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The request body is wrong (HTTP 400).
    #[error(transparent)]
    Render(#[from] renderer::RenderError),
}

/// One dp rank: a cache, a prefill lane, an event queue.
#[derive(Debug)]
struct Rank {
    cache: Mutex<PagedCache>,
    lane: tokio::sync::Mutex<()>,
    events: Option<EventQueue>,
    /// Requests queued for the prefill lane, and their uncached tokens.
    waiting: AtomicU64,
    waiting_uncached: AtomicU64,
    /// Requests admitted and not yet answered (prefilling or decoding).
    running: AtomicU64,
}

/// One rank's load as SGLang's `/v1/loads` reports it (the fields a router reads).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct RankLoad {
    /// The data-parallel rank.
    pub dp_rank: usize,
    /// Requests prefilling or decoding.
    pub num_running_reqs: u64,
    /// Requests queued for prefill.
    pub num_waiting_reqs: u64,
    /// Prompt tokens of the queued requests not in the cache.
    pub num_waiting_uncached_tokens: u64,
    /// Share of the KV cache's pages running requests hold (SGLang's `token_usage`: the
    /// evictable cache apart).
    pub token_usage: f64,
    /// Tokens a second it generates (SGLang's `gen_throughput`; a fault sets it).
    pub gen_throughput: f64,
}

/// Ends a running count if the request is dropped before it is admitted.
struct Running<'a>(&'a Rank);

impl<'a> Running<'a> {
    fn start(rank: &'a Rank) -> Self {
        rank.running.fetch_add(1, Ordering::Relaxed);
        Self(rank)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts a request as queued until it reaches the prefill lane (or is dropped).
struct Queued<'a> {
    rank: &'a Rank,
    uncached: u64,
}

impl<'a> Queued<'a> {
    fn start(rank: &'a Rank, uncached: u64) -> Self {
        rank.waiting.fetch_add(1, Ordering::Relaxed);
        rank.waiting_uncached.fetch_add(uncached, Ordering::Relaxed);
        Self { rank, uncached }
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.rank.waiting.fetch_sub(1, Ordering::Relaxed);
        self.rank.waiting_uncached.fetch_sub(self.uncached, Ordering::Relaxed);
    }
}

/// The engine.
#[derive(Debug)]
pub struct Engine {
    config: MockEngineConfig,
    renderer: Renderer,
    hasher: PageHasher,
    ranks: Vec<Rank>,
    publishers: Vec<std::sync::Arc<Publisher>>,
    next_rank: AtomicUsize,
    faults: Mutex<Faults>,
    /// Its disaggregated role, when it has one.
    pd: Option<std::sync::Arc<crate::pd::Pd>>,
    /// The last PD legs it got (their `x-request-id`, rank header and body), for tests.
    legs: Mutex<std::collections::VecDeque<Leg>>,
    /// Requests served, prompt tokens, cached prompt tokens.
    pub requests: AtomicU64,
    /// `/flush_cache` calls served.
    pub flushes: AtomicU64,
    /// Requests that came over HTTP/2 (with [`crate::MockEngineConfig::http2`]).
    pub http2_requests: AtomicU64,
    /// Requests of any kind (probes, polls, generations) that came over HTTP/1.x.
    pub http1_requests: AtomicU64,
    /// ...
    pub prompt_tokens: AtomicU64,
    /// ...
    pub cached_tokens: AtomicU64,
    /// Streamed answers whose client went away before their end (the
    /// response body dropped unfinished): requests the engine saw cancelled.
    pub cancelled_streams: AtomicU64,
    /// The generated tokens' logprob (f64 bits).
    token_logprob: AtomicU64,
    /// Requests held by the `hold_next` fault now.
    pub held: AtomicUsize,
    /// Lets held requests go.
    release: tokio::sync::Semaphore,
    /// Its KV events for its gRPC service's subscribers (with `grpc_listen` and KV events on).
    pub(crate) grpc_events: Option<crate::grpc_events::GrpcEvents>,
}

/// One disaggregated leg an engine got, as it came.
#[derive(Debug, Clone)]
pub struct Leg {
    /// Its `X-Request-Id`.
    pub request_id: Option<String>,
    /// Its `X-Data-Parallel-Rank`.
    pub rank_header: Option<String>,
    /// Its body.
    pub body: serde_json::Value,
    /// Its headers (name, value), in order.
    pub headers: Vec<(String, String)>,
    /// When it arrived.
    pub at: Instant,
}

impl Leg {
    /// A request as it arrived.
    pub(crate) fn of(headers: &axum::http::HeaderMap, body: &serde_json::Value) -> Self {
        let header = |name: &str| headers.get(name).and_then(|h| h.to_str().ok()).map(str::to_string);
        Leg {
            request_id: header("x-request-id"),
            rank_header: header("x-data-parallel-rank"),
            body: body.clone(),
            headers: headers
                .iter()
                .map(|(n, v)| (n.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
                .collect(),
            at: Instant::now(),
        }
    }
}

/// Legs an engine remembers.
const MAX_LEGS: usize = 256;

/// An admitted request: its rank and pinned pages. Release with [`Engine::release`].
#[derive(Debug)]
pub struct Admission {
    rank: usize,
    chain: Vec<BlockHash>,
    pinned: usize,
    /// The cache generation the pins belong to.
    generation: u64,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens that were already cached.
    pub cached_tokens: usize,
}

// === impl Engine ===

impl Engine {
    pub(crate) fn new(
        config: MockEngineConfig,
        renderer: Renderer,
        publishers: Vec<Publisher>,
        pd: Option<std::sync::Arc<crate::pd::Pd>>,
    ) -> Self {
        let page = NonZeroUsize::new(config.page_size).unwrap_or(NonZeroUsize::MIN);
        let publishers: Vec<std::sync::Arc<Publisher>> = publishers.into_iter().map(std::sync::Arc::new).collect();
        let ranks = (0..config.dp_size.max(1))
            .map(|r| {
                let events = publishers.get(r).map(|p| EventQueue::spawn(p.clone()));
                Rank {
                    cache: Mutex::new(PagedCache::new(config.capacity_tokens / page.get())),
                    lane: tokio::sync::Mutex::new(()),
                    events,
                    waiting: AtomicU64::new(0),
                    waiting_uncached: AtomicU64::new(0),
                    running: AtomicU64::new(0),
                }
            })
            .collect();
        let config_logprob = config.token_logprob;
        let grpc_events = (config.grpc_listen.is_some() && config.kv_events)
            .then(|| crate::grpc_events::GrpcEvents::new(config.dp_size, config.replay_buffer_steps));
        Self {
            hasher: PageHasher::new(page, HashMode::Unigram),
            config,
            renderer,
            ranks,
            publishers,
            next_rank: AtomicUsize::new(0),
            faults: Mutex::new(Faults::default()),
            pd,
            legs: Mutex::new(std::collections::VecDeque::new()),
            requests: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            http2_requests: AtomicU64::new(0),
            http1_requests: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            cached_tokens: AtomicU64::new(0),
            cancelled_streams: AtomicU64::new(0),
            token_logprob: AtomicU64::new(config_logprob.to_bits()),
            held: AtomicUsize::new(0),
            release: tokio::sync::Semaphore::new(0),
            grpc_events,
        }
    }

    /// The logprob every generated token is reported with.
    pub fn token_logprob(&self) -> f64 {
        f64::from_bits(self.token_logprob.load(Ordering::Relaxed))
    }

    /// Changes the generated tokens' logprob (how sure the simulated model is).
    pub fn set_token_logprob(&self, logprob: f64) {
        self.token_logprob.store(logprob.to_bits(), Ordering::Relaxed);
    }

    /// The configuration.
    pub fn config(&self) -> &MockEngineConfig {
        &self.config
    }

    /// Its disaggregated side (prefill or decode role), if any.
    pub fn pd(&self) -> Option<&std::sync::Arc<crate::pd::Pd>> {
        self.pd.as_ref()
    }

    /// Remembers a leg it got (the last [`MAX_LEGS`]).
    pub(crate) fn record_leg(&self, leg: Leg) {
        let mut legs = self.legs.lock().unwrap_or_else(|p| p.into_inner());
        if legs.len() >= MAX_LEGS {
            legs.pop_front();
        }
        legs.push_back(leg);
    }

    /// The disaggregated legs it got (and with `record_requests` every
    /// request), oldest first.
    pub fn legs(&self) -> Vec<Leg> {
        self.legs.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect()
    }

    /// Admits a request whose KV came from a prefill worker: no prefill. SGLang's decode
    /// keeps no radix cache (`keep` false: no cache lookup or insert); vLLM's caches the
    /// blocks it received as its own (`keep`: stored and published like a prefill's). Its
    /// answer reports the `cached` prompt tokens the prefill worker had.
    pub fn admit_remote(&self, tokens: &[u32], cached: usize, keep: bool) -> Admission {
        let r = &self.ranks[0];
        r.running.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.prompt_tokens.fetch_add(tokens.len() as u64, Ordering::Relaxed);
        let cached_tokens = cached.min(tokens.len());
        if !keep {
            let generation = r.cache.lock().unwrap_or_else(|p| p.into_inner()).generation();
            return Admission {
                rank: 0,
                chain: Vec::new(),
                pinned: 0,
                generation,
                prompt_tokens: tokens.len(),
                cached_tokens,
            };
        }
        let page = self.config.page_size.max(1);
        let chain = self.hasher.block_hashes(&tokens[..tokens.len() / page * page], None).unwrap_or_default();
        let mut cache = r.cache.lock().unwrap_or_else(|p| p.into_inner());
        let hit = cache.lookup_and_pin(&chain);
        let change = cache.insert_pinned(&chain, hit);
        self.publish(0, &chain, tokens, change.stored_from, change.stored, &change.evicted);
        let (pinned, generation) = (change.stored_from + change.stored, cache.generation());
        Admission { rank: 0, chain, pinned, generation, prompt_tokens: tokens.len(), cached_tokens }
    }

    /// The renderer (tokenizer and chat template).
    pub fn renderer(&self) -> &Renderer {
        &self.renderer
    }

    /// The PUB and replay endpoints of each rank's publisher.
    pub fn publisher_endpoints(&self) -> Vec<(String, Option<String>)> {
        self.publishers.iter().map(|p| (p.endpoint().to_string(), p.replay_endpoint().map(str::to_string))).collect()
    }

    /// Pages cached per rank.
    pub fn cached_pages(&self) -> Vec<usize> {
        self.ranks.iter().map(|r| r.cache.lock().unwrap_or_else(|p| p.into_inner()).len()).collect()
    }

    /// The cached prompt tokens each rank holds of `tokens` (whole pages
    /// only), without touching the cache: what a request sent now would find.
    /// The truth a router's choice is measured against.
    pub fn cached_prefix_tokens(&self, tokens: &[u32]) -> Vec<usize> {
        let ps = self.config.page_size.max(1);
        let full = tokens.len() / ps * ps;
        let chain = self.hasher.block_hashes(&tokens[..full], None).unwrap_or_default();
        self.ranks.iter().map(|r| r.cache.lock().unwrap_or_else(|p| p.into_inner()).peek(&chain) * ps).collect()
    }

    /// Per rank, the blocks its published events tell a subscriber the cache
    /// holds: equal to the pages of [`Engine::cached_tree`] once the queue is empty, or
    /// the engine's events are wrong.
    pub fn told_blocks(&self) -> Vec<std::collections::HashSet<u64>> {
        self.ranks.iter().map(|r| r.events.as_ref().map(EventQueue::told).unwrap_or_default()).collect()
    }

    /// Event batches (and publisher restarts) queued and not yet published, all ranks.
    pub fn queued_events(&self) -> usize {
        self.ranks.iter().filter_map(|r| r.events.as_ref()).map(EventQueue::pending).sum()
    }

    /// Per rank, each page held (what a router's index of it must equal) and the page it continues.
    pub fn cached_tree(&self) -> Vec<std::collections::HashMap<BlockHash, Option<BlockHash>>> {
        self.ranks
            .iter()
            .map(|r| {
                let cache = r.cache.lock().unwrap_or_else(|p| p.into_inner());
                cache.hashes().map(|h| (h, cache.parent(h))).collect()
            })
            .collect()
    }

    /// Each rank's publisher (seqs, pending drops, corruption and END_SEQ knobs).
    pub fn publishers(&self) -> &[std::sync::Arc<Publisher>] {
        &self.publishers
    }

    /// Crashes every rank's publisher as a dying engine does: cache gone, the
    /// PUB socket closed (after `END_SEQ` when `graceful`), and back `down`
    /// later on the same port from seq 0. Batches of requests served
    /// meanwhile are published once it is back. Resolves when it is.
    pub async fn crash_publishers(&self, down: Duration, graceful: bool) {
        let mut done = Vec::new();
        for rank in &self.ranks {
            let mut cache = rank.cache.lock().unwrap_or_else(|p| p.into_inner());
            cache.clear();
            done.extend(rank.events.as_ref().map(|q| q.crash(down, graceful)));
        }
        for d in done {
            let _ = d.await;
        }
    }

    /// Applies fault knobs (counts add up; `restart_publisher` acts at once).
    pub async fn set_faults(&self, f: Faults) {
        if f.restart_publisher {
            let mut done = Vec::new();
            for rank in &self.ranks {
                let mut cache = rank.cache.lock().unwrap_or_else(|p| p.into_inner());
                cache.clear();
                done.extend(rank.events.as_ref().map(EventQueue::restart));
            }
            for d in done {
                let _ = d.await;
            }
        }
        if f.drop_next_batches > 0 {
            for p in &self.publishers {
                p.drop_next(f.drop_next_batches);
            }
        }
        let mut faults = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        faults.event_delay_ms = f.event_delay_ms;
        faults.fail_next = faults.fail_next.saturating_add(f.fail_next);
        if f.fail_status != 0 {
            faults.fail_status = f.fail_status;
        }
        faults.hang_next += f.hang_next;
        faults.hold_next += f.hold_next;
        faults.die_mid_stream_next += f.die_mid_stream_next;
        faults.wedge_mid_stream_next += f.wedge_mid_stream_next;
        faults.report_waiting_extra = f.report_waiting_extra;
        faults.report_token_usage = f.report_token_usage;
        faults.report_gen_throughput = f.report_gen_throughput;
        faults.drop_kv_params_next += f.drop_kv_params_next;
        faults.bloat_kv_params_bytes = f.bloat_kv_params_bytes;
    }

    /// Waits, counted in `held`, until [`Engine::release_held`] lets one request go.
    pub async fn hold(&self) {
        self.held.fetch_add(1, Ordering::SeqCst);
        if let Ok(permit) = self.release.acquire().await {
            permit.forget();
        }
        self.held.fetch_sub(1, Ordering::SeqCst);
    }

    /// Lets `n` held requests (or the next `n` to be held) go on.
    pub fn release_held(&self, n: usize) {
        self.release.add_permits(n);
    }

    /// The fault this request suffers before anything is sent, if any (consumes one).
    pub fn take_fault(&self, _streaming: bool) -> Option<RequestFault> {
        let mut f = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        if f.fail_next > 0 {
            f.fail_next -= 1;
            return Some(RequestFault::Fail(if f.fail_status == 0 { 500 } else { f.fail_status }));
        }
        if f.hang_next > 0 {
            f.hang_next -= 1;
            return Some(RequestFault::Hang);
        }
        if f.hold_next > 0 {
            f.hold_next -= 1;
            return Some(RequestFault::Hold);
        }
        None
    }

    /// Takes one of the faults `pick` counts down, if any is left.
    fn take_one(&self, pick: impl FnOnce(&mut Faults) -> &mut usize) -> bool {
        let mut f = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        let left = pick(&mut f);
        let some = *left > 0;
        *left = left.saturating_sub(1);
        some
    }

    /// True if this vLLM prefill answer must leave out its params (consumes one).
    pub fn take_drop_kv_params(&self) -> bool {
        self.take_one(|f| &mut f.drop_kv_params_next)
    }

    /// Bytes of padding for this vLLM prefill answer's params (consumes the fault).
    pub fn take_bloat_kv_params(&self) -> usize {
        std::mem::take(&mut self.faults.lock().unwrap_or_else(|p| p.into_inner()).bloat_kv_params_bytes)
    }

    /// True if this streamed request must die after its first chunk (consumes one).
    pub fn take_fault_mid_stream_pending(&self) -> bool {
        self.take_one(|f| &mut f.die_mid_stream_next)
    }

    /// True if this streamed request must stop after its first chunk until released (consumes one).
    pub fn take_wedge_mid_stream(&self) -> bool {
        self.take_one(|f| &mut f.wedge_mid_stream_next)
    }

    fn scaled(&self, d: Duration) -> Duration {
        if self.config.fast { Duration::ZERO } else { d.div_f64(self.config.speedup.max(1e-9)) }
    }

    /// Admits a request: picks the rank, looks the prompt up, waits its turn
    /// in the prefill lane for the uncached tokens, stores its pages and
    /// publishes the events.
    pub async fn admit(&self, tokens: &[u32], rank_hint: Option<usize>) -> Admission {
        let rank = match rank_hint {
            Some(r) if r < self.ranks.len() => r,
            _ => self.next_rank.fetch_add(1, Ordering::Relaxed) % self.ranks.len(),
        };
        let full = tokens.len() / self.config.page_size.max(1) * self.config.page_size.max(1);
        let chain = self.hasher.block_hashes(&tokens[..full], None).unwrap_or_default();
        let r = &self.ranks[rank];
        let (hit, looked_up) = {
            let mut cache = r.cache.lock().unwrap_or_else(|p| p.into_inner());
            (cache.lookup_and_pin(&chain), cache.generation())
        };
        let cached_tokens = hit * self.config.page_size;
        let uncached = tokens.len() - cached_tokens;
        // Counted as running from the lane on; `release` ends it, or the guard if dropped mid-prefill.
        let running;
        {
            let queued = Queued::start(r, uncached as u64);
            let _lane = r.lane.lock().await;
            drop(queued);
            running = Running::start(r);
            let prefill = self.config.prefill_fixed
                + Duration::from_secs_f64(uncached as f64 / self.config.prefill_tokens_per_s.max(1.0));
            let prefill = self.scaled(prefill);
            if !prefill.is_zero() {
                tokio::time::sleep(prefill).await;
            }
        }
        let (change, generation) = {
            let mut cache = r.cache.lock().unwrap_or_else(|p| p.into_inner());
            // A restart during the prefill took the pins: look the prompt up
            // again, so the pins and the stored pages are this request's own.
            let from = if cache.generation() == looked_up { hit } else { cache.lookup_and_pin(&chain) };
            let change = cache.insert_pinned(&chain, from);
            // Queued under the lock: batches leave in the order the cache changed.
            self.publish(rank, &chain, tokens, change.stored_from, change.stored, &change.evicted);
            (change, cache.generation())
        };
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.prompt_tokens.fetch_add(tokens.len() as u64, Ordering::Relaxed);
        self.cached_tokens.fetch_add(cached_tokens as u64, Ordering::Relaxed);
        std::mem::forget(running);
        Admission {
            rank,
            chain,
            pinned: change.stored_from + change.stored,
            generation,
            prompt_tokens: tokens.len(),
            cached_tokens,
        }
    }

    fn publish(
        &self,
        rank: usize,
        chain: &[BlockHash],
        tokens: &[u32],
        from: usize,
        stored: usize,
        evicted: &[BlockHash],
    ) {
        let queue = self.ranks[rank].events.as_ref();
        if queue.is_none() && self.grpc_events.is_none() {
            return;
        }
        let ps = self.config.page_size;
        let mut events = Vec::new();
        if !evicted.is_empty() {
            events.push(KvEvent::Removed {
                block_hashes: evicted.iter().map(|h| EngineBlockHash::I64(h.0)).collect(),
                tier: Tier::Device,
                group_idx: None,
            });
        }
        if stored > 0 {
            events.push(KvEvent::Stored(StoredBlocks::plain(
                chain[from..from + stored].iter().map(|h| EngineBlockHash::I64(h.0)).collect(),
                from.checked_sub(1).map(|p| EngineBlockHash::I64(chain[p].0)),
                tokens[from * ps..(from + stored) * ps].iter().map(|t| u64::from(*t)).collect(),
                ps as u32,
            )));
        }
        if events.is_empty() {
            return;
        }
        let ts = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        let delay = Duration::from_millis(self.faults.lock().unwrap_or_else(|p| p.into_inner()).event_delay_ms);
        let batch = EventBatch { ts, events, dp_rank: Some(router_types::DpRank(rank as u32)) };
        if let Some(g) = &self.grpc_events {
            g.record(rank, &batch);
        }
        if let Some(queue) = queue {
            queue.batch(delay, batch);
        }
    }

    /// Empties every rank's cache and publishes `AllBlocksCleared`, as
    /// SGLang's `/flush_cache` does; the number of pages dropped.
    pub async fn flush_cache(&self) -> usize {
        let mut dropped = 0;
        for (rank, r) in self.ranks.iter().enumerate() {
            let mut cache = r.cache.lock().unwrap_or_else(|p| p.into_inner());
            dropped += cache.len();
            cache.clear();
            let ts =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
            let batch =
                EventBatch { ts, events: vec![KvEvent::AllCleared], dp_rank: Some(router_types::DpRank(rank as u32)) };
            if let Some(g) = &self.grpc_events {
                g.record(rank, &batch);
            }
            let Some(queue) = &r.events else { continue };
            queue.batch(Duration::ZERO, batch);
        }
        self.flushes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        dropped
    }

    /// Waits the time of one generated token.
    pub async fn decode_step(&self) {
        let d = self.scaled(self.config.decode_per_token);
        if !d.is_zero() {
            tokio::time::sleep(d).await;
        }
    }

    /// Unpins the request's pages.
    pub fn release(&self, a: &Admission) {
        let r = &self.ranks[a.rank];
        let mut cache = r.cache.lock().unwrap_or_else(|p| p.into_inner());
        // After a restart the pins are gone; the pages may be another request's now.
        if cache.generation() == a.generation {
            cache.unpin(&a.chain, a.pinned);
        }
        drop(cache);
        r.running.fetch_sub(1, Ordering::Relaxed);
    }

    /// Each rank's load now (SGLang's `/v1/loads` core fields).
    pub fn loads(&self) -> Vec<RankLoad> {
        let (extra, usage, throughput) = {
            let f = self.faults.lock().unwrap_or_else(|p| p.into_inner());
            (f.report_waiting_extra, f.report_token_usage, f.report_gen_throughput)
        };
        self.ranks
            .iter()
            .enumerate()
            .map(|(dp_rank, r)| {
                let cache = r.cache.lock().unwrap_or_else(|p| p.into_inner());
                // As SGLang reports it: the pages running requests hold, the evictable cache apart.
                let token_usage = usage.unwrap_or(cache.pinned() as f64 / cache.capacity().max(1) as f64);
                drop(cache);
                RankLoad {
                    dp_rank,
                    num_running_reqs: r.running.load(Ordering::Relaxed),
                    num_waiting_reqs: r.waiting.load(Ordering::Relaxed) + extra,
                    num_waiting_uncached_tokens: r.waiting_uncached.load(Ordering::Relaxed),
                    token_usage,
                    gen_throughput: throughput,
                }
            })
            .collect()
    }
}
