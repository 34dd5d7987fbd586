//! `sgl-router-bench signal-quality`: the embedding signals' quality on
//! labelled data no one here wrote, against a TF-IDF baseline computed in the
//! same run with the same classifiers (the router's own
//! [`model_select::DomainClassifier`] and [`model_select::contrastive_score`]):
//! - domain: MT-Bench's 80 questions in 8 categories, leave-one-out (each
//!   question classified by the other 79), accuracy with Wilson 95 % intervals;
//! - jailbreak: bastioncorpus's 181 rows (malicious and benign hard
//!   negatives), leave-one-out contrastive scores, ROC AUC and recall at
//!   ≤ 5 % false positives with stratified-bootstrap 95 % intervals, overall and
//!   per attack category.
//!
//! `--check` fails unless the embedding beats TF-IDF on domain accuracy and
//! jailbreak AUC.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Result, bail};
use model_select::{DomainClassifier, DomainMethod, contrastive_score};
use router_types::SplitMix;
use serde::Deserialize;

use crate::corpus::{jsonl, terms};
use crate::fidelity::{Figures, Vectors};
use crate::stats::{auc, recall_at_5, split, wilson, with_interval};

/// The command's arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct SignalQualityArgs {
    /// The sentence-embedding model directory (all-MiniLM-L6-v2; `tools/embed_eval/fetch.sh`).
    #[arg(long, env = "SGL_ROUTER_EMBED_MODEL")]
    model: PathBuf,
    /// MT-Bench's `question.jsonl`.
    #[arg(long, env = "SGL_ROUTER_MTBENCH")]
    mtbench: PathBuf,
    /// bastioncorpus's `injections.jsonl`.
    #[arg(long, env = "SGL_ROUTER_BASTION")]
    bastion: PathBuf,
    /// Examples per side the jailbreak score averages, and per label for knn.
    #[arg(long, default_value_t = 1)]
    k: usize,
    /// Bootstrap resamples for the intervals.
    #[arg(long, default_value_t = 2000)]
    resamples: usize,
    /// How the encoder computes (`auto`, `int8`, `f32`). At int8 the f32 encoder runs too: the
    /// fidelity table (cosines, every figure against f32's interval).
    #[arg(long, default_value = "auto")]
    precision: embed::Precision,
    /// Exit non-zero unless the embedding beats TF-IDF on domain accuracy and jailbreak AUC, the
    /// shipped jailbreak detector the end-to-end config's example rule (AUC), and
    /// no two different MT-Bench turns would hit a semantic cache at 0.95; at int8 also unless
    /// every cosine to f32 is at least 0.99 and every figure within f32's 95 % interval.
    #[arg(long)]
    check: bool,
    /// The shipped detectors' training texts (`tools/presets/build_data.py`'s output): a TF-IDF
    /// trained on the same texts joins their tables as a baseline.
    #[arg(long)]
    preset_data: Option<PathBuf>,
}

#[derive(Deserialize)]
struct Question {
    category: String,
    turns: Vec<String>,
}

#[derive(Deserialize)]
struct Row {
    category: String,
    label: String,
    text: String,
}

/// The labelled texts.
struct Data {
    questions: Vec<Question>,
    rows: Vec<Row>,
}

/// Runs the command.
pub(crate) fn run(a: &SignalQualityArgs) -> Result<()> {
    let data = Data { questions: jsonl(&a.mtbench)?, rows: jsonl(&a.bastion)? };
    let encoder = embed::Encoder::load_with(&a.model, a.precision).map_err(anyhow::Error::msg)?;
    println!("precision: {}\n", encoder.precision().as_str());
    let (figures, vectors) = measure(&encoder, &data, a, true)?;
    let (n, mut failures) = (data.questions.len(), Vec::new());
    if encoder.precision() == embed::Precision::Int8 {
        let reference = embed::Encoder::load_with(&a.model, embed::Precision::F32).map_err(anyhow::Error::msg)?;
        let (f32_figures, f32_vectors) = measure(&reference, &data, a, false)?;
        failures.extend(crate::fidelity::report(n, &vectors, &f32_vectors, &figures.own, &f32_figures.own));
    }
    if a.check {
        let t = figures.tfidf;
        if figures.own.domain[0] < t.0 {
            failures.push(format!("domain accuracy {}/{n} under TF-IDF's {}/{n}", figures.own.domain[0], t.0));
        }
        if figures.own.auc.0 < t.1 {
            failures.push(format!("jailbreak AUC {:.3} under TF-IDF's {:.3}", figures.own.auc.0, t.1));
        }
        if let Some((shipped, example)) = figures.presets
            && shipped <= example
        {
            failures.push(format!(
                "the shipped jailbreak detector's AUC {shipped:.3} is not above the example rule's {example:.3}"
            ));
        }
        if figures.own.false_hits > 0 {
            failures.push(format!(
                "{} pairs of different MT-Bench turns would hit a semantic cache at 0.95",
                figures.own.false_hits
            ));
        }
        if !failures.is_empty() {
            bail!("the embedding signals fall short: {}", failures.join("; "));
        }
        println!(
            "\ncheck: the embedding beats TF-IDF on domain accuracy and jailbreak AUC, the shipped detector the example rule"
        );
    }
    Ok(())
}

