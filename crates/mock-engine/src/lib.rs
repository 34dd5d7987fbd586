//! A simulated SGLang-like engine for tests, the demo and benchmarks: the
//! real HTTP API (`/health`, `/server_info`, `/v1/models`,
//! `/v1/chat/completions`, `/v1/completions`, `/generate`, streaming or not),
//! a paged prefix cache per dp rank with capacity and LRU eviction, real KV
//! events over ZMQ in SGLang's format (one publisher and replay socket per
//! rank), a prefill/decode timing model, and fault knobs; with
//! `grpc_listen`, SGLang's gRPC scheduler service too (token ids in and out).
//!
//! `MockEngine::spawn` binds 127.0.0.1:0 and shuts down when dropped.

mod anthropic;
mod cache;
mod engine;
mod events;
mod grpc;
mod grpc_events;
mod grpc_pd;
mod http;
mod legs;
mod pd;
mod reply;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kv_events::{EventForm, PublisherConfig};
use renderer::Renderer;
use tokio_util::sync::CancellationToken;

pub use cache::{CacheChange, PagedCache};
pub use engine::{Engine, EngineError, Faults, Leg, RankLoad};
pub use pd::{DEFAULT_BOOTSTRAP_PORT, Flavor, Pd, PdConfig, PdCounters, PdRole};

/// The largest request body an engine takes by default: the router's own
/// default (`gateway::DEFAULT_MAX_BODY_BYTES`, 5 MiB), so what the router
/// admits an engine does not refuse. Larger bodies are answered 413.
pub const DEFAULT_MAX_BODY_BYTES: usize = 5 << 20;

/// How the simulated engine behaves.
#[derive(Debug, Clone)]
pub struct MockEngineConfig {
    /// Address to serve HTTP on (`127.0.0.1:0`: any free port).
    pub listen: SocketAddr,
    /// Model id reported by `/v1/models` and in responses.
    pub model_id: String,
    /// Tokens per KV page.
    pub page_size: usize,
    /// KV cache capacity per dp rank, in tokens.
    pub capacity_tokens: usize,
    /// Data-parallel ranks (one cache and one publisher each).
    pub dp_size: usize,
    /// Publish KV events (PUB + replay ROUTER per rank on free loopback ports).
    pub kv_events: bool,
    /// Event layout (SGLang's maps by default).
    pub event_form: EventForm,
    /// Fixed cost of a prefill, before scaling.
    pub prefill_fixed: Duration,
    /// Prefill speed, uncached tokens per second.
    pub prefill_tokens_per_s: f64,
    /// Time per generated token.
    pub decode_per_token: Duration,
    /// All times are divided by this.
    pub speedup: f64,
    /// No sleeping at all (overhead benchmarks).
    pub fast: bool,
    /// Tokens generated when a request does not say.
    pub default_max_tokens: usize,
    /// Require `Authorization: Bearer <key>` on every route but `/health*`,
    /// `/ready*` and `/metrics*`, as SGLang does when started with `--api-key`.
    pub api_key: Option<String>,
    /// Its disaggregated role (regular by default).
    pub pd: PdConfig,
    /// Answer 404 to a request naming another model than `model_id`, as vLLM
    /// does (SGLang serves whatever `model` says: off by default).
    pub strict_model: bool,
    /// Batches each publisher keeps for replay (SGLang's `buffer_steps`, 10,000).
    pub replay_buffer_steps: usize,
    /// Remember every request (its headers and body, the last 256) for
    /// [`Engine::legs`], not only the disaggregated legs.
    pub record_requests: bool,
    /// The logprob of every generated token, reported when a whole chat or completion asks
    /// for logprobs (`logprobs: true`, or a number on completions); [`Engine::set_token_logprob`]
    /// changes it at run time.
    pub token_logprob: f64,
    /// The largest request body taken, in bytes; a larger one is answered 413
    /// (`length limit exceeded`) before the handler runs. Default
    /// [`DEFAULT_MAX_BODY_BYTES`]; tests of a router's own limit set less.
    pub max_body_bytes: usize,
    /// Answer 400 `Invalid request` to any request carrying `X-Data-Parallel-Rank`, as
    /// Dynamo 1.6's frontend does (an engine that advertises no ranks; off by default).
    pub refuse_rank_header: bool,
    /// The model directory its renderer was loaded from, if any: `GetTokenizer` hands over its
    /// tokenizer files (refused without one, as SGLang's servicer does).
    pub tokenizer_dir: Option<std::path::PathBuf>,
    /// Also serve SGLang's gRPC scheduler service (`Generate`, `HealthCheck`, `GetModelInfo`,
    /// `GetServerInfo`, `GetLoads`, `Abort`) here (`127.0.0.1:0`: any free port).
    pub grpc_listen: Option<SocketAddr>,
    /// Which service `grpc_listen` serves: SGLang's scheduler or vLLM's engine (`--grpc`).
    pub grpc_service: engine_grpc::Service,
    /// Also answer HTTP/2 by prior knowledge (h2c) on the HTTP port, as an engine behind an
    /// h2c-speaking server does; off: HTTP/1.1 only, as SGLang's and vLLM's uvicorn.
    pub http2: bool,
    /// Answer HTTP/2 only (h2c by prior knowledge), as an engine behind a server that speaks
    /// nothing else; HTTP/1.1 is refused at the connection.
    pub http2_only: bool,
    /// The text the gRPC service's answers are made of (its first `max_new_tokens` tokens);
    /// none: the HTTP API's words (" the cache is warm and routing works." over and over).
    pub reply_text: Option<String>,
}

