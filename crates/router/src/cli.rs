//! The command line: one clap struct, every flag with `long` and `env`, every
//! default a named constant.

use std::num::NonZeroUsize;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

mod cache_trace;
mod control;
mod discovery;
mod epp;
mod liveness;
mod scheduler;
pub(crate) mod shared;
mod smg_only;
#[cfg(test)]
mod smg_options;

pub(crate) use discovery::{DiscoveryFlags, PeerFlags};

/// KV-cache-aware router for SGLang and vLLM engine replicas.
///
/// Without a command, runs the router: an OpenAI-compatible gateway
/// (/v1/chat/completions, /v1/completions, /generate, /v1/models, /health,
/// /liveness, /readiness, and the control plane /metrics, /debug/route, /workers) in front of --worker-urls,
/// sending each request where --policy says. With --policy cache_aware
/// --kv-events it follows the KV events the engines publish and sends each
/// request to the replica already holding its prompt prefix. --mock-workers N
/// starts N simulated engines in-process instead (no GPU): the demo.
///
/// The commands compute exactly the tokens and block hashes the engine
/// computes, and show what the router learns from the engines' events.
#[derive(Debug, Parser)]
#[command(
    name = "sgl-router",
    version,
    about,
    long_about,
    propagate_version = true,
    args_conflicts_with_subcommands = true
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
    /// Without a subcommand: run the router.
    #[command(flatten)]
    pub(crate) serve: ServeArgs,
}

/// The routing policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum PolicyName {
    /// Next worker in turn.
    #[value(name = "round_robin", alias = "round-robin")]
    RoundRobin,
    /// A uniformly random worker.
    #[value(name = "random")]
    Random,
    /// The less loaded of two random workers.
    #[value(name = "power_of_two", alias = "power-of-two")]
    PowerOfTwo,
    /// The least loaded worker.
    #[value(name = "least_load", alias = "least-load")]
    LeastLoad,
    /// Approximate: a tree of the text this router sent where (no KV events needed).
    #[value(name = "approx_tree", alias = "approx-tree")]
    ApproxTree,
    /// KV-event cache-aware: the worker holding the longest prefix, with load guards (needs --kv-events).
    #[value(name = "cache_aware", alias = "cache-aware")]
    CacheAware,
    /// Sticky sessions (SGLang Model Gateway's): a request with `x-smg-routing-key` goes to its
    /// key's worker (rendezvous hashing: it stays there while that worker is healthy), one
    /// without to a random worker. Every policy honours the key.
    #[value(name = "manual")]
    Manual,
    /// Estimated time to first token: the least prefill owed plus this prompt's uncached part, less
    /// --ttft-hit-weight per cached token (cache hits need --kv-events; without, the least work).
    #[value(name = "min_ttft", alias = "min-ttft")]
    MinTtft,
}

/// What power_of_two compares (`--power-of-two-load-metric`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LoadMetricName {
    /// The two draws' expected waits.
    #[value(name = "expected_wait")]
    ExpectedWait,
    /// Their requests in flight, then their prompt tokens owed.
    #[value(name = "requests")]
    Requests,
    /// No draws: the fewest requests of the workers with a load report.
    #[value(name = "least_requests")]
    LeastRequests,
}

/// How cache_aware judges the workers whose KV events it does not follow (`--cache-index`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum CacheIndex {
    /// A tree of the text sent to each.
    Tree,
    /// A TTL'd map of request heads at the cache boundaries.
    Hash,
}

/// SMG's layout of its KV-event index (`--kv-index`): both map onto the one index here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum KvIndexLayout {
    /// One entry per block position.
    Positional,
    /// Chains as runs.
    Chain,
}

