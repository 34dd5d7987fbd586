//! One worker as the fleet owns it: its identity (a stable [`WorkerId`],
//! URL, role, pool), its place in the state machine, what it reported about
//! itself, the router-side load on it, and the guard that releases a
//! request's load exactly once however the request ends. Only the fleet
//! moves a worker between states; the gateway reads and charges load.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use router_types::{Bootstrap, DpRank, Load, PoolId, Role, WorkerId, WorkerUrl};

use crate::breaker::{Breaker, BreakerState};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

/// Longest a worker stays out of rotation after requests to it failed,
/// whatever its health probe says (doubling from one second per failure in a row).
pub const MAX_QUARANTINE: Duration = Duration::from_secs(60);

/// Where a worker is in its life. A worker moves only forward through
/// `Discovering` and `Following`, then between `Healthy` and `Down`, and
/// leaves through `Retained` (no new requests; in-flight ones finish) to
/// `Removed` (gone from the fleet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Added; its KV-event publishers are being found. Not routed to.
    Discovering,
    /// Its events are followed (or there are none to follow); waiting for a healthy probe.
    Following,
    /// In rotation.
    Healthy,
    /// Out of rotation: failing probes, or quarantined after failed requests. Its
    /// subscriptions and index state are kept (a worker that comes back keeps its cache)
    /// until the retention period passes.
    Down,
    /// Never routed to: what it reports of itself contradicts how it was added (a
    /// `--prefill` worker whose `/server_info` says `disaggregation_mode: decode`).
    /// Remove it and add it again with the right role.
    Refused,
    /// Removed by its source: no new requests, in-flight ones finish; its
    /// subscriptions are cancelled and its index state dropped.
    Retained,
    /// Gone.
    Removed,
}

/// What the fleet knows of a worker's KV events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Events {
    /// The router does not follow KV events (`--kv-events` off).
    Off,
    /// Being looked for (`/server_info` or explicit endpoints).
    Discovering,
    /// Followed: this many (worker, dp rank) streams.
    Followed {
        /// Streams subscribed.
        streams: usize,
    },
    /// Not followed, and why (routed to without cache knowledge).
    NotFollowed(String),
    /// Its events could never match a request's hashes (another page size): not followed.
    Refused(String),
}

/// What a worker reports about itself (SGLang's `/server_info`, or vLLM's
/// `/v1/models`); a field it does not report is `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerInfo {
    /// The model it serves (`served_model_name`, `model_path`, or the first `/v1/models` id).
    pub model_id: Option<String>,
    /// The model it was started with (`--model`: SGLang's `model_path`, the first `/v1/models`
    /// entry's `root`): vLLM keys images' identifiers by it.
    pub model_path: Option<String>,
    /// Its data-parallel size (at most [`crate::MAX_DP_SIZE`]).
    pub dp_size: Option<u32>,
    /// Its KV page (block) size in tokens.
    pub page_size: Option<u32>,
    /// SGLang's `disaggregation_mode`: `null` (regular), `prefill` or `decode`.
    pub disaggregation_mode: Option<String>,
    /// SGLang's `disaggregation_bootstrap_port` (prefill workers).
    pub bootstrap_port: Option<u16>,
}

/// Reads SGLang's `/server_info` (its server args, flattened). A data-parallel
/// size above [`crate::MAX_DP_SIZE`] (a lying or broken worker) is not believed.
pub fn from_server_info(v: &serde_json::Value) -> WorkerInfo {
    use serde_json::Value;
    let text =
        |k: &str| v.get(k).and_then(Value::as_str).filter(|s| !s.is_empty()).map(|s| s.chars().take(256).collect());
    let num = |k: &str| v.get(k).and_then(Value::as_u64).and_then(|n| u32::try_from(n).ok());
    WorkerInfo {
        model_id: text("served_model_name").or_else(|| text("model_path")),
        model_path: text("model_path"),
        dp_size: num("dp_size").filter(|n| (1..=crate::MAX_DP_SIZE).contains(n)),
        page_size: num("page_size"),
        disaggregation_mode: text("disaggregation_mode"),
        bootstrap_port: num("disaggregation_bootstrap_port").and_then(|p| u16::try_from(p).ok()).filter(|p| *p != 0),
    }
}

