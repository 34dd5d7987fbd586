//! Every default of the command line, named and documented in one place.

/// Page size assumed for workers that do not advertise one (vLLM's default block size).
pub(crate) const KV_EVENTS_BLOCK_SIZE: std::num::NonZeroUsize = std::num::NonZeroUsize::new(16).unwrap();
/// Milliseconds between two lines of `sgl-router kv-events`.
pub(crate) const WATCH_INTERVAL_MS: u64 = 1000;
/// Listen address.
pub(crate) const HOST: &str = "127.0.0.1";
/// Listen port (SGLang's router default).
pub(crate) const PORT: u16 = 30000;
/// Model id reported by `/v1/models` when none is given.
pub(crate) const MODEL_ID: &str = "default";
/// Seconds a request may wait for the worker's response headers.
pub(crate) const REQUEST_TIMEOUT_SECS: u64 = 600;
/// Largest request body (the reference router's 5 MiB).
pub(crate) const MAX_BODY_BYTES: usize = 5 << 20;
/// Most requests in flight.
pub(crate) const MAX_CONCURRENT_REQUESTS: i64 = 4096;
/// Seconds between health checks (SGLang Model Gateway's is 60: a worker
/// that hangs without closing its connections is noticed six times sooner).
pub(crate) const HEALTH_CHECK_INTERVAL_SECS: u64 = 10;
/// Milliseconds between polls of every worker's own load report (SGLang `/v1/loads`).
pub(crate) const WORKER_LOAD_POLL_MS: u64 = 100;
/// Seconds a down worker's KV-index state is kept (it keeps its cache if it comes back).
pub(crate) const WORKER_INDEX_RETENTION_SECS: u64 = 300;
/// Seconds to drain on shutdown.
pub(crate) const SHUTDOWN_GRACE_SECS: u64 = 30;
/// Seconds a client may take to send a request's head once it started it.
pub(crate) const CLIENT_HEADER_TIMEOUT_SECS: u64 = 30;
/// Seconds a client may take to send a request's body once its head arrived.
pub(crate) const CLIENT_BODY_TIMEOUT_SECS: u64 = 60;
/// Longest pause mid-body (Shepherd Model Gateway's `--stream-body-stall-timeout-secs`
/// default; 0: none).
pub(crate) const STREAM_BODY_STALL_TIMEOUT_SECS: u64 = 300;
/// Seconds a keep-alive client connection may stay idle between requests.
pub(crate) const CLIENT_IDLE_TIMEOUT_SECS: u64 = 60;
/// Most client connections open at once (more wait in the kernel's backlog); capped to what
/// the open-file limit leaves after [`FD_RESERVE_DIVISOR`] and [`FD_RESERVE_MIN`].
pub(crate) const MAX_CONNECTIONS: usize = 16_384;
/// The open files kept from client connections: the soft `RLIMIT_NOFILE` divided by this (a
/// quarter) for upstream connections, KV-event subscribers, probes, listeners and logs. A
/// proxied request holds a client and an upstream connection; upstream connections are pooled
/// and shared, so a quarter covers them short of every client streaming at once.
pub(crate) const FD_RESERVE_DIVISOR: u64 = 4;
/// ... and at least this many: the router's own sockets (listeners, subscribers, the workers'
/// probes) when the limit is small.
pub(crate) const FD_RESERVE_MIN: u64 = 64;
/// Seconds a worker may stay silent in the middle of an answer's body.
pub(crate) const UPSTREAM_IDLE_TIMEOUT_SECS: u64 = 300;
/// Bytes of memory the requests in progress may hold: 1 GiB, about 25 requests
/// of the largest body (5 MiB, charged 8 bytes per body byte) at once.
pub(crate) const MAX_REQUEST_MEMORY_BYTES: usize = 1 << 30;
/// Requests that may wait for a slot past --max-concurrent-requests (SGLang Model Gateway's).
pub(crate) const QUEUE_SIZE: usize = 100;
/// Seconds a request may wait for a slot (SGLang Model Gateway's).
pub(crate) const QUEUE_TIMEOUT_SECS: u64 = 60;
/// Attempts in all, the first included (`--retry-max-retries`, as SGLang Model Gateway counts them).
pub(crate) const RETRY_MAX_RETRIES: u32 = 5;
/// Milliseconds before the first retry.
pub(crate) const RETRY_INITIAL_BACKOFF_MS: u64 = 50;
/// Longest wait between two attempts, in milliseconds.
pub(crate) const RETRY_MAX_BACKOFF_MS: u64 = 30_000;
/// Growth of the wait between attempts.
pub(crate) const RETRY_BACKOFF_MULTIPLIER: f64 = 1.5;
/// Random share of each wait.
pub(crate) const RETRY_JITTER_FACTOR: f64 = 0.2;
/// Failures in a row that open a worker's circuit breaker.
pub(crate) const CB_FAILURE_THRESHOLD: u32 = 10;
/// Successes in a row, half-open, that close it.
pub(crate) const CB_SUCCESS_THRESHOLD: u32 = 3;
/// Seconds an open breaker waits before a trial.
pub(crate) const CB_TIMEOUT_DURATION_SECS: u64 = 60;
/// Seconds within which failures in a row add up.
pub(crate) const CB_WINDOW_DURATION_SECS: u64 = 120;
/// Seconds a health probe may take.
pub(crate) const HEALTH_CHECK_TIMEOUT_SECS: u64 = 5;
/// The path probed.
pub(crate) const HEALTH_CHECK_ENDPOINT: &str = "/health";
/// Failed probes in a row that take a worker out.
pub(crate) const HEALTH_FAILURE_THRESHOLD: u32 = 3;
/// Good probes in a row that bring it back.
pub(crate) const HEALTH_SUCCESS_THRESHOLD: u32 = 2;
/// Log level when `RUST_LOG` is not set.
pub(crate) const LOG_LEVEL: &str = "info";
/// SGLang Model Gateway's `--service-discovery-port` default.
pub(crate) const SERVICE_DISCOVERY_PORT: u16 = 80;
/// Longest wait for the catch-up from peers (every peer asked at once), seconds.
pub(crate) const INDEX_PEER_TIMEOUT_SECS: u64 = 30;
/// Longest wait for the pump to take a snapshot a peer asked for, seconds.
pub(crate) const INDEX_SNAPSHOT_TIMEOUT_SECS: u64 = 10;

#[cfg(test)]
mod tests {
    /// What the router admits, its simulated engines take (an engine's 413 under the router's
    /// limit would be a test artefact, not the router's behaviour).
    #[test]
    fn the_body_limit_is_one_number() {
        assert_eq!(super::MAX_BODY_BYTES, gateway::DEFAULT_MAX_BODY_BYTES);
        assert_eq!(super::MAX_BODY_BYTES, mock_engine::DEFAULT_MAX_BODY_BYTES);
    }
}
