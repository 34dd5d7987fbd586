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
