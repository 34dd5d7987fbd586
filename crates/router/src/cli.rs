//! The command line: one clap struct, every flag with `long` and `env`, every
//! default a named constant.

use std::num::NonZeroUsize;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// KV-cache-aware router for SGLang and vLLM engine replicas.
///
/// The router sends each request to the replica that already holds its prompt
/// prefix in KV cache, knowing what each one holds from the KV events the
/// engines publish. The tools below compute exactly the tokens and block
/// hashes the engine computes, to check a deployment by hand.
#[derive(Debug, Parser)]
#[command(name = "sgl-router", version, about, long_about, propagate_version = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
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
    #[arg(long = "kv-events-block-size", env = "SGL_ROUTER_KV_EVENTS_BLOCK_SIZE", value_name = "N", default_value_t = crate::defaults::KV_EVENTS_BLOCK_SIZE)]
    pub(crate) block_size: NonZeroUsize,
    /// Topic to subscribe to on explicit endpoints (engines publish with an empty topic by default).
    #[arg(long = "kv-events-topic", env = "SGL_ROUTER_KV_EVENTS_TOPIC", value_name = "TOPIC", default_value = "")]
    pub(crate) topic: String,
}

#[derive(Debug, Args)]
pub(crate) struct KvEventsArgs {
    /// Base URLs of the engine workers, comma separated or repeated.
    #[arg(long, env = "SGL_ROUTER_WORKER_URLS", value_delimiter = ',', required = true, value_name = "URL")]
    pub(crate) worker_urls: Vec<String>,
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
