//! Custom objects read from the Kubernetes API server (a Gateway API Inference
//! Extension `InferencePool` or `InferenceObjective`, the router's own
//! `RoutingConfig`): list, watch, get one, and a merge patch of an object's
//! `status`; and [`follow`], one task that keeps the objects of a collection
//! (or the one of a name) as they are, with the same list-then-watch loop,
//! resume, relist on expiry and backoff as pod discovery. What an object means
//! is its reader's business: this module hands over JSON.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::api::{ApiServer, K8sError, LIST_TIMEOUT, WATCH_IDLE_GRACE, WATCH_TIMEOUT, Watch, encode, read_body};
use super::pod::Status;
use super::{BACKOFF_INITIAL, BACKOFF_MAX};
use crate::Fleet;

/// Most objects one followed collection keeps (more are skipped and counted).
pub const MAX_OBJECTS: usize = 1024;

/// Which objects: a resource type in one namespace, all of it or one name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectsRef {
    /// `group/version` (`inference.networking.k8s.io/v1`).
    pub api_version: String,
    /// The resource's plural (`inferencepools`).
    pub plural: String,
    /// The namespace.
    pub namespace: String,
    /// One object's name (a `metadata.name` field selector), or every object.
    pub name: Option<String>,
}

/// The objects followed now, by name; `None` until the first list.
pub type Followed = Option<Arc<BTreeMap<String, Value>>>;

/// What the object followers counted (all of them together).
#[derive(Debug, Default)]
pub struct ObjectMetrics {
    /// Lists done.
    pub lists: AtomicU64,
    /// Watch events applied.
    pub events: AtomicU64,
    /// Lists and watches that failed, unreadable events, objects over the bound.
    pub failures: AtomicU64,
}

/// One watch event on custom objects.
#[derive(Debug)]
enum ObjectEvent {
    Applied(Value),
    Deleted(Value),
    Bookmark(String),
    Error(Status),
}

// === impl ObjectsRef ===

impl ObjectsRef {
    /// Every object of `plural` (`group/version`) in `namespace`, or the one named `name`.
    pub fn new(api_version: &str, plural: &str, namespace: &str, name: Option<&str>) -> Self {
        Self {
            api_version: api_version.to_owned(),
            plural: plural.to_owned(),
            namespace: namespace.to_owned(),
            name: name.map(str::to_owned),
        }
    }

    /// `namespace/name` or `namespace/*`, and the resource (for logs and problems).
    pub fn shown(&self) -> String {
        format!("{}.{} {}/{}", self.plural, self.api_version, self.namespace, self.name.as_deref().unwrap_or("*"))
    }

    fn collection_url(&self, api: &ApiServer) -> String {
        format!(
            "{}/apis/{}/namespaces/{}/{}",
            api.base_url(),
            self.api_version,
            encode(&self.namespace),
            encode(&self.plural)
        )
    }

    fn query(&self) -> String {
        self.name
            .as_deref()
            .map_or_else(String::new, |n| format!("fieldSelector={}&", encode(&format!("metadata.name={n}"))))
    }
}

// === impl ApiServer (objects) ===

impl ApiServer {
    /// The objects `what` names and the list's resource version.
    pub async fn list_objects(&self, what: &ObjectsRef) -> Result<(Vec<Value>, String), K8sError> {
        #[derive(Deserialize)]
        struct List {
            #[serde(default)]
            metadata: Value,
            #[serde(default)]
            items: Vec<Value>,
        }
        let url = format!("{}?{}limit={MAX_OBJECTS}", what.collection_url(self), what.query());
        let req = self.request_with(reqwest::Method::GET, url)?.timeout(LIST_TIMEOUT);
        let response = req.send().await.map_err(|e| K8sError::Http(e.to_string()))?;
        let body = read_body(response).await?;
        let list: List =
            serde_json::from_slice(&body).map_err(|e| K8sError::Decode(format!("{} list: {e}", what.shown())))?;
        if list.metadata.get("continue").and_then(Value::as_str).is_some_and(|c| !c.is_empty()) {
            return Err(K8sError::Decode(format!("more than {MAX_OBJECTS} objects in {}", what.shown())));
        }
        let rv = list.metadata.get("resourceVersion").and_then(Value::as_str).unwrap_or_default().to_owned();
        Ok((list.items, rv))
    }