/// The router's own flags.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("routing").args(["routing_config", "routing_config_resource"])))]
pub(crate) struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "SGL_ROUTER_HOST", default_value = crate::defaults::HOST)]
    pub(crate) host: String,
    /// Port to listen on.
    #[arg(long, env = "SGL_ROUTER_PORT", default_value_t = crate::defaults::PORT)]
    pub(crate) port: u16,
    /// Base URLs of the engine workers: space or comma separated, or repeated.
    #[arg(long, env = "SGL_ROUTER_WORKER_URLS", num_args = 1.., value_delimiter = ',', value_name = "URL")]
    pub(crate) worker_urls: Vec<String>,
    /// Bearer token for the workers (engines started with `--api-key`): sent on the router's own
    /// requests to them (health, load, discovery) and on proxied requests of clients that
    /// presented a client key, never on an anonymous client's request. Without
    /// --client-api-keys, clients must present this key (as SGLang Model Gateway requires).
    #[arg(long, env = "SGL_ROUTER_API_KEY", hide_env_values = true, value_name = "KEY")]
    pub(crate) api_key: Option<String>,
    /// Bearer keys of the control plane: fleet changes (`POST`/`DELETE /workers`), `GET /workers`,
    /// `/debug/route` and `/metrics` need `Authorization: Bearer KEY` with one of them. Without
    /// any, those routes answer 403 (closed, never open). Space or comma separated, or repeated.
    #[arg(long, env = "SGL_ROUTER_CONTROL_PLANE_API_KEYS", hide_env_values = true, num_args = 1.., value_delimiter = ',', value_name = "KEY")]
    pub(crate) control_plane_api_keys: Vec<String>,
    /// Bearer keys clients must present on the OpenAI routes (`/v1/*`, `/generate`); 401 without
    /// one. Their requests reach the workers with --api-key instead of the client's key. Without
    /// any, the OpenAI routes are open and a client's own `Authorization` passes through.
    #[arg(long, env = "SGL_ROUTER_CLIENT_API_KEYS", hide_env_values = true, num_args = 1.., value_delimiter = ',', value_name = "KEY")]
    pub(crate) client_api_keys: Vec<String>,
    /// Serve the control plane (and the probes) on this port instead of the client port, which
    /// then answers 404 on its routes.
    #[arg(long, env = "SGL_ROUTER_ADMIN_PORT", value_name = "PORT")]
    pub(crate) admin_port: Option<u16>,
    /// Address of the --admin-port listener [default: --host].
    #[arg(long, env = "SGL_ROUTER_ADMIN_HOST", value_name = "HOST", requires = "admin_port")]
    pub(crate) admin_host: Option<String>,
    /// Start simulated engines in-process (no GPU) and route to them: the demo. `N` regular
    /// engines, or `NpMd` (`2p2d`) for N prefill and M decode engines, disaggregated (SGLang's
    /// contract, or vLLM's with --vllm-pd-disaggregation); with a PD flag, `N` is N of each.
    #[arg(long, env = "SGL_ROUTER_MOCK_WORKERS", default_value = "0", value_name = "N|NpMd", value_parser = parse_mock_workers)]
    pub(crate) mock_workers: MockWorkers,
    #[command(flatten)]
    pub(crate) pd: PdFlags,
    #[command(flatten)]
    pub(crate) discovery: DiscoveryFlags,
    #[command(flatten)]
    pub(crate) peers: PeerFlags,
    /// How to pick a worker.
    #[arg(long, env = "SGL_ROUTER_POLICY", value_enum, default_value = "round_robin")]
    pub(crate) policy: PolicyName,
    /// Follow the workers' KV events (discovered from /server_info, or given below).
    #[arg(long, env = "SGL_ROUTER_KV_EVENTS")]
    pub(crate) kv_events: bool,
    #[command(flatten)]
    pub(crate) events: KvEventFlags,
    /// Balance requests over each worker's data-parallel ranks: one that no rank holds a prefix
    /// of goes to the rank with the least prefill queued (the worker's own report per rank from
    /// SGLang's `/v1/loads`, or this router's view, whichever is larger), with the
    /// `X-Data-Parallel-Rank` hint (`routed_dp_rank` on `/generate`).
    #[arg(long, env = "SGL_ROUTER_DP_AWARE")]
    pub(crate) dp_aware: bool,
    /// Which workers are told the data-parallel rank a request is for (`X-Data-Parallel-Rank`,
    /// `routed_dp_rank` on `/generate`): `auto`, a worker known to have several ranks (its
    /// `dp_size`, or events from a rank above 0); `always`, every worker (rank 0 too); `never`.
    #[arg(long, env = "SGL_ROUTER_DP_RANK_HEADER", value_enum, default_value_t = RankHeaderArg::Auto)]
    pub(crate) dp_rank_header: RankHeaderArg,
    /// Model directory (tokenizer.json and chat template) the workers serve; the built-in byte-level model if absent.
    #[arg(long, visible_aliases = ["model-path", "model"], env = "SGL_ROUTER_TOKENIZER_PATH", value_name = "DIR")]
    pub(crate) tokenizer_path: Option<PathBuf>,
    /// Chat template file overriding the model directory's.
    #[arg(long, env = "SGL_ROUTER_CHAT_TEMPLATE_FILE", value_name = "FILE")]
    pub(crate) chat_template: Option<PathBuf>,
    /// Model id reported by /v1/models.
    #[arg(long, env = "SGL_ROUTER_MODEL_ID", default_value = crate::defaults::MODEL_ID)]
    pub(crate) model_id: String,
    /// The engine the workers run (SGLang Model Gateway's option): the router renders an
    /// Anthropic Messages request as that engine converts it to a chat. `openai`, `anthropic`
    /// and `tokenspeed` (SMG's other backends) are refused at start.
    #[arg(long, env = "SGL_ROUTER_BACKEND", value_enum, default_value = "sglang")]
    pub(crate) backend: Backend,
    /// Model pools and the decisions that route `model: "auto"` among them (YAML,
    /// docs/model-routing.md); check one with `sgl-router check-config FILE`. Without it, one
    /// pool serves --model-id from --worker-urls; with it, --worker-urls join the default pool.
    #[arg(long, env = "SGL_ROUTER_ROUTING_CONFIG", value_name = "FILE")]
    pub(crate) routing_config: Option<PathBuf>,
    /// The routing config from a Kubernetes `RoutingConfig` resource
    /// (`router.sglang.ai/v1alpha1`, deploy/crds/routingconfig.yaml) instead of a file:
    /// `[NAMESPACE/]NAME` (the namespace: --service-discovery-namespace, else `default`). Read at
    /// start, within 30 s (the pools are built from it); later changes are applied as a reload is
    /// and their outcome written to its status; a deleted resource keeps the config in force.
    #[arg(long, env = "SGL_ROUTER_ROUTING_CONFIG_RESOURCE", value_name = "[NS/]NAME")]
    pub(crate) routing_config_resource: Option<String>,
    /// Sentence-embedding model directory (sentence-transformers layout: config.json,
    /// model.safetensors, tokenizer.json; all-MiniLM-L6-v2 in docs/model-routing.md) for the
    /// routing config's embedding, domain, jailbreak, complexity and reask signals. Needs a
    /// build with the `embed` feature (`--features embed`; the image and the wheel have it).
    #[arg(long, env = "SGL_ROUTER_EMBEDDING_MODEL_PATH", value_name = "DIR", requires = "routing")]
    pub(crate) embedding_model_path: Option<PathBuf>,
    /// Threads the embedding model computes on (off the serving threads).
    #[arg(long, env = "SGL_ROUTER_EMBEDDING_THREADS", default_value_t = 1, value_name = "N")]
    pub(crate) embedding_threads: usize,
    /// Texts waiting for the embedding model at most; more make their signals fail at once.
    #[arg(long, env = "SGL_ROUTER_EMBEDDING_QUEUE", default_value_t = 64, value_name = "N")]
    pub(crate) embedding_queue: usize,
    /// Texts embedded together at most.
    #[arg(long, env = "SGL_ROUTER_EMBEDDING_BATCH", default_value_t = 8, value_name = "N")]
    pub(crate) embedding_batch: usize,
    /// Embeddings cached by text (0: none).
    #[arg(long, env = "SGL_ROUTER_EMBEDDING_CACHE_ENTRIES", default_value_t = 10_000, value_name = "N")]
    pub(crate) embedding_cache_entries: usize,
    /// How long a request waits for its embedding; past it, its embedding signals fail.
    #[arg(long, env = "SGL_ROUTER_EMBEDDING_TIMEOUT_MS", default_value_t = 2_000, value_name = "MS")]
    pub(crate) embedding_timeout_ms: u64,
    /// How the embedding model computes: `int8` (matrix products in int8, the weights quantized
    /// at load; about 4x faster, cosine to f32 at least 0.997 on MT-Bench and bastioncorpus),
    /// `f32` (the reference), or `auto` (int8 where the CPU has AVX-512 VNNI, else f32).
    #[arg(long, env = "SGL_ROUTER_EMBEDDING_PRECISION", default_value = "auto", value_name = "auto|int8|f32")]
    pub(crate) embedding_precision: embed::Precision,
    /// Feedback: the file what `POST /v1/route/feedback` taught is kept in (loaded at start,
    /// saved while it changes and at shutdown; one per replica) [default: none, kept in memory].
    #[arg(long, env = "SGL_ROUTER_ROUTE_FEEDBACK_STATE", value_name = "FILE", requires = "routing")]
    pub(crate) route_feedback_state: Option<PathBuf>,
    /// Feedback: seconds between two saves of the state file.
    #[arg(long, env = "SGL_ROUTER_ROUTE_FEEDBACK_SAVE_SECS", default_value_t = 60, value_name = "S")]
    pub(crate) route_feedback_save_secs: u64,
    /// Feedback: route ids (`x-route-id`) remembered at most, the oldest forgotten first.
    #[arg(long, env = "SGL_ROUTER_ROUTE_FEEDBACK_ROUTES", default_value_t = 100_000, value_name = "N")]
    pub(crate) route_feedback_routes: usize,
    /// Feedback: how long a route id takes feedback, seconds.
    #[arg(long, env = "SGL_ROUTER_ROUTE_FEEDBACK_TTL_SECS", default_value_t = 3_600, value_name = "S")]
    pub(crate) route_feedback_ttl_secs: u64,
    /// Feedback: (decision, pool) pairs with evidence kept at most, the least recently updated out first.
    #[arg(long, env = "SGL_ROUTER_ROUTE_FEEDBACK_ARMS", default_value_t = 10_000, value_name = "N")]
    pub(crate) route_feedback_arms: usize,
    /// Feedback: how many verdicts a pool's configured `quality` weighs as (the bandit's prior).
    #[arg(long, env = "SGL_ROUTER_ROUTE_FEEDBACK_PRIOR_STRENGTH", default_value_t = 10.0, value_name = "N")]
    pub(crate) route_feedback_prior_strength: f64,
    /// Feedback: bodies one caller (a client key, a pass-through credential's digest, or all
    /// anonymous callers together) sends `POST /v1/route/feedback` a minute; over it, 429 (0: no bound).
    #[arg(long, env = "SGL_ROUTER_ROUTE_FEEDBACK_PER_MINUTE", default_value_t = 120, value_name = "N")]
    pub(crate) route_feedback_per_minute: u32,
    /// Feedback: verdicts and preferences one caller moves one (decision, pool) arm by in an
    /// hour; over it, 429 and the arm unmoved (0: no bound).
    #[arg(long, env = "SGL_ROUTER_ROUTE_FEEDBACK_CALLER_WEIGHT", default_value_t = 100, value_name = "N")]
    pub(crate) route_feedback_caller_weight: u32,
    /// Inference-gateway mode (SGLang Model Gateway's): one model pool per model the workers
    /// serve, each worker's model read from its `GET /v1/models` at start (for up to 30 s); a
    /// request's `model` picks the pool. No auto names: --routing-config gives pools with decisions.
    #[arg(long, env = "SGL_ROUTER_ENABLE_IGW", conflicts_with = "routing")]
    pub(crate) enable_igw: bool,
    /// Threads serving requests, each with its own single-threaded runtime and upstream connections
    /// (0: share the runtime of the background tasks) [default: the number of CPUs].
    #[arg(long, env = "SGL_ROUTER_SERVE_THREADS", value_name = "N")]
    pub(crate) serve_threads: Option<usize>,
    /// Serve proxied requests through axum and hyper instead of the router's own HTTP/1.1 path
    /// (a fallback: the same answers, more latency and CPU per request).
    #[arg(long, env = "SGL_ROUTER_NO_FAST_PROXY")]
    pub(crate) no_fast_proxy: bool,
    /// cache_aware: a worker is a candidate only if it holds this many prompt tokens [default: 1024].
    #[arg(long, env = "SGL_ROUTER_CACHE_AFFINITY_MIN_MATCHED_TOKENS", value_name = "N")]
    pub(crate) cache_affinity_min_matched_tokens: Option<u64>,
    /// cache_aware: keep at least this many candidates [default: 8].
    #[arg(long, env = "SGL_ROUTER_CACHE_CANDIDATES_MIN", value_name = "N")]
    pub(crate) cache_candidates_min: Option<usize>,
    /// cache_aware: or this fraction of the healthy workers [default: 0.05].
    #[arg(long, env = "SGL_ROUTER_CACHE_CANDIDATES_RATIO", value_name = "R")]
    pub(crate) cache_candidates_ratio: Option<f64>,
    /// cache_aware: and at most this many [default: 32].
    #[arg(long, env = "SGL_ROUTER_CACHE_CANDIDATES_MAX", value_name = "N")]
    pub(crate) cache_candidates_max: Option<usize>,
    /// cache_aware: hits within this many tokens of the best count as equal [default: 1024].
    #[arg(long, env = "SGL_ROUTER_CACHE_SWITCH_MARGIN_TOKENS", value_name = "N")]
    pub(crate) cache_switch_margin_tokens: Option<u64>,
    /// cache_aware: the best hit is overloaded if it owes this many more uncached prefill tokens [default: 1024]...
    #[arg(long, env = "SGL_ROUTER_CACHE_PRESSURE_ABS_TOKENS", value_name = "N")]
    pub(crate) cache_pressure_abs_tokens: Option<u64>,
    /// cache_aware: ...and more than this multiple of the alternative's [default: 1.5].
    #[arg(long, env = "SGL_ROUTER_CACHE_PRESSURE_REL", value_name = "R")]
    pub(crate) cache_pressure_rel: Option<f64>,
    /// cache_aware: never move a hit to a less loaded worker.
    #[arg(long, env = "SGL_ROUTER_NO_CACHE_PRESSURE_GUARD")]
    pub(crate) no_cache_pressure_guard: bool,
    /// cache_aware (Shepherd Model Gateway's): rank hits by matched tokens divided by
    /// 1 + D × x, x the prefill a hit owes above the least owed among the hits, per prompt
    /// token, so a backlogged worker's longer hit yields to an idle one's [default: 0.0, off].
    #[arg(long, env = "SGL_ROUTER_OVERLAP_DECAY", value_name = "D")]
    pub(crate) overlap_decay: Option<f64>,
    /// cache_aware (Shepherd Model Gateway's): draw the hit with the softmax of the hits'
    /// min-max normalized scores at this temperature instead of taking the best; larger
    /// spreads more [default: 0.0, the best].
    #[arg(long, env = "SGL_ROUTER_SELECTION_TEMPERATURE", value_name = "T")]
    pub(crate) selection_temperature: Option<f64>,
    /// cache_aware (Shepherd Model Gateway's): when the hottest and the coldest engine's reported
    /// KV-cache usage (0 to 1) differ by more than this, cache affinity gives way to the shortest
    /// queue; engines that report none take no part [default: 1.0, off].
    #[arg(long, env = "SGL_ROUTER_BALANCE_TOKEN_USAGE_THRESHOLD", value_name = "U")]
    pub(crate) balance_token_usage_threshold: Option<f64>,
    /// cache_aware (Shepherd Model Gateway's): the hottest engine, when its reported KV-cache
    /// usage is over this, is left out of the request's choice while another engine can serve
    /// [default: 1.0, off].
    #[arg(long, env = "SGL_ROUTER_OVERLOAD_TOKEN_USAGE_THRESHOLD", value_name = "U")]
    pub(crate) overload_token_usage_threshold: Option<f64>,
    /// least_load and power_of_two (Shepherd Model Gateway's expected-wait model): the seconds
    /// the KV-cache barrier `weight * k / (1 - k)` weighs at an engine's reported usage k
    /// [default: 0.15].
    #[arg(long, env = "SGL_ROUTER_LEAST_LOAD_KV_PRESSURE_WEIGHT", value_name = "SECS")]
    pub(crate) least_load_kv_pressure_weight: Option<f64>,
    /// least_load and power_of_two: the tokens a second an engine drains when it reports no
    /// `gen_throughput` [default: 2000.0].
    #[arg(long, env = "SGL_ROUTER_LEAST_LOAD_DEFAULT_THROUGHPUT", value_name = "TOKENS_PER_SEC")]
    pub(crate) least_load_default_throughput: Option<f64>,
    /// least_load and power_of_two: a prompt's tokens when the router did not count them (no
    /// tokenizer), and a reported waiting request's when its engine reports no token count
    /// [default: 1024].
    #[arg(long, env = "SGL_ROUTER_LEAST_LOAD_MEAN_PREFILL_TOKENS", value_name = "N")]
    pub(crate) least_load_mean_prefill_tokens: Option<u32>,
    /// least_load: leave out a worker whose engine reports this many waiting requests,
    /// counting those sent since its report; every worker at the cap answers 503
    /// [default: 0, no cap].
    #[arg(long, env = "SGL_ROUTER_LEAST_LOAD_MAX_WAITING_REQUESTS", value_name = "N")]
    pub(crate) least_load_max_waiting_requests: Option<u32>,
    /// power_of_two: what the two draws are compared by: expected_wait (the engines' reported
    /// queues, throughput and KV usage, as least_load), requests (requests in flight, then
    /// prompt tokens owed), least_requests (no draws: the fewest requests of the reporting
    /// workers) [default: expected_wait].
    #[arg(long, env = "SGL_ROUTER_POWER_OF_TWO_LOAD_METRIC", value_name = "METRIC")]
    pub(crate) power_of_two_load_metric: Option<LoadMetricName>,
    /// KV index: credit the chosen worker with the request's blocks for this long, so a burst
    /// sharing a cold prefix lands together before the events arrive [default: 0, off].
    #[arg(
        long,
        visible_alias = "selection-accounting-ttl-ms",
        env = "SGL_ROUTER_CACHE_PENDING_PREFIX_TTL_MS",
        value_name = "MS"
    )]
    pub(crate) cache_pending_prefix_ttl_ms: Option<u64>,
    /// Page digests the page-hash memo keeps, per pool (about 64 bytes each: 32 MiB at the
    /// default): a request whose prompt starts like an earlier one reuses the digests of the
    /// shared pages instead of hashing them again. Full, it starts over.
    #[arg(long, env = "SGL_ROUTER_PAGE_HASH_MEMO_PAGES", default_value_t = renderer::DEFAULT_CHAIN_MEMO_PAGES, value_name = "N")]
    pub(crate) page_hash_memo_pages: usize,
    /// Tokenizer: segments (text between special tokens, with their ids) the segment cache keeps,
    /// least recently used out; 0 disables it.
    #[arg(long, visible_alias = "tokenizer-cache-l0-max-entries", env = "SGL_ROUTER_TOKENIZER_CACHE_SEGMENTS", default_value_t = renderer::DEFAULT_SEGMENT_CACHE_ENTRIES, value_name = "N")]
    pub(crate) tokenizer_cache_segments: usize,
    /// Tokenizer: text bytes the segment cache keeps (its ids and nodes come on top, about as much again).
    #[arg(long, visible_alias = "tokenizer-cache-l0-max-memory", env = "SGL_ROUTER_TOKENIZER_CACHE_SEGMENT_BYTES", default_value_t = renderer::DEFAULT_SEGMENT_CACHE_BYTES, value_name = "BYTES")]
    pub(crate) tokenizer_cache_segment_bytes: usize,
    /// Tokenizer: bytes the fast path's word cache keeps (words, their ids and an entry's
    /// overhead); full, it starts over; 0 disables it.
    #[arg(long, visible_alias = "tokenizer-cache-l1-max-memory", env = "SGL_ROUTER_TOKENIZER_CACHE_WORD_BYTES", default_value_t = renderer::DEFAULT_WORD_CACHE_BYTES, value_name = "BYTES")]
    pub(crate) tokenizer_cache_word_bytes: usize,
    /// SGLang Model Gateway's switches for its two tokenizer caches, accepted so its command lines
    /// run: here both caches are always on (size one to 0 to turn it off).
    #[arg(long = "tokenizer-cache-enable-l0", hide_short_help = true)]
    pub(crate) _tokenizer_cache_enable_l0: bool,
    /// See `--tokenizer-cache-enable-l0`.
    #[arg(long = "tokenizer-cache-enable-l1", hide_short_help = true)]
    pub(crate) _tokenizer_cache_enable_l1: bool,
    /// KV index: most blocks the index keeps (least recently used tails go first) [default: unbounded].
    #[arg(long, env = "SGL_ROUTER_MAX_INDEX_BLOCKS", value_name = "N")]
    pub(crate) max_index_blocks: Option<NonZeroUsize>,
    /// min_ttft: credit per cached token, in tokens of prefill, on top of the prefill it saves [default: 4].
    #[arg(long, env = "SGL_ROUTER_TTFT_HIT_WEIGHT", value_name = "W")]
    pub(crate) ttft_hit_weight: Option<f64>,
    /// approx_tree, and cache_aware for workers without KV events: follow the text tree when the
    /// match covers more than this fraction [default: 0.3].
    #[arg(long, visible_aliases = ["cache-threshold", "cache-match-threshold"], env = "SGL_ROUTER_APPROX_CACHE_THRESHOLD", value_name = "R")]
    pub(crate) approx_cache_threshold: Option<f64>,
    /// approx_tree and cache_aware: imbalanced when loads differ by more than this many requests
    /// (then the least loaded worker is chosen) [default: 64]...
    #[arg(long, visible_aliases = ["balance-abs-threshold", "spill-abs-threshold"], env = "SGL_ROUTER_APPROX_BALANCE_ABS", value_name = "N")]
    pub(crate) approx_balance_abs: Option<u32>,
    /// approx_tree and cache_aware: ...and the most loaded has more than this multiple of the least [default: 1.5].
    #[arg(long, visible_aliases = ["balance-rel-threshold", "spill-rel-threshold"], env = "SGL_ROUTER_APPROX_BALANCE_REL", value_name = "R")]
    pub(crate) approx_balance_rel: Option<f64>,
    /// approx_tree (and cache_aware's text tree): accepted for SGLang Model Gateway's command lines; no
    /// periodic trim runs (the tree is trimmed at the insert that takes it over --approx-max-tree-bytes).
    #[arg(
        long,
        visible_alias = "eviction-interval-secs",
        env = "SGL_ROUTER_APPROX_EVICTION_INTERVAL_SECS",
        value_name = "S"
    )]
    pub(crate) approx_eviction_interval_secs: Option<u64>,
    /// approx_tree (and cache_aware's text tree): most bytes the tree holds, its text and its nodes [default: 33554432].
    #[arg(long, visible_alias = "max-tree-size", env = "SGL_ROUTER_APPROX_MAX_TREE_BYTES", value_name = "N")]
    pub(crate) approx_max_tree_bytes: Option<usize>,
    /// approx_tree and cache_aware's text tree: seconds a placement stays routable after its
    /// worker was last sent the text, approximating how long an engine keeps a prefix (SMG's
    /// option); 0: until the tree's bound trims it.
    #[arg(long, env = "SGL_ROUTER_CACHE_TTL_SECS", default_value_t = 180, value_name = "S")]
    pub(crate) cache_ttl_secs: u64,
    /// cache_aware: how the workers whose KV events are not followed are judged (SMG's
    /// option): `tree`, a tree of the text this router sent each; `hash`, a TTL'd map of the
    /// worker each request head (its first tokens at each --cache-boundaries position) was
    /// last sent to, bounded by --approx-max-tree-bytes and aged by --cache-ttl-secs.
    #[arg(long, env = "SGL_ROUTER_CACHE_INDEX", value_enum, default_value_t = CacheIndex::Tree, value_name = "INDEX")]
    pub(crate) cache_index: CacheIndex,
    /// `--cache-index hash`: the token positions at which a request's head is hashed,
    /// comma-separated (SMG's option) [default: every power of two times --block-size, up to 2^20].
    #[arg(long, env = "SGL_ROUTER_CACHE_BOUNDARIES", value_delimiter = ',', value_name = "N,N,...")]
    pub(crate) cache_boundaries: Vec<u32>,
    /// SMG's layout of its KV-event index (`positional` or `chain`): accepted, either way the one
    /// exact index here (block hashes per worker and rank) answers the same matches.
    #[arg(long, env = "SGL_ROUTER_KV_INDEX", value_enum, default_value_t = KvIndexLayout::Positional, value_name = "LAYOUT")]
    pub(crate) kv_index: KvIndexLayout,
    /// Longest a request may wait for the worker's response headers.
    #[arg(long, env = "SGL_ROUTER_REQUEST_TIMEOUT_SECS", default_value_t = crate::defaults::REQUEST_TIMEOUT_SECS, value_name = "S")]
    pub(crate) request_timeout_secs: u64,
    /// Largest request body accepted, in bytes (413 above).
    #[arg(long, visible_alias = "max-payload-size", env = "SGL_ROUTER_MAX_BODY_BYTES", default_value_t = crate::defaults::MAX_BODY_BYTES, value_name = "N")]
    pub(crate) max_body_bytes: usize,
    /// Bytes of memory the requests in progress may hold: each is charged 8 bytes per body byte
    /// (parsed, rendered, tokenized) from admission to its end, and a body over 64 KiB that will
    /// be tokenized 160 more per byte until it is rendered; past it, 429 with Retry-After.
    #[arg(long, env = "SGL_ROUTER_MAX_REQUEST_MEMORY_BYTES", default_value_t = crate::defaults::MAX_REQUEST_MEMORY_BYTES, value_name = "N")]
    pub(crate) max_request_memory_bytes: usize,
    /// Large prompts (over 64 KiB) rendered at once, off the serving threads, so they do not
    /// stall small ones [default: the number of CPUs].
    #[arg(long, env = "SGL_ROUTER_RENDER_THREADS", value_name = "N")]
    pub(crate) render_threads: Option<usize>,
    /// Most requests in flight; past it requests wait in the queue (--queue-size). 0 or less: no
    /// limit (SGLang Model Gateway's -1).
    #[arg(long, env = "SGL_ROUTER_MAX_CONCURRENT_REQUESTS", default_value_t = crate::defaults::MAX_CONCURRENT_REQUESTS, value_name = "N", allow_negative_numbers = true)]
    pub(crate) max_concurrent_requests: i64,
    /// Requests that may wait for a slot when --max-concurrent-requests are in flight (429 past
    /// it; 0: refuse at once).
    #[arg(long, env = "SGL_ROUTER_QUEUE_SIZE", default_value_t = crate::defaults::QUEUE_SIZE, value_name = "N")]
    pub(crate) queue_size: usize,
    /// Requests admitted per second on average (a token bucket holding one second of them);
    /// past it requests wait in the queue like for a slot [default: no limit].
    #[arg(long, env = "SGL_ROUTER_RATE_LIMIT_TOKENS_PER_SECOND", value_name = "N")]
    pub(crate) rate_limit_tokens_per_second: Option<u32>,
    /// Longest a request waits in that queue (408 after).
    #[arg(long, env = "SGL_ROUTER_QUEUE_TIMEOUT_SECS", default_value_t = crate::defaults::QUEUE_TIMEOUT_SECS, value_name = "S")]
    pub(crate) queue_timeout_secs: u64,
    #[command(flatten)]
    pub(crate) retry: RetryFlags,
    #[command(flatten)]
    pub(crate) breaker: BreakerFlags,
    /// Seconds a client may take to send a request's complete head once its first byte arrived
    /// (slow-header clients are closed with 408).
    #[arg(long, visible_alias = "header-read-timeout-secs", env = "SGL_ROUTER_CLIENT_HEADER_TIMEOUT_SECS", default_value_t = crate::defaults::CLIENT_HEADER_TIMEOUT_SECS, value_name = "S")]
    pub(crate) client_header_timeout_secs: u64,
    /// Seconds a client may take to send a request's complete body once its head arrived (408 after).
    #[arg(long, env = "SGL_ROUTER_CLIENT_BODY_TIMEOUT_SECS", default_value_t = crate::defaults::CLIENT_BODY_TIMEOUT_SECS, value_name = "S")]
    pub(crate) client_body_timeout_secs: u64,
    /// Seconds a client may pause mid-body (no byte) before the request is answered 408, within
    /// --client-body-timeout-secs; 0: no pause bound (Shepherd Model Gateway's option; its
    /// default, 300, is beyond the whole body's 60 here).
    #[arg(long, env = "SGL_ROUTER_STREAM_BODY_STALL_TIMEOUT_SECS", default_value_t = crate::defaults::STREAM_BODY_STALL_TIMEOUT_SECS, value_name = "S")]
    pub(crate) stream_body_stall_timeout_secs: u64,
    /// Seconds a keep-alive client connection may stay idle between two requests before it is closed.
    #[arg(long, visible_alias = "idle-connection-timeout-secs", env = "SGL_ROUTER_CLIENT_IDLE_TIMEOUT_SECS", default_value_t = crate::defaults::CLIENT_IDLE_TIMEOUT_SECS, value_name = "S")]
    pub(crate) client_idle_timeout_secs: u64,
    /// Most client connections open at once; past it the router stops accepting until one closes.
    /// Capped to the open-file limit (`ulimit -n`) less a quarter of it (at least 64) kept for
    /// upstream connections and subscribers, shared with the --admin-port listener.
    #[arg(long, env = "SGL_ROUTER_MAX_CONNECTIONS", default_value_t = crate::defaults::MAX_CONNECTIONS, value_name = "N")]
    pub(crate) max_connections: usize,
    /// Seconds a worker may stay silent in the middle of an answer's body before the answer is
    /// ended as a worker failure (the worker leaves rotation).
    #[arg(long, env = "SGL_ROUTER_UPSTREAM_IDLE_TIMEOUT_SECS", default_value_t = crate::defaults::UPSTREAM_IDLE_TIMEOUT_SECS, value_name = "S")]
    pub(crate) upstream_idle_timeout_secs: u64,
    /// Seconds of a worker's silence after which an open event stream gets a keep-alive frame
    /// (an SSE comment; Anthropic's `ping` event on /v1/messages), between events, so an
    /// idle-timeout proxy does not cut a stream waiting on a long prefill; 0: none.
    #[arg(long, env = "SGL_ROUTER_SSE_KEEPALIVE_SECS", default_value_t = 15, value_name = "S")]
    pub(crate) sse_keepalive_secs: u64,
    /// Export each proxied request's span over OTLP/gRPC (SGLang Model Gateway's option): the
    /// client's W3C `traceparent` continued (or a trace started), the worker sent a
    /// `traceparent` naming the router's span, so the engine's spans join the trace.
    #[arg(long, env = "SGL_ROUTER_ENABLE_TRACE")]
    pub(crate) enable_trace: bool,
    /// How gRPC workers' answers separate a reasoning model's thinking from its answer
    /// (`reasoning_content`): deepseek_r1, qwen3 or qwen3_thinking (smg's names). An HTTP
    /// worker's engine parses its own answers.
    #[arg(long, env = "SGL_ROUTER_REASONING_PARSER", value_name = "NAME",
          value_parser = ["deepseek_r1", "qwen3", "qwen3_thinking"])]
    pub(crate) reasoning_parser: Option<String>,
    /// How gRPC workers' chat answers are read for tool calls (`tool_calls`), when the request
    /// offers tools: qwen, qwen2.5 or qwen3 (Qwen and Hermes `<tool_call>` JSON), llama
    /// (Llama 3 JSON), mistral (`[TOOL_CALLS]`), deepseek (DeepSeek V3), pythonic (Llama 4:
    /// `[f(a=1)]`): smg's names. An HTTP worker's engine parses its own answers.
    #[arg(long, env = "SGL_ROUTER_TOOL_CALL_PARSER", value_name = "NAME",
          value_parser = ["qwen", "qwen2.5", "qwen3", "llama", "mistral", "deepseek", "pythonic"])]
    pub(crate) tool_call_parser: Option<String>,
    /// The OpenTelemetry collector's OTLP/gRPC endpoint, `HOST:PORT`, with --enable-trace.
    #[arg(long, env = "SGL_ROUTER_OTLP_TRACES_ENDPOINT", default_value = "localhost:4317", value_name = "HOST:PORT")]
    pub(crate) otlp_traces_endpoint: String,
    /// Headers a request's routing key is read from after `x-smg-routing-key`, in order (SGLang
    /// Model Gateway's option): the first present with a usable value (1 to 256 bytes) names
    /// the worker by rendezvous hashing.
    #[arg(long, num_args = 0.., action = clap::ArgAction::Append, value_name = "HEADER")]
    pub(crate) routing_key_headers: Vec<String>,
    #[command(flatten)]
    pub(crate) health: HealthFlags,
    /// Milliseconds between polls of each worker's own load report (SGLang `/v1/loads`: the
    /// prefill it has queued from every router); 0: route on this router's own view only.
    #[arg(long, env = "SGL_ROUTER_WORKER_LOAD_POLL_MS", default_value_t = crate::defaults::WORKER_LOAD_POLL_MS, value_name = "MS")]
    pub(crate) worker_load_poll_ms: u64,
    #[command(flatten)]
    pub(crate) liveness: liveness::LivenessFlags,
    #[command(flatten)]
    pub(crate) scheduler: scheduler::SchedulerFlags,
    #[command(flatten)]
    pub(crate) control: control::ControlFlags,
    #[command(flatten)]
    pub(crate) epp: epp::EppFlags,
    #[command(flatten)]
    pub(crate) cache_trace: cache_trace::CacheTraceFlags,
    #[command(flatten)]
    pub(crate) shared: shared::SharedStateFlags,
    /// SMG's options this router does not implement: known, judged at start.
    #[command(flatten)]
    pub(crate) smg_only: smg_only::SmgOnlyFlags,
    /// Seconds a worker may stay out of rotation before its KV-index state is
    /// dropped (until then it is kept: a worker that comes back keeps its cache).
    #[arg(long, env = "SGL_ROUTER_WORKER_INDEX_RETENTION_SECS", default_value_t = crate::defaults::WORKER_INDEX_RETENTION_SECS, value_name = "S")]
    pub(crate) worker_index_retention_secs: u64,
    /// Seconds to let in-flight requests finish after SIGTERM.
    #[arg(long, visible_alias = "shutdown-grace-period-secs", env = "SGL_ROUTER_SHUTDOWN_GRACE_SECS", default_value_t = crate::defaults::SHUTDOWN_GRACE_SECS, value_name = "S")]
    pub(crate) shutdown_grace_secs: u64,
    /// Log format on stderr.
    #[arg(long, env = "SGL_ROUTER_LOG_FORMAT", value_enum, default_value = "text")]
    pub(crate) log_format: LogFormat,
    /// The same as `--log-format json` (SGLang Model Gateway's spelling).
    #[arg(long, env = "SGL_ROUTER_LOG_JSON", conflicts_with = "log_format")]
    pub(crate) log_json: bool,
    /// Also write the log to daily files `DIR/sgl-router.YYYY-MM-DD` (UTC), besides stderr.
    #[arg(long, env = "SGL_ROUTER_LOG_DIR", value_name = "DIR")]
    pub(crate) log_dir: Option<PathBuf>,
    /// Headers a client's request id is read from, first found wins; the id (or a new one when
    /// none is sent) goes to the worker and back to the client as `x-request-id`
    /// [default: x-request-id x-correlation-id x-trace-id request-id].
    #[arg(long, env = "SGL_ROUTER_REQUEST_ID_HEADERS", num_args = 1.., value_delimiter = ',', value_name = "HEADER")]
    pub(crate) request_id_headers: Vec<String>,
    /// Origins a browser page may call the router from (`*`: any); preflights are answered.
    /// Without it, no CORS headers are sent.
    #[arg(long, env = "SGL_ROUTER_CORS_ALLOWED_ORIGINS", num_args = 1.., value_delimiter = ',', value_name = "ORIGIN")]
    pub(crate) cors_allowed_origins: Vec<String>,
    /// Serve HTTPS: the certificate chain (PEM) of the client and admin listeners.
    #[arg(long, env = "SGL_ROUTER_TLS_CERT_PATH", value_name = "FILE", requires = "tls_key_path")]
    pub(crate) tls_cert_path: Option<PathBuf>,
    /// Serve HTTPS: the private key (PEM) of --tls-cert-path.
    #[arg(long, env = "SGL_ROUTER_TLS_KEY_PATH", value_name = "FILE", requires = "tls_cert_path")]
    pub(crate) tls_key_path: Option<PathBuf>,
    /// CA certificates (PEM) trusted for `https://` workers, besides the system's roots.
    #[arg(long, env = "SGL_ROUTER_CA_CERT_PATHS", num_args = 1.., value_delimiter = ',', value_name = "FILE")]
    pub(crate) ca_cert_paths: Vec<PathBuf>,
    /// Client certificate (PEM) presented to `https://` workers (mutual TLS).
    #[arg(long, env = "SGL_ROUTER_CLIENT_CERT_PATH", value_name = "FILE", requires = "client_key_path")]
    pub(crate) client_cert_path: Option<PathBuf>,
    /// Private key (PEM) of --client-cert-path.
    #[arg(long, env = "SGL_ROUTER_CLIENT_KEY_PATH", value_name = "FILE", requires = "client_cert_path")]
    pub(crate) client_key_path: Option<PathBuf>,
    /// Also serve `/metrics` on this port, without a key (for a Prometheus scraper on a private
    /// network); `/metrics` on the main port stays behind the control-plane keys.
    #[arg(long, env = "SGL_ROUTER_PROMETHEUS_PORT", value_name = "PORT")]
    pub(crate) prometheus_port: Option<u16>,
    /// Address of the --prometheus-port listener.
    #[arg(long, env = "SGL_ROUTER_PROMETHEUS_HOST", default_value = crate::defaults::HOST, value_name = "HOST", requires = "prometheus_port")]
    pub(crate) prometheus_host: String,
    /// Log level (error, warn, info, debug, trace); `RUST_LOG`, when set, wins.
    #[arg(long, env = "SGL_ROUTER_LOG_LEVEL", default_value = crate::defaults::LOG_LEVEL, value_name = "LEVEL")]
    pub(crate) log_level: String,
    /// Bounds of the latency histograms, in seconds, space or comma separated
    /// [default: 0.0005 0.001 0.0025 0.005 0.01 0.025 0.05 0.1 0.25 0.5 1 2.5 10 60].
    #[arg(long, env = "SGL_ROUTER_PROMETHEUS_DURATION_BUCKETS", num_args = 1.., value_delimiter = ',', value_name = "S")]
    pub(crate) prometheus_duration_buckets: Vec<f64>,
}