/// An encoder's figures and the TF-IDF baseline's (domain centroid hits, AUC).
struct Measured {
    own: Figures,
    tfidf: (usize, f64),
    /// The shipped jailbreak detector's AUC and today's example rule's (when printed).
    presets: Option<(f64, f64)>,
}

/// Every figure of `encoder` on `data` (printed with the TF-IDF baseline when `print`).
fn measure(encoder: &embed::Encoder, data: &Data, a: &SignalQualityArgs, print: bool) -> Result<(Measured, Vectors)> {
    let (questions, rows) = (&data.questions, &data.rows);
    let start = Instant::now();
    let q_texts: Vec<&str> = questions.iter().map(|q| q.turns.first().map_or("", String::as_str)).collect();
    let r_texts: Vec<&str> = rows.iter().map(|r| r.text.as_str()).collect();
    let turns: Vec<&str> = questions.iter().flat_map(|q| q.turns.iter().map(String::as_str)).collect();
    let embed_all = |texts: &[&str]| -> Result<Vec<Vec<f32>>> {
        let mut out = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(16) {
            out.extend(encoder.embed_batch(chunk).map_err(anyhow::Error::msg)?.into_iter().map(|e| e.vector.to_vec()));
        }
        Ok(out)
    };
    let q_vectors = embed_all(&q_texts)?;
    let r_vectors = embed_all(&r_texts)?;
    let per_text = start.elapsed().as_secs_f64() * 1e3 / (q_texts.len() + r_texts.len()) as f64;
    let turn_vectors = embed_all(&turns)?;
    // The TF-IDF baseline of the shipped detectors, on their own training texts.
    let baseline = match (&a.preset_data, print) {
        (Some(dir), true) => Some(crate::presets_eval::Baseline::load(dir)?),
        _ => None,
    };
    let say = |line: String| {
        if print {
            println!("{line}");
        }
    };
    say(format!(
        "{} MT-Bench questions, {} bastioncorpus rows; embedded in {:.1} ms per text (batches of 16)\n",
        questions.len(),
        rows.len(),
        per_text
    ));

    // Domain.
    let labels: Vec<&str> = questions.iter().map(|q| q.category.as_str()).collect();
    say(format!(
        "## Domain: MT-Bench, {} questions in {} categories, leave-one-out\n",
        labels.len(),
        distinct(&labels)
    ));
    say("| classifier | all-MiniLM-L6-v2 | TF-IDF (same classifier) |\n|---|---:|---:|".to_owned());
    let mut domain = [0; 2];
    let mut tfidf_domain = 0;
    for (slot, (name, method)) in
        [("centroid", DomainMethod::Centroid), ("knn", DomainMethod::Knn)].into_iter().enumerate()
    {
        let e = domain_loo(&labels, |train, test| (pick(&q_vectors, train), q_vectors[test].clone()), method, a.k);
        domain[slot] = e;
        if !print {
            continue;
        }
        let t = domain_loo(&labels, |train, test| tfidf_fold(&q_texts, train, test), method, a.k);
        if slot == 0 {
            tfidf_domain = t;
        }
        let shown = if method == DomainMethod::Knn { format!("knn (k = {})", a.k) } else { name.to_owned() };
        say(format!("| {shown} | {} | {} |", wilson(e, labels.len()), wilson(t, labels.len())));
    }
    say(format!("\nchance: {:.3}", 1.0 / distinct(&labels) as f64));
    if print {
        crate::presets_eval::domain(&labels, &q_vectors, &q_texts, baseline.as_ref());
    }
    say(String::new());

    // Jailbreak.
    let malicious: Vec<bool> = rows.iter().map(|r| r.label == "malicious").collect();
    let n_mal = malicious.iter().filter(|m| **m).count();
    say(format!(
        "## Jailbreak: bastioncorpus, {n_mal} malicious and {} benign, leave-one-out contrastive score (k = {})\n",
        rows.len() - n_mal,
        a.k
    ));
    let e_scores = jailbreak_loo(&malicious, |train, test| (pick(&r_vectors, train), r_vectors[test].clone()), a.k);
    let mut rng = SplitMix::new(1);
    let (pos_e, neg_e) = split(&e_scores, &malicious, |_| true);
    let auc_e = with_interval(&pos_e, &neg_e, auc, a.resamples, &mut rng);
    let rec_e = with_interval(&pos_e, &neg_e, recall_at_5, a.resamples, &mut rng);
    let mut tfidf_auc = 0.0;
    let mut presets = None;
    if print {
        let t_scores = jailbreak_loo(&malicious, |train, test| tfidf_fold(&r_texts, train, test), a.k);
        let (pos_t, neg_t) = split(&t_scores, &malicious, |_| true);
        let auc_t = with_interval(&pos_t, &neg_t, auc, a.resamples, &mut rng);
        let rec_t = with_interval(&pos_t, &neg_t, recall_at_5, a.resamples, &mut rng);
        tfidf_auc = auc_t.0;
        say("| metric | all-MiniLM-L6-v2 | TF-IDF (same score) |\n|---|---:|---:|".to_owned());
        say(format!("| ROC AUC | {} | {} |", auc_e.3, auc_t.3));
        say(format!("| recall at ≤ 5 % false positives | {} | {} |", rec_e.3, rec_t.3));
        say("\nPer attack category (its malicious rows against every benign row), ROC AUC:\n".to_owned());
        say("| category | rows | all-MiniLM-L6-v2 | TF-IDF |\n|---|---:|---:|---:|".to_owned());
        let mut categories: Vec<&str> =
            rows.iter().filter(|r| r.label == "malicious").map(|r| r.category.as_str()).collect();
        categories.sort();
        categories.dedup();
        for c in categories {
            let of = |i: usize| rows[i].category == c;
            let (pe, ne) = split(&e_scores, &malicious, of);
            let (pt, nt) = split(&t_scores, &malicious, of);
            let e = with_interval(&pe, &ne, auc, a.resamples, &mut rng);
            let t = with_interval(&pt, &nt, auc, a.resamples, &mut rng);
            say(format!("| {c} | {} | {} | {} |", pe.len(), e.3, t.3));
        }
        let tfidf = baseline.as_ref().map(|b| b.jailbreak_scores(&r_texts));
        presets = Some(crate::presets_eval::jailbreak(&r_vectors, &malicious, a.resamples, embed_all, tfidf)?);
    }
    let false_hits = cache_false_hits(&turns, &turn_vectors, print);
    let own = Figures { domain, auc: (auc_e.0, auc_e.1, auc_e.2), recall: (rec_e.0, rec_e.1, rec_e.2), false_hits };
    let vectors = Vectors { rows: r_vectors, turns: turn_vectors };
    Ok((Measured { own, tfidf: (tfidf_domain, tfidf_auc), presets }, vectors))
}

