//! Catching up from a peer replica: a router started with `--index-peers`
//! (or `--index-peer-selector`) asks all its peers at once for a snapshot of
//! their KV index (`GET /index/snapshot`, a control-plane key), under one
//! deadline for the whole catch-up and a size bound per snapshot. It does so
//! in the background, once its listener is bound: a hanging peer delays
//! neither the probes nor the other peers. The first valid snapshot seeds the
//! fleet (each stream in it starts from the peer's holdings and replays from
//! the peer's seq on); then the workers join, so that every stream the
//! snapshot covers resumes from it. No peer answering is not an error: the
//! router starts empty, as without peers.
//!
//! Owns the catch-up and the moment the workers join; not what the workers
//! are (the app's) nor how a seed is applied (the fleet's).

use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet::k8s::DiscoveryConfig;
use fleet::k8s::api::ApiServer;
use fleet::{Fleet, IndexSnapshot, SnapshotLimits, Source};
use router_types::{PoolId, Role, WorkerUrl};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Where the peers are and how to ask them.
#[derive(Debug, Clone)]
pub struct PeerSetup {
    /// Peer base URLs (`--index-peers`), all asked at once.
    pub urls: Vec<String>,
    /// Router pods found by a label selector (`--index-peer-selector`), after `urls`.
    pub selector: Option<PeerSelector>,
    /// Bearer key for the peers' control plane (`--index-peer-api-key`, else our own first key).
    pub api_key: Option<String>,
    /// Longest wait for the whole catch-up (`--index-peer-timeout-secs`):
    /// listing the peer pods and asking every peer, at once.
    pub timeout: Duration,
    /// Bounds on a snapshot accepted.
    pub limits: SnapshotLimits,
    /// Replicas announced in the shared-state backend (`--shared-state`), after `urls`.
    pub shared: Option<SharedPeers>,
}

/// Where replicas announce themselves (`--shared-state`, `--shared-state-advertise-url`).
#[derive(Debug, Clone)]
pub struct SharedPeers {
    /// The backend.
    pub target: shared_state::Target,
    /// Its deadlines and bounds.
    pub options: shared_state::Options,
    /// The keys' prefix.
    pub prefix: String,
    /// This replica's own announced URL (not asked).
    pub me: Option<String>,
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

/// Who joins the fleet once the catch-up is over: the workers in order, and
/// the Kubernetes discovery to start.
#[derive(Debug, Default)]
pub(crate) struct Joining {
    /// Workers with their role and pool, added in this order.
    pub(crate) workers: Vec<(WorkerUrl, Role, PoolId, Source)>,
    /// Pods to watch, found by the API server.
    pub(crate) discovery: Option<(ApiServer, DiscoveryConfig)>,
}

// === impl Joining ===

impl Joining {
    /// Adds the workers and starts discovery.
    pub(crate) fn join(self, fleet: &Arc<Fleet>) {
        for (url, role, pool, source) in self.workers {
            fleet.add_in(url, role, pool, source);
        }
        if let Some((api, dc)) = self.discovery {
            info!(api = %api.base_url(), namespace = ?dc.namespace, selectors = dc.watched.len(), "kubernetes discovery: watching pods");
            fleet::k8s::spawn(fleet, api, dc);
        }
    }
}

/// Lets `joining` join the fleet: at once without `setup`, else in a
/// background task once the catch-up is over (a snapshot applied, or none
/// within the deadline). The receiver turns `true` then (or closes, if
/// `cancel` stopped the catch-up first).
pub(crate) fn join_after_catch_up(
    setup: Option<PeerSetup>,
    fleet: &Arc<Fleet>,
    joining: Joining,
    cancel: CancellationToken,
) -> watch::Receiver<bool> {
    let Some(setup) = setup else {
        joining.join(fleet);
        return watch::channel(true).1;
    };
    let (done, caught_up) = watch::channel(false);
    let fleet = fleet.clone();
    tokio::spawn(async move {
        let seed = tokio::select! {
            biased;
            () = cancel.cancelled() => {
                info!("index peers: catch-up stopped by shutdown");
                return;
            }
            seed = fetch(&setup) => seed,
        };
        if let Some(seed) = seed {
            fleet.seed(seed);
        }
        joining.join(&fleet);
        let _ = done.send(true);
    });
    caught_up
}

/// The first valid snapshot any peer gives within `setup.timeout` (every
/// peer asked at once; the others are dropped then), or `None`.
pub async fn fetch(setup: &PeerSetup) -> Option<IndexSnapshot> {
    match tokio::time::timeout(setup.timeout, first_snapshot(setup)).await {
        Ok(snapshot) => snapshot,
        Err(_) => {
            warn!(timeout = ?setup.timeout, "index peers: no snapshot in time; starting with an empty index");
            None
        }
    }
}

async fn first_snapshot(setup: &PeerSetup) -> Option<IndexSnapshot> {
    let mut urls = setup.urls.clone();
    if let Some(sel) = &setup.selector {
        urls.extend(peer_pods(sel).await);
    }
    if let Some(s) = &setup.shared {
        let backend = shared_state::Backend::start(s.target.clone(), s.options.clone());
        let found = crate::members::peers(&backend, &s.prefix, s.me.as_deref(), Duration::from_secs(2)).await;
        info!(peers = found.len(), "index peers: replicas announced in the shared-state backend");
        urls.extend(found.into_iter().filter(|u| !setup.urls.contains(u)));
    }
    if urls.is_empty() {
        warn!("index peers: none found; starting with an empty index");
        return None;
    }
    let client = reqwest::Client::builder().connect_timeout(Duration::from_secs(3)).build().ok()?;
    // Dropped on return or at the deadline: the asks still running are aborted.
    let mut asks = JoinSet::new();
    for url in urls {
        let (client, key, limits) = (client.clone(), setup.api_key.clone(), setup.limits);
        asks.spawn(async move {
            let started = Instant::now();
            let answer = ask(&client, &url, key.as_deref(), limits).await;
            (url, started.elapsed(), answer)
        });
    }
    while let Some(joined) = asks.join_next().await {
        match joined {
            Ok((url, took, Ok(snapshot))) => {
                info!(peer = %url, streams = snapshot.streams.len(), blocks = snapshot.blocks(), ?took, "index peers: snapshot received");
                return Some(snapshot);
            }
            Ok((url, _, Err(why))) => warn!(peer = %url, %why, "index peers: no snapshot"),
            Err(e) => warn!(error = %e, "index peers: an ask failed"),
        }
    }
    warn!("index peers: no peer gave a snapshot; starting with an empty index");
    None
}

async fn ask(
    client: &reqwest::Client,
    url: &str,
    api_key: Option<&str>,
    limits: SnapshotLimits,
) -> Result<IndexSnapshot, String> {
    let mut req = client.get(format!("{}/index/snapshot", url.trim_end_matches('/')));
    if let Some(v) = api_key.and_then(fleet::bearer) {
        req = req.header(reqwest::header::AUTHORIZATION, v);
    }
    let mut response = req.send().await.map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("HTTP {}", response.status()));
    }
    let max = limits.max_bytes;
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
