//! The routing config (`docs/model-routing.md` §4) as serde types, and its
//! validation: pools, signals, decisions, plugins, strategy. Owns the shape
//! only: compiling signals is `signals`, evaluating rules is `decision`,
//! reading YAML with line numbers is `load`.

use std::fmt;

use serde::Deserialize;

mod load;
mod pools;
mod semantic;
mod validate;

pub use load::{Problem, parse_yaml};
pub use pools::{
    Cascade, DEFAULT_PREFILL_TOKENS_PER_S, Disaggregation, GuardAction, HeaderMutation, PluginConfig, PoolConfig,
    PrefillWorker, Price, ResponseCache, ResponseGuard, SystemPromptMode,
};
pub(crate) use semantic::uses_embeddings;
pub use semantic::{
    Aggregation, ComplexityRule, DomainConfig, DomainLabel, DomainMethod, EmbeddingRule, JailbreakRule, ReaskRule,
};
pub use validate::{ALGORITHMS, RESERVED_DECISIONS, validate};

/// A routing config file (version 1). Unknown keys are errors.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The format's version: 1.
    #[serde(default = "one")]
    pub version: u32,
    /// A request whose `model` is one of these is routed by the decisions.
    #[serde(default = "auto_names")]
    pub auto_model_names: Vec<String>,
    /// The pool serving requests no decision matched (default: the first pool).
    #[serde(default)]
    pub default_pool: Option<String>,
    /// The model pools.
    #[serde(default)]
    pub pools: Vec<PoolConfig>,
    /// Signal rules, by type.
    #[serde(default)]
    pub signals: SignalsConfig,
    /// Decisions, in config order (the last tie-breaker).
    #[serde(default)]
    pub decisions: Vec<DecisionConfig>,
    /// How matched decisions are ranked when no tier is set.
    #[serde(default)]
    pub strategy: Strategy,
    /// Keeping a conversation on its pool while that pool holds its prefix.
    #[serde(default)]
    pub stickiness: Stickiness,
    /// The decisions' guards apply to every request with a prompt, not only to auto-routed
    /// ones: a request naming a pool's model (or none) is decided too, and the winning
    /// decision's `block` refuses it and its `pii_redact` redacts it; it still goes to the pool
    /// it named (the decision's other plugins do not run). Off by default.
    #[serde(default)]
    pub guard_all_requests: bool,
}

/// The `signals` section.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalsConfig {
    /// Keyword rules.
    #[serde(default)]
    pub keywords: Vec<KeywordRule>,
    /// Regex rules.
    #[serde(default)]
    pub regex: Vec<RegexRule>,
    /// PII rules.
    #[serde(default)]
    pub pii: Vec<PiiRule>,
    /// Token-count rules.
    #[serde(default)]
    pub context: Vec<ContextRule>,
    /// Language rules.
    #[serde(default)]
    pub language: Vec<LanguageRule>,
    /// Conversation-shape rules (turns, tools, tool loop, images).
    #[serde(default)]
    pub conversation: Vec<ConversationRule>,
    /// Trusted request-header rules.
    #[serde(default)]
    pub headers: Vec<HeaderRule>,
    /// Live pool-load rules (in flight, estimated TTFT).
    #[serde(default)]
    pub load: Vec<LoadRule>,
    /// Similarity of the last user turn to candidate phrases (embedding model).
    #[serde(default)]
    pub embedding: Vec<EmbeddingRule>,
    /// The domain classifier over labelled examples (embedding model).
    #[serde(default)]
    pub domain: Option<DomainConfig>,
    /// Malicious against benign examples (embedding model).
    #[serde(default)]
    pub jailbreak: Vec<JailbreakRule>,
    /// Hard against easy examples (embedding model).
    #[serde(default)]
    pub complexity: Vec<ComplexityRule>,
    /// The last user turn repeats the previous one (embedding model).
    #[serde(default)]
    pub reask: Vec<ReaskRule>,
}

/// A conversation-shape rule: matched when every condition it sets holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConversationRule {
    /// The signal's name.
    pub name: String,
    /// At least this many user turns.
    #[serde(default)]
    pub min_turns: Option<u32>,
    /// At most this many user turns.
    #[serde(default)]
    pub max_turns: Option<u32>,
    /// The request offers tools (or not).
    #[serde(default)]
    pub has_tools: Option<bool>,
    /// The last message is a tool's result: an agent loop going on (or not).
    #[serde(default)]
    pub tool_loop: Option<bool>,
    /// A message carries an image (or not).
    #[serde(default)]
    pub has_images: Option<bool>,
}

