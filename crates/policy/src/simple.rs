//! Load-only policies: round robin, random, power of two choices, least load.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::{Candidate, Decision, Policy, PolicyError, Reason, RequestInfo};

/// A lock-free SplitMix64 generator: good enough to spread load, seedable for tests.
#[derive(Debug)]
pub struct SplitMix(AtomicU64);

/// Next in turn.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

/// Uniformly at random.
#[derive(Debug)]
pub struct Random {
    rng: SplitMix,
}

/// The less loaded of two distinct random candidates.
#[derive(Debug)]
pub struct PowerOfTwo {
    rng: SplitMix,
}

/// The least loaded candidate (fewest in-flight requests, then fewest uncached tokens).
#[derive(Debug, Default)]
pub struct LeastLoad {
    tie: AtomicUsize,
}

// === impl SplitMix ===

impl SplitMix {
    /// A generator with this seed.
    pub fn new(seed: u64) -> Self {
        Self(AtomicU64::new(seed))
    }

    /// A uniform value below `n` (`n > 0`).
    pub fn below(&self, n: usize) -> usize {
        let mut z = self.0.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((u128::from(z) * n as u128) >> 64) as usize
    }
}

pub(crate) fn check(candidates: &[Candidate]) -> Result<(), PolicyError> {
    if candidates.is_empty() { Err(PolicyError::NoCandidates) } else { Ok(()) }
}

/// Orders by load: in-flight requests, then uncached tokens owed.
pub(crate) fn lighter(a: &Candidate, b: &Candidate) -> bool {
    (a.load.in_flight, a.load.uncached_tokens) < (b.load.in_flight, b.load.uncached_tokens)
}

/// Power of two choices over `candidates`.
pub(crate) fn power_of_two(rng: &SplitMix, candidates: &[Candidate]) -> usize {
    let n = candidates.len();
    if n == 1 {
        return candidates[0].worker;
    }
    let a = rng.below(n);
    let mut b = rng.below(n - 1);
    if b >= a {
        b += 1;
    }
    if lighter(&candidates[b], &candidates[a]) { candidates[b].worker } else { candidates[a].worker }
}

// === impl RoundRobin ===

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round_robin"
    }

    fn select(&self, candidates: &[Candidate], _request: &RequestInfo<'_>) -> Result<Decision, PolicyError> {
        check(candidates)?;
        let i = self.next.fetch_add(1, Ordering::Relaxed) % candidates.len();
        Ok(Decision { worker: candidates[i].worker, reason: Reason::RoundRobin })
    }
}

// === impl Random ===

impl Random {
    /// Seeded (tests use a fixed seed; the router seeds from the clock).
    pub fn new(seed: u64) -> Self {
        Self { rng: SplitMix::new(seed) }
    }
}

impl Policy for Random {
    fn name(&self) -> &'static str {
        "random"
    }

    fn select(&self, candidates: &[Candidate], _request: &RequestInfo<'_>) -> Result<Decision, PolicyError> {
        check(candidates)?;
        Ok(Decision { worker: candidates[self.rng.below(candidates.len())].worker, reason: Reason::Random })
    }
}

// === impl PowerOfTwo ===

impl PowerOfTwo {
    /// Seeded.
    pub fn new(seed: u64) -> Self {
        Self { rng: SplitMix::new(seed) }
    }
}

impl Policy for PowerOfTwo {
    fn name(&self) -> &'static str {
        "power_of_two"
    }

    fn select(&self, candidates: &[Candidate], _request: &RequestInfo<'_>) -> Result<Decision, PolicyError> {
        check(candidates)?;
        Ok(Decision { worker: power_of_two(&self.rng, candidates), reason: Reason::PowerOfTwo })
    }
}

// === impl LeastLoad ===

impl Policy for LeastLoad {
    fn name(&self) -> &'static str {
        "least_load"
    }

    fn select(&self, candidates: &[Candidate], _request: &RequestInfo<'_>) -> Result<Decision, PolicyError> {
        check(candidates)?;
        // Rotate the starting point so ties do not always go to the first worker.
        let start = self.tie.fetch_add(1, Ordering::Relaxed) % candidates.len();
        let mut best = &candidates[start];
        for c in candidates[start..].iter().chain(&candidates[..start]) {
            if lighter(c, best) {
                best = c;
            }
        }
        Ok(Decision { worker: best.worker, reason: Reason::LeastLoad })
    }
}