/// The simulated engines to start (`--mock-workers`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct MockWorkers {
    /// Regular engines, or prefill engines in the `NpMd` form.
    pub(crate) n: usize,
    /// Decode engines (`NpMd`), or `None` for the plain form.
    pub(crate) decode: Option<usize>,
}

fn parse_mock_workers(s: &str) -> Result<MockWorkers, String> {
    let s = s.trim().to_ascii_lowercase();
    let bad = || format!("{s:?}: a count (4) or prefill and decode counts (2p2d)");
    match s.split_once('p') {
        None => Ok(MockWorkers { n: s.parse().map_err(|_| bad())?, decode: None }),
        Some((p, d)) => {
            let d = d.strip_suffix('d').ok_or_else(bad)?;
            Ok(MockWorkers { n: p.parse().map_err(|_| bad())?, decode: Some(d.parse().map_err(|_| bad())?) })
        }
    }
}

/// Prefill/decode disaggregation (SGLang Model Gateway's and vllm-router's flags).
#[derive(Debug, Args)]
pub(crate) struct PdFlags {
    /// Disaggregated SGLang workers: every request goes to a --prefill and a --decode worker at
    /// once, one body with `bootstrap_host`, `bootstrap_port` and a fresh `bootstrap_room`.
    #[arg(long, env = "SGL_ROUTER_PD_DISAGGREGATION", conflicts_with = "vllm_pd_disaggregation")]
    pub(crate) pd_disaggregation: bool,
    /// Disaggregated vLLM workers (NIXL): a --prefill worker first (one token, keeping the KV),
    /// then a --decode worker with its `kv_transfer_params`.
    #[arg(long, env = "SGL_ROUTER_VLLM_PD_DISAGGREGATION")]
    pub(crate) vllm_pd_disaggregation: bool,
    /// A prefill worker, and its bootstrap port: a number, `none` (sent as null: each engine
    /// uses its own configured port), or omitted (read from its /server_info
    /// `disaggregation_bootstrap_port`, else none). Repeat for more.
    #[arg(long, num_args = 1..=2, action = clap::ArgAction::Append, value_names = ["URL", "BOOTSTRAP_PORT"])]
    pub(crate) prefill: Vec<String>,
    /// A decode worker. Repeat for more (or space or comma separated).
    #[arg(long, num_args = 1.., value_delimiter = ',', action = clap::ArgAction::Append, value_name = "URL")]
    pub(crate) decode: Vec<String>,
    /// How to pick the prefill worker [default: --policy]. cache_aware and min_ttft use the
    /// prefill workers' KV events.
    #[arg(long, env = "SGL_ROUTER_PREFILL_POLICY", value_enum)]
    pub(crate) prefill_policy: Option<PolicyName>,
    /// How to pick the decode worker [default: --policy]. Decode workers are chosen by load
    /// whatever the policy: their KV comes from the prefill, so none holds a prefix.
    #[arg(long, env = "SGL_ROUTER_DECODE_POLICY", value_enum)]
    pub(crate) decode_policy: Option<PolicyName>,
    /// vLLM's KV connector [default: nixl]: `nixl` (NixlConnector: prefill, then decode with its
    /// params; both at once once a prefill reports push mode) or `mooncake` (MooncakeConnector:
    /// both at once, linked by a router-made `transfer_id`; the prefill's engine id is read from
    /// its bootstrap server's `GET /query` on the --prefill bootstrap port, default 8998).
    #[arg(long, env = "SGL_ROUTER_KV_CONNECTOR", value_parser = ["nixl", "mooncake", "moriio"])]
    pub(crate) kv_connector: Option<String>,
    /// vLLM: a request with fewer prompt tokens than this not cached on its decode worker (a
    /// short prompt, or one the decode worker mostly holds, by its KV events) skips the prefill
    /// leg: the decode worker serves it alone and prefills locally. 0: never.
    #[arg(long, env = "SGL_ROUTER_PD_SKIP_PREFILL_UNCACHED_TOKENS", default_value_t = 0, value_name = "N")]
    pub(crate) pd_skip_prefill_uncached_tokens: u64,
    /// vLLM: a request of which the decode worker holds at least this share of the prompt (0..1)
    /// skips the prefill leg, as above. 0: never.
    #[arg(long, env = "SGL_ROUTER_PD_SKIP_PREFILL_CACHED_FRACTION", default_value_t = 0.0, value_name = "F")]
    pub(crate) pd_skip_prefill_cached_fraction: f64,
}

