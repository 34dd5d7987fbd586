//! The OpenAI-compatible gateway: axum routes in front of the engine workers.
//! For each request it renders and tokenizes (when the policy needs tokens),
//! asks the index how much of the prompt each worker holds, lets the policy
//! choose, charges the worker's load, and proxies the request, streaming the
//! answer back chunk by chunk.
//!
//! ```text
//! body ─► parse ─► tokens ─► page hashes ─► index.prefix_depths ─► policy ─► worker
//!                                                                   └─► proxy (stream) ─► client
//! ```

mod answer_guard;
pub mod cache;
pub mod cached;
pub mod epp;
pub mod error;
pub mod explain;
mod exposition;
mod grpc;
mod h1;
mod judge;
pub mod jwt;
pub mod metrics;
pub mod pd;
pub mod pipeline;
pub mod pools;
mod proxy;
mod relay;
mod routes;
pub mod runtimes;
mod send;
mod served;
pub mod shared;
#[cfg(test)]
mod testing;
pub mod tls;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize};

use router_types::WorkerUrl;
use std::time::Duration;

use kv_index::KvIndex;
use policy::Policy;
use renderer::Renderer;

pub use error::GatewayError;
pub use fleet::{Fleet, HashModes, LoadGuard, Worker, WorkerInfo, worker_client};
pub use h1::{serve, serve_admin, serve_metrics, serve_probes};
pub use metrics::GatewayMetrics;
pub use pipeline::body::read_body;
pub use pipeline::request::PROXIED_PATHS;
use pipeline::{admission, auth, context};
pub use routes::ControlRoutes;

/// Default request body limit (the reference router's).
pub const DEFAULT_MAX_BODY_BYTES: usize = 5 << 20;

/// How the gateway behaves.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Longest a proxied request may take.
    pub request_timeout: Duration,
    /// Most requests in flight at once; more get 429.
    pub max_concurrent: usize,
    /// Credit the chosen worker with the request's blocks (pending prefixes).
    pub credit_pending: bool,
    /// The model id `/v1/models` reports.
    pub model_id: String,
    /// Bearer token for the workers (engines started with `--api-key`), sent
    /// with proxied requests of clients that presented a client key; never
    /// with an anonymous client's request.
    pub worker_api_key: Option<String>,
    /// Limits on what a client connection may hold (both front ends).
    pub limits: ClientLimits,
    /// Bearer keys of the control plane (`--control-plane-api-keys`); none: it is closed.
    pub control_plane_keys: Vec<String>,
    /// Bearer keys clients must present on the OpenAI routes (`--client-api-keys`); none: open.
    pub client_keys: Vec<String>,
    /// Bytes of memory the requests in progress may hold (429 past it; see [`admission`]).
    pub max_request_memory: usize,
    /// Large renders run at most this many at a time, off the serving threads.
    pub render_threads: usize,
    /// The control plane has a listener of its own ([`serve_admin`]): the client
    /// listener does not serve its routes.
    pub admin_listener: bool,
    /// Retries of requests no byte of whose answer reached the client.
    pub retry: RetryConfig,
    /// Requests that may wait for a slot when all are taken (`--queue-size`; 0: refuse at once).
    pub queue_size: usize,
    /// Longest a request waits in that queue (`--queue-timeout-secs`; 408 after).
    pub queue_timeout: Duration,
    /// Bounds of the latency histograms, in seconds (`--prometheus-duration-buckets`).
    pub duration_buckets: Vec<f64>,
    /// Headers a client's request id is looked for in, in order (`--request-id-headers`).
    pub request_id_headers: Vec<String>,
    /// Which browser origins may call the router (`--cors-allowed-origins`).
    pub cors: context::Cors,
    /// Requests admitted per second on average (`--rate-limit-tokens-per-second`; none: no limit).
    pub rate_limit: Option<u32>,
    /// Serve HTTPS with this configuration (`--tls-cert-path`, `--tls-key-path`) on the client
    /// and admin listeners.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Bounds of the index snapshots served to peer replicas (`GET /index/snapshot`).
    pub index_snapshot: SnapshotServing,
    /// Page digests each pool's page-hash memo keeps (`--page-hash-memo-pages`).
    pub chain_memo_pages: usize,
    /// The priority scheduler (`--priority-scheduler-enabled`; none: one queue for all).
    pub scheduler: Option<pipeline::scheduler::SchedulerConfig>,
    /// Who a request's tenant is (`--tenant-api-key`, `--trust-tenant-header`).
    pub tenants: pipeline::scheduler::Tenants,
    /// Per-tenant rate limits (`--tenant-rate-limit-enabled`; none: off).
    pub tenant_limits: Option<pipeline::tenant_limits::TenantLimitsConfig>,
    /// JWT/OIDC tokens on the control plane (`--jwt-issuer`; none: keys only).
    pub jwt: Option<jwt::JwtConfig>,
    /// Log every control-plane request (`--control-plane-audit-enabled`, target `audit`).
    pub audit: bool,
    /// How long a pooled worker connection may have been idle to be reused
    /// (`--upstream-pool-idle-timeout-secs`; `Duration::MAX`: until the pools' own sweep, a minute).
    pub upstream_pool_idle: Duration,
    /// HTTP/2 to the cleartext workers that answer it (`--upstream-http2`).
    pub upstream_http2: bool,
    /// Who gets a dispatch's decision record (`--cache-trace*`, SMG's `x-smg-cache-trace`).
    pub cache_trace: pipeline::cache_trace::CacheTraceConfig,
    /// Spans of requests exported over OTLP (`--enable-trace`; none: off).
    pub tracer: Option<otlp::Tracer>,
    /// How gRPC workers' answers separate reasoning from the answer (`--reasoning-parser`).
    pub reasoning_parser: Option<String>,
    /// How gRPC workers' chat answers are read for tool calls (`--tool-call-parser`).
    pub tool_call_parser: Option<String>,
    /// Headers a routing key is read from after `x-smg-routing-key`, in order, lowercase
    /// (`--routing-key-headers`; the first present with a usable value wins).
    pub routing_key_headers: Vec<String>,
    /// State shared with the other router replicas (`--shared-state`; none: alone).
    pub shared_state: Option<shared::SharedConfig>,
}

