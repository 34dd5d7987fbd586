//! The gateway's metrics: what it counts of requests, decisions and
//! latencies (the Prometheus primitives are `router_types::metrics`).

use std::sync::atomic::AtomicU64;

pub use router_types::metrics::{Histogram, LabeledCounter, escape, head};

/// Latency buckets: a proxied request takes milliseconds (fast engines) to minutes (long generations).
pub const LATENCY_BUCKETS: [f64; 14] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0];
/// Matched-token buckets: powers of two up to 128 k tokens of prompt.
pub const TOKEN_BUCKETS: [f64; 10] = [0.0, 256.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0, 131072.0];

/// What the gateway counts.
#[derive(Debug)]
pub struct GatewayMetrics {
    /// Requests by `route` and `status`.
    pub requests: LabeledCounter,
    /// Requests that failed before a worker's answer, by `side` and error `type`.
    pub errors: LabeledCounter,
    /// Decisions by `reason` (the policy is fixed per router).
    pub decisions: LabeledCounter,
    /// Retries: requests sent again after a connect failure or a retryable status.
    pub retries: AtomicU64,
    /// Requests refused because the queue for a slot was full.
    pub queue_full: AtomicU64,
    /// Requests that waited their whole queue timeout.
    pub queue_timeouts: AtomicU64,
    /// Requests waiting now for a worker's reported queue under least_load's waiting cap.
    pub cap_waiting: AtomicU64,
    /// Requests that waited their whole queue timeout for one.
    pub cap_timeouts: AtomicU64,
    /// How long queued requests waited for a slot.
    pub queue_wait: Histogram,
    /// Requests refused because the memory budget was spent.
    pub over_budget: AtomicU64,
    /// Requests refused (429) over their tenant's rate limit.
    pub tenant_rate_limited: AtomicU64,
    /// Whole-request latency.
    pub latency: Histogram,
    /// Time to the first response byte from the worker.
    pub ttfb: Histogram,
    /// Prompt tokens the chosen worker already held.
    pub matched_tokens: Histogram,
    /// Disaggregated requests' legs by `leg` (prefill, decode) and `outcome`.
    pub pd_legs: LabeledCounter,
    /// Legs aborted because the other leg failed, by `leg` (the one aborted).
    pub pd_aborts: LabeledCounter,
    /// Disaggregated attempts by `path`: `disaggregated` (both legs) or `decode_alone` (the
    /// prefill leg skipped, `--pd-skip-prefill-*`).
    pub pd_paths: LabeledCounter,
    /// Disaggregated decisions by `leg`, `policy` and `reason`.
    pub pd_decisions: LabeledCounter,
    /// Time from a disaggregated request's dispatch to both legs' answer heads.
    pub pd_heads: Histogram,
    /// gRPC workers' calls that failed, by `kind`: `unreachable`, `status` (an error status),
    /// `broken` (the call broke or ended short), `deadline`, `bad_message` (a message for
    /// another request or sequence, a token outside the vocabulary, an empty answer).
    pub grpc_failures: LabeledCounter,
    /// Prompts rendered (template and tokenizer): at most one per request and renderer; their
    /// images by identity.
    pub prompts: planner::PromptCounts,
    /// Answers that broke off after their head went out, by `route`.
    pub answers_cut: LabeledCounter,
    /// Failed `accept`s on the client listener (out of descriptors and the like).
    pub accept_errors: AtomicU64,
    /// The endpoint picker's streams by `outcome`: `picked` (a worker named), `answered` (in the
    /// gateway's stead: a refusal or a cached answer), `error` (ended with a gRPC error).
    pub epp_streams: LabeledCounter,
    /// The decisions' routing regret and the workers' reported cache hits.
    pub cached: crate::cached::CacheMetrics,
}

// === impl GatewayMetrics ===

impl Default for GatewayMetrics {
    fn default() -> Self {
        Self::new(&LATENCY_BUCKETS)
    }
}

impl GatewayMetrics {
    /// The metrics, with `buckets` (seconds) for the latency histograms
    /// (`--prometheus-duration-buckets`).
    pub fn new(buckets: &[f64]) -> Self {
        Self {
            queue_full: AtomicU64::new(0),
            queue_timeouts: AtomicU64::new(0),
            cap_waiting: AtomicU64::new(0),
            cap_timeouts: AtomicU64::new(0),
            queue_wait: Histogram::new(buckets),
            requests: LabeledCounter::default(),
            decisions: LabeledCounter::default(),
            errors: LabeledCounter::default(),
            retries: AtomicU64::new(0),
            over_budget: AtomicU64::new(0),
            tenant_rate_limited: AtomicU64::new(0),
            latency: Histogram::new(buckets),
            ttfb: Histogram::new(buckets),
            epp_streams: LabeledCounter::default(),
            matched_tokens: Histogram::new(&TOKEN_BUCKETS),
            pd_legs: LabeledCounter::default(),
            pd_aborts: LabeledCounter::default(),
            pd_paths: LabeledCounter::default(),
            pd_decisions: LabeledCounter::default(),
            pd_heads: Histogram::new(buckets),
            grpc_failures: LabeledCounter::default(),
            prompts: planner::PromptCounts::default(),
            accept_errors: AtomicU64::new(0),
            answers_cut: LabeledCounter::default(),
            cached: crate::cached::CacheMetrics::default(),
        }
    }
}

