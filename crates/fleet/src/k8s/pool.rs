//! Discovery by a Gateway API Inference Extension `InferencePool`
//! (`--pool-name`, as GIE's endpoint pickers take it): the pool's
//! `spec.selector.matchLabels` and its first `spec.targetPorts` number (v1;
//! v1alpha2's `spec.selector` and `spec.targetPortNumber` too) pick the pods.
//! The pool is followed: when its selector or port changes, the pod watch is
//! started again with the new ones, and its first list moves the fleet to the
//! pods the new selector names (those it no longer names leave). A pool that
//! is deleted or unusable keeps the workers found so far (logged and counted).
//! The pool's `InferenceObjective`s are followed too ([`objectives`]): the
//! endpoint picker gives a request the priority of the objective it names.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::Value;
use tracing::{info, warn};

use super::object::{self, ObjectsRef};
use super::{DiscoveryConfig, Watcher};

/// The Inference Extension's API group (v1).
pub const DEFAULT_POOL_GROUP: &str = "inference.networking.k8s.io";
/// Its experimental group (v1alpha2).
pub const ALPHA_POOL_GROUP: &str = "inference.networking.x-k8s.io";

/// The `InferencePool` `name` of `namespace` in `group`.
pub fn pool_ref(group: &str, namespace: &str, name: &str) -> ObjectsRef {
    let version = if group == ALPHA_POOL_GROUP { "v1alpha2" } else { "v1" };
    ObjectsRef::new(&format!("{group}/{version}"), "inferencepools", namespace, Some(name))
}

/// What a pool selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolTarget {
    /// Its label selector (`key=value,...`, keys sorted).
    pub selector: String,
    /// The port its pods serve on.
    pub port: u16,
}

/// A label key or value as Kubernetes allows them (so the selector reads back as written).
fn label_like(s: &str) -> bool {
    !s.is_empty() && s.len() <= 317 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b))
}

/// What `pool` (an `InferencePool` object) selects, or why it cannot be used.
pub fn target(pool: &Value) -> Result<PoolTarget, String> {
    let spec = pool.get("spec").ok_or("no spec")?;
    let labels = spec
        .pointer("/selector/matchLabels")
        .or_else(|| spec.get("selector").filter(|s| s.get("matchLabels").is_none()))
        .and_then(Value::as_object)
        .filter(|m| !m.is_empty())
        .ok_or("no spec.selector.matchLabels")?;
    let mut terms = Vec::with_capacity(labels.len());
    for (k, v) in labels {
        let v = v.as_str().ok_or_else(|| format!("label {k:?}: not a string"))?;
        if !label_like(k) || !(v.is_empty() || label_like(v)) {
            return Err(format!("label {k:?}={v:?}: not a valid label"));
        }
        terms.push(format!("{k}={v}"));
    }
    terms.sort();
    let port = spec
        .pointer("/targetPorts/0/number")
        .or_else(|| spec.get("targetPortNumber"))
        .and_then(Value::as_u64)
        .ok_or("no spec.targetPorts[0].number")?;
    let port = u16::try_from(port).ok().filter(|&p| p > 0).ok_or_else(|| format!("port {port}: not 1..=65535"))?;
    Ok(PoolTarget { selector: terms.join(","), port })
}

/// The `InferenceObjective`s (`inference.networking.x-k8s.io/v1alpha2`) of `pool`'s namespace
/// whose `spec.poolRef.name` is the pool, followed: name → `spec.priority` (0 when unset).
pub fn objectives(
    fleet: &Arc<crate::Fleet>,
    api: super::api::ApiServer,
    pool: &ObjectsRef,
) -> tokio::sync::watch::Receiver<Arc<HashMap<String, i64>>> {
    let what = ObjectsRef::new(&format!("{ALPHA_POOL_GROUP}/v1alpha2"), "inferenceobjectives", &pool.namespace, None);
    let mut rx = object::follow(fleet, api, what);
    let (tx, out) = tokio::sync::watch::channel(Arc::default());
    let name = pool.name.clone().unwrap_or_default();
    fleet.spawn_until_stopped(async move {
        while rx.changed().await.is_ok() {
            let objects = rx.borrow_and_update().clone().unwrap_or_default();
            let table: HashMap<String, i64> = objects
                .iter()
                .filter(|(_, o)| o.pointer("/spec/poolRef/name").and_then(Value::as_str) == Some(name.as_str()))
                .map(|(n, o)| (n.clone(), o.pointer("/spec/priority").and_then(Value::as_i64).unwrap_or(0)))
                .collect();
            info!(objectives = table.len(), "k8s discovery: the InferencePool's objectives");
            tx.send_replace(Arc::new(table));
        }
    });
    out
}