/// How index snapshots are served (`--index-snapshot-max-blocks`, `--index-snapshot-timeout-secs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotServing {
    /// Most blocks in one snapshot (streams beyond are left out whole).
    pub max_blocks: usize,
    /// Longest wait for the pump to take it.
    pub timeout: Duration,
}

impl Default for SnapshotServing {
    fn default() -> Self {
        Self { max_blocks: fleet::DEFAULT_SNAPSHOT_MAX_BLOCKS, timeout: Duration::from_secs(10) }
    }
}

/// Retries (SGLang Model Gateway's `--retry-*` flags): a request whose worker
/// could not be reached, or answered 408, 429, 500, 502, 503 or 504, is sent
/// again after a backoff, to another worker when there is one, as long as no
/// byte of the answer went to the client.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryConfig {
    /// Off: every request is sent once (`--disable-retries`).
    pub enabled: bool,
    /// Most attempts in all, the first included (`--retry-max-retries`, as
    /// SGLang Model Gateway counts it: 5 is one try and four retries).
    pub max_retries: u32,
    /// Wait before the first retry (`--retry-initial-backoff-ms`).
    pub initial_backoff: Duration,
    /// Longest wait between two attempts (`--retry-max-backoff-ms`).
    pub max_backoff: Duration,
    /// Each wait is the one before times this (`--retry-backoff-multiplier`).
    pub multiplier: f64,
    /// Each wait is moved by up to this fraction of it, at random (`--retry-jitter-factor`).
    pub jitter: f64,
}

impl Default for RetryConfig {
    /// SGLang Model Gateway's defaults.
    fn default() -> Self {
        Self {
            enabled: true,
            max_retries: 5,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(30_000),
            multiplier: 1.5,
            jitter: 0.2,
        }
    }
}

impl RetryConfig {
    /// Attempts in all, the first included (at least one).
    pub fn max_attempts(&self) -> u32 {
        self.max_retries.max(1)
    }

    /// Whether a worker's answer with `status` is worth another attempt.
    pub fn retryable(status: u16) -> bool {
        matches!(status, 408 | 429 | 500 | 502 | 503 | 504)
    }

