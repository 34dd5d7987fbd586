//! The liveness and overload-protection flags (Shepherd Model Gateway 1.13's
//! `--worker-stall-secs`, `--worker-wedge-secs`, `--worker-stale-secs`,
//! `--worker-overload-*`, `--worker-warmup-*`, `--worker-startup-*`) and its
//! load-monitor spellings: a flag group of
//! [`super::ServeArgs`], turned into the fleet's [`LivenessConfig`] here.

use std::time::Duration;

use clap::Args;
use fleet::liveness::{LivenessConfig, Overload};

use crate::usage::UsageError;

/// Liveness vetoes and worker overload protection (on by default, as in SMG 1.13).
#[derive(Debug, Args)]
pub(crate) struct LivenessFlags {
    /// Seconds without contact from a worker (a probe, a load poll, an answer's bytes) after
    /// which a transport failure leaves it out of routing until it is heard from again; 0: off.
    #[arg(long, env = "SGL_ROUTER_WORKER_STALL_SECS", default_value_t = 2, value_name = "S")]
    pub(crate) worker_stall_secs: u64,
    /// Seconds without progress (an answer's bytes or a completion) from a worker with requests
    /// in flight while they pile up (more than at its last progress, four deep, or its reported
    /// queue growing), after which new requests go elsewhere until it makes progress; stretched
    /// by the prefill it owes (8,192 tokens a second, up to 120 s); 0: off.
    #[arg(long, env = "SGL_ROUTER_WORKER_WEDGE_SECS", default_value_t = 3, value_name = "S")]
    pub(crate) worker_wedge_secs: u64,
    /// Seconds without contact from a worker that answered a load poll once, after which it is
    /// left out of routing as unreachable until heard from; keep it above the load-poll period; 0: off.
    #[arg(long, env = "SGL_ROUTER_WORKER_STALE_SECS", default_value_t = 15, value_name = "S")]
    pub(crate) worker_stale_secs: u64,
    /// Queued requests a worker reports (SGLang `/v1/loads`, over its ranks) at or above which it
    /// is left out of routing while another worker is under the thresholds (at least 1).
    #[arg(long, env = "SGL_ROUTER_WORKER_OVERLOAD_WAITING_REQUESTS", default_value_t = 8, value_name = "N")]
    pub(crate) worker_overload_waiting_requests: u32,
    /// Mean KV-cache token usage a worker reports at or above which it is overloaded, in (0, 1].
    #[arg(long, env = "SGL_ROUTER_WORKER_OVERLOAD_TOKEN_USAGE", default_value_t = 0.8, value_name = "R")]
    pub(crate) worker_overload_token_usage: f64,
    /// Overload protection is on by default; accepted so older SMG command lines parse.
    #[arg(long, overrides_with = "disable_worker_overload_protection")]
    pub(crate) worker_overload_protection: bool,
    /// No worker is left out of routing for its queue or KV usage.
    #[arg(long, env = "SGL_ROUTER_DISABLE_WORKER_OVERLOAD_PROTECTION", overrides_with = "worker_overload_protection")]
    pub(crate) disable_worker_overload_protection: bool,
    /// Refuse a request with a 503 (`Retry-After`: the load-poll period) when every worker it could
    /// use is overloaded, instead of sending it to the least loaded one.
    #[arg(long, env = "SGL_ROUTER_WORKER_OVERLOAD_SHED")]
    pub(crate) worker_overload_shed: bool,
    /// cache_aware's warm-up slice: for this many seconds after a worker enters rotation, until
    /// its KV cache has grown by --worker-warmup-blocks, it gets a share of the misses; 0: off.
    #[arg(long, env = "SGL_ROUTER_WORKER_WARMUP_SECS", default_value_t = 60, value_name = "S")]
    pub(crate) worker_warmup_secs: u64,
    /// Share of cache misses given to a warming (young or thin) worker, from 0 to 1.
    #[arg(long, env = "SGL_ROUTER_WORKER_WARMUP_SHARE", default_value_t = 0.25, value_name = "R")]
    pub(crate) worker_warmup_share: f64,
    /// Blocks a warming worker's cache must grow by to be warm.
    #[arg(long, env = "SGL_ROUTER_WORKER_WARMUP_BLOCKS", default_value_t = 1024, value_name = "N")]
    pub(crate) worker_warmup_blocks: usize,
    /// A worker whose cache holds less than this share of the median of the workers in rotation
    /// (or nothing) is thin: it warms up until grown by --worker-warmup-blocks, from 0 to 1; 0: off.
    #[arg(long, env = "SGL_ROUTER_WORKER_WARMUP_THIN_RATIO", default_value_t = 0.5, value_name = "R")]
    pub(crate) worker_warmup_thin_ratio: f64,
    /// One cache hit in this many goes to a thin worker with nothing in flight, although another
    /// worker holds its prefix; 0: off.
    #[arg(long, env = "SGL_ROUTER_WORKER_WARMUP_DIVERT_EVERY", default_value_t = 8, value_name = "N")]
    pub(crate) worker_warmup_divert_every: u64,
    /// Serve `/health`, `/liveness` and `/readiness` on this port too (on --host), from a thread
    /// and runtime of their own, so probes are answered however busy the serving threads are.
    #[arg(long, env = "SGL_ROUTER_HEALTH_CHECK_PORT", value_name = "PORT")]
    pub(crate) health_check_port: Option<u16>,
    /// Seconds an idle connection to a worker is kept for reuse; keep it under the engines' own
    /// keep-alive timeout (uvicorn's 5 s) so a connection is not reused as the engine closes it; 0: forever.
    #[arg(long, env = "SGL_ROUTER_UPSTREAM_POOL_IDLE_TIMEOUT_SECS", default_value_t = 3, value_name = "S")]
    pub(crate) upstream_pool_idle_timeout_secs: u64,
    /// Speak HTTP/2 to workers by prior knowledge (h2c; `https://` workers stay on HTTP/1.1),
    /// every request to a worker multiplexed over one connection per serving thread. Asked per
    /// worker at its first request: a worker that does not answer HTTP/2 stays on HTTP/1.1.
    #[arg(long, env = "SGL_ROUTER_UPSTREAM_HTTP2")]
    pub(crate) upstream_http2: bool,
    /// Seconds a new worker's first probe waits.
    #[arg(long, env = "SGL_ROUTER_WORKER_STARTUP_DELAY", default_value_t = 0, value_name = "S")]
    pub(crate) worker_startup_delay: u64,
    /// Seconds between the probes of a worker that has never been healthy (at least one).
    #[arg(long, env = "SGL_ROUTER_WORKER_STARTUP_CHECK_INTERVAL", default_value_t = 1, value_name = "S")]
    pub(crate) worker_startup_check_interval: u64,
    /// Seconds a new worker has to become healthy; past it, it is removed from the fleet (its
    /// registration failed; a discovered one comes back when discovery sees it again).
    #[arg(long, env = "SGL_ROUTER_WORKER_STARTUP_TIMEOUT_SECS", default_value_t = 1800, value_name = "S")]
    pub(crate) worker_startup_timeout_secs: u64,
    /// SMG's load-poll period in seconds: overrides --worker-load-poll-ms.
    #[arg(long, env = "SGL_ROUTER_LOAD_MONITOR_INTERVAL", value_name = "S")]
    pub(crate) load_monitor_interval: Option<u64>,
    /// No load polls (SMG's spelling of --worker-load-poll-ms 0): overload protection and the
    /// stale veto see no reports.
    #[arg(long, env = "SGL_ROUTER_DISABLE_LOAD_MONITORING")]
    pub(crate) disable_load_monitoring: bool,
}