/// One engine replica.
#[derive(Debug)]
pub struct Worker {
    /// Its identity for its whole life (never reused).
    pub id: WorkerId,
    /// Its base URL (validated and normalized).
    pub url: WorkerUrl,
    /// Regular, prefill or decode.
    pub role: Role,
    /// The model pool it serves.
    pub pool: PoolId,
    /// Its id in the KV index, when the router follows events.
    pub index_id: Option<kv_index::WorkerId>,
    /// The proxied routes' URLs on it, parsed once.
    endpoints: Vec<(&'static str, http::Uri)>,
    /// Its scheduler service, when it is a gRPC worker (`grpc://`): the one connection to it.
    engine: Option<Arc<engine_grpc::Engine>>,
    state: AtomicU8,
    /// The last verdict of probes and requests (false until the first probe).
    healthy: AtomicBool,
    /// A probe has answered (or failed) at least once.
    probed: AtomicBool,
    quarantine: Mutex<Option<Instant>>,
    failures_in_a_row: AtomicU32,
    /// Probes in a row that failed, and that answered.
    probe_failures: AtomicU32,
    probe_successes: AtomicU32,
    /// `--health-failure-threshold`, `--health-success-threshold`.
    probe_thresholds: (u32, u32),
    /// Its circuit breaker.
    breaker: Breaker,
    /// Its events are followed (mirrors `events`, read on every routing decision).
    followed: AtomicBool,
    /// Its load per data-parallel rank (`--dp-aware`; empty otherwise).
    ranks: crate::ranks::RankLoads,
    in_flight: AtomicU32,
    uncached_tokens: AtomicU64,
    reported_uncached: AtomicU64,
    /// Requests it reports running or waiting (every router's), from `/v1/loads`.
    reported_requests: AtomicU32,
    /// What this router sent it since its last load report, and that report's throughput.
    pub since_poll: crate::since_poll::SincePoll,
    /// Other router replicas' requests in flight on it and the prefill they owe it, as they
    /// last shared them (`--shared-state`; zero alone or when their reports are stale).
    remote_in_flight: AtomicU32,
    remote_uncached: AtomicU64,
    loads_unsupported: AtomicBool,
    info: RwLock<Option<WorkerInfo>>,
    events: RwLock<Events>,
    down_since: Mutex<Option<Instant>>,
    index_cleared: AtomicBool,
    /// Cancels every task of this worker (subscribers, discovery).
    pub(crate) cancel: CancellationToken,
    /// Tracks every task of this worker.
    pub(crate) tasks: TaskTracker,
    /// The streams registered with the pump, to unregister on removal.
    pub(crate) streams: Mutex<Vec<router_types::WorkerKey>>,
    /// The publishers followed now (each stream's endpoint and replay endpoint).
    pub(crate) publishers: Mutex<Vec<(String, Option<String>)>>,
    /// Stops the subscribers followed now (a child of `cancel`): they are replaced when the
    /// worker's publishers move.
    pub(crate) subscriptions: Mutex<CancellationToken>,
    /// A look for moved publishers is under way.
    pub(crate) refollowing: AtomicBool,
    /// What the disaggregation layer learned of it (dropped with it).
    pd_facts: Mutex<crate::PdFacts>,
    /// Whether it answers HTTP/2 (`--upstream-http2`): 0 not asked yet, 1 yes, 2 no.
    upstream_h2: AtomicU8,
    /// When it was last heard from and made progress, what it reported queued.
    pub liveness: crate::liveness::Liveness,
    /// `--worker-stall-secs`: silence after which a transport failure stalls it.
    stall: Duration,
    /// Its warm-up phase ([`crate::warmup`]), and what the phase is measured from.
    pub(crate) warmup_phase: AtomicU8,
    pub(crate) warm_state: Mutex<crate::warmup::WarmState>,
    /// When it joined, whether it was ever healthy, and when it was last probed.
    joined: Instant,
    ever_healthy: AtomicBool,
    last_probe: Mutex<Option<Instant>>,
    /// When the last look for moved publishers started.
    pub(crate) looked_at: Mutex<Option<std::time::Instant>>,
}

/// Who a new worker is (what [`Worker::new`] needs besides its tasks' token).
#[derive(Debug)]
pub(crate) struct Spec {
    pub(crate) id: WorkerId,
    pub(crate) url: WorkerUrl,
    pub(crate) role: Role,
    pub(crate) pool: PoolId,
    pub(crate) index_id: Option<kv_index::WorkerId>,
    pub(crate) events: Events,
}

/// Holds one request's load on a worker; dropping it releases the load. The
/// uncached tokens (prefill owed) go earlier, when the first byte of the
/// answer shows the prefill is done.
#[derive(Debug)]
pub struct LoadGuard {
    worker: Arc<Worker>,
    uncached: u64,
    /// The data-parallel rank charged too (`--dp-aware`).
    rank: Option<usize>,
}

// === impl State ===

impl State {
    /// A stable label (metrics, `/workers`).
    pub fn as_str(self) -> &'static str {
        match self {
            State::Discovering => "discovering",
            State::Following => "following",
            State::Healthy => "healthy",
            State::Down => "down",
            State::Refused => "refused",
            State::Retained => "retained",
            State::Removed => "removed",
        }
    }

