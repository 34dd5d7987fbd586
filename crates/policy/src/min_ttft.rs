//! Estimated-TTFT selection (Mooncake's conductor, simplified): a worker's
//! time to first token is the prefill it already owes (uncached tokens of its
//! requests still prefilling) plus this request's uncached tokens on it. Both
//! are in tokens, so no prefill speed is needed. Among the workers within
//! `slack_tokens` of the smallest estimate, the longest cache hit wins: a
//! little extra wait keeps a conversation where its prefix lives, so the
//! fleet's caches do not fill with copies.

use crate::simple::check;
use crate::{Candidate, Decision, Policy, PolicyError, Reason, RequestInfo};

/// The knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinTtftConfig {
    /// Extra estimated prefill, in tokens, accepted to keep a longer cache hit.
    pub slack_tokens: u64,
}

/// The policy.
#[derive(Debug)]
pub struct MinTtft {
    config: MinTtftConfig,
}

// === impl MinTtftConfig ===

impl Default for MinTtftConfig {
    /// 32,768 tokens: about 1.6 s of prefill at 20 k tokens/s. Chosen by
    /// `sgl-router-bench sim` on the Mooncake traces (docs/benchmarks.md):
    /// 0 loses a tenth of cache_aware's hit rate, 64 k and more lose TTFT.
    fn default() -> Self {
        Self { slack_tokens: 32_768 }
    }
}

// === impl MinTtft ===

impl MinTtft {
    /// The policy with `config`.
    pub fn new(config: MinTtftConfig) -> Self {
        Self { config }
    }

    /// Estimated prefill tokens ahead of the first token of a request of `input` tokens on `c`.
    pub fn estimate(c: &Candidate, input: u64) -> u64 {
        c.load.uncached_tokens.saturating_add(input.saturating_sub(c.matched_tokens))
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
        let fastest = candidates.iter().map(|c| Self::estimate(c, input)).min().ok_or(PolicyError::NoCandidates)?;
        let limit = fastest.saturating_add(self.config.slack_tokens);
        let best = candidates
            .iter()
            .filter(|c| Self::estimate(c, input) <= limit)
            .min_by(|a, b| {
                b.matched_tokens
                    .cmp(&a.matched_tokens)
                    .then(Self::estimate(a, input).cmp(&Self::estimate(b, input)))
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

    fn cand(worker: usize, matched: u64, owed: u64) -> Candidate {
        Candidate {
            worker,
            load: Load { in_flight: (owed / 1000) as u32, uncached_tokens: owed },
            matched_tokens: matched,
        }
    }

    fn pick(p: &MinTtft, cs: &[Candidate], input: u64) -> Decision {
        p.select(cs, &RequestInfo { input_tokens: input, text: None }).unwrap()
    }

    #[test]
    fn trades_cache_hits_against_queued_prefill() {
        let strict = MinTtft::new(MinTtftConfig { slack_tokens: 0 });
        // Idle fleet: the hit is faster.
        assert_eq!(pick(&strict, &[cand(0, 8_000, 0), cand(1, 0, 0)], 10_000).worker, 0);
        // The holder owes 30,000 tokens (32,000 in all); a cold idle worker needs 10,000.
        assert_eq!(
            pick(&strict, &[cand(0, 8_000, 30_000), cand(1, 0, 0)], 10_000),
            Decision { worker: 1, reason: Reason::LeastLoad }
        );
        // No hits anywhere: the least owed prefill, whatever the request count.
        let d = pick(
            &strict,
            &[cand(0, 0, 5_000), Candidate { load: Load { in_flight: 9, uncached_tokens: 100 }, ..cand(1, 0, 0) }],
            1,
        );
        assert_eq!(d.worker, 1);
    }

    #[test]
    fn slack_keeps_the_hit_when_the_wait_is_small() {
        let p = MinTtft::new(MinTtftConfig { slack_tokens: 4_096 });
        // The holder is 2,000 tokens slower than the idle worker: within the slack, stay.
        assert_eq!(
            pick(&p, &[cand(0, 8_000, 4_000), cand(1, 0, 0)], 4_000),
            Decision { worker: 0, reason: Reason::CacheHit }
        );
        // 20,000 slower: move.
        assert_eq!(pick(&p, &[cand(0, 8_000, 22_000), cand(1, 0, 0)], 4_000).worker, 1);
        // Within the slack, the longer hit wins over the faster shorter one.
        assert_eq!(pick(&p, &[cand(0, 2_000, 0), cand(1, 3_000, 1_500), cand(2, 0, 0)], 4_000).worker, 1);
        assert_eq!(p.select(&[], &RequestInfo::default()), Err(PolicyError::NoCandidates));
    }
}
