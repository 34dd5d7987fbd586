//! Liveness that health probes miss (SGLang/Shepherd Model Gateway's
//! `--worker-stall-secs`, `--worker-wedge-secs`, `--worker-stale-secs` and
//! worker overload protection): what each worker was last heard from and last
//! made progress, what it last reported queued and of its KV cache used, and
//! the veto a routing decision reads from them. A vetoed worker stays in the
//! fleet's rotation (its probe still answers); it is only left out of new
//! routing decisions while the veto holds, and the veto clears by itself
//! when the worker is heard from or makes progress again.
//!
//! The vetoes, in the order a worker is judged:
//! - **stalled**: no contact (a probe, a load poll, an answer's bytes) for
//!   `stall`, then a transport failure (a refused or timed-out probe, poll or
//!   request). Cleared by the next contact.
//! - **stale**: a worker that answered a load poll once, then no contact for
//!   `stale` (0: off). Workers never polled are not judged by it.
//! - **wedged**: requests in flight, no progress (an answer's bytes or a
//!   completion) for `wedge` stretched by the prefill it still owes (at
//!   [`PREFILL_TOKENS_PER_SEC`], up to [`MAX_WEDGE`]), while its pile of
//!   requests grew since its last progress, is [`WEDGE_PILE`] deep, or its
//!   reported queue grew. Cleared by progress.
//! - **overloaded**: it reported at least `overload_waiting` queued requests
//!   (over its data-parallel ranks) or a mean KV-cache usage of at least
//!   `overload_token_usage` (SGLang's `/v1/loads`).
//!
//! Stalled and stale workers are left out of every decision. Wedged and
//! overloaded ones only while another candidate is clear of vetoes; when none
//! is, the least loaded of them takes the request, or the request is shed
//! (`shed`, a 503 with `Retry-After`) when one of them is overloaded.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::Worker;

/// Prefill rate a wedge bound is stretched at: a worker owing this many
/// uncached prompt tokens may stay silent a second longer before it counts
/// as wedged.
pub const PREFILL_TOKENS_PER_SEC: u64 = 8_192;
/// The longest a wedge bound is stretched to.
pub const MAX_WEDGE: Duration = Duration::from_secs(120);
/// Requests in flight at which a silent worker's pile counts as grown.
pub const WEDGE_PILE: u32 = 4;

/// The vetoes' thresholds (`Duration::ZERO` or `None`: that veto is off).
#[derive(Debug, Clone, PartialEq)]
pub struct LivenessConfig {
    /// `--worker-stall-secs`.
    pub stall: Duration,
    /// `--worker-wedge-secs`.
    pub wedge: Duration,
    /// `--worker-stale-secs`.
    pub stale: Duration,
    /// Worker overload protection (`--worker-overload-waiting-requests`,
    /// `--worker-overload-token-usage`); `None`: off.
    pub overload: Option<Overload>,
    /// `--worker-overload-shed`: refuse a request every candidate of which is overloaded.
    pub shed: bool,
    /// The warm-up slice's phases (`None`: every worker warm).
    pub warmup: Option<crate::warmup::WarmupRule>,
}

/// When a worker counts as overloaded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Overload {
    /// Queued requests it reports (over its ranks) at or above which it is.
    pub waiting_requests: u32,
    /// Mean KV-cache token usage it reports at or above which it is.
    pub token_usage: f64,
}

impl Default for LivenessConfig {
    /// Shepherd Model Gateway 1.13's defaults.
    fn default() -> Self {
        Self {
            stall: Duration::from_secs(2),
            wedge: Duration::from_secs(3),
            stale: Duration::from_secs(15),
            overload: Some(Overload { waiting_requests: 8, token_usage: 0.8 }),
            shed: false,
            warmup: Some(crate::warmup::WarmupRule::default()),
        }
    }
}

impl LivenessConfig {
    /// Every veto off.
    pub fn off() -> Self {
        Self {
            stall: Duration::ZERO,
            wedge: Duration::ZERO,
            stale: Duration::ZERO,
            overload: None,
            shed: false,
            warmup: None,
        }
    }
}

