//! Model selection for `model: auto`: which pool serves a request, decided by
//! declarative rules over request signals (the vLLM Semantic Router's rule
//! shape, see `docs/model-routing.md` §1 and §4). This crate owns the
//! `signals`/`decisions`/`strategy` part of the routing config, the rule
//! signals and the decision evaluator; it does no I/O, knows no HTTP, and
//! leaves pools, workers and algorithms to others.
//!
//! ```text
//! Config ──validate──▶ Signals::compile ──▶ Signals::evaluate(text, tokens, needed)
//!                                                  │ SignalResults
//!                        needed_signals(decisions) ┘        ▼
//!                                          decision::select ──▶ Selection {winner, trace}
//! ```

mod config;
mod decision;
mod error;
mod pii;
mod signals;

pub use config::{
    AlgorithmConfig, Bounds, Config, ContextRule, DecisionConfig, KeywordOperator, KeywordRule, LanguageRule, PiiRule,
    RegexRule, RuleNode, RuleOperator, SignalCondition, SignalKind, SignalRef, SignalsConfig, Strategy, validate,
};
pub use decision::{DecisionTrace, RuleOutcome, Selection, evaluate_rule, needed_signals, select};
pub use error::ConfigError;
pub use pii::{PiiDetector, PiiFinding, PiiType};
pub use signals::{SignalInput, SignalResult, SignalResults, Signals};
