//! A local stand-in of the Kubernetes API server's pod **list/watch**
//! protocol, for tests of the router's Kubernetes service discovery. No
//! cluster is reachable where these tests run, so this was written from the
//! API concepts documentation (<https://kubernetes.io/docs/reference/using-api/api-concepts/>:
//! efficient detection of changes, watch bookmarks, 410 Gone, chunked lists)
//! and the watch cache's documented behaviour, and speaks the same wire
//! format over real TCP (optionally TLS) sockets.
//!
//! ```text
//!  test ──upsert_pod / set_ready / delete_pod / compact / drop_watches──┐
//!                                                                      ▼
//!  client ──GET /api/v1/[namespaces/{ns}/]pods──▶ http ──▶ store (pods, global rv, history)
//!                         ?watch=1 ◀── watch task ◀── bounded channel ◀─┘
//! ```
//!
//! What it does:
//! - `GET /api/v1/pods` and `GET /api/v1/namespaces/{ns}/pods`, with
//!   `labelSelector` (every operator), `limit`/`continue` (pages of one
//!   snapshot; a token from before a compaction answers 410 `Expired`),
//!   `resourceVersion` and `resourceVersionMatch` (`NotOlderThan`, `Exact`).
//! - `watch=1`: newline-delimited `ADDED`/`MODIFIED`/`DELETED` events in a
//!   chunked 200 response, from a version (the history after it) or from now
//!   (synthetic `ADDED` for the current pods); a version compacted away gets
//!   one `ERROR` event (a 410 `Expired` Status) inside the 200 stream; label
//!   changes become `ADDED`/`DELETED` for a selecting watcher;
//!   `allowWatchBookmarks`, `timeoutSeconds`, `sendInitialEvents`.
//! - One global resource-version counter, bumped by every change (a no-op
//!   update bumps nothing); each pod carries the version of its last change.
//! - Bearer-token authentication (401 `Unauthorized` Status), HTTPS with a
//!   CA made at spawn ([`MockApiServer::ca_pem`], [`MockApiServer::kubeconfig`]).
//!
//! Custom objects too (`objects.rs`, `custom.rs`): any namespaced
//! `/apis/{group}/{version}/namespaces/{ns}/{plural}` resource a test puts
//! ([`MockApiServer::put_object`]): list and watch (a `metadata.name` field
//! selector, no bookmarks or pages), get one, and a JSON merge patch of its
//! `status` subresource, with `generation` bumped by changes but the status's.
//!
//! What it does not do: other built-in resources, any verb on pods but list and watch
//! (no get of one pod, create, update, patch, delete over HTTP, server-side
//! apply, subresources, `/api` discovery, `/version`), field selectors
//! (accepted and ignored), protobuf or CBOR, `resourceVersionMatch` for
//! watches, waiting for a future `resourceVersion` (answered 504 at once,
//! where the real server waits up to 3 s first), the default watch timeout
//! (a watch without `timeoutSeconds` lasts until it is dropped), HTTP/2,
//! client certificates, RBAC, and the initial delay of real bookmarks (they
//! come every [`MockApiConfig::bookmark_interval`]).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::serve::ListenerExt;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::objects::Objects;
use crate::store::{Key, Store};

mod base64;
mod custom;
mod error;
mod http;
mod objects;
mod pod;
mod refusal;
mod selector;
mod store;
mod tls;
mod watch;

pub use base64::encode as base64_encode;
pub use error::MockK8sError;
pub use pod::{Pod, ResourceVersion};

/// What the handlers share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) store: Arc<Store>,
    pub(crate) objects: Objects,
    pub(crate) token: Option<String>,
    pub(crate) bookmark_interval: Duration,
    pub(crate) requests: Mutex<VecDeque<String>>,
    pub(crate) lists: AtomicUsize,
}

/// How often a watch that allows bookmarks gets one, by default.
pub const DEFAULT_BOOKMARK_INTERVAL: Duration = Duration::from_secs(1);

/// Changes kept for watches to start from, by default.
pub const DEFAULT_HISTORY_LIMIT: usize = 1000;

/// Changes buffered per watch before it is closed as too slow.
const WATCH_BUFFER: usize = 1024;

/// How the mock API server behaves.
#[derive(Debug, Clone)]
pub struct MockApiConfig {
    /// Require `Authorization: Bearer <token>` on every request.
    pub token: Option<String>,
    /// Serve HTTPS with a CA made at spawn.
    pub tls: bool,
    /// How often a watch with `allowWatchBookmarks=true` gets a `BOOKMARK`
    /// (zero: never).
    pub bookmark_interval: Duration,
    /// Changes kept for watches from a version (older ones answer 410).
    pub history_limit: usize,
}

/// A running mock API server on `127.0.0.1`. Dropping it stops serving and
/// ends every watch.
#[derive(Debug)]
pub struct MockApiServer {
    addr: SocketAddr,
    ca_pem: Option<String>,
    token: Option<String>,
    shared: Arc<Shared>,
    cancel: CancellationToken,
}