/// The process's own series, read at scrape time (nothing is counted on the
/// request path): resident memory, open descriptors and threads from
/// `/proc/self` (Linux; absent elsewhere). The runtimes' series are
/// [`crate::runtimes::Runtimes::render`]'s.
pub fn render_process(out: &mut String) {
    use std::fmt::Write as _;
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        let field = |name: &str| {
            status.lines().find_map(|l| l.strip_prefix(name)?.split_whitespace().next()?.parse::<u64>().ok())
        };
        if let Some(kib) = field("VmRSS:") {
            head(out, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
            let _ = writeln!(out, "process_resident_memory_bytes {}", kib * 1024);
        }
        if let Some(n) = field("Threads:") {
            head(out, "process_threads", "gauge", "OS threads of the process.");
            let _ = writeln!(out, "process_threads {n}");
        }
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        head(out, "process_open_fds", "gauge", "Open file descriptors.");
        let _ = writeln!(out, "process_open_fds {}", fds.count());
    }
}

/// Buckets of the signal-and-decision latency: microseconds to a few milliseconds.
const SIGNAL_BUCKETS: [f64; 10] = [2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 5e-3, 2.5e-2];

/// What model selection counts.
#[derive(Debug)]
pub struct RoutingMetrics {
    /// Routed requests by `pool` and `decision`.
    pub requests: LabeledCounter,
    /// Requests a `block` plugin answered, by `decision`.
    pub blocks: LabeledCounter,
    /// Values a `pii_redact` plugin replaced, by `type`.
    pub redactions: LabeledCounter,
    /// Time computing signals and the decision, per auto-routed request.
    pub signal_seconds: Histogram,
    /// Auto-routed conversations by what stickiness did (`new`, `same`, `stayed`, `switched`).
    pub sessions: LabeledCounter,
    /// Response-cache lookups by `decision` and `outcome` (`hit_exact`, `hit_semantic`, `miss`,
    /// `skip_sampling`, `skip_choices`, `skip_bypass`).
    pub cache_lookups: LabeledCounter,
    /// Answers stored in a response cache, by `decision`.
    pub cache_stores: LabeledCounter,
    /// Requests a `cascade` plugin judged or let pass, by `decision` and `outcome` (`kept`,
    /// `escalated`, `no_logprobs`, `skip_stream`, `skip_route`, `too_large`, `failed`).
    pub cascades: LabeledCounter,
    /// 2xx answers a `response_guard` read, by `decision` and `outcome` (`clean`, `annotated`,
    /// `redacted`, `blocked`, `too_large`, `failed`).
    pub guarded: LabeledCounter,
    /// What a `response_guard` found in answers, by `decision` and `finding` (a PII type, or
    /// `jailbreak:<rule>`).
    pub guard_findings: LabeledCounter,
}

impl RoutingMetrics {
    /// Nothing counted yet.
    pub fn new() -> Self {
        RoutingMetrics {
            requests: LabeledCounter::default(),
            blocks: LabeledCounter::default(),
            redactions: LabeledCounter::default(),
            signal_seconds: Histogram::new(&SIGNAL_BUCKETS),
            sessions: LabeledCounter::default(),
            cache_lookups: LabeledCounter::default(),
            cache_stores: LabeledCounter::default(),
            cascades: LabeledCounter::default(),
            guarded: LabeledCounter::default(),
            guard_findings: LabeledCounter::default(),
        }
    }

    /// One request a `cascade` plugin judged or let pass.
    pub(crate) fn count_cascade(&self, decision: &str, outcome: &str) {
        let decision = escape(decision);
        self.cascades.inc(format_args!("decision=\"{decision}\",outcome=\"{outcome}\""));
    }
}

impl Default for RoutingMetrics {
    fn default() -> Self {
        RoutingMetrics::new()
    }
}

#[cfg(test)]
mod process_tests {
    use super::render_process;

    #[test]
    fn the_process_series_are_read_from_the_running_process() {
        let mut out = String::new();
        render_process(&mut out);
        let value = |name: &str| -> u64 {
            let line =
                out.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name}: {out}"));
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        if cfg!(target_os = "linux") {
            assert!(value("process_resident_memory_bytes") > 1 << 20, "{out}");
            assert!(value("process_open_fds") >= 3, "stdin, stdout, stderr at least");
            assert!(value("process_threads") >= 1);
        }
    }
}