    /// Watches the objects `what` names after `resource_version`.
    pub async fn watch_objects(&self, what: &ObjectsRef, resource_version: &str) -> Result<Watch, K8sError> {
        let url = format!(
            "{}?{}watch=1&allowWatchBookmarks=true&resourceVersion={}&timeoutSeconds={}",
            what.collection_url(self),
            what.query(),
            encode(resource_version),
            WATCH_TIMEOUT.as_secs()
        );
        let response =
            self.request_with(reqwest::Method::GET, url)?.send().await.map_err(|e| K8sError::Http(e.to_string()))?;
        if !response.status().is_success() {
            return Err(super::api::status_error(response).await);
        }
        Ok(Watch { response, buf: Vec::new(), idle: WATCH_TIMEOUT + WATCH_IDLE_GRACE })
    }

    /// Merge-patches the `status` of the object `name` of `what`'s collection
    /// (`patch` is the whole patch: `{"status": {...}}`).
    pub async fn patch_status(&self, what: &ObjectsRef, name: &str, patch: &Value) -> Result<(), K8sError> {
        let url = format!("{}/{}/status", what.collection_url(self), encode(name));
        let req = self
            .request_with(reqwest::Method::PATCH, url)?
            .header(reqwest::header::CONTENT_TYPE, "application/merge-patch+json")
            .body(patch.to_string())
            .timeout(LIST_TIMEOUT);
        let response = req.send().await.map_err(|e| K8sError::Http(e.to_string()))?;
        read_body(response).await.map(drop)
    }
}

// === impl ObjectEvent ===

impl ObjectEvent {
    fn parse(line: &[u8]) -> Result<Self, String> {
        let e = super::pod::Envelope::parse(line)?;
        match e.kind.as_str() {
            "ADDED" | "MODIFIED" => Ok(Self::Applied(e.object)),
            "DELETED" => Ok(Self::Deleted(e.object)),
            "BOOKMARK" => Ok(Self::Bookmark(resource_version(&e.object).to_owned())),
            "ERROR" => serde_json::from_value(e.object).map(Self::Error).map_err(|e| format!("error event: {e}")),
            other => Err(format!("unknown watch event type {other:?}")),
        }
    }
}

fn resource_version(object: &Value) -> &str {
    object.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or_default()
}

fn name_of(object: &Value) -> Option<&str> {
    object.pointer("/metadata/name").and_then(Value::as_str)
}

/// Follows the objects `what` names until the fleet stops: the receiver sees
/// them after every list and every change (`None` until the first list).
pub fn follow(fleet: &Arc<Fleet>, api: ApiServer, what: ObjectsRef) -> watch::Receiver<Followed> {
    let (tx, rx) = watch::channel(None);
    let follower = Follower { fleet: fleet.clone(), api, what, tx, backoff: BACKOFF_INITIAL };
    fleet.tasks.spawn(follower.run());
    rx
}

struct Follower {
    fleet: Arc<Fleet>,
    api: ApiServer,
    what: ObjectsRef,
    tx: watch::Sender<Followed>,
    backoff: Duration,
}

impl Follower {
    fn metrics(&self) -> &ObjectMetrics {
        &self.fleet.metrics.discovery.objects
    }

    fn fail(&self, error: &dyn std::fmt::Display, what: &str) {
        self.metrics().failures.fetch_add(1, Ordering::Relaxed);
        warn!(objects = %self.what.shown(), %error, backoff = ?self.backoff, "k8s objects: {what}");
    }

    async fn back_off(&mut self) -> bool {
        let wait = self.backoff;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        tokio::select! {
            biased;
            () = self.fleet.cancel.cancelled() => false,
            () = tokio::time::sleep(wait) => true,
        }
    }

    /// Keeps `objects` under the bound: an object past it is skipped and counted.
    fn insert(&self, objects: &mut BTreeMap<String, Value>, object: Value) {
        let Some(name) = name_of(&object).map(str::to_owned) else {
            self.fail(&"an object without metadata.name", "skipped");
            return;
        };
        if objects.len() >= MAX_OBJECTS && !objects.contains_key(&name) {
            self.fail(&format!("over {MAX_OBJECTS} objects"), "skipped");
            return;
        }
        objects.insert(name, object);
    }

