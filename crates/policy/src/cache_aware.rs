//! The KV-event cache-aware policy (`../shared/docs/reference.md` §4): among
//! workers holding enough of the prompt, keep the top K by matched tokens and
//! take the one with the fewest uncached tokens, unless a near-equal hit sits
//! on a materially less loaded worker; with no such worker, power of two.
//! The random stream of that fallback moves on `commit` only.

use crate::simple::{SplitMix, check, commit_power_of_two, power_of_two};
use crate::{Candidate, Decision, Policy, PolicyError, Reason, RequestInfo};

/// The knobs, with the reference router's defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheAwareConfig {
    /// A worker is a cache candidate only if it holds at least this many prompt tokens.
    pub min_matched_tokens: u64,
    /// Candidates kept: at least this many...
    pub candidates_min: usize,
    /// ...or this fraction of the healthy workers...
    pub candidates_ratio: f64,
    /// ...and at most this many.
    pub candidates_max: usize,
    /// Hits within this many tokens of the best count as equal.
    pub switch_margin_tokens: u64,
    /// Whether near-equal hits may move to a less loaded worker.
    pub pressure_guard: bool,
    /// The best hit is "materially more loaded" if it owes this many more uncached prefill tokens...
    pub pressure_abs_tokens: u64,
    /// ...and more than this multiple of the alternative's.
    pub pressure_rel: f64,
}

/// The policy.
#[derive(Debug)]
pub struct CacheAware {
    config: CacheAwareConfig,
    rng: SplitMix,
}

// === impl CacheAwareConfig ===

impl Default for CacheAwareConfig {
    fn default() -> Self {
        Self {
            min_matched_tokens: 1024,
            candidates_min: 8,
            candidates_ratio: 0.05,
            candidates_max: 32,
            switch_margin_tokens: 1024,
            pressure_guard: true,
            pressure_abs_tokens: 1024,
            pressure_rel: 1.5,
        }
    }
}

impl CacheAwareConfig {
    /// How many candidates to keep among `healthy` workers.
    pub fn top_k(&self, healthy: usize) -> usize {
        let by_ratio = (self.candidates_ratio * healthy as f64).ceil() as usize;
        healthy.min(self.candidates_max).min(self.candidates_min.max(by_ratio)).max(1)
    }
}

// === impl CacheAware ===

impl CacheAware {
    /// The policy with `config`; `seed` drives the power-of-two fallback.
    pub fn new(config: CacheAwareConfig, seed: u64) -> Self {
        Self { config, rng: SplitMix::new(seed) }
    }

    /// The configuration.
    pub fn config(&self) -> &CacheAwareConfig {
        &self.config
    }

    /// Whether `c` holds enough of the prompt to be a cache candidate.
    fn is_hit(&self, c: &Candidate) -> bool {
        c.matched_tokens > 0 && c.matched_tokens >= self.config.min_matched_tokens
    }
}