// === impl MockApiConfig ===

impl Default for MockApiConfig {
    fn default() -> Self {
        Self {
            token: None,
            tls: false,
            bookmark_interval: DEFAULT_BOOKMARK_INTERVAL,
            history_limit: DEFAULT_HISTORY_LIMIT,
        }
    }
}

// === impl MockApiServer ===

impl MockApiServer {
    /// Binds `127.0.0.1:0` and serves until dropped. Must run in a Tokio runtime.
    pub async fn spawn(config: MockApiConfig) -> Result<Self, MockK8sError> {
        let cancel = CancellationToken::new();
        let shared = Arc::new(Shared {
            store: Arc::new(Store::new(config.history_limit, WATCH_BUFFER, cancel.clone())),
            objects: Objects::new(config.history_limit, cancel.clone()),
            token: config.token.clone(),
            bookmark_interval: config.bookmark_interval,
            requests: Mutex::new(VecDeque::new()),
            lists: AtomicUsize::new(0),
        });
        let tcp = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.map_err(MockK8sError::Bind)?;
        let addr = tcp.local_addr().map_err(MockK8sError::Bind)?;
        let app = http::router(shared.clone());
        let stop = cancel.clone().cancelled_owned();
        let ca_pem = if config.tls {
            let pki = tls::Pki::generate()?;
            let listener = tls::TlsListener::spawn(tcp, pki.config, cancel.clone()).map_err(MockK8sError::Bind)?;
            tokio::spawn(async move {
                let served = axum::serve(listener, app).with_graceful_shutdown(stop).await;
                debug!(result = ?served, "mock API server (https) stopped");
            });
            Some(pki.ca_pem)
        } else {
            // Events are small writes: send each at once.
            let listener = tcp.tap_io(|s| {
                let _ = s.set_nodelay(true);
            });
            tokio::spawn(async move {
                let served = axum::serve(listener, app).with_graceful_shutdown(stop).await;
                debug!(result = ?served, "mock API server (http) stopped");
            });
            None
        };
        info!(%addr, tls = config.tls, "mock Kubernetes API server listening");
        Ok(Self { addr, ca_pem, token: config.token, shared, cancel })
    }

    /// `http://127.0.0.1:PORT`, or `https://` with TLS.
    pub fn url(&self) -> String {
        let scheme = if self.ca_pem.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The CA certificate (PEM) that signed the server's, with TLS on.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// A kubeconfig (YAML) for this server: its URL, the CA as
    /// `certificate-authority-data` with TLS, the token if any, and
    /// `namespace` as the context's namespace.
    pub fn kubeconfig(&self, namespace: &str) -> String {
        let ca = self.ca_pem.as_deref().map(|pem| base64_encode(pem.as_bytes()));
        let ca = ca.map(|b64| format!("    certificate-authority-data: {b64}\n")).unwrap_or_default();
        let user = match &self.token {
            Some(token) => format!("  user:\n    token: {token}\n"),
            None => "  user: {}\n".to_owned(),
        };
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: mock\n  cluster:\n    server: {url}\n{ca}\
             contexts:\n- name: mock\n  context:\n    cluster: mock\n    user: mock\n    namespace: {namespace}\n\
             current-context: mock\nusers:\n- name: mock\n{user}",
            url = self.url(),
        )
    }

    /// Creates `pod` (`ADDED`) or replaces the one of that name (`MODIFIED`,
    /// nothing if equal; a pending deletion stays). The version it now has.
    pub fn upsert_pod(&self, pod: Pod) -> ResourceVersion {
        ResourceVersion(self.shared.store.upsert(pod))
    }

    /// Changes a pod with `f` (a rename is ignored): `MODIFIED`. `None` when absent.
    pub fn update_pod(&self, namespace: &str, name: &str, f: impl FnOnce(Pod) -> Pod) -> Option<ResourceVersion> {
        self.shared.store.update(&key(namespace, name), f).map(ResourceVersion)
    }

    /// Sets the `Ready` and `ContainersReady` conditions: `MODIFIED`.
    pub fn set_ready(&self, namespace: &str, name: &str, ready: bool) -> Option<ResourceVersion> {
        self.update_pod(namespace, name, |p| p.ready(ready))
    }

    /// Sets `status.phase`: `MODIFIED`.
    pub fn set_phase(&self, namespace: &str, name: &str, phase: &str) -> Option<ResourceVersion> {
        self.update_pod(namespace, name, |p| p.phase(phase))
    }

    /// Sets `status.podIP`: `MODIFIED`.
    pub fn set_ip(&self, namespace: &str, name: &str, ip: &str) -> Option<ResourceVersion> {
        self.update_pod(namespace, name, |p| p.ip(ip))
    }