/// A running simulated engine. Dropping it stops the server and the publishers.
#[derive(Debug)]
pub struct MockEngine {
    addr: SocketAddr,
    grpc_addr: Option<SocketAddr>,
    engine: Arc<Engine>,
    cancel: CancellationToken,
}

// === impl MockEngineConfig ===

impl Default for MockEngineConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            model_id: "mock-model".into(),
            page_size: 16,
            capacity_tokens: 400_000,
            dp_size: 1,
            kv_events: true,
            event_form: EventForm::Map,
            prefill_fixed: Duration::from_millis(5),
            prefill_tokens_per_s: 20_000.0,
            decode_per_token: Duration::from_millis(10),
            speedup: 1.0,
            fast: false,
            default_max_tokens: 16,
            api_key: None,
            pd: PdConfig::default(),
            strict_model: false,
            record_requests: false,
            replay_buffer_steps: kv_events::publisher::DEFAULT_BUFFER_STEPS,
            token_logprob: -0.1,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            refuse_rank_header: false,
            grpc_listen: None,
            grpc_service: engine_grpc::Service::Sglang,
            http2: false,
            http2_only: false,
            tokenizer_dir: None,
            reply_text: None,
        }
    }
}

impl MockEngineConfig {
    /// An engine in a disaggregated `role` following `flavor`'s contract (a
    /// decode worker keeps no radix cache, so publishes no KV events).
    pub fn in_role(role: PdRole, flavor: Flavor) -> Self {
        Self {
            kv_events: role != PdRole::Decode,
            pd: PdConfig { role, flavor, ..PdConfig::default() },
            ..Self::default()
        }
    }
}

/// The HTTP versions the engine's port answers.
#[derive(Debug, Clone, Copy)]
enum Speaks {
    Http1,
    Both,
    Http2,
}

/// Serves `app` on `listener` in HTTP/1.1, and in HTTP/2 by prior knowledge (h2c) too when
/// `http2` (`Only`: in HTTP/2 alone), until `shutdown`.
async fn serve(listener: tokio::net::TcpListener, app: axum::Router, shutdown: CancellationToken, http2: Speaks) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::service::TowerToHyperService;
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                // Out of descriptors, say: the next accept may do.
                Err(e) => {
                    tracing::warn!(error = %e, "mock engine accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => return,
        };
        // No Nagle: a stream's small events go out as written (else the client's delayed ACK
        // holds each for up to 40 ms, as a real engine's server does not).
        let _ = tcp.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let mut builder = Builder::new(TokioExecutor::new());
            builder = match http2 {
                Speaks::Http1 => builder.http1_only(),
                Speaks::Both => builder,
                Speaks::Http2 => builder.http2_only(),
            };
            tokio::select! {
                _ = builder.serve_connection(TokioIo::new(tcp), service) => {}
                () = stop.cancelled() => {}
            }
        });
    }
}

