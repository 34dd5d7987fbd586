//! The `pools` section and the decisions' `plugins` as serde types: what a
//! pool is made of (workers, served model, tokenizer, window, price,
//! quality) and what each plugin does. Building real pools from them is the
//! gateway's and the router's business.

use std::collections::BTreeMap;

use serde::Deserialize;

/// One model pool.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// The pool's name (a concrete `model` may name it; `x-route-pool`).
    pub name: String,
    /// The model name its engines serve: the body's `model` becomes this.
    pub served_model: String,
    /// Its workers' base URLs (more may join through the control plane).
    #[serde(default)]
    pub workers: Vec<String>,
    /// Any `--policy` value (default: the router's `--policy`).
    #[serde(default)]
    pub policy: Option<String>,
    /// Its model directory, as `--tokenizer-path` (default: the router's).
    #[serde(default)]
    pub tokenizer_path: Option<String>,
    /// Its chat template file, as `--chat-template` (default: the router's;
    /// needs a model directory).
    #[serde(default)]
    pub chat_template: Option<String>,
    /// Tokens its engines hold per request: a pool that cannot hold the
    /// prompt plus `max_tokens` is skipped.
    #[serde(default)]
    pub context_window: Option<u64>,
    /// What its tokens cost.
    #[serde(default)]
    pub price: Option<Price>,
    /// A prior of its answers' quality in [0, 1], for algorithms.
    #[serde(default)]
    pub quality: Option<f64>,
    /// Prompt tokens one of its workers prefills per second: the estimated
    /// time to first token is the worker's queued prefill plus this prompt
    /// over this rate (default [`DEFAULT_PREFILL_TOKENS_PER_S`], an 8B model
    /// on one H100; measure yours).
    #[serde(default)]
    pub prefill_tokens_per_s: Option<f64>,
    /// Prefill/decode disaggregation, with the CLI's semantics: `sglang`
    /// (`--pd-disaggregation`), `vllm` (`--vllm-pd-disaggregation`, NIXL) or
    /// `mooncake` (`--vllm-pd-disaggregation --kv-connector mooncake`). Its
    /// workers are then `prefill` and `decode`, not `workers`.
    #[serde(default)]
    pub disaggregation: Option<Disaggregation>,
    /// Its prefill workers (a disaggregated pool): a URL, or `{url, bootstrap_port}`
    /// (SGLang's bootstrap port; without one it is read from the worker's `/server_info`).
    #[serde(default)]
    pub prefill: Vec<PrefillWorker>,
    /// Its decode workers (a disaggregated pool).
    #[serde(default)]
    pub decode: Vec<String>,
    /// Chooses its decode worker, by load (any `--policy` value; default: the
    /// pool's `policy`, as `--decode-policy` defaults to `--policy`).
    #[serde(default)]
    pub decode_policy: Option<String>,
}

/// Whose disaggregation contract a pool's workers follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Disaggregation {
    /// SGLang: one body to both legs at once, met by `bootstrap_room`.
    Sglang,
    /// vLLM with the NIXL connector: prefill, then decode with its `kv_transfer_params`.
    Vllm,
    /// vLLM with the Mooncake connector: both legs at once, linked by a `transfer_id`.
    Mooncake,
}

impl Disaggregation {
    /// Its name in a routing config.
    pub fn as_str(self) -> &'static str {
        match self {
            Disaggregation::Sglang => "sglang",
            Disaggregation::Vllm => "vllm",
            Disaggregation::Mooncake => "mooncake",
        }
    }
}

/// A prefill worker of a disaggregated pool.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum PrefillWorker {
    /// Its base URL; the bootstrap port is read from its `/server_info`.
    Url(String),
    /// Its base URL and bootstrap port.
    Spec {
        url: String,
        /// SGLang's `disaggregation_bootstrap_port` (none: read from `/server_info`).
        #[serde(default)]
        bootstrap_port: Option<u16>,
    },
}

impl PrefillWorker {
    /// Its base URL.
    pub fn url(&self) -> &str {
        match self {
            PrefillWorker::Url(url) | PrefillWorker::Spec { url, .. } => url,
        }
    }

