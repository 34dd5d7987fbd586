//! The embedding signals' rules (`docs/model-routing.md` §3): similarity to
//! candidate phrases, the domain classifier over labelled examples,
//! contrastive rules (jailbreak, complexity) and semantic re-ask. Shape and
//! validation only; `semantic` compiles and evaluates them.

use std::collections::HashSet;

use serde::Deserialize;

use super::{SignalKind, SignalsConfig};
use crate::error::ConfigError;

/// An `embedding` rule: the last user turn's similarity to the candidates.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingRule {
    /// The signal's name.
    pub name: String,
    /// Phrases to compare with.
    pub candidates: Vec<String>,
    /// Matched at or above this cosine similarity (default 0.6).
    #[serde(default = "default_similarity")]
    pub threshold: f64,
    /// How the candidates' similarities combine: `max` (default) or `mean`.
    #[serde(default)]
    pub aggregation: Aggregation,
}

/// How several similarities become one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Aggregation {
    /// The highest.
    #[default]
    Max,
    /// The mean.
    Mean,
}

/// The `domain` classifier: each label's examples; a request is given the
/// nearest label, or the fallback when the nearest is not clear enough.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainConfig {
    /// The shipped classifier (`default`: math, coding, reasoning, writing, extraction, stem,
    /// humanities, and its texts of no such domain for the fallback), trained here on public
    /// data; `labels` then add examples to its labels, or labels of their own.
    #[serde(default)]
    pub preset: Option<String>,
    /// The labels; each is a signal `{type: domain, name: <label>}`.
    #[serde(default)]
    pub labels: Vec<DomainLabel>,
    /// `centroid` (the default without a preset: similarity to the mean of each label's
    /// examples) or `knn` (the mean of each label's `k` most similar examples; the preset's
    /// default).
    #[serde(default)]
    pub method: Option<DomainMethod>,
    /// Examples per label `knn` averages (default 3).
    #[serde(default = "three")]
    pub k: usize,
    /// The fallback is chosen when the best label's score beats the second's
    /// by less than this (default 0).
    #[serde(default)]
    pub min_margin: f64,
    /// … or when the best label's score is below this (default: none, -1).
    #[serde(default = "minus_one")]
    pub min_similarity: f64,
    /// The label of a request no label is clear for (default `other`); also a signal.
    #[serde(default = "other")]
    pub fallback: String,
}

/// One domain label.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainLabel {
    /// The label.
    pub name: String,
    /// Example requests of this domain.
    pub examples: Vec<String>,
}

/// How the domain classifier scores a label.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DomainMethod {
    /// Cosine similarity to the normalised mean of the label's examples.
    #[default]
    Centroid,
    /// The mean similarity of the label's `k` nearest examples.
    Knn,
}

/// A `jailbreak` rule: more like the malicious examples than the benign ones.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JailbreakRule {
    /// The signal's name.
    pub name: String,
    /// The shipped detector (`default`), trained here on public attacks and ordinary
    /// requests; the examples below then tune it (they join its prototypes).
    #[serde(default)]
    pub preset: Option<String>,
    /// Attacks (none needed with a preset).
    #[serde(default)]
    pub malicious: Vec<String>,
    /// Harmless requests that look alike (hard negatives).
    #[serde(default)]
    pub benign: Vec<String>,
    /// Matched when the score is at least this (default 0, or the preset's: 5 % false
    /// positives on its held-out benign texts): the mean similarity of the `k` nearest
    /// malicious examples minus that of the `k` nearest benign ones (without benign
    /// examples, the first term alone).
    #[serde(default)]
    pub threshold: Option<f64>,
    /// Examples on each side the score averages (default 1: the nearest; the preset's 3).
    #[serde(default)]
    pub k: Option<usize>,
    /// … and only when the nearest malicious examples are at least this
    /// similar (default -1: no floor); keeps a text unlike both sides (a
    /// maths question) from matching on a small difference.
    #[serde(default = "minus_one")]
    pub min_similarity: f64,
    /// Also score the whole conversation's user text, not only the last
    /// turn; the higher score counts (a second embedding).
    #[serde(default)]
    pub history: bool,
}

/// A `complexity` rule: more like the hard examples than the easy ones.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComplexityRule {
    /// The signal's name.
    pub name: String,
    /// Requests that need the larger model.
    pub hard: Vec<String>,
    /// Requests the small model answers well.
    pub easy: Vec<String>,
    /// Matched when the score (hard minus easy, as a jailbreak rule's) is at least this (default 0).
    #[serde(default)]
    pub threshold: f64,
    /// Examples on each side the score averages (default 1).
    #[serde(default = "one_k")]
    pub k: usize,
}

/// A `reask` rule: the last user turn says again what the previous one said.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReaskRule {
    /// The signal's name.
    pub name: String,
    /// Matched at or above this similarity of the two turns (default 0.85).
    #[serde(default = "default_reask")]
    pub threshold: f64,
}

fn default_similarity() -> f64 {
    0.6
}
fn default_reask() -> f64 {
    0.85
}
fn three() -> usize {
    3
}
fn one_k() -> usize {
    1
}
fn minus_one() -> f64 {
    -1.0
}
fn other() -> String {
    "other".to_owned()
}

