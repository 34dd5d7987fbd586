//! Model selection for `model: auto`: which pool serves a request, decided by
//! declarative rules over request signals (the vLLM Semantic Router's rule
//! shape, see `docs/model-routing.md` §1 and §4). This crate owns the
//! routing config (its YAML, with line numbers), the rule signals, the
//! decision evaluator, the `static` algorithm and the body-rewriting plugins;
//! it does no I/O, knows no HTTP, and leaves workers and pool state to others.
//!
//! ```text
//! YAML ─parse_yaml─▶ Config ─Selector::new─▶ target(model): Auto | Pool | Unknown
//!                                           decide(text, tokens) ─▶ Choice {decision, pools, trace}
//!
//! Config ──validate──▶ Signals::compile ──▶ Signals::evaluate(text, tokens, needed)
//!                                                  │ SignalResults
//!                        needed_signals(decisions) ┘        ▼
//!                                          decision::select ──▶ Selection {winner, trace}
//! ```

mod algorithm;
mod config;
mod decision;
mod error;
mod feedback;
mod guard;
mod language;
mod normalize;
mod pii;
mod polarity;
pub mod presets;
mod redact;
mod request;
mod results;
mod selector;
mod semantic;
mod signals;

pub use algorithm::{Algorithm, Bandit, Candidate, MultiFactor, OnNoCandidates, Scales, Scored, Slo, Weights};
pub use config::{
    ALGORITHMS, Aggregation, AlgorithmConfig, Bounds, Cascade, ComplexityRule, Config, ContextRule, ConversationRule,
    DEFAULT_PREFILL_TOKENS_PER_S, DecisionConfig, Disaggregation, DomainConfig, DomainLabel, DomainMethod,
    EmbeddingRule, GuardAction, HeaderMutation, HeaderRule, JailbreakRule, KeywordOperator, KeywordRule, LanguageRule,
    LoadRule, PiiRule, PluginConfig, PoolConfig, PrefillWorker, Price, Problem, RESERVED_DECISIONS, ReaskRule,
    RegexRule, ResponseCache, ResponseGuard, RuleNode, RuleOperator, SignalCondition, SignalKind, SignalRef,
    SignalsConfig, Stickiness, Strategy, SystemPromptMode, parse_yaml, validate,
};
pub use decision::{DecisionTrace, RuleOutcome, Selection, evaluate_rule, needed_signals, select};
pub use error::ConfigError;
pub use feedback::{Arm, ELO_K, ELO_START, Evidence, Outcomes, Rng};
pub use guard::{Lane, StreamGuard};
pub use language::{Detected, detect as detect_language, normalize as language_code};
pub use pii::{PiiDetector, PiiFinding, PiiType};
pub use polarity::polarity;
pub use redact::{Placeholders, Redactions, answer_text, redact, redact_answer};
pub use request::{guard_text, set_system_prompt, shape, signal_text, user_turns};
pub use results::{SignalResult, SignalResults};
pub use selector::{Choice, NO_DECISION, Selector, Target, first_eligible, redact_types};
pub use semantic::{
    DomainClassifier, DomainOutcome, Embedder, EmbeddingNeeds, RequestEmbeddings, Vector, centroid, contrastive_score,
    cosine, nearest_mean,
};
pub use signals::{PoolState, Shape, SignalInput, Signals};
