//! Where each worker publishes: from SGLang's `GET /server_info` `kv_events`
//! block, or from explicit flags for engines that advertise nothing (vLLM).
//! Parsing is pure; fetching retries with backoff.
//!
//! A worker's answer decides how many subscriber tasks the router spawns and
//! how much it reads, so both are bounded: at most [`MAX_DP_SIZE`] streams per
//! worker (more is refused, [`DiscoveryError::TooManyRanks`], not clamped: a
//! worker subscribed to in part would look healthy while half its cache is
//! invisible), every port within range, and a body of at most
//! [`MAX_SERVER_INFO_BYTES`].

use std::collections::HashMap;
use std::time::Duration;

use router_types::{DpRank, WorkerKey, WorkerUrl};
use serde::Deserialize;
use serde_json::Value;
use tracing::{debug, warn};

use crate::subscriber::StreamEndpoints;

/// Speculative algorithms whose engines key the KV cache by bigrams.
const BIGRAM_ALGORITHMS: [&str; 3] = ["EAGLE", "EAGLE3", "FROZEN_KV_MTP"];
/// Most dp ranks (one subscriber task and two sockets each) accepted from one
/// worker, advertised or given by flag: above the largest data-parallel
/// deployments, far below what would flood the router with tasks.
pub const MAX_DP_SIZE: usize = 256;
/// Largest `/server_info` body read: SGLang's is a few KiB of server args.
pub const MAX_SERVER_INFO_BYTES: usize = 1024 * 1024;

/// Everything needed to subscribe to one worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerEvents {
    /// The worker.
    pub worker: WorkerUrl,
    /// One stream per dp rank.
    pub streams: Vec<StreamEndpoints>,
    /// The page size the worker hashes with.
    pub block_size: usize,
    /// True if the worker keys blocks by bigrams (EAGLE-style speculative decoding).
    pub bigram: bool,
}

/// Endpoints given on the command line, per worker.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExplicitEndpoints {
    /// `--kv-events-endpoint WORKER=tcp://HOST:PORT` (rank r at PORT + r).
    pub endpoints: HashMap<WorkerUrl, String>,
    /// `--kv-events-replay-endpoint WORKER=tcp://HOST:PORT` (same rule).
    pub replay_endpoints: HashMap<WorkerUrl, String>,
    /// `--kv-events-dp-size WORKER=N` (default 1).
    pub dp_sizes: HashMap<WorkerUrl, usize>,
}

/// Why a worker's event endpoints are unknown or unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiscoveryError {
    /// The worker did not answer `/server_info` in time.
    #[error("{worker}: /server_info unreachable: {message}")]
    Unreachable {
        /// The worker.
        worker: WorkerUrl,
        /// Why.
        message: String,
    },
    /// The answer is not what SGLang sends.
    #[error("{worker}: /server_info: {message}")]
    Invalid {
        /// The worker.
        worker: WorkerUrl,
        /// What is wrong.
        message: String,
    },
    /// The worker advertises (or a flag gives) more dp ranks than [`MAX_DP_SIZE`].
    #[error("{worker}: dp_size {dp_size} is more than the maximum of {max} streams per worker")]
    TooManyRanks {
        /// The worker.
        worker: WorkerUrl,
        /// The dp size asked for.
        dp_size: usize,
        /// [`MAX_DP_SIZE`].
        max: usize,
    },
    /// The worker publishes no KV events and no endpoint was given for it.
    #[error("{0}: publishes no KV events (kv_events is null) and no --kv-events-endpoint was given")]
    NotPublishing(WorkerUrl),
    /// A flag is malformed.
    #[error("invalid flag value {value:?}: {message}")]
    Flag {
        /// The value given.
        value: String,
        /// What is wrong.
        message: String,
    },
}

#[derive(Debug, Deserialize)]
struct KvEventsInfo {
    #[serde(default)]
    publisher: Option<String>,
    endpoint_host: String,
    endpoint_port_base: u16,
    #[serde(default)]
    topic: Option<String>,
    #[serde(default)]
    block_size: Option<usize>,
    #[serde(default)]
    dp_size: Option<usize>,
    #[serde(default)]
    replay_endpoint_port_base: Option<u16>,
}

// === impl DiscoveryError ===

impl DiscoveryError {
    /// A stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            DiscoveryError::Unreachable { .. } => "unreachable",
            DiscoveryError::Invalid { .. } => "invalid",
            DiscoveryError::TooManyRanks { .. } => "too_many_ranks",
            DiscoveryError::NotPublishing(_) => "not_publishing",
            DiscoveryError::Flag { .. } => "flag",
        }
    }
}

