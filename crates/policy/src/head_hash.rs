//! The head-hash placement map, cache_aware's under-layer for workers whose
//! KV events are not followed when started with `--cache-index hash`
//! (Shepherd Model Gateway 1.13's "TTL'd exact-match placement map keyed on
//! request heads at `--cache-boundaries`"): a request's head is its first
//! `b` tokens for each boundary `b` it reaches; the map holds, per head, the
//! workers last sent a request with that head (at most [`HOLDERS`], the
//! stalest replaced, as SMG keeps three) and when. A request is matched at the
//! deepest of its heads the map holds for a candidate: each of that head's
//! holders is credited with its boundary (cache_aware then takes the least
//! loaded of them, as SMG does), and on `commit` every head of it is placed on
//! (or refreshed for) the chosen worker. A request without tokens has no head
//! and is load-balanced.
//!
//! Heads are hashed ([`heads`]) once per request by the planner, 64 bits each
//! (a collision costs a request its affinity, never a wrong answer); the map
//! holds at most `max_bytes / ENTRY_BYTES` of them: past the TTL a placement is
//! not matched, and an insert past the bound first drops what aged out, then
//! the least recently placed quarter.

use std::collections::HashMap;

use router_types::WorkerId;

/// One head of a request: its first `tokens` tokens, hashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Head {
    /// The boundary: how many of the prompt's tokens the head is.
    pub tokens: u32,
    /// Their hash.
    pub hash: u64,
}

/// The knobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadHashConfig {
    /// The boundaries, ascending and distinct (`--cache-boundaries`; by default every power
    /// of two times the page size, up to 2^20 tokens).
    pub boundaries: Vec<u32>,
    /// Milliseconds a placement stays routable after its worker was last sent it
    /// (`--cache-ttl-secs`); 0: until the bound drops it.
    pub ttl_ms: u64,
    /// The bound on the map, in bytes ([`ENTRY_BYTES`] each); `--approx-max-tree-bytes`.
    pub max_bytes: usize,
}

/// What one head costs as the bound counts it: its key, its holders and their stamps, and the
/// hash table's slack.
pub const ENTRY_BYTES: usize = 72;

/// Workers a head is kept for (SMG's three holders per key).
pub(crate) const HOLDERS: usize = 3;

/// A head's holders: (worker, the milliseconds it was last placed at).
type Holders = [Option<(WorkerId, u64)>; HOLDERS];

/// The placements.
#[derive(Debug, Default)]
pub struct HeadMap {
    /// Head hash → its holders.
    placed: HashMap<u64, Holders>,
}

// === impl HeadHashConfig ===

impl HeadHashConfig {
    /// The default boundaries for pages of `page` tokens: `page × 2^k` up to 2^20 tokens.
    pub fn powers_of_two(page: u32) -> Vec<u32> {
        let page = page.max(1);
        std::iter::successors(Some(page), |b| b.checked_mul(2)).take_while(|b| *b <= 1 << 20).collect()
    }

    /// The most heads the bound allows (at least one).
    fn max_entries(&self) -> usize {
        (self.max_bytes / ENTRY_BYTES).max(1)
    }
}

/// The heads of `tokens` at `boundaries` (ascending), shallowest first: one pass over the
/// tokens up to the deepest boundary they reach, in four lanes of two tokens a step (a 16,384
/// token prompt in about 3 µs, not one long chain of multiplies), the lanes folded at each
/// boundary. A head's hash depends on its tokens and on the boundaries before it, which are
/// the same for every request of one configuration.
pub fn heads(tokens: &[u32], boundaries: &[u32]) -> Vec<Head> {
    let mut out = Vec::new();
    let mut lanes: [u64; 4] =
        [0x243F_6A88_85A3_08D3, 0x1319_8A2E_0370_7344, 0xA409_3822_299F_31D0, 0x082E_FA98_EC4E_6C89];
    let mut at = 0usize;
    for &b in boundaries {
        let end = b as usize;
        if end == 0 || end > tokens.len() {
            break;
        }
        let run = &tokens[at..end];
        let mut steps = run.chunks_exact(8);
        for step in &mut steps {
            for (lane, pair) in lanes.iter_mut().zip(step.chunks_exact(2)) {
                *lane = mix(*lane, u64::from(pair[0]) | u64::from(pair[1]) << 32);
            }
        }
        for &t in steps.remainder() {
            lanes[0] = mix(lanes[0], u64::from(t));
        }
        at = end;
        let folded = lanes.iter().fold(u64::from(b), |acc, lane| mix(acc, *lane));
        out.push(Head { tokens: b, hash: finish(folded) });
    }
    out
}

