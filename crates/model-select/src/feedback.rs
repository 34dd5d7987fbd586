//! Learning from outcomes (the arithmetic; the endpoint and the route ids
//! are the gateway's): per (decision, pool) a Beta posterior over "the answer
//! was good", seeded from the pool's configured quality, moved by verdicts,
//! and an Elo rating moved by pairwise preferences. Thompson sampling picks
//! among candidates. Bounded (at most `max_arms` pairs, the least recently
//! updated out first) and saved as JSON. Replicas sharing state add what
//! they learn to totals kept apart from it; each arm remembers the part of
//! its evidence that came from those totals ([`Arm::shared`]), so that a
//! fresh reading of them replaces that part instead of adding to it
//! ([`Outcomes::apply_shared`]).

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
    /// The shared totals last applied to it (zero when it never was): the part of its
    /// evidence every replica sharing state has.
    #[serde(default, skip_serializing_if = "Evidence::is_zero")]
    pub shared: Evidence,
}

/// What verdicts and preferences added to an arm beyond its prior: one answer's, or the sum of
/// every replica's (the shared totals).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// Added to `alpha`.
    pub alpha: f64,
    /// Added to `beta`.
    pub beta: f64,
    /// Added to the Elo rating.
    pub elo: f64,
    /// Verdicts and preferences.
    pub updates: u64,
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

    /// The evidence added to `before` to make this arm.
    pub fn since(&self, before: &Arm) -> Evidence {
        Evidence {
            alpha: self.alpha - before.alpha,
            beta: self.beta - before.beta,
            elo: self.elo - before.elo,
            updates: self.updates.saturating_sub(before.updates),
        }
    }
}

impl Evidence {
    /// Whether it adds nothing.
    pub fn is_zero(&self) -> bool {
        *self == Evidence::default()
    }

