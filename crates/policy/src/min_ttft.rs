//! Estimated-TTFT selection (Mooncake's conductor, simplified): each worker's
//! time to first token is the prefill it already owes (uncached tokens of its
//! in-flight requests) plus this request's uncached tokens, at the worker's
//! prefill speed; the smallest wins. Cache hits shrink the second term, load
//! grows the first, so one number trades them off.

use crate::simple::check;
use crate::{Candidate, Decision, Policy, PolicyError, Reason, RequestInfo};

/// The prefill model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MinTtftConfig {
    /// Uncached prompt tokens a worker prefills per second.
    pub prefill_tokens_per_s: f64,
    /// Fixed cost of each request's prefill, seconds.
    pub prefill_fixed_s: f64,
}

/// The policy.
#[derive(Debug)]
pub struct MinTtft {
    config: MinTtftConfig,
}

// === impl MinTtftConfig ===

impl Default for MinTtftConfig {
    fn default() -> Self {
        Self { prefill_tokens_per_s: 20_000.0, prefill_fixed_s: 0.02 }
    }
}

// === impl MinTtft ===

impl MinTtft {
    /// The policy with `config`.
    pub fn new(config: MinTtftConfig) -> Self {
        Self { config }
    }

    /// Estimated seconds to the first token of a request of `input` tokens on `c`.
    pub fn estimate(&self, c: &Candidate, input: u64) -> f64 {
        let owed = c.load.uncached_tokens as f64 / self.config.prefill_tokens_per_s + self.config.prefill_fixed_s;
        let mine = input.saturating_sub(c.matched_tokens) as f64 / self.config.prefill_tokens_per_s;
        owed + mine
    }
}

impl Policy for MinTtft {
    fn name(&self) -> &'static str {
        "min_ttft"
    }

    fn select(&self, candidates: &[Candidate], request: &RequestInfo<'_>) -> Result<Decision, PolicyError> {
        check(candidates)?;
        let best = candidates
            .iter()
            .min_by(|a, b| {
                self.estimate(a, request.input_tokens)
                    .total_cmp(&self.estimate(b, request.input_tokens))
                    .then(b.matched_tokens.cmp(&a.matched_tokens))
                    .then(a.load.in_flight.cmp(&b.load.in_flight))
            })
            .ok_or(PolicyError::NoCandidates)?;
        let reason = if best.matched_tokens > 0 { Reason::CacheHit } else { Reason::LeastLoad };
        Ok(Decision { worker: best.worker, reason })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Load;

    #[test]
    fn trades_cache_hits_against_queued_prefill() {
        let p = MinTtft::new(MinTtftConfig { prefill_tokens_per_s: 10_000.0, prefill_fixed_s: 0.0 });
        let req = RequestInfo { input_tokens: 10_000, text: None };
        let hit_idle = Candidate { worker: 0, load: Load::default(), matched_tokens: 8_000 };
        let miss_idle = Candidate { worker: 1, load: Load::default(), matched_tokens: 0 };
        assert_eq!(p.select(&[hit_idle, miss_idle], &req).unwrap().worker, 0);
        // The holder owes 30,000 tokens of prefill (3 s); a cold idle worker needs 1 s.
        let hit_busy =
            Candidate { worker: 0, load: Load { in_flight: 3, uncached_tokens: 30_000 }, matched_tokens: 8_000 };
        assert_eq!(p.select(&[hit_busy, miss_idle], &req).unwrap(), Decision { worker: 1, reason: Reason::LeastLoad });
    }
}
