//! The crate's one error type: what is wrong with a routing config. Owns the
//! messages and the stable `kind()` labels; says nothing about where in a file
//! the problem is (line numbers come with file loading).

use crate::config::{RuleOperator, SignalKind, SignalRef};

/// A problem in the `signals` / `decisions` part of a routing config.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A signal or decision without a name.
    #[error("{what} has an empty name")]
    EmptyName {
        /// What is unnamed, e.g. "keyword signal #2".
        what: String,
    },
    /// Two signals of one type share a name.
    #[error("{kind} signal `{name}` is defined more than once")]
    DuplicateSignal {
        /// The signal type.
        kind: SignalKind,
        /// The repeated name.
        name: String,
    },
    /// Two decisions share a name.
    #[error("decision `{name}` is defined more than once")]
    DuplicateDecision {
        /// The repeated name.
        name: String,
    },
    /// A keyword rule with an empty list.
    #[error("keyword signal `{name}` has no keywords")]
    EmptyKeywords {
        /// The rule.
        name: String,
    },
    /// A keyword rule with an empty or blank keyword.
    #[error("keyword signal `{name}` has an empty keyword")]
    BlankKeyword {
        /// The rule.
        name: String,
    },
    /// A pattern that does not compile.
    #[error("{kind} signal `{name}`: the pattern does not compile: {message}")]
    BadRegex {
        /// The signal type (regex, or keyword when the list is too large).
        kind: SignalKind,
        /// The rule.
        name: String,
        /// The regex compiler's message.
        message: String,
    },
    /// A PII rule naming a type we do not detect.
    #[error(
        "pii signal `{name}`: unknown type `{ty}` (known: email, phone, credit_card, iban, us_ssn, ip_address, api_key)"
    )]
    UnknownPiiType {
        /// The rule.
        name: String,
        /// The unknown type as written.
        ty: String,
    },
    /// A PII rule with no types.
    #[error("pii signal `{name}` lists no types")]
    EmptyPiiTypes {
        /// The rule.
        name: String,
    },
    /// A context rule without bounds, or with min above max.
    #[error("context signal `{name}`: {reason}")]
    BadContextBounds {
        /// The rule.
        name: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A language rule with no languages.
    #[error("language signal `{name}` lists no languages")]
    EmptyLanguages {
        /// The rule.
        name: String,
    },
    /// A language rule naming a language the detector does not know.
    #[error("language signal `{name}`: unknown language `{code}` (ISO 639-1 codes such as en, zh, de)")]
    UnknownLanguage {
        /// The rule.
        name: String,
        /// The code as written.
        code: String,
    },
    /// A language rule's `min_confidence` outside [0, 1].
    #[error("language signal `{name}`: min_confidence must be in [0, 1]")]
    BadConfidence {
        /// The rule.
        name: String,
    },
    /// A conversation, header or load rule that cannot match as written.
    #[error("{kind} signal `{name}`: {reason}")]
    BadRule {
        /// The signal type.
        kind: SignalKind,
        /// The rule.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// Embedding signals without an embedding model.
    #[error(
        "embedding, domain, jailbreak, complexity and reask signals need the embedding model (--embedding-model-path)"
    )]
    NoEmbeddingModel,
    /// The embedding model failed on the config's examples.
    #[error("embedding the signals' examples failed: {0}")]
    Embedding(String),
    /// A decision's condition names a signal that is not defined.
    #[error("decision `{decision}` refers to undefined signal {signal}")]
    UnknownSignal {
        /// The decision.
        decision: String,
        /// The missing signal.
        signal: SignalRef,
    },
    /// A NOT node without exactly one condition.
    #[error("decision `{decision}`: NOT at {path} needs exactly one condition, has {children}")]
    NotArity {
        /// The decision.
        decision: String,
        /// Where in its rules, e.g. "AND[1]".
        path: String,
        /// How many it has.
        children: usize,
    },
    /// An AND or OR node without conditions.
    #[error("decision `{decision}`: {operator} at {path} has no conditions")]
    EmptyConditions {
        /// The decision.
        decision: String,
        /// Where in its rules.
        path: String,
        /// AND or OR.
        operator: RuleOperator,
    },
    /// A pool that cannot be built as written.
    #[error("pool `{pool}`: {message}")]
    Pool {
        /// The pool.
        pool: String,
        /// What is wrong.
        message: String,
    },
    /// A decision's pools, algorithm or plugins are wrong.
    #[error("decision `{decision}`: {message}")]
    Decision {
        /// The decision.
        decision: String,
        /// What is wrong.
        message: String,
    },
    /// A top-level key is wrong (`version`, `auto_model_names`, `default_pool`).
    #[error("{key}: {message}")]
    TopLevel {
        /// The key.
        key: &'static str,
        /// What is wrong.
        message: String,
    },
    /// More than one decision without rules.
    #[error("decisions `{first}` and `{second}` both have no rules; only one catch-all is allowed")]
    MultipleCatchAll {
        /// The first catch-all.
        first: String,
        /// Another one.
        second: String,
    },
}