    /// Every state, in order.
    pub const ALL: [State; 7] = [
        State::Discovering,
        State::Following,
        State::Healthy,
        State::Down,
        State::Refused,
        State::Retained,
        State::Removed,
    ];
}

// Stored phases; Healthy and Down are `Following` plus the health verdict.
const DISCOVERING: u8 = 0;
const FOLLOWING: u8 = 1;
const RETAINED: u8 = 2;
const REMOVED: u8 = 3;
const REFUSED: u8 = 4;

// === impl Worker ===

impl Worker {
    /// A worker just added (Discovering), routed to once discovered and probed healthy.
    pub(crate) fn new(spec: Spec, cancel: CancellationToken, config: &crate::FleetConfig) -> Self {
        let Spec { id, url, role, pool, index_id, events } = spec;
        let paths = config.proxied_paths;
        let endpoints = paths.iter().filter_map(|p| Some((*p, format!("{url}{p}").parse().ok()?))).collect();
        // A gRPC worker (`grpc://host:port`): its scheduler service, connected when first asked.
        let connect_timeout = config.health.timeout.max(Duration::from_secs(1));
        let engine = url
            .as_str()
            .strip_prefix("grpc://")
            .map(|authority| Arc::new(engine_grpc::Engine::new(authority.trim_end_matches('/'), connect_timeout)));
        Self {
            engine,
            probe_failures: AtomicU32::new(0),
            probe_successes: AtomicU32::new(0),
            probe_thresholds: (config.health.failure_threshold.max(1), config.health.success_threshold.max(1)),
            breaker: Breaker::new(config.breaker),
            followed: AtomicBool::new(matches!(events, Events::Followed { .. })),
            ranks: crate::ranks::RankLoads::new(
                if config.dp_aware { crate::MAX_DP_SIZE as usize } else { 0 },
                config.rank_header,
            ),
            endpoints,
            id,
            url,
            role,
            pool,
            index_id,
            state: AtomicU8::new(DISCOVERING),
            healthy: AtomicBool::new(false),
            probed: AtomicBool::new(false),
            quarantine: Mutex::new(None),
            failures_in_a_row: AtomicU32::new(0),
            in_flight: AtomicU32::new(0),
            uncached_tokens: AtomicU64::new(0),
            reported_uncached: AtomicU64::new(0),
            reported_requests: AtomicU32::new(0),
            since_poll: Default::default(),
            remote_in_flight: AtomicU32::new(0),
            remote_uncached: AtomicU64::new(0),
            loads_unsupported: AtomicBool::new(false),
            info: RwLock::new(None),
            events: RwLock::new(events),
            down_since: Mutex::new(None),
            index_cleared: AtomicBool::new(false),
            tasks: TaskTracker::new(),
            streams: Mutex::new(Vec::new()),
            publishers: Mutex::new(Vec::new()),
            subscriptions: Mutex::new(cancel.child_token()),
            refollowing: AtomicBool::new(false),
            looked_at: Mutex::new(None),
            pd_facts: Mutex::new(crate::PdFacts::default()),
            upstream_h2: AtomicU8::new(0),
            liveness: crate::liveness::Liveness::default(),
            stall: config.liveness.stall,
            warmup_phase: AtomicU8::new(0),
            warm_state: Mutex::new(crate::warmup::WarmState::default()),
            joined: Instant::now(),
            ever_healthy: AtomicBool::new(false),
            last_probe: Mutex::new(None),
            cancel,
        }
    }

