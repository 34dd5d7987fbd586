//! Custom objects: any namespaced resource under
//! `/apis/{group}/{version}/namespaces/{ns}/{plural}` (an `InferencePool`, an
//! `InferenceObjective`, the router's `RoutingConfig`), stored as JSON with
//! the metadata the API server keeps (`resourceVersion`, `generation` bumped
//! when anything but `status` changes, `uid`, `creationTimestamp`). Owns their
//! state, their change history and the watches on them: list (with a
//! `metadata.name` field selector), watch from a version or from now, get one,
//! and the `status` subresource's merge patch (RFC 7386; only `status` is
//! taken from it, as the real server does). Versions come from one counter of
//! their own (pods have theirs): clients treat versions as opaque strings.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::refusal::Refusal;

/// Changes buffered per watch before it is closed as too slow.
const WATCH_BUFFER: usize = 256;

/// One resource type in one namespace: `(group/version, plural, namespace)`.
pub(crate) type Collection = (String, String, String);

/// One change of one object, as watches see it.
#[derive(Debug, Clone)]
pub(crate) struct ObjectChange {
    rv: u64,
    collection: Collection,
    kind: &'static str,
    object: Value,
}

#[derive(Debug)]
struct Inner {
    rv: u64,
    items: BTreeMap<(Collection, String), Value>,
    history: VecDeque<ObjectChange>,
    /// Cancelled by `drop_watches` (then replaced).
    abort: CancellationToken,
}

/// Every custom object, and their watchers.
#[derive(Debug)]
pub(crate) struct Objects {
    inner: Mutex<Inner>,
    changes: broadcast::Sender<ObjectChange>,
    history_limit: usize,
    shutdown: CancellationToken,
}

/// Where a watch starts.
#[derive(Debug)]
pub(crate) enum Start {
    /// The current objects, as synthetic `ADDED` events.
    Now,
    /// The changes after this version.
    After(u64),
}

/// A name restriction (`fieldSelector=metadata.name=NAME`).
pub(crate) fn name_selector(field_selector: Option<&str>) -> Result<Option<String>, Refusal> {
    let Some(fs) = field_selector.filter(|s| !s.is_empty()) else { return Ok(None) };
    let mut name = None;
    for term in fs.split(',') {
        let (field, value) = term
            .split_once("==")
            .or_else(|| term.split_once('='))
            .ok_or_else(|| Refusal::BadRequest(format!("invalid field selector: {term:?}")))?;
        match field.trim() {
            "metadata.name" => name = Some(value.trim().to_owned()),
            // Each collection is one namespace already.
            "metadata.namespace" => {}
            other => {
                return Err(Refusal::BadRequest(format!(
                    "\"{other}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
                )));
            }
        }
    }
    Ok(name)
}