/// A semantic response cache's false hits on MT-Bench: every pair of distinct
/// turns (80 questions, two turns each) is a pair that must not hit; how many
/// reach each threshold, before and after the cache's rule that a question
/// holding digits never hits semantically (printed when `print`).
/// Returns the false hits at the plugin's default threshold (0.95), under the digit rule.
fn cache_false_hits(turns: &[&str], vectors: &[Vec<f32>], print: bool) -> usize {
    let digits = |t: &str| t.bytes().any(|b| b.is_ascii_digit());
    let mut sims = Vec::new();
    let mut eligible = Vec::new();
    for i in 0..turns.len() {
        for j in i + 1..turns.len() {
            if turns[i] == turns[j] {
                continue;
            }
            let sim = model_select::cosine(&vectors[i], &vectors[j]);
            sims.push(sim);
            if !digits(turns[i]) && !digits(turns[j]) {
                eligible.push(sim);
            }
        }
    }
    if print {
        let max = |v: &[f64]| v.iter().copied().fold(f64::MIN, f64::max);
        println!(
            "\n## Semantic cache false hits: MT-Bench, {} turns, {} pairs of different turns ({} without digits)\n",
            turns.len(),
            sims.len(),
            eligible.len()
        );
        println!("| threshold | pairs at or above | of them without digits (the cache's rule) |\n|---:|---:|---:|");
        for t in [0.85, 0.90, 0.95, 0.98] {
            let over = |v: &[f64]| v.iter().filter(|s| **s >= t).count();
            println!("| {t:.2} | {} | {} |", over(&sims), over(&eligible));
        }
        println!(
            "\nhighest similarity of two different turns: {:.3} (without digits: {:.3})",
            max(&sims),
            max(&eligible)
        );
    }
    eligible.iter().filter(|s| **s >= 0.95).count()
}

fn distinct(labels: &[&str]) -> usize {
    labels.iter().collect::<std::collections::BTreeSet<_>>().len()
}