// === impl ConfigError ===

impl ConfigError {
    /// A stable label (metric label, JSON `error.type`, log field).
    pub fn kind(&self) -> &'static str {
        match self {
            ConfigError::EmptyName { .. } => "empty_name",
            ConfigError::DuplicateSignal { .. } => "duplicate_signal",
            ConfigError::DuplicateDecision { .. } => "duplicate_decision",
            ConfigError::EmptyKeywords { .. } => "empty_keywords",
            ConfigError::BlankKeyword { .. } => "blank_keyword",
            ConfigError::BadRegex { .. } => "bad_regex",
            ConfigError::UnknownPiiType { .. } => "unknown_pii_type",
            ConfigError::EmptyPiiTypes { .. } => "empty_pii_types",
            ConfigError::BadContextBounds { .. } => "bad_context_bounds",
            ConfigError::EmptyLanguages { .. } => "empty_languages",
            ConfigError::UnknownLanguage { .. } => "unknown_language",
            ConfigError::BadRule { .. } => "bad_rule",
            ConfigError::BadConfidence { .. } => "bad_confidence",
            ConfigError::UnknownSignal { .. } => "unknown_signal",
            ConfigError::NoEmbeddingModel => "no_embedding_model",
            ConfigError::Embedding(_) => "embedding_failed",
            ConfigError::NotArity { .. } => "not_arity",
            ConfigError::EmptyConditions { .. } => "empty_conditions",
            ConfigError::MultipleCatchAll { .. } => "multiple_catch_all",
            ConfigError::Pool { .. } => "bad_pool",
            ConfigError::Decision { .. } => "bad_decision",
            ConfigError::TopLevel { .. } => "bad_key",
        }
    }

    /// Where in the file the problem is: the section key (`pools`,
    /// `decisions`, `keywords`, ...) and the name of the entry, or a
    /// top-level key alone. Line numbers are found from it ([`crate::parse_yaml`]).
    pub fn subject(&self) -> (&'static str, Option<&str>) {
        use ConfigError as E;
        let signal = |kind: SignalKind| match kind {
            SignalKind::Keyword => "keywords",
            SignalKind::Header => "headers",
            other => other.as_str(),
        };
        match self {
            E::EmptyName { .. } => ("signals", None),
            E::DuplicateSignal { kind, name } => (signal(*kind), Some(name)),
            E::BadRegex { kind, name, .. } | E::BadRule { kind, name, .. } => (signal(*kind), Some(name)),
            E::EmptyKeywords { name } | E::BlankKeyword { name } => ("keywords", Some(name)),
            E::UnknownPiiType { name, .. } | E::EmptyPiiTypes { name } => ("pii", Some(name)),
            E::BadContextBounds { name, .. } => ("context", Some(name)),
            E::EmptyLanguages { name } | E::UnknownLanguage { name, .. } | E::BadConfidence { name } => {
                ("language", Some(name))
            }
            E::DuplicateDecision { name } => ("decisions", Some(name)),
            E::UnknownSignal { decision, .. }
            | E::NotArity { decision, .. }
            | E::EmptyConditions { decision, .. }
            | E::Decision { decision, .. } => ("decisions", Some(decision)),
            E::MultipleCatchAll { second, .. } => ("decisions", Some(second)),
            E::Pool { pool, .. } => ("pools", Some(pool)),
            E::TopLevel { key, .. } => (key, None),
            E::NoEmbeddingModel | E::Embedding(_) => ("signals", None),
        }
    }
}
