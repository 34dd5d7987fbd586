//! What the router is built from: the typed [`AppConfig`] and the setups it
//! holds (policy, pools, disaggregation, discovery, embedding). Plain data:
//! the binary fills it from the command line, tests fill it directly, and
//! [`crate::app::App::build`] reads it. Nothing here validates flags or
//! builds anything.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fleet::EventsConfig;
use gateway::pd::PdMode;
use policy::{ApproxTreeConfig, CacheAwareConfig, ExpectedWait, HeadHashConfig, LoadMetric, MinTtftConfig};
use router_types::{Bootstrap, WorkerUrl};

/// The selection policy and its knobs.
#[derive(Debug, Clone)]
pub enum PolicyConfig {
    /// Next in turn.
    RoundRobin,
    /// Uniform.
    Random,
    /// Less loaded of two, compared by the metric (expected waits by the model).
    PowerOfTwo(LoadMetric, ExpectedWait),
    /// The least expected wait.
    LeastLoad(ExpectedWait),
    /// Sticky by `x-smg-routing-key`, random without it.
    Manual,
    /// Approximate text tree (no KV events), trimmed every interval.
    ApproxTree(ApproxTreeConfig),
    /// KV-event cache-aware, with a text tree (trimmed every interval) or a head map
    /// (`--cache-index hash`) for the workers whose events are not followed.
    CacheAware(CacheAwareConfig, Unfollowed),
    /// Estimated time to first token (cache hits from KV events when followed).
    MinTtft(MinTtftConfig),
}

impl PolicyConfig {
    /// cache_aware with every default (its text tree trimmed every minute).
    pub fn cache_aware() -> Self {
        PolicyConfig::CacheAware(CacheAwareConfig::default(), Unfollowed::Tree(ApproxTreeConfig::default()))
    }

    /// power_of_two with every default (expected waits, SMG's model parameters).
    pub fn power_of_two() -> Self {
        PolicyConfig::PowerOfTwo(LoadMetric::default(), ExpectedWait::default())
    }

    /// least_load with every default (SMG's model parameters).
    pub fn least_load() -> Self {
        PolicyConfig::LeastLoad(ExpectedWait::default())
    }
}

/// How cache_aware judges the workers whose KV events it does not follow (`--cache-index`).
#[derive(Debug, Clone)]
pub enum Unfollowed {
    /// A tree of the text this router sent each (`tree`, the default).
    Tree(ApproxTreeConfig),
    /// The placements of the requests' heads at the cache boundaries (`hash`).
    Heads(HeadHashConfig),
}