    /// The wait before retry `n` (1 for the first): the initial backoff times
    /// the multiplier `n - 1` times, capped, then moved by the jitter.
    pub fn backoff(&self, n: u32) -> Duration {
        let base =
            self.initial_backoff.as_secs_f64() * self.multiplier.max(1.0).powi(n.saturating_sub(1).min(64) as i32);
        let base = base.min(self.max_backoff.as_secs_f64());
        let jitter = self.jitter.clamp(0.0, 1.0) * (2.0 * unit_random() - 1.0);
        Duration::from_secs_f64((base * (1.0 + jitter)).max(0.0))
    }
}

/// A number in [0, 1) for jitter.
fn unit_random() -> f64 {
    (random_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// A fast per-thread pseudo-random number (xorshift64*, seeded from the
/// clock and the thread): for jitter and request ids, never for secrets.
/// Milliseconds since the process first asked (at least 1): the planner's clock.
pub(crate) fn millis_since_start() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64 + 1
}

pub(crate) fn random_u64() -> u64 {
    use std::cell::Cell;
    thread_local! { static STATE: Cell<u64> = Cell::new(seed()); }
    fn seed() -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
        // The std hasher's per-process random keys tell two threads (and two processes) apart.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(t);
        h.finish() | 1
    }
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    })
}

/// What one client connection may hold, and for how long: the deadlines and
/// caps that keep slow or idle clients (and stalled workers) from holding the
/// router's connections, tasks and load slots without bound. Defaults: the
/// router's `defaults.rs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientLimits {
    /// Longest wait for a request's complete head once its first byte arrived.
    pub header_read_timeout: Duration,
    /// Longest wait for a request's complete body once its head arrived.
    pub body_read_timeout: Duration,
    /// Longest wait for the next byte of a request's body (`--stream-body-stall-timeout-secs`;
    /// zero: only `body_read_timeout`).
    pub body_stall_timeout: Duration,
    /// Longest a keep-alive connection may sit idle between requests.
    pub idle_timeout: Duration,
    /// Most client connections open at once; the accept loop stops accepting
    /// past it (the kernel's backlog holds the rest) until one closes.
    pub max_connections: usize,
    /// Longest a worker may stay silent in the middle of an answer's body
    /// (between two reads) before the answer is ended as a worker failure.
    pub upstream_idle_timeout: Duration,
    /// An event stream whose worker has been silent this long gets a keep-alive frame (an SSE
    /// comment; Anthropic's `ping` event on its routes), between events, so a proxy's idle
    /// timeout does not cut a stream waiting on a long prefill (`--sse-keepalive-secs`; zero: none).
    pub sse_keepalive: Duration,
}

impl Default for ClientLimits {
    /// Test-friendly defaults; the binary passes its own from `defaults.rs`.
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(30),
            body_read_timeout: Duration::from_secs(60),
            body_stall_timeout: Duration::ZERO,
            idle_timeout: Duration::from_secs(60),
            max_connections: 16_384,
            upstream_idle_timeout: Duration::from_secs(300),
            sse_keepalive: Duration::from_secs(15),
        }
    }
}

/// How long an idle upstream connection may be reused by default (SMG's
/// `--upstream-pool-idle-timeout-secs`: under the engines' own keep-alive timeout, uvicorn's 5 s,
/// so a connection is not reused as the engine closes it).
pub const DEFAULT_UPSTREAM_POOL_IDLE: Duration = Duration::from_secs(3);

