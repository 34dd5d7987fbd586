//! `sgl-router-bench train-presets`: the shipped detectors (`preset: default`)
//! trained on the texts `tools/presets/build_data.py` reads from pinned PyPI
//! wheels: every text embedded by the router's encoder, each class reduced to
//! prototypes (spherical k-means, seeded), the jailbreak threshold set on a
//! held-out fifth at 1 % false positives, and written (int8 per vector, hex)
//! as `crates/model-select/presets/{jailbreak,domain}.json`. Prints what the
//! held-out fifth says; the evaluation on data never trained on is
//! `signal-quality`'s (MT-Bench, bastioncorpus).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Result;
use model_select::presets::{PROBE_TEXT, encode_vector};
use model_select::{DomainClassifier, DomainMethod, contrastive_score};
use router_types::SplitMix;
use serde::Deserialize;

use crate::corpus::{held_out, jsonl};
use crate::stats::auc;

/// The command's arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct TrainPresetsArgs {
    /// The sentence-embedding model directory (all-MiniLM-L6-v2; `tools/embed_eval/fetch.sh`).
    #[arg(long, env = "SGL_ROUTER_EMBED_MODEL")]
    model: PathBuf,
    /// The directory `tools/presets/build_data.py` wrote (`jailbreak.jsonl`, `domain.jsonl`).
    #[arg(long)]
    data: PathBuf,
    /// Where the presets go.
    #[arg(long, default_value = "crates/model-select/presets")]
    out: PathBuf,
    /// Prototypes per jailbreak class.
    #[arg(long, default_value_t = 64)]
    jailbreak_prototypes: usize,
    /// Prototypes per domain label.
    #[arg(long, default_value_t = 32)]
    domain_prototypes: usize,
    /// How the encoder computes (`auto`, `int8`, `f32`).
    #[arg(long, default_value = "auto")]
    precision: embed::Precision,
    /// Keep each data file's vectors beside it (`<name>.vectors`, f32) and reuse them.
    #[arg(long)]
    cache: bool,
    /// With `--cache`: also keep the vectors of bastioncorpus's rows and MT-Bench's first turns
    /// (never trained on), for an analysis outside the router.
    #[arg(long, env = "SGL_ROUTER_BASTION", requires = "cache")]
    bastion: Option<PathBuf>,
    /// MT-Bench's `question.jsonl` (with `--bastion`).
    #[arg(long, env = "SGL_ROUTER_MTBENCH", requires = "cache")]
    mtbench: Option<PathBuf>,
}

#[derive(Deserialize)]
struct Row<L> {
    text: String,
    label: L,
    source: String,
}