/// A trusted-header rule: matched when the request carries `header` with one
/// of `values` (any value when the list is empty). Only headers an edge proxy
/// sets (and strips from clients) are worth trusting.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderRule {
    /// The signal's name.
    pub name: String,
    /// The header's name (case-insensitive).
    pub header: String,
    /// Accepted values, compared exactly (empty: present is enough).
    #[serde(default)]
    pub values: Vec<String>,
}

/// A live-load rule on one pool: matched when every bound it sets holds for
/// the pool now (requests in flight on its workers, the estimated time to
/// first token of this prompt on its least-loaded worker).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadRule {
    /// The signal's name.
    pub name: String,
    /// The pool.
    pub pool: String,
    /// At least this many requests in flight on the pool.
    #[serde(default)]
    pub min_in_flight: Option<u64>,
    /// At most this many.
    #[serde(default)]
    pub max_in_flight: Option<u64>,
    /// An estimated TTFT of at least this (ms).
    #[serde(default)]
    pub min_ttft_ms: Option<f64>,
    /// An estimated TTFT of at most this (ms).
    #[serde(default)]
    pub max_ttft_ms: Option<f64>,
}

/// A keyword rule: matched when any (OR), all (AND) or none (NOR) of the
/// keywords occur as whole words (multi-word phrases allowed).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeywordRule {
    /// The signal's name.
    pub name: String,
    /// How the keywords combine.
    #[serde(default)]
    pub operator: KeywordOperator,
    /// Words or phrases.
    pub keywords: Vec<String>,
    /// Match case exactly (default: case-insensitive).
    #[serde(default)]
    pub case_sensitive: bool,
}

/// How a keyword rule's keywords combine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum KeywordOperator {
    /// Any keyword occurs.
    #[default]
    #[serde(rename = "OR", alias = "or")]
    Or,
    /// Every keyword occurs.
    #[serde(rename = "AND", alias = "and")]
    And,
    /// No keyword occurs.
    #[serde(rename = "NOR", alias = "nor")]
    Nor,
}

/// A regex rule: matched when the pattern matches anywhere in the text.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegexRule {
    /// The signal's name.
    pub name: String,
    /// A `regex`-crate pattern.
    pub pattern: String,
}

/// A PII rule: matched when any finding of the listed types occurs.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PiiRule {
    /// The signal's name.
    pub name: String,
    /// Type names as written (`email`, `phone`, `credit_card`, `iban`,
    /// `us_ssn`, `ip_address`, `api_key`); kept as strings so that
    /// [`validate`] can report every unknown one.
    pub types: Vec<String>,
}

/// A context rule: matched when `min_tokens <= tokens <= max_tokens` (a
/// missing bound is open).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextRule {
    /// The signal's name.
    pub name: String,
    /// Inclusive lower bound.
    #[serde(default)]
    pub min_tokens: Option<u64>,
    /// Inclusive upper bound.
    #[serde(default)]
    pub max_tokens: Option<u64>,
}

/// A language rule: matched when the text's language (whatlang) is one of these.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LanguageRule {
    /// The signal's name.
    pub name: String,
    /// ISO 639-1 codes (`zh`, `de`; 639-3 `cmn` is read too).
    pub languages: Vec<String>,
    /// The least detector confidence in [0, 1] that counts (default 0: any).
    #[serde(default)]
    pub min_confidence: Option<f64>,
}

/// One decision: if its rules hold, its pools serve the request.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionConfig {
    /// The decision's name (reported in `x-route-decision`).
    pub name: String,
    /// Higher wins under `strategy: priority`.
    #[serde(default)]
    pub priority: i64,
    /// Lower wins before anything else; a decision without a tier ranks
    /// after every decision with one.
    #[serde(default)]
    pub tier: Option<u32>,
    /// The condition; none makes this the catch-all.
    #[serde(default)]
    pub rules: Option<RuleNode>,
    /// Candidate pools, in preference order.
    #[serde(default)]
    pub pools: Vec<String>,
    /// How to choose among the pools.
    #[serde(default)]
    pub algorithm: Option<AlgorithmConfig>,
    /// Decision-driven processing, in order.
    #[serde(default)]
    pub plugins: Vec<PluginConfig>,
    /// A conversation may stay on its earlier pool (one of `pools`) while it
    /// holds its prefix (default true; false: this decision always moves it).
    #[serde(default = "yes")]
    pub sticky: bool,
}

/// A decision's algorithm: its `type` and any other keys, uninterpreted.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AlgorithmConfig {
    /// `static`, `multi_factor`, `bandit`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// The remaining keys.
    #[serde(flatten)]
    pub params: serde_json::Map<String, serde_json::Value>,
}

