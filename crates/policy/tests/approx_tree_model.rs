//! The approximate tree against a naive model (every inserted text kept in a
//! list): random inserts on a tiny alphabet, longest-prefix queries must agree
//! on the matched length and on the workers at the end of the match, among
//! the texts sent at or after a random time (the TTL's cut).

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
        let mut model: Vec<(Vec<u8>, WorkerId, u64)> = Vec::new();
        for step in 0..400 {
            if rng.below(2) == 0 {
                let t = text(&mut rng);
                let w = WorkerId(rng.below(4) as u32);
                tree.insert(&t, w, step);
                if !t.is_empty() {
                    model.push((t, w, step));
                }
            } else {
                let q = text(&mut rng);
                let since = if rng.below(2) == 0 { 0 } else { rng.below(step as usize + 1) as u64 };
                let fresh: Vec<&(Vec<u8>, WorkerId, u64)> = model.iter().filter(|(_, _, at)| *at >= since).collect();
                let matched = fresh.iter().map(|(t, _, _)| common(t, &q)).max().unwrap_or(0);
                let mut workers: Vec<WorkerId> = if matched == 0 {
                    Vec::new()
                } else {
                    fresh
                        .iter()
                        .filter(|(t, _, _)| t.len() >= matched && t[..matched] == q[..matched])
                        .map(|(_, w, _)| *w)
                        .collect()
                };
                workers.sort_unstable();
                workers.dedup();
                let found = tree.longest_match(&q, since);
                assert_eq!(found, (matched, workers), "seed {seed} step {step} query {q:?} since {since}");
            }
        }
        let total: usize = {
            // Distinct bytes stored = size of the trie of all texts.
            let mut prefixes = std::collections::HashSet::new();
            for (t, _, _) in &model {
                for i in 1..=t.len() {
                    prefixes.insert(t[..i].to_vec());
                }
            }
            prefixes.len()
        };
        assert_eq!(tree.bytes(), total, "seed {seed}: stored bytes");
    }
}
