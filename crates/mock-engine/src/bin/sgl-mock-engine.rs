//! `sgl-mock-engine`: one simulated engine on a port, for demos and benchmarks.
//! Faults can be set at start with flags, or at any time with `POST /admin/faults`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use mock_engine::{MockEngine, MockEngineConfig};

/// A simulated SGLang-like engine: real HTTP API, real KV events, a paged
/// prefix cache and a prefill/decode timing model. No GPU.
#[derive(Debug, Parser)]
#[command(name = "sgl-mock-engine", version, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "SGL_MOCK_LISTEN", default_value = "127.0.0.1:30001")]
    listen: SocketAddr,
    /// Also serve SGLang's gRPC scheduler service here (`--smg-grpc-mode`'s protocol: token ids
    /// in and out), e.g. `127.0.0.1:30002`; the router's `--worker-urls grpc://ADDR`.
    #[arg(long, env = "SGL_MOCK_GRPC_LISTEN", value_name = "ADDR")]
    grpc_listen: Option<SocketAddr>,
    /// The service `--grpc-listen` serves: `sglang` (SGLang's scheduler, `--smg-grpc-mode`) or
    /// `vllm` (vLLM's engine, `vllm serve --grpc`).
    #[arg(long, env = "SGL_MOCK_GRPC_SERVICE", value_enum, default_value = "sglang")]
    grpc_service: GrpcService,
    /// Also answer HTTP/2 by prior knowledge (h2c) on the HTTP port (the router's
    /// `--upstream-http2`); off: HTTP/1.1 only, as SGLang's and vLLM's servers.
    #[arg(long, env = "SGL_MOCK_HTTP2")]
    http2: bool,
    /// Answer HTTP/2 only (h2c by prior knowledge) on the HTTP port: HTTP/1.1 is refused.
    #[arg(long, env = "SGL_MOCK_HTTP2_ONLY")]
    http2_only: bool,
    /// Model directory (tokenizer.json + chat template); the built-in byte-level model if absent.
    /// gRPC's `GetTokenizer` hands its tokenizer files over (refused without it).
    #[arg(long, env = "SGL_MOCK_TOKENIZER_PATH")]
    tokenizer_path: Option<PathBuf>,
    /// Model id to report.
    #[arg(long, env = "SGL_MOCK_MODEL_ID", default_value = "mock-model")]
    model_id: String,
    /// Answer 404 to requests naming another model, as vLLM does.
    #[arg(long, env = "SGL_MOCK_STRICT_MODEL")]
    strict_model: bool,
    /// Answer 400 to any request carrying `X-Data-Parallel-Rank`, as Dynamo's frontend does.
    #[arg(long, env = "SGL_MOCK_REFUSE_RANK_HEADER")]
    refuse_rank_header: bool,
    /// Batches each KV-event publisher keeps for replay.
    #[arg(long, default_value_t = kv_events::publisher::DEFAULT_BUFFER_STEPS)]
    replay_buffer_steps: usize,
    /// Tokens per KV page.
    #[arg(long, env = "SGL_MOCK_PAGE_SIZE", default_value_t = 16)]
    page_size: usize,
    /// KV cache capacity per dp rank, in tokens.
    #[arg(long, env = "SGL_MOCK_CAPACITY_TOKENS", default_value_t = 400_000)]
    capacity_tokens: usize,
    /// Data-parallel ranks.
    #[arg(long, env = "SGL_MOCK_DP_SIZE", default_value_t = 1)]
    dp_size: usize,
    /// Do not publish KV events.
    #[arg(long, env = "SGL_MOCK_NO_KV_EVENTS")]
    no_kv_events: bool,
    /// Fixed prefill cost in milliseconds.
    #[arg(long, env = "SGL_MOCK_PREFILL_FIXED_MS", default_value_t = 5)]
    prefill_fixed_ms: u64,
    /// Prefill speed in uncached tokens per second.
    #[arg(long, env = "SGL_MOCK_PREFILL_TOKENS_PER_S", default_value_t = 20_000.0)]
    prefill_tokens_per_s: f64,
    /// Milliseconds per generated token.
    #[arg(long, env = "SGL_MOCK_DECODE_MS_PER_TOKEN", default_value_t = 10)]
    decode_ms_per_token: u64,
    /// Divide all simulated times by this.
    #[arg(long, env = "SGL_MOCK_SPEEDUP", default_value_t = 1.0)]
    speedup: f64,
    /// No simulated time at all (overhead benchmarks).
    #[arg(long, env = "SGL_MOCK_FAST")]
    fast: bool,
    /// Event layout: `map` (SGLang and vLLM today) or `positional` (vLLM <= 0.23, older SGLang).
    #[arg(long, env = "SGL_MOCK_KV_EVENTS_FORMAT", default_value = "map", value_parser = ["map", "positional"])]
    kv_events_format: String,
    /// Require `Authorization: Bearer KEY` on every route but /health*, /ready* and /metrics*
    /// (SGLang's `--api-key`).
    #[arg(long, env = "SGL_MOCK_API_KEY", hide_env_values = true, value_name = "KEY")]
    api_key: Option<String>,
    /// The largest request body taken, in bytes (413 past it); the router's default, 5 MiB.
    #[arg(long, env = "SGL_MOCK_MAX_BODY_BYTES", default_value_t = mock_engine::DEFAULT_MAX_BODY_BYTES, value_name = "BYTES")]
    max_body_bytes: usize,
    /// Disaggregated role: `prefill` (with a bootstrap listener) or `decode` (no radix cache,
    /// so no KV events).
    #[arg(long, env = "SGL_MOCK_ROLE", value_enum, default_value = "regular")]
    role: mock_engine::PdRole,
    /// Whose disaggregation contract a PD role follows: `sglang` (one body to both legs, met by
    /// `bootstrap_room`) or `vllm` (two stages linked by `kv_transfer_params`).
    #[arg(long, env = "SGL_MOCK_FLAVOR", value_enum, default_value = "sglang")]
    flavor: mock_engine::Flavor,
    /// Prefill: the bootstrap port to listen on (0: any free port, shown in /server_info).
    /// Decode: the port a request without `bootstrap_port` meets its prefill on (0: 8998).
    #[arg(long, env = "SGL_MOCK_BOOTSTRAP_PORT", default_value_t = 0)]
    bootstrap_port: u16,
    /// Longest a PD leg waits for its peer, in seconds (SGLang waits 300).
    #[arg(long, env = "SGL_MOCK_BOOTSTRAP_TIMEOUT_SECS", default_value_t = 30)]
    bootstrap_timeout_secs: u64,
    /// vLLM prefill: NIXL push mode (NixlPushConnector): answers `transfer_mode: push`, and its
    /// decode peers register by request id with no block ids, so both legs can go at once.
    #[arg(long, env = "SGL_MOCK_PUSH")]
    push: bool,
    /// vLLM: the MooncakeConnector: the prefill's bootstrap port answers `GET /query`, prefill
    /// requests need the router's `transfer_id`, decode pulls from `remote_bootstrap_addr`.
    #[arg(long, env = "SGL_MOCK_MOONCAKE", conflicts_with = "push")]
    mooncake: bool,
    /// Fault: keep the first N event batches out of the live stream (replay still has them).
    #[arg(long, env = "SGL_MOCK_FAULT_DROP_BATCHES", default_value_t = 0)]
    fault_drop_batches: usize,
    /// Fault: delay every event batch by this many milliseconds.
    #[arg(long, env = "SGL_MOCK_FAULT_EVENT_DELAY_MS", default_value_t = 0)]
    fault_event_delay_ms: u64,
    /// Fault: the first N requests fail with HTTP 500 (or --fault-fail-status).
    #[arg(long, env = "SGL_MOCK_FAULT_FAIL_NEXT", default_value_t = 0)]
    fault_fail_next: usize,
    /// Fault: the status those requests fail with (503: an overloaded engine).
    #[arg(long, env = "SGL_MOCK_FAULT_FAIL_STATUS", default_value_t = 500)]
    fault_fail_status: u16,
    /// The logprob of every generated token, reported when a whole chat or completion asks for logprobs.
    #[arg(long, env = "SGL_MOCK_TOKEN_LOGPROB", default_value_t = -0.1, allow_hyphen_values = true)]
    token_logprob: f64,
    /// Fault: the first N requests never answer.
    #[arg(long, env = "SGL_MOCK_FAULT_HANG_NEXT", default_value_t = 0)]
    fault_hang_next: usize,
    /// Fault: the first N streamed requests die after their first chunk.
    #[arg(long, env = "SGL_MOCK_FAULT_DIE_MID_STREAM_NEXT", default_value_t = 0)]
    fault_die_mid_stream_next: usize,
}