    /// Its bootstrap port, when given.
    pub fn bootstrap_port(&self) -> Option<u16> {
        match self {
            PrefillWorker::Url(_) => None,
            PrefillWorker::Spec { bootstrap_port, .. } => *bootstrap_port,
        }
    }
}

pub use router_types::DEFAULT_PREFILL_TOKENS_PER_S;

/// Prices per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Uncached prompt tokens.
    pub input_per_1m: f64,
    /// Prompt tokens served from cache (default: `input_per_1m`).
    #[serde(default)]
    pub cached_input_per_1m: Option<f64>,
    /// Generated tokens.
    pub output_per_1m: f64,
}

/// A decision's plugin.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum PluginConfig {
    /// Answer at once with `status` and `message`; nothing goes upstream.
    Block {
        /// 400..=599 (default 403).
        #[serde(default = "forbidden")]
        status: u16,
        /// The error message the client reads.
        #[serde(default = "refused")]
        message: String,
    },
    /// Replace PII of these types with placeholders (`[EMAIL_1]`) before
    /// rendering; the values are never logged.
    PiiRedact {
        /// Type names (empty: every type).
        #[serde(default)]
        types: Vec<String>,
    },
    /// Set the chat's system prompt.
    SystemPrompt {
        /// The prompt.
        prompt: String,
        /// Replace the client's system prompt, or put this one before it.
        #[serde(default)]
        mode: SystemPromptMode,
    },
    /// Change the headers the worker receives.
    HeaderMutation(HeaderMutation),
    /// Answer a request the decision saw before from the router's cache.
    ResponseCache(ResponseCache),
    /// The chosen pool first; the `to` pool when its answer's mean token logprob is low.
    Cascade(Cascade),
    /// A chat longer than the chosen pool's `context_window` (its prompt and the tokens it
    /// may generate) is cut to fit: the leading system messages and the latest turns kept,
    /// the oldest turns dropped (from a user turn on), how many said in
    /// `x-route-context-dropped`; refused with 400 when even the last turn alone does not
    /// fit. When no candidate pool fits the chat whole, the decision's pools are chosen among
    /// as if it did (the chat is then cut for the chosen one).
    FitContext {},
    /// Reads the answer (2xx, whole or streamed) for PII and, with `jailbreak` rules,
    /// jailbreak-style text; blocks, redacts or annotates it.
    ResponseGuard(ResponseGuard),
}

/// A `response_guard` plugin: the answer's texts (a chat's content and reasoning, a
/// completion's text, Anthropic's text blocks, `/generate`'s text) read for PII of `pii_types`
/// and for the `jailbreak` rules; a finding is acted on by `action`. A whole answer is read
/// whole; a stream's text is held back `look_behind_chars` (and, with `jailbreak` rules,
/// until its window was judged), so a value split over tokens is caught before it goes out.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseGuard {
    /// What a finding does.
    pub action: GuardAction,
    /// Look for PII in the answer (default true).
    #[serde(default = "yes")]
    pub pii: bool,
    /// The PII types looked for (empty: every type).
    #[serde(default)]
    pub pii_types: Vec<String>,
    /// Names of `signals.jailbreak` rules the answer's text is judged by (default none).
    #[serde(default)]
    pub jailbreak: Vec<String>,
    /// Bytes of a stream's text held back so that a value split over tokens is found whole
    /// (default 256).
    #[serde(default = "look_behind")]
    pub look_behind_chars: usize,
    /// The text a jailbreak rule judges at once, in bytes; windows overlap by half (default 1,024).
    #[serde(default = "guard_window")]
    pub window_chars: usize,
    /// A larger whole answer is refused (502) rather than passed on unread (default 1 MiB).
    #[serde(default = "cache_answer_bytes")]
    pub max_answer_bytes: usize,
    /// The status of a blocked whole answer (default 403).
    #[serde(default = "forbidden")]
    pub status: u16,
    /// The message the client reads when an answer is blocked.
    #[serde(default = "withheld")]
    pub message: String,
}

