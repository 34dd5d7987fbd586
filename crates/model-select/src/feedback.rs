//! Learning from outcomes (the arithmetic; the endpoint and the route ids
//! are the gateway's): per (decision, pool) a Beta posterior over "the answer
//! was good", seeded from the pool's configured quality, moved by verdicts,
//! and an Elo rating moved by pairwise preferences. Thompson sampling picks
//! among candidates. Bounded (at most `max_arms` pairs, the least recently
//! updated out first) and saved as JSON. Per router replica: replicas do
//! not share it.

use std::collections::BTreeMap;

use router_types::SplitMix;
use serde::{Deserialize, Serialize};

/// The Elo rating of an arm no preference has moved.
pub const ELO_START: f64 = 1500.0;
/// How far one preference moves two ratings at most.
pub const ELO_K: f64 = 32.0;

/// One (decision, pool) pair's evidence.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Arm {
    /// Good verdicts plus the prior's share.
    pub alpha: f64,
    /// Bad verdicts plus the prior's share.
    pub beta: f64,
    /// Its Elo rating.
    pub elo: f64,
    /// Verdicts and preferences it took (the recency order of the bound).
    pub updates: u64,
    /// When it was last updated, in the store's update count.
    pub last: u64,
}

/// Every arm's evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcomes {
    /// How many verdicts the configured quality weighs as (default 10).
    pub prior_strength: f64,
    /// Arms kept at most.
    pub max_arms: usize,
    arms: BTreeMap<String, BTreeMap<String, Arm>>,
    clock: u64,
}

impl Arm {
    /// The posterior's mean: how likely the pool's next answer is good.
    pub fn mean(&self) -> f64 {
        self.alpha / (self.alpha + self.beta)
    }
}

impl Outcomes {
    /// No evidence yet.
    pub fn new(prior_strength: f64, max_arms: usize) -> Self {
        Outcomes { prior_strength: prior_strength.max(0.0), max_arms: max_arms.max(1), arms: BTreeMap::new(), clock: 0 }
    }

    /// The arm of `pool` under `decision`: its evidence, or the prior from `quality` (0.5 without).
    pub fn arm(&self, decision: &str, pool: &str, quality: Option<f64>) -> Arm {
        self.arms.get(decision).and_then(|d| d.get(pool)).copied().unwrap_or_else(|| self.prior(quality))
    }

    fn prior(&self, quality: Option<f64>) -> Arm {
        let q = quality.unwrap_or(0.5).clamp(0.0, 1.0);
        Arm {
            alpha: 1.0 + q * self.prior_strength,
            beta: 1.0 + (1.0 - q) * self.prior_strength,
            elo: ELO_START,
            updates: 0,
            last: 0,
        }
    }

    /// Arms held now.
    pub fn len(&self) -> usize {
        self.arms.values().map(BTreeMap::len).sum()
    }

    /// Whether no arm has evidence.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A verdict on an answer `pool` gave under `decision`.
    pub fn verdict(&mut self, decision: &str, pool: &str, quality: Option<f64>, good: bool) {
        let mut arm = self.arm(decision, pool, quality);
        if good {
            arm.alpha += 1.0;
        } else {
            arm.beta += 1.0;
        }
        self.put(decision, pool, arm);
    }

    /// A preference: `winner`'s answer over `loser`'s (pools under one decision): Elo, and half
    /// a good verdict for the winner and half a bad one for the loser (so that the bandit,
    /// which draws from the Beta posteriors, learns from preferences too).
    pub fn preference(&mut self, decision: &str, winner: (&str, Option<f64>), loser: (&str, Option<f64>)) {
        let (mut w, mut l) = (self.arm(decision, winner.0, winner.1), self.arm(decision, loser.0, loser.1));
        let expected = 1.0 / (1.0 + 10f64.powf((l.elo - w.elo) / 400.0));
        w.elo += ELO_K * (1.0 - expected);
        l.elo -= ELO_K * (1.0 - expected);
        w.alpha += 0.5;
        l.beta += 0.5;
        self.put(decision, winner.0, w);
        self.put(decision, loser.0, l);
    }

    fn put(&mut self, decision: &str, pool: &str, mut arm: Arm) {
        self.clock += 1;
        arm.updates += 1;
        arm.last = self.clock;
        self.arms.entry(decision.to_owned()).or_default().insert(pool.to_owned(), arm);
        while self.len() > self.max_arms {
            let oldest = self
                .arms
                .iter()
                .flat_map(|(d, pools)| pools.iter().map(move |(p, a)| (a.last, d.clone(), p.clone())))
                .min();
            let Some((_, d, p)) = oldest else { break };
            if let Some(pools) = self.arms.get_mut(&d) {
                pools.remove(&p);
                if pools.is_empty() {
                    self.arms.remove(&d);
                }
            }
        }
    }

    /// The candidate with the highest draw from its posterior (Thompson
    /// sampling): (pool, quality) pairs in the decision's order; `None` without candidates.
    pub fn choose(&self, decision: &str, candidates: &[(&str, Option<f64>)], rng: &mut Rng) -> Option<usize> {
        self.choose_satisficing(decision, candidates, None, rng)
    }

    /// [`choose`](Self::choose), or with `min_quality` the first candidate whose draw reaches
    /// it (the highest draw when none does).
    pub fn choose_satisficing(
        &self,
        decision: &str,
        candidates: &[(&str, Option<f64>)],
        min_quality: Option<f64>,
        rng: &mut Rng,
    ) -> Option<usize> {
        let draws: Vec<f64> = candidates
            .iter()
            .map(|(pool, quality)| {
                let arm = self.arm(decision, pool, *quality);
                rng.beta(arm.alpha, arm.beta)
            })
            .collect();
        if let Some(i) = min_quality.and_then(|m| draws.iter().position(|d| *d >= m)) {
            return Some(i);
        }
        draws.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0))).map(|(i, _)| i)
    }
}