/// Retries (SGLang Model Gateway's names and defaults).
#[derive(Debug, Args)]
pub(crate) struct RetryFlags {
    /// Attempts in all (the first included, as SGLang Model Gateway counts) of a request whose
    /// worker could not be reached or answered 408, 429, 500, 502, 503 or 504 (never once a byte
    /// of the answer reached the client).
    #[arg(long, env = "SGL_ROUTER_RETRY_MAX_RETRIES", default_value_t = crate::defaults::RETRY_MAX_RETRIES, value_name = "N")]
    pub(crate) retry_max_retries: u32,
    /// Wait before the first retry.
    #[arg(long, env = "SGL_ROUTER_RETRY_INITIAL_BACKOFF_MS", default_value_t = crate::defaults::RETRY_INITIAL_BACKOFF_MS, value_name = "MS")]
    pub(crate) retry_initial_backoff_ms: u64,
    /// Longest wait between two attempts.
    #[arg(long, env = "SGL_ROUTER_RETRY_MAX_BACKOFF_MS", default_value_t = crate::defaults::RETRY_MAX_BACKOFF_MS, value_name = "MS")]
    pub(crate) retry_max_backoff_ms: u64,
    /// Each wait is the one before times this.
    #[arg(long, env = "SGL_ROUTER_RETRY_BACKOFF_MULTIPLIER", default_value_t = crate::defaults::RETRY_BACKOFF_MULTIPLIER, value_name = "X")]
    pub(crate) retry_backoff_multiplier: f64,
    /// Each wait moves by up to this fraction of it, at random.
    #[arg(long, env = "SGL_ROUTER_RETRY_JITTER_FACTOR", default_value_t = crate::defaults::RETRY_JITTER_FACTOR, value_name = "R")]
    pub(crate) retry_jitter_factor: f64,
    /// Send every request once.
    #[arg(long, env = "SGL_ROUTER_DISABLE_RETRIES")]
    pub(crate) disable_retries: bool,
}

