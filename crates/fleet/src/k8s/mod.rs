//! Kubernetes discovery: a source of workers that watches pods by label
//! selector (SGLang Model Gateway's `--service-discovery`). Each selector
//! (regular, or prefill and decode for PD) has one task that lists its pods,
//! then watches from the list's resource version with bookmarks; a dropped
//! watch resumes from the last version seen, an expired one (the `ERROR`
//! event with a 410 Status inside the 200 stream, or a 410 answer) and an
//! unreadable event list again, and every failure backs off (0.5 s doubling
//! to 30 s). A pod is a worker only while Running, Ready, with a pod IP and
//! no deletion timestamp: one that stops being so, or is deleted, is removed
//! from the fleet (no new requests; in-flight ones finish), and one that
//! becomes so is added. Unlike SMG's discovery, DELETED events and pods
//! turning NotReady are acted on, and a watcher error never sleeps 60 s.

pub mod api;
pub mod object;
pub mod pod;
pub mod pool;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use router_types::{Bootstrap, PoolId, Role, WorkerUrl};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::{Fleet, Source};
use api::{ApiServer, K8sError};
use pod::{Pod, WatchEvent};

/// SGLang's bootstrap-port annotation (SMG's `--bootstrap-port-annotation` default).
pub const DEFAULT_BOOTSTRAP_ANNOTATION: &str = "sglang.ai/bootstrap-port";
/// First wait after a failure; doubled up to [`BACKOFF_MAX`].
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(500);
/// Longest wait after failures in a row.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Most pods one selector turns into workers (more are skipped and counted).
pub const MAX_PODS_PER_SELECTOR: usize = 4096;

/// What the pods of a selector are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodRole {
    /// Regular workers (`--selector`).
    Regular,
    /// Prefill workers (`--prefill-selector`), bootstrap port from the annotation.
    Prefill,
    /// Decode workers (`--decode-selector`).
    Decode,
}

/// One watched selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watched {
    /// The label selector, as the API server takes it (`app=sglang,role=prefill`).
    pub selector: String,
    /// What its pods are.
    pub role: PodRole,
}

/// How discovery runs (the router's `--service-discovery*` flags).
#[derive(Debug, Clone)]
pub struct DiscoveryConfig {
    /// The namespace watched; `None`: every namespace (SMG's default; needs a ClusterRole).
    pub namespace: Option<String>,
    /// The port workers listen on in their pods.
    pub port: u16,
    /// The selectors, each with its role.
    pub watched: Vec<Watched>,
    /// The annotation holding a prefill pod's bootstrap port (vLLM's is read when it is absent).
    pub bootstrap_annotation: String,
    /// The label whose value names a pod's model pool; without it (or on a pod without the
    /// label) pods join `default_pool`.
    pub pool_label: Option<String>,
    /// The pool of a pod that names none: the routing config's default pool, or the one pool.
    pub default_pool: PoolId,
    /// The pools that exist (`--routing-config`); a pod labelled with another is skipped.
    /// `None`: any.
    pub pools: Option<Vec<PoolId>>,
    /// A Gateway API Inference Extension `InferencePool` whose selector and target port pick
    /// the pods (`--pool-name`), followed as it changes; `watched` and `port` are then unused.
    pub inference_pool: Option<object::ObjectsRef>,
}

/// What discovery counted.
#[derive(Debug, Default)]
pub struct DiscoveryMetrics {
    /// Lists done.
    pub lists: AtomicU64,
    /// Lists and watches that failed (connection, status, unreadable answer).
    pub failures: AtomicU64,
    /// Watches opened.
    pub watches: AtomicU64,
    /// Watches that ended with an expired resource version (410): a fresh list followed.
    pub expired: AtomicU64,
    /// Watch events read.
    pub events: AtomicU64,
    /// Workers added by discovery.
    pub added: AtomicU64,
    /// Workers removed by discovery (deleted, not ready, moved).
    pub removed: AtomicU64,
    /// Pods that match a selector but cannot be workers (bad annotation, unknown pool, over the bound).
    pub skipped: AtomicU64,
    /// Workers discovery holds now.
    pub workers: AtomicU64,
    /// The custom objects followed (`object::follow`).
    pub objects: object::ObjectMetrics,
}

/// A pod discovery added to the fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Member {
    url: WorkerUrl,
    role: Role,
    pool: PoolId,
}

/// One selector's list-and-watch loop.
struct Watcher {
    fleet: Arc<Fleet>,
    api: ApiServer,
    config: Arc<DiscoveryConfig>,
    watched: Watched,
    /// Pods (by `namespace/name`) this watcher added.
    known: HashMap<String, Member>,
    backoff: Duration,
    /// Ends the loop: the fleet's stop, or (an InferencePool's) a new selector.
    stop: tokio_util::sync::CancellationToken,
}

