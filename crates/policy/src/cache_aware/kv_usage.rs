//! cache_aware's guards on the KV-cache usage the engines report (Shepherd
//! Model Gateway's `--balance-token-usage-threshold` and
//! `--overload-token-usage-threshold`): a spread between the hottest and the
//! coldest engine abandons cache affinity for the shortest queue; an engine
//! over the ceiling is left out of this request's choice. Workers that report
//! no usage take no part in either.

use router_types::WorkerId;

use crate::Candidate;

/// A reported usage, 0 to 1.
fn usage(c: &Candidate) -> Option<f64> {
    c.kv_usage.map(|permille| f64::from(permille) / 1000.0)
}

/// The candidate with the shortest queue (fewest requests in flight, then the least prefill
/// owed, then the least KV usage reported, then the lowest id), when the reporting candidates'
/// usage spreads by more than `threshold` (1 or more: never).
pub(super) fn spread(candidates: &[Candidate], threshold: f64) -> Option<WorkerId> {
    if threshold >= 1.0 {
        return None;
    }
    let (mut low, mut high) = (f64::INFINITY, f64::NEG_INFINITY);
    for u in candidates.iter().filter_map(usage) {
        low = low.min(u);
        high = high.max(u);
    }
    (high - low > threshold).then(|| {
        let key = |c: &&Candidate| (c.load.in_flight, c.load.uncached_tokens, c.kv_usage.unwrap_or(u16::MAX), c.worker);
        let shortest = candidates.iter().min_by_key(key);
        shortest.map(|c| c.worker)
    })?
}

/// The position of the hottest reporting candidate, when its usage is over `ceiling` (1 or
/// more: never) and another candidate is left to serve.
pub(super) fn saturated(candidates: &[Candidate], ceiling: f64) -> Option<usize> {
    if ceiling >= 1.0 || candidates.len() < 2 {
        return None;
    }
    let hottest = candidates
        .iter()
        .enumerate()
        .filter_map(|(i, c)| Some((i, usage(c)?, c.worker)))
        .max_by(|a, b| a.1.total_cmp(&b.1).then(b.2.cmp(&a.2)))?;
    (hottest.1 > ceiling).then_some(hottest.0)
}

/// `candidates` without the one at `shed`.
pub(super) fn without(candidates: &[Candidate], shed: usize) -> Vec<Candidate> {
    candidates.iter().enumerate().filter(|(i, _)| *i != shed).map(|(_, c)| *c).collect()
}