/// The per-worker circuit breaker (SGLang Model Gateway's names and defaults).
#[derive(Debug, Args)]
pub(crate) struct BreakerFlags {
    /// Failures in a row (unreachable, timed out, died mid-answer, 5xx) that open a worker's
    /// breaker: out of rotation.
    #[arg(long, env = "SGL_ROUTER_CB_FAILURE_THRESHOLD", default_value_t = crate::defaults::CB_FAILURE_THRESHOLD, value_name = "N")]
    pub(crate) cb_failure_threshold: u32,
    /// Successes in a row, half-open, that close it again.
    #[arg(long, env = "SGL_ROUTER_CB_SUCCESS_THRESHOLD", default_value_t = crate::defaults::CB_SUCCESS_THRESHOLD, value_name = "N")]
    pub(crate) cb_success_threshold: u32,
    /// Seconds an open breaker waits before letting requests through on trial (half-open).
    #[arg(long, env = "SGL_ROUTER_CB_TIMEOUT_DURATION_SECS", default_value_t = crate::defaults::CB_TIMEOUT_DURATION_SECS, value_name = "S")]
    pub(crate) cb_timeout_duration_secs: u64,
    /// Failures in a row count only within this many seconds of the first of them.
    #[arg(long, env = "SGL_ROUTER_CB_WINDOW_DURATION_SECS", default_value_t = crate::defaults::CB_WINDOW_DURATION_SECS, value_name = "S")]
    pub(crate) cb_window_duration_secs: u64,
    /// Never open a breaker (failed requests still quarantine an unreachable worker).
    #[arg(long, env = "SGL_ROUTER_DISABLE_CIRCUIT_BREAKER")]
    pub(crate) disable_circuit_breaker: bool,
}

