//! Sticky routing by a client's key (SGLang Model Gateway's
//! `x-smg-routing-key`): a key goes to the worker of highest rendezvous
//! weight among those that may take it. A session stays on its worker while
//! that worker is healthy, moves to the next one while it is not, and comes
//! back when it returns; adding a worker moves only the keys it wins. The
//! weights hash the key with each worker's URL (a stable 64-bit hash), so
//! every router replica sends a key to the same worker, and nothing is
//! remembered per key: no client can make the router hold state.
//!
//! The `manual` policy is this for requests with a key and a uniform random
//! choice for requests without one (SGLang Model Gateway's default
//! assignment); every other policy honours the key as an override.

use router_types::WorkerId;

use crate::simple::Random;
use crate::{Candidate, Decision, Policy, PolicyError, RequestInfo};

/// FNV-1a over `parts`, then a SplitMix64 finalizer: stable across builds and machines.
fn weight(key: &[u8], worker: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.iter().chain(&[0xff]).chain(worker.as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The worker `key` goes to among `workers` (id and URL), if any.
pub fn by_key<'a>(key: &[u8], workers: impl IntoIterator<Item = (WorkerId, &'a str)>) -> Option<WorkerId> {
    workers.into_iter().max_by_key(|(id, url)| (weight(key, url), std::cmp::Reverse(*id))).map(|(id, _)| id)
}

/// `--policy manual`: keyed requests by [`by_key`] (the gateway applies it
/// for every policy), the others uniformly at random.
#[derive(Debug)]
pub struct Manual {
    random: Random,
}

impl Manual {
    /// The policy; `seed` drives the choice for requests without a key.
    pub fn new(seed: u64) -> Self {
        Self { random: Random::new(seed) }
    }
}

impl Policy for Manual {
    fn name(&self) -> &'static str {
        "manual"
    }

    fn select(&self, candidates: &[Candidate], request: &RequestInfo<'_>) -> Result<Decision, PolicyError> {
        self.random.select(candidates, request)
    }

    fn commit(&self, decision: &Decision, candidates: &[Candidate], request: &RequestInfo<'_>) {
        self.random.commit(decision, candidates, request);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet(n: u32) -> Vec<(WorkerId, String)> {
        (0..n).map(|i| (WorkerId(i), format!("http://10.0.0.{i}:30000"))).collect()
    }

    fn pick(key: &str, workers: &[(WorkerId, String)]) -> WorkerId {
        by_key(key.as_bytes(), workers.iter().map(|(id, u)| (*id, u.as_str()))).unwrap()
    }

    #[test]
    fn a_key_stays_on_its_worker_moves_while_it_is_away_and_comes_back() {
        let all = fleet(4);
        let home = pick("session-42", &all);
        assert_eq!(pick("session-42", &all), home, "stable");
        let without: Vec<_> = all.iter().filter(|(id, _)| *id != home).cloned().collect();
        let away = pick("session-42", &without);
        assert_ne!(away, home);
        assert_eq!(pick("session-42", &all), home, "back when it returns");
        assert_eq!(by_key(b"k", std::iter::empty()), None);
    }

    #[test]
    fn keys_spread_and_a_new_worker_moves_only_the_keys_it_wins() {
        let (four, five) = (fleet(4), fleet(5));
        let mut per = [0usize; 4];
        let mut moved = 0;
        for k in 0..4000 {
            let key = format!("user-{k}");
            let before = pick(&key, &four);
            per[before.0 as usize] += 1;
            let after = pick(&key, &five);
            if after != before {
                assert_eq!(after, WorkerId(4), "a key moves only to the new worker");
                moved += 1;
            }
        }
        assert!(per.iter().all(|n| (800..1200).contains(n)), "{per:?}");
        assert!((600..1000).contains(&moved), "about a fifth moved: {moved}");
    }
}