    /// Where it is in its life.
    pub fn state(&self) -> State {
        match self.state.load(Ordering::Acquire) {
            DISCOVERING => State::Discovering,
            FOLLOWING if !self.probed.load(Ordering::Relaxed) => State::Following,
            FOLLOWING if self.healthy.load(Ordering::Relaxed) => State::Healthy,
            FOLLOWING => State::Down,
            RETAINED => State::Retained,
            REFUSED => State::Refused,
            _ => State::Removed,
        }
    }

    /// Whether new requests may go to it.
    pub fn is_routable(&self) -> bool {
        self.state.load(Ordering::Acquire) == FOLLOWING
            && self.healthy.load(Ordering::Relaxed)
            && self.breaker.allows(&self.url)
    }

    /// Where its circuit breaker is.
    pub fn breaker_state(&self) -> BreakerState {
        self.breaker.state()
    }

    /// Times its circuit breaker opened.
    pub fn breaker_opened(&self) -> u64 {
        self.breaker.opened.load(Ordering::Relaxed)
    }

    /// Whether its KV events are followed (its cache is known exactly).
    pub fn is_followed(&self) -> bool {
        self.followed.load(Ordering::Relaxed)
    }

    /// Whether it is in rotation (an alias of [`Worker::is_routable`]).
    pub fn is_healthy(&self) -> bool {
        self.is_routable()
    }