impl LivenessFlags {
    /// The fleet's vetoes.
    pub(crate) fn config(&self) -> Result<LivenessConfig, UsageError> {
        if self.worker_overload_waiting_requests == 0 {
            return Err(UsageError(
                "--worker-overload-waiting-requests must be at least 1 (0 would veto every worker)".into(),
            ));
        }
        let usage = self.worker_overload_token_usage;
        if !(usage > 0.0 && usage <= 1.0) {
            return Err(UsageError(format!("--worker-overload-token-usage {usage}: must be in (0, 1]")));
        }
        for (flag, r) in [
            ("--worker-warmup-share", self.worker_warmup_share),
            ("--worker-warmup-thin-ratio", self.worker_warmup_thin_ratio),
        ] {
            if !(0.0..=1.0).contains(&r) {
                return Err(UsageError(format!("{flag} {r}: must be from 0 to 1")));
            }
        }
        let warmup = fleet::warmup::WarmupRule {
            secs: Duration::from_secs(self.worker_warmup_secs),
            blocks: self.worker_warmup_blocks,
            thin_ratio: self.worker_warmup_thin_ratio,
        };
        Ok(LivenessConfig {
            stall: Duration::from_secs(self.worker_stall_secs),
            wedge: Duration::from_secs(self.worker_wedge_secs),
            stale: Duration::from_secs(self.worker_stale_secs),
            overload: (!self.disable_worker_overload_protection)
                .then_some(Overload { waiting_requests: self.worker_overload_waiting_requests, token_usage: usage }),
            shed: self.worker_overload_shed,
            warmup: Some(warmup),
        })
    }

    /// How a new worker is probed until it is first healthy.
    pub(crate) fn startup(&self) -> fleet::StartupConfig {
        fleet::StartupConfig {
            delay: Duration::from_secs(self.worker_startup_delay),
            check_interval: Duration::from_secs(self.worker_startup_check_interval.max(1)),
            timeout: Duration::from_secs(self.worker_startup_timeout_secs.max(1)),
        }
    }

    /// The load-poll period: SMG's spellings over `--worker-load-poll-ms` (`poll_ms`).
    pub(crate) fn load_poll(&self, poll_ms: u64) -> Duration {
        if self.disable_load_monitoring {
            Duration::ZERO
        } else if let Some(s) = self.load_monitor_interval {
            Duration::from_secs(s)
        } else {
            Duration::from_millis(poll_ms)
        }
    }
}
