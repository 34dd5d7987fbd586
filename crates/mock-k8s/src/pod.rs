//! The pods a test puts in the mock cluster ([`Pod`], a builder), and how a
//! stored pod is written on the wire: `metadata`, `spec`, `status` shaped as
//! the real server shapes a `v1.Pod` (empty maps and unset fields left out).
//! Owns the object's JSON form only; versions and history are the store's.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

/// A resource version: the value of the server's one global counter when an
/// object last changed (the API treats it as an opaque string; it is
/// `Display`ed as the decimal number it is here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceVersion(pub u64);

/// A pod as a test describes it. [`Pod::new`] is a pod just created (phase
/// `Pending`, not ready, no IP); [`Pod::running`] one that serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) annotations: BTreeMap<String, String>,
    pub(crate) ip: Option<String>,
    pub(crate) phase: String,
    pub(crate) ready: bool,
    pub(crate) port: Option<u16>,
}

/// A pod as the server holds it: the test's description plus what the
/// server adds (its version, creation and deletion times).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredPod {
    pub(crate) pod: Pod,
    pub(crate) rv: u64,
    pub(crate) created: String,
    pub(crate) deleting: Option<String>,
}

// === impl ResourceVersion ===

impl fmt::Display for ResourceVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

// === impl Pod ===

impl Pod {
    /// A pod named `name` in `namespace`, just created: `Pending`, not ready, no IP.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            ip: None,
            phase: "Pending".into(),
            ready: false,
            port: None,
        }
    }

    /// A pod that serves: `Running`, ready, at `ip`.
    pub fn running(namespace: impl Into<String>, name: impl Into<String>, ip: impl Into<String>) -> Self {
        Self::new(namespace, name).phase("Running").ready(true).ip(ip)
    }

    /// Sets label `key` to `value`.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Replaces every label.
    pub fn labels<K: Into<String>, V: Into<String>>(mut self, labels: impl IntoIterator<Item = (K, V)>) -> Self {
        self.labels = labels.into_iter().map(|(k, v)| (k.into(), v.into())).collect();
        self
    }

    /// Removes label `key`.
    pub fn without_label(mut self, key: &str) -> Self {
        self.labels.remove(key);
        self
    }

    /// Sets annotation `key` to `value`.
    pub fn annotation(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    /// Sets `status.podIP` (and `status.podIPs`).
    pub fn ip(mut self, ip: impl Into<String>) -> Self {
        self.ip = Some(ip.into());
        self
    }

    /// Sets `status.phase` (`Pending`, `Running`, `Succeeded`, `Failed`, `Unknown`).
    pub fn phase(mut self, phase: impl Into<String>) -> Self {
        self.phase = phase.into();
        self
    }

    /// Sets the `Ready` and `ContainersReady` conditions.
    pub fn ready(mut self, ready: bool) -> Self {
        self.ready = ready;
        self
    }

    /// Declares a container port (`spec.containers[0].ports[0].containerPort`).
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// Its namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its labels.
    pub fn label_map(&self) -> &BTreeMap<String, String> {
        &self.labels
    }

    /// Its annotations.
    pub fn annotation_map(&self) -> &BTreeMap<String, String> {
        &self.annotations
    }

    /// `status.podIP`, when set.
    pub fn pod_ip(&self) -> Option<&str> {
        self.ip.as_deref()
    }

    /// `status.phase`.
    pub fn pod_phase(&self) -> &str {
        &self.phase
    }

    /// Whether the `Ready` condition is `True`.
    pub fn is_ready(&self) -> bool {
        self.ready
    }

    pub(crate) fn key(&self) -> (String, String) {
        (self.namespace.clone(), self.name.clone())
    }
}

// === impl StoredPod ===