/// Why a worker is left out of routing decisions now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Veto {
    /// Silent, then a transport failure.
    Stalled,
    /// Polled once, silent since.
    Stale,
    /// Requests in flight and no progress while they pile up.
    Wedged,
    /// Its queue or KV cache over the thresholds.
    Overloaded,
}

impl Veto {
    /// Every veto, in the order a worker is judged.
    pub const ALL: [Veto; 4] = [Veto::Stalled, Veto::Stale, Veto::Wedged, Veto::Overloaded];

    /// Its name in `/workers` and `/metrics`.
    pub fn as_str(self) -> &'static str {
        match self {
            Veto::Stalled => "stalled",
            Veto::Stale => "stale",
            Veto::Wedged => "wedged",
            Veto::Overloaded => "overloaded",
        }
    }

    /// Left out of every decision, or only while another candidate is clear.
    pub fn is_hard(self) -> bool {
        matches!(self, Veto::Stalled | Veto::Stale)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Milliseconds since the process's first reading (never 0: 0 is "never").
pub(crate) fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(|| Instant::now() - Duration::from_millis(1));
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// What one worker was last heard from, its progress and its reported load.
#[derive(Debug, Default)]
pub struct Liveness {
    /// Last contact (ms, 0: never).
    contact: AtomicU64,
    /// Last progress: an answer's bytes, a completion, or the first request after idling.
    progress: AtomicU64,
    /// Requests in flight, and its reported queue, at its last progress.
    pile_at_progress: AtomicU32,
    waiting_at_progress: AtomicU32,
    /// A transport failure after `stall` of silence; cleared by contact.
    stalled: AtomicBool,
    /// It answered a load poll once (judged by `stale` from then on).
    polled: AtomicBool,
    /// Its last load report stands (none lost since).
    reporting: AtomicBool,
    /// What it last reported: queued requests over its ranks, mean KV usage (f64 bits).
    waiting: AtomicU32,
    token_usage: AtomicU64,
    /// Routing decisions that left it out, per veto.
    pub(crate) vetoed: [AtomicU64; 4],
    /// Its last report per data-parallel rank (at most [`crate::MAX_DP_SIZE`]).
    ranks: std::sync::Mutex<Vec<RankReport>>,
}

/// One rank's load as the engine last reported it (SGLang's `/v1/loads`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankReport {
    /// The data-parallel rank.
    pub dp_rank: u32,
    /// Requests running (prefilling or decoding).
    pub running: u64,
    /// Requests queued.
    pub waiting: u64,
    /// Prompt tokens of the queued requests not in its cache.
    pub uncached: u64,
    /// KV-cache token usage, 0 to 1.
    pub token_usage: f64,
    /// Tokens a second it generates (`gen_throughput`; 0 when not reported).
    pub gen_throughput: f64,
}

impl RankReport {
    /// Each rank of a SGLang `/v1/loads` answer (`{"loads": [{"dp_rank": 0, ...}, ...]}`), the
    /// first [`crate::MAX_DP_SIZE`]; a field it lacks is 0.
    pub fn parse(answer: &serde_json::Value) -> Vec<RankReport> {
        let loads = answer.get("loads").and_then(serde_json::Value::as_array).map_or(&[][..], Vec::as_slice);
        let ranks = loads.iter().take(crate::MAX_DP_SIZE as usize);
        ranks
            .map(|l| {
                let n = |k: &str| l.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
                let usage = l.get("token_usage").and_then(serde_json::Value::as_f64).filter(|u| u.is_finite());
                let throughput = l.get("gen_throughput").and_then(serde_json::Value::as_f64).filter(|t| t.is_finite());
                RankReport {
                    dp_rank: u32::try_from(n("dp_rank")).unwrap_or(u32::MAX),
                    running: n("num_running_reqs"),
                    waiting: n("num_waiting_reqs"),
                    uncached: n("num_waiting_uncached_tokens"),
                    token_usage: usage.unwrap_or(0.0).clamp(0.0, 1.0),
                    gen_throughput: throughput.unwrap_or(0.0).max(0.0),
                }
            })
            .collect()
    }
}

