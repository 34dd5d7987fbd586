//! The algorithms that choose among a decision's pools, after the caller's
//! hard filters (a routable worker, a window that holds the request):
//! `static` (the first, in the decision's order) and `multi_factor` (SLO
//! ceilings drop candidates, then `wQ·quality + wL·latency + wC·cost +
//! wLoad·load` on fixed scales from the config, never min-max over the
//! candidates: a score means the same whoever else is there) and `bandit`
//! (Thompson sampling over what feedback taught, [`crate::Outcomes`]).

use serde::Deserialize;

/// A decision's compiled algorithm.
#[derive(Debug, Clone, PartialEq)]
pub enum Algorithm {
    /// The first eligible pool in the decision's order.
    Static,
    /// Scored; see [`MultiFactor`].
    MultiFactor(MultiFactor),
    /// Thompson sampling over what feedback taught; see [`Bandit`].
    Bandit(Bandit),
}

/// `bandit`'s parameters: one draw from each candidate's Beta posterior (seeded
/// from its configured quality, moved by feedback, [`crate::Outcomes`]); the
/// highest draw serves, or with `min_quality` the first candidate in the
/// decision's order whose draw reaches it (list the cheaper pool first: it serves
/// while it is likely good enough), the highest draw when none does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bandit {
    /// The quality a pool must likely reach to be taken in order (in [0, 1]).
    #[serde(default)]
    pub min_quality: Option<f64>,
}

impl Bandit {
    /// Parses and checks the decision's `algorithm` keys.
    pub fn from_params(params: &serde_json::Map<String, serde_json::Value>) -> Result<Self, String> {
        let b: Bandit = serde_json::from_value(serde_json::Value::Object(params.clone())).map_err(|e| e.to_string())?;
        if b.min_quality.is_some_and(|q| !(0.0..=1.0).contains(&q)) {
            return Err("min_quality must be in [0, 1]".into());
        }
        Ok(b)
    }
}

/// `multi_factor`'s parameters (every key optional).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MultiFactor {
    /// The factors' weights.
    #[serde(default)]
    pub weights: Weights,
    /// Where each factor's score reaches 0 (latency, cost, load; quality is in [0, 1] already).
    #[serde(default)]
    pub scales: Scales,
    /// Ceilings: a candidate over any is dropped.
    #[serde(default)]
    pub slo: Slo,
    /// What to do when the ceilings drop every candidate.
    #[serde(default)]
    pub on_no_candidates: OnNoCandidates,
}

/// The factors' weights (default quality 0.4, latency 0.3, cost 0.2, load 0.1).
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Weights {
    /// The pool's quality prior.
    pub quality: f64,
    /// Its estimated time to first token.
    pub latency: f64,
    /// The request's estimated price on it.
    pub cost: f64,
    /// Its requests in flight.
    pub load: f64,
}

/// Fixed scales: a factor scores `1 - value / scale`, floored at 0.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Scales {
    /// Estimated TTFT (ms) that scores 0 (default 2000).
    pub ttft_ms: f64,
    /// Request price (USD) that scores 0 (default 0.01).
    pub cost_usd: f64,
    /// Requests in flight on the pool that score 0 (default 64).
    pub in_flight: f64,
}

/// SLO ceilings (none by default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Slo {
    /// Estimated TTFT (ms).
    #[serde(default)]
    pub max_ttft_ms: Option<f64>,
    /// Prefill queued on the pool's least-loaded worker (tokens).
    #[serde(default)]
    pub max_queued_tokens: Option<u64>,
    /// Requests in flight on the pool.
    #[serde(default)]
    pub max_in_flight: Option<u64>,
    /// The request's estimated price (USD).
    #[serde(default)]
    pub max_cost_usd: Option<f64>,
}

/// When every candidate is over a ceiling.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnNoCandidates {
    /// The best score, ceilings ignored.
    #[default]
    IgnoreSlo,
    /// The config's default pool, if it is a candidate.
    DefaultPool,
    /// Refuse (503).
    Reject,
}