/// Everything the router needs to start.
#[derive(Debug, Clone)]
pub struct AppConfig {
    /// Where to listen.
    pub listen: SocketAddr,
    /// The workers (more are added by `mock_workers`).
    pub workers: Vec<WorkerUrl>,
    /// Prefill/decode disaggregation, when on (its workers are its own).
    pub pd: Option<PdSetup>,
    /// Start this many simulated engines in-process and route to them.
    pub mock_workers: usize,
    /// The policy.
    pub policy: PolicyConfig,
    /// Model pools and the decisions between them (`--routing-config`); none: one pool.
    pub routing: Option<RoutingSetup>,
    /// The embedding model for embedding signals (`--embedding-model-path`).
    pub embedding: Option<EmbeddingSetup>,
    /// One pool per model the workers serve, read from their `/v1/models` at start (`--enable-igw`).
    pub igw: bool,
    /// Follow the workers' KV events.
    pub kv_events: Option<EventsConfig>,
    /// Model directory; the built-in byte-level model if absent.
    pub tokenizer_path: Option<PathBuf>,
    /// Chat template override.
    pub chat_template: Option<PathBuf>,
    /// The engine the workers run: whose conversions the renderers mirror.
    pub backend: renderer::anthropic::Backend,
    /// Model id reported by `/v1/models`.
    pub model_id: String,
    /// Pending-prefix TTL (cache_aware; zero: off).
    pub pending_ttl: Duration,
    /// Upper bound on index nodes.
    pub max_index_nodes: Option<NonZeroUsize>,
    /// Page digests each pool's page-hash memo keeps.
    pub chain_memo_pages: usize,
    /// Bounds of every tokenizer's caches (the router's and the pools').
    pub tokenizer_caches: renderer::CacheBounds,
    /// Route ids, feedback and its state file (with a routing config).
    pub feedback: gateway::pools::feedback::FeedbackConfig,
    /// Gateway limits.
    pub max_body_bytes: usize,
    /// ...
    pub request_timeout: Duration,
    /// ...
    pub max_concurrent: usize,
    /// The workers' health probes.
    pub health: fleet::HealthConfig,
    /// Every worker's circuit breaker.
    pub breaker: fleet::BreakerConfig,
    /// Retries of requests whose answer has not started.
    pub retry: gateway::RetryConfig,
    /// Requests that may wait for a slot (0: refused at once).
    pub queue_size: usize,
    /// Longest wait for a slot.
    pub queue_timeout: Duration,
    /// Bounds of the latency histograms (seconds).
    pub duration_buckets: Vec<f64>,
    /// Requests admitted per second on average (none: no limit).
    pub rate_limit: Option<u32>,
    /// Headers a client's request id is read from, in order.
    pub request_id_headers: Vec<String>,
    /// Browser origins allowed (CORS).
    pub cors: gateway::pipeline::context::Cors,
    /// Balance requests over each worker's data-parallel ranks by their loads.
    pub dp_aware: bool,
    /// Which workers are told the rank a request is for (`--dp-rank-header`).
    pub rank_header: fleet::RankHeader,
    /// Serve HTTPS with this configuration (the client and admin listeners).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// TLS towards `https://` workers: roots and client identity.
    pub worker_tls: fleet::WorkerTls,
    /// Serve the probes on this address too, on a runtime of their own (`--health-check-port`).
    pub probe_listen: Option<SocketAddr>,
    /// Serve `/metrics` without a key on this address too (`--prometheus-port`).
    pub metrics_listen: Option<SocketAddr>,
    /// Serve as an endpoint picker (`ext_proc`, `grpc.health.v1`) on this address (`--epp-port`).
    pub epp_listen: Option<SocketAddr>,
    /// The endpoint picker's settings.
    pub epp: gateway::epp::EppConfig,
    /// Period of polling the workers' own load reports (zero: off).
    pub load_poll: Duration,
    /// The liveness vetoes and worker overload protection.
    pub liveness: fleet::liveness::LivenessConfig,
    /// The priority scheduler (none: one queue for all).
    pub scheduler: Option<gateway::pipeline::scheduler::SchedulerConfig>,
    /// Who a request's tenant is.
    pub tenants: gateway::pipeline::scheduler::Tenants,
    /// JWT/OIDC tokens on the control plane (none: keys only).
    pub jwt: Option<gateway::jwt::JwtConfig>,
    /// Log every control-plane request (target `audit`).
    pub audit: bool,
    /// How long a pooled worker connection may have been idle to be reused (`Duration::MAX`: until
    /// the pools' sweep).
    pub upstream_pool_idle: Duration,
    /// HTTP/2 to the cleartext workers that answer it (`--upstream-http2`).
    pub upstream_http2: bool,
    /// Who gets a dispatch's decision record (`--cache-trace*`).
    pub cache_trace: gateway::pipeline::cache_trace::CacheTraceConfig,
    /// The reasoning parser of gRPC workers' answers (`--reasoning-parser`).
    pub reasoning_parser: Option<String>,
    /// The tool-call parser of gRPC workers' answers (`--tool-call-parser`).
    pub tool_call_parser: Option<String>,
    /// Requests' spans exported over OTLP (`--enable-trace`; none: off).
    pub trace: Option<otlp::ExportConfig>,
    /// Headers a routing key is read from after `x-smg-routing-key` (`--routing-key-headers`).
    pub routing_key_headers: Vec<String>,
    /// State shared with the other router replicas (`--shared-state`; none: alone).
    pub shared_state: Option<SharedStateSetup>,
    /// Per-tenant rate limits (none: off).
    pub tenant_limits: Option<gateway::pipeline::tenant_limits::TenantLimitsConfig>,
    /// How long a down worker's index state is kept.
    pub index_retention: Duration,
    /// How long to wait for in-flight requests on shutdown.
    pub shutdown_grace: Duration,
    /// Threads serving requests, each with its own single-threaded runtime and
    /// upstream connections (0: serve on the caller's runtime).
    pub serve_threads: usize,
    /// Serve proxied requests on the gateway's own HTTP/1.1 path (false: through axum and hyper).
    pub fast_proxy: bool,
    /// Bearer token for the workers: the router's own requests, and proxied
    /// requests of clients that presented a client key.
    pub worker_api_key: Option<String>,
    /// Deadlines and caps on client connections (and mid-answer worker silence).
    pub limits: gateway::ClientLimits,
    /// Bearer keys of the control plane (none: closed, 403).
    pub control_plane_keys: Vec<String>,
    /// Bearer keys clients must present on the OpenAI routes (none: open).
    pub client_keys: Vec<String>,
    /// Serve the control plane on this address instead of `listen`.
    pub admin_listen: Option<SocketAddr>,
    /// Bytes of memory the requests in progress may hold (429 past it).
    pub max_request_memory: usize,
    /// Large renders at once, off the serving threads.
    pub render_threads: usize,
    /// Kubernetes discovery (`--service-discovery`).
    pub discovery: Option<DiscoverySetup>,
    /// Peers to catch up from (`--index-peers`, `--index-peer-selector`).
    pub index_peers: Option<crate::peers::PeerSetup>,
    /// How this router serves its own index snapshot to peers.
    pub index_snapshot: gateway::SnapshotServing,
}