impl StoredPod {
    /// The pod as JSON; `typed` adds `kind` and `apiVersion` (watch events
    /// carry them, list items do not).
    pub(crate) fn to_json(&self, typed: bool) -> Value {
        let p = &self.pod;
        let mut metadata = Map::new();
        metadata.insert("name".into(), json!(p.name));
        metadata.insert("namespace".into(), json!(p.namespace));
        metadata.insert("uid".into(), json!(uid(&p.namespace, &p.name)));
        metadata.insert("resourceVersion".into(), json!(self.rv.to_string()));
        metadata.insert("creationTimestamp".into(), json!(self.created));
        if let Some(at) = &self.deleting {
            metadata.insert("deletionTimestamp".into(), json!(at));
            metadata.insert("deletionGracePeriodSeconds".into(), json!(30));
        }
        if !p.labels.is_empty() {
            metadata.insert("labels".into(), json!(p.labels));
        }
        if !p.annotations.is_empty() {
            metadata.insert("annotations".into(), json!(p.annotations));
        }
        let mut container = json!({"name": "engine", "image": "mock-engine:latest"});
        if let Some(port) = p.port {
            container["ports"] = json!([{"containerPort": port, "protocol": "TCP"}]);
        }
        let truth = if p.ready { "True" } else { "False" };
        let conditions: Vec<Value> = ["Initialized", "Ready", "ContainersReady", "PodScheduled"]
            .iter()
            .map(|kind| {
                let status = if matches!(*kind, "Ready" | "ContainersReady") { truth } else { "True" };
                json!({"type": kind, "status": status, "lastProbeTime": null, "lastTransitionTime": self.created})
            })
            .collect();
        let mut status = Map::new();
        status.insert("phase".into(), json!(p.phase));
        status.insert("conditions".into(), Value::Array(conditions));
        if let Some(ip) = &p.ip {
            status.insert("hostIP".into(), json!("127.0.0.1"));
            status.insert("podIP".into(), json!(ip));
            status.insert("podIPs".into(), json!([{"ip": ip}]));
        }
        status.insert("startTime".into(), json!(self.created));
        let mut pod = Map::new();
        if typed {
            pod.insert("kind".into(), json!("Pod"));
            pod.insert("apiVersion".into(), json!("v1"));
        }
        pod.insert("metadata".into(), Value::Object(metadata));
        pod.insert("spec".into(), json!({"containers": [container], "restartPolicy": "Always"}));
        pod.insert("status".into(), Value::Object(status));
        Value::Object(pod)
    }
}

/// A UID that is the same for the same namespace and name, shaped as the
/// real server's (a version-4 UUID).
pub(crate) fn uid(namespace: &str, name: &str) -> String {
    let hash = |seed: u64| {
        let key = format!("{namespace}/{name}");
        key.bytes().fold(seed, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
    };
    let (a, b) = (hash(0xcbf2_9ce4_8422_2325), hash(0x8422_2325_cbf2_9ce4));
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0x0fff,
        0x8000 | ((b >> 48) & 0x3fff),
        b & 0xffff_ffff_ffff
    )
}

/// `now` as RFC 3339 in UTC to the second, as `metav1.Time` is written.
pub(crate) fn timestamp(now: SystemTime) -> String {
    let secs = now.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (rest / 3600, rest / 60 % 60, rest % 60);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(timestamp(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(timestamp(UNIX_EPOCH + Duration::from_secs(951_782_400)), "2000-02-29T00:00:00Z");
        assert_eq!(timestamp(UNIX_EPOCH + Duration::from_secs(1_735_689_599)), "2024-12-31T23:59:59Z");
    }

    #[test]
    fn uids_are_stable_and_distinct() {
        assert_eq!(uid("ns", "a"), uid("ns", "a"));
        assert_ne!(uid("ns", "a"), uid("ns", "b"));
        assert_ne!(uid("ns", "a"), uid("other", "a"));
        let u = uid("ns", "a");
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
    }

    #[test]
    fn a_pod_is_written_as_the_real_server_writes_it() {
        let pod = Pod::running("ns", "a", "10.0.0.1").label("app", "x").annotation("sglang.ai/bootstrap-port", "8998");
        let stored = StoredPod { pod, rv: 7, created: "2025-01-01T00:00:00Z".into(), deleting: None };
        let item = stored.to_json(false);
        assert!(item.get("kind").is_none());
        assert_eq!(item["metadata"]["resourceVersion"], "7");
        assert_eq!(item["metadata"]["labels"]["app"], "x");
        assert_eq!(item["status"]["podIP"], "10.0.0.1");
        assert_eq!(item["status"]["podIPs"][0]["ip"], "10.0.0.1");
        assert_eq!(item["spec"]["containers"][0]["name"], "engine");
        let ready = item["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Ready").unwrap();
        assert_eq!(ready["status"], "True");
        let typed = stored.to_json(true);
        assert_eq!((typed["kind"].as_str(), typed["apiVersion"].as_str()), (Some("Pod"), Some("v1")));
        let bare = StoredPod { pod: Pod::new("ns", "b"), ..stored }.to_json(false);
        assert!(bare["metadata"].get("labels").is_none() && bare["status"].get("podIP").is_none());
        assert_eq!(bare["status"]["phase"], "Pending");
    }
}