    /// Takes it out of the fleet's rotation for good: `why` its report contradicts its role.
    pub(crate) fn refuse(&self, why: &str) {
        let mut state = self.state.load(Ordering::Acquire);
        while matches!(state, DISCOVERING | FOLLOWING) {
            match self.state.compare_exchange(state, REFUSED, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    warn!(worker = %self.url, role = self.role.as_str(), why, "worker refused: never routed to");
                    return;
                }
                Err(now) => state = now,
            }
        }
    }

    /// The bootstrap port decode workers meet this prefill worker on: the
    /// configured one, else the one it advertises; `None` (sent as JSON null)
    /// for a worker that is not a prefill worker or has no known port.
    pub fn bootstrap_port(&self) -> Option<u16> {
        match self.role {
            Role::Prefill { bootstrap: Bootstrap::Port(p) } => Some(p),
            Role::Prefill { bootstrap: Bootstrap::Discover } => self.info().and_then(|i| i.bootstrap_port),
            _ => None,
        }
    }

    /// Its data-parallel size, as it reported it (1 when it did not).
    pub fn dp_size(&self) -> u32 {
        self.info().and_then(|i| i.dp_size).unwrap_or(1).max(1)
    }

    /// Discovery is over: it may be routed to once healthy.
    pub(crate) fn discovered(&self) {
        let _ = self.state.compare_exchange(DISCOVERING, FOLLOWING, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Taken out by its source; false if it already was.
    pub(crate) fn retain(&self) -> bool {
        let prev = self.state.swap(RETAINED, Ordering::AcqRel);
        if prev == REMOVED {
            self.state.store(REMOVED, Ordering::Release);
        }
        prev != RETAINED && prev != REMOVED
    }

    /// Gone.
    pub(crate) fn mark_removed(&self) {
        self.state.store(REMOVED, Ordering::Release);
    }

    /// What its KV events are.
    pub fn events(&self) -> Events {
        self.events.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn set_events(&self, events: Events) {
        self.followed.store(matches!(events, Events::Followed { .. }), Ordering::Relaxed);
        *self.events.write().unwrap_or_else(|p| p.into_inner()) = events;
    }

    /// The URL of a proxied route's `path` on this worker (parsed once, see
    /// [`crate::FleetConfig::proxied_paths`]); `None` for another path.
    pub fn endpoint(&self, path: &str) -> Option<http::Uri> {
        self.endpoints.iter().find(|(p, _)| *p == path).map(|(_, u)| u.clone())
    }

    /// Its scheduler service, when it is a gRPC worker (`grpc://host:port`).
    pub fn engine(&self) -> Option<&Arc<engine_grpc::Engine>> {
        self.engine.as_ref()
    }

    /// The URL of `path` (a route such as `/generate`) on this worker.
    pub fn endpoint_url(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    /// What the disaggregation layer learned of it so far.
    pub fn pd_facts(&self) -> crate::PdFacts {
        self.pd_facts.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Changes what the disaggregation layer knows of it.
    pub fn update_pd_facts(&self, change: impl FnOnce(&mut crate::PdFacts)) {
        change(&mut self.pd_facts.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// Whether it answers HTTP/2 over cleartext (`--upstream-http2`): `None` until the gateway
    /// has asked it (at its first request), then what the answer showed.
    pub fn upstream_http2(&self) -> Option<bool> {
        match self.upstream_h2.load(Ordering::Relaxed) {
            0 => None,
            1 => Some(true),
            _ => Some(false),
        }
    }

    /// Records whether it answers HTTP/2.
    pub fn set_upstream_http2(&self, speaks: bool) {
        self.upstream_h2.store(if speaks { 1 } else { 2 }, Ordering::Relaxed);
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

    /// Still starting: never healthy since it joined; and for how long it has been in the fleet.
    pub fn starting(&self) -> Option<Duration> {
        (!self.ever_healthy.load(Ordering::Relaxed)).then(|| self.joined.elapsed())
    }

    /// Notes a probe now.
    pub(crate) fn probed_now(&self) {
        *self.last_probe.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }

    /// How long since its last probe (`None`: never probed).
    pub(crate) fn since_probe(&self) -> Option<Duration> {
        self.last_probe.lock().unwrap_or_else(|p| p.into_inner()).map(|t| t.elapsed())
    }

    /// Whether requests to it failed recently enough that probes cannot bring it back yet.
    pub fn quarantined(&self) -> bool {
        self.quarantine.lock().unwrap_or_else(|p| p.into_inner()).is_some_and(|until| Instant::now() < until)
    }

    /// A probe's verdict. The first decides at once; after it, a worker in
    /// rotation leaves after `--health-failure-threshold` failed probes in a
    /// row, and one out of it comes back after `--health-success-threshold`
    /// good ones. A worker quarantined after failed requests stays out
    /// however the probe went (a worker that answers `/health` but hangs on
    /// requests must not come back every probe).
    /// True when this probe took it out of rotation (it was in).
    pub fn set_probe_result(&self, ok: bool) -> bool {
        let first = !self.probed.swap(true, Ordering::Relaxed);
        if first && !ok {
            // Never up: down since now (for the retention clock).
            *self.down_since.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        }
        let (fail_after, back_after) = self.probe_thresholds;
        let (run, other) = if ok {
            (&self.probe_successes, &self.probe_failures)
        } else {
            (&self.probe_failures, &self.probe_successes)
        };
        other.store(0, Ordering::Relaxed);
        let n = run.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        let up = self.healthy.load(Ordering::Relaxed);
        let verdict = if first {
            ok
        } else if ok {
            up || n >= back_after
        } else {
            up && n < fail_after
        };
        let in_rotation = verdict && !self.quarantined();
        self.set_healthy(in_rotation);
        up && !in_rotation
    }

    /// Takes it out of (or back into) rotation.
    pub fn set_healthy(&self, up: bool) {
        if up && !self.ever_healthy.load(Ordering::Relaxed) {
            self.ever_healthy.store(true, Ordering::Relaxed);
        }
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

    /// A request to it failed on the worker's side (unreachable, timed out,
    /// died mid-answer): out of rotation, and quarantined for a period that
    /// doubles with each failure in a row (1 s up to [`MAX_QUARANTINE`]).
    pub fn request_failed(&self) {
        self.liveness.transport_failed(self.stall);
        self.breaker.failed(&self.url);
        let n = self.failures_in_a_row.fetch_add(1, Ordering::Relaxed).min(16);
        let period = Duration::from_secs(1u64 << n.min(6)).min(MAX_QUARANTINE);
        *self.quarantine.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now() + period);
        self.set_healthy(false);
    }

    /// It answered a request with a server error (5xx): its circuit breaker
    /// counts a failure (it stays in rotation until the breaker opens).
    pub fn answer_failed(&self) {
        self.breaker.failed(&self.url);
    }

    /// A request to it got a good answer: failures in a row start over.
    pub fn request_succeeded(&self) {
        self.breaker.succeeded(&self.url);
        if self.failures_in_a_row.load(Ordering::Relaxed) != 0 {
            self.failures_in_a_row.store(0, Ordering::Relaxed);
        }
    }

    /// Why it is left out of new routing decisions now, if it is (see [`crate::liveness`]).
    pub fn veto(&self, cfg: &crate::liveness::LivenessConfig) -> Option<crate::liveness::Veto> {
        self.veto_at(cfg, crate::liveness::now_ms())
    }

    /// [`Worker::veto`] at `now` (the liveness clock's milliseconds).
    pub(crate) fn veto_at(&self, cfg: &crate::liveness::LivenessConfig, now: u64) -> Option<crate::liveness::Veto> {
        let owed = self.uncached_tokens.load(Ordering::Relaxed);
        self.liveness.veto_at(cfg, self.in_flight.load(Ordering::Relaxed), owed, now)
    }

    /// Its current load: the requests in flight on it from this router and from the
    /// replicas sharing state with it, and the prefill it owes: their uncached tokens not
    /// yet answered, or what the worker reports queued (every router's requests),
    /// whichever is larger.
    pub fn load(&self) -> Load {
        let routers =
            self.uncached_tokens.load(Ordering::Relaxed).saturating_add(self.remote_uncached.load(Ordering::Relaxed));
        Load {
            in_flight: self
                .in_flight
                .load(Ordering::Relaxed)
                .saturating_add(self.remote_in_flight.load(Ordering::Relaxed)),
            uncached_tokens: routers.max(self.reported_uncached.load(Ordering::Relaxed)),
        }
    }

    /// Its load as a decode worker: the requests it runs, the routers' in flight
    /// (this one's and its replicas') or what it reports running and waiting
    /// (every router's), whichever is larger; no prefill is owed on it.
    pub fn decode_load(&self) -> Load {
        let routers =
            self.in_flight.load(Ordering::Relaxed).saturating_add(self.remote_in_flight.load(Ordering::Relaxed));
        Load { in_flight: routers.max(self.reported_requests.load(Ordering::Relaxed)), uncached_tokens: 0 }
    }

    /// This router's own requests in flight on it and the prefill they owe, what it shares
    /// with its replicas.
    pub fn own_load(&self) -> Load {
        Load {
            in_flight: self.in_flight.load(Ordering::Relaxed),
            uncached_tokens: self.uncached_tokens.load(Ordering::Relaxed),
        }
    }

    /// Records what the other router replicas have in flight on it now (their sum).
    pub fn set_remote_load(&self, load: Load) {
        self.remote_in_flight.store(load.in_flight, Ordering::Relaxed);
        self.remote_uncached.store(load.uncached_tokens, Ordering::Relaxed);
    }

    /// What the other router replicas have in flight on it, as last shared.
    pub fn remote_load(&self) -> Load {
        Load {
            in_flight: self.remote_in_flight.load(Ordering::Relaxed),
            uncached_tokens: self.remote_uncached.load(Ordering::Relaxed),
        }
    }

    /// Records the requests it reports running and waiting.
    pub fn set_reported_requests(&self, n: u32) {
        self.reported_requests.store(n, Ordering::Relaxed);
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
        self.charge_on(Some(uncached), None)
    }

    /// Charges a request sent to data-parallel `rank` (when ranks are tracked, to it too), and
    /// tallies it as sent since the worker's last load report. `counted`: the uncached prompt
    /// tokens it owes, when the router counted them (`None`: not tokenized; it owes none here,
    /// and the load policies' tally counts it at their mean prompt).
    pub fn charge_on(self: &Arc<Self>, counted: Option<u64>, rank: Option<DpRank>) -> LoadGuard {
        self.since_poll.sent(counted);
        let uncached = counted.unwrap_or(0);
        if self.in_flight.fetch_add(1, Ordering::Relaxed) == 0 {
            self.liveness.busy_from_idle();
        }
        self.uncached_tokens.fetch_add(uncached, Ordering::Relaxed);
        let rank = rank.map(|r| r.0 as usize).filter(|r| self.ranks.charge(*r, uncached));
        LoadGuard { worker: self.clone(), uncached, rank }
    }

    /// The rank to send a request no rank holds a prefix of (`--dp-aware`,
    /// a worker of several ranks): the least loaded one.
    pub fn least_loaded_rank(&self) -> Option<DpRank> {
        if !self.ranks.tracked() {
            return None;
        }
        let dp = self.info().and_then(|i| i.dp_size).unwrap_or(1);
        self.ranks.least_loaded(dp as usize)
    }

    /// The rank to tell this worker a request is for, of `rank` the router chose
    /// (`--dp-rank-header`: by default only to a worker known to have several ranks).
    pub fn rank_hint(&self, rank: Option<DpRank>) -> Option<DpRank> {
        self.ranks.hint(rank, self.dp_size())
    }

    /// Records the worker's own report of its queued prefill per rank (`--dp-aware`).
    pub fn set_reported_rank_loads(&self, report: &[(usize, u64)]) {
        self.ranks.set_reported(report);
    }
}

impl LoadGuard {
    /// The worker has prefilled the prompt: it no longer owes those tokens.
    pub fn prefill_done(&mut self) {
        self.worker.liveness.progressed(self.worker.in_flight.load(Ordering::Relaxed));
        self.worker.uncached_tokens.fetch_sub(self.uncached, Ordering::Relaxed);
        if let Some(r) = self.rank {
            self.worker.ranks.prefilled(r, self.uncached);
        }
        self.uncached = 0;
    }

    /// The worker this load is on.
    pub fn worker(&self) -> &Arc<Worker> {
        &self.worker
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        let left = self.worker.in_flight.fetch_sub(1, Ordering::Relaxed).saturating_sub(1);
        // A completion (or an abandoned request) is progress.
        self.worker.liveness.progressed(left);
        self.worker.uncached_tokens.fetch_sub(self.uncached, Ordering::Relaxed);
        if let Some(r) = self.rank {
            self.worker.ranks.release(r, self.uncached);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker at `url` whose probes move it after `fail` failures or `succeed` successes in a row.
    fn worker_with(url: &str, fail: u32, succeed: u32) -> Worker {
        let url = WorkerUrl::parse(url).unwrap();
        let spec = Spec {
            id: WorkerId(1),
            url,
            role: Role::Regular,
            pool: PoolId::default_pool(),
            index_id: None,
            events: Events::Off,
        };
        let config = crate::FleetConfig {
            health: crate::HealthConfig { failure_threshold: fail, success_threshold: succeed, ..Default::default() },
            breaker: crate::BreakerConfig::default(),
            index_retention: Duration::from_secs(300),
            load_poll: Duration::ZERO,
            api_key: None,
            events: None,
            proxied_paths: &["/generate"],
            dp_aware: false,
            rank_header: crate::RankHeader::Auto,
            tls: crate::WorkerTls::default(),
            liveness: crate::liveness::LivenessConfig::default(),
        };
        Worker::new(spec, CancellationToken::new(), &config)
    }

    fn worker(url: &str) -> Worker {
        worker_with(url, 1, 1)
    }

    #[test]
    fn disaggregation_facts_live_on_their_worker() {
        let w = worker("http://p0:30000");
        assert_eq!(w.pd_facts(), crate::PdFacts::default());
        w.update_pd_facts(|f| f.engine_ids = Some([(0, "engine-a".to_owned())].into()));
        assert_eq!(w.pd_facts().engine_ids.unwrap()[&0], "engine-a");
        w.update_pd_facts(|f| f.engine_ids = None);
        assert_eq!(w.pd_facts(), crate::PdFacts::default());
    }

    #[test]
    fn urls_split_into_what_a_connection_needs() {
        let w = worker("http://[::1]:8000/prefix");
        let uri = w.endpoint("/generate").unwrap();
        assert_eq!(
            (uri.authority().unwrap().as_str(), uri.host(), uri.port_u16()),
            ("[::1]:8000", Some("[::1]"), Some(8000))
        );
        assert_eq!(uri.path(), "/prefix/generate");
        assert!(w.endpoint("/other").is_none());
        let w = worker("http://engine");
        let uri = w.endpoint("/generate").unwrap();
        assert_eq!((uri.authority().unwrap().as_str(), uri.port_u16(), uri.path()), ("engine", None, "/generate"));
    }

    #[test]
    fn states_move_forward_and_only_following_workers_route() {
        let w = worker("http://e:1");
        assert_eq!(w.state(), State::Discovering);
        assert!(!w.is_routable(), "not routed to before its events are followed");
        w.discovered();
        assert_eq!(w.state(), State::Following);
        assert!(!w.is_routable(), "not routed to before a probe");
        w.set_probe_result(true);
        assert_eq!(w.state(), State::Healthy);
        w.set_probe_result(false);
        assert_eq!(w.state(), State::Down);
        w.set_probe_result(true);
        assert!(w.is_routable());
        assert!(w.retain());
        assert!(!w.retain(), "retained once");
        assert_eq!(w.state(), State::Retained);
        assert!(!w.is_routable());
        w.discovered();
        assert_eq!(w.state(), State::Retained, "a retained worker never comes back");
        w.mark_removed();
        assert_eq!(w.state(), State::Removed);
    }

    #[test]
    fn a_worker_whose_requests_fail_is_not_brought_back_by_its_probe() {
        let w = worker("http://e:1");
        w.discovered();
        w.set_probe_result(true);
        w.request_failed();
        assert!(!w.is_routable());
        w.set_probe_result(true);
        assert!(!w.is_routable(), "quarantined: /health answering is not enough");
        assert!(w.quarantined());
        // Once the quarantine is over, a good probe brings it back.
        *w.quarantine.lock().unwrap() = Some(Instant::now() - Duration::from_millis(1));
        w.set_probe_result(true);
        assert!(w.is_routable());
    }

    #[test]
    fn probes_move_a_worker_only_past_their_thresholds() {
        let w = worker_with("http://e:1", 3, 2);
        w.discovered();
        w.set_probe_result(true);
        assert!(w.is_routable(), "the first probe decides at once");
        w.set_probe_result(false);
        w.set_probe_result(false);
        w.set_probe_result(true);
        w.set_probe_result(false);
        w.set_probe_result(false);
        assert!(w.is_routable(), "never three failures in a row");
        w.set_probe_result(false);
        assert!(!w.is_routable(), "three in a row");
        w.set_probe_result(true);
        assert!(!w.is_routable(), "one good probe of two");
        w.set_probe_result(true);
        assert!(w.is_routable());
    }

    #[test]
    fn server_errors_open_the_breaker_and_take_the_worker_out() {
        let w = worker("http://e:1");
        w.discovered();
        w.set_probe_result(true);
        for _ in 0..9 {
            w.answer_failed();
        }
        assert!(w.is_routable(), "nine of ten");
        w.answer_failed();
        assert_eq!(w.breaker_state(), BreakerState::Open);
        assert!(!w.is_routable());
        w.set_probe_result(true);
        assert!(!w.is_routable(), "a good probe does not close the breaker");
        assert_eq!(w.breaker_opened(), 1);
    }
}
