//! SMG's routing diagnostics (`x-smg-cache-trace`): who gets a dispatch's
//! decision record. SMG reads them from its environment only; the same
//! variables set them here, and so do these flags.

use clap::Args;

/// A dispatch's decision record: the header a request asks for with `x-smg-cache-trace: 1`
/// (always allowed), for every answer, and as a log line.
#[derive(Debug, Args)]
pub(crate) struct CacheTraceFlags {
    /// Every proxied answer carries its decision record in `x-smg-cache-trace` (the chosen
    /// worker, the policy, what the index said it holds; no candidates or loads), not only the
    /// answers to requests that ask with `x-smg-cache-trace: 1`.
    #[arg(long, env = "SMG_CACHE_TRACE_HEADER")]
    pub(crate) cache_trace_header: bool,
    /// Log each dispatch's decision record, with its candidates, at INFO (target
    /// `smg::cache_trace`).
    #[arg(long, env = "SMG_CACHE_TRACE")]
    pub(crate) cache_trace: bool,
    /// With --cache-trace, log one dispatch in N.
    #[arg(long, env = "SMG_CACHE_TRACE_SAMPLE", default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) cache_trace_sample: u64,
    /// With --cache-trace, a record longer than B bytes drops its candidate lists (unset: no cap).
    #[arg(long, env = "SMG_CACHE_TRACE_MAX_BYTES", value_name = "B")]
    pub(crate) cache_trace_max_bytes: Option<usize>,
}

impl CacheTraceFlags {
    /// The gateway's setting.
    pub(crate) fn config(&self) -> gateway::pipeline::cache_trace::CacheTraceConfig {
        gateway::pipeline::cache_trace::CacheTraceConfig {
            header: self.cache_trace_header,
            log: self.cache_trace,
            sample: self.cache_trace_sample,
            max_bytes: self.cache_trace_max_bytes,
        }
    }
}