fn pick(vectors: &[Vec<f32>], idx: &[usize]) -> Vec<Vec<f32>> {
    idx.iter().map(|&i| vectors[i].clone()).collect()
}

/// Correct leave-one-out classifications: `vectors(train, test)` gives the
/// training rows' vectors (in `train`'s order) and the held-out one's.
fn domain_loo(
    labels: &[&str],
    vectors: impl Fn(&[usize], usize) -> (Vec<Vec<f32>>, Vec<f32>),
    method: DomainMethod,
    k: usize,
) -> usize {
    let mut names: Vec<&str> = labels.to_vec();
    names.sort();
    names.dedup();
    (0..labels.len())
        .filter(|&test| {
            let train: Vec<usize> = (0..labels.len()).filter(|&i| i != test).collect();
            let (train_vectors, v) = vectors(&train, test);
            let by_label = names
                .iter()
                .map(|n| {
                    let ex = train.iter().zip(&train_vectors).filter(|(i, _)| labels[**i] == *n);
                    (n.to_string(), ex.map(|(_, v)| v.clone()).collect())
                })
                .collect();
            let c = DomainClassifier::new(by_label, method, k, 0.0, -1.0);
            c.classify(&v).label.map(|i| names[i]) == Some(labels[test])
        })
        .count()
}

/// Each row's leave-one-out contrastive score (malicious minus benign examples).
fn jailbreak_loo(
    malicious: &[bool],
    vectors: impl Fn(&[usize], usize) -> (Vec<Vec<f32>>, Vec<f32>),
    k: usize,
) -> Vec<f64> {
    (0..malicious.len())
        .map(|test| {
            let train: Vec<usize> = (0..malicious.len()).filter(|&i| i != test).collect();
            let (train_vectors, v) = vectors(&train, test);
            let (mut pos, mut neg) = (Vec::new(), Vec::new());
            for (i, tv) in train.iter().zip(train_vectors) {
                if malicious[*i] { pos.push(tv) } else { neg.push(tv) }
            }
            contrastive_score(&v, &pos, &neg, k)
        })
        .collect()
}

/// TF-IDF fitted on the training texts (sublinear term frequency, smoothed
/// idf, unigrams and bigrams, L2-normalised), the held-out text transformed.
fn tfidf_fold(texts: &[&str], train: &[usize], test: usize) -> (Vec<Vec<f32>>, Vec<f32>) {
    let docs: Vec<Vec<String>> = train.iter().map(|&i| terms(texts[i])).collect();
    let mut df: HashMap<&str, usize> = HashMap::new();
    for d in &docs {
        let mut seen: Vec<&str> = d.iter().map(String::as_str).collect();
        seen.sort();
        seen.dedup();
        for t in seen {
            *df.entry(t).or_default() += 1;
        }
    }
    let vocab: HashMap<&str, usize> = df.keys().enumerate().map(|(i, t)| (*t, i)).collect();
    let n = docs.len() as f64;
    let idf: Vec<f64> = {
        let mut v = vec![0.0; vocab.len()];
        for (t, &i) in &vocab {
            v[i] = ((1.0 + n) / (1.0 + df[t] as f64)).ln() + 1.0;
        }
        v
    };
    let vectorize = |terms: &[String]| -> Vec<f32> {
        let mut tf: HashMap<usize, f64> = HashMap::new();
        for t in terms {
            if let Some(&i) = vocab.get(t.as_str()) {
                *tf.entry(i).or_default() += 1.0;
            }
        }
        let mut v = vec![0f32; vocab.len()];
        for (i, c) in tf {
            v[i] = ((1.0 + c.ln()) * idf[i]) as f32;
        }
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
        v.iter().map(|x| x / norm).collect()
    };
    (docs.iter().map(|d| vectorize(d)).collect(), vectorize(&terms(texts[test])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statistics() {
        assert_eq!(auc(&[3.0, 4.0], &[1.0, 2.0]), 1.0);
        assert_eq!(auc(&[1.0], &[1.0]), 0.5);
        assert_eq!(auc(&[1.0, 3.0], &[2.0]), 0.5);
        // 20 negatives: at most one may pass (19), so a positive must beat the second highest (18).
        let neg: Vec<f64> = (0..20).map(f64::from).collect();
        assert_eq!(recall_at_5(&[18.0, 19.5, 5.0, 20.0], &neg), 0.5);
        assert_eq!(wilson(8, 10), "0.800 [0.490, 0.943]");
        let (docs, v) = tfidf_fold(&["the cat sat", "the dog ran", "a cat"], &[0, 1], 2);
        assert_eq!(docs.len(), 2);
        assert!(model_select::cosine(&v, &docs[0]) > model_select::cosine(&v, &docs[1]));
    }
}