/// Runs the command.
pub(crate) fn run(a: &TrainPresetsArgs) -> Result<()> {
    let encoder = embed::Encoder::load_with(&a.model, a.precision).map_err(anyhow::Error::msg)?;
    let embed_now = |texts: &[&str]| -> Result<Vec<Vec<f32>>> {
        let mut out = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(16) {
            let e = encoder.embed_batch(chunk).map_err(|e| anyhow::anyhow!("{e}"))?;
            out.extend(e.into_iter().map(|e| e.vector.to_vec()));
        }
        Ok(out)
    };
    let cached = |name: &str, texts: &[&str]| -> Result<Vec<Vec<f32>>> {
        let path = a.data.join(format!("{name}.vectors"));
        if a.cache
            && let Ok(raw) = std::fs::read(&path)
            && raw.len() == texts.len() * encoder.dim() * 4
        {
            let floats: Vec<f32> = raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            return Ok(floats.chunks(encoder.dim()).map(<[f32]>::to_vec).collect());
        }
        let vectors = embed_now(texts)?;
        if a.cache {
            std::fs::write(&path, vectors.iter().flatten().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())?;
        }
        Ok(vectors)
    };
    let probe = embed_now(&[PROBE_TEXT])?.remove(0);
    if let (true, Some(b), Some(m)) = (a.cache, &a.bastion, &a.mtbench) {
        let rows: Vec<serde_json::Value> = jsonl(b)?;
        let texts: Vec<&str> = rows.iter().map(|r| r["text"].as_str().unwrap_or("")).collect();
        cached("bastion", &texts)?;
        let qs: Vec<serde_json::Value> = jsonl(m)?;
        let texts: Vec<&str> = qs.iter().map(|q| q["turns"][0].as_str().unwrap_or("")).collect();
        cached("mtbench", &texts)?;
    }
    std::fs::create_dir_all(&a.out)?;

    let rows: Vec<Row<u8>> = jsonl(&a.data.join("jailbreak.jsonl"))?;
    let vectors = cached("jailbreak", &rows.iter().map(|r| r.text.as_str()).collect::<Vec<_>>())?;
    let held = |i: usize| held_out(&rows[i].text);
    let side = |label: u8, train: bool| -> Vec<Vec<f32>> {
        (0..rows.len()).filter(|&i| rows[i].label == label && held(i) != train).map(|i| vectors[i].clone()).collect()
    };
    let malicious = prototypes(&side(1, true), a.jailbreak_prototypes, 1);
    let benign = prototypes(&side(0, true), a.jailbreak_prototypes, 2);
    let score = |v: &[f32]| contrastive_score(v, &malicious, &benign, JAILBREAK_K);
    let mut benign_scores: Vec<f64> = side(0, false).iter().map(|v| score(v)).collect();
    benign_scores.sort_by(f64::total_cmp);
    let threshold = benign_scores[(benign_scores.len() as f64 * 0.99) as usize];
    let attacks: Vec<f64> = side(1, false).iter().map(|v| score(v)).collect();
    let recall = attacks.iter().filter(|&&s| s >= threshold).count() as f64 / attacks.len() as f64;
    println!(
        "jailbreak: {} texts ({} attacks), held-out fifth: threshold {threshold:.4} at 1 % false positives, recall {:.3}, AUC {:.3}",
        rows.len(),
        rows.iter().filter(|r| r.label == 1).count(),
        recall,
        auc(&attacks, &benign_scores)
    );
    let mut json = String::new();
    write!(
        json,
        "{{\"model\": \"all-MiniLM-L6-v2\", \"probe\": \"{}\", \"threshold\": {threshold:.4}, \"k\": {JAILBREAK_K}, ",
        encode_vector(&probe)
    )?;
    write!(json, "\"trained_on\": {}, ", serde_json::to_string(&sources(rows.iter().map(|r| (&r.source, r.label))))?)?;
    writeln!(json, "\"malicious\": {}, \"benign\": {}}}", list(&malicious), list(&benign))?;
    std::fs::write(a.out.join("jailbreak.json"), json)?;

    let rows: Vec<Row<String>> = jsonl(&a.data.join("domain.jsonl"))?;
    let vectors = cached("domain", &rows.iter().map(|r| r.text.as_str()).collect::<Vec<_>>())?;
    let labels: Vec<&str> = {
        let mut l: Vec<&str> = rows.iter().map(|r| r.label.as_str()).collect();
        l.sort_unstable();
        l.dedup();
        l
    };
    let trained: Vec<(String, Vec<Vec<f32>>)> = labels
        .iter()
        .enumerate()
        .map(|(n, l)| {
            let own: Vec<Vec<f32>> = (0..rows.len())
                .filter(|&i| rows[i].label == *l && !held_out(&rows[i].text))
                .map(|i| vectors[i].clone())
                .collect();
            (l.to_string(), prototypes(&own, a.domain_prototypes, 10 + n as u64))
        })
        .collect();
    let classifier = DomainClassifier::new(trained.clone(), DomainMethod::Knn, 3, 0.0, -1.0);
    let test: Vec<usize> = (0..rows.len()).filter(|&i| held_out(&rows[i].text)).collect();
    let right = test
        .iter()
        .filter(|&&i| classifier.classify(&vectors[i]).label.map(|l| labels[l]) == Some(&rows[i].label))
        .count();
    println!(
        "domain: {} texts in {} labels, held-out fifth: accuracy {:.3} ({right}/{})",
        rows.len(),
        labels.len(),
        right as f64 / test.len() as f64,
        test.len()
    );
    let mut json = String::new();
    write!(json, "{{\"model\": \"all-MiniLM-L6-v2\", \"probe\": \"{}\", ", encode_vector(&probe))?;
    write!(
        json,
        "\"trained_on\": {}, \"labels\": [",
        serde_json::to_string(&sources(rows.iter().map(|r| (&r.source, &r.label))))?
    )?;
    for (i, (name, protos)) in trained.iter().enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        write!(json, "{sep}{{\"name\": \"{name}\", \"prototypes\": {}}}", list(protos))?;
    }
    json.push_str("]}\n");
    std::fs::write(a.out.join("domain.json"), json)?;
    println!("written to {}", a.out.display());
    Ok(())
}

/// Prototypes on each side the jailbreak score averages.
const JAILBREAK_K: usize = 3;

/// Rows by (source, label).
fn sources<'a, L: std::fmt::Display>(rows: impl Iterator<Item = (&'a String, L)>) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for (s, l) in rows {
        *out.entry(format!("{s} ({l})")).or_insert(0) += 1;
    }
    out
}

fn list(vectors: &[Vec<f32>]) -> String {
    let items: Vec<String> = vectors.iter().map(|v| format!("\"{}\"", encode_vector(v))).collect();
    format!("[{}]", items.join(", "))
}

/// `k` unit prototypes of unit `vectors`: spherical k-means, k-means++ seeded by `seed`, 30 rounds.
fn prototypes(vectors: &[Vec<f32>], k: usize, seed: u64) -> Vec<Vec<f32>> {
    let k = k.min(vectors.len());
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    let mut rng = SplitMix::new(seed);
    let mut centers = vec![vectors[rng.below(vectors.len() as u64) as usize].clone()];
    while centers.len() < k {
        let far: Vec<f64> = vectors
            .iter()
            .map(|v| centers.iter().map(|c| f64::from(1.0 - dot(v, c)).max(0.0)).fold(f64::MAX, f64::min).powi(2))
            .collect();
        let total: f64 = far.iter().sum();
        let mut pick = rng.uniform() * total;
        let i = far.iter().position(|&d| {
            pick -= d;
            pick <= 0.0
        });
        centers.push(vectors[i.unwrap_or(vectors.len() - 1)].clone());
    }
    for _ in 0..30 {
        let mut sums = vec![vec![0f32; vectors[0].len()]; k];
        for v in vectors {
            let best = (0..k).max_by(|&a, &b| dot(v, &centers[a]).total_cmp(&dot(v, &centers[b]))).unwrap_or(0);
            sums[best].iter_mut().zip(v).for_each(|(s, x)| *s += x);
        }
        for (c, s) in centers.iter_mut().zip(sums) {
            let norm = s.iter().map(|x| x * x).sum::<f32>().sqrt();
            if norm > 0.0 {
                *c = s.iter().map(|x| x / norm).collect();
            }
        }
    }
    centers
}