    /// Replaces every label: `MODIFIED` (to a selecting watcher, `ADDED` or
    /// `DELETED` when it starts or stops matching).
    pub fn set_labels<K: Into<String>, V: Into<String>>(
        &self,
        namespace: &str,
        name: &str,
        labels: impl IntoIterator<Item = (K, V)>,
    ) -> Option<ResourceVersion> {
        self.update_pod(namespace, name, |p| p.labels(labels))
    }

    /// Sets `metadata.deletionTimestamp` (graceful deletion begins; the pod
    /// stays until [`Self::delete_pod`]): `MODIFIED`.
    pub fn start_deleting(&self, namespace: &str, name: &str) -> Option<ResourceVersion> {
        self.shared.store.start_deleting(&key(namespace, name)).map(ResourceVersion)
    }

    /// Removes a pod: `DELETED`, carrying its last state.
    pub fn delete_pod(&self, namespace: &str, name: &str) -> Option<ResourceVersion> {
        self.shared.store.delete(&key(namespace, name)).map(ResourceVersion)
    }

    /// A pod as it is now.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.shared.store.get(&key(namespace, name))
    }

    /// The current resource version (what a list answers now).
    pub fn resource_version(&self) -> ResourceVersion {
        ResourceVersion(self.shared.store.rv())
    }

    /// Cuts every open watch: each connection closes without a final event
    /// or chunk, as when the API server restarts.
    pub fn drop_watches(&self) {
        self.shared.store.drop_watches();
        self.shared.objects.drop_watches();
    }

    /// Creates a custom object (`ADDED`) of `api_version` (`group/version`),
    /// `plural` and `kind` in `namespace`, or replaces the one of that name but
    /// its status (`MODIFIED`; `metadata.generation` bumped when it changed).
    /// `object` holds `spec` (and labels, annotations under `metadata` if any).
    pub fn put_object(
        &self,
        api_version: &str,
        plural: &str,
        kind: &str,
        namespace: &str,
        name: &str,
        object: serde_json::Value,
    ) -> ResourceVersion {
        let c = (api_version.to_owned(), plural.to_owned(), namespace.to_owned());
        ResourceVersion(self.shared.objects.put(c, kind, name, object))
    }

    /// Removes a custom object: `DELETED`. `None` when absent.
    pub fn delete_object(
        &self,
        api_version: &str,
        plural: &str,
        namespace: &str,
        name: &str,
    ) -> Option<ResourceVersion> {
        let c = (api_version.to_owned(), plural.to_owned(), namespace.to_owned());
        self.shared.objects.delete(c, name).map(ResourceVersion)
    }

    /// A custom object as it is now (its status as last patched).
    pub fn object(&self, api_version: &str, plural: &str, namespace: &str, name: &str) -> Option<serde_json::Value> {
        let c = (api_version.to_owned(), plural.to_owned(), namespace.to_owned());
        self.shared.objects.get(&c, name)
    }

    /// Waits until the custom object satisfies `ready` (checked at each change
    /// of any custom object); its state then, or `None` at the deadline.
    pub async fn wait_object(
        &self,
        (api_version, plural, namespace, name): (&str, &str, &str, &str),
        deadline: Duration,
        ready: impl Fn(&serde_json::Value) -> bool,
    ) -> Option<serde_json::Value> {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let rv = self.shared.objects.rv();
            if let Some(o) = self.object(api_version, plural, namespace, name).filter(|o| ready(o)) {
                return Some(o);
            }
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() || !self.shared.objects.changed_after(rv, left).await {
                return None;
            }
        }
    }

    /// Forgets the whole history: a watch from an older version then gets
    /// the 410 `ERROR` event, an older `continue` token a 410 answer. Lists work.
    pub fn compact(&self) {
        self.shared.store.compact();
    }

    /// How many watch streams are open.
    pub fn watches_open(&self) -> usize {
        self.shared.store.watches_open()
    }

    /// Waits until exactly `n` watches are open; `false` if `deadline` passes first.
    pub async fn wait_for_watches(&self, n: usize, deadline: Duration) -> bool {
        let mut open = self.shared.store.open_watches();
        tokio::time::timeout(deadline, open.wait_for(|&now| now == n)).await.is_ok_and(|r| r.is_ok())
    }

    /// Every request (`METHOD /path?query`, the query as sent), the last 1000.
    pub fn requests(&self) -> Vec<String> {
        self.shared.requests.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect()
    }

    /// How many list (not watch) requests were answered past authentication.
    pub fn lists(&self) -> usize {
        self.shared.lists.load(Ordering::SeqCst)
    }

    /// Stops serving and ends every watch (also done on drop).
    pub fn shutdown(&self) {
        self.cancel.cancel();
    }
}

impl Drop for MockApiServer {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

fn key(namespace: &str, name: &str) -> Key {
    (namespace.to_owned(), name.to_owned())
}
