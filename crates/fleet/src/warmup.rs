//! Each worker's warm-up phase (Shepherd Model Gateway 1.13's
//! `--worker-warmup-*`): cache-aware routing sends every hit to the worker
//! holding the prefix, so a worker new in rotation, or one whose cache was
//! emptied (a restart, a flush, a resync), would get only what no one holds.
//! Here the fleet decides, from the KV index, which workers are warming:
//! - **young**: in rotation (again) for less than `secs`, and its index not
//!   yet grown by `blocks` since;
//! - **thin**: its index holds less than `thin_ratio` of the median of the
//!   workers in rotation (or nothing while they hold something), until it
//!   has grown by `blocks` since it became thin.
//!
//! The policy (`cache_aware`) gives warming workers a share of the misses
//! and diverts a share of the hits to thin ones. Judged every
//! [`TICK`] for the workers whose events are followed (the others are warm:
//! nothing is known of their cache).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use router_types::Warmup;

use crate::{Fleet, Worker};

/// How often the phases are judged.
pub const TICK: Duration = Duration::from_millis(250);

/// When a worker is warming.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmupRule {
    /// `--worker-warmup-secs` (0: no young phase).
    pub secs: Duration,
    /// `--worker-warmup-blocks`: grown by this many, it is warm.
    pub blocks: usize,
    /// `--worker-warmup-thin-ratio` (0: no thin phase).
    pub thin_ratio: f64,
}

impl Default for WarmupRule {
    /// Shepherd Model Gateway 1.13's defaults.
    fn default() -> Self {
        Self { secs: Duration::from_secs(60), blocks: 1024, thin_ratio: 0.5 }
    }
}

/// One worker's phase and what it is measured from.
#[derive(Debug, Default)]
pub(crate) struct WarmState {
    /// It was in rotation at the last judgement.
    routable: bool,
    /// When its phase began, and its blocks then.
    since: Option<Instant>,
    base: usize,
}

const WARM: u8 = 0;
const YOUNG: u8 = 1;
const THIN: u8 = 2;

/// Decodes a stored phase.
pub(crate) fn phase(code: u8) -> Warmup {
    match code {
        YOUNG => Warmup::Young,
        THIN => Warmup::Thin,
        _ => Warmup::Warm,
    }
}

fn code(phase: Warmup) -> u8 {
    match phase {
        Warmup::Warm => WARM,
        Warmup::Young => YOUNG,
        Warmup::Thin => THIN,
    }
}

/// The next phase of a worker now `routable` and holding `blocks` (the
/// routable workers' median: `median`), from `now` and its state.
fn judge(
    rule: &WarmupRule,
    st: &mut WarmState,
    now: Warmup,
    (routable, blocks, median): (bool, usize, usize),
    at: Instant,
) -> Warmup {
    if !routable {
        *st = WarmState::default();
        return Warmup::Warm;
    }
    let mut next = now;
    if !st.routable {
        st.routable = true;
        next = Warmup::Warm;
        if !rule.secs.is_zero() {
            (next, st.since, st.base) = (Warmup::Young, Some(at), blocks);
        }
    }
    let grown = blocks >= st.base.saturating_add(rule.blocks);
    next = match next {
        Warmup::Young if grown || st.since.is_none_or(|t| at.duration_since(t) >= rule.secs) => Warmup::Warm,
        Warmup::Thin if grown => Warmup::Warm,
        other => other,
    };
    let thin = rule.thin_ratio > 0.0 && median > 0 && (blocks as f64) < rule.thin_ratio * median as f64;
    if thin && next != Warmup::Thin {
        (next, st.since, st.base) = (Warmup::Thin, Some(at), blocks);
    }
    next
}

impl Worker {
    /// Where it is in its warm-up (the fleet judges it every [`TICK`]).
    pub fn warmup(&self) -> Warmup {
        phase(self.warmup_phase.load(Ordering::Relaxed))
    }
}

/// Judges every worker's phase each [`TICK`] until the fleet stops.
pub(crate) async fn warmup_loop(fleet: Arc<Fleet>, rule: WarmupRule) {
    let Some(ev) = fleet.events.as_ref() else { return };
    let index = ev.index.clone();
    let mut ticks = crate::ticks::Ticks::new(TICK, fleet.cancel.clone());
    while ticks.next().await {
        let all = fleet.snapshot();
        let held = index.worker_blocks();
        let blocks_of = |w: &Worker| w.index_id.and_then(|id| held.get(&id).copied()).unwrap_or(0);
        let judged = |w: &Worker| w.is_routable() && w.is_followed();
        let mut sizes: Vec<usize> = all.iter().filter(|w| judged(w)).map(|w| blocks_of(w)).collect();
        sizes.sort_unstable();
        let median = match sizes.len() {
            0 => 0,
            n if n % 2 == 1 => sizes[n / 2],
            n => (sizes[n / 2 - 1] + sizes[n / 2]) / 2,
        };
        let at = Instant::now();
        for w in all.iter() {
            let mut st = w.warm_state.lock().unwrap_or_else(|p| p.into_inner());
            let next = judge(&rule, &mut st, w.warmup(), (judged(w), blocks_of(w), median), at);
            w.warmup_phase.store(code(next), Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_is_young_until_it_grows_or_its_time_is_up_and_thin_while_far_under_the_median() {
        let rule = WarmupRule { secs: Duration::from_secs(60), blocks: 100, thin_ratio: 0.5 };
        let (mut st, t0) = (WarmState::default(), Instant::now());
        let mut at = |phase, routable, blocks, median, secs| {
            judge(&rule, &mut st, phase, (routable, blocks, median), t0 + Duration::from_secs(secs))
        };
        assert_eq!(at(Warmup::Warm, true, 10, 10, 0), Warmup::Young, "new in rotation");
        assert_eq!(at(Warmup::Young, true, 50, 60, 10), Warmup::Young);
        assert_eq!(at(Warmup::Young, true, 110, 110, 20), Warmup::Warm, "grown by its blocks");
        assert_eq!(at(Warmup::Warm, true, 110, 110, 30), Warmup::Warm);
        assert_eq!(at(Warmup::Warm, true, 0, 400, 40), Warmup::Thin, "emptied: far under the median");
        assert_eq!(at(Warmup::Thin, true, 90, 400, 500), Warmup::Thin, "no time limit when thin");
        assert_eq!(at(Warmup::Thin, true, 100, 400, 510), Warmup::Thin, "grown, but still thin: again");
        assert_eq!(at(Warmup::Thin, true, 300, 400, 520), Warmup::Warm);
        assert_eq!(at(Warmup::Warm, false, 300, 400, 530), Warmup::Warm, "out of rotation");
        assert_eq!(at(Warmup::Warm, true, 300, 400, 540), Warmup::Young, "back in rotation");
        assert_eq!(at(Warmup::Young, true, 300, 400, 601), Warmup::Warm, "its time is up");
    }

    #[test]
    fn off_rules_leave_every_worker_warm() {
        let rule = WarmupRule { secs: Duration::ZERO, blocks: 100, thin_ratio: 0.0 };
        let mut st = WarmState::default();
        assert_eq!(judge(&rule, &mut st, Warmup::Warm, (true, 0, 1000), Instant::now()), Warmup::Warm);
    }
}
