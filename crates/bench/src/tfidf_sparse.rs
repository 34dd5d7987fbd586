//! A sparse TF-IDF, weighted as `signal-quality`'s dense baseline (sublinear
//! term frequency, smoothed idf, words and adjacent pairs, L2-normalised),
//! for corpora too large for dense vectors: the shipped detectors' training
//! texts, as the baseline the detectors are compared with.

use std::collections::HashMap;

/// A text's weights by term id, ascending, of unit length.
pub(crate) type Sparse = Vec<(u32, f32)>;

/// Term ids and their idf, fitted on a corpus.
pub(crate) struct Tfidf {
    vocab: HashMap<String, u32>,
    idf: Vec<f32>,
}

impl Tfidf {
    /// Fitted on `docs`.
    pub(crate) fn fit(docs: &[&str]) -> Self {
        let mut vocab: HashMap<String, u32> = HashMap::new();
        let mut df: Vec<u32> = Vec::new();
        for d in docs {
            let mut terms = crate::corpus::terms(d);
            terms.sort_unstable();
            terms.dedup();
            for t in terms {
                let next = vocab.len() as u32;
                let id = *vocab.entry(t).or_insert(next);
                if id as usize == df.len() {
                    df.push(0);
                }
                df[id as usize] += 1;
            }
        }
        let n = docs.len() as f64;
        let idf = df.iter().map(|&d| (((1.0 + n) / (1.0 + f64::from(d))).ln() + 1.0) as f32).collect();
        Self { vocab, idf }
    }

    /// `text`'s vector (terms the corpus never had are left out).
    pub(crate) fn vector(&self, text: &str) -> Sparse {
        let mut tf: HashMap<u32, f32> = HashMap::new();
        for t in crate::corpus::terms(text) {
            if let Some(&id) = self.vocab.get(&t) {
                *tf.entry(id).or_default() += 1.0;
            }
        }
        let mut v: Sparse = tf.into_iter().map(|(id, c)| (id, (1.0 + c.ln()) * self.idf[id as usize])).collect();
        v.sort_unstable_by_key(|(id, _)| *id);
        let norm = v.iter().map(|(_, x)| x * x).sum::<f32>().sqrt().max(1e-12);
        v.iter_mut().for_each(|(_, x)| *x /= norm);
        v
    }
}

/// The cosine of two unit vectors.
pub(crate) fn dot(a: &Sparse, b: &Sparse) -> f64 {
    let (mut i, mut j, mut sum) = (0, 0, 0f64);
    while i < a.len() && j < b.len() {
        match a[i].0.cmp(&b[j].0) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                sum += f64::from(a[i].1 * b[j].1);
                i += 1;
                j += 1;
            }
        }
    }
    sum
}

/// The mean of `v`'s `k` highest cosines to `set` (as `model_select::nearest_mean`); 0 for an
/// empty set.
pub(crate) fn nearest_mean(v: &Sparse, set: &[Sparse], k: usize) -> f64 {
    if set.is_empty() {
        return 0.0;
    }
    let mut sims: Vec<f64> = set.iter().map(|s| dot(v, s)).collect();
    let k = k.clamp(1, sims.len());
    sims.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    sims[..k].iter().sum::<f64>() / k as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_are_unit_length_and_share_terms_as_the_dense_baseline_weighs_them() {
        let t = Tfidf::fit(&["the cat sat", "the dog ran", "a cat"]);
        let (cat, dog, none) = (t.vector("a cat sat"), t.vector("the dog"), t.vector("zebra"));
        assert!((dot(&cat, &cat) - 1.0).abs() < 1e-6);
        assert!(dot(&cat, &t.vector("the cat sat")) > dot(&cat, &dog));
        assert!(none.is_empty() && dot(&none, &cat) == 0.0);
        let set = vec![t.vector("the cat sat"), t.vector("the dog ran")];
        assert!(nearest_mean(&cat, &set, 1) > nearest_mean(&dog, &set[..1], 1));
        assert_eq!(nearest_mean(&cat, &[], 3), 0.0);
    }
}
