//! The statistics `signal-quality` reports: ROC AUC, recall at a false-positive budget, their
//! stratified-bootstrap intervals, and Wilson intervals of proportions.

use router_types::SplitMix;

use crate::fidelity::wilson_bounds;

/// The positives `keep` accepts and every negative.
pub(crate) fn split(scores: &[f64], positive: &[bool], keep: impl Fn(usize) -> bool) -> (Vec<f64>, Vec<f64>) {
    let pos = (0..scores.len()).filter(|&i| positive[i] && keep(i)).map(|i| scores[i]).collect();
    let neg = (0..scores.len()).filter(|&i| !positive[i]).map(|i| scores[i]).collect();
    (pos, neg)
}

/// The probability that a random positive outscores a random negative (ties half).
pub(crate) fn auc(pos: &[f64], neg: &[f64]) -> f64 {
    let mut wins = 0.0;
    for p in pos {
        for n in neg {
            wins += if p > n {
                1.0
            } else if p == n {
                0.5
            } else {
                0.0
            };
        }
    }
    wins / (pos.len() * neg.len()).max(1) as f64
}

/// The share of positives above the threshold that lets at most 5 % of the negatives through.
pub(crate) fn recall_at_5(pos: &[f64], neg: &[f64]) -> f64 {
    let mut sorted = neg.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let allowed = (sorted.len() as f64 * 0.05).floor() as usize;
    let Some(&threshold) = sorted.get(allowed) else { return 1.0 };
    pos.iter().filter(|&&p| p > threshold).count() as f64 / pos.len().max(1) as f64
}

/// The statistic and its stratified-bootstrap 95 % interval, formatted.
pub(crate) fn with_interval(
    pos: &[f64],
    neg: &[f64],
    stat: fn(&[f64], &[f64]) -> f64,
    resamples: usize,
    rng: &mut SplitMix,
) -> (f64, f64, f64, String) {
    let point = stat(pos, neg);
    let mut draws: Vec<f64> = (0..resamples)
        .map(|_| {
            let p: Vec<f64> = (0..pos.len()).map(|_| pos[rng.below(pos.len() as u64) as usize]).collect();
            let n: Vec<f64> = (0..neg.len()).map(|_| neg[rng.below(neg.len() as u64) as usize]).collect();
            stat(&p, &n)
        })
        .collect();
    draws.sort_by(f64::total_cmp);
    let at = |q: f64| draws.get(((draws.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(point);
    let (lo, hi) = (at(0.025), at(0.975));
    (point, lo, hi, format!("{point:.3} [{lo:.3}, {hi:.3}]"))
}

/// `hits` of `n` with its Wilson 95 % interval.
pub(crate) fn wilson(hits: usize, n: usize) -> String {
    let (p, lo, hi) = wilson_bounds(hits, n);
    format!("{p:.3} [{lo:.3}, {hi:.3}]")
}
