//! The fleet: the one owner of every worker. A worker enters from a source
//! (the command line, the admin API, the simulated engines), gets a stable
//! [`WorkerId`], and moves through one state machine
//! (discovering → following → healthy ⇄ down → retained → removed, see
//! [`State`]). The fleet finds its KV-event publishers in the background
//! (with backoff: a worker that comes up late is followed when it does),
//! runs its subscribers under one tracker per worker and cancels them when
//! it leaves, probes its health and load, and publishes what others need: a
//! snapshot of the workers for the gateway, and [`Notice`]s of departures
//! for the policies. The index learns of departures from the fleet directly.
//!
//! ```text
//! sources ─add/remove─► Fleet ─► Worker (state, load, info, events)
//!                         │ follow: discover ─► pump.add_stream ─► subscriber tasks (per-worker tracker)
//!                         │ health / load probes ─► state
//!                         └► snapshot() for the gateway, subscribe() for notices
//! ```

mod breaker;
mod follow;
mod follow_grpc;
pub mod grpc;
mod health;
pub mod k8s;
pub mod liveness;
mod metrics;
mod pd_facts;
mod ranks;
mod since_poll;
mod ticks;
mod tls;
pub mod warmup;
mod worker;

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use kv_events::{EventMetrics, ExplicitEndpoints, SubscriberConfig};
use kv_index::KvIndex;
use kv_ingest::{PumpControl, PumpMetrics};
use router_types::{PoolId, Role, WorkerId, WorkerUrl};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

pub use breaker::{BreakerConfig, BreakerState};
pub use health::{MAX_ANSWER_BYTES, introspect, read_capped};
pub use kv_events::StreamHistory;
pub use kv_ingest::snapshot::{DEFAULT_SNAPSHOT_MAX_BLOCKS, DEFAULT_SNAPSHOT_MAX_BYTES};
pub use kv_ingest::{IndexSnapshot, SnapshotLimits, TakenSnapshot};
pub use pd_facts::PdFacts;
pub use ranks::RankHeader;
pub use since_poll::{Sent, SincePoll};
pub use tls::{TlsError, WorkerTls, certificates, private_key};
pub use worker::{Events, LoadGuard, MAX_QUARANTINE, State, Worker, WorkerInfo, from_server_info};

/// The largest data-parallel size accepted from a worker's own report: a
/// worker cannot make the router start more subscribers than this.
pub const MAX_DP_SIZE: u32 = 256;
/// Capacity of the channel from all subscribers to the pump (the reference router's).
pub const PUMP_CHANNEL_CAPACITY: usize = 1024;
/// How long a worker's `/server_info` may stay unreachable while its `/health`
/// answers before it is routed to without following its events (discovery
/// goes on in the background).
pub const DEFAULT_DISCOVERY_DEADLINE: Duration = Duration::from_secs(30);
/// How long a removal waits for the worker's tasks to stop.
const TASKS_STOP_WAIT: Duration = Duration::from_secs(2);
/// How long a peer's snapshot of a stream waits for its worker to be followed.
pub const SEED_TTL: Duration = Duration::from_secs(300);
/// Notices buffered per subscriber; one that falls further behind resyncs from the snapshot.
const NOTICE_CAPACITY: usize = 256;

/// How the fleet runs (defaults: the router's `defaults.rs`).
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// The health probes.
    pub health: HealthConfig,
    /// Every worker's circuit breaker.
    pub breaker: BreakerConfig,
    /// How long a worker may stay down before its index state is dropped.
    pub index_retention: Duration,
    /// Period of polling the workers' own load reports (zero: off).
    pub load_poll: Duration,
    /// Bearer token for the router's own requests to workers.
    pub api_key: Option<String>,
    /// Follow the workers' KV events (with an index), or not.
    pub events: Option<EventsConfig>,
    /// The paths requests are proxied to, parsed once per worker ([`Worker::endpoint`]).
    pub proxied_paths: &'static [&'static str],
    /// Track each data-parallel rank's load, and send requests no rank holds
    /// a prefix of to the least loaded rank (`--dp-aware`).
    pub dp_aware: bool,
    /// Which workers are told the rank a request is for (`--dp-rank-header`).
    pub rank_header: RankHeader,
    /// TLS towards `https://` workers.
    pub tls: WorkerTls,
    /// The liveness vetoes and overload protection.
    pub liveness: liveness::LivenessConfig,
}