    async fn run(mut self) {
        let cancel = self.fleet.cancel.clone();
        'list: loop {
            let listed = tokio::select! {
                biased;
                () = cancel.cancelled() => break 'list,
                l = self.api.list_objects(&self.what) => l,
            };
            let (items, mut rv) = match listed {
                Ok(l) => l,
                Err(e) => {
                    self.fail(&e, "list failed");
                    if !self.back_off().await {
                        break;
                    }
                    continue;
                }
            };
            self.metrics().lists.fetch_add(1, Ordering::Relaxed);
            let mut objects = BTreeMap::new();
            for o in items {
                self.insert(&mut objects, o);
            }
            info!(objects = %self.what.shown(), found = objects.len(), "k8s objects: listed");
            self.tx.send_replace(Some(Arc::new(objects.clone())));
            loop {
                let opened = tokio::select! {
                    biased;
                    () = cancel.cancelled() => break 'list,
                    w = self.api.watch_objects(&self.what, &rv) => w,
                };
                let mut watch = match opened {
                    Ok(w) => w,
                    Err(K8sError::Status { code: 410, .. }) => continue 'list,
                    Err(e) => {
                        self.fail(&e, "watch failed");
                        if !self.back_off().await {
                            break 'list;
                        }
                        continue 'list;
                    }
                };
                let mut events = 0u64;
                loop {
                    let next = tokio::select! {
                        biased;
                        () = cancel.cancelled() => break 'list,
                        l = watch.next_line() => l,
                    };
                    let line = match next {
                        Ok(Some(line)) => line,
                        Ok(None) => {
                            // A watch that ends at once, again and again, is backed off.
                            if events == 0 && !self.back_off().await {
                                break 'list;
                            }
                            break;
                        }
                        Err(e) => {
                            self.fail(&e, "watch dropped");
                            if !self.back_off().await {
                                break 'list;
                            }
                            continue 'list;
                        }
                    };
                    events += 1;
                    match ObjectEvent::parse(&line) {
                        Ok(ObjectEvent::Applied(o)) => {
                            rv = resource_version(&o).to_owned();
                            self.insert(&mut objects, o);
                        }
                        Ok(ObjectEvent::Deleted(o)) => {
                            rv = resource_version(&o).to_owned();
                            if let Some(name) = name_of(&o) {
                                objects.remove(name);
                            }
                        }
                        Ok(ObjectEvent::Bookmark(v)) => {
                            if !v.is_empty() {
                                rv = v;
                            }
                            continue;
                        }
                        Ok(ObjectEvent::Error(status)) => {
                            debug!(objects = %self.what.shown(), code = status.code, "k8s objects: watch error event, listing again");
                            continue 'list;
                        }
                        Err(e) => {
                            self.fail(&e, "unreadable watch event, listing again");
                            if !self.back_off().await {
                                break 'list;
                            }
                            continue 'list;
                        }
                    }
                    self.backoff = BACKOFF_INITIAL;
                    self.metrics().events.fetch_add(1, Ordering::Relaxed);
                    self.tx.send_replace(Some(Arc::new(objects.clone())));
                }
            }
        }
        debug!(objects = %self.what.shown(), "k8s objects: stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_parse() {
        let e = ObjectEvent::parse(br#"{"type":"MODIFIED","object":{"metadata":{"name":"a","resourceVersion":"7"}}}"#);
        assert!(matches!(e, Ok(ObjectEvent::Applied(o)) if resource_version(&o) == "7" && name_of(&o) == Some("a")));
        assert!(
            matches!(ObjectEvent::parse(br#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}}"#), Ok(ObjectEvent::Bookmark(v)) if v == "9")
        );
        assert!(
            matches!(ObjectEvent::parse(br#"{"type":"ERROR","object":{"code":410}}"#), Ok(ObjectEvent::Error(s)) if s.code == 410)
        );
        assert!(ObjectEvent::parse(b"{").is_err());
        assert!(ObjectEvent::parse(br#"{"type":"SOMETHING"}"#).is_err());
    }

    #[test]
    fn one_name_is_a_field_selector() {
        let r = ObjectsRef::new("g.io/v1", "things", "ns", Some("x"));
        assert_eq!(r.query(), "fieldSelector=metadata.name%3Dx&");
        assert_eq!(ObjectsRef::new("g.io/v1", "things", "ns", None).query(), "");
    }
}