/// One step of a lane.
#[inline(always)]
fn mix(h: u64, x: u64) -> u64 {
    (h.rotate_left(23) ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// SplitMix64's finalizer.
fn finish(h: u64) -> u64 {
    let mut z = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

// === impl HeadMap ===

impl HeadMap {
    /// The deepest of `heads` with a holder placed within the TTL at `at_ms` that `eligible`
    /// accepts: its boundary and every such holder of it (by id).
    pub fn deepest(
        &self,
        heads: &[Head],
        config: &HeadHashConfig,
        at_ms: u64,
        eligible: impl Fn(WorkerId) -> bool,
    ) -> Option<(u32, Vec<WorkerId>)> {
        let fresh = |stamp: u64| config.ttl_ms == 0 || stamp.saturating_add(config.ttl_ms) >= at_ms;
        heads.iter().rev().find_map(|h| {
            let holders = self.placed.get(&h.hash)?;
            let mut live: Vec<WorkerId> =
                holders.iter().flatten().filter(|(w, stamp)| fresh(*stamp) && eligible(*w)).map(|(w, _)| *w).collect();
            live.sort_unstable();
            (!live.is_empty()).then_some((h.tokens, live))
        })
    }

    /// Places every one of `heads` on `worker` at `at_ms` (refreshed if it holds one already,
    /// else in a free place or the stalest's), within the bound.
    pub fn place(&mut self, heads: &[Head], worker: WorkerId, config: &HeadHashConfig, at_ms: u64) {
        for h in heads {
            let holders = self.placed.entry(h.hash).or_default();
            let at = holders.iter().position(|x| x.is_some_and(|(w, _)| w == worker));
            let at = at.or_else(|| holders.iter().position(Option::is_none));
            let at = at.unwrap_or_else(|| (0..HOLDERS).min_by_key(|&i| holders[i].map_or(0, |(_, s)| s)).unwrap_or(0));
            holders[at] = Some((worker, at_ms));
        }
        let max = config.max_entries();
        if self.placed.len() > max {
            self.shrink(config, at_ms, max);
        }
    }

    /// Drops what aged out, then, while still over `max`, the least recently placed quarter of
    /// the heads (by their latest placement).
    fn shrink(&mut self, config: &HeadHashConfig, at_ms: u64, max: usize) {
        if config.ttl_ms > 0 {
            let oldest = at_ms.saturating_sub(config.ttl_ms);
            self.placed.retain(|_, holders| {
                holders.iter_mut().for_each(|x| *x = x.filter(|(_, stamp)| *stamp >= oldest));
                holders.iter().any(Option::is_some)
            });
        }
        if self.placed.len() > max {
            let latest = |holders: &Holders| holders.iter().flatten().map(|(_, s)| *s).max().unwrap_or(0);
            let keep = max - max / 4;
            let mut stamps: Vec<u64> = self.placed.values().map(latest).collect();
            let cut = stamps.len() - keep;
            let (_, nth, _) = stamps.select_nth_unstable(cut);
            let cut_at = *nth;
            self.placed.retain(|_, holders| latest(holders) > cut_at);
        }
    }

    /// Forgets `worker`'s placements.
    pub fn remove_worker(&mut self, worker: WorkerId) {
        self.placed.retain(|_, holders| {
            holders.iter_mut().for_each(|x| *x = x.filter(|(w, _)| *w != worker));
            holders.iter().any(Option::is_some)
        });
    }

    /// Bytes held, as the bound counts them.
    pub fn bytes(&self) -> usize {
        self.placed.len() * ENTRY_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(boundaries: &[u32], ttl_ms: u64, entries: usize) -> HeadHashConfig {
        HeadHashConfig { boundaries: boundaries.to_vec(), ttl_ms, max_bytes: entries * ENTRY_BYTES }
    }

    #[test]
    fn a_request_has_a_head_at_each_boundary_it_reaches_and_heads_depend_on_their_tokens_only() {
        let tokens: Vec<u32> = (0..100).collect();
        let hs = heads(&tokens, &[16, 32, 64, 128]);
        assert_eq!(hs.iter().map(|h| h.tokens).collect::<Vec<_>>(), vec![16, 32, 64]);
        // A longer prompt with the same first 64 tokens has the same three heads, and one more.
        let mut longer = tokens.clone();
        longer.extend(1000..1100);
        assert_eq!(heads(&longer, &[16, 32, 64, 128])[..3], hs[..]);
        // One token changed at 40: the heads it is in change, the one before it does not.
        let mut changed = tokens.clone();
        changed[40] = 7;
        let other = heads(&changed, &[16, 32, 64, 128]);
        assert_eq!(other[..2], hs[..2]);
        assert_ne!(other[2], hs[2]);
        // Boundaries off the lanes' eight-token step: the same, every token counted.
        let odd = [5, 13, 21];
        assert_eq!(heads(&longer, &odd), heads(&tokens, &odd));
        let mut at_12 = tokens.clone();
        at_12[12] = 7;
        let (a, b) = (heads(&tokens, &odd), heads(&at_12, &odd));
        assert_eq!(a[0], b[0]);
        assert!(a[1] != b[1] && a[2] != b[2]);
        let mut at_4 = tokens.clone();
        at_4[4] = 7;
        assert_ne!(heads(&at_4, &odd)[0], a[0]);
        assert!(heads(&tokens[..15], &[16, 32]).is_empty(), "shorter than every boundary: no head");
        assert!(heads(&[], &[16]).is_empty());
    }

    #[test]
    fn the_deepest_fresh_head_on_an_eligible_worker_matches() {
        let c = config(&[4, 8, 16], 1_000, 100);
        let tokens: Vec<u32> = (0..20).collect();
        let hs = heads(&tokens, &c.boundaries);
        let mut map = HeadMap::default();
        map.place(&hs[..2], WorkerId(1), &c, 0);
        map.place(&hs[2..], WorkerId(2), &c, 500);
        let one = |w: u32, tokens: u32| Some((tokens, vec![WorkerId(w)]));
        assert_eq!(map.deepest(&hs, &c, 900, |_| true), one(2, 16));
        // Worker 2 not a candidate: the deeper of worker 1's heads.
        assert_eq!(map.deepest(&hs, &c, 900, |w| w != WorkerId(2)), one(1, 8));
        // Worker 1's placements past the TTL (placed at 0, 1 s): only worker 2's.
        assert_eq!(map.deepest(&hs, &c, 1_200, |w| w != WorkerId(2)), None);
        assert_eq!(map.deepest(&hs, &c, 1_200, |_| true), one(2, 16));
        // A TTL of 0: forever.
        let forever = HeadHashConfig { ttl_ms: 0, ..c.clone() };
        assert_eq!(map.deepest(&hs, &forever, u64::MAX, |w| w == WorkerId(1)), one(1, 8));
        map.remove_worker(WorkerId(2));
        assert_eq!(map.deepest(&hs, &c, 900, |_| true), one(1, 8));
    }

    #[test]
    fn a_head_keeps_three_holders_the_stalest_replaced() {
        let c = config(&[4], 0, 100);
        let hs = heads(&[1, 2, 3, 4], &c.boundaries);
        let mut map = HeadMap::default();
        for (w, at) in [(1, 10), (2, 20), (3, 30)] {
            map.place(&hs, WorkerId(w), &c, at);
        }
        let all = |map: &HeadMap| map.deepest(&hs, &c, 100, |_| true).map(|(_, h)| h);
        assert_eq!(all(&map), Some(vec![WorkerId(1), WorkerId(2), WorkerId(3)]));
        // Worker 1 refreshed, then a fourth: the stalest (2) goes.
        map.place(&hs, WorkerId(1), &c, 40);
        map.place(&hs, WorkerId(4), &c, 50);
        assert_eq!(all(&map), Some(vec![WorkerId(1), WorkerId(3), WorkerId(4)]));
        assert_eq!(map.bytes(), ENTRY_BYTES, "one head");
        map.remove_worker(WorkerId(3));
        assert_eq!(all(&map), Some(vec![WorkerId(1), WorkerId(4)]));
    }

    #[test]
    fn the_map_stays_within_its_bound_dropping_the_least_recently_placed() {
        let c = config(&[1], 0, 100);
        let mut map = HeadMap::default();
        for i in 0..1_000u32 {
            map.place(&heads(&[i], &c.boundaries), WorkerId(i % 4), &c, u64::from(i));
            assert!(map.bytes() <= 100 * ENTRY_BYTES, "{} bytes after {i}", map.bytes());
        }
        // The latest placements are kept, the first ones are gone.
        assert!(map.deepest(&heads(&[999], &c.boundaries), &c, 1_000, |_| true).is_some());
        assert!(map.deepest(&heads(&[0], &c.boundaries), &c, 1_000, |_| true).is_none());
        // With a TTL, what aged out goes first.
        let aging = config(&[1], 10, 100);
        let mut map = HeadMap::default();
        for i in 0..101u32 {
            map.place(&heads(&[i], &aging.boundaries), WorkerId(0), &aging, if i < 50 { 0 } else { 100 });
        }
        assert_eq!(map.bytes(), 51 * ENTRY_BYTES, "the 50 aged out went, the fresh stayed");
    }

    #[test]
    fn the_default_boundaries_are_powers_of_two_of_the_page() {
        let b = HeadHashConfig::powers_of_two(16);
        assert_eq!(&b[..4], &[16, 32, 64, 128]);
        assert_eq!(*b.last().unwrap(), 1 << 20);
        assert_eq!(HeadHashConfig::powers_of_two(0)[0], 1);
    }
}