impl FleetConfig {
    /// A fleet that takes each worker in rotation as it comes, without probes, load polls or
    /// KV events (the crates' own tests, which send through no socket).
    pub fn unprobed(proxied_paths: &'static [&'static str]) -> Self {
        FleetConfig {
            health: HealthConfig { enabled: false, ..Default::default() },
            breaker: BreakerConfig::default(),
            index_retention: Duration::from_secs(300),
            load_poll: Duration::ZERO,
            api_key: None,
            events: None,
            proxied_paths,
            dp_aware: false,
            rank_header: RankHeader::Auto,
            tls: WorkerTls::default(),
            liveness: liveness::LivenessConfig::off(),
        }
    }
}

/// The health probes (SGLang Model Gateway's `--health-*` flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthConfig {
    /// Off: no probes, every worker is in rotation once discovered
    /// (`--disable-health-check`); failed requests still take it out.
    pub enabled: bool,
    /// Interval between two probes of every worker (a worker out of rotation
    /// is probed every second, at most every interval).
    pub interval: Duration,
    /// Longest a probe may take (a slower answer is a failure).
    pub timeout: Duration,
    /// The path probed (`/health`).
    pub endpoint: String,
    /// Failed probes in a row that take a worker out of rotation.
    pub failure_threshold: u32,
    /// Good probes in a row that bring it back (its first probe decides at once).
    pub success_threshold: u32,
    /// A worker that was in rotation and fails `failure_threshold` probes in a row is removed
    /// from the fleet, not kept and probed until it comes back (SGLang Model Gateway's
    /// `--remove-unhealthy-workers`: discovery re-adds it when its engine returns).
    pub remove_unhealthy: bool,
    /// How a worker that has never been healthy is probed (SMG's `--worker-startup-*`).
    pub startup: StartupConfig,
    /// The probes, introspection and load polls speak HTTP/2 to a worker that answers it
    /// (`--upstream-http2`: by prior knowledge, then HTTP/1.1 if it does not), as its requests do.
    pub http2: bool,
}

/// A new worker's probes until it is first healthy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartupConfig {
    /// Wait this long before its first probe (`--worker-startup-delay`).
    pub delay: Duration,
    /// Probe it this often (at most every second) until it is healthy (`--worker-startup-check-interval`).
    pub check_interval: Duration,
    /// Not healthy this long after it joined, it is removed from the fleet: its registration
    /// failed (`--worker-startup-timeout-secs`).
    pub timeout: Duration,
}

impl Default for StartupConfig {
    /// The router's defaults: probed every second (SMG: every 30 s), given up after 30 minutes (SMG's).
    fn default() -> Self {
        Self { delay: Duration::ZERO, check_interval: Duration::from_secs(1), timeout: Duration::from_secs(1800) }
    }
}

impl Default for HealthConfig {
    /// The router's defaults (`defaults.rs` says why they differ from SGLang Model Gateway's).
    fn default() -> Self {
        Self {
            enabled: true,
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            endpoint: "/health".into(),
            failure_threshold: 3,
            success_threshold: 2,
            remove_unhealthy: false,
            startup: StartupConfig::default(),
            http2: false,
        }
    }
}

/// Where the workers' KV events come from.
#[derive(Debug, Clone)]
pub struct EventsConfig {
    /// Endpoints given on the command line (vLLM); they win over discovery.
    pub explicit: ExplicitEndpoints,
    /// Page size of workers that advertise none.
    pub default_block_size: NonZeroUsize,
    /// Topic to subscribe to on explicitly configured endpoints.
    pub topic: String,
    /// How long `/server_info` may stay unreachable before the worker is routed to unfollowed.
    pub discovery_deadline: Duration,
    /// How long a healthy, followed worker's stream may stay without a connection before its
    /// publishers are looked up again (`--kv-events-rediscover-secs`), and the least time between
    /// two such looks.
    pub rediscover_after: Duration,
    /// Subscriber tuning.
    pub subscriber: SubscriberConfig,
}

/// Where a worker came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `--worker-urls`.
    Flag,
    /// `POST /workers`.
    Admin,
    /// `--mock-workers`.
    Mock,
    /// Kubernetes discovery (`--service-discovery`).
    Kubernetes,
}

/// A change others must hear of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// A worker joined.
    Added(WorkerId),
    /// A worker left for good: forget what was learned of it.
    Removed(WorkerId),
}

