//! The embedding signals (`docs/model-routing.md` §3): compiled once from the
//! config with an [`Embedder`] (the examples' and candidates' vectors), then
//! evaluated per request on the vectors the caller computed off the serving
//! threads ([`RequestEmbeddings`]). Pure arithmetic on unit vectors; owns no
//! model. A vector that could not be computed makes its signals report an
//! error (a `failed` leaf matches it) instead of silently not matching.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use crate::config::{Aggregation, DomainConfig, DomainMethod, SignalKind, SignalRef, SignalsConfig, uses_embeddings};
use crate::error::ConfigError;
use crate::results::{SignalResult, SignalResults};

/// Turns texts into unit-length vectors (the router's embedding pool; a
/// stand-in in tests). Used when compiling a config, not per request.
pub trait Embedder {
    /// One vector per text, in order.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String>;
}

/// A vector, or why there is none.
pub type Vector = Result<Arc<[f32]>, String>;

/// What the embedding model said of one request (each part only when
/// [`EmbeddingNeeds`] asked for it).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestEmbeddings {
    /// The last user turn.
    pub last: Option<Vector>,
    /// The user turn before it (none in a one-turn chat).
    pub previous: Option<Vector>,
    /// Every user turn's text together.
    pub history: Option<Vector>,
}

/// Which vectors the reachable decisions read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EmbeddingNeeds {
    /// The last user turn's.
    pub last: bool,
    /// The previous user turn's (re-ask).
    pub previous: bool,
    /// The whole conversation's user text (jailbreak with `history`).
    pub history: bool,
}

impl EmbeddingNeeds {
    /// Whether any vector is needed.
    pub fn any(self) -> bool {
        self.last || self.previous || self.history
    }
}

/// The cosine similarity of two unit vectors: their dot product, in eight
/// f32 lanes (the compiler vectorizes it; a response cache scans thousands;
/// 384 products of unit vectors lose about 1e-6 against an f64 sum).
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    let mut lanes = [0f32; 8];
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    f64::from(lanes.iter().sum::<f32>() + tail)
}

/// The mean similarity of `v` to its `k` most similar `examples` (fewer
/// when there are fewer; `None` without examples).
pub fn nearest_mean(v: &[f32], examples: &[Vec<f32>], k: usize) -> Option<f64> {
    if examples.is_empty() {
        return None;
    }
    let mut sims: Vec<f64> = examples.iter().map(|e| cosine(v, e)).collect();
    let k = k.clamp(1, sims.len());
    sims.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    Some(sims[..k].iter().sum::<f64>() / k as f64)
}

/// The contrastive score: nearest positives minus nearest negatives (the
/// positive side alone without negatives).
pub fn contrastive_score(v: &[f32], positive: &[Vec<f32>], negative: &[Vec<f32>], k: usize) -> f64 {
    nearest_mean(v, positive, k).unwrap_or(0.0) - nearest_mean(v, negative, k).unwrap_or(0.0)
}

/// The pair with the higher first element.
fn max_pair(a: (f64, f64), b: (f64, f64)) -> (f64, f64) {
    if b.0 > a.0 { b } else { a }
}

/// The normalised mean of unit vectors.
pub fn centroid(vectors: &[Vec<f32>]) -> Vec<f32> {
    let dim = vectors.first().map_or(0, Vec::len);
    let mut c = vec![0f64; dim];
    for v in vectors {
        for (s, x) in c.iter_mut().zip(v) {
            *s += f64::from(*x);
        }
    }
    let norm = c.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-12);
    c.iter().map(|x| (x / norm) as f32).collect()
}

/// The domain classifier: a label per request, or none (the fallback).
#[derive(Debug, Clone)]
pub struct DomainClassifier {
    labels: Vec<(String, Vec<Vec<f32>>, Vec<f32>)>,
    method: DomainMethod,
    k: usize,
    min_margin: f64,
    min_similarity: f64,
}

/// A domain classification.
#[derive(Debug, Clone, PartialEq)]
pub struct DomainOutcome {
    /// The label's index, or `None`: not clear enough (the fallback).
    pub label: Option<usize>,
    /// Each label's score.
    pub scores: Vec<f64>,
    /// The best score minus the second's.
    pub margin: f64,
}