/// How long an idle upstream connection is kept at most (the per-thread pools' sweep, whatever
/// `--upstream-pool-idle-timeout-secs` says).
const UPSTREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest wait for a connection to a worker.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The gateway's shared state.
pub struct Gateway {
    /// Configuration.
    pub config: GatewayConfig,
    /// The workers (the fleet owns them; the gateway reads its snapshot and charges load).
    pub fleet: Arc<Fleet>,
    /// The model pools (one, `default`, without a routing config), each
    /// with its policy, renderer and chain memo.
    pub pools: Vec<Arc<pools::Pool>>,
    /// Which pool serves a request, with a routing config (`--routing-config`; reloadable).
    pub routing: Option<pools::RoutingSlot>,
    /// The KV index, when routing by KV events (shared by every pool: its
    /// entries are per worker, and a pool reads its own workers' only).
    pub index: Option<Arc<KvIndex>>,
    /// Counters and histograms.
    pub metrics: GatewayMetrics,
    /// `Authorization` for the workers (from `config.worker_api_key`), put on
    /// the proxied requests of authenticated clients (see `proxy::worker_credentials`).
    pub(crate) worker_auth: Option<axum::http::HeaderValue>,
    /// Keys of the control plane.
    pub(crate) control_keys: auth::Keys,
    /// Keys of the data plane.
    pub(crate) client_keys: auth::Keys,
    /// Set on shutdown: readiness turns 503, new requests are refused.
    pub draining: AtomicBool,
    pub(crate) in_flight: AtomicUsize,
    /// The memory of requests in progress.
    pub budget: admission::Budget,
    /// Requests waiting for a slot.
    pub queue: admission::Queue,
    /// The rate limit's token bucket, when there is one.
    pub(crate) rate: Option<admission::TokenBucket>,
    /// The control plane's JWT verifier, when an identity provider is configured.
    pub jwt: Option<jwt::JwtVerifier>,
    /// Per-tenant rate limits, when on.
    pub tenant_limiter: Option<pipeline::tenant_limits::TenantLimiter>,
    /// The priority scheduler, when on: it holds the slots instead of `in_flight`'s limit.
    pub scheduler: Option<Arc<pipeline::scheduler::Scheduler>>,
    /// Slots of the render pool.
    pub(crate) render_slots: tokio::sync::Semaphore,
    /// Held from a prefix match to the chosen worker's pending credit (with `credit_pending`),
    /// so that concurrent requests sharing a cold prefix see each other's credit.
    pub(crate) credit_lock: std::sync::Mutex<()>,
    /// One slot per open client connection (`--max-connections`), over every serving thread.
    pub(crate) connections: Arc<tokio::sync::Semaphore>,
    /// TLS towards `https://` workers (the fleet's configuration), for the fast path.
    pub(crate) upstream_tls: tls::WorkerConnectors,
    /// The control plane's routes, handed over once as the router is wired.
    pub(crate) control: std::sync::OnceLock<ControlRoutes>,
    /// State shared with the other router replicas (`--shared-state`), when on.
    pub shared: Option<Arc<shared::Shared>>,
    /// The runtimes the router serves on, watched for `/metrics`.
    pub runtimes: Arc<runtimes::Runtimes>,
}

// === impl Gateway ===

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").field("config", &self.config).field("pools", &self.pools).finish()
    }
}

impl Gateway {
    /// A gateway over the fleet's workers, serving one model (`config.model_id`,
    /// the default pool) with `policy`.
    pub fn new(
        config: GatewayConfig,
        fleet: Arc<Fleet>,
        policy: Arc<dyn Policy>,
        index: Option<Arc<KvIndex>>,
        renderer: Arc<Renderer>,
    ) -> Self {
        Self {
            budget: admission::Budget::new(config.max_request_memory),
            queue: admission::Queue::default(),
            rate: config.rate_limit.map(admission::TokenBucket::per_second),
            tenant_limiter: config.tenant_limits.clone().map(pipeline::tenant_limits::TenantLimiter::new),
            jwt: config.jwt.clone().map(jwt::JwtVerifier::new),
            scheduler: config
                .scheduler
                .clone()
                .map(|s| Arc::new(pipeline::scheduler::Scheduler::new(s, config.max_concurrent))),
            metrics: GatewayMetrics::new(&config.duration_buckets),
            render_slots: tokio::sync::Semaphore::new(config.render_threads.max(1)),
            credit_lock: std::sync::Mutex::new(()),
            connections: Arc::new(tokio::sync::Semaphore::new(config.limits.max_connections.max(1))),
            worker_auth: config.worker_api_key.as_deref().and_then(fleet::bearer),
            upstream_tls: tls::WorkerConnectors::new(fleet.tls().config()),
            control_keys: auth::Keys::new(&config.control_plane_keys),
            client_keys: auth::Keys::new(&config.client_keys),
            pools: vec![Arc::new(pools::Pool::new(
                router_types::PoolId::default_pool(),
                config.model_id.clone(),
                policy,
                renderer,
                None,
                config.chain_memo_pages,
            ))],
            routing: None,
            shared: config.shared_state.clone().map(|c| shared::Shared::start(c, fleet.clone(), index.clone())),
            config,
            fleet,
            index,
            draining: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            control: std::sync::OnceLock::new(),
            runtimes: Arc::default(),
        }
    }

