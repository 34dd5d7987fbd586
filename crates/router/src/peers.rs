//! Catching up from a peer replica: before following any worker, a router
//! started with `--index-peers` (or `--index-peer-selector`) asks its peers,
//! in order, for a snapshot of their KV index (`GET /index/snapshot`, a
//! control-plane key), within a deadline and a size bound. The first that
//! answers with a valid snapshot seeds the fleet: each stream in it starts
//! from the peer's holdings and replays from the peer's seq on. No peer
//! answering is not an error: the router starts empty, as without peers.

use std::time::Duration;

use fleet::k8s::api::ApiServer;
use fleet::{IndexSnapshot, SnapshotLimits};
use tracing::{info, warn};

/// Where the peers are and how to ask them.
#[derive(Debug, Clone)]
pub struct PeerSetup {
    /// Peer base URLs (`--index-peers`), asked in order.
    pub urls: Vec<String>,
    /// Router pods found by a label selector (`--index-peer-selector`), after `urls`.
    pub selector: Option<PeerSelector>,
    /// Bearer key for the peers' control plane (`--index-peer-api-key`, else our own first key).
    pub api_key: Option<String>,
    /// Longest wait for one peer's snapshot (`--index-peer-timeout-secs`).
    pub timeout: Duration,
    /// Bounds on a snapshot accepted.
    pub limits: SnapshotLimits,
}

/// Router pods by label.
#[derive(Debug, Clone)]
pub struct PeerSelector {
    /// The API server.
    pub api: ApiServer,
    /// Their namespace (`--service-discovery-namespace`; all when none).
    pub namespace: Option<String>,
    /// Their labels.
    pub selector: String,
    /// The port their control plane listens on (`--index-peer-port`).
    pub port: u16,
}

/// The first snapshot a peer gives, or `None`.
pub async fn fetch(setup: &PeerSetup) -> Option<IndexSnapshot> {
    let mut urls = setup.urls.clone();
    if let Some(sel) = &setup.selector {
        urls.extend(peer_pods(sel).await);
    }
    if urls.is_empty() {
        warn!("index peers: none found; starting with an empty index");
        return None;
    }
    let client = reqwest::Client::builder().connect_timeout(Duration::from_secs(3)).build().ok()?;
    for url in urls {
        let started = std::time::Instant::now();
        match tokio::time::timeout(setup.timeout, ask(&client, &url, setup)).await {
            Ok(Ok(snapshot)) => {
                info!(peer = %url, streams = snapshot.streams.len(), blocks = snapshot.blocks(), took = ?started.elapsed(), "index peers: snapshot received");
                return Some(snapshot);
            }
            Ok(Err(why)) => warn!(peer = %url, %why, "index peers: no snapshot"),
            Err(_) => warn!(peer = %url, timeout = ?setup.timeout, "index peers: no snapshot in time"),
        }
    }
    warn!("index peers: no peer gave a snapshot; starting with an empty index");
    None
}

async fn ask(client: &reqwest::Client, url: &str, setup: &PeerSetup) -> Result<IndexSnapshot, String> {
    let mut req = client.get(format!("{}/index/snapshot", url.trim_end_matches('/')));
    if let Some(v) = setup.api_key.as_deref().and_then(fleet::bearer) {
        req = req.header(reqwest::header::AUTHORIZATION, v);
    }
    let mut response = req.send().await.map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("HTTP {}", response.status()));
    }
    let max = setup.limits.max_bytes;
    if response.content_length().is_some_and(|n| n > max as u64) {
        return Err(format!("snapshot over {max} bytes"));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
        if body.len() + chunk.len() > max {
            return Err(format!("snapshot over {max} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    let limits = setup.limits;
    tokio::task::spawn_blocking(move || IndexSnapshot::decode(&body, &limits))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}

/// The control-plane URLs of the ready router pods of the selector, this pod excepted.
async fn peer_pods(sel: &PeerSelector) -> Vec<String> {
    let me = std::env::var("HOSTNAME").unwrap_or_default();
    match sel.api.list_pods(sel.namespace.as_deref(), &sel.selector).await {
        Ok(list) => list
            .pods
            .iter()
            .filter(|p| p.metadata.name != me)
            .filter_map(|p| p.eligible().ok())
            .map(|e| match e.ip {
                std::net::IpAddr::V4(v4) => format!("http://{v4}:{}", sel.port),
                std::net::IpAddr::V6(v6) => format!("http://[{v6}]:{}", sel.port),
            })
            .collect(),
        Err(e) => {
            warn!(error = %e, selector = %sel.selector, "index peers: listing router pods failed");
            Vec::new()
        }
    }
}