/// `--grpc-service`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum GrpcService {
    Sglang,
    Vllm,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter("info").init();
    let a = Args::parse();
    let config = MockEngineConfig {
        listen: a.listen,
        grpc_listen: a.grpc_listen,
        grpc_service: match a.grpc_service {
            GrpcService::Sglang => engine_grpc::Service::Sglang,
            GrpcService::Vllm => engine_grpc::Service::Vllm,
        },
        http2: a.http2,
        http2_only: a.http2_only,
        model_id: a.model_id,
        strict_model: a.strict_model,
        refuse_rank_header: a.refuse_rank_header,
        token_logprob: a.token_logprob,
        replay_buffer_steps: a.replay_buffer_steps,
        page_size: a.page_size,
        capacity_tokens: a.capacity_tokens,
        dp_size: a.dp_size,
        // SGLang's decode keeps no radix cache to publish; vLLM's caches the blocks it pulled.
        kv_events: !(a.no_kv_events
            || (a.role == mock_engine::PdRole::Decode && a.flavor == mock_engine::Flavor::Sglang)),
        pd: mock_engine::PdConfig {
            role: a.role,
            flavor: a.flavor,
            bootstrap_port: a.bootstrap_port,
            bootstrap_timeout: Duration::from_secs(a.bootstrap_timeout_secs),
            push: a.push,
            mooncake: a.mooncake,
        },
        prefill_fixed: Duration::from_millis(a.prefill_fixed_ms),
        prefill_tokens_per_s: a.prefill_tokens_per_s,
        decode_per_token: Duration::from_millis(a.decode_ms_per_token),
        speedup: a.speedup,
        fast: a.fast,
        api_key: a.api_key,
        max_body_bytes: a.max_body_bytes,
        event_form: if a.kv_events_format == "positional" {
            kv_events::EventForm::Positional
        } else {
            kv_events::EventForm::Map
        },
        tokenizer_dir: a.tokenizer_path.clone(),
        ..MockEngineConfig::default()
    };
    let engine = match a.tokenizer_path {
        Some(dir) => MockEngine::spawn_with(config, renderer::Renderer::from_dir(&dir, None)?).await?,
        None => MockEngine::spawn(config).await?,
    };
    engine
        .engine()
        .set_faults(mock_engine::Faults {
            drop_next_batches: a.fault_drop_batches,
            event_delay_ms: a.fault_event_delay_ms,
            fail_next: a.fault_fail_next,
            fail_status: a.fault_fail_status,
            hang_next: a.fault_hang_next,
            hold_next: 0,
            die_mid_stream_next: a.fault_die_mid_stream_next,
            restart_publisher: false,
            drop_kv_params_next: 0,
            bloat_kv_params_bytes: 0,
            ..mock_engine::Faults::default()
        })
        .await;
    println!("sgl-mock-engine listening on {}", engine.url());
    if let Some(url) = engine.grpc_url() {
        println!("  gRPC scheduler service on {url}");
    }
    if let Some(port) = engine.engine().pd().and_then(|pd| pd.bootstrap_port()) {
        println!("  prefill bootstrap port {port}");
    }
    for (rank, (pub_ep, replay)) in engine.engine().publisher_endpoints().iter().enumerate() {
        println!("  dp rank {rank}: KV events {pub_ep}, replay {}", replay.as_deref().unwrap_or("-"));
    }
    tokio::signal::ctrl_c().await?;
    Ok(())
}
