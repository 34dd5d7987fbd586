//! Round robin and random; and the pieces the load policies share (the seedable random
//! stream, the load order, a power-of-two draw).
//!
//! Each `select` reads its state (the last worker served, the stream's
//! position, the tie counter) and each `commit` moves it, so a selection that
//! is never sent changes nothing.

use std::sync::atomic::{AtomicU64, Ordering};

use router_types::WorkerId;

use crate::{Candidate, Decision, Policy, PolicyError, Reason, RequestInfo};

/// A lock-free SplitMix64 stream, seedable for tests: [`peek`](Self::peek)
/// reads the next draws without taking them, [`advance`](Self::advance)
/// takes them once the choice they made is committed.
#[derive(Debug)]
pub struct SplitMix(AtomicU64);

/// The draws ahead of a [`SplitMix`] at the time of a `peek`: a private
/// copy of its state, so drawing from it leaves the stream as it was.
#[derive(Debug, Clone)]
pub struct Draws {
    state: u64,
    taken: u64,
}

/// Next in turn: the candidate with the next id after the last one served,
/// wrapping, so the turn survives workers joining, leaving and the
/// candidates' order.
#[derive(Debug, Default)]
pub struct RoundRobin {
    /// The last worker served, as `id + 1`; 0 before the first.
    after: AtomicU64,
}

/// Uniformly at random.
#[derive(Debug)]
pub struct Random {
    rng: SplitMix,
}

/// The SplitMix64 increment (the golden ratio).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

// === impl SplitMix ===

impl SplitMix {
    /// A stream with this seed.
    pub fn new(seed: u64) -> Self {
        Self(AtomicU64::new(seed))
    }

    /// The draws ahead, left in the stream.
    pub fn peek(&self) -> Draws {
        Draws { state: self.0.load(Ordering::Relaxed), taken: 0 }
    }

    /// Takes `draws` draws from the stream (those a committed choice used).
    pub fn advance(&self, draws: u64) {
        self.0.fetch_add(GAMMA.wrapping_mul(draws), Ordering::Relaxed);
    }
}

// === impl Draws ===

impl Draws {
    /// A uniform value below `n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        self.state = self.state.wrapping_add(GAMMA);
        self.taken += 1;
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((u128::from(z) * n as u128) >> 64) as usize
    }

    /// A uniform value in `[0, 1)` (one draw).
    pub fn unit(&mut self) -> f64 {
        const STEPS: u64 = 1 << 53;
        self.below(STEPS as usize) as f64 / STEPS as f64
    }

    /// How many draws were made.
    pub fn taken(&self) -> u64 {
        self.taken
    }
}

pub(crate) fn check(candidates: &[Candidate]) -> Result<(), PolicyError> {
    if candidates.is_empty() { Err(PolicyError::NoCandidates) } else { Ok(()) }
}

/// Orders by load: in-flight requests, then uncached tokens owed.
pub(crate) fn lighter(a: &Candidate, b: &Candidate) -> bool {
    (a.load.in_flight, a.load.uncached_tokens) < (b.load.in_flight, b.load.uncached_tokens)
}

/// Power of two choices over `candidates`, drawing from `draws`
/// (two draws, none for a single candidate).
pub(crate) fn power_of_two(draws: &mut Draws, candidates: &[Candidate]) -> WorkerId {
    if candidates.len() == 1 {
        return candidates[0].worker;
    }
    let (a, b) = two(draws, candidates.len());
    if lighter(&candidates[b], &candidates[a]) { candidates[b].worker } else { candidates[a].worker }
}

/// Two distinct uniform positions below `n` (`n >= 2`), from two draws.
pub(crate) fn two(draws: &mut Draws, n: usize) -> (usize, usize) {
    let a = draws.below(n);
    let mut b = draws.below(n - 1);
    if b >= a {
        b += 1;
    }
    (a, b)
}

/// Takes from `rng` the draws a power-of-two choice over `candidates` used.
pub(crate) fn commit_power_of_two(rng: &SplitMix, candidates: &[Candidate]) {
    let mut draws = rng.peek();
    if !candidates.is_empty() {
        power_of_two(&mut draws, candidates);
    }
    rng.advance(draws.taken());
}

