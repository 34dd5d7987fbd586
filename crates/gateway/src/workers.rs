//! The worker registry: URLs, health, what each worker told us about itself
//! (model, dp size, page size), router-side load, and the guard that releases
//! a request's load exactly once however the request ends.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use kv_index::{KvIndex, WorkerId};
use policy::Load;
use router_types::WorkerUrl;
use tracing::{info, warn};

use crate::proxy::Route;

/// One engine replica as the router sees it.
#[derive(Debug)]
pub struct Worker {
    /// Its base URL.
    pub url: WorkerUrl,
    /// Its id in the KV index, when there is one.
    pub index_id: Option<WorkerId>,
    healthy: AtomicBool,
    in_flight: AtomicU32,
    uncached_tokens: AtomicU64,
    /// Prefill the worker itself reports queued (all routers' requests); 0 when unknown.
    reported_uncached: AtomicU64,
    /// The worker answered that it has no load endpoint: stop asking.
    loads_unsupported: AtomicBool,
    info: RwLock<Option<WorkerInfo>>,
    /// The proxied routes' URLs, parsed once.
    endpoints: Vec<(&'static str, axum::http::Uri)>,
    down_since: Mutex<Option<Instant>>,
    index_cleared: AtomicBool,
}

/// What a worker reports about itself (SGLang's `/server_info`, or vLLM's
/// `/v1/models`); a field it does not report is `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerInfo {
    /// The model it serves (`served_model_name`, `model_path`, or the first `/v1/models` id).
    pub model_id: Option<String>,
    /// Its data-parallel size.
    pub dp_size: Option<u32>,
    /// Its KV page (block) size in tokens.
    pub page_size: Option<u32>,
}

/// All workers.
#[derive(Debug, Default)]
pub struct Workers {
    list: RwLock<Vec<Arc<Worker>>>,
}

/// Holds one request's load on a worker; dropping it releases the load. The
/// uncached tokens (prefill owed) go earlier, when the first byte of the
/// answer shows the prefill is done.
#[derive(Debug)]
pub struct LoadGuard {
    worker: Arc<Worker>,
    uncached: u64,
}

/// Checks and normalizes a worker base URL (see [`WorkerUrl::parse`]).
pub fn check_worker_url(url: &str) -> Result<WorkerUrl, String> {
    WorkerUrl::parse(url).map_err(|e| e.to_string())
}

// === impl Worker ===

impl Worker {
    /// A healthy worker with no load.
    pub fn new(url: WorkerUrl, index: Option<&KvIndex>) -> Self {
        let index_id = index.map(|i| i.worker_id(&url));
        let endpoints =
            Route::ALL.iter().filter_map(|r| Some((r.path(), format!("{url}{}", r.path()).parse().ok()?))).collect();
        Self {
            url,
            index_id,
            endpoints,
            healthy: AtomicBool::new(true),
            in_flight: AtomicU32::new(0),
            uncached_tokens: AtomicU64::new(0),
            reported_uncached: AtomicU64::new(0),
            loads_unsupported: AtomicBool::new(false),
            info: RwLock::new(None),
            down_since: Mutex::new(None),
            index_cleared: AtomicBool::new(false),
        }
    }

    /// The URL of a proxied route's `path` on this worker (parsed once); `None` if the
    /// worker's URL does not parse.
    pub fn endpoint(&self, path: &str) -> Option<axum::http::Uri> {
        self.endpoints.iter().find(|(p, _)| *p == path).map(|(_, u)| u.clone())
    }

