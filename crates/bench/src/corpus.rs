//! The texts the signal benchmarks read: JSON-lines files (MT-Bench,
//! bastioncorpus, the detectors' training data), the split of the training
//! texts the detectors hold out, and the terms the TF-IDF baselines count.

use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::Deserialize;

/// Every line of a JSON-lines file, parsed.
pub(crate) fn jsonl<T: for<'de> Deserialize<'de>>(path: &PathBuf) -> Result<Vec<T>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| serde_json::from_str(l).with_context(|| format!("{}:{}", path.display(), i + 1)))
        .collect()
}

/// One text in five, by its hash: the calibration and check set, never a prototype.
pub(crate) fn held_out(text: &str) -> bool {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in text.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    h.is_multiple_of(5)
}

/// Lowercased words and adjacent pairs.
pub(crate) fn terms(text: &str) -> Vec<String> {
    let words: Vec<String> = text
        .to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect();
    let pairs = words.windows(2).map(|w| format!("{} {}", w[0], w[1]));
    words.iter().cloned().chain(pairs).collect()
}