/// The hash modes of the followed workers: unigram, bigram (EAGLE-style
/// speculative decoding), or both in a mixed fleet. With none known,
/// requests are hashed unigram.
#[derive(Debug, Default)]
pub struct HashModes(AtomicU8);

/// Fleet-level counters.
#[derive(Debug, Default)]
pub struct FleetMetrics {
    /// Workers whose events are not followed because their page size differs from their pool's.
    pub refused_block_size: AtomicU64,
    /// Discovery attempts that failed (unreachable or invalid `/server_info`).
    pub discovery_failures: AtomicU64,
    /// Followed workers whose publishers moved and were followed anew.
    pub rediscoveries: AtomicU64,
    /// Workers removed.
    pub removed: AtomicU64,
    /// Kubernetes discovery's counters.
    pub discovery: k8s::DiscoveryMetrics,
    /// Index snapshots served to peers.
    pub snapshots_served: AtomicU64,
    /// Index snapshots asked for and not served (no events, the pump did not answer in time).
    pub snapshots_refused: AtomicU64,
}

/// The KV-event side the fleet feeds.
#[derive(Debug)]
struct EventsSide {
    config: EventsConfig,
    index: Arc<KvIndex>,
    /// Subscribers' channel to the pump.
    tx: mpsc::Sender<kv_events::StreamMessage>,
    control: mpsc::Sender<PumpControl>,
    events: Arc<EventMetrics>,
    pump: Arc<PumpMetrics>,
    /// Each pool's page size, fixed by the first of its workers followed (a
    /// pool's requests are hashed with it; another pool may have another).
    block_sizes: RwLock<std::collections::HashMap<PoolId, usize>>,
    hash_modes: Arc<HashModes>,
    /// A peer's snapshot, per stream, waiting for its worker to be followed
    /// (taken once; dropped after [`SEED_TTL`]).
    seeds: std::sync::Mutex<std::collections::HashMap<router_types::WorkerKey, kv_ingest::StreamSnapshot>>,
}

#[derive(Debug, Default)]
struct Members {
    /// Live workers (not retained), in order of arrival.
    live: Vec<Arc<Worker>>,
    /// Workers leaving: in-flight requests finishing.
    retained: Vec<Arc<Worker>>,
}

/// The fleet.
#[derive(Debug)]
pub struct Fleet {
    config: FleetConfig,
    members: RwLock<Members>,
    /// The live workers, rebuilt on every change (readers clone one `Arc`).
    snapshot: RwLock<Arc<[Arc<Worker>]>>,
    next_id: AtomicU32,
    notices: broadcast::Sender<Notice>,
    events: Option<EventsSide>,
    client: reqwest::Client,
    /// The same over HTTP/2 by prior knowledge (`HealthConfig::http2`).
    h2_client: Option<reqwest::Client>,
    /// Notified after each round of load polls.
    load_polled: tokio::sync::Notify,
    cancel: CancellationToken,
    tasks: TaskTracker,
    /// Counters.
    pub metrics: FleetMetrics,
}

/// What [`Fleet::add`] did.
#[derive(Debug, Clone)]
pub struct Added {
    /// The worker (the one already there when `new` is false).
    pub worker: Arc<Worker>,
    /// False: it was known already (however it was spelled).
    pub new: bool,
}

// === impl HashModes ===

impl HashModes {
    const UNIGRAM: u8 = 1;
    const BIGRAM: u8 = 2;

    /// Records that a followed worker keys blocks in `mode`.
    pub fn add(&self, mode: renderer::HashMode) {
        let bit = match mode {
            renderer::HashMode::Unigram => Self::UNIGRAM,
            renderer::HashMode::Bigram => Self::BIGRAM,
        };
        self.0.fetch_or(bit, Ordering::Relaxed);
    }

    /// The modes requests must be hashed in, unigram first.
    pub fn modes(&self) -> impl Iterator<Item = renderer::HashMode> {
        let bits = self.0.load(Ordering::Relaxed);
        let bits = if bits == 0 { Self::UNIGRAM } else { bits };
        [(Self::UNIGRAM, renderer::HashMode::Unigram), (Self::BIGRAM, renderer::HashMode::Bigram)]
            .into_iter()
            .filter(move |(b, _)| bits & b != 0)
            .map(|(_, m)| m)
    }
}

// === impl Fleet ===