/// What a `response_guard` does with a finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GuardAction {
    /// A whole answer is replaced by an error; a stream ends with an error event, the text
    /// held back never sent.
    Block,
    /// PII is replaced by placeholders (`[EMAIL_1]`); a jailbreak finding blocks.
    Redact,
    /// The answer passes unchanged; the findings are told (`x-route-response-guard`, or a
    /// stream's last comment) and counted.
    Annotate,
}

fn yes() -> bool {
    true
}
fn look_behind() -> usize {
    256
}
fn guard_window() -> usize {
    1024
}
fn withheld() -> String {
    "the answer was withheld by the router's response guard".to_owned()
}

/// A `cascade` plugin: a whole (not streamed) chat or completion is sent to the
/// pool the decision chose with logprobs asked for; when the answer's mean
/// token logprob is under `min_mean_logprob`, the same request goes to the
/// `to` pool and its answer is the client's.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cascade {
    /// The pool that answers when the first is unsure (one of the config's pools).
    pub to: String,
    /// The mean token logprob under which the first answer is not kept (default -1.0).
    #[serde(default = "cascade_threshold")]
    pub min_mean_logprob: f64,
    /// A larger first answer is passed on as it is, not judged (default 1 MiB).
    #[serde(default = "cache_answer_bytes")]
    pub max_answer_bytes: usize,
}

fn cascade_threshold() -> f64 {
    -1.0
}

/// A `response_cache` plugin: exact hits (the same request but for `model`,
/// the same decision, pool and stream flag) and, opted in, semantic hits (the
/// last user turn similar enough, everything else identical). Only complete
/// answers (2xx, not cut) are stored; an entry lives `ttl_secs`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseCache {
    /// Also hit on a similar last user turn (needs the embedding model).
    #[serde(default)]
    pub semantic: bool,
    /// The similarity a semantic hit needs (default 0.95).
    #[serde(default = "cache_threshold")]
    pub threshold: f64,
    /// How long an answer is served, in seconds (default 600).
    #[serde(default = "cache_ttl")]
    pub ttl_secs: u64,
    /// Answers kept at most, least recently used out first (default 1,000).
    #[serde(default = "cache_entries")]
    pub max_entries: usize,
    /// A larger answer is not stored (default 1 MiB).
    #[serde(default = "cache_answer_bytes")]
    pub max_answer_bytes: usize,
    /// Bytes the kept answers hold at most (bodies, vectors, bookkeeping; keys are 32-byte
    /// digests), least recently used out first (default 64 MiB).
    #[serde(default = "cache_bytes")]
    pub max_bytes: usize,
    /// Cache requests that sample (`temperature` above 0, or unset); off by
    /// default: a sampled answer is meant to vary.
    #[serde(default)]
    pub allow_sampling: bool,
}

fn cache_threshold() -> f64 {
    0.95
}
fn cache_ttl() -> u64 {
    600
}
fn cache_entries() -> usize {
    1_000
}
fn cache_answer_bytes() -> usize {
    1 << 20
}
fn cache_bytes() -> usize {
    64 << 20
}

/// How a `system_prompt` plugin treats the client's own system prompt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SystemPromptMode {
    /// The plugin's prompt replaces it.
    #[default]
    Replace,
    /// The plugin's prompt goes before it (a blank line between).
    Insert,
}

/// Headers to set and to remove on the request to the worker.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderMutation {
    /// Set (replacing any the client sent).
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    /// Removed.
    #[serde(default)]
    pub remove: Vec<String>,
}

fn forbidden() -> u16 {
    403
}

fn refused() -> String {
    "refused by the router's routing policy".to_owned()
}

// === impl PluginConfig ===

impl PluginConfig {
    /// The plugin's type as written.
    pub fn kind(&self) -> &'static str {
        match self {
            PluginConfig::Block { .. } => "block",
            PluginConfig::PiiRedact { .. } => "pii_redact",
            PluginConfig::SystemPrompt { .. } => "system_prompt",
            PluginConfig::HeaderMutation(_) => "header_mutation",
            PluginConfig::ResponseCache(_) => "response_cache",
            PluginConfig::Cascade(_) => "cascade",
            PluginConfig::FitContext {} => "fit_context",
            PluginConfig::ResponseGuard(_) => "response_guard",
        }
    }
}
