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
//! Shepherd Model Gateway's two tunings of the choice among hits, both off by
//! default: an overlap decay ranks the hits by matched tokens divided by
//! `1 + decay × x`, x the prefill a hit owes above the least owed among them
//! per prompt token, so a hot worker's long hit yields to an idle one's
//! shorter hit; a selection temperature draws the hit with the softmax of the
//! hits' scores, min-max normalized, instead of taking the best (one draw from
//! the same stream, taken on `commit`; reason `cache_hit_sampled`).
//!
//! With a text tree ([`CacheAware::with_text_tree`], SGLang Model Gateway's
//! `cache_aware` for engines that publish no events), a worker whose events
//! are not followed is judged by the tree of the text this router sent it:
//! it is a hit when its match covers more than the tree's `cache_threshold`
//! of the prompt, credited with that share of the prompt's tokens, and
//! ranked with the followed workers' exact hits. The tree learns (on
//! `commit`) only what goes to such workers. With a head map instead
//! ([`CacheAware::with_head_hashes`], SMG's `--cache-index hash`), such a
//! worker is a hit when it holds the placement of one of the request's heads
//! (`crate::head_hash`), credited with the deepest one's tokens.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use router_types::WorkerId;

use crate::approx_tree::{ApproxTree, ApproxTreeConfig};
use crate::head_hash::{Head, HeadHashConfig, HeadMap, heads};
use crate::simple::{Draws, SplitMix, check, commit_power_of_two, power_of_two};
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
    /// Shepherd Model Gateway's anti-hotspot decay: each hit's score, its matched tokens, is
    /// divided by `1 + overlap_decay × x`, x the prefill it owes above the least owed among
    /// the hits, per prompt token; the hits are ranked by that score (0: off, by matched tokens).
    pub overlap_decay: f64,
    /// Shepherd Model Gateway's selection temperature: the hit is drawn with the softmax of
    /// the hits' scores, min-max normalized, at this temperature, instead of taking the best
    /// (0: the best, no draw).
    pub selection_temperature: f64,
    /// Shepherd Model Gateway's KV-usage spread: when the hottest and the coldest engine's
    /// reported KV usage differ by more than this, cache affinity gives way to the shortest
    /// queue (1.0: off).
    pub balance_token_usage: f64,
    /// Shepherd Model Gateway's KV-usage ceiling: the hottest engine, when its reported KV
    /// usage is over this, is left out of the request's choice (1.0: off).
    pub overload_token_usage: f64,
}

/// The policy.
#[derive(Debug)]
pub struct CacheAware {
    config: CacheAwareConfig,
    rng: SplitMix,
    /// The text tree for workers whose events are not followed.
    text: Option<TextTree>,
    /// Or the head map (`--cache-index hash`).
    heads: Option<HeadLayer>,
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

/// The head map and its knobs.
#[derive(Debug)]
struct HeadLayer {
    config: HeadHashConfig,
    map: Mutex<HeadMap>,
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
            overlap_decay: 0.0,
            selection_temperature: 0.0,
            balance_token_usage: 1.0,
            overload_token_usage: 1.0,
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
        Self {
            config,
            rng: SplitMix::new(seed),
            text: None,
            heads: None,
            misses: AtomicU64::new(0),
            hits: AtomicU64::new(0),
        }
    }

    /// Judges the workers whose events are not followed by a tree of the
    /// text this router sent them (see the module's documentation).
    pub fn with_text_tree(mut self, config: ApproxTreeConfig) -> Self {
        self.text = Some(TextTree { config, tree: Mutex::new(ApproxTree::new()), clock: AtomicU64::new(0) });
        self.heads = None;
        self
    }

    /// Judges the workers whose events are not followed by the placements of the
    /// request's heads instead of a text tree (see the module's documentation).
    pub fn with_head_hashes(mut self, config: HeadHashConfig) -> Self {
        self.heads = Some(HeadLayer { config, map: Mutex::new(HeadMap::default()) });
        self.text = None;
        self
    }