/// One candidate pool now, as `multi_factor` sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// The pool (its index in the config).
    pub pool: usize,
    /// Its quality prior in [0, 1] (0.5 when the config gives none).
    pub quality: f64,
    /// The estimated TTFT of this prompt on it (ms).
    pub est_ttft_ms: f64,
    /// Prefill queued on its least-loaded worker.
    pub queued_tokens: u64,
    /// Requests in flight on it.
    pub in_flight: u64,
    /// This request's estimated price on it (USD; 0 without a price).
    pub cost_usd: f64,
}

/// A candidate's score and why it was dropped, if it was.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    /// The pool.
    pub pool: usize,
    /// Its weighted score.
    pub score: f64,
    /// The ceiling it is over.
    pub over: Option<String>,
}

impl Default for Weights {
    fn default() -> Self {
        Weights { quality: 0.4, latency: 0.3, cost: 0.2, load: 0.1 }
    }
}

impl Default for Scales {
    fn default() -> Self {
        Scales { ttft_ms: 2000.0, cost_usd: 0.01, in_flight: 64.0 }
    }
}

// === impl MultiFactor ===

impl MultiFactor {
    /// Reads the algorithm's keys (everything but `type`).
    pub fn from_params(params: &serde_json::Map<String, serde_json::Value>) -> Result<Self, String> {
        let m: MultiFactor =
            serde_json::from_value(serde_json::Value::Object(params.clone())).map_err(|e| e.to_string())?;
        let w = m.weights;
        if [w.quality, w.latency, w.cost, w.load].iter().any(|x| !x.is_finite() || *x < 0.0) {
            return Err("weights must be finite and not negative".into());
        }
        let s = m.scales;
        if [s.ttft_ms, s.cost_usd, s.in_flight].iter().any(|x| !x.is_finite() || *x <= 0.0) {
            return Err("scales must be positive".into());
        }
        Ok(m)
    }

    /// Scores every candidate; returns the chosen pool (`None`: refused) and
    /// every score, in the candidates' order. Ties go to the earlier candidate.
    pub fn choose(&self, candidates: &[Candidate], default_pool: usize) -> (Option<usize>, Vec<Scored>) {
        let scored: Vec<Scored> =
            candidates.iter().map(|c| Scored { pool: c.pool, score: self.score(c), over: self.over(c) }).collect();
        let best = |ignore_slo: bool| {
            scored
                .iter()
                .filter(|s| ignore_slo || s.over.is_none())
                .fold(None::<&Scored>, |best, s| match best {
                    Some(b) if b.score >= s.score => Some(b),
                    _ => Some(s),
                })
                .map(|s| s.pool)
        };
        let chosen = best(false).or_else(|| match self.on_no_candidates {
            OnNoCandidates::IgnoreSlo => best(true),
            OnNoCandidates::DefaultPool => candidates.iter().find(|c| c.pool == default_pool).map(|c| c.pool),
            OnNoCandidates::Reject => None,
        });
        (chosen, scored)
    }

    /// `wQ·quality + wL·latency + wC·cost + wLoad·load`.
    pub fn score(&self, c: &Candidate) -> f64 {
        let (w, s) = (&self.weights, &self.scales);
        let down = |value: f64, scale: f64| (1.0 - value / scale).clamp(0.0, 1.0);
        w.quality * c.quality.clamp(0.0, 1.0)
            + w.latency * down(c.est_ttft_ms, s.ttft_ms)
            + w.cost * down(c.cost_usd, s.cost_usd)
            + w.load * down(c.in_flight as f64, s.in_flight)
    }