impl Fleet {
    /// Resolves after the next round of load polls (`--worker-load-poll-ms`; never while they are off).
    pub fn load_polled(&self) -> tokio::sync::futures::Notified<'_> {
        self.load_polled.notified()
    }

    /// The client for the router's own requests to `w`: over HTTP/2 when it is known to
    /// answer it and the probes speak it (`HealthConfig::http2`).
    pub(crate) fn client_for(&self, w: &Worker) -> &reqwest::Client {
        match &self.h2_client {
            Some(h2) if w.upstream_http2() == Some(true) => h2,
            _ => &self.client,
        }
    }

    /// Starts the fleet: the pump (when following events into `index`), the
    /// health and load loops, and `workers` from the command line. Returns at
    /// once: discovery runs in the background. Everything stops with `cancel`.
    pub fn start(
        config: FleetConfig,
        index: Option<Arc<KvIndex>>,
        workers: &[WorkerUrl],
        cancel: CancellationToken,
    ) -> Arc<Self> {
        Self::start_seeded(config, index, workers, None, cancel)
    }

    /// Like [`Fleet::start`], with a peer replica's snapshot of the index:
    /// each stream in it starts from the snapshot's holdings and replays
    /// after its seq once its worker is followed.
    pub fn start_seeded(
        config: FleetConfig,
        index: Option<Arc<KvIndex>>,
        workers: &[WorkerUrl],
        seed: Option<kv_ingest::IndexSnapshot>,
        cancel: CancellationToken,
    ) -> Arc<Self> {
        let tasks = TaskTracker::new();
        let events = match (&config.events, index) {
            (Some(ev), Some(index)) => {
                let pump_metrics = Arc::new(PumpMetrics::default());
                let pump = kv_ingest::Pump::new(index.clone(), pump_metrics.clone());
                let (tx, rx) = mpsc::channel(PUMP_CHANNEL_CAPACITY);
                let (control, control_rx) = mpsc::channel(64);
                tasks.spawn(pump.run_with_control(rx, control_rx, cancel.clone()));
                Some(EventsSide {
                    config: ev.clone(),
                    index,
                    tx,
                    control,
                    events: Arc::new(EventMetrics::default()),
                    pump: pump_metrics,
                    block_sizes: RwLock::new(std::collections::HashMap::new()),
                    hash_modes: Arc::new(HashModes::default()),
                    seeds: std::sync::Mutex::new(std::collections::HashMap::new()),
                })
            }
            _ => None,
        };
        let client = worker_client(config.api_key.as_deref(), Some(Duration::from_secs(5)), &config.tls);
        let h2_client = config.health.http2.then(|| {
            // In TLS the worker is asked for HTTP/2 by ALPN, as the relay asks it.
            let mut tls: rustls::ClientConfig = (**config.tls.config()).clone();
            tls.alpn_protocols = vec![b"h2".to_vec()];
            let h2 = worker_client_builder(config.api_key.as_deref(), Some(Duration::from_secs(5)), tls);
            h2.http2_prior_knowledge().build().unwrap_or_default()
        });
        let fleet = Arc::new(Self {
            config,
            members: RwLock::new(Members::default()),
            snapshot: RwLock::new(Arc::from(Vec::new())),
            next_id: AtomicU32::new(0),
            notices: broadcast::channel(NOTICE_CAPACITY).0,
            events,
            client,
            h2_client,
            load_polled: tokio::sync::Notify::new(),
            cancel: cancel.clone(),
            tasks,
            metrics: FleetMetrics::default(),
        });
        if let Some(seed) = seed {
            fleet.seed(seed);
        }
        for url in workers {
            fleet.add(url.clone(), Source::Flag);
        }
        fleet.tasks.spawn(health::health_loop(fleet.clone()));
        if !fleet.config.load_poll.is_zero() {
            fleet.tasks.spawn(health::load_loop(fleet.clone()));
        }
        if let (Some(rule), true) = (fleet.config.liveness.warmup, fleet.events.is_some()) {
            fleet.tasks.spawn(warmup::warmup_loop(fleet.clone(), rule));
        }
        fleet
    }

    /// Runs `task` beside the fleet's own tasks until the fleet stops (it is dropped then).
    pub fn spawn_until_stopped(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let cancel = self.cancel.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                biased;
                () = cancel.cancelled() => {}
                () = task => {}
            }
        });
    }

    /// Installs a peer replica's snapshot of the index: each stream in it
    /// starts from the snapshot's holdings and replays after its seq once its
    /// worker is followed. A stream is seeded when its worker is first
    /// followed, so call this before adding the snapshot's workers (the
    /// router adds them once its catch-up is over); streams no worker claims
    /// within [`SEED_TTL`] are dropped. Without events, does nothing.
    pub fn seed(self: &Arc<Self>, seed: kv_ingest::IndexSnapshot) {
        if let Some(ev) = &self.events {
            let n = seed.streams.len();
            let mut seeds = ev.seeds.lock().unwrap_or_else(|p| p.into_inner());
            seeds.extend(seed.streams.into_iter().map(|s| (s.key.clone(), s)));
            drop(seeds);
            info!(streams = n, "kv index: a peer's snapshot waits for its workers");
            let f = self.clone();
            self.tasks.spawn(async move {
                tokio::select! {
                    _ = f.cancel.cancelled() => {}
                    _ = tokio::time::sleep(SEED_TTL) => {
                        if let Some(ev) = &f.events {
                            let unused = std::mem::take(&mut *ev.seeds.lock().unwrap_or_else(|p| p.into_inner()));
                            if !unused.is_empty() {
                                info!(streams = unused.len(), "kv index: snapshot streams of workers never followed, dropped");
                            }
                        }
                    }
                }
            });
        }
    }

    /// The client of the router's own requests to workers (`--api-key`, TLS,
    /// a 5 s deadline per request); the gateway's calls to every worker use it too.
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// How connections to `https://` workers are secured.
    pub fn tls(&self) -> &WorkerTls {
        &self.config.tls
    }

    /// Whether requests are balanced over each worker's data-parallel ranks (`--dp-aware`).
    pub fn dp_aware(&self) -> bool {
        self.config.dp_aware
    }

    /// The liveness vetoes' thresholds.
    pub fn liveness(&self) -> &liveness::LivenessConfig {
        &self.config.liveness
    }

    /// Leaves the workers vetoed now out of a decision among `workers` ([`liveness::screen`]).
    pub fn screen(&self, workers: Vec<Arc<Worker>>) -> liveness::Screened {
        liveness::screen(&self.config.liveness, workers)
    }

    /// The live workers (every state but retained and removed), in order of arrival.
    pub fn snapshot(&self) -> Arc<[Arc<Worker>]> {
        self.snapshot.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Every worker, the leaving ones too.
    pub fn all(&self) -> Vec<Arc<Worker>> {
        let m = self.members.read().unwrap_or_else(|p| p.into_inner());
        m.live.iter().chain(&m.retained).cloned().collect()
    }

    /// Notices of workers joining and leaving.
    pub fn subscribe(&self) -> broadcast::Receiver<Notice> {
        self.notices.subscribe()
    }

    /// Adds a regular worker (in the default pool), or returns the one already there.
    /// Its discovery starts in the background.
    pub fn add(self: &Arc<Self>, url: WorkerUrl, source: Source) -> Added {
        self.add_as(url, Role::Regular, source)
    }

    /// Adds a worker in `role` (in the default pool), or returns the one
    /// already there (whatever its role). Its discovery starts in the
    /// background; it enters rotation once its report agrees with its role.
    pub fn add_as(self: &Arc<Self>, url: WorkerUrl, role: Role, source: Source) -> Added {
        self.add_in(url, role, PoolId::default_pool(), source)
    }

    /// Adds a worker in `role` serving `pool`, or returns the one already
    /// there (whatever its role and pool: a URL is one worker).
    pub fn add_in(self: &Arc<Self>, url: WorkerUrl, role: Role, pool: PoolId, source: Source) -> Added {
        let worker = {
            let mut m = self.members.write().unwrap_or_else(|p| p.into_inner());
            if let Some(w) = m.live.iter().find(|w| w.url == url) {
                return Added { worker: w.clone(), new: false };
            }
            let id = WorkerId(self.next_id.fetch_add(1, Ordering::Relaxed));
            let index_id = self.events.as_ref().map(|e| e.index.worker_id(&url));
            let events = if self.events.is_some() { Events::Discovering } else { Events::Off };
            let spec = worker::Spec { id, url, role, pool, index_id, events };
            let w = Arc::new(Worker::new(spec, self.cancel.child_token(), &self.config));
            m.live.push(w.clone());
            self.publish(&m);
            w
        };
        info!(worker = %worker.url, id = %worker.id, role = worker.role.as_str(), pool = %worker.pool, ?source, "worker added");
        let _ = self.notices.send(Notice::Added(worker.id));
        let (fleet, w) = (self.clone(), worker.clone());
        worker.tasks.spawn(health::first_probe(fleet, w));
        match &self.events {
            Some(_) => {
                let (fleet, w) = (self.clone(), worker.clone());
                worker.tasks.spawn(async move { follow::follow(fleet, w).await });
            }
            None => worker.discovered(),
        }
        Added { worker, new: true }
    }

    /// Removes the worker at `url`: out of rotation at once, its subscribers
    /// cancelled, its streams and index state dropped, policies told; it
    /// stays listed (retained) until its in-flight requests finish.
    pub async fn remove(&self, url: &WorkerUrl) -> Option<Arc<Worker>> {
        let worker = {
            let mut m = self.members.write().unwrap_or_else(|p| p.into_inner());
            let i = m.live.iter().position(|w| &w.url == url)?;
            let w = m.live.remove(i);
            w.retain();
            m.retained.push(w.clone());
            self.publish(&m);
            w
        };
        worker.cancel.cancel();
        worker.tasks.close();
        // Its subscribers see the cancellation at their next await; wait for them (bounded), so
        // nothing of theirs (a last gauge update, a batch) lands after the removal.
        if tokio::time::timeout(TASKS_STOP_WAIT, worker.tasks.wait()).await.is_err() {
            warn!(worker = %worker.url, "worker removed, some of its tasks still stopping");
        }
        if let Some(ev) = &self.events {
            let keys = std::mem::take(&mut *worker.streams.lock().unwrap_or_else(|p| p.into_inner()));
            for key in keys {
                let _ = ev.control.send(PumpControl::RemoveStream(key.clone())).await;
                ev.events.forget(&key);
            }
            ev.index.remove_worker(&worker.url);
        }
        self.metrics.removed.fetch_add(1, Ordering::Relaxed);
        let _ = self.notices.send(Notice::Removed(worker.id));
        info!(worker = %worker.url, id = %worker.id, "worker removed: finishing its requests");
        self.sweep_retained();
        Some(worker)
    }

    /// Waits (up to `timeout`) until a worker's discovery is over, and tells how it ended.
    pub async fn wait_discovered(&self, worker: &Worker, timeout: Duration) -> Events {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let events = worker.events();
            if events != Events::Discovering || tokio::time::Instant::now() >= deadline {
                return events;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The page size the default pool's requests are hashed with (see [`Fleet::block_size_of`]).
    pub fn block_size(&self) -> usize {
        self.block_size_of(&PoolId::default_pool())
    }

    /// The page size `pool`'s requests are hashed with: its followed workers'
    /// (the configured default until one is followed).
    pub fn block_size_of(&self, pool: &PoolId) -> usize {
        match &self.events {
            Some(ev) => {
                let sizes = ev.block_sizes.read().unwrap_or_else(|p| p.into_inner());
                sizes.get(pool).copied().unwrap_or(ev.config.default_block_size.get())
            }
            None => 16,
        }
    }

    /// How the followed workers key blocks.
    pub fn hash_modes(&self) -> Arc<HashModes> {
        self.events.as_ref().map_or_else(Arc::default, |e| e.hash_modes.clone())
    }

    /// Subscriber counters, when following events.
    pub fn event_metrics(&self) -> Option<&Arc<EventMetrics>> {
        self.events.as_ref().map(|e| &e.events)
    }

    /// How many of `worker`'s event streams are connected now (`None` without events):
    /// fewer than it has streams is a degraded subscription, never a readiness failure.
    pub fn connected_streams(&self, worker: &Worker) -> Option<usize> {
        let ev = self.events.as_ref()?;
        Some(ev.events.connected().iter().filter(|(key, up)| *up && key.worker == worker.url).count())
    }

    /// A consistent snapshot of the index, taken by the pump between two
    /// batches, within `max_blocks`; `None` without events, or when the pump
    /// does not answer within `timeout`.
    pub async fn snapshot_index(&self, max_blocks: usize, timeout: Duration) -> Option<kv_ingest::TakenSnapshot> {
        let ev = self.events.as_ref()?;
        let (done, taken) = tokio::sync::oneshot::channel();
        let asked = async {
            ev.control.send(PumpControl::Snapshot(max_blocks, done)).await.ok()?;
            taken.await.ok()
        };
        tokio::time::timeout(timeout, asked).await.ok().flatten()
    }

    /// Fault injection for tests (no route reaches it): the pump applies nothing until the
    /// returned sender is dropped, so the subscribers' channel fills; `None` without events.
    pub async fn stall_pump(&self) -> Option<tokio::sync::oneshot::Sender<()>> {
        let ev = self.events.as_ref()?;
        let (release, stalled) = tokio::sync::oneshot::channel();
        ev.control.send(PumpControl::Stall(stalled)).await.ok()?;
        Some(release)
    }

    /// How each of `worker`'s streams got its history (missed batches, or a peer's snapshot).
    pub fn stream_history(&self, worker: &Worker) -> Vec<(router_types::DpRank, kv_events::StreamHistory)> {
        let Some(ev) = &self.events else { return Vec::new() };
        let keys = worker.streams.lock().unwrap_or_else(|p| p.into_inner()).clone();
        keys.iter().filter_map(|k| ev.events.history(k).map(|h| (k.rank, h))).collect()
    }

    /// Pump counters, when following events.
    pub fn pump_metrics(&self) -> Option<&Arc<PumpMetrics>> {
        self.events.as_ref().map(|e| &e.pump)
    }

    /// Waits for every task of the fleet (after `cancel`).
    pub async fn stopped(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// Drops the retained workers whose requests are done.
    pub(crate) fn sweep_retained(&self) {
        let mut m = self.members.write().unwrap_or_else(|p| p.into_inner());
        m.retained.retain(|w| {
            let busy = w.load().in_flight > 0;
            if !busy {
                w.mark_removed();
            }
            busy
        });
    }

    fn publish(&self, m: &Members) {
        *self.snapshot.write().unwrap_or_else(|p| p.into_inner()) = Arc::from(m.live.clone());
    }

    /// Routes to a worker without following its events (it publishes none, or they cannot be used).
    /// The page size of the worker's pool: the first worker of a pool followed fixes it (its
    /// own, `found`, else the fleet's default). `None`, with the worker refused, when the
    /// worker's differs: its block hashes could never match a request's.
    pub(crate) fn pool_block_size(&self, ev: &EventsSide, worker: &Worker, found: Option<usize>) -> Option<usize> {
        let fleet_block = ev.config.default_block_size.get();
        let block_size = {
            let mut sizes = ev.block_sizes.write().unwrap_or_else(|p| p.into_inner());
            *sizes.entry(worker.pool.clone()).or_insert(found.unwrap_or(fleet_block))
        };
        let worker_block = found.unwrap_or(block_size);
        if worker_block != block_size {
            self.metrics.refused_block_size.fetch_add(1, Ordering::Relaxed);
            let reason = format!(
                "page size {worker_block} differs from pool {}'s {block_size}: its block hashes could never match a request's",
                worker.pool
            );
            self.unfollowed(worker, Events::Refused(reason));
            return None;
        }
        Some(block_size)
    }

    pub(crate) fn unfollowed(&self, worker: &Worker, events: Events) {
        warn!(worker = %worker.url, ?events, "kv events: worker not followed");
        worker.set_events(events);
        worker.discovered();
    }
}

/// The `Authorization` value for a workers' API key (kept out of debug output);
/// `None` if the key cannot be a header value.
pub fn bearer(key: &str) -> Option<reqwest::header::HeaderValue> {
    let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}")).ok()?;
    v.set_sensitive(true);
    Some(v)
}

/// The client for the router's own requests to workers (health, introspection,
/// load reports, KV-event discovery): with the workers' bearer token when
/// they require one, and an overall timeout when given.
pub fn worker_client(api_key: Option<&str>, timeout: Option<Duration>, tls: &WorkerTls) -> reqwest::Client {
    worker_client_builder(api_key, timeout, (**tls.config()).clone()).build().unwrap_or_default()
}

/// [`worker_client`]'s builder, with this TLS configuration.
fn worker_client_builder(
    api_key: Option<&str>,
    timeout: Option<Duration>,
    tls: rustls::ClientConfig,
) -> reqwest::ClientBuilder {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(v) = api_key.and_then(bearer) {
        headers.insert(reqwest::header::AUTHORIZATION, v);
    }
    let mut builder = reqwest::Client::builder().default_headers(headers).tls_backend_preconfigured(tls);
    if let Some(t) = timeout {
        builder = builder.timeout(t);
    }
    builder
}
