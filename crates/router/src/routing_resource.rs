//! The routing config as a Kubernetes custom resource (`RoutingConfig`,
//! `router.sglang.ai/v1alpha1`, `deploy/crds/`): its `spec` is the routing
//! config (pools, signals, decisions, plugins). Read once at start (the pools
//! are built from it), then followed: a new generation is applied as a reload
//! is (the same checks; the pools stay as built), and the outcome written to
//! the resource's `status` (`observedGeneration` and one `Accepted`
//! condition: `True`/`Applied`, or `False`/`Invalid` with every problem (up
//! to 64 KiB of them), the config in force kept). A deleted resource keeps the config in force.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fleet::Fleet;
use fleet::k8s::api::ApiServer;
use fleet::k8s::object::{self, ObjectsRef};
use gateway::Gateway;
use serde_json::{Value, json};
use tracing::{info, warn};

/// The resource's `group/version`.
pub const API_VERSION: &str = "router.sglang.ai/v1alpha1";
/// Its plural (the URL's collection).
pub const PLURAL: &str = "routingconfigs";
/// Its kind.
pub const KIND: &str = "RoutingConfig";
/// Longest the start waits for the resource to be read.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(30);
/// Most bytes of problems written to the status message (past it, the rest are counted): a
/// resource's status shares the object's size limit (about 1.5 MB with its spec).
const MAX_PROBLEM_BYTES: usize = 64 << 10;

/// The resource a router follows, and what it put in force at start.
#[derive(Debug, Clone)]
pub struct Followed {
    /// The API server.
    pub api: ApiServer,
    /// The one resource (namespace and name).
    pub what: ObjectsRef,
    /// The version applied: `metadata.uid` and `metadata.generation`.
    pub applied: (String, u64),
}

/// What the router read of the resource at start.
#[derive(Debug)]
pub struct Fetched {
    /// Its spec as text (JSON, which the YAML reader takes).
    pub text: String,
    /// The resource, to follow.
    pub followed: Followed,
}

/// The resource `namespace/name`.
pub fn resource(namespace: &str, name: &str) -> ObjectsRef {
    ObjectsRef::new(API_VERSION, PLURAL, namespace, Some(name))
}

/// `RoutingConfig namespace/name` (what problems and logs name).
pub fn shown(what: &ObjectsRef) -> String {
    format!("{KIND} {}/{}", what.namespace, what.name.as_deref().unwrap_or_default())
}

/// Reads the resource at start, within [`FETCH_TIMEOUT`].
pub async fn fetch(api: ApiServer, what: ObjectsRef) -> Result<Fetched, String> {
    let named = shown(&what);
    let listed = tokio::time::timeout(FETCH_TIMEOUT, api.list_objects(&what))
        .await
        .map_err(|_| format!("{named}: the API server did not answer within {FETCH_TIMEOUT:?}"))?
        .map_err(|e| format!("{named}: {e}"))?;
    let object = listed.0.into_iter().next().ok_or_else(|| format!("{named}: not found"))?;
    let text = spec_text(&object).map_err(|e| format!("{named}: {e}"))?;
    let applied = version(&object);
    Ok(Fetched { text, followed: Followed { api, what, applied } })
}

/// The resource's spec as text.
fn spec_text(object: &Value) -> Result<String, String> {
    match object.get("spec") {
        Some(spec @ Value::Object(_)) => Ok(spec.to_string()),
        Some(_) => Err("its spec is not an object".into()),
        None => Err("it has no spec".into()),
    }
}

/// `metadata.uid` and `metadata.generation`.
fn version(object: &Value) -> (String, u64) {
    let uid = object.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default().to_owned();
    (uid, object.pointer("/metadata/generation").and_then(Value::as_u64).unwrap_or(0))
}