impl DomainClassifier {
    /// From each label's examples' vectors.
    pub fn new(
        labels: Vec<(String, Vec<Vec<f32>>)>,
        method: DomainMethod,
        k: usize,
        min_margin: f64,
        min_similarity: f64,
    ) -> Self {
        let labels = labels.into_iter().map(|(n, ex)| (n, centroid(&ex), ex)).map(|(n, c, ex)| (n, ex, c)).collect();
        DomainClassifier { labels, method, k, min_margin, min_similarity }
    }

    /// The labels, in order.
    pub fn labels(&self) -> impl Iterator<Item = &str> {
        self.labels.iter().map(|(n, _, _)| n.as_str())
    }

    /// Classifies `v`.
    pub fn classify(&self, v: &[f32]) -> DomainOutcome {
        let scores: Vec<f64> = self
            .labels
            .iter()
            .map(|(_, examples, c)| match self.method {
                DomainMethod::Centroid => cosine(v, c),
                DomainMethod::Knn => nearest_mean(v, examples, self.k).unwrap_or(f64::MIN),
            })
            .collect();
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        let best = order.first().map_or(f64::MIN, |&i| scores[i]);
        let margin = order.get(1).map_or(f64::INFINITY, |&i| best - scores[i]);
        let clear = margin >= self.min_margin && best >= self.min_similarity;
        DomainOutcome { label: order.first().copied().filter(|_| clear), scores, margin }
    }
}

/// A compiled jailbreak or complexity rule.
#[derive(Debug, Clone)]
struct Contrastive {
    signal: SignalRef,
    positive: Vec<Vec<f32>>,
    negative: Vec<Vec<f32>>,
    threshold: f64,
    k: usize,
    /// The nearest positives' similarity must reach this too.
    min_similarity: f64,
    /// Score the whole conversation's user text too.
    history: bool,
}

/// The compiled embedding signals.
#[derive(Debug, Clone, Default)]
pub(crate) struct Semantic {
    embedding: Vec<(SignalRef, Vec<Vec<f32>>, f64, Aggregation)>,
    /// The classifier, the fallback's signal, and the label that stands for the fallback (a
    /// preset's texts of no domain).
    domain: Option<(DomainClassifier, SignalRef, Option<usize>)>,
    contrastive: Vec<Contrastive>,
    reask: Vec<(SignalRef, f64)>,
}