/// The host of a worker URL (`http://10.0.0.5:30000/` → `10.0.0.5`; IPv6 keeps its brackets).
pub fn url_host(url: &WorkerUrl) -> Option<String> {
    let rest = url.as_str().split_once("://").map_or(url.as_str(), |(_, r)| r);
    let authority = rest.split('/').next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split_once(']').map(|(h, _)| format!("[{h}]"));
    }
    let host = authority.split(':').next()?;
    (!host.is_empty()).then(|| host.to_string())
}

fn is_wildcard(host: &str) -> bool {
    matches!(host, "*" | "0.0.0.0" | "::" | "[::]" | "")
}

/// Parses a `/server_info` body. `Ok(None)` when `kv_events` is null or absent.
pub fn parse_server_info(worker: &WorkerUrl, body: &[u8]) -> Result<Option<WorkerEvents>, DiscoveryError> {
    let invalid = |message: String| DiscoveryError::Invalid { worker: worker.clone(), message };
    let info: Value = serde_json::from_slice(body).map_err(|e| invalid(format!("not JSON: {e}")))?;
    let kv = match info.get("kv_events") {
        None | Some(Value::Null) => return Ok(None),
        Some(v) => KvEventsInfo::deserialize(v).map_err(|e| invalid(format!("kv_events: {e}")))?,
    };
    if kv.publisher.as_deref().is_some_and(|p| p != "zmq") {
        return Err(invalid(format!("unsupported publisher {:?}", kv.publisher)));
    }
    let host = if is_wildcard(&kv.endpoint_host) {
        url_host(worker).ok_or_else(|| invalid("worker URL has no host".into()))?
    } else if kv.endpoint_host.contains(':') && !kv.endpoint_host.starts_with('[') {
        format!("[{}]", kv.endpoint_host)
    } else {
        kv.endpoint_host.clone()
    };
    let dp_size = kv.dp_size.unwrap_or(1).max(1);
    if dp_size > MAX_DP_SIZE {
        return Err(DiscoveryError::TooManyRanks { worker: worker.clone(), dp_size, max: MAX_DP_SIZE });
    }
    let last_port = |base: u16| usize::from(base) + dp_size - 1;
    if last_port(kv.endpoint_port_base) > usize::from(u16::MAX)
        || kv.replay_endpoint_port_base.is_some_and(|b| last_port(b) > usize::from(u16::MAX))
    {
        return Err(invalid(format!("dp_size {dp_size} puts ports past 65535")));
    }
    let block_size = kv.block_size.filter(|b| *b > 0).ok_or_else(|| invalid("kv_events.block_size missing".into()))?;
    let bigram = info
        .get("speculative_algorithm")
        .and_then(Value::as_str)
        .is_some_and(|a| BIGRAM_ALGORITHMS.contains(&a.to_ascii_uppercase().as_str()));
    let streams = (0..dp_size)
        .map(|rank| {
            let port = usize::from(kv.endpoint_port_base) + rank;
            let replay = kv.replay_endpoint_port_base.map(|b| format!("tcp://{host}:{}", usize::from(b) + rank));
            StreamEndpoints {
                key: WorkerKey::new(worker.clone(), DpRank(rank as u32)),
                endpoint: format!("tcp://{host}:{port}"),
                replay_endpoint: replay,
                topic: kv.topic.clone().unwrap_or_default(),
            }
        })
        .collect();
    Ok(Some(WorkerEvents { worker: worker.clone(), streams, block_size, bigram }))
}

/// Splits `WORKER_URL=VALUE` (the URL itself contains `:` and `/`, so split at the last `=`).
pub fn parse_worker_flag(value: &str) -> Result<(WorkerUrl, String), DiscoveryError> {
    let flag = |message: &str| DiscoveryError::Flag { value: value.to_string(), message: message.to_string() };
    let (worker, rest) = value.rsplit_once('=').ok_or_else(|| flag("expected WORKER_URL=VALUE"))?;
    if worker.is_empty() || rest.is_empty() {
        return Err(flag("expected WORKER_URL=VALUE"));
    }
    Ok((WorkerUrl::new(worker), rest.to_string()))
}

/// Splits a `tcp://HOST:PORT` endpoint.
fn endpoint_parts(endpoint: &str) -> Option<(&str, u16)> {
    let rest = endpoint.strip_prefix("tcp://")?;
    let (host, port) = rest.rsplit_once(':')?;
    Some((host, port.parse().ok()?))
}