impl Liveness {
    /// It was heard from (a probe, a poll or an answer): a stall ends.
    pub fn contact(&self) {
        self.contact.store(now_ms(), Ordering::Relaxed);
        if self.stalled.load(Ordering::Relaxed) {
            self.stalled.store(false, Ordering::Relaxed);
        }
    }

    /// A probe, poll or request to it failed in transport: after `stall` of
    /// silence it is stalled until heard from.
    pub fn transport_failed(&self, stall: Duration) {
        if stall.is_zero() {
            return;
        }
        let silent = now_ms().saturating_sub(self.heard());
        if u128::from(silent) >= stall.as_millis() {
            self.stalled.store(true, Ordering::Relaxed);
        }
    }

    /// It made progress (an answer's bytes, a completion) with `in_flight` requests on it
    /// (progress is contact too: [`Liveness::heard`] reads both).
    pub(crate) fn progressed(&self, in_flight: u32) {
        self.progress.store(now_ms(), Ordering::Relaxed);
        self.pile_at_progress.store(in_flight, Ordering::Relaxed);
        self.waiting_at_progress.store(self.waiting.load(Ordering::Relaxed), Ordering::Relaxed);
        if self.stalled.load(Ordering::Relaxed) {
            self.stalled.store(false, Ordering::Relaxed);
        }
    }

    /// A request went to it while it had none in flight: its silence starts now.
    pub(crate) fn busy_from_idle(&self) {
        self.progressed(0);
    }

    /// Its load report: `waiting` requests queued over its ranks, `token_usage` mean KV usage.
    pub fn reported(&self, waiting: u32, token_usage: f64) {
        self.polled.store(true, Ordering::Relaxed);
        self.reporting.store(true, Ordering::Relaxed);
        self.waiting.store(waiting, Ordering::Relaxed);
        self.token_usage.store(token_usage.to_bits(), Ordering::Relaxed);
        self.contact();
    }