// === impl RoundRobin ===

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round_robin"
    }

    fn select(&self, candidates: &[Candidate], _request: &RequestInfo<'_>) -> Result<Decision, PolicyError> {
        check(candidates)?;
        let after = self.after.load(Ordering::Relaxed);
        // The smallest id past the last one served; when there is none, wrap to the smallest.
        // The fleet's snapshot lists workers in id order: then a binary search finds it.
        let next = if candidates.is_sorted_by_key(|c| c.worker) {
            let i = candidates.partition_point(|c| u64::from(c.worker.0) < after);
            candidates.get(i).unwrap_or(&candidates[0]).worker
        } else {
            let (mut past, mut least) = (None::<WorkerId>, candidates[0].worker);
            for c in candidates {
                least = least.min(c.worker);
                if u64::from(c.worker.0) >= after && past.is_none_or(|p| c.worker < p) {
                    past = Some(c.worker);
                }
            }
            past.unwrap_or(least)
        };
        Ok(Decision { worker: next, reason: Reason::RoundRobin })
    }

    fn commit(&self, decision: &Decision, _candidates: &[Candidate], _request: &RequestInfo<'_>) {
        self.after.store(u64::from(decision.worker.0) + 1, Ordering::Relaxed);
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
        let i = self.rng.peek().below(candidates.len());
        Ok(Decision { worker: candidates[i].worker, reason: Reason::Random })
    }

    fn commit(&self, _decision: &Decision, _candidates: &[Candidate], _request: &RequestInfo<'_>) {
        self.rng.advance(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_candidate;

    fn ids(ids: &[u32]) -> Vec<Candidate> {
        ids.iter().map(|&w| test_candidate(w, 0, 0)).collect()
    }

    /// A real request: select, then commit.
    fn send(p: &dyn Policy, cs: &[Candidate]) -> u32 {
        let req = RequestInfo::default();
        let d = p.select(cs, &req).unwrap();
        p.commit(&d, cs, &req);
        d.worker.0
    }

    #[test]
    fn round_robin_turns_follow_ids_as_the_fleet_changes() {
        let rr = RoundRobin::default();
        let fleet = ids(&[1, 2, 3]);
        let mut counts = [0usize; 4];
        for _ in 0..300 {
            counts[send(&rr, &fleet) as usize] += 1;
        }
        assert_eq!(counts, [0, 100, 100, 100]);
        // 1 and 2 served; 2 leaves: it is 3's turn, not 1's again.
        assert_eq!([send(&rr, &fleet), send(&rr, &fleet)], [1, 2]);
        let picks: Vec<u32> = (0..6).map(|_| send(&rr, &ids(&[1, 3]))).collect();
        assert_eq!(picks, [3, 1, 3, 1, 3, 1]);
        // A new worker (a new, higher id) takes its turn after 3.
        let picks: Vec<u32> = (0..8).map(|_| send(&rr, &ids(&[1, 3, 10]))).collect();
        assert_eq!(picks, [3, 10, 1, 3, 10, 1, 3, 10]);
    }

    #[test]
    fn round_robin_ignores_the_candidates_order() {
        let rr = RoundRobin::default();
        let mut counts = [0usize; 4];
        for i in 0..300 {
            // Each request lists the workers rotated one further: a cursor over positions
            // would land on the same worker every time.
            let mut order = vec![1, 2, 3];
            order.rotate_right(i % 3);
            counts[send(&rr, &ids(&order)) as usize] += 1;
        }
        assert_eq!(counts, [0, 100, 100, 100]);
    }

    #[test]
    fn commit_takes_the_draws_select_made() {
        for n in 1..6u32 {
            let cs: Vec<Candidate> = (0..n).map(|w| test_candidate(w, 0, u64::from(w) * 1000)).collect();
            let rng = SplitMix::new(u64::from(n));
            let mut draws = rng.peek();
            let chosen = power_of_two(&mut draws, &cs);
            commit_power_of_two(&rng, &cs);
            assert_eq!(rng.peek().state, draws.state, "{n} candidates");
            assert_eq!(power_of_two(&mut SplitMix::new(u64::from(n)).peek(), &cs), chosen, "peeking is repeatable");
        }
    }
}