/// The workers' health probes (SGLang Model Gateway's names).
#[derive(Debug, Args)]
pub(crate) struct HealthFlags {
    /// Seconds between two health checks of every worker (one out of rotation: every second).
    #[arg(long, env = "SGL_ROUTER_HEALTH_CHECK_INTERVAL_SECS", default_value_t = crate::defaults::HEALTH_CHECK_INTERVAL_SECS, value_name = "S")]
    pub(crate) health_check_interval_secs: u64,
    /// Seconds a probe may take (slower is a failure).
    #[arg(long, env = "SGL_ROUTER_HEALTH_CHECK_TIMEOUT_SECS", default_value_t = crate::defaults::HEALTH_CHECK_TIMEOUT_SECS, value_name = "S")]
    pub(crate) health_check_timeout_secs: u64,
    /// Path probed on every worker.
    #[arg(long, env = "SGL_ROUTER_HEALTH_CHECK_ENDPOINT", default_value = crate::defaults::HEALTH_CHECK_ENDPOINT, value_name = "PATH")]
    pub(crate) health_check_endpoint: String,
    /// Failed probes in a row that take a worker out of rotation.
    #[arg(long, env = "SGL_ROUTER_HEALTH_FAILURE_THRESHOLD", default_value_t = crate::defaults::HEALTH_FAILURE_THRESHOLD, value_name = "N")]
    pub(crate) health_failure_threshold: u32,
    /// Good probes in a row that bring it back (a worker's first probe decides at once).
    #[arg(long, env = "SGL_ROUTER_HEALTH_SUCCESS_THRESHOLD", default_value_t = crate::defaults::HEALTH_SUCCESS_THRESHOLD, value_name = "N")]
    pub(crate) health_success_threshold: u32,
    /// No probes: every worker is in rotation once discovered (failed requests still take it out).
    #[arg(long, env = "SGL_ROUTER_DISABLE_HEALTH_CHECK")]
    pub(crate) disable_health_check: bool,
    /// A worker that was in rotation and fails --health-failure-threshold probes in a row leaves
    /// the fleet (a discovered one comes back when discovery sees its pod again); without it a
    /// worker out of rotation is kept and probed every second until it is back.
    #[arg(
        long,
        visible_alias = "worker-auto-recovery",
        env = "SGL_ROUTER_REMOVE_UNHEALTHY_WORKERS",
        overrides_with = "no_remove_unhealthy_workers"
    )]
    pub(crate) remove_unhealthy_workers: bool,
    /// The default: workers out of rotation are kept and probed (SMG's spelling).
    #[arg(long, visible_alias = "no-worker-auto-recovery", overrides_with = "remove_unhealthy_workers")]
    pub(crate) no_remove_unhealthy_workers: bool,
}