/// Runs `w`'s pod watch on what `pool` selects, started again at each change, until the fleet stops.
pub(super) async fn follow_pool(mut w: Watcher, pool: ObjectsRef) {
    let mut rx = object::follow(&w.fleet, w.api.clone(), pool.clone());
    let name = pool.name.clone().unwrap_or_default();
    let shown = pool.shown();
    let wanted = |rx: &mut tokio::sync::watch::Receiver<object::Followed>| {
        rx.borrow_and_update().as_ref().map(|m| m.get(&name).map(target))
    };
    let mut current: Option<PoolTarget> = None;
    loop {
        match wanted(&mut rx) {
            // Not listed yet.
            None => {}
            Some(None) => {
                warn!(pool = %shown, "k8s discovery: the InferencePool is absent; the workers found so far are kept")
            }
            Some(Some(Err(why))) => {
                w.metrics().skipped.fetch_add(1, Ordering::Relaxed);
                warn!(pool = %shown, %why, "k8s discovery: the InferencePool cannot be used; the workers found so far are kept");
            }
            Some(Some(Ok(t))) if current.as_ref() != Some(&t) => {
                info!(pool = %shown, selector = %t.selector, port = t.port, "k8s discovery: the InferencePool selects");
                w.watched.selector = t.selector.clone();
                w.config = Arc::new(DiscoveryConfig { port: t.port, ..(*w.config).clone() });
                current = Some(t);
                w.stop = w.fleet.cancel.child_token();
                let stop = w.stop.clone();
                let run = w.run();
                tokio::pin!(run);
                // The watch runs until the pool selects something else (or the fleet stops).
                loop {
                    tokio::select! {
                        () = &mut run => return,
                        changed = rx.changed() => {
                            if changed.is_err() {
                                return;
                            }
                            let now = rx.borrow().as_ref().and_then(|m| m.get(&name).map(target));
                            if matches!(&now, Some(Ok(t)) if current.as_ref() != Some(t)) {
                                stop.cancel();
                                (&mut run).await;
                                break;
                            }
                            // Absent or unusable: logged by the outer loop when it selects anew.
                            if let Some(Err(why)) = now {
                                warn!(pool = %shown, %why, "k8s discovery: the InferencePool cannot be used; its last selector stays");
                            }
                        }
                    }
                }
                rx.mark_changed();
            }
            Some(Some(Ok(_))) => {}
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_pool_selects_by_its_labels_and_first_port() {
        let v1 = json!({"spec": {"selector": {"matchLabels": {"model": "qwen", "app": "vllm"}}, "targetPorts": [{"number": 8000}, {"number": 8001}]}});
        assert_eq!(target(&v1), Ok(PoolTarget { selector: "app=vllm,model=qwen".into(), port: 8000 }));
        let alpha = json!({"spec": {"selector": {"app": "sglang"}, "targetPortNumber": 30000}});
        assert_eq!(target(&alpha), Ok(PoolTarget { selector: "app=sglang".into(), port: 30000 }));
        for bad in [
            json!({}),
            json!({"spec": {"selector": {"matchLabels": {}}, "targetPorts": [{"number": 1}]}}),
            json!({"spec": {"selector": {"matchLabels": {"a": "b"}}}}),
            json!({"spec": {"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": 70000}]}}),
            json!({"spec": {"selector": {"matchLabels": {"a,b": "c"}}, "targetPorts": [{"number": 1}]}}),
            json!({"spec": {"selector": {"matchLabels": {"a": "b=c"}}, "targetPorts": [{"number": 1}]}}),
        ] {
            assert!(target(&bad).is_err(), "{bad}");
        }
        assert_eq!(pool_ref(DEFAULT_POOL_GROUP, "ns", "p").api_version, "inference.networking.k8s.io/v1");
        assert_eq!(pool_ref(ALPHA_POOL_GROUP, "ns", "p").api_version, "inference.networking.x-k8s.io/v1alpha2");
    }
}