/// RFC 7386 JSON merge patch of `patch` into `target`.
pub(crate) fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let Value::Object(t) = target else { return };
    for (k, v) in fields {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

// === impl Objects ===

impl Objects {
    pub(crate) fn new(history_limit: usize, shutdown: CancellationToken) -> Self {
        let (changes, _) = broadcast::channel(WATCH_BUFFER);
        let inner = Inner { rv: 0, items: BTreeMap::new(), history: VecDeque::new(), abort: shutdown.child_token() };
        Self { inner: Mutex::new(inner), changes, history_limit, shutdown }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates the object (`ADDED`) or replaces all of it but `status` and
    /// its server-kept metadata (`MODIFIED`, `generation` bumped when it changed).
    pub(crate) fn put(&self, c: Collection, kind: &str, name: &str, mut object: Value) -> u64 {
        let mut inner = self.lock();
        inner.rv += 1;
        let rv = inner.rv;
        let key = (c.clone(), name.to_owned());
        let old = inner.items.get(&key).cloned();
        if !object.is_object() {
            object = json!({});
        }
        object["apiVersion"] = json!(c.0);
        object["kind"] = json!(kind);
        object["metadata"]["name"] = json!(name);
        object["metadata"]["namespace"] = json!(c.2);
        let kind = match &old {
            None => {
                object["metadata"]["generation"] = json!(1);
                object["metadata"]["uid"] = json!(format!("00000000-0000-4000-8000-{rv:012}"));
                object["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
                "ADDED"
            }
            Some(old) => {
                let spec_changed = strip(old) != strip(&object);
                let generation = old["metadata"]["generation"].as_u64().unwrap_or(1) + u64::from(spec_changed);
                object["metadata"]["generation"] = json!(generation);
                object["metadata"]["uid"] = old["metadata"]["uid"].clone();
                object["metadata"]["creationTimestamp"] = old["metadata"]["creationTimestamp"].clone();
                object["status"] = old.get("status").cloned().unwrap_or(Value::Null);
                if object["status"].is_null() {
                    object.as_object_mut().map(|o| o.remove("status"));
                }
                "MODIFIED"
            }
        };
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        inner.items.insert(key, object.clone());
        self.record(&mut inner, ObjectChange { rv, collection: c, kind, object });
        rv
    }

    /// Removes the object: `DELETED`. `None` when absent.
    pub(crate) fn delete(&self, c: Collection, name: &str) -> Option<u64> {
        let mut inner = self.lock();
        let mut object = inner.items.remove(&(c.clone(), name.to_owned()))?;
        inner.rv += 1;
        let rv = inner.rv;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.record(&mut inner, ObjectChange { rv, collection: c, kind: "DELETED", object });
        Some(rv)
    }

    /// Merge-patches the object's `status` (the status subresource): the object after.
    pub(crate) fn patch_status(&self, c: Collection, name: &str, patch: &Value) -> Option<Value> {
        let mut inner = self.lock();
        let key = (c.clone(), name.to_owned());
        let mut object = inner.items.get(&key)?.clone();
        let mut status = object.get("status").cloned().unwrap_or(Value::Null);
        if let Some(p) = patch.get("status") {
            merge(&mut status, p);
        }
        if status == object.get("status").cloned().unwrap_or(Value::Null) {
            return Some(object);
        }
        inner.rv += 1;
        let rv = inner.rv;
        object["status"] = status;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        inner.items.insert(key, object.clone());
        self.record(&mut inner, ObjectChange { rv, collection: c, kind: "MODIFIED", object: object.clone() });
        Some(object)
    }

    fn record(&self, inner: &mut Inner, change: ObjectChange) {
        if inner.history.len() == self.history_limit.max(1) {
            inner.history.pop_front();
        }
        inner.history.push_back(change.clone());
        let _ = self.changes.send(change);
    }

    /// One object as it is now.
    pub(crate) fn get(&self, c: &Collection, name: &str) -> Option<Value> {
        self.lock().items.get(&(c.clone(), name.to_owned())).cloned()
    }

    /// The collection's objects (only `name` when given) and the current version.
    pub(crate) fn list(&self, c: &Collection, name: Option<&str>) -> (Vec<Value>, u64) {
        let inner = self.lock();
        let items = inner
            .items
            .iter()
            .filter(|((col, n), _)| col == c && name.is_none_or(|want| want == n))
            .map(|(_, v)| v.clone())
            .collect();
        (items, inner.rv)
    }

    /// Cuts every open watch of custom objects.
    pub(crate) fn drop_watches(&self) {
        let mut inner = self.lock();
        inner.abort.cancel();
        inner.abort = self.shutdown.child_token();
    }

    /// A watch's body: the changes of `c` (only `name`'s when given) from `start`,
    /// ended after `timeout`, cut by `drop_watches`; a version older than the
    /// history gets one `ERROR` event (410 `Expired`) in the 200 stream.
    pub(crate) fn watch(&self, c: Collection, name: Option<String>, start: Start, timeout: Option<Duration>) -> Body {
        let inner = self.lock();
        let mut rx = self.changes.subscribe();
        let abort = inner.abort.clone();
        let wanted = move |ch: &ObjectChange| {
            ch.collection == c && name.as_deref().is_none_or(|n| ch.object["metadata"]["name"] == n)
        };
        let mut first: Vec<Bytes> = Vec::new();
        let mut seen = inner.rv;
        match start {
            Start::Now => {
                for ((col, _), v) in &inner.items {
                    let ch = ObjectChange { rv: 0, collection: col.clone(), kind: "ADDED", object: v.clone() };
                    if wanted(&ch) {
                        first.push(line(&ch));
                    }
                }
            }
            Start::After(rv) => {
                let oldest = inner.history.front().map_or(inner.rv, |h| h.rv.saturating_sub(1));
                if rv < oldest {
                    let status = Refusal::Expired { requested: rv, oldest, continued: false }.status();
                    let event = Bytes::from(format!("{}\n", json!({"type": "ERROR", "object": status})));
                    return Body::from_stream(futures_util::stream::once(
                        async move { Ok::<_, std::io::Error>(event) },
                    ));
                }
                first.extend(inner.history.iter().filter(|h| h.rv > rv && wanted(h)).map(line));
            }
        }
        drop(inner);
        let (tx, mut out) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(WATCH_BUFFER);
        tokio::spawn(async move {
            for event in first {
                if tx.send(Ok(event)).await.is_err() {
                    return;
                }
            }
            let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
            loop {
                let change = tokio::select! {
                    biased;
                    () = abort.cancelled() => {
                        let _ = tx.try_send(Err(std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "watch dropped")));
                        return;
                    }
                    () = tx.closed() => return,
                    () = until(deadline) => return,
                    change = rx.recv() => change,
                };
                match change {
                    Ok(ch) if ch.rv > seen && wanted(&ch) => {
                        seen = ch.rv;
                        if tx.send(Ok(line(&ch))).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    // Fell behind: the response ends cleanly and the client lists again.
                    Err(_) => return,
                }
            }
        });
        Body::from_stream(futures_util::stream::poll_fn(move |cx| out.poll_recv(cx)))
    }

    /// Waits for a change (any object) after version `rv`; `false` at the deadline.
    pub(crate) async fn changed_after(&self, rv: u64, deadline: Duration) -> bool {
        let mut rx = self.changes.subscribe();
        if self.lock().rv > rv {
            return true;
        }
        tokio::time::timeout(deadline, async {
            loop {
                match rx.recv().await {
                    Ok(ch) if ch.rv > rv => return true,
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => return true,
                    Err(broadcast::error::RecvError::Closed) => return false,
                }
            }
        })
        .await
        .unwrap_or(false)
    }

    /// The current version.
    pub(crate) fn rv(&self) -> u64 {
        self.lock().rv
    }
}

/// The object without what the server keeps itself (what `generation` counts changes of).
fn strip(object: &Value) -> Value {
    let mut o = object.clone();
    if let Some(map) = o.as_object_mut() {
        map.remove("status");
        map.remove("metadata");
    }
    json!({"body": o, "labels": object["metadata"]["labels"], "annotations": object["metadata"]["annotations"]})
}

fn line(change: &ObjectChange) -> Bytes {
    let mut bytes = serde_json::to_vec(&json!({"type": change.kind, "object": change.object})).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col() -> Collection {
        ("example.io/v1".into(), "things".into(), "ns".into())
    }

    #[test]
    fn generation_counts_spec_changes_and_status_patches_keep_it() {
        let o = Objects::new(10, CancellationToken::new());
        o.put(col(), "Thing", "a", json!({"spec": {"x": 1}}));
        o.put(col(), "Thing", "a", json!({"spec": {"x": 1}}));
        assert_eq!(o.get(&col(), "a").unwrap()["metadata"]["generation"], 1, "same spec: same generation");
        let patched = o.patch_status(col(), "a", &json!({"status": {"ok": true}, "spec": {"x": 9}})).unwrap();
        assert_eq!((patched["spec"]["x"].clone(), patched["status"]["ok"].clone()), (json!(1), json!(true)));
        o.put(col(), "Thing", "a", json!({"spec": {"x": 2}}));
        let now = o.get(&col(), "a").unwrap();
        assert_eq!(now["metadata"]["generation"], 2);
        assert_eq!(now["status"]["ok"], true, "a spec update keeps the status");
        assert_eq!(o.list(&col(), Some("b")).0.len(), 0);
        assert_eq!(o.list(&col(), None).0.len(), 1);
    }

    #[test]
    fn merge_patch_is_rfc_7386() {
        let mut t = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge(&mut t, &json!({"a": "z", "c": {"f": null}}));
        assert_eq!(t, json!({"a": "z", "c": {"d": "e"}}));
        merge(&mut t, &json!({"c": [1]}));
        assert_eq!(t["c"], json!([1]));
    }

    #[test]
    fn field_selectors_name_one_object() {
        assert_eq!(name_selector(Some("metadata.name=x")).unwrap().as_deref(), Some("x"));
        assert_eq!(name_selector(Some("metadata.name==x,metadata.namespace=ns")).unwrap().as_deref(), Some("x"));
        assert!(name_selector(Some("spec.x=1")).is_err());
        assert_eq!(name_selector(None).unwrap(), None);
    }
}