/// The workers' engine (`--backend`, SMG's spellings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Backend {
    Sglang,
    Vllm,
    /// SMG: OpenAI-compatible cloud backends (refused here).
    Openai,
    /// SMG: Anthropic's cloud (refused here).
    Anthropic,
    /// SMG: TokenSpeed engines over ZMQ (refused here).
    Tokenspeed,
}

/// `--dp-rank-header`'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum RankHeaderArg {
    Auto,
    Always,
    Never,
}

impl From<RankHeaderArg> for fleet::RankHeader {
    fn from(a: RankHeaderArg) -> Self {
        match a {
            RankHeaderArg::Auto => fleet::RankHeader::Auto,
            RankHeaderArg::Always => fleet::RankHeader::Always,
            RankHeaderArg::Never => fleet::RankHeader::Never,
        }
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Print the SGLang block hashes of a JSON array of token ids.
    ///
    /// Reads `[1, 2, 3, ...]` from --tokens-file or stdin and prints the JSON
    /// array of signed 64-bit block hashes, one per page (the last page may be
    /// partial), exactly as SGLang publishes them in `BlockStored` events.
    Hash(HashArgs),
    /// Render an OpenAI chat request to prompt text, token ids and block hashes.
    ///
    /// Reads a `/v1/chat/completions` body from --request or stdin, applies the
    /// model's chat template as HF transformers does, tokenizes the text with
    /// `add_special_tokens = false`, and prints one JSON object
    /// `{"text": ..., "token_ids": [...], "block_hashes": [...]}` (hashes only
    /// with --page-size).
    Render(RenderArgs),
    /// Follow the workers' KV events and print what the router learns from them.
    ///
    /// Finds each worker's publishers (from SGLang's `/server_info`, or from
    /// --kv-events-endpoint for engines that advertise nothing, like vLLM),
    /// subscribes to every (worker, dp rank), and applies the events to an
    /// index exactly as the router does. Prints one JSON line per interval
    /// (index size, event counters, workers followed or refused) and, with
    /// --metrics, the Prometheus metrics at the end.
    KvEvents(KvEventsArgs),
    /// Check a routing config: print its pools, each decision's signals, pools, algorithm and
    /// plugins, the signals no reachable decision reads, and every problem with its line.
    ///
    /// Exits 0 when the file is valid, 65 when it is not.
    CheckConfig(CheckConfigArgs),
}

#[derive(Debug, Args)]
pub(crate) struct CheckConfigArgs {
    /// The routing config (YAML).
    #[arg(value_name = "FILE")]
    pub(crate) file: PathBuf,
}

/// How to hash pages; shared by `hash` and `render`.
#[derive(Debug, Args)]
pub(crate) struct HashOptions {
    /// Hash the bigram form EAGLE/MTP speculative decoding uses (`n + 1` tokens give `n` positions).
    #[arg(long, env = "SGL_ROUTER_BIGRAM")]
    pub(crate) bigram: bool,
    /// Start the chain from the salt prior `SHA256("sglang-cache-salt-v1\0" ‖ SALT)`, as a request with `cache_salt` does.
    #[arg(long, env = "SGL_ROUTER_CACHE_SALT", value_name = "SALT")]
    pub(crate) cache_salt: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct HashArgs {
    /// Tokens per page: the engine's `--page-size` (SGLang advertises it as `kv_events.block_size`).
    #[arg(long, env = "SGL_ROUTER_PAGE_SIZE", value_name = "N")]
    pub(crate) page_size: NonZeroUsize,
    /// File holding the JSON array of token ids; stdin when absent.
    #[arg(long, env = "SGL_ROUTER_TOKENS_FILE", value_name = "FILE")]
    pub(crate) tokens_file: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) hash: HashOptions,
}

#[derive(Debug, Args)]
pub(crate) struct RenderArgs {
    /// Model directory with `tokenizer.json` and `tokenizer_config.json` or `chat_template.jinja`.
    #[arg(long, env = "SGL_ROUTER_TOKENIZER", value_name = "DIR")]
    pub(crate) tokenizer: PathBuf,
    /// Jinja chat template file; overrides the model directory's template.
    #[arg(long, env = "SGL_ROUTER_CHAT_TEMPLATE", value_name = "FILE")]
    pub(crate) chat_template: Option<PathBuf>,
    /// Also print the block hashes for this page size.
    #[arg(long, env = "SGL_ROUTER_PAGE_SIZE", value_name = "N")]
    pub(crate) page_size: Option<NonZeroUsize>,
    /// File holding the chat-completions request body; stdin when absent.
    #[arg(long, env = "SGL_ROUTER_REQUEST", value_name = "FILE")]
    pub(crate) request: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) hash: HashOptions,
}