/// The status patch for generation `generation`'s outcome.
fn status_patch(generation: u64, outcome: &Result<String, Vec<String>>) -> Value {
    let (status, reason, message) = match outcome {
        Ok(what) => ("True", "Applied", what.clone()),
        Err(problems) => {
            let mut message = String::from("refused, the config in force kept: ");
            for (i, p) in problems.iter().enumerate() {
                if message.len() + p.len() > MAX_PROBLEM_BYTES {
                    message.push_str(&format!("; and {} more", problems.len() - i));
                    break;
                }
                if i > 0 {
                    message.push_str("; ");
                }
                message.push_str(p);
            }
            ("False", "Invalid", message)
        }
    };
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let now = renderer::strftime("%Y-%m-%dT%H:%M:%SZ", i64::try_from(secs).unwrap_or(0));
    json!({"status": {
        "observedGeneration": generation,
        "conditions": [{
            "type": "Accepted",
            "status": status,
            "reason": reason,
            "message": message,
            "observedGeneration": generation,
            "lastTransitionTime": now,
        }],
    }})
}

/// Writes an outcome to the resource's status (a failure is logged: the config in force stands).
async fn report(f: &Followed, generation: u64, outcome: &Result<String, Vec<String>>) {
    let name = f.what.name.as_deref().unwrap_or_default();
    if let Err(e) = f.api.patch_status(&f.what, name, &status_patch(generation, outcome)).await {
        warn!(resource = %shown(&f.what), error = %e, "routing config: its status could not be written");
    }
}

/// Follows the resource until the fleet stops: reports the start's outcome,
/// then applies each new version.
pub fn spawn(gw: Arc<Gateway>, fleet: &Arc<Fleet>, followed: Followed) {
    let mut rx = object::follow(fleet, followed.api.clone(), followed.what.clone());
    fleet.spawn_until_stopped(async move {
        let named = shown(&followed.what);
        let name = followed.what.name.clone().unwrap_or_default();
        let mut applied = followed.applied.clone();
        report(&followed, applied.1, &Ok("in force since the router started".to_owned())).await;
        let mut gone = false;
        loop {
            if rx.changed().await.is_err() {
                return;
            }
            let Some(objects) = rx.borrow_and_update().clone() else { continue };
            let Some(object) = objects.get(&name) else {
                if !gone {
                    warn!(resource = %named, "routing config: the resource was deleted; the config in force is kept");
                }
                gone = true;
                continue;
            };
            gone = false;
            let now = version(object);
            if now == applied {
                continue; // a status write, or nothing new
            }
            let outcome = match spec_text(object) {
                Ok(text) => gateway::pools::apply(&gw, text, named.clone())
                    .await
                    .map(|r| format!("applied: {} decisions, {} signals", r.decisions, r.signals)),
                Err(e) => Err(vec![format!("{named}: {e}")]),
            };
            match &outcome {
                Ok(what) => info!(resource = %named, generation = now.1, "routing config: {what}"),
                Err(p) => warn!(resource = %named, generation = now.1, problems = %p.join("; "), "routing config: refused, the config in force is kept"),
            }
            report(&followed, now.1, &outcome).await;
            applied = now;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_lists_every_problem_within_its_bound() {
        let condition =
            |outcome: &Result<String, Vec<String>>| status_patch(7, outcome)["status"]["conditions"][0].clone();
        let ok = condition(&Ok("applied".into()));
        assert_eq!(
            (ok["status"].as_str(), ok["reason"].as_str(), ok["observedGeneration"].as_u64()),
            (Some("True"), Some("Applied"), Some(7))
        );
        let problems: Vec<String> = (0..30).map(|i| format!("problem {i}")).collect();
        let refused = condition(&Err(problems));
        assert_eq!((refused["status"].as_str(), refused["reason"].as_str()), (Some("False"), Some("Invalid")));
        let message = refused["message"].as_str().unwrap();
        assert!(message.contains("problem 0; problem 1") && message.ends_with("problem 29"), "every one: {message}");
        let long: Vec<String> = (0..100).map(|i| format!("{i}: {}", "x".repeat(1000))).collect();
        let message = condition(&Err(long))["message"].as_str().unwrap().to_owned();
        assert!(message.len() <= MAX_PROBLEM_BYTES + 32, "{}", message.len());
        assert!(message.ends_with(" more"), "the rest counted: {}", &message[message.len() - 40..]);
    }
}
