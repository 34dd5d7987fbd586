//! A worker's load per data-parallel rank (`--dp-aware`): what the worker
//! last reported queued on each rank (SGLang's `/v1/loads`), and what this
//! router has sent each rank and not yet seen answered. The router sends a
//! request that no rank holds a prefix of to the least loaded rank, by the
//! same rule as for workers: the larger of its own view and the report.
//! It also decides whether a worker is told a rank at all ([`RankHeader`]).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use router_types::DpRank;

/// One rank's load.
#[derive(Debug, Default)]
struct Rank {
    reported: AtomicU64,
    uncached: AtomicU64,
    in_flight: AtomicU32,
}

/// When a worker is told the rank to serve a request on (`X-Data-Parallel-Rank`, or
/// `routed_dp_rank` on `/generate`): `--dp-rank-header`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RankHeader {
    /// Only a worker known to have several ranks: one whose `/server_info` says
    /// `dp_size` > 1, or whose events came from a rank above 0. An engine that advertises
    /// no ranks may refuse the hint (Dynamo's frontend answers it 400), and rank 0 of a
    /// one-rank engine means nothing.
    #[default]
    Auto,
    /// Every worker, rank 0 included (engines that accept it, as SGLang and vLLM do).
    Always,
    /// No worker: the engines place requests on their ranks themselves.
    Never,
}

/// Every rank's load; empty when the router is not DP-aware (costs nothing then).
#[derive(Debug, Default)]
pub(crate) struct RankLoads {
    ranks: Box<[Rank]>,
    header: RankHeader,
}

impl RankLoads {
    /// Room for `n` ranks (0: not DP-aware), the rank hint sent by `header`.
    pub(crate) fn new(n: usize, header: RankHeader) -> Self {
        Self { ranks: (0..n).map(|_| Rank::default()).collect(), header }
    }

    /// The rank to name to a worker of `dp_size` advertised ranks, of the one chosen.
    pub(crate) fn hint(&self, rank: Option<DpRank>, dp_size: u32) -> Option<DpRank> {
        match self.header {
            RankHeader::Always => rank,
            RankHeader::Never => None,
            RankHeader::Auto => rank.filter(|r| r.0 > 0 || dp_size > 1),
        }
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
        let r = RankLoads::new(4, RankHeader::Auto);
        assert_eq!(r.least_loaded(4), Some(DpRank(0)), "all idle: the lowest");
        assert_eq!(r.least_loaded(1), None, "one rank: nothing to choose");
        assert_eq!(RankLoads::new(0, RankHeader::Auto).least_loaded(4), None, "not DP-aware");
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

    #[test]
    fn a_rank_is_named_only_to_a_worker_of_several_by_default() {
        let (zero, two) = (Some(DpRank(0)), Some(DpRank(2)));
        let auto = RankLoads::new(0, RankHeader::Auto);
        assert_eq!(auto.hint(zero, 1), None, "rank 0 of an engine that advertised no ranks");
        assert_eq!(auto.hint(zero, 4), zero, "rank 0 of four");
        assert_eq!(auto.hint(two, 1), two, "events from rank 2: the engine has ranks");
        assert_eq!(auto.hint(None, 4), None);
        assert_eq!(RankLoads::new(0, RankHeader::Always).hint(zero, 1), zero);
        assert_eq!(RankLoads::new(0, RankHeader::Never).hint(two, 4), None);
    }
}
