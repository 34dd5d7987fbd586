//! `signal-quality` at int8: the fidelity of the int8 encoder to the f32 one
//! on the same texts (the cosine of each text's two vectors, per corpus) and
//! every signal figure of the int8 run against the f32 run's 95 % interval.
//! Returns what falls short (`--check` fails on it). Owns the figures' and
//! vectors' shapes the two share.

/// The figures of one encoder, as `fidelity` compares them.
#[derive(Debug, Clone)]
pub(crate) struct Figures {
    /// Leave-one-out domain hits (centroid, knn) of `labels.len()`.
    pub(crate) domain: [usize; 2],
    /// Jailbreak ROC AUC and recall at ≤ 5 % false positives: (point, 2.5 %, 97.5 %).
    pub(crate) auc: (f64, f64, f64),
    pub(crate) recall: (f64, f64, f64),
    /// Semantic-cache false hits at 0.95 under the digit rule.
    pub(crate) false_hits: usize,
}

/// The vectors one encoder gave: bastioncorpus's rows, every MT-Bench turn.
pub(crate) struct Vectors {
    pub(crate) rows: Vec<Vec<f32>>,
    pub(crate) turns: Vec<Vec<f32>>,
}

/// `hits / n` and its Wilson 95 % interval.
pub(crate) fn wilson_bounds(hits: usize, n: usize) -> (f64, f64, f64) {
    let (p, n) = (hits as f64 / n as f64, n as f64);
    let z = 1.959_964f64;
    let centre = (p + z * z / (2.0 * n)) / (1.0 + z * z / n);
    let half = z * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt() / (1.0 + z * z / n);
    (p, centre - half, centre + half)
}

/// The least cosine to f32 that `--check` accepts.
pub(crate) const MIN_COSINE: f64 = 0.99;

/// Prints the fidelity tables; returns the failures.
/// `n`: MT-Bench's questions (the domain figures' denominator).
pub(crate) fn report(n: usize, int8: &Vectors, f32: &Vectors, got: &Figures, want: &Figures) -> Vec<String> {
    let mut failures = Vec::new();
    println!("\n## Fidelity: int8 against f32, the same texts\n");
    println!("| texts | n | least cosine | 1st percentile | median | mean |\n|---|---:|---:|---:|---:|---:|");
    let corpora = [("MT-Bench turns", &int8.turns, &f32.turns), ("bastioncorpus rows", &int8.rows, &f32.rows)];
    for (name, a, b) in corpora {
        let mut cos: Vec<f64> = a.iter().zip(b.iter()).map(|(x, y)| model_select::cosine(x, y)).collect();
        cos.sort_by(f64::total_cmp);
        let at = |q: f64| cos[((cos.len() - 1) as f64 * q).round() as usize];
        let mean = cos.iter().sum::<f64>() / cos.len() as f64;
        println!("| {name} | {} | {:.4} | {:.4} | {:.4} | {mean:.4} |", cos.len(), cos[0], at(0.01), at(0.5));
        if cos[0] < MIN_COSINE {
            failures.push(format!("{name}: least cosine to f32 {:.4} under {MIN_COSINE}", cos[0]));
        }
    }
    println!("\n| figure | int8 | f32 [95 % interval] | within |\n|---|---:|---:|---|");
    let mut row = |name: &str, got: f64, (point, lo, hi): (f64, f64, f64)| {
        let within = (lo..=hi).contains(&got);
        println!("| {name} | {got:.3} | {point:.3} [{lo:.3}, {hi:.3}] | {} |", if within { "yes" } else { "NO" });
        if !within {
            failures.push(format!("{name} {got:.3} outside f32's [{lo:.3}, {hi:.3}]"));
        }
    };
    row("domain accuracy, centroid", got.domain[0] as f64 / n as f64, wilson_bounds(want.domain[0], n));
    row("domain accuracy, knn", got.domain[1] as f64 / n as f64, wilson_bounds(want.domain[1], n));
    row("jailbreak ROC AUC", got.auc.0, want.auc);
    row("jailbreak recall at ≤ 5 % false positives", got.recall.0, want.recall);
    println!(
        "| semantic-cache false hits at 0.95 | {} | {} | {} |",
        got.false_hits,
        want.false_hits,
        if got.false_hits <= want.false_hits { "yes" } else { "NO" }
    );
    if got.false_hits > want.false_hits {
        failures.push(format!("{} semantic-cache false hits, f32 {}", got.false_hits, want.false_hits));
    }
    failures
}