/// Conversation stickiness: a conversation (by `x-session-id`, else a
/// fingerprint of its first messages) stays on the pool that served its last
/// turn while that pool's workers hold at least `min_cached_tokens_to_stick`
/// of its prompt (measured in the KV index), unless its decision is not
/// sticky or does not list that pool, or (`multi_factor`) the other pool's
/// score wins by more than the re-prefill cost.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Stickiness {
    /// Off: every turn is routed afresh.
    pub enabled: bool,
    /// Cached prompt tokens on the earlier pool that make a conversation stay.
    pub min_cached_tokens_to_stick: u64,
    /// Cached tokens worth one point of `multi_factor` score: the other pool
    /// must win by more than `cached / reprefill_tokens_per_point`.
    pub reprefill_tokens_per_point: u64,
    /// Conversations remembered (least recently seen forgotten first).
    pub max_sessions: usize,
    /// A conversation not seen for this long is forgotten.
    pub ttl_secs: u64,
}

impl Default for Stickiness {
    fn default() -> Self {
        Stickiness {
            enabled: true,
            min_cached_tokens_to_stick: 512,
            reprefill_tokens_per_point: 8192,
            max_sessions: 100_000,
            ttl_secs: 3600,
        }
    }
}

/// How matched decisions are ranked (after tier).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Priority, then confidence.
    #[default]
    Priority,
    /// Confidence, then priority.
    Confidence,
}

/// A rule node: a signal leaf or a combination.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "RawRuleNode")]
pub enum RuleNode {
    /// `{type, name, gt?, gte?, lt?, lte?}`.
    Signal(SignalCondition),
    /// `{operator, conditions}`.
    Composite {
        /// AND, OR or NOT.
        operator: RuleOperator,
        /// The children (NOT: exactly one, checked by [`validate`]).
        conditions: Vec<RuleNode>,
    },
}

/// A leaf: a signal, and optionally a predicate on its value.
#[derive(Debug, Clone, PartialEq)]
pub struct SignalCondition {
    /// The signal.
    pub signal: SignalRef,
    /// The predicate on the signal's value (all bounds must hold).
    pub bounds: Bounds,
}

/// Numeric predicate on a signal's value.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Bounds {
    /// value > gt.
    pub gt: Option<f64>,
    /// value >= gte.
    pub gte: Option<f64>,
    /// value < lt.
    pub lt: Option<f64>,
    /// value <= lte.
    pub lte: Option<f64>,
}

/// A combining operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum RuleOperator {
    /// All children.
    #[serde(rename = "AND", alias = "and")]
    And,
    /// Any child.
    #[serde(rename = "OR", alias = "or")]
    Or,
    /// The one child is false.
    #[serde(rename = "NOT", alias = "not")]
    Not,
}

/// A signal type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SignalKind {
    /// `signals.keywords`.
    #[serde(alias = "keywords")]
    Keyword,
    /// `signals.regex`.
    Regex,
    /// `signals.pii`.
    Pii,
    /// `signals.context`.
    Context,
    /// `signals.language`.
    Language,
    /// `signals.conversation`.
    Conversation,
    /// `signals.headers`.
    #[serde(alias = "headers")]
    Header,
    /// `signals.load`.
    Load,
    /// `signals.embedding`.
    Embedding,
    /// `signals.domain`'s labels and its fallback.
    Domain,
    /// `signals.jailbreak`.
    Jailbreak,
    /// `signals.complexity`.
    Complexity,
    /// `signals.reask`.
    Reask,
    /// `{type: failed, name: "jailbreak:x"}`: that signal could not be
    /// computed (the embedding pool was full, say); lets a decision fail
    /// closed or open.
    Failed,
}

/// A signal named by type and name, e.g. `keyword:math`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SignalRef {
    /// The type.
    pub kind: SignalKind,
    /// The rule's name.
    pub name: String,
}

/// What a rule node looks like on the wire, before we know which kind it is.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRuleNode {
    #[serde(rename = "type")]
    kind: Option<SignalKind>,
    name: Option<String>,
    gt: Option<f64>,
    gte: Option<f64>,
    lt: Option<f64>,
    lte: Option<f64>,
    operator: Option<RuleOperator>,
    conditions: Option<Vec<RuleNode>>,
}

fn one() -> u32 {
    1
}

fn yes() -> bool {
    true
}

fn auto_names() -> Vec<String> {
    vec!["auto".to_owned()]
}

impl Default for Config {
    fn default() -> Self {
        Config {
            version: 1,
            auto_model_names: auto_names(),
            default_pool: None,
            pools: Vec::new(),
            signals: SignalsConfig::default(),
            decisions: Vec::new(),
            strategy: Strategy::default(),
            stickiness: Stickiness::default(),
            guard_all_requests: false,
        }
    }
}