/// Starts one task per selector under the fleet's tracker (or, with an
/// `InferencePool`, one that follows the pool's selector); they stop with the fleet.
pub fn spawn(fleet: &Arc<Fleet>, api: ApiServer, config: DiscoveryConfig) {
    if let Some(pool) = config.inference_pool.clone() {
        let w =
            Watcher::new(fleet, &api, Arc::new(config), Watched { selector: String::new(), role: PodRole::Regular });
        fleet.tasks.spawn(pool::follow_pool(w, pool));
        return;
    }
    let config = Arc::new(config);
    for watched in config.watched.clone() {
        let mut w = Watcher::new(fleet, &api, config.clone(), watched);
        fleet.tasks.spawn(async move { w.run().await });
    }
}

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// How one watch ended.
enum WatchEnd {
    /// Resume from the last resource version seen.
    Resume,
    /// List again (expired version, unreadable event).
    Relist,
}

// === impl Watcher ===

impl Watcher {
    fn new(fleet: &Arc<Fleet>, api: &ApiServer, config: Arc<DiscoveryConfig>, watched: Watched) -> Self {
        Watcher {
            fleet: fleet.clone(),
            api: api.clone(),
            config,
            watched,
            known: HashMap::new(),
            backoff: BACKOFF_INITIAL,
            stop: fleet.cancel.clone(),
        }
    }

    fn metrics(&self) -> &DiscoveryMetrics {
        &self.fleet.metrics.discovery
    }

    fn ns(&self) -> Option<&str> {
        self.config.namespace.as_deref()
    }

