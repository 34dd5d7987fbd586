//! `signal-quality`'s tables for the shipped detectors (`preset: default`),
//! on the same held-out data as the example rules (MT-Bench, bastioncorpus),
//! none of which they were trained on (`tools/presets/build_data.py`); with
//! their training texts (`--preset-data`), beside a TF-IDF trained on the
//! same texts (the prototypes' four fifths) and scored the same way.

use std::path::Path;

use model_select::{DomainClassifier, DomainMethod, contrastive_score, presets};
use router_types::SplitMix;
use serde::Deserialize;

use crate::stats::{auc, recall_at_5, split, wilson, with_interval};
use crate::tfidf_sparse::{Sparse, Tfidf, nearest_mean};

/// The TF-IDF baseline: fitted on the detectors' training texts, each class's texts as its
/// vectors (all of them: a stronger baseline than the detectors' prototypes).
pub(crate) struct Baseline {
    domain: (Tfidf, Vec<(String, Vec<Sparse>)>),
    jailbreak: (Tfidf, Vec<Sparse>, Vec<Sparse>),
}

#[derive(Deserialize)]
struct Row<L> {
    text: String,
    label: L,
}

impl Baseline {
    /// Fitted on `dir`'s `domain.jsonl` and `jailbreak.jsonl`, the texts the prototypes were
    /// made of (the held-out fifth left out, as there).
    pub(crate) fn load(dir: &Path) -> anyhow::Result<Self> {
        let trained = |t: &str| !crate::corpus::held_out(t);
        let rows: Vec<Row<String>> = crate::corpus::jsonl(&dir.join("domain.jsonl"))?;
        let rows: Vec<Row<String>> = rows.into_iter().filter(|r| trained(&r.text)).collect();
        let tfidf = Tfidf::fit(&rows.iter().map(|r| r.text.as_str()).collect::<Vec<_>>());
        let mut labels: Vec<String> = rows.iter().map(|r| r.label.clone()).collect();
        labels.sort_unstable();
        labels.dedup();
        let by_label = labels
            .into_iter()
            .map(|l| {
                let own = rows.iter().filter(|r| r.label == l).map(|r| tfidf.vector(&r.text)).collect();
                (l, own)
            })
            .collect();
        let rows: Vec<Row<u8>> = crate::corpus::jsonl(&dir.join("jailbreak.jsonl"))?;
        let rows: Vec<Row<u8>> = rows.into_iter().filter(|r| trained(&r.text)).collect();
        let jt = Tfidf::fit(&rows.iter().map(|r| r.text.as_str()).collect::<Vec<_>>());
        let side = |label: u8| rows.iter().filter(|r| r.label == label).map(|r| jt.vector(&r.text)).collect();
        let (bad, good) = (side(1), side(0));
        Ok(Self { domain: (tfidf, by_label), jailbreak: (jt, bad, good) })
    }

    /// The domain label of each of `texts` (knn, k = 3, as the preset's).
    fn domains(&self, texts: &[&str]) -> Vec<String> {
        let (tfidf, labels) = &self.domain;
        texts
            .iter()
            .map(|t| {
                let v = tfidf.vector(t);
                let scored = labels.iter().map(|(l, set)| (l, nearest_mean(&v, set, 3)));
                scored.max_by(|a, b| a.1.total_cmp(&b.1)).map(|(l, _)| l.clone()).unwrap_or_default()
            })
            .collect()
    }

    /// The contrastive score of each of `texts` (k = 3, as the preset's).
    pub(crate) fn jailbreak_scores(&self, texts: &[&str]) -> Vec<f64> {
        let (tfidf, bad, good) = &self.jailbreak;
        texts
            .iter()
            .map(|t| {
                let v = tfidf.vector(t);
                nearest_mean(&v, bad, 3) - nearest_mean(&v, good, 3)
            })
            .collect()
    }
}

/// The shipped domain classifier on MT-Bench's questions (`labels`, `vectors`, `texts`): its
/// hits by method over all of them and over the categories it has, with the TF-IDF baseline's
/// when given; printed.
pub(crate) fn domain(labels: &[&str], vectors: &[Vec<f32>], texts: &[&str], baseline: Option<&Baseline>) -> [usize; 2] {
    let preset = presets::domain();
    let names: Vec<&str> = preset.labels.iter().map(|(n, _)| n.as_str()).collect();
    let known: Vec<usize> = (0..labels.len()).filter(|&i| names.contains(&labels[i])).collect();
    println!("\n### The shipped classifier (`domain: {{preset: default}}`), trained on none of these\n");
    println!(
        "| method | all {} questions | the {} of its {} labels |\n|---|---:|---:|",
        labels.len(),
        known.len(),
        names.len() - 1
    );
    let mut hits = [0; 2];
    for (slot, (name, method, k)) in
        [("centroid", DomainMethod::Centroid, 1), ("knn (k = 3)", DomainMethod::Knn, 3)].into_iter().enumerate()
    {
        let classifier = DomainClassifier::new(preset.labels.clone(), method, k, 0.0, -1.0);
        let right: Vec<bool> = (0..labels.len())
            .map(|i| classifier.classify(&vectors[i]).label.map(|l| names[l]) == Some(labels[i]))
            .collect();
        hits[slot] = right.iter().filter(|r| **r).count();
        let on_known = known.iter().filter(|&&i| right[i]).count();
        println!("| {name} | {} | {} |", wilson(hits[slot], labels.len()), wilson(on_known, known.len()));
    }
    if let Some(b) = baseline {
        let said = b.domains(texts);
        let right: Vec<bool> = (0..labels.len()).map(|i| said[i] == labels[i]).collect();
        let on_known = known.iter().filter(|&&i| right[i]).count();
        let all = right.iter().filter(|r| **r).count();
        println!(
            "| TF-IDF trained on the same texts, knn (k = 3) | {} | {} |",
            wilson(all, labels.len()),
            wilson(on_known, known.len())
        );
    }
    let missing: Vec<&str> = {
        let mut m: Vec<&str> = labels.iter().copied().filter(|l| !names.contains(l)).collect();
        m.sort_unstable();
        m.dedup();
        m
    };
    println!("\nMT-Bench categories it has no label for (no training data in the pinned wheels): {missing:?}");
    hits
}