impl Semantic {
    /// Embeds every example and candidate of `config` (each distinct text once).
    pub(crate) fn compile<'c>(
        config: &'c SignalsConfig,
        embedder: Option<&dyn Embedder>,
    ) -> Result<Semantic, ConfigError> {
        if !uses_embeddings(config) {
            return Ok(Semantic::default());
        }
        let embedder = embedder.ok_or(ConfigError::NoEmbeddingModel)?;
        let jailbreak_preset = config.jailbreak.iter().any(|r| r.preset.is_some());
        let domain_preset = config.domain.as_ref().is_some_and(|d| d.preset.is_some());
        if jailbreak_preset {
            let p = crate::presets::jailbreak();
            check_model(embedder, &p.model, p.probe())?;
        }
        if domain_preset {
            let p = crate::presets::domain();
            check_model(embedder, &p.model, p.probe())?;
        }
        let mut texts: Vec<&str> = Vec::new();
        let mut seen = HashSet::new();
        let mut add = |list: &'c [String]| {
            for t in list {
                if seen.insert(t.as_str()) {
                    texts.push(t.as_str());
                }
            }
        };
        config.embedding.iter().for_each(|r| add(&r.candidates));
        config.domain.iter().flat_map(|d| &d.labels).for_each(|l| add(&l.examples));
        config.jailbreak.iter().for_each(|r| {
            add(&r.malicious);
            add(&r.benign)
        });
        config.complexity.iter().for_each(|r| {
            add(&r.hard);
            add(&r.easy)
        });
        let vectors =
            if texts.is_empty() { Vec::new() } else { embedder.embed(&texts).map_err(ConfigError::Embedding)? };
        if vectors.len() != texts.len() {
            return Err(ConfigError::Embedding(format!("{} vectors for {} texts", vectors.len(), texts.len())));
        }
        let by_text: BTreeMap<&str, &Vec<f32>> = texts.iter().copied().zip(&vectors).collect();
        let of = |list: &[String]| list.iter().map(|t| by_text[t.as_str()].clone()).collect::<Vec<_>>();
        let signal = SignalRef::new;
        Ok(Semantic {
            embedding: config
                .embedding
                .iter()
                .map(|r| (signal(SignalKind::Embedding, &r.name), of(&r.candidates), r.threshold, r.aggregation))
                .collect(),
            domain: config.domain.as_ref().map(|d: &DomainConfig| {
                let mut labels: Vec<(String, Vec<Vec<f32>>)> =
                    if d.preset.is_some() { crate::presets::domain().labels.clone() } else { Vec::new() };
                for l in &d.labels {
                    match labels.iter_mut().find(|(n, _)| *n == l.name) {
                        Some((_, protos)) => protos.extend(of(&l.examples)),
                        None => labels.push((l.name.clone(), of(&l.examples))),
                    }
                }
                let fallback = labels.iter().position(|(n, _)| *n == d.fallback);
                let shipped = if d.preset.is_some() { DomainMethod::Knn } else { DomainMethod::Centroid };
                let method = d.method.unwrap_or(shipped);
                let classifier = DomainClassifier::new(labels, method, d.k, d.min_margin, d.min_similarity);
                (classifier, signal(SignalKind::Domain, &d.fallback), fallback)
            }),
            contrastive: config
                .jailbreak
                .iter()
                .map(|r| {
                    let shipped = r.preset.as_ref().map(|_| crate::presets::jailbreak());
                    let with = |p: Option<&Vec<Vec<f32>>>, own: &[String]| {
                        p.into_iter().flatten().cloned().chain(of(own)).collect::<Vec<_>>()
                    };
                    Contrastive {
                        signal: signal(SignalKind::Jailbreak, &r.name),
                        positive: with(shipped.map(|p| &p.malicious), &r.malicious),
                        negative: with(shipped.map(|p| &p.benign), &r.benign),
                        threshold: r.threshold.or(shipped.map(|p| p.threshold)).unwrap_or(0.0),
                        k: r.k.or(shipped.map(|p| p.k)).unwrap_or(1),
                        min_similarity: r.min_similarity,
                        history: r.history,
                    }
                })
                .chain(config.complexity.iter().map(|r| Contrastive {
                    signal: signal(SignalKind::Complexity, &r.name),
                    positive: of(&r.hard),
                    negative: of(&r.easy),
                    threshold: r.threshold,
                    k: r.k,
                    min_similarity: -1.0,
                    history: false,
                }))
                .collect(),
            reask: config.reask.iter().map(|r| (signal(SignalKind::Reask, &r.name), r.threshold)).collect(),
        })
    }

    /// Which vectors the `needed` signals read.
    pub(crate) fn needs(&self, needed: &HashSet<SignalRef>) -> EmbeddingNeeds {
        let semantic = |k: SignalKind| {
            matches!(k, SignalKind::Embedding | SignalKind::Domain | SignalKind::Jailbreak | SignalKind::Complexity)
        };
        EmbeddingNeeds {
            last: needed.iter().any(|s| semantic(s.kind) || s.kind == SignalKind::Reask),
            previous: needed.iter().any(|s| s.kind == SignalKind::Reask),
            history: self.contrastive.iter().any(|c| c.history && needed.contains(&c.signal)),
        }
    }

    /// Whether the `jailbreak` rule `name` matches the text of vector `v` (its last-turn score;
    /// `None`: no such rule).
    pub(crate) fn jailbreak(&self, name: &str, v: &[f32]) -> Option<bool> {
        let c = self.contrastive.iter().find(|c| c.signal.kind == SignalKind::Jailbreak && c.signal.name == name)?;
        let near = nearest_mean(v, &c.positive, c.k).unwrap_or(0.0);
        let score = near - nearest_mean(v, &c.negative, c.k).unwrap_or(0.0);
        Some(score >= c.threshold && near >= c.min_similarity)
    }

    /// Computes the `needed` embedding signals into `out`.
    pub(crate) fn evaluate(
        &self,
        input: Option<&RequestEmbeddings>,
        needed: &HashSet<SignalRef>,
        out: &mut SignalResults,
    ) {
        let missing: Vector = Err("no embedding was computed".to_owned());
        let part = |p: Option<&Option<Vector>>| -> Vector { p.and_then(Option::clone).unwrap_or(missing.clone()) };
        let last = part(input.map(|i| &i.last));
        let result = |matched: bool, confidence: f64, value: f64| SignalResult {
            matched,
            confidence: if matched { confidence.clamp(0.0, 1.0) } else { 0.0 },
            value: Some(value),
        };
        for (s, candidates, threshold, aggregation) in self.embedding.iter().filter(|e| needed.contains(&e.0)) {
            match &last {
                Ok(v) => {
                    let sims = candidates.iter().map(|c| cosine(v, c));
                    let sim = match aggregation {
                        Aggregation::Max => sims.fold(f64::MIN, f64::max),
                        Aggregation::Mean => sims.sum::<f64>() / candidates.len().max(1) as f64,
                    };
                    out.insert(s.clone(), result(sim >= *threshold, sim, sim));
                }
                Err(e) => out.fail(s.clone(), e),
            }
        }
        if let Some((classifier, fallback, stands_for)) = &self.domain {
            let wanted: Vec<(Option<usize>, SignalRef)> = classifier
                .labels()
                .enumerate()
                .filter(|(i, _)| Some(*i) != *stands_for)
                .map(|(i, n)| (Some(i), SignalRef::new(SignalKind::Domain, n)))
                .chain([(None, fallback.clone())])
                .filter(|(_, s)| needed.contains(s))
                .collect();
            if !wanted.is_empty() {
                match &last {
                    Ok(v) => {
                        let mut o = classifier.classify(v);
                        o.label = o.label.filter(|l| Some(*l) != *stands_for);
                        let best = o.scores.iter().copied().fold(f64::MIN, f64::max);
                        for (label, s) in wanted {
                            let value = label.map_or(best, |i| o.scores[i]);
                            out.insert(s, result(o.label == label, value, value));
                        }
                    }
                    Err(e) => wanted.into_iter().for_each(|(_, s)| out.fail(s, e)),
                }
            }
        }
        let history = self.contrastive.iter().any(|c| c.history && needed.contains(&c.signal));
        let whole = if history { part(input.map(|i| &i.history)) } else { missing.clone() };
        for c in self.contrastive.iter().filter(|c| needed.contains(&c.signal)) {
            // (score, nearest positives' similarity) of a vector; over the history too, the higher.
            let score = |v: &[f32]| {
                let near = nearest_mean(v, &c.positive, c.k).unwrap_or(0.0);
                (near - nearest_mean(v, &c.negative, c.k).unwrap_or(0.0), near)
            };
            let scored = match (&last, c.history) {
                (Ok(v), false) => Ok(score(v)),
                (Ok(v), true) => whole.as_ref().map(|h| max_pair(score(v), score(h))).map_err(Clone::clone),
                (Err(e), _) => Err(e.clone()),
            };
            match scored {
                Ok((x, near)) => {
                    let matched = x >= c.threshold && near >= c.min_similarity;
                    out.insert(c.signal.clone(), result(matched, near, x))
                }
                Err(e) => out.fail(c.signal.clone(), &e),
            }
        }
        let previous = part(input.map(|i| &i.previous));
        for (s, threshold) in self.reask.iter().filter(|r| needed.contains(&r.0)) {
            match (&last, &previous, input.is_some_and(|i| i.previous.is_none())) {
                // One user turn: nothing is asked again.
                (Ok(_), _, true) => {
                    out.insert(s.clone(), SignalResult { matched: false, confidence: 0.0, value: None })
                }
                (Ok(v), Ok(p), false) => {
                    let sim = cosine(v, p);
                    out.insert(s.clone(), result(sim >= *threshold, sim, sim))
                }
                (Err(e), _, _) | (_, Err(e), _) => out.fail(s.clone(), e),
            }
        }
    }
}

/// Whether `embedder` is the model a preset was trained on (`model`, its probe vector `probe`).
fn check_model(embedder: &dyn Embedder, model: &str, probe: &[f32]) -> Result<(), ConfigError> {
    let ours = embedder.embed(&[crate::presets::PROBE_TEXT]).map_err(ConfigError::Embedding)?;
    let sim = ours.first().map_or(-1.0, |v| if v.len() == probe.len() { cosine(v, probe) } else { -1.0 });
    if sim < crate::presets::SAME_MODEL {
        return Err(ConfigError::Embedding(format!(
            "preset `default` was trained on {model}; the embedding model is another (probe cosine {sim:.3})"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