    /// Bytes held by the tree or the head map, as its bound counts them.
    pub fn tree_bytes(&self) -> usize {
        let tree = self.text.as_ref().map_or(0, |t| t.lock().held());
        tree + self.heads.as_ref().map_or(0, |h| h.lock().bytes())
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

    /// A hit's score: its matched tokens, divided by `1 + overlap_decay × x` (x: the
    /// prefill it owes above the least owed among `hits`, per prompt token).
    fn scorer(&self, hits: &[&Judged], request: &RequestInfo<'_>) -> impl Fn(&&Judged) -> f64 + use<> {
        let decay = self.config.overlap_decay.max(0.0);
        let least = hits.iter().map(|j| j.c.load.uncached_tokens).min().unwrap_or(0);
        let per = request.input_tokens.max(1) as f64;
        move |j: &&Judged| {
            let x = j.c.load.uncached_tokens.saturating_sub(least) as f64 / per;
            j.c.matched_tokens as f64 / (1.0 + decay * x)
        }
    }

    /// Whether `c` holds enough of the prompt to be a cache candidate.
    fn is_hit(&self, c: &Candidate) -> bool {
        c.matched_tokens > 0 && c.matched_tokens >= self.config.min_matched_tokens
    }

    /// Every candidate with its verdict: followed ones by their exact match,
    /// unfollowed ones by the text tree or the head map (when there is one).
    fn judge(&self, candidates: &[Candidate], request: &RequestInfo<'_>) -> Vec<Judged> {
        let exact = |c: &Candidate| Judged { c: *c, hit: self.is_hit(c), estimated: false };
        if let Some(layer) = &self.heads {
            return layer.judge(candidates, request, exact);
        }
        let text = request.text.unwrap_or("").as_bytes();
        let Some(tree) = self.text.as_ref().filter(|_| !text.is_empty() && candidates.iter().any(|c| !c.followed))
        else {
            return candidates.iter().map(exact).collect();
        };
        let (matched, holders) = tree.lock().longest_match(text, tree.config.fresh_since(request.at_ms));
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

/// One of `hits` drawn with the softmax of their scores, min-max normalized
/// (the best 1, the worst 0), at `temperature`: one draw from `draws`.
fn softmax_draw<'a>(
    hits: &[&'a Judged],
    score: &impl Fn(&&Judged) -> f64,
    temperature: f64,
    draws: &mut Draws,
) -> &'a Judged {
    let scores: Vec<f64> = hits.iter().map(score).collect();
    let (lo, hi) = scores.iter().fold((f64::MAX, f64::MIN), |(lo, hi), s| (lo.min(*s), hi.max(*s)));
    let span = if hi > lo { hi - lo } else { 1.0 };
    // Relative to the best (exp of at most 0), so no weight overflows.
    let weights: Vec<f64> = scores.iter().map(|s| (((s - lo) / span - 1.0) / temperature).exp()).collect();
    let mut at = draws.unit() * weights.iter().sum::<f64>();
    for (hit, w) in hits.iter().zip(&weights) {
        if at < *w {
            return hit;
        }
        at -= w;
    }
    hits[hits.len() - 1]
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

    fn needs_tokens(&self) -> bool {
        self.heads.is_some()
    }

    fn heads(&self, tokens: &[u32]) -> Vec<Head> {
        self.heads.as_ref().map_or_else(Vec::new, |h| heads(tokens, &h.config.boundaries))
    }

    fn select(&self, candidates: &[Candidate], request: &RequestInfo<'_>) -> Result<Decision, PolicyError> {
        check(candidates)?;
        let c = &self.config;
        // The engines' KV usage first: a wide spread, then an engine over the ceiling.
        if let Some(worker) = kv_usage::spread(candidates, c.balance_token_usage) {
            return Ok(Decision { worker, reason: Reason::Imbalanced });
        }
        match kv_usage::saturated(candidates, c.overload_token_usage) {
            Some(hot) => self.select_among(&kv_usage::without(candidates, hot), request),
            None => self.select_among(candidates, request),
        }
    }

    fn commit(&self, decision: &Decision, candidates: &[Candidate], request: &RequestInfo<'_>) {
        // The choice was made among the candidates left by the ceiling, as in select.
        match kv_usage::saturated(candidates, self.config.overload_token_usage) {
            Some(hot) => self.commit_among(decision, &kv_usage::without(candidates, hot), request),
            None => self.commit_among(decision, candidates, request),
        }
    }

    fn remove_worker(&self, worker: WorkerId) {
        if let Some(tree) = &self.text {
            tree.lock().remove_worker(worker);
        }
        if let Some(layer) = &self.heads {
            layer.lock().remove_worker(worker);
        }
    }

    fn held_bytes(&self) -> usize {
        self.tree_bytes()
    }
}

impl CacheAware {
    /// The choice among `candidates` (those the KV-usage ceiling left).
    fn select_among(&self, candidates: &[Candidate], request: &RequestInfo<'_>) -> Result<Decision, PolicyError> {
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
        // Most matched first (or the best score, with a decay); among equals the lighter load.
        let by_hit = |a: &&Judged, b: &&Judged| {
            let (a, b) = (&a.c, &b.c);
            b.matched_tokens
                .cmp(&a.matched_tokens)
                .then(a.load.uncached_tokens.cmp(&b.load.uncached_tokens))
                .then(a.load.in_flight.cmp(&b.load.in_flight))
                .then(a.worker.cmp(&b.worker))
        };
        let score = self.scorer(&hits, request);
        let decayed = c.overlap_decay > 0.0;
        let rank = |a: &&Judged, b: &&Judged| {
            if decayed { score(b).total_cmp(&score(a)).then_with(|| by_hit(a, b)) } else { by_hit(a, b) }
        };
        let k = c.top_k(candidates.len()).min(hits.len());
        if k < hits.len() {
            hits.select_nth_unstable_by(k - 1, rank);
            hits.truncate(k);
        }
        hits.sort_unstable_by(rank);
        let best = hits[0];
        let estimated = if self.heads.is_some() { Reason::HeadHashHit } else { Reason::TextTreeHit };
        let reason = |j: &Judged, exact: Reason| if j.estimated { estimated } else { exact };
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
        if c.selection_temperature > 0.0 && hits.len() > 1 {
            let drawn = softmax_draw(&hits, &score, c.selection_temperature, &mut self.rng.peek());
            return Ok(Decision { worker: drawn.c.worker, reason: Reason::CacheHitSampled });
        }
        Ok(Decision { worker: best.c.worker, reason: reason(best, Reason::CacheHit) })
    }

    /// What a decision among `candidates` leaves behind: the draws taken, the hit and miss
    /// counts, the text tree.
    fn commit_among(&self, decision: &Decision, candidates: &[Candidate], request: &RequestInfo<'_>) {
        // Only the fallback and a sampled hit draw (their reasons say select did; no second look at the tree).
        match decision.reason {
            Reason::NoCacheCandidate => commit_power_of_two(&self.rng, candidates),
            Reason::CacheHitSampled => self.rng.advance(1),
            _ => {}
        }
        match decision.reason {
            Reason::NoCacheCandidate | Reason::Warmup => self.misses.fetch_add(1, Ordering::Relaxed),
            Reason::CacheHit
            | Reason::CacheHitLessLoaded
            | Reason::CacheHitSampled
            | Reason::TextTreeHit
            | Reason::HeadHashHit
            | Reason::WarmupDivert => self.hits.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
        // The tree learns what goes to the workers it stands in for.
        let text = request.text.unwrap_or("").as_bytes();
        if let Some(tree) = &self.text
            && !text.is_empty()
            && candidates.iter().any(|c| c.worker == decision.worker && !c.followed)
        {
            let stamp = ApproxTreeConfig::stamp(request.at_ms, tree.clock.fetch_add(1, Ordering::Relaxed));
            tree.lock().learn(text, decision.worker, stamp, &tree.config);
        }
        // The head map places what goes to them, as the tree learns it.
        if let Some(layer) = &self.heads
            && !request.heads.is_empty()
            && candidates.iter().any(|c| c.worker == decision.worker && !c.followed)
        {
            layer.lock().place(request.heads, decision.worker, &layer.config, request.at_ms);
        }
    }
}

impl HeadLayer {
    fn lock(&self) -> std::sync::MutexGuard<'_, HeadMap> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The candidates judged: followed ones by `exact`, the others a hit when they hold the
    /// request's deepest head that any of them holds (each holder credited with its boundary,
    /// so the ranking takes the least loaded of them).
    fn judge(
        &self,
        candidates: &[Candidate],
        request: &RequestInfo<'_>,
        exact: impl Fn(&Candidate) -> Judged,
    ) -> Vec<Judged> {
        let unfollowed = |w| candidates.iter().any(|c| c.worker == w && !c.followed);
        let held = match request.heads {
            [] => None,
            heads => self.lock().deepest(heads, &self.config, request.at_ms, unfollowed),
        };
        candidates
            .iter()
            .map(|c| {
                if c.followed {
                    return exact(c);
                }
                let matched_tokens = match &held {
                    Some((tokens, holders)) if holders.contains(&c.worker) => {
                        u64::from(*tokens).min(request.input_tokens).max(1)
                    }
                    _ => 0,
                };
                Judged { c: Candidate { matched_tokens, ..*c }, hit: matched_tokens > 0, estimated: true }
            })
            .collect()
    }
}

mod kv_usage;

#[cfg(test)]
mod tests;