impl Config {
    /// The pool serving requests no decision matched: `default_pool`, else the first pool.
    pub fn default_pool_name(&self) -> Option<&str> {
        self.default_pool.as_deref().or_else(|| self.pools.first().map(|p| p.name.as_str()))
    }
}

// === impl RuleNode ===

impl TryFrom<RawRuleNode> for RuleNode {
    type Error = String;

    fn try_from(raw: RawRuleNode) -> Result<Self, String> {
        let has_bounds = raw.gt.is_some() || raw.gte.is_some() || raw.lt.is_some() || raw.lte.is_some();
        match (raw.kind, raw.name, raw.operator) {
            (Some(kind), Some(name), None) if raw.conditions.is_none() => Ok(RuleNode::Signal(SignalCondition {
                signal: SignalRef { kind, name },
                bounds: Bounds { gt: raw.gt, gte: raw.gte, lt: raw.lt, lte: raw.lte },
            })),
            (None, None, Some(operator)) if !has_bounds => {
                Ok(RuleNode::Composite { operator, conditions: raw.conditions.unwrap_or_default() })
            }
            _ => Err("a rule node is either {type, name, gt/gte/lt/lte?} or {operator, conditions}".to_owned()),
        }
    }
}

// === impl DecisionConfig ===

impl DecisionConfig {
    /// Whether this is the catch-all (no rules).
    pub fn is_catch_all(&self) -> bool {
        self.rules.is_none()
    }

    /// Every signal its rules name, in order of appearance (may repeat).
    pub fn signal_refs(&self) -> Vec<&SignalRef> {
        fn walk<'a>(node: &'a RuleNode, out: &mut Vec<&'a SignalRef>) {
            match node {
                RuleNode::Signal(c) => out.push(&c.signal),
                RuleNode::Composite { conditions, .. } => conditions.iter().for_each(|c| walk(c, out)),
            }
        }
        let mut out = Vec::new();
        if let Some(rules) = &self.rules {
            walk(rules, &mut out);
        }
        out
    }
}

// === impl Bounds ===

impl Bounds {
    /// Whether any bound is set.
    pub fn is_empty(&self) -> bool {
        self.gt.is_none() && self.gte.is_none() && self.lt.is_none() && self.lte.is_none()
    }

    /// Whether `value` satisfies every set bound.
    pub fn holds(&self, value: f64) -> bool {
        self.gt.is_none_or(|b| value > b)
            && self.gte.is_none_or(|b| value >= b)
            && self.lt.is_none_or(|b| value < b)
            && self.lte.is_none_or(|b| value <= b)
    }
}

impl fmt::Display for Bounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        for (op, b) in [(">", self.gt), (">=", self.gte), ("<", self.lt), ("<=", self.lte)] {
            if let Some(b) = b {
                write!(f, "{sep}{op} {b}")?;
                sep = " and ";
            }
        }
        Ok(())
    }
}

// === impl SignalKind ===

impl SignalKind {
    /// The type's name as in a rule leaf.
    pub fn as_str(self) -> &'static str {
        match self {
            SignalKind::Keyword => "keyword",
            SignalKind::Regex => "regex",
            SignalKind::Pii => "pii",
            SignalKind::Context => "context",
            SignalKind::Language => "language",
            SignalKind::Conversation => "conversation",
            SignalKind::Header => "header",
            SignalKind::Load => "load",
            SignalKind::Embedding => "embedding",
            SignalKind::Domain => "domain",
            SignalKind::Jailbreak => "jailbreak",
            SignalKind::Complexity => "complexity",
            SignalKind::Reask => "reask",
            SignalKind::Failed => "failed",
        }
    }
}

impl fmt::Display for SignalKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// === impl RuleOperator ===

impl fmt::Display for RuleOperator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RuleOperator::And => "AND",
            RuleOperator::Or => "OR",
            RuleOperator::Not => "NOT",
        })
    }
}

// === impl SignalRef ===

impl SignalRef {
    /// A reference to signal `name` of type `kind`.
    pub fn new(kind: SignalKind, name: impl Into<String>) -> Self {
        SignalRef { kind, name: name.into() }
    }

    /// For a `failed` leaf, the signal it watches (`name` is `type:name`).
    pub fn watched(&self) -> Option<SignalRef> {
        if self.kind != SignalKind::Failed {
            return None;
        }
        let (kind, name) = self.name.split_once(':')?;
        let kind: SignalKind = serde_json::from_value(serde_json::Value::String(kind.to_owned())).ok()?;
        (kind != SignalKind::Failed).then(|| SignalRef::new(kind, name))
    }
}

impl fmt::Display for SignalRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind, self.name)
    }
}

#[cfg(test)]
mod tests;