    /// The first ceiling `c` is over.
    fn over(&self, c: &Candidate) -> Option<String> {
        let slo = &self.slo;
        if let Some(m) = slo.max_ttft_ms.filter(|m| c.est_ttft_ms > *m) {
            return Some(format!("estimated TTFT {:.0} ms > {m} ms", c.est_ttft_ms));
        }
        if let Some(m) = slo.max_queued_tokens.filter(|m| c.queued_tokens > *m) {
            return Some(format!("queued prefill {} tokens > {m}", c.queued_tokens));
        }
        if let Some(m) = slo.max_in_flight.filter(|m| c.in_flight > *m) {
            return Some(format!("in flight {} > {m}", c.in_flight));
        }
        if let Some(m) = slo.max_cost_usd.filter(|m| c.cost_usd > *m) {
            return Some(format!("estimated price ${:.6} > ${m}", c.cost_usd));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn mf(v: serde_json::Value) -> MultiFactor {
        MultiFactor::from_params(v.as_object().unwrap()).unwrap()
    }

    fn cand(pool: usize, quality: f64, ttft: f64, in_flight: u64, cost: f64) -> Candidate {
        Candidate { pool, quality, est_ttft_ms: ttft, queued_tokens: 0, in_flight, cost_usd: cost }
    }

    #[test]
    fn scores_use_fixed_scales_and_weights() {
        let m = mf(json!({"weights": {"quality": 1.0, "latency": 1.0, "cost": 1.0, "load": 1.0},
                          "scales": {"ttft_ms": 1000.0, "cost_usd": 0.01, "in_flight": 10.0}}));
        let c = cand(0, 0.8, 250.0, 5, 0.002);
        assert!((m.score(&c) - (0.8 + 0.75 + 0.8 + 0.5)).abs() < 1e-9, "{}", m.score(&c));
        // Past a scale, a factor scores 0, never below.
        assert!((m.score(&cand(0, 0.0, 5000.0, 100, 1.0))).abs() < 1e-12);
        // Fixed scales: one candidate's score does not depend on the others.
        let (_, alone) = m.choose(&[c], 0);
        let (_, with) = m.choose(&[c, cand(1, 0.1, 10.0, 0, 0.0)], 0);
        assert_eq!(alone[0].score, with[0].score);
    }

    #[test]
    fn quality_wins_when_latency_is_cheap_and_loses_when_it_is_not() {
        let m = mf(json!({"weights": {"quality": 0.5, "latency": 0.5, "cost": 0.0, "load": 0.0}}));
        let small = cand(0, 0.6, 100.0, 0, 0.0);
        let large = cand(1, 0.9, 300.0, 0, 0.0);
        assert_eq!(m.choose(&[small, large], 0).0, Some(1));
        let slow_large = cand(1, 0.9, 1900.0, 0, 0.0);
        assert_eq!(m.choose(&[small, slow_large], 0).0, Some(0));
    }

    #[test]
    fn ceilings_drop_candidates_and_on_no_candidates_decides() {
        let slo = json!({"max_ttft_ms": 500.0, "max_in_flight": 4});
        let a = cand(0, 0.9, 800.0, 0, 0.0);
        let b = cand(1, 0.5, 100.0, 9, 0.0);
        let m = mf(json!({"slo": slo}));
        let (chosen, scored) = m.choose(&[a, b], 1);
        assert_eq!(chosen, Some(0), "ignore_slo: the best score");
        assert_eq!(scored[0].over.as_deref(), Some("estimated TTFT 800 ms > 500 ms"));
        assert_eq!(scored[1].over.as_deref(), Some("in flight 9 > 4"));
        let m = mf(json!({"slo": slo, "on_no_candidates": "default_pool"}));
        assert_eq!(m.choose(&[a, b], 1).0, Some(1));
        let m = mf(json!({"slo": slo, "on_no_candidates": "reject"}));
        assert_eq!(m.choose(&[a, b], 1).0, None);
        // One under every ceiling wins whatever its score.
        let c = cand(2, 0.1, 100.0, 1, 0.0);
        assert_eq!(m.choose(&[a, b, c], 1).0, Some(2));
    }

    #[test]
    fn bad_parameters_are_refused() {
        for bad in [
            json!({"weights": {"quality": -1.0}}),
            json!({"scales": {"ttft_ms": 0.0}}),
            json!({"slo": {"max_ttft": 1.0}}),
            json!({"on_no_candidates": "panic"}),
            json!({"weight": {}}),
        ] {
            assert!(MultiFactor::from_params(bad.as_object().unwrap()).is_err(), "{bad}");
        }
        assert_eq!(mf(json!({})).weights, Weights::default());
    }
}