    /// What it reported about itself, once introspected.
    pub fn info(&self) -> Option<WorkerInfo> {
        self.info.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Records what it reported about itself.
    pub fn set_info(&self, info: WorkerInfo) {
        *self.info.write().unwrap_or_else(|p| p.into_inner()) = Some(info);
    }

    /// How long it has been out of rotation (`None` while healthy).
    pub fn down_for(&self) -> Option<Duration> {
        self.down_since.lock().unwrap_or_else(|p| p.into_inner()).map(|t| t.elapsed())
    }

    /// Marks its index state as dropped; true the first time since it went down.
    pub(crate) fn mark_index_cleared(&self) -> bool {
        !self.index_cleared.swap(true, Ordering::Relaxed)
    }

    /// Whether it is in rotation.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Takes it out of (or back into) rotation.
    pub fn set_healthy(&self, up: bool) {
        let was = self.healthy.swap(up, Ordering::Relaxed);
        if was != up {
            let mut since = self.down_since.lock().unwrap_or_else(|p| p.into_inner());
            *since = if up { None } else { Some(Instant::now()) };
            if up {
                self.index_cleared.store(false, Ordering::Relaxed);
                info!(worker = %self.url, "worker back in rotation");
            } else {
                warn!(worker = %self.url, "worker out of rotation");
            }
        }
    }

    /// Its current load: this router's requests in flight, and the prefill it
    /// owes: this router's uncached tokens not yet answered, or what the worker
    /// reports queued (every router's requests), whichever is larger.
    pub fn load(&self) -> Load {
        let own = self.uncached_tokens.load(Ordering::Relaxed);
        Load {
            in_flight: self.in_flight.load(Ordering::Relaxed),
            uncached_tokens: own.max(self.reported_uncached.load(Ordering::Relaxed)),
        }
    }

    /// This router's own view of the prefill it owes.
    pub fn own_uncached_tokens(&self) -> u64 {
        self.uncached_tokens.load(Ordering::Relaxed)
    }

    /// What the worker last reported queued (0 when unknown).
    pub fn reported_uncached_tokens(&self) -> u64 {
        self.reported_uncached.load(Ordering::Relaxed)
    }

    /// Records the worker's own report of its queued prefill (0: unknown).
    pub fn set_reported_uncached_tokens(&self, tokens: u64) {
        self.reported_uncached.store(tokens, Ordering::Relaxed);
    }

    /// Whether the worker has a load endpoint worth polling.
    pub fn reports_load(&self) -> bool {
        !self.loads_unsupported.load(Ordering::Relaxed)
    }

    /// The worker has no load endpoint.
    pub fn set_no_load_reports(&self) {
        self.loads_unsupported.store(true, Ordering::Relaxed);
        self.reported_uncached.store(0, Ordering::Relaxed);
    }

    /// Charges a request to this router's view of its load until the guard drops.
    pub fn charge(self: &Arc<Self>, uncached: u64) -> LoadGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.uncached_tokens.fetch_add(uncached, Ordering::Relaxed);
        LoadGuard { worker: self.clone(), uncached }
    }
}

impl LoadGuard {
    /// The worker has prefilled the prompt: it no longer owes those tokens.
    pub fn prefill_done(&mut self) {
        self.worker.uncached_tokens.fetch_sub(self.uncached, Ordering::Relaxed);
        self.uncached = 0;
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.worker.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.worker.uncached_tokens.fetch_sub(self.uncached, Ordering::Relaxed);
    }
}

// === impl Workers ===

impl Workers {
    /// The registry of `urls`.
    pub fn new(urls: &[WorkerUrl], index: Option<&KvIndex>) -> Self {
        Self { list: RwLock::new(urls.iter().map(|u| Arc::new(Worker::new(u.clone(), index))).collect()) }
    }

    /// Every worker, healthy or not, in a stable order.
    pub fn all(&self) -> Vec<Arc<Worker>> {
        self.list.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Adds a worker; false if it is known already.
    pub fn add(&self, url: WorkerUrl, index: Option<&KvIndex>) -> bool {
        let mut list = self.list.write().unwrap_or_else(|p| p.into_inner());
        if list.iter().any(|w| w.url == url) {
            return false;
        }
        list.push(Arc::new(Worker::new(url, index)));
        true
    }

    /// Removes a worker; false if unknown.
    pub fn remove(&self, url: &WorkerUrl) -> bool {
        let mut list = self.list.write().unwrap_or_else(|p| p.into_inner());
        let before = list.len();
        list.retain(|w| &w.url != url);
        list.len() != before
    }
}
