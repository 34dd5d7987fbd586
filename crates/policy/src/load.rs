//! The load policies, least load and power of two choices, with Shepherd Model Gateway
//! 1.13's expected-wait model: a worker's score is the time its engine needs to drain
//! what it holds,
//!
//! ```text
//!   (queued_tokens + sent_tokens) / throughput + kv_pressure_weight · k / (1 − k)
//! ```
//!
//! - `queued_tokens`: the prompt tokens waiting in its queue, not cached, as its engine last
//!   reported them (`num_waiting_uncached_tokens`), or its waiting requests times the mean
//!   prompt (`--least-load-mean-prefill-tokens`) when it reports a queue but no tokens;
//! - `sent_tokens`: what this router sent it since that report (the report is stale between
//!   polls: without them every request of a poll interval would go to one worker), a request
//!   whose prompt was not tokenized counted at the mean prompt;
//! - `throughput`: the tokens a second it reported generating (`gen_throughput`), else
//!   `--least-load-default-throughput`;
//! - `k`: the KV-cache usage it reported, a barrier that grows without bound as it fills.
//!
//! A worker without a standing report, while others report, scores as the best reporting one
//! plus its own requests in flight at the mean prompt and the reporters' mean throughput (not
//! idle, not starved); with no report at all the score is the requests in flight, then the
//! prompt tokens owed. With `--least-load-max-waiting-requests` a worker whose reported queue
//! plus the requests sent since has reached the cap is left out (none left: no choice).
//! Equal scores (idle engines all score 0) go to the fewer requests in flight, counting other
//! router replicas' with `--shared-state`, then the fewer prompt tokens owed, then to the
//! candidates in turn (SMG draws among them at random).

use std::sync::atomic::{AtomicUsize, Ordering};

use router_types::WorkerId;

use crate::simple::{SplitMix, check, commit_power_of_two, lighter, two};
use crate::{Candidate, Decision, Policy, PolicyError, Reason, RequestInfo};

/// The expected-wait model's parameters (SMG's `--least-load-*` options and defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExpectedWait {
    /// Seconds the KV barrier weighs (`--least-load-kv-pressure-weight`, 0.15).
    pub kv_pressure_weight: f64,
    /// Tokens a second when an engine reports none (`--least-load-default-throughput`, 2000).
    pub default_throughput: f64,
    /// A prompt's tokens when the router did not count them (`--least-load-mean-prefill-tokens`, 1024).
    pub mean_prefill_tokens: u32,
    /// Reported waiting requests plus those sent since at which a worker is left out
    /// (`--least-load-max-waiting-requests`; 0: never).
    pub max_waiting_requests: u32,
}

/// What power of two choices compares (`--power-of-two-load-metric`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoadMetric {
    /// The two draws' expected waits.
    #[default]
    ExpectedWait,
    /// The two draws' requests in flight, then their prompt tokens owed.
    Requests,
    /// No draws: the fewest requests in flight (then tokens owed) of every worker with a
    /// standing load report (of every worker when none has one).
    LeastRequests,
}

/// The less loaded of two distinct random candidates, by [`LoadMetric`].
#[derive(Debug)]
pub struct PowerOfTwo {
    rng: SplitMix,
    metric: LoadMetric,
    wait: ExpectedWait,
    tie: AtomicUsize,
}

/// The candidate with the least expected wait.
#[derive(Debug, Default)]
pub struct LeastLoad {
    wait: ExpectedWait,
    tie: AtomicUsize,
}

// === impl ExpectedWait ===

impl Default for ExpectedWait {
    fn default() -> Self {
        Self {
            kv_pressure_weight: 0.15,
            default_throughput: 2000.0,
            mean_prefill_tokens: 1024,
            max_waiting_requests: 0,
        }
    }
}

impl ExpectedWait {
    /// Why these parameters cannot be used (SMG's own checks), if they cannot.
    pub fn check(&self) -> Result<(), String> {
        if !self.kv_pressure_weight.is_finite() || self.kv_pressure_weight < 0.0 {
            return Err(format!(
                "the KV pressure weight must be finite and at least 0, not {}",
                self.kv_pressure_weight
            ));
        }
        if !self.default_throughput.is_finite() || self.default_throughput <= 0.0 {
            return Err(format!("the default throughput must be finite and above 0, not {}", self.default_throughput));
        }
        if self.mean_prefill_tokens == 0 {
            return Err("the mean prefill tokens must be at least 1".into());
        }
        Ok(())
    }