/// Where the workers' KV events come from; shared with the server.
#[derive(Debug, Args)]
pub(crate) struct KvEventFlags {
    /// PUB endpoint of a worker that does not advertise one, as WORKER_URL=tcp://HOST:PORT
    /// (dp rank r publishes at PORT + r). Repeatable.
    #[arg(long = "kv-events-endpoint", env = "SGL_ROUTER_KV_EVENTS_ENDPOINT", value_name = "WORKER=ENDPOINT")]
    pub(crate) endpoints: Vec<String>,
    /// Replay (ROUTER) endpoint of such a worker, as WORKER_URL=tcp://HOST:PORT (rank r at PORT + r). Repeatable.
    #[arg(
        long = "kv-events-replay-endpoint",
        env = "SGL_ROUTER_KV_EVENTS_REPLAY_ENDPOINT",
        value_name = "WORKER=ENDPOINT"
    )]
    pub(crate) replay_endpoints: Vec<String>,
    /// Number of dp ranks (publishers) of such a worker, as WORKER_URL=N (default 1). Repeatable.
    #[arg(long = "kv-events-dp-size", env = "SGL_ROUTER_KV_EVENTS_DP_SIZE", value_name = "WORKER=N")]
    pub(crate) dp_sizes: Vec<String>,
    /// Page size of workers that do not advertise one; every followed worker must share one page size.
    #[arg(long = "kv-events-block-size", visible_aliases = ["block-size", "kv-event-block-size"], env = "SGL_ROUTER_KV_EVENTS_BLOCK_SIZE", value_name = "N", default_value_t = crate::defaults::KV_EVENTS_BLOCK_SIZE)]
    pub(crate) block_size: NonZeroUsize,
    /// Topic to subscribe to on explicit endpoints (engines publish with an empty topic by default).
    #[arg(long = "kv-events-topic", env = "SGL_ROUTER_KV_EVENTS_TOPIC", value_name = "TOPIC", default_value = "")]
    pub(crate) topic: String,
    /// Seconds a healthy worker's KV-event subscription may stay without a connection before its
    /// publishers are looked up again (an engine whose publishers moved while its HTTP port stayed).
    #[arg(
        long = "kv-events-rediscover-secs",
        env = "SGL_ROUTER_KV_EVENTS_REDISCOVER_SECS",
        value_name = "S",
        default_value_t = 30
    )]
    pub(crate) rediscover_secs: u64,
}

#[derive(Debug, Args)]
pub(crate) struct KvEventsArgs {
    /// Base URLs of the engine workers: space or comma separated, or repeated.
    #[arg(long, env = "SGL_ROUTER_WORKER_URLS", num_args = 1.., value_delimiter = ',', required = true, value_name = "URL")]
    pub(crate) worker_urls: Vec<String>,
    /// Bearer token for the workers' `/server_info` (engines started with `--api-key`).
    #[arg(long, env = "SGL_ROUTER_API_KEY", hide_env_values = true, value_name = "KEY")]
    pub(crate) api_key: Option<String>,
    #[command(flatten)]
    pub(crate) events: KvEventFlags,
    /// Milliseconds between two printed lines.
    #[arg(long, env = "SGL_ROUTER_INTERVAL_MS", value_name = "MS", default_value_t = crate::defaults::WATCH_INTERVAL_MS)]
    pub(crate) interval_ms: u64,
    /// Stop after this many seconds (default: run until interrupted).
    #[arg(long, env = "SGL_ROUTER_DURATION_SECS", value_name = "SECS")]
    pub(crate) duration_secs: Option<u64>,
    /// Print the Prometheus metrics when stopping.
    #[arg(long, env = "SGL_ROUTER_METRICS")]
    pub(crate) metrics: bool,
}
