//! The KV-event cache-aware policy (`../shared/docs/reference.md` §4): among
//! workers holding enough of the prompt, keep the top K by matched tokens and
//! take the one with the fewest uncached tokens, unless a near-equal hit sits
//! on a materially less loaded worker; with no such worker, power of two.
//! The random stream of that fallback moves on `commit` only.
//!
//! The warm-up slice (Shepherd Model Gateway 1.13's): a worker new in
//! rotation or with a thin cache ([`crate::Warmup`]) would get no hit while
//! another worker holds every prefix. One miss in `1 / warmup_share` goes to
//! the least loaded warming worker, and one hit in `warmup_divert_every` to a
//! thin worker with nothing in flight, so it builds a cache. The counters
//! move on `commit` only, as the random stream does.
//!
//! With a text tree ([`CacheAware::with_text_tree`], SGLang Model Gateway's
//! `cache_aware` for engines that publish no events), a worker whose events
//! are not followed is judged by the tree of the text this router sent it:
//! it is a hit when its match covers more than the tree's `cache_threshold`
//! of the prompt, credited with that share of the prompt's tokens, and
//! ranked with the followed workers' exact hits. The tree learns (on
//! `commit`) only what goes to such workers.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use router_types::WorkerId;

use crate::approx_tree::{ApproxTree, ApproxTreeConfig};
use crate::simple::{SplitMix, check, commit_power_of_two, power_of_two};
use crate::{Candidate, Decision, Policy, PolicyError, Reason, RequestInfo, Warmup};

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
    /// Share of cache misses given to a warming worker (0: none).
    pub warmup_share: f64,
    /// One cache hit in this many is diverted to a thin worker (0: none).
    pub warmup_divert_every: u64,
}

/// The policy.
#[derive(Debug)]
pub struct CacheAware {
    config: CacheAwareConfig,
    rng: SplitMix,
    /// The text tree for workers whose events are not followed.
    text: Option<TextTree>,
    /// Misses and hits committed (the warm-up slice counts them).
    misses: AtomicU64,
    hits: AtomicU64,
}

/// What the router sent each unfollowed worker, as text.
#[derive(Debug)]
struct TextTree {
    config: ApproxTreeConfig,
    tree: Mutex<ApproxTree>,
    clock: AtomicU64,
}

/// A candidate as judged: exact (events) or estimated (text tree).
#[derive(Debug, Clone, Copy)]
struct Judged {
    c: Candidate,
    hit: bool,
    estimated: bool,
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
            warmup_share: 0.25,
            warmup_divert_every: 8,
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
        Self { config, rng: SplitMix::new(seed), text: None, misses: AtomicU64::new(0), hits: AtomicU64::new(0) }
    }

    /// Judges the workers whose events are not followed by a tree of the
    /// text this router sent them (see the module's documentation).
    pub fn with_text_tree(mut self, config: ApproxTreeConfig) -> Self {
        self.text = Some(TextTree { config, tree: Mutex::new(ApproxTree::new()), clock: AtomicU64::new(0) });
        self
    }

    /// Bytes held by the tree, as its bound counts them (its text and its nodes).
    pub fn tree_bytes(&self) -> usize {
        self.text.as_ref().map_or(0, |t| t.lock().held())
    }

    /// The configuration.
    pub fn config(&self) -> &CacheAwareConfig {
        &self.config
    }

    /// A miss's warming worker, when this miss is the slice's turn: the least
    /// loaded young or thin candidate.
    fn warmup_miss(&self, candidates: &[Candidate]) -> Option<WorkerId> {
        let share = self.config.warmup_share;
        if share.is_nan() || share <= 0.0 {
            return None;
        }
        let warming = candidates.iter().filter(|c| c.warmup != Warmup::Warm);
        let least = warming.min_by_key(|c| (c.load.uncached_tokens, c.load.in_flight, c.worker))?;
        let every = (1.0 / share.min(1.0)).round().max(1.0) as u64;
        let turn = (self.misses.load(Ordering::Relaxed) + 1).is_multiple_of(every);
        turn.then_some(least.worker)
    }

    /// A hit's thin worker, when this hit is the diversion's turn: the least
    /// loaded thin candidate with nothing in flight (one diverted request at a time).
    fn warmup_divert(&self, candidates: &[Candidate]) -> Option<WorkerId> {
        let every = self.config.warmup_divert_every;
        if every == 0 {
            return None;
        }
        let thin = candidates.iter().filter(|c| c.warmup == Warmup::Thin && c.load.in_flight == 0);
        let least = thin.min_by_key(|c| (c.load.uncached_tokens, c.worker))?;
        (self.hits.load(Ordering::Relaxed) + 1).is_multiple_of(every).then_some(least.worker)
    }

    /// Whether `c` holds enough of the prompt to be a cache candidate.
    fn is_hit(&self, c: &Candidate) -> bool {
        c.matched_tokens > 0 && c.matched_tokens >= self.config.min_matched_tokens
    }

    /// Every candidate with its verdict: followed ones by their exact match,
    /// unfollowed ones by the text tree (when there is one).
    fn judge(&self, candidates: &[Candidate], request: &RequestInfo<'_>) -> Vec<Judged> {
        let exact = |c: &Candidate| Judged { c: *c, hit: self.is_hit(c), estimated: false };
        let text = request.text.unwrap_or("").as_bytes();
        let Some(tree) = self.text.as_ref().filter(|_| !text.is_empty() && candidates.iter().any(|c| !c.followed))
        else {
            return candidates.iter().map(exact).collect();
        };
        let (matched, holders) = tree.lock().longest_match(text);
        let ratio = matched as f64 / text.len() as f64;
        let tokens = (ratio * request.input_tokens as f64) as u64;
        candidates
            .iter()
            .map(|c| {
                if c.followed {
                    return exact(c);
                }
                let hit = ratio > tree.config.cache_threshold && holders.binary_search(&c.worker).is_ok();
                let matched_tokens = if hit { tokens.max(1) } else { 0 };
                Judged { c: Candidate { matched_tokens, ..*c }, hit, estimated: true }
            })
            .collect()
    }
}