/// Kubernetes discovery: where the API server is, and what to watch.
#[derive(Debug, Clone)]
pub struct DiscoverySetup {
    /// The API server.
    pub api: fleet::k8s::api::ApiServer,
    /// Selectors, namespace, port, annotation, pool label (`pools` is filled from the routing config).
    pub config: fleet::k8s::DiscoveryConfig,
}

/// The embedding model and how its pool runs.
#[derive(Debug, Clone)]
pub struct EmbeddingSetup {
    /// The model directory.
    pub model: PathBuf,
    /// Threads, queue, batch, cache, timeout.
    pub pool: embed::PoolConfig,
    /// How the model computes (`--embedding-precision`).
    pub precision: embed::Precision,
}

/// Where the routing config comes from.
#[derive(Debug, Clone)]
pub enum RoutingOrigin {
    /// A file.
    File(PathBuf),
    /// A `RoutingConfig` resource on the Kubernetes API server, as read at start.
    Resource(crate::routing_resource::Followed),
}

/// Model pools from a routing config, checked.
#[derive(Debug, Clone)]
pub struct RoutingSetup {
    /// The config (compiled into the gateway's selector).
    pub config: model_select::Config,
    /// Where it was read from: a file (SIGHUP and `POST /routing/reload` read it again) or a
    /// `RoutingConfig` resource (followed: `App` applies its changes).
    pub source: Option<RoutingOrigin>,
    /// Its pools, in the config's order.
    pub pools: Vec<PoolSetup>,
}

/// One pool to build.
#[derive(Debug, Clone)]
pub struct PoolSetup {
    /// Its name.
    pub name: String,
    /// The model its engines serve.
    pub served_model: String,
    /// Its workers (`mock_workers` adds that many simulated engines serving `served_model`).
    pub workers: Vec<WorkerUrl>,
    /// Its policy.
    pub policy: PolicyConfig,
    /// Its model directory (the router's `tokenizer_path` when none).
    pub tokenizer_path: Option<PathBuf>,
    /// Its chat template (the router's `chat_template` when none).
    pub chat_template: Option<PathBuf>,
    /// Its context window.
    pub context_window: Option<u64>,
    /// Its prefill/decode disaggregation (its workers are then `pd`'s, not `workers`).
    pub pd: Option<PoolPd>,
}

/// A disaggregated pool's contract, legs and decode policy (the CLI's
/// disaggregation, per pool; `policy` chooses its prefill worker).
#[derive(Debug, Clone)]
pub struct PoolPd {
    /// The engines' contract.
    pub mode: PdMode,
    /// vLLM's connector.
    pub connector: gateway::pd::KvConnector,
    /// Prefill workers and their bootstrap ports.
    pub prefill: Vec<(WorkerUrl, Bootstrap)>,
    /// Decode workers.
    pub decode: Vec<WorkerUrl>,
    /// Chooses the decode worker.
    pub decode_policy: PolicyConfig,
}

/// Prefill/decode disaggregation: its workers and policies.
#[derive(Debug, Clone)]
pub struct PdSetup {
    /// The engines' contract.
    pub mode: PdMode,
    /// Prefill workers and their bootstrap ports.
    pub prefill: Vec<(WorkerUrl, Bootstrap)>,
    /// Decode workers.
    pub decode: Vec<WorkerUrl>,
    /// Chooses the prefill worker.
    pub prefill_policy: PolicyConfig,
    /// Chooses the decode worker (by load: decode candidates hold no prefix).
    pub decode_policy: PolicyConfig,
    /// Simulated prefill engines to start in-process.
    pub mock_prefill: usize,
    /// Simulated decode engines to start in-process.
    pub mock_decode: usize,
    /// vLLM's KV connector.
    pub connector: gateway::pd::KvConnector,
    /// When a request skips its prefill leg (vLLM only).
    pub skip_prefill: gateway::pd::SkipPrefill,
}

/// The shared-state backend to start (`--shared-state`), and its keys' prefix.
#[derive(Debug, Clone)]
pub struct SharedStateSetup {
    /// Where it is.
    pub target: shared_state::Target,
    /// Its deadlines and bounds.
    pub options: shared_state::Options,
    /// Every key and channel starts with it.
    pub prefix: String,
    /// This replica's control-plane URL as the others reach it, announced once it has caught
    /// up (`--shared-state-advertise-url`), so a replica starting later catches up from it.
    pub advertise: Option<String>,
}