/// The streams of a worker from explicit flags (vLLM and other engines that advertise nothing).
pub fn explicit_streams(
    worker: &WorkerUrl,
    flags: &ExplicitEndpoints,
    topic: &str,
) -> Result<Option<Vec<StreamEndpoints>>, DiscoveryError> {
    let Some(endpoint) = flags.endpoints.get(worker) else { return Ok(None) };
    let bad = |v: &str| DiscoveryError::Flag { value: v.to_string(), message: "expected tcp://HOST:PORT".into() };
    let (host, port) = endpoint_parts(endpoint).ok_or_else(|| bad(endpoint))?;
    let replay = match flags.replay_endpoints.get(worker) {
        Some(r) => Some(endpoint_parts(r).ok_or_else(|| bad(r))?),
        None => None,
    };
    let dp = flags.dp_sizes.get(worker).copied().unwrap_or(1).max(1);
    if dp > MAX_DP_SIZE {
        return Err(DiscoveryError::TooManyRanks { worker: worker.clone(), dp_size: dp, max: MAX_DP_SIZE });
    }
    let host = if is_wildcard(host) { url_host(worker).unwrap_or_else(|| host.to_string()) } else { host.to_string() };
    (0..dp)
        .map(|rank| {
            let port = usize::from(port) + rank;
            if port > usize::from(u16::MAX) {
                return Err(bad(endpoint));
            }
            Ok(StreamEndpoints {
                key: WorkerKey::new(worker.clone(), DpRank(rank as u32)),
                endpoint: format!("tcp://{host}:{port}"),
                replay_endpoint: replay.map(|(h, p)| {
                    let h = if is_wildcard(h) { host.clone() } else { h.to_string() };
                    format!("tcp://{h}:{}", usize::from(p) + rank)
                }),
                topic: topic.to_string(),
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Fetches `/server_info`, retrying with backoff (doubling from `initial`) until `deadline` passes.
pub async fn discover(
    client: &reqwest::Client,
    worker: &WorkerUrl,
    initial: Duration,
    deadline: Duration,
) -> Result<Option<WorkerEvents>, DiscoveryError> {
    let start = tokio::time::Instant::now();
    let mut backoff = initial;
    let url = format!("{}/server_info", worker.as_str());
    loop {
        let attempt = async {
            let response = client.get(&url).send().await.map_err(|e| e.to_string())?;
            if !response.status().is_success() {
                return Err(format!("HTTP {}", response.status()));
            }
            Ok(read_server_info(worker, response).await)
        };
        let remaining = deadline.saturating_sub(start.elapsed());
        let message = match tokio::time::timeout(remaining.max(Duration::from_millis(1)), attempt).await {
            Ok(Ok(Ok(body))) => return parse_server_info(worker, &body),
            Ok(Ok(Err(DiscoveryError::Unreachable { message, .. }))) | Ok(Err(message)) => message,
            Ok(Ok(Err(e))) => return Err(e),
            Err(_) => "timed out".to_string(),
        };
        if start.elapsed() + backoff >= deadline {
            warn!(%worker, error = %message, "kv events: giving up on /server_info");
            return Err(DiscoveryError::Unreachable { worker: worker.clone(), message });
        }
        debug!(%worker, error = %message, ?backoff, "kv events: /server_info failed, retrying");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// Reads a `/server_info` response body, at most [`MAX_SERVER_INFO_BYTES`]
/// of it: more is [`DiscoveryError::Invalid`] (asking again will not help), a
/// failed read [`DiscoveryError::Unreachable`]. For callers that send the
/// request themselves; [`discover`] uses it.
pub async fn read_server_info(worker: &WorkerUrl, mut response: reqwest::Response) -> Result<Vec<u8>, DiscoveryError> {
    let too_large = || DiscoveryError::Invalid {
        worker: worker.clone(),
        message: format!("/server_info body larger than {MAX_SERVER_INFO_BYTES} bytes"),
    };
    if response.content_length().is_some_and(|n| n > MAX_SERVER_INFO_BYTES as u64) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| DiscoveryError::Unreachable { worker: worker.clone(), message: e.to_string() })?
    {
        if body.len() + chunk.len() > MAX_SERVER_INFO_BYTES {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(url: &str) -> WorkerUrl {
        WorkerUrl::new(url)
    }

    #[test]
    fn wildcard_hosts_become_the_worker_host() {
        let body = br#"{"kv_events": {"publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": 5557,
            "topic": "kv", "block_size": 64, "dp_size": 2, "replay_endpoint_port_base": 6000},
            "speculative_algorithm": "EAGLE3", "other": 1}"#;
        let ev = parse_server_info(&w("http://10.1.2.3:30000"), body).unwrap().unwrap();
        assert_eq!((ev.block_size, ev.bigram, ev.streams.len()), (64, true, 2));
        assert_eq!(ev.streams[1].endpoint, "tcp://10.1.2.3:5558");
        assert_eq!(ev.streams[1].replay_endpoint.as_deref(), Some("tcp://10.1.2.3:6001"));
        assert_eq!(ev.streams[1].key.rank, DpRank(1));
        assert_eq!(ev.streams[0].topic, "kv");
        for wildcard in ["0.0.0.0", "::", "[::]"] {
            let body = format!(
                r#"{{"kv_events": {{"endpoint_host": "{wildcard}", "endpoint_port_base": 1, "block_size": 16}}}}"#
            );
            let ev = parse_server_info(&w("http://[fd00::1]:8000/"), body.as_bytes()).unwrap().unwrap();
            assert_eq!(ev.streams[0].endpoint, "tcp://[fd00::1]:1");
            assert!(!ev.bigram);
        }
    }

    #[test]
    fn null_kv_events_and_bad_bodies() {
        assert_eq!(parse_server_info(&w("http://a:1"), br#"{"kv_events": null}"#).unwrap(), None);
        assert_eq!(parse_server_info(&w("http://a:1"), br#"{"model": "x"}"#).unwrap(), None);
        assert_eq!(parse_server_info(&w("http://a:1"), b"<html>").unwrap_err().kind(), "invalid");
        let no_block = br#"{"kv_events": {"endpoint_host": "h", "endpoint_port_base": 1}}"#;
        assert!(parse_server_info(&w("http://a:1"), no_block).unwrap_err().to_string().contains("block_size"));
    }

    #[test]
    fn explicit_flags() {
        let (worker, ep) = parse_worker_flag("http://vllm-0:8000=tcp://vllm-0:5557").unwrap();
        assert_eq!((worker.as_str(), ep.as_str()), ("http://vllm-0:8000", "tcp://vllm-0:5557"));
        assert!(parse_worker_flag("tcp://x:1").is_err());
        let mut flags = ExplicitEndpoints::default();
        flags.endpoints.insert(worker.clone(), ep);
        flags.replay_endpoints.insert(worker.clone(), "tcp://*:5600".into());
        flags.dp_sizes.insert(worker.clone(), 2);
        let streams = explicit_streams(&worker, &flags, "").unwrap().unwrap();
        assert_eq!(streams[1].endpoint, "tcp://vllm-0:5558");
        assert_eq!(streams[1].replay_endpoint.as_deref(), Some("tcp://vllm-0:5601"));
        assert_eq!(explicit_streams(&w("http://other:1"), &flags, "").unwrap(), None);
        flags.endpoints.insert(worker.clone(), "udp://x".into());
        assert_eq!(explicit_streams(&worker, &flags, "").unwrap_err().kind(), "flag");
        flags.endpoints.insert(worker.clone(), "tcp://vllm-0:5557".into());
        flags.dp_sizes.insert(worker.clone(), MAX_DP_SIZE + 1);
        assert_eq!(explicit_streams(&worker, &flags, "").unwrap_err().kind(), "too_many_ranks");
    }

    #[test]
    fn dp_size_and_ports_are_bounded() {
        let body = |dp: usize, port: u16| {
            format!(
                r#"{{"kv_events": {{"endpoint_host": "h", "endpoint_port_base": {port}, "block_size": 16, "dp_size": {dp}}}}}"#
            )
        };
        let worker = w("http://a:1");
        assert_eq!(parse_server_info(&worker, body(MAX_DP_SIZE, 5000).as_bytes()).unwrap().unwrap().streams.len(), 256);
        let err = parse_server_info(&worker, body(100_000, 5000).as_bytes()).unwrap_err();
        assert_eq!(err, DiscoveryError::TooManyRanks { worker: worker.clone(), dp_size: 100_000, max: MAX_DP_SIZE });
        assert!(err.to_string().contains("maximum of 256"), "{err}");
        let err = parse_server_info(&worker, body(2, u16::MAX).as_bytes()).unwrap_err();
        assert!(err.to_string().contains("past 65535"), "{err}");
    }
}