/// The least loaded worker, when the most loaded has more than `balance_abs`
/// requests more and more than `balance_rel` times as many (ties to the lowest id).
fn imbalanced(candidates: &[Candidate], t: &ApproxTreeConfig) -> Option<WorkerId> {
    let least = candidates.iter().min_by_key(|c| (c.load.in_flight, c.worker))?;
    let most = candidates.iter().map(|c| c.load.in_flight).max()?;
    let min = least.load.in_flight;
    (most.saturating_sub(min) > t.balance_abs && f64::from(most) > t.balance_rel * f64::from(min))
        .then_some(least.worker)
}

impl TextTree {
    fn lock(&self) -> std::sync::MutexGuard<'_, ApproxTree> {
        self.tree.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Policy for CacheAware {
    fn name(&self) -> &'static str {
        "cache_aware"
    }

    fn needs_text(&self) -> bool {
        self.text.is_some()
    }

    fn select(&self, candidates: &[Candidate], request: &RequestInfo<'_>) -> Result<Decision, PolicyError> {
        check(candidates)?;
        let c = &self.config;
        // SGLang Model Gateway's guard: a grossly imbalanced fleet goes to its least loaded worker.
        if let Some(tree) = &self.text
            && let Some(least) = imbalanced(candidates, &tree.config)
        {
            return Ok(Decision { worker: least, reason: Reason::Imbalanced });
        }
        let judged = self.judge(candidates, request);
        let mut hits: Vec<&Judged> = judged.iter().filter(|x| x.hit).collect();
        if hits.is_empty() {
            if let Some(worker) = self.warmup_miss(candidates) {
                return Ok(Decision { worker, reason: Reason::Warmup });
            }
            let worker = power_of_two(&mut self.rng.peek(), candidates);
            return Ok(Decision { worker, reason: Reason::NoCacheCandidate });
        }
        if let Some(worker) = self.warmup_divert(candidates) {
            return Ok(Decision { worker, reason: Reason::WarmupDivert });
        }
        // Most matched first; among equals the lighter load.
        let by_hit = |a: &&Judged, b: &&Judged| {
            let (a, b) = (&a.c, &b.c);
            b.matched_tokens
                .cmp(&a.matched_tokens)
                .then(a.load.uncached_tokens.cmp(&b.load.uncached_tokens))
                .then(a.load.in_flight.cmp(&b.load.in_flight))
                .then(a.worker.cmp(&b.worker))
        };
        let k = c.top_k(candidates.len()).min(hits.len());
        if k < hits.len() {
            hits.select_nth_unstable_by(k - 1, by_hit);
            hits.truncate(k);
        }
        hits.sort_unstable_by(by_hit);
        let best = hits[0];
        let reason = |j: &Judged, exact: Reason| if j.estimated { Reason::TextTreeHit } else { exact };
        if c.pressure_guard {
            let floor = best.c.matched_tokens.saturating_sub(c.switch_margin_tokens);
            let lightest = hits
                .iter()
                .filter(|x| x.c.matched_tokens >= floor)
                .min_by_key(|x| (x.c.load.uncached_tokens, x.c.load.in_flight))
                .copied()
                .unwrap_or(best);
            let (b, l) = (best.c.load.uncached_tokens, lightest.c.load.uncached_tokens);
            if b > l + c.pressure_abs_tokens && b as f64 > c.pressure_rel * l as f64 {
                return Ok(Decision {
                    worker: lightest.c.worker,
                    reason: reason(lightest, Reason::CacheHitLessLoaded),
                });
            }
        }
        Ok(Decision { worker: best.c.worker, reason: reason(best, Reason::CacheHit) })
    }

