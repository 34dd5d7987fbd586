//! Estimated-TTFT selection (Mooncake's conductor, simplified): a worker's
//! time to first token is the prefill it already owes (uncached tokens of its
//! requests still prefilling) plus this request's uncached tokens on it. Both
//! are in tokens, so no prefill speed is needed. Each cached token also earns
//! `hit_weight` tokens of credit: a hit is worth more than the prefill it saves
//! now, because keeping a conversation where its prefix lives stops the fleet's
//! caches filling with copies. Ties go round the workers, so routers that
//! cannot see each other's load do not all pick the same idle worker; the
//! turn moves on `commit` only.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::simple::check;
use crate::{Candidate, Decision, Policy, PolicyError, Reason, RequestInfo};

/// The knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MinTtftConfig {
    /// Credit per cached token, in tokens of estimated prefill, on top of the prefill it saves.
    pub hit_weight: f64,
}

/// The policy.
#[derive(Debug)]
pub struct MinTtft {
    config: MinTtftConfig,
    next: AtomicUsize,
}

// === impl MinTtftConfig ===

impl Default for MinTtftConfig {
    /// 4: chosen with `sgl-router-bench sim` on the Mooncake traces
    /// (docs/benchmarks.md). 0 (pure estimated TTFT) loses a tenth of
    /// cache_aware's hit rate on the conversation trace; 4 keeps 0.98 of it
    /// and nearly all of the TTFT gain.
    fn default() -> Self {
        Self { hit_weight: 4.0 }
    }
}

// === impl MinTtft ===

impl MinTtft {
    /// The policy with `config`.
    pub fn new(config: MinTtftConfig) -> Self {
        Self { config, next: AtomicUsize::new(0) }
    }

    /// Estimated prefill tokens ahead of the first token of a request of `input` tokens on `c`.
    pub fn estimate(c: &Candidate, input: u64) -> u64 {
        c.load.uncached_tokens.saturating_add(input.saturating_sub(c.matched_tokens))
    }

    /// What the policy minimizes: the estimate less the credit for the hit.
    fn cost(&self, c: &Candidate, input: u64) -> f64 {
        Self::estimate(c, input) as f64 - self.config.hit_weight * c.matched_tokens.min(input) as f64
    }
}

impl Policy for MinTtft {
    fn name(&self) -> &'static str {
        "min_ttft"
    }

    fn needs_tokens(&self) -> bool {
        true
    }

    fn select(&self, candidates: &[Candidate], request: &RequestInfo<'_>) -> Result<Decision, PolicyError> {
        check(candidates)?;
        let input = request.input_tokens;
        let start = self.next.load(Ordering::Relaxed) % candidates.len();
        let best = candidates[start..]
            .iter()
            .chain(&candidates[..start])
            .min_by(|a, b| {
                self.cost(a, input).total_cmp(&self.cost(b, input)).then(a.load.in_flight.cmp(&b.load.in_flight))
            })
            .ok_or(PolicyError::NoCandidates)?;
        let reason = if best.matched_tokens > 0 { Reason::CacheHit } else { Reason::LeastLoad };
        Ok(Decision { worker: best.worker, reason })
    }

    fn commit(&self, _decision: &Decision, _candidates: &[Candidate], _request: &RequestInfo<'_>) {
        self.next.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use router_types::WorkerId;

    use crate::{Load, test_candidate as cand};

    /// A real request: select, then commit.
    fn pick(p: &MinTtft, cs: &[Candidate], input: u64) -> Decision {
        let req = RequestInfo { input_tokens: input, text: None, at_ms: 0, heads: &[] };
        let d = p.select(cs, &req).unwrap();
        p.commit(&d, cs, &req);
        d
    }

    #[test]
    fn trades_cache_hits_against_queued_prefill() {
        let pure = MinTtft::new(MinTtftConfig { hit_weight: 0.0 });
        // Idle fleet: the hit is faster.
        assert_eq!(pick(&pure, &[cand(0, 8_000, 0), cand(1, 0, 0)], 10_000).worker, WorkerId(0));
        // The holder owes 30,000 tokens (32,000 in all); a cold idle worker needs 10,000.
        assert_eq!(
            pick(&pure, &[cand(0, 8_000, 30_000), cand(1, 0, 0)], 10_000),
            Decision { worker: WorkerId(1), reason: Reason::LeastLoad }
        );
        // No hits anywhere: the least owed prefill, whatever the request count.
        let light = Candidate { load: Load { in_flight: 9, uncached_tokens: 100 }, ..cand(1, 0, 0) };
        assert_eq!(pick(&pure, &[cand(0, 0, 5_000), light], 1).worker, WorkerId(1));
    }

    #[test]
    fn the_hit_weight_keeps_a_hit_through_a_short_wait() {
        let p = MinTtft::new(MinTtftConfig { hit_weight: 4.0 });
        // The holder of 8,000 tokens is 4,000 tokens slower (cost 8,000 - 32,000 against 4,000): stay.
        assert_eq!(
            pick(&p, &[cand(0, 8_000, 12_000), cand(1, 0, 0)], 12_000),
            Decision { worker: WorkerId(0), reason: Reason::CacheHit }
        );
        // 50,000 tokens slower: move.
        assert_eq!(pick(&p, &[cand(0, 8_000, 58_000), cand(1, 0, 0)], 12_000).worker, WorkerId(1));
        // A one-page hit buys little: a busy holder of 16 tokens loses to an idle worker.
        assert_eq!(pick(&p, &[cand(0, 16, 2_000), cand(1, 0, 0)], 4_000).worker, WorkerId(1));
        assert_eq!(p.select(&[], &RequestInfo::default()), Err(PolicyError::NoCandidates));
    }

    #[test]
    fn ties_go_round_the_workers() {
        let p = MinTtft::new(MinTtftConfig::default());
        let idle: Vec<Candidate> = (0..4).map(|w| cand(w, 0, 0)).collect();
        let picks: Vec<u32> = (0..8).map(|_| pick(&p, &idle, 100).worker.0).collect();
        assert_eq!(picks, [0, 1, 2, 3, 0, 1, 2, 3]);
    }
}
