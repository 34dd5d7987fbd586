//! The approximate tree against a naive model (every inserted text kept in a
//! list): random inserts on a tiny alphabet, longest-prefix queries must agree
//! on the matched length and on the workers at the end of the match.

use policy::ApproxTree;
use router_types::WorkerId;

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

fn text(rng: &mut Rng) -> Vec<u8> {
    (0..rng.below(12)).map(|_| b"abc"[rng.below(3)]).collect()
}

fn common(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[test]
fn random_inserts_and_queries_match_the_model() {
    for seed in 1..=20u64 {
        let mut rng = Rng(seed * 7919);
        let mut tree = ApproxTree::new();
        let mut model: Vec<(Vec<u8>, WorkerId)> = Vec::new();
        for step in 0..400 {
            if rng.below(2) == 0 {
                let t = text(&mut rng);
                let w = WorkerId(rng.below(4) as u32);
                tree.insert(&t, w, step);
                if !t.is_empty() {
                    model.push((t, w));
                }
            } else {
                let q = text(&mut rng);
                let matched = model.iter().map(|(t, _)| common(t, &q)).max().unwrap_or(0);
                let mut workers: Vec<WorkerId> = if matched == 0 {
                    Vec::new()
                } else {
                    model
                        .iter()
                        .filter(|(t, _)| t.len() >= matched && t[..matched] == q[..matched])
                        .map(|(_, w)| *w)
                        .collect()
                };
                workers.sort_unstable();
                workers.dedup();
                assert_eq!(tree.longest_match(&q), (matched, workers), "seed {seed} step {step} query {q:?}");
            }
        }
        let total: usize = {
            // Distinct bytes stored = size of the trie of all texts.
            let mut prefixes = std::collections::HashSet::new();
            for (t, _) in &model {
                for i in 1..=t.len() {
                    prefixes.insert(t[..i].to_vec());
                }
            }
            prefixes.len()
        };
        assert_eq!(tree.bytes(), total, "seed {seed}: stored bytes");
    }
}
