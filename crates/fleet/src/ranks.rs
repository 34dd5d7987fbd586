//! A worker's load per data-parallel rank (`--dp-aware`): what the worker
//! last reported queued on each rank (SGLang's `/v1/loads`), and what this
//! router has sent each rank and not yet seen answered. The router sends a
//! request that no rank holds a prefix of to the least loaded rank, by the
//! same rule as for workers: the larger of its own view and the report.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use router_types::DpRank;

/// One rank's load.
#[derive(Debug, Default)]
struct Rank {
    reported: AtomicU64,
    uncached: AtomicU64,
    in_flight: AtomicU32,
}

/// Every rank's load; empty when the router is not DP-aware (costs nothing then).
#[derive(Debug, Default)]
pub(crate) struct RankLoads {
    ranks: Box<[Rank]>,
}

impl RankLoads {
    /// Room for `n` ranks (0: not DP-aware).
    pub(crate) fn new(n: usize) -> Self {
        Self { ranks: (0..n).map(|_| Rank::default()).collect() }
    }

    /// Whether ranks are tracked.
    pub(crate) fn tracked(&self) -> bool {
        !self.ranks.is_empty()
    }

    /// Records the worker's report: queued uncached tokens by rank (ranks it
    /// does not name are taken as idle).
    pub(crate) fn set_reported(&self, report: &[(usize, u64)]) {
        for r in self.ranks.iter() {
            r.reported.store(0, Ordering::Relaxed);
        }
        for (rank, tokens) in report {
            if let Some(r) = self.ranks.get(*rank) {
                r.reported.store(*tokens, Ordering::Relaxed);
            }
        }
    }

    /// The least loaded of the first `dp_size` ranks: the larger of the
    /// router's uncached tokens on it and the worker's report, then the
    /// router's requests in flight, then the lowest rank.
    pub(crate) fn least_loaded(&self, dp_size: usize) -> Option<DpRank> {
        let ranks = self.ranks.get(..dp_size.min(self.ranks.len()))?;
        if ranks.len() < 2 {
            return None;
        }
        let load = |r: &Rank| {
            let own = r.uncached.load(Ordering::Relaxed);
            (own.max(r.reported.load(Ordering::Relaxed)), r.in_flight.load(Ordering::Relaxed))
        };
        let (best, _) = ranks.iter().enumerate().min_by_key(|(i, r)| (load(r), *i))?;
        Some(DpRank(best as u32))
    }

    /// Charges a request on `rank`; the same `rank` is given to [`RankLoads::release`].
    pub(crate) fn charge(&self, rank: usize, uncached: u64) -> bool {
        let Some(r) = self.ranks.get(rank) else { return false };
        r.in_flight.fetch_add(1, Ordering::Relaxed);
        r.uncached.fetch_add(uncached, Ordering::Relaxed);
        true
    }

    /// The rank prefilled `uncached` tokens.
    pub(crate) fn prefilled(&self, rank: usize, uncached: u64) {
        if let Some(r) = self.ranks.get(rank) {
            r.uncached.fetch_sub(uncached, Ordering::Relaxed);
        }
    }

    /// The request on `rank` ended, `uncached` of its tokens still owed.
    pub(crate) fn release(&self, rank: usize, uncached: u64) {
        if let Some(r) = self.ranks.get(rank) {
            r.in_flight.fetch_sub(1, Ordering::Relaxed);
            r.uncached.fetch_sub(uncached, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_loaded_rank_by_report_and_own_load() {
        let r = RankLoads::new(4);
        assert_eq!(r.least_loaded(4), Some(DpRank(0)), "all idle: the lowest");
        assert_eq!(r.least_loaded(1), None, "one rank: nothing to choose");
        assert_eq!(RankLoads::new(0).least_loaded(4), None, "not DP-aware");
        r.set_reported(&[(0, 5000), (1, 100), (2, 3000)]);
        assert_eq!(r.least_loaded(4), Some(DpRank(3)));
        assert!(r.charge(3, 200));
        assert_eq!(r.least_loaded(4), Some(DpRank(1)), "its own 200 owed beats the report of 100");
        r.prefilled(3, 200);
        assert_eq!(r.least_loaded(4), Some(DpRank(3)), "prefilled: only its request in flight, no tokens owed");
        assert!(r.charge(3, 0));
        r.set_reported(&[(0, 0), (1, 0), (2, 0)]);
        assert_eq!(r.least_loaded(4), Some(DpRank(0)), "ties on tokens go by requests in flight");
        r.release(3, 0);
        r.release(3, 0);
        assert!(!r.charge(9, 1), "a rank past the worker's is not charged");
    }
}