impl Policy for CacheAware {
    fn name(&self) -> &'static str {
        "cache_aware"
    }

    fn select(&self, candidates: &[Candidate], _request: &RequestInfo<'_>) -> Result<Decision, PolicyError> {
        check(candidates)?;
        let c = &self.config;
        let mut hits: Vec<&Candidate> = candidates.iter().filter(|x| self.is_hit(x)).collect();
        if hits.is_empty() {
            let worker = power_of_two(&mut self.rng.peek(), candidates);
            return Ok(Decision { worker, reason: Reason::NoCacheCandidate });
        }
        // Most matched first; among equals the lighter load.
        let by_hit = |a: &&Candidate, b: &&Candidate| {
            b.matched_tokens
                .cmp(&a.matched_tokens)
                .then(a.load.uncached_tokens.cmp(&b.load.uncached_tokens))
                .then(a.load.in_flight.cmp(&b.load.in_flight))
        };
        let k = c.top_k(candidates.len()).min(hits.len());
        if k < hits.len() {
            hits.select_nth_unstable_by(k - 1, by_hit);
            hits.truncate(k);
        }
        hits.sort_unstable_by(by_hit);
        let best = hits[0];
        if c.pressure_guard {
            let floor = best.matched_tokens.saturating_sub(c.switch_margin_tokens);
            let lightest = hits
                .iter()
                .filter(|x| x.matched_tokens >= floor)
                .min_by_key(|x| (x.load.uncached_tokens, x.load.in_flight))
                .copied()
                .unwrap_or(best);
            let (b, l) = (best.load.uncached_tokens, lightest.load.uncached_tokens);
            if b > l + c.pressure_abs_tokens && b as f64 > c.pressure_rel * l as f64 {
                return Ok(Decision { worker: lightest.worker, reason: Reason::CacheHitLessLoaded });
            }
        }
        Ok(Decision { worker: best.worker, reason: Reason::CacheHit })
    }

    fn commit(&self, _decision: &Decision, candidates: &[Candidate], _request: &RequestInfo<'_>) {
        // Only the fallback draws.
        if !candidates.iter().any(|x| self.is_hit(x)) {
            commit_power_of_two(&self.rng, candidates);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use router_types::WorkerId;

    use crate::test_candidate as cand;

    /// A real request: select, then commit.
    fn pick(p: &CacheAware, cs: &[Candidate]) -> Decision {
        let req = RequestInfo { input_tokens: 8000, text: None };
        let d = p.select(cs, &req).unwrap();
        p.commit(&d, cs, &req);
        d
    }

    #[test]
    fn top_k_follows_the_reference_rule() {
        let c = CacheAwareConfig::default();
        assert_eq!(c.top_k(4), 4);
        assert_eq!(c.top_k(100), 8);
        assert_eq!(c.top_k(400), 20);
        assert_eq!(c.top_k(1000), 32);
    }

    #[test]
    fn longest_hit_wins_unless_materially_more_loaded() {
        let p = CacheAware::new(CacheAwareConfig::default(), 1);
        // Worker 1 holds most of the prompt.
        let d = pick(&p, &[cand(0, 2048, 0), cand(1, 6144, 0), cand(2, 0, 0)]);
        assert_eq!(d, Decision { worker: WorkerId(1), reason: Reason::CacheHit });
        // Worker 0 is within the margin and worker 1 owes far more prefill: switch.
        let d = pick(&p, &[cand(0, 5500, 100), cand(1, 6144, 5000)]);
        assert_eq!(d, Decision { worker: WorkerId(0), reason: Reason::CacheHitLessLoaded });
        // Outside the margin: stay, however loaded.
        let d = pick(&p, &[cand(0, 2048, 0), cand(1, 6144, 50_000)]);
        assert_eq!(d.worker, WorkerId(1));
        // Gap under the absolute threshold: stay.
        let d = pick(&p, &[cand(0, 5500, 100), cand(1, 6144, 1000)]);
        assert_eq!(d.worker, WorkerId(1));
        // Guard off: stay.
        let off = CacheAware::new(CacheAwareConfig { pressure_guard: false, ..CacheAwareConfig::default() }, 1);
        assert_eq!(pick(&off, &[cand(0, 5500, 100), cand(1, 6144, 5000)]).worker, WorkerId(1));
    }

    #[test]
    fn no_hit_above_the_floor_falls_back_to_load() {
        let p = CacheAware::new(CacheAwareConfig::default(), 7);
        let cs = [cand(0, 1000, 9000), cand(1, 0, 0)];
        for _ in 0..50 {
            let d = pick(&p, &cs);
            assert_eq!(
                d,
                Decision { worker: WorkerId(1), reason: Reason::NoCacheCandidate },
                "two candidates: always the lighter"
            );
        }
        assert_eq!(p.select(&[], &RequestInfo::default()), Err(PolicyError::NoCandidates));
    }
}