    fn commit(&self, decision: &Decision, candidates: &[Candidate], request: &RequestInfo<'_>) {
        // Only the fallback draws (its reason says select took it; no second look at the tree).
        if decision.reason == Reason::NoCacheCandidate {
            commit_power_of_two(&self.rng, candidates);
        }
        match decision.reason {
            Reason::NoCacheCandidate | Reason::Warmup => self.misses.fetch_add(1, Ordering::Relaxed),
            Reason::CacheHit | Reason::CacheHitLessLoaded | Reason::TextTreeHit | Reason::WarmupDivert => {
                self.hits.fetch_add(1, Ordering::Relaxed)
            }
            _ => 0,
        };
        // The tree learns what goes to the workers it stands in for.
        let text = request.text.unwrap_or("").as_bytes();
        if let Some(tree) = &self.text
            && !text.is_empty()
            && candidates.iter().any(|c| c.worker == decision.worker && !c.followed)
        {
            let now = tree.clock.fetch_add(1, Ordering::Relaxed);
            tree.lock().insert_bounded(text, decision.worker, now, tree.config.max_tree_bytes);
        }
    }

    fn remove_worker(&self, worker: WorkerId) {
        if let Some(tree) = &self.text {
            tree.lock().remove_worker(worker);
        }
    }