/// Whether the signals include any that needs the embedding model.
pub(crate) fn uses_embeddings(s: &SignalsConfig) -> bool {
    !s.embedding.is_empty()
        || s.domain.is_some()
        || !s.jailbreak.is_empty()
        || !s.complexity.is_empty()
        || !s.reask.is_empty()
}

/// Records a signal's definition (kind, position, name), reporting a duplicate or blank name.
pub(super) type Define<'a> = dyn FnMut(SignalKind, usize, &str, &mut Vec<ConfigError>) + 'a;

/// Checks the embedding rules; `define` records each signal (and reports duplicates).
pub(super) fn check(s: &SignalsConfig, errors: &mut Vec<ConfigError>, define: &mut Define<'_>) {
    let bad = |errors: &mut Vec<ConfigError>, kind: SignalKind, name: &str, reason: String| {
        errors.push(ConfigError::BadRule { kind, name: name.to_owned(), reason })
    };
    let similarity = |x: f64| (-1.0..=1.0).contains(&x);
    let blank = |list: &[String]| list.iter().any(|t| t.trim().is_empty());
    for (i, r) in s.embedding.iter().enumerate() {
        define(SignalKind::Embedding, i, &r.name, errors);
        if r.candidates.is_empty() || blank(&r.candidates) {
            bad(errors, SignalKind::Embedding, &r.name, "needs candidates, none blank".into());
        }
        if !similarity(r.threshold) {
            bad(errors, SignalKind::Embedding, &r.name, "threshold must be a similarity in [-1, 1]".into());
        }
    }
    let preset = |errors: &mut Vec<ConfigError>, kind: SignalKind, name: &str, p: &Option<String>| {
        if let Some(p) = p.as_deref().filter(|p| !crate::presets::PRESETS.contains(p)) {
            bad(errors, kind, name, format!("unknown preset `{p}` (known: {})", crate::presets::PRESETS.join(", ")));
        }
    };
    if let Some(d) = &s.domain {
        let mut seen = HashSet::new();
        preset(errors, SignalKind::Domain, &d.fallback, &d.preset);
        // The preset's labels are signals too (its texts of no domain are the fallback's).
        let shipped: Vec<&str> = match d.preset {
            Some(_) => {
                crate::presets::domain().labels.iter().map(|(n, _)| n.as_str()).filter(|n| *n != d.fallback).collect()
            }
            None => Vec::new(),
        };
        for (i, name) in shipped.iter().enumerate() {
            define(SignalKind::Domain, i, name, errors);
            seen.insert(*name);
        }
        for (i, l) in d.labels.iter().enumerate() {
            if !shipped.contains(&l.name.as_str()) {
                define(SignalKind::Domain, shipped.len() + i, &l.name, errors);
            }
            seen.insert(l.name.as_str());
            if l.examples.is_empty() || blank(&l.examples) {
                bad(errors, SignalKind::Domain, &l.name, "needs examples, none blank".into());
            }
        }
        if seen.len() < 2 {
            bad(errors, SignalKind::Domain, &d.fallback, "the classifier needs at least two labels".into());
        }
        if seen.contains(d.fallback.as_str()) {
            bad(errors, SignalKind::Domain, &d.fallback, "the fallback cannot also be a label".into());
        } else {
            define(SignalKind::Domain, seen.len(), &d.fallback, errors);
        }
        if d.k == 0 {
            bad(errors, SignalKind::Domain, &d.fallback, "k must be at least 1".into());
        }
        if !(0.0..=2.0).contains(&d.min_margin) || !similarity(d.min_similarity) {
            bad(errors, SignalKind::Domain, &d.fallback, "min_margin in [0, 2], min_similarity in [-1, 1]".into());
        }
    }
    let mut contrastive = |errors: &mut Vec<ConfigError>,
                           kind: SignalKind,
                           (i, name, shipped): (usize, &str, bool),
                           pos: &[String],
                           neg: &[String],
                           k: usize| {
        define(kind, i, name, errors);
        if (pos.is_empty() && !shipped) || blank(pos) || blank(neg) {
            bad(errors, kind, name, "needs positive examples, none blank".into());
        }
        if k == 0 {
            bad(errors, kind, name, "k must be at least 1".into());
        }
    };
    for (i, r) in s.jailbreak.iter().enumerate() {
        contrastive(
            errors,
            SignalKind::Jailbreak,
            (i, &r.name, r.preset.is_some()),
            &r.malicious,
            &r.benign,
            r.k.unwrap_or(1),
        );
        preset(errors, SignalKind::Jailbreak, &r.name, &r.preset);
        if !similarity(r.min_similarity) || r.threshold.is_some_and(|t| !(-2.0..=2.0).contains(&t)) {
            bad(
                errors,
                SignalKind::Jailbreak,
                &r.name,
                "min_similarity must be a similarity in [-1, 1], threshold in [-2, 2]".into(),
            );
        }
    }
    for (i, r) in s.complexity.iter().enumerate() {
        contrastive(errors, SignalKind::Complexity, (i, &r.name, false), &r.hard, &r.easy, r.k);
    }
    for (i, r) in s.reask.iter().enumerate() {
        define(SignalKind::Reask, i, &r.name, errors);
        if !similarity(r.threshold) {
            bad(errors, SignalKind::Reask, &r.name, "threshold must be a similarity in [-1, 1]".into());
        }
    }
}