/// The shipped jailbreak detector on bastioncorpus (`vectors`, `malicious`) against today's
/// example rule (the end-to-end config's, embedded by `embed`) and, when given, the TF-IDF
/// baseline's scores (`tfidf`): AUC and recall at ≤ 5 % false positives with bootstrap
/// intervals, and what each refuses at its own threshold; printed. Returns the preset's AUC
/// and the example rule's.
pub(crate) fn jailbreak(
    vectors: &[Vec<f32>],
    malicious: &[bool],
    resamples: usize,
    embed: impl Fn(&[&str]) -> anyhow::Result<Vec<Vec<f32>>>,
    tfidf: Option<Vec<f64>>,
) -> anyhow::Result<(f64, f64)> {
    let preset = presets::jailbreak();
    let yaml = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/routing/semantic.yaml"))?;
    let config = model_select::parse_yaml(&yaml).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let rule = &config.signals.jailbreak[0];
    fn text(l: &[String]) -> Vec<&str> {
        l.iter().map(String::as_str).collect()
    }
    let (bad, good) = (embed(&text(&rule.malicious))?, embed(&text(&rule.benign))?);
    let k = rule.k.unwrap_or(1);
    let near = |v: &[f32]| model_select::nearest_mean(v, &bad, k).unwrap_or(0.0);
    let examples: Vec<f64> = vectors.iter().map(|v| contrastive_score(v, &bad, &good, k)).collect();
    let example_hit: Vec<bool> = vectors
        .iter()
        .zip(&examples)
        .map(|(v, s)| *s >= rule.threshold.unwrap_or(0.0) && near(v) >= rule.min_similarity)
        .collect();
    let shipped: Vec<f64> =
        vectors.iter().map(|v| contrastive_score(v, &preset.malicious, &preset.benign, preset.k)).collect();
    let mut rng = SplitMix::new(2);
    println!(
        "\n### The shipped detector (`jailbreak: [{{name: attack, preset: default}}]`), trained on none of these\n"
    );
    println!("Against today's example rule (tests/routing/semantic.yaml: 4 attacks, 3 benign, as configured).\n");
    println!("| metric | preset `default` | the example rule |\n|---|---:|---:|");
    let (pos, neg) = split(&shipped, malicious, |_| true);
    let (epos, eneg) = split(&examples, malicious, |_| true);
    let a = with_interval(&pos, &neg, auc, resamples, &mut rng);
    let ea = with_interval(&epos, &eneg, auc, resamples, &mut rng);
    println!("| ROC AUC | {} | {} |", a.3, ea.3);
    let r = with_interval(&pos, &neg, recall_at_5, resamples, &mut rng);
    let er = with_interval(&epos, &eneg, recall_at_5, resamples, &mut rng);
    println!("| recall at ≤ 5 % false positives | {} | {} |", r.3, er.3);
    if let Some(scores) = &tfidf {
        let (tpos, tneg) = split(scores, malicious, |_| true);
        let ta = with_interval(&tpos, &tneg, auc, resamples, &mut rng);
        let tr = with_interval(&tpos, &tneg, recall_at_5, resamples, &mut rng);
        println!("| TF-IDF trained on the same texts (k = 3): ROC AUC | {} | |", ta.3);
        println!("| TF-IDF trained on the same texts: recall at ≤ 5 % false positives | {} | |", tr.3);
    }
    let t = preset.threshold;
    let n_pos = malicious.iter().filter(|m| **m).count();
    let n_neg = malicious.len() - n_pos;
    let count = |attack: bool, hit: &dyn Fn(usize) -> bool| {
        (0..malicious.len()).filter(|&i| malicious[i] == attack && hit(i)).count()
    };
    let ours = |i: usize| shipped[i] >= t;
    let theirs = |i: usize| example_hit[i];
    println!(
        "| refused at its threshold: attacks | {} | {} |",
        wilson(count(true, &ours), n_pos),
        wilson(count(true, &theirs), n_pos)
    );
    println!(
        "| refused at its threshold: benign hard negatives | {} | {} |",
        wilson(count(false, &ours), n_neg),
        wilson(count(false, &theirs), n_neg)
    );
    println!("\n(the preset's threshold {t:.4}, k = {}: 1 % of its held-out ordinary texts refused)", preset.k);
    Ok((a.0, ea.0))
}