    /// Hands over the control plane's routes (the `control` crate's), before
    /// the listeners are served; false if they were handed over already.
    pub fn set_control_plane(&self, routes: ControlRoutes) -> bool {
        self.control.set(routes).is_ok()
    }

    /// The same gateway serving `pools`, each request's pool chosen by `selector`'s config
    /// (its pools named by id among `pools`), read from `source` (reloads read it again).
    /// Embedding signals are computed by `embedder`; route ids, feedback and the `bandit`
    /// algorithm by `learning` (shared with the other replicas when the gateway shares state).
    /// `Err` names a pool of the config that `pools` lacks.
    pub fn with_routing(
        mut self,
        pools: Vec<pools::Pool>,
        selector: model_select::Selector,
        source: Option<pools::RoutingSource>,
        embedder: Option<embed::EmbedPool>,
        learning: Arc<pools::feedback::Learning>,
    ) -> Result<Self, String> {
        self.pools = pools.into_iter().map(Arc::new).collect();
        let routing = pools::Routing::new(selector, &self.pools)?;
        if let Some(shared) = &self.shared {
            learning.share(shared.clone());
        }
        self.routing = Some(pools::RoutingSlot::new(routing, source, embedder, learning));
        Ok(self)
    }

    /// The routing config in force, if there is one.
    pub fn routing(&self) -> Option<Arc<pools::Routing>> {
        self.routing.as_ref().map(pools::RoutingSlot::current)
    }

    /// The pool of requests that name none: the only one without a routing config.
    pub fn default_pool(&self) -> Arc<pools::Pool> {
        self.routing().map_or_else(|| self.pools[0].clone(), |r| r.default_pool().clone())
    }

    /// What the plan phase reads beside a pool: the fleet, the request's snapshot of its
    /// workers (`workers`, taken once per request), the index, the credit lock.
    pub(crate) fn planner<'a>(&'a self, workers: &'a [Arc<fleet::Worker>]) -> planner::Planner<'a> {
        planner::Planner {
            fleet: &self.fleet,
            workers,
            index: self.index.as_deref(),
            credit_pending: self.config.credit_pending,
            credit_lock: &self.credit_lock,
            counts: &self.metrics.prompts,
            only: None,
            placements: self.shared.as_deref().map(|s| s as &dyn planner::Placements),
            at_ms: millis_since_start(),
        }
    }

    /// Whether any request may go to a prefill/decode pair (a disaggregated pool).
    pub fn disaggregated(&self) -> bool {
        self.pools.iter().any(|p| p.pd.is_some())
    }

    /// The same gateway with its default pool disaggregated (the CLI's disaggregation): every
    /// request goes to a prefill/decode pair, the pool's policy choosing the prefill worker.
    /// Called as it is built, before the pool is shared.
    pub fn with_pd(mut self, pd: pd::PdConfig) -> Self {
        let pool = self.pools.first_mut().and_then(Arc::get_mut);
        pool.expect("the default pool is not shared while the gateway is built").pd = Some(Arc::new(pd));
        self
    }

    /// Large renders running now.
    pub fn render_slots_busy(&self) -> usize {
        self.config.render_threads.max(1) - self.render_slots.available_permits()
    }

    /// Requests being served now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Checks and normalizes a worker base URL (see [`WorkerUrl::parse`]).
pub fn check_worker_url(url: &str) -> Result<WorkerUrl, String> {
    WorkerUrl::parse(url).map_err(|e| e.to_string())
}

/// Checks that a disaggregated pool's workers (its `prefill` and `decode` URLs) speak one
/// protocol: a pair of one gRPC and one HTTP worker cannot meet (each engine's leg is sent
/// the other's way).
pub fn check_pd_protocols<'a>(
    prefill: impl IntoIterator<Item = &'a WorkerUrl>,
    decode: impl IntoIterator<Item = &'a WorkerUrl>,
) -> Result<(), String> {
    let mut all = prefill.into_iter().chain(decode);
    let Some(first) = all.next() else { return Ok(()) };
    let grpc = |u: &WorkerUrl| u.as_str().starts_with("grpc://");
    match all.find(|u| grpc(u) != grpc(first)) {
        Some(other) => {
            Err(format!("a disaggregated pool's workers speak one protocol, gRPC or HTTP: {first} and {other} do not"))
        }
        None => Ok(()),
    }
}