    /// Its report per rank.
    pub fn rank_reports(&self) -> Vec<RankReport> {
        self.ranks.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Records its report per rank (the first [`crate::MAX_DP_SIZE`]): its queued requests over
    /// them and their mean KV usage ([`Liveness::reported`]); none: the report is lost.
    pub fn set_rank_reports(&self, mut reports: Vec<RankReport>) {
        reports.truncate(crate::MAX_DP_SIZE as usize);
        if reports.is_empty() {
            self.report_lost();
            return;
        }
        let waiting = reports.iter().map(|r| r.waiting).fold(0u64, u64::saturating_add);
        let usage = reports.iter().map(|r| r.token_usage).sum::<f64>() / reports.len() as f64;
        self.reported(u32::try_from(waiting).unwrap_or(u32::MAX), usage);
        *self.ranks.lock().unwrap_or_else(|p| p.into_inner()) = reports;
    }

    /// When it was last heard from: a contact or progress (ms, 0: never).
    fn heard(&self) -> u64 {
        self.contact.load(Ordering::Relaxed).max(self.progress.load(Ordering::Relaxed))
    }

    /// Its report is lost (a failed poll): nothing is known of its queue.
    pub fn report_lost(&self) {
        self.ranks.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.reporting.store(false, Ordering::Relaxed);
        self.waiting.store(0, Ordering::Relaxed);
        self.token_usage.store(0f64.to_bits(), Ordering::Relaxed);
    }

    /// It answered a load poll at least once (the stale veto judges it).
    pub fn polled(&self) -> bool {
        self.polled.load(Ordering::Relaxed)
    }

    /// Queued requests it last reported.
    pub fn waiting(&self) -> u32 {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Mean KV-cache usage it last reported (0 when unknown).
    pub fn token_usage(&self) -> f64 {
        f64::from_bits(self.token_usage.load(Ordering::Relaxed))
    }

    /// Mean KV-cache usage of its standing report, in thousandths (`None`: no report).
    pub fn kv_usage_permille(&self) -> Option<u16> {
        self.reporting.load(Ordering::Relaxed).then(|| (self.token_usage() * 1000.0).round().clamp(0.0, 1000.0) as u16)
    }

    /// Routing decisions that left it out for `veto`.
    pub fn vetoed(&self, veto: Veto) -> u64 {
        self.vetoed[veto.index()].load(Ordering::Relaxed)
    }

    /// Milliseconds since it was last heard from (`None`: never).
    pub fn silent_for(&self) -> Option<Duration> {
        let at = self.heard();
        (at != 0).then(|| Duration::from_millis(now_ms().saturating_sub(at)))
    }

    /// Its veto now, if any (`in_flight`, `owed`: its requests in flight and
    /// the uncached prompt tokens it still owes).
    pub fn veto(&self, cfg: &LivenessConfig, in_flight: u32, owed: u64) -> Option<Veto> {
        self.veto_at(cfg, in_flight, owed, now_ms())
    }

    /// [`Liveness::veto`] at `now` (one clock reading for a whole decision's candidates).
    pub(crate) fn veto_at(&self, cfg: &LivenessConfig, in_flight: u32, owed: u64, now: u64) -> Option<Veto> {
        if self.stalled.load(Ordering::Relaxed) {
            return Some(Veto::Stalled);
        }
        let since = |at: u64| now.saturating_sub(at);
        if !cfg.stale.is_zero()
            && self.polled.load(Ordering::Relaxed)
            && u128::from(since(self.heard())) >= cfg.stale.as_millis()
        {
            return Some(Veto::Stale);
        }
        if !cfg.wedge.is_zero() && in_flight > 0 {
            let bound = (cfg.wedge + Duration::from_millis(owed.saturating_mul(1_000) / PREFILL_TOKENS_PER_SEC))
                .min(MAX_WEDGE.max(cfg.wedge));
            let piling = in_flight > self.pile_at_progress.load(Ordering::Relaxed)
                || in_flight >= WEDGE_PILE
                || self.waiting() > self.waiting_at_progress.load(Ordering::Relaxed);
            if piling && u128::from(since(self.progress.load(Ordering::Relaxed))) >= bound.as_millis() {
                return Some(Veto::Wedged);
            }
        }
        if let Some(o) = cfg.overload
            && (self.waiting() >= o.waiting_requests || self.token_usage() >= o.token_usage)
        {
            return Some(Veto::Overloaded);
        }
        None
    }
}

/// What screening a decision's candidates left.
#[derive(Debug)]
pub enum Screened {
    /// The candidates to choose among (empty: every one is stalled or stale).
    Workers(Vec<Arc<Worker>>),
    /// Every candidate is vetoed, one of them overloaded, and `shed` is on.
    Shed,
}

/// Leaves vetoed workers out of a decision among `workers` (see the module's doc).
pub fn screen(cfg: &LivenessConfig, workers: Vec<Arc<Worker>>) -> Screened {
    let now = now_ms();
    let vetoes: Vec<Option<Veto>> = workers.iter().map(|w| w.veto_at(cfg, now)).collect();
    if vetoes.iter().all(Option::is_none) {
        return Screened::Workers(workers);
    }
    let count = |w: &Worker, v: Veto| {
        w.liveness.vetoed[v.index()].fetch_add(1, Ordering::Relaxed);
    };
    if vetoes.iter().any(Option::is_none) {
        let mut kept = Vec::with_capacity(workers.len());
        for (w, v) in workers.into_iter().zip(vetoes) {
            match v {
                None => kept.push(w),
                Some(v) => count(&w, v),
            }
        }
        return Screened::Workers(kept);
    }
    // Every one is vetoed: the hard vetoes leave, the soft ones fall back to the least loaded.
    let mut soft = Vec::new();
    let mut overloaded = false;
    for (w, v) in workers.into_iter().zip(vetoes) {
        let v = v.expect("every one vetoed");
        if v.is_hard() {
            count(&w, v);
        } else {
            overloaded |= v == Veto::Overloaded;
            soft.push((w, v));
        }
    }
    if overloaded && cfg.shed {
        for (w, v) in &soft {
            count(w, *v);
        }
        return Screened::Shed;
    }
    let least = soft.iter().enumerate().min_by_key(|(_, (w, _))| {
        let l = w.load();
        (l.in_flight.saturating_add(w.liveness.waiting()), l.uncached_tokens)
    });
    let Some((at, _)) = least else { return Screened::Workers(Vec::new()) };
    let mut kept = Vec::with_capacity(1);
    for (i, (w, v)) in soft.into_iter().enumerate() {
        if i == at {
            kept.push(w);
        } else {
            count(&w, v);
        }
    }
    Screened::Workers(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> LivenessConfig {
        LivenessConfig {
            stall: Duration::from_millis(20),
            wedge: Duration::from_millis(30),
            stale: Duration::from_millis(40),
            overload: Some(Overload { waiting_requests: 8, token_usage: 0.8 }),
            shed: false,
            warmup: None,
        }
    }

    /// Waits until at least `d` has passed on the liveness clock.
    fn pass(d: Duration) {
        let until = now_ms() + u64::try_from(d.as_millis()).unwrap() + 1;
        while now_ms() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_transport_failure_stalls_only_a_silent_worker_and_contact_ends_it() {
        let l = Liveness::default();
        l.contact();
        l.transport_failed(cfg().stall);
        assert_eq!(l.veto(&cfg(), 0, 0), None, "heard from just now: one failure is not a stall");
        pass(cfg().stall);
        l.transport_failed(cfg().stall);
        assert_eq!(l.veto(&cfg(), 0, 0), Some(Veto::Stalled));
        l.contact();
        assert_eq!(l.veto(&cfg(), 0, 0), None);
        l.transport_failed(Duration::ZERO);
        assert_eq!(l.veto(&cfg(), 0, 0), None, "stall off");
    }

    #[test]
    fn a_worker_polled_once_goes_stale_when_silent_and_one_never_polled_does_not() {
        let (polled, never) = (Liveness::default(), Liveness::default());
        polled.reported(0, 0.0);
        never.contact();
        pass(cfg().stale);
        assert_eq!(polled.veto(&cfg(), 0, 0), Some(Veto::Stale));
        assert_eq!(never.veto(&cfg(), 0, 0), None);
        polled.contact();
        assert_eq!(polled.veto(&cfg(), 0, 0), None);
    }

    #[test]
    fn a_silent_worker_is_wedged_only_while_its_pile_grows_and_progress_ends_it() {
        let l = Liveness::default();
        l.busy_from_idle();
        l.progressed(1);
        pass(cfg().wedge);
        assert_eq!(l.veto(&cfg(), 1, 0), None, "one request, silent, pile not grown: a long prefill");
        assert_eq!(l.veto(&cfg(), 2, 0), Some(Veto::Wedged), "a second one piled on");
        assert_eq!(l.veto(&cfg(), WEDGE_PILE, 0), Some(Veto::Wedged));
        assert_eq!(l.veto(&cfg(), 2, PREFILL_TOKENS_PER_SEC), None, "the prefill it owes stretches the bound");
        assert_eq!(l.veto(&cfg(), 0, 0), None, "nothing in flight");
        l.progressed(2);
        assert_eq!(l.veto(&cfg(), 2, 0), None, "progress");
    }

    #[test]
    fn a_reported_queue_or_cache_over_the_thresholds_overloads() {
        let l = Liveness::default();
        l.reported(7, 0.79);
        assert_eq!(l.veto(&cfg(), 0, 0), None);
        l.reported(8, 0.0);
        assert_eq!(l.veto(&cfg(), 0, 0), Some(Veto::Overloaded));
        l.reported(0, 0.8);
        assert_eq!(l.veto(&cfg(), 0, 0), Some(Veto::Overloaded));
        assert_eq!(l.veto(&LivenessConfig::off(), 0, 0), None);
        l.report_lost();
        assert_eq!(l.veto(&cfg(), 0, 0), None);
    }
}