/// A seeded generator ([`SplitMix`]) with the draws Thompson sampling needs.
#[derive(Debug, Clone)]
pub struct Rng(SplitMix);

impl Rng {
    /// Seeded.
    pub fn new(seed: u64) -> Self {
        Rng(SplitMix::new(seed))
    }

    /// Uniform in (0, 1).
    pub fn uniform(&mut self) -> f64 {
        self.0.uniform()
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        (-2.0 * self.uniform().ln()).sqrt() * (2.0 * std::f64::consts::PI * self.uniform()).cos()
    }

    /// Gamma(shape, 1) (Marsaglia and Tsang; shape below 1 by boosting).
    pub fn gamma(&mut self, shape: f64) -> f64 {
        if shape < 1.0 {
            return self.gamma(shape + 1.0) * self.uniform().powf(1.0 / shape);
        }
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal();
            let v = (1.0 + c * x).powi(3);
            if v <= 0.0 {
                continue;
            }
            let u = self.uniform();
            if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
                return d * v;
            }
        }
    }

    /// Beta(a, b).
    pub fn beta(&mut self, a: f64, b: f64) -> f64 {
        let x = self.gamma(a.max(1e-6));
        let y = self.gamma(b.max(1e-6));
        x / (x + y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prior_comes_from_the_quality_and_verdicts_move_it() {
        let mut o = Outcomes::new(10.0, 100);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        let prior = o.arm("d", "large", Some(0.75));
        assert!(close(prior.alpha, 8.5) && close(prior.beta, 3.5) && prior.elo == ELO_START, "{prior:?}");
        o.verdict("d", "large", Some(0.75), false);
        o.verdict("d", "large", Some(0.75), true);
        let arm = o.arm("d", "large", Some(0.75));
        assert!(close(arm.alpha, 9.5) && close(arm.beta, 4.5) && arm.updates == 2, "{arm:?}");
        assert_eq!(o.arm("other", "large", None).alpha, 6.0, "decisions are apart; no quality is 0.5");
    }

    #[test]
    fn thompson_sampling_follows_the_evidence() {
        let mut o = Outcomes::new(2.0, 100);
        for _ in 0..50 {
            o.verdict("d", "small", None, false);
            o.verdict("d", "large", None, true);
        }
        let mut rng = Rng::new(7);
        let picks =
            (0..1000).filter(|_| o.choose("d", &[("small", None), ("large", None)], &mut rng) == Some(1)).count();
        assert!(picks > 990, "{picks}");
        // With equal evidence, both are explored.
        let even = Outcomes::new(2.0, 100);
        let picks = (0..1000).filter(|_| even.choose("d", &[("a", None), ("b", None)], &mut rng) == Some(0)).count();
        assert!((350..650).contains(&picks), "{picks}");
        assert_eq!(even.choose("d", &[], &mut rng), None);
        // Satisficing: the first candidate likely good enough, though the other is better.
        let mut o = Outcomes::new(2.0, 100);
        for _ in 0..50 {
            o.verdict("d", "small", Some(0.9), true);
            o.verdict("d", "large", Some(0.9), true);
        }
        for _ in 0..5 {
            o.verdict("d", "small", Some(0.9), false);
        }
        let both = [("small", Some(0.9)), ("large", Some(0.9))];
        let small = (0..1000).filter(|_| o.choose_satisficing("d", &both, Some(0.75), &mut rng) == Some(0)).count();
        assert!(small > 990, "{small}");
        let small = (0..1000).filter(|_| o.choose("d", &both, &mut rng) == Some(0)).count();
        assert!(small < 200, "without min_quality the better one: {small}");
    }

    #[test]
    fn the_draws_have_their_means() {
        let mut rng = Rng::new(1);
        let n = 20_000;
        for (a, b) in [(2.0, 5.0), (0.5, 0.5), (30.0, 10.0)] {
            let mean = (0..n).map(|_| rng.beta(a, b)).sum::<f64>() / f64::from(n);
            assert!((mean - a / (a + b)).abs() < 0.01, "Beta({a}, {b}): {mean}");
        }
        let mean = (0..n).map(|_| rng.gamma(3.0)).sum::<f64>() / f64::from(n);
        assert!((mean - 3.0).abs() < 0.05, "{mean}");
    }

    #[test]
    fn preferences_move_elo_and_the_store_is_bounded_and_saved() {
        let mut o = Outcomes::new(10.0, 3);
        o.preference("d", ("large", None), ("small", None));
        let (w, l) = (o.arm("d", "large", None).elo, o.arm("d", "small", None).elo);
        assert_eq!((w, l), (ELO_START + 16.0, ELO_START - 16.0), "equal ratings: half of K each way");
        assert_eq!((o.arm("d", "large", None).alpha, o.arm("d", "small", None).beta), (6.5, 6.5), "half verdicts");
        o.preference("d", ("large", None), ("small", None));
        assert!(o.arm("d", "large", None).elo - w < 16.0, "the favourite gains less");
        o.verdict("e", "x", None, true);
        o.verdict("f", "y", None, true);
        assert_eq!(o.len(), 3, "at most max_arms; the least recently updated went");
        assert_eq!(o.arm("d", "large", None).updates, 0, "d/large was the oldest: back to its prior");
        let saved = serde_json::to_string(&o).unwrap();
        let loaded: Outcomes = serde_json::from_str(&saved).unwrap();
        assert_eq!(loaded, o);
    }
}