    /// Both together.
    pub fn plus(&self, other: &Evidence) -> Evidence {
        Evidence {
            alpha: self.alpha + other.alpha,
            beta: self.beta + other.beta,
            elo: self.elo + other.elo,
            updates: self.updates.saturating_add(other.updates),
        }
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
            shared: Evidence::default(),
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

    /// Sets the shared part of `pool`'s arm under `decision` to `totals`, the sum of what every
    /// replica sharing state added to it, as the backend has it now: the arm's evidence moves by
    /// what the totals gained since they were last applied, less `pushed` (evidence this replica
    /// applied here first and has just added to the totals: it is in both). `None`: the backend
    /// no longer has the arm; what it had stays here as this replica's own. Without evidence here
    /// the arm starts from the prior of `quality`, and `pushed` went with it. True when the
    /// arm changed.
    pub fn apply_shared(
        &mut self,
        decision: &str,
        pool: &str,
        quality: Option<f64>,
        pushed: Evidence,
        totals: Option<Evidence>,
    ) -> bool {
        let held = self.arms.get(decision).and_then(|d| d.get(pool)).copied();
        let Some(totals) = totals else {
            let Some(mut arm) = held.filter(|a| !a.shared.is_zero()) else { return false };
            arm.shared = Evidence::default();
            self.place(decision, pool, arm, false);
            return true;
        };
        let pushed = if held.is_some() { pushed } else { Evidence::default() };
        let mut arm = held.unwrap_or_else(|| self.prior(quality));
        let before = arm.shared.plus(&pushed);
        if totals == arm.shared && pushed.is_zero() {
            return false;
        }
        arm.alpha += totals.alpha - before.alpha;
        arm.beta += totals.beta - before.beta;
        arm.elo += totals.elo - before.elo;
        arm.updates = arm.updates.saturating_add(totals.updates).saturating_sub(before.updates);
        arm.shared = totals;
        // Moved by another replica: as recent as if moved here (pushed alone: no news).
        self.place(decision, pool, arm, totals != before);
        true
    }

    /// The arms with a shared part, as (decision, pool).
    pub fn shared_arms(&self) -> Vec<(String, String)> {
        let arms = self.arms.iter().flat_map(|(d, pools)| pools.iter().map(move |(p, a)| (d, p, a)));
        arms.filter(|(_, _, a)| !a.shared.is_zero()).map(|(d, p, _)| (d.clone(), p.clone())).collect()
    }

    fn put(&mut self, decision: &str, pool: &str, mut arm: Arm) {
        arm.updates += 1;
        self.place(decision, pool, arm, true);
    }

    /// Keeps `arm` (the most recently updated when `touch`), within `max_arms`.
    fn place(&mut self, decision: &str, pool: &str, mut arm: Arm, touch: bool) {
        if touch {
            self.clock += 1;
            arm.last = self.clock;
        }
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

    /// Two replicas' totals merged into one store: what came from the totals is replaced by
    /// each fresh reading, never added twice; what this replica pushed is counted once; an arm
    /// the backend lost keeps what it had.
    #[test]
    fn shared_totals_replace_their_part_of_an_arm() {
        let mut o = Outcomes::new(10.0, 100);
        let prior = o.arm("d", "large", Some(0.5));
        // Another replica's two good verdicts, read twice: applied once.
        let two = Evidence { alpha: 2.0, updates: 2, ..Evidence::default() };
        assert!(o.apply_shared("d", "large", Some(0.5), Evidence::default(), Some(two)));
        assert!(!o.apply_shared("d", "large", Some(0.5), Evidence::default(), Some(two)), "nothing new");
        let arm = o.arm("d", "large", Some(0.5));
        assert_eq!((arm.alpha, arm.beta, arm.updates, arm.shared), (prior.alpha + 2.0, prior.beta, 2, two));
        // A bad verdict here, applied at once and then pushed: the totals that include it count it once.
        let before = o.arm("d", "large", Some(0.5));
        o.verdict("d", "large", Some(0.5), false);
        let mine = o.arm("d", "large", Some(0.5)).since(&before);
        assert_eq!(mine, Evidence { beta: 1.0, updates: 1, ..Evidence::default() });
        let three = two.plus(&mine);
        assert!(o.apply_shared("d", "large", Some(0.5), mine, Some(three)));
        let arm = o.arm("d", "large", Some(0.5));
        assert_eq!((arm.alpha, arm.beta, arm.updates), (prior.alpha + 2.0, prior.beta + 1.0, 3));
        // Own evidence kept while the backend was out of reach stays on top of the totals.
        o.verdict("d", "large", Some(0.5), true);
        let more = three.plus(&Evidence { elo: 16.0, alpha: 0.5, updates: 1, ..Evidence::default() });
        o.apply_shared("d", "large", Some(0.5), Evidence::default(), Some(more));
        let arm = o.arm("d", "large", Some(0.5));
        assert_eq!((arm.alpha, arm.elo, arm.updates), (prior.alpha + 3.5, ELO_START + 16.0, 5));
        // An arm only another replica judged arrives with its prior; one the backend lost is kept.
        o.apply_shared("d", "small", Some(0.75), Evidence::default(), Some(two));
        assert_eq!(o.arm("d", "small", Some(0.75)).alpha, 1.0 + 7.5 + 2.0);
        assert_eq!(o.shared_arms(), vec![("d".into(), "large".into()), ("d".into(), "small".into())]);
        assert!(o.apply_shared("d", "small", None, Evidence::default(), None));
        assert_eq!(o.arm("d", "small", None).alpha, 10.5, "kept as this replica's own");
        assert_eq!(o.shared_arms().len(), 1);
        // Its shared part round-trips through the state file (so a restart does not count it twice).
        let loaded: Outcomes = serde_json::from_str(&serde_json::to_string(&o).unwrap()).unwrap();
        assert_eq!(loaded, o);
        // Bounded as ever: totals for one arm too many push out the least recently updated.
        let mut small = Outcomes::new(10.0, 1);
        small.verdict("d", "a", None, true);
        small.apply_shared("d", "b", None, Evidence::default(), Some(two));
        assert_eq!((small.len(), small.arm("d", "a", None).updates), (1, 0));
    }
}