    /// The candidates a waiting-queue cap leaves (all without a cap, or without reports).
    fn uncapped<'a>(&self, candidates: &'a [Candidate]) -> Vec<&'a Candidate> {
        let cap = u64::from(self.max_waiting_requests);
        let under =
            |c: &&Candidate| cap == 0 || c.report.is_none_or(|r| u64::from(r.waiting) + u64::from(r.sent) < cap);
        candidates.iter().filter(under).collect()
    }

    /// The score of each of `candidates` (see the module's doc); with no report among them,
    /// their requests in flight.
    fn scores(&self, candidates: &[&Candidate]) -> Vec<f64> {
        let mean = f64::from(self.mean_prefill_tokens);
        let reported = |c: &Candidate| {
            let r = c.report?;
            let queued = if r.queued_tokens > 0 { r.queued_tokens as f64 } else { f64::from(r.waiting) * mean };
            let sent = r.sent_tokens as f64 + f64::from(r.sent_unknown) * mean;
            let throughput = if r.throughput > 0 { f64::from(r.throughput) } else { self.default_throughput };
            let k = (f64::from(c.kv_usage.unwrap_or(0)) / 1000.0).clamp(0.0, 0.999);
            Some((queued + sent) / throughput + self.kv_pressure_weight * k / (1.0 - k))
        };
        let known: Vec<Option<f64>> = candidates.iter().map(|c| reported(c)).collect();
        let best_known = known.iter().flatten().copied().fold(f64::INFINITY, f64::min);
        if !best_known.is_finite() {
            // No report at all: requests in flight (`least` breaks ties by tokens owed).
            return candidates.iter().map(|c| f64::from(c.load.in_flight)).collect();
        }
        let throughputs: Vec<f64> = candidates
            .iter()
            .filter_map(|c| c.report)
            .filter(|r| r.throughput > 0)
            .map(|r| f64::from(r.throughput))
            .collect();
        let nominal = if throughputs.is_empty() {
            self.default_throughput
        } else {
            throughputs.iter().sum::<f64>() / throughputs.len() as f64
        };
        let unreported = |c: &Candidate| best_known + f64::from(c.load.in_flight) * mean / nominal;
        candidates.iter().zip(known).map(|(c, s)| s.unwrap_or_else(|| unreported(c))).collect()
    }

    /// The least-scored of `candidates`; equal scores go to the fewer requests in flight (this
    /// router's and, with `--shared-state`, its replicas'), then the fewer tokens owed, then to
    /// the first from `start`.
    fn least(&self, candidates: &[&Candidate], start: usize) -> Option<WorkerId> {
        let scores = self.scores(candidates);
        let n = candidates.len();
        let mut best: Option<usize> = None;
        for i in (0..n).map(|j| (start + j) % n) {
            let better = match best {
                None => true,
                Some(b) => scores[i] < scores[b] || (scores[i] == scores[b] && lighter(candidates[i], candidates[b])),
            };
            if better {
                best = Some(i);
            }
        }
        best.map(|i| candidates[i].worker)
    }
}

// === impl LeastLoad ===

impl LeastLoad {
    /// With these parameters.
    pub fn new(wait: ExpectedWait) -> Self {
        Self { wait, tie: AtomicUsize::new(0) }
    }
}

impl Policy for LeastLoad {
    fn name(&self) -> &'static str {
        "least_load"
    }

    fn select(&self, candidates: &[Candidate], _request: &RequestInfo<'_>) -> Result<Decision, PolicyError> {
        check(candidates)?;
        let open = self.wait.uncapped(candidates);
        // Rotate the starting point so ties do not always go to the first worker.
        let start = self.tie.load(Ordering::Relaxed) % open.len().max(1);
        let worker = self.wait.least(&open, start).ok_or(PolicyError::AllAtWaitingCap)?;
        Ok(Decision { worker, reason: Reason::LeastLoad })
    }

    fn commit(&self, _decision: &Decision, _candidates: &[Candidate], _request: &RequestInfo<'_>) {
        self.tie.fetch_add(1, Ordering::Relaxed);
    }
}

// === impl PowerOfTwo ===

impl PowerOfTwo {
    /// Seeded, comparing by `metric` (expected waits by `wait`).
    pub fn new(seed: u64, metric: LoadMetric, wait: ExpectedWait) -> Self {
        Self { rng: SplitMix::new(seed), metric, wait, tie: AtomicUsize::new(0) }
    }
}

impl Policy for PowerOfTwo {
    fn name(&self) -> &'static str {
        "power_of_two"
    }

    fn select(&self, candidates: &[Candidate], _request: &RequestInfo<'_>) -> Result<Decision, PolicyError> {
        check(candidates)?;
        let worker = match self.metric {
            LoadMetric::LeastRequests => {
                let reporting: Vec<&Candidate> = candidates.iter().filter(|c| c.report.is_some()).collect();
                let pool: Vec<&Candidate> = if reporting.is_empty() { candidates.iter().collect() } else { reporting };
                let start = self.tie.load(Ordering::Relaxed) % pool.len();
                let mut best = pool[start];
                for &c in pool[start..].iter().chain(&pool[..start]) {
                    if lighter(c, best) {
                        best = c;
                    }
                }
                best.worker
            }
            _ if candidates.len() == 1 => candidates[0].worker,
            LoadMetric::Requests => {
                let (a, b) = two(&mut self.rng.peek(), candidates.len());
                if lighter(&candidates[b], &candidates[a]) { candidates[b].worker } else { candidates[a].worker }
            }
            LoadMetric::ExpectedWait => {
                // The two draws scored against each other alone (their own nominal throughput).
                let (a, b) = two(&mut self.rng.peek(), candidates.len());
                let pair = [&candidates[a], &candidates[b]];
                self.wait.least(&pair, 0).unwrap_or(candidates[a].worker)
            }
        };
        Ok(Decision { worker, reason: Reason::PowerOfTwo })
    }

    fn commit(&self, _decision: &Decision, candidates: &[Candidate], _request: &RequestInfo<'_>) {
        match self.metric {
            LoadMetric::LeastRequests => {
                self.tie.fetch_add(1, Ordering::Relaxed);
            }
            LoadMetric::Requests | LoadMetric::ExpectedWait => commit_power_of_two(&self.rng, candidates),
        }
    }
}

#[cfg(test)]
#[path = "load/tests.rs"]
mod tests;
