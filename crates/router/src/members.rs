//! Router replicas found through the shared-state backend (`--shared-state`), for the index
//! catch-up: a replica that has caught up announces its control-plane URL
//! (`--shared-state-advertise-url`) in a sorted set scored by the backend's clock, again every
//! [`ANNOUNCE_EVERY`]; a replica starting later reads the URLs announced within [`FRESH`] and
//! asks them for a snapshot beside its `--index-peers` and the Kubernetes selector's pods.
//! Owns the set's key and its scripts; not the catch-up (`peers`).

use std::time::Duration;

use shared_state::{Backend, Reply};
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// How often a replica says it is there.
pub const ANNOUNCE_EVERY: Duration = Duration::from_secs(5);
/// An announcement older than this (by the backend's clock) is forgotten.
const FRESH_MS: u64 = 30_000;
/// Peers read at most.
pub const MAX_PEERS: usize = 16;
/// Longest announced URL.
const MAX_URL: usize = 512;

/// KEYS[1]: the set. ARGV: the URL, the freshness (ms). Scores the URL with the backend's
/// clock and drops what is stale.
const ANNOUNCE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) * 2)
return 1
";

/// KEYS[1]: the set. ARGV: the freshness (ms), the most to read. The fresh URLs, newest first.
const FRESH: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZREVRANGEBYSCORE', KEYS[1], '+inf', now - tonumber(ARGV[1]), 'LIMIT', 0, tonumber(ARGV[2]))
";

/// The set's key under `prefix`.
fn key(prefix: &str) -> Vec<u8> {
    format!("{prefix}:replicas").into_bytes()
}

/// Announces `url` (this replica's control plane) every [`ANNOUNCE_EVERY`] until `cancel`,
/// then takes it back. Never fails: a backend out of reach costs announcements (logged once).
pub async fn announce(backend: Backend, prefix: String, url: String, cancel: CancellationToken) {
    let key = key(&prefix);
    let fresh = FRESH_MS.to_string();
    let mut warned = false;
    loop {
        let r = backend.cmd(&[b"EVAL", ANNOUNCE.as_bytes(), b"1", &key, url.as_bytes(), fresh.as_bytes()]).await;
        if !matches!(r, Ok(Reply::Int(1))) && !std::mem::replace(&mut warned, true) {
            warn!(?r, "shared state: this replica could not announce itself (retried every 5 s)");
        }
        tokio::select! {
            () = cancel.cancelled() => break,
            () = tokio::time::sleep(ANNOUNCE_EVERY) => {}
        }
    }
    let _ = backend.cmd(&[b"ZREM", &key, url.as_bytes()]).await;
}

/// The replicas announced within the last 30 s, `me` excepted, at most [`MAX_PEERS`]; none
/// when the backend is not reached within `deadline`.
pub async fn peers(backend: &Backend, prefix: &str, me: Option<&str>, deadline: Duration) -> Vec<String> {
    if !backend.wait_up(deadline).await {
        warn!("shared state: the backend is out of reach; no peers found through it");
        return Vec::new();
    }
    let (fresh, limit, key) = (FRESH_MS.to_string(), (MAX_PEERS + 1).to_string(), key(prefix));
    let args: [&[u8]; 6] = [b"EVAL", FRESH.as_bytes(), b"1", &key, fresh.as_bytes(), limit.as_bytes()];
    let Ok(Reply::Array(urls)) = backend.cmd(&args).await else { return Vec::new() };
    urls.iter()
        .filter_map(|u| std::str::from_utf8(u.as_bytes()?).ok())
        .filter(|u| u.len() <= MAX_URL && (u.starts_with("http://") || u.starts_with("https://")))
        .filter(|u| Some(*u) != me)
        .take(MAX_PEERS)
        .map(str::to_owned)
        .collect()
}