    #[tracing::instrument(name = "k8s_discovery", skip_all, fields(selector = %self.watched.selector, role = ?self.watched.role))]
    async fn run(&mut self) {
        let cancel = self.stop.clone();
        'list: loop {
            let list = tokio::select! {
                biased;
                _ = cancel.cancelled() => break 'list,
                l = self.api.list_pods(self.ns(), &self.watched.selector) => l,
            };
            let list = match list {
                Ok(l) => l,
                Err(e) => {
                    inc(&self.metrics().failures);
                    warn!(error = %e, backoff = ?self.backoff, "k8s discovery: list failed");
                    if !self.back_off().await {
                        break 'list;
                    }
                    continue;
                }
            };
            inc(&self.metrics().lists);
            info!(pods = list.pods.len(), resource_version = %list.resource_version, "k8s discovery: listed");
            self.reconcile(list.pods).await;
            let mut rv = list.resource_version;
            loop {
                match self.watch(&mut rv).await {
                    None => break 'list,
                    Some(WatchEnd::Resume) => continue,
                    Some(WatchEnd::Relist) => continue 'list,
                }
            }
        }
        debug!("k8s discovery: stopped");
    }

    /// Waits the backoff (doubling it); false if cancelled meanwhile.
    async fn back_off(&mut self) -> bool {
        let wait = self.backoff;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        tokio::select! {
            biased;
            _ = self.stop.cancelled() => false,
            _ = tokio::time::sleep(wait) => true,
        }
    }

    /// One watch from `rv`, applying its events; `None` when cancelled.
    async fn watch(&mut self, rv: &mut String) -> Option<WatchEnd> {
        let cancel = self.stop.clone();
        let started = Instant::now();
        let opened = tokio::select! {
            biased;
            _ = cancel.cancelled() => return None,
            w = self.api.watch_pods(self.ns(), &self.watched.selector, rv) => w,
        };
        let mut watch = match opened {
            Ok(w) => w,
            Err(K8sError::Status { code: 410, .. }) => {
                inc(&self.metrics().expired);
                info!(resource_version = %rv, "k8s discovery: resource version expired, listing again");
                return Some(WatchEnd::Relist);
            }
            Err(e) => {
                inc(&self.metrics().failures);
                warn!(error = %e, backoff = ?self.backoff, "k8s discovery: watch failed");
                return if self.back_off().await { Some(WatchEnd::Relist) } else { None };
            }
        };
        inc(&self.metrics().watches);
        let mut events = 0u64;
        loop {
            let next = tokio::select! {
                biased;
                _ = cancel.cancelled() => return None,
                e = watch.next() => e,
            };
            let event = match next {
                Ok(Some(e)) => e,
                Ok(None) => {
                    // The server's timeout, or a proxy closing: resume, unless it ends at once.
                    if events == 0 && started.elapsed() < Duration::from_secs(1) && !self.back_off().await {
                        return None;
                    }
                    return Some(WatchEnd::Resume);
                }
                Err(e @ K8sError::Decode(_)) => {
                    inc(&self.metrics().failures);
                    warn!(error = %e, "k8s discovery: unreadable watch event, listing again");
                    return if self.back_off().await { Some(WatchEnd::Relist) } else { None };
                }
                Err(e) => {
                    inc(&self.metrics().failures);
                    warn!(error = %e, resource_version = %rv, "k8s discovery: watch dropped, resuming");
                    return if self.back_off().await { Some(WatchEnd::Resume) } else { None };
                }
            };
            events += 1;
            inc(&self.metrics().events);
            self.backoff = BACKOFF_INITIAL;
            if let Some(v) = event.resource_version() {
                v.clone_into(rv);
            }
            match event {
                WatchEvent::Applied(pod) => self.apply(&pod).await,
                WatchEvent::Deleted(pod) => self.leave(&pod.key(), "deleted").await,
                WatchEvent::Bookmark(_) => {}
                WatchEvent::Error(status) if status.code == 410 => {
                    inc(&self.metrics().expired);
                    info!(resource_version = %rv, message = %status.message, "k8s discovery: watch expired, listing again");
                    return Some(WatchEnd::Relist);
                }
                WatchEvent::Error(status) => {
                    inc(&self.metrics().failures);
                    warn!(code = status.code, reason = %status.reason, message = %status.message, "k8s discovery: watch error, listing again");
                    return if self.back_off().await { Some(WatchEnd::Relist) } else { None };
                }
            }
        }
    }

    /// Makes the fleet hold exactly the eligible pods of a fresh list.
    async fn reconcile(&mut self, pods: Vec<Pod>) {
        let listed: std::collections::HashSet<String> = pods.iter().map(Pod::key).collect();
        let gone: Vec<String> = self.known.keys().filter(|k| !listed.contains(*k)).cloned().collect();
        for key in gone {
            self.leave(&key, "absent from a fresh list").await;
        }
        for pod in &pods {
            self.apply(pod).await;
        }
    }

    /// A pod's new state: it joins, leaves, or moves (a new IP or role).
    async fn apply(&mut self, pod: &Pod) {
        let key = pod.key();
        let wanted = match self.member(pod) {
            Ok(m) => Some(m),
            Err(Skip::NotEligible(why)) => {
                debug!(pod = %key, why, "k8s discovery: pod is not a worker now");
                None
            }
            Err(Skip::Refused(why)) => {
                inc(&self.metrics().skipped);
                warn!(pod = %key, %why, "k8s discovery: pod skipped");
                None
            }
        };
        match (self.known.get(&key), wanted) {
            (Some(have), Some(want)) if *have == want => {}
            (Some(_), want) => {
                self.leave(&key, if want.is_some() { "moved" } else { "no longer eligible" }).await;
                if let Some(want) = want {
                    self.join(key, want);
                }
            }
            (None, Some(want)) => self.join(key, want),
            (None, None) => {}
        }
    }

    fn join(&mut self, key: String, m: Member) {
        if self.known.len() >= MAX_PODS_PER_SELECTOR {
            inc(&self.metrics().skipped);
            warn!(pod = %key, max = MAX_PODS_PER_SELECTOR, "k8s discovery: too many pods, skipped");
            return;
        }
        let added = self.fleet.add_in(m.url.clone(), m.role, m.pool.clone(), Source::Kubernetes);
        if !added.new {
            // Another source (or selector) has it: theirs to remove.
            debug!(pod = %key, worker = %m.url, "k8s discovery: worker already in the fleet");
            return;
        }
        info!(pod = %key, worker = %m.url, role = m.role.as_str(), pool = %m.pool, "k8s discovery: pod joins");
        inc(&self.metrics().added);
        self.metrics().workers.fetch_add(1, Ordering::Relaxed);
        self.known.insert(key, m);
    }

    async fn leave(&mut self, key: &str, why: &str) {
        let Some(m) = self.known.remove(key) else { return };
        info!(pod = %key, worker = %m.url, why, "k8s discovery: pod leaves");
        self.fleet.remove(&m.url).await;
        inc(&self.metrics().removed);
        self.metrics().workers.fetch_sub(1, Ordering::Relaxed);
    }

    /// The worker a pod is now, or why none.
    fn member(&self, pod: &Pod) -> Result<Member, Skip> {
        let ip = pod.eligible().map_err(Skip::NotEligible)?.ip;
        let host = match ip {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("[{v6}]"),
        };
        let url = WorkerUrl::parse(&format!("http://{host}:{}", self.config.port))
            .map_err(|e| Skip::Refused(format!("worker URL: {e}")))?;
        let role = match self.watched.role {
            PodRole::Regular => Role::Regular,
            PodRole::Decode => Role::Decode,
            PodRole::Prefill => {
                let bootstrap = match pod.bootstrap_port(&self.config.bootstrap_annotation).map_err(Skip::Refused)? {
                    Some(p) => Bootstrap::Port(p),
                    None => Bootstrap::Discover,
                };
                Role::Prefill { bootstrap }
            }
        };
        let pool = match self.config.pool_label.as_deref().and_then(|l| pod.metadata.labels.get(l)) {
            Some(name) => {
                let pool = PoolId(name.clone());
                if let Some(pools) = &self.config.pools
                    && !pools.contains(&pool)
                {
                    return Err(Skip::Refused(format!("pool {name:?} is not configured")));
                }
                pool
            }
            None => self.config.default_pool.clone(),
        };
        Ok(Member { url, role, pool })
    }
}

/// Why a matching pod is not a worker.
enum Skip {
    /// Not now (not running, not ready, no IP, being deleted): normal.
    NotEligible(&'static str),
    /// Never as it is (bad annotation, unknown pool): counted and logged.
    Refused(String),
}