// === impl MockEngine ===

impl MockEngine {
    /// Starts the engine with the built-in byte-level model.
    pub async fn spawn(config: MockEngineConfig) -> anyhow::Result<Self> {
        Self::spawn_with(config, Renderer::builtin()?).await
    }

    /// Starts the engine with a given renderer (a real tokenizer and template).
    pub async fn spawn_with(config: MockEngineConfig, renderer: Renderer) -> anyhow::Result<Self> {
        let publishers = if config.kv_events { bind_publishers(&config).await? } else { Vec::new() };
        let cancel = CancellationToken::new();
        let pd = match config.pd.role {
            PdRole::Regular => None,
            _ => Some(Pd::start(config.pd.clone(), cancel.clone()).await?),
        };
        let engine = Arc::new(Engine::new(config.clone(), renderer, publishers, pd));
        let listener = tokio::net::TcpListener::bind(config.listen).await?;
        let addr = listener.local_addr()?;
        let app = http::router(engine.clone());
        let shutdown = cancel.clone();
        let speaks = match (config.http2, config.http2_only) {
            (_, true) => Speaks::Http2,
            (true, false) => Speaks::Both,
            (false, false) => Speaks::Http1,
        };
        tokio::spawn(serve(listener, app, shutdown, speaks));
        let grpc_addr = match config.grpc_listen {
            Some(at) => {
                let listener = tokio::net::TcpListener::bind(at).await?;
                let bound = listener.local_addr()?;
                grpc::spawn(listener, Arc::new(grpc::Scheduler::new(engine.clone(), cancel.clone())), cancel.clone());
                Some(bound)
            }
            None => None,
        };
        Ok(Self { addr, grpc_addr, engine, cancel })
    }

    /// The gRPC service's URL (`grpc://host:port`), when it serves one.
    pub fn grpc_url(&self) -> Option<String> {
        self.grpc_addr.map(|a| format!("grpc://{a}"))
    }

    /// The HTTP base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The engine (cache state, faults).
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Stops serving (also done on drop).
    pub fn shutdown(&self) {
        self.cancel.cancel();
    }
}

impl Drop for MockEngine {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// One publisher per dp rank. Like SGLang, rank `r` binds `base + r` (and
/// replay `replay_base + r`), so discovery from `/server_info` finds every
/// rank; a single rank takes any free port.
async fn bind_publishers(config: &MockEngineConfig) -> anyhow::Result<Vec<kv_events::Publisher>> {
    let ranks = config.dp_size.max(1);
    let one = |endpoint: String, replay: String| PublisherConfig {
        endpoint,
        replay_endpoint: Some(replay),
        form: config.event_form,
        buffer_steps: config.replay_buffer_steps.max(1),
        ..PublisherConfig::loopback()
    };
    if ranks == 1 {
        let any = "tcp://127.0.0.1:0".to_owned();
        return Ok(vec![kv_events::Publisher::bind(one(any.clone(), any)).await?]);
    }
    let mut last = None;
    for attempt in 0..32u64 {
        // Spread attempts over the unprivileged range below the usual ephemeral ports.
        let seed = std::process::id() as u64 * 7919 + attempt * 104_729 + now_nanos();
        let base = 20_000 + (seed % 12_000) as usize;
        let mut bound = Vec::with_capacity(ranks);
        for r in 0..ranks {
            let pc = one(format!("tcp://127.0.0.1:{}", base + r), format!("tcp://127.0.0.1:{}", base + ranks + r));
            match kv_events::Publisher::bind(pc).await {
                Ok(p) => bound.push(p),
                Err(e) => {
                    last = Some(e);
                    break;
                }
            }
        }
        if bound.len() == ranks {
            return Ok(bound);
        }
    }
    Err(anyhow::anyhow!("no {ranks} consecutive free publisher ports: {last:?}"))
}

/// A digest of a prompt (FNV-1a over its token ids): what two legs of one
/// disaggregated request compare.
pub fn digest(tokens: &[u32]) -> u64 {
    tokens.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, t| {
        t.to_le_bytes().iter().fold(h, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
    })
}

fn now_nanos() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos() as u64)
}