    fn held_bytes(&self) -> usize {
        self.tree_bytes()
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
    fn a_thin_worker_gets_one_hit_in_eight_and_a_warming_one_one_miss_in_four() {
        let p = CacheAware::new(CacheAwareConfig::default(), 1);
        let thin = Candidate { warmup: Warmup::Thin, ..cand(1, 0, 0) };
        // Worker 0 holds every prompt: without the slice the thin worker would never be chosen.
        let got: Vec<Reason> = (0..16).map(|_| pick(&p, &[cand(0, 6144, 0), thin]).reason).collect();
        let diverted = got.iter().filter(|r| **r == Reason::WarmupDivert).count();
        assert_eq!(diverted, 2, "{got:?}");
        assert_eq!((got[7], got[15]), (Reason::WarmupDivert, Reason::WarmupDivert));
        // One request at a time: a thin worker with one in flight gets no diversion.
        let busy = Candidate { warmup: Warmup::Thin, ..cand(1, 0, 1000) };
        assert!((0..16).all(|_| pick(&p, &[cand(0, 6144, 0), busy]).worker == WorkerId(0)));
        // Misses: every fourth to the least loaded young or thin worker.
        let p = CacheAware::new(CacheAwareConfig::default(), 1);
        let young = Candidate { warmup: Warmup::Young, ..cand(2, 0, 0) };
        let got: Vec<Decision> = (0..8).map(|_| pick(&p, &[cand(0, 0, 0), cand(1, 0, 0), young])).collect();
        let slice: Vec<usize> = (0..8).filter(|i| got[*i].reason == Reason::Warmup).collect();
        assert_eq!(slice, [3, 7]);
        assert!(slice.iter().all(|i| got[*i].worker == WorkerId(2)));
        // Off: no slice, no diversion.
        let off = CacheAwareConfig { warmup_share: 0.0, warmup_divert_every: 0, ..CacheAwareConfig::default() };
        let p = CacheAware::new(off, 1);
        assert!((0..16).all(|_| pick(&p, &[cand(0, 6144, 0), thin]).worker == WorkerId(0)));
        assert!((0..16).all(|_| pick(&p, &[cand(0, 0, 0), young]).reason == Reason::NoCacheCandidate));
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

    fn unfollowed(worker: u32, owed: u64) -> Candidate {
        Candidate { followed: false, ..cand(worker, 0, owed) }
    }

    fn send(p: &CacheAware, cs: &[Candidate], text: &str, tokens: u64) -> Decision {
        let req = RequestInfo { input_tokens: tokens, text: Some(text) };
        let d = p.select(cs, &req).unwrap();
        p.commit(&d, cs, &req);
        d
    }

    #[test]
    fn unfollowed_workers_are_judged_by_the_text_they_were_sent() {
        let p = CacheAware::new(CacheAwareConfig::default(), 3).with_text_tree(ApproxTreeConfig::default());
        assert!(p.needs_text());
        let cs = [unfollowed(0, 0), unfollowed(1, 0)];
        let first = send(&p, &cs, "the long shared system prompt, then question one", 4000);
        assert_eq!(first.reason, Reason::NoCacheCandidate, "nothing learned yet");
        // The same prefix goes where it went, whatever the order of the candidates.
        for cs in [[unfollowed(0, 0), unfollowed(1, 0)], [unfollowed(1, 0), unfollowed(0, 0)]] {
            let d = send(&p, &cs, "the long shared system prompt, then question two", 4000);
            assert_eq!(d, Decision { worker: first.worker, reason: Reason::TextTreeHit });
        }
        // A match under the threshold is no hit.
        let d =
            p.select(&cs, &RequestInfo { input_tokens: 4000, text: Some("th and something else entirely") }).unwrap();
        assert_eq!(d.reason, Reason::NoCacheCandidate);
        // Forgotten with the worker.
        p.remove_worker(first.worker);
        let d =
            p.select(&cs, &RequestInfo { input_tokens: 4000, text: Some("the long shared system prompt") }).unwrap();
        assert_eq!(d.reason, Reason::NoCacheCandidate);
    }

    #[test]
    fn exact_hits_and_estimates_are_ranked_together() {
        let p = CacheAware::new(CacheAwareConfig::default(), 3).with_text_tree(ApproxTreeConfig::default());
        let text = "a prompt of one hundred characters, give or take: shared by every request of this conversation";
        // Teach the tree that worker 1 (unfollowed) holds the whole text.
        let only_1 = [unfollowed(1, 0)];
        send(&p, &only_1, text, 8000);
        // Worker 0 (followed) holds 2,000 of 8,000 tokens; worker 1 is estimated at about all of them.
        let d = p.select(&[cand(0, 2000, 0), unfollowed(1, 0)], &RequestInfo { input_tokens: 8000, text: Some(text) });
        assert_eq!(d.unwrap(), Decision { worker: WorkerId(1), reason: Reason::TextTreeHit });
        // A followed worker holding more wins over the estimate.
        let longer = format!("{text} and more");
        let d =
            p.select(&[cand(0, 8000, 0), unfollowed(1, 0)], &RequestInfo { input_tokens: 8000, text: Some(&longer) });
        assert_eq!(d.unwrap(), Decision { worker: WorkerId(0), reason: Reason::CacheHit });
        // The tree does not learn what goes to followed workers.
        let other = "another conversation entirely, sent to the followed worker only";
        send(&p, &[cand(0, 0, 0)], other, 8000);
        let d = p.select(&[unfollowed(1, 0), unfollowed(2, 0)], &RequestInfo { input_tokens: 8000, text: Some(other) });
        assert_eq!(d.unwrap().reason, Reason::NoCacheCandidate);
        // Without a tree, unfollowed workers never hit.
        let plain = CacheAware::new(CacheAwareConfig::default(), 3);
        assert!(!plain.needs_text());
        let d = plain.select(&only_1, &RequestInfo { input_tokens: 8000, text: Some(text) }).unwrap();
        assert_eq!(d.reason, Reason::NoCacheCandidate);
    }

    #[test]
    fn a_grossly_imbalanced_fleet_goes_to_its_least_loaded_worker() {
        let p = CacheAware::new(CacheAwareConfig::default(), 3).with_text_tree(ApproxTreeConfig::default());
        let busy = Candidate { load: crate::Load { in_flight: 100, uncached_tokens: 0 }, ..cand(0, 8000, 0) };
        let idle = Candidate { load: crate::Load { in_flight: 10, uncached_tokens: 0 }, ..cand(1, 0, 0) };
        let d = p.select(&[busy, idle], &RequestInfo { input_tokens: 8000, text: Some("x") }).unwrap();
        assert_eq!(d, Decision { worker: WorkerId(1), reason: Reason::Imbalanced });
        // Within the bounds the hit wins.
        let near = Candidate { load: crate::Load { in_flight: 50, uncached_tokens: 0 }, ..cand(1, 0, 0) };
        let d = p.select(&[busy, near], &RequestInfo { input_tokens: 8000, text: Some("x") }).unwrap();
        assert_eq!(d.reason, Reason::CacheHit);
    }
}
