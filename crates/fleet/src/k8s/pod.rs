//! What the discovery reads of a pod and of a watch event: the few fields of
//! the API server's JSON that decide whether a pod is a worker (Running,
//! Ready, a pod IP, not being deleted), where it listens, its role's
//! bootstrap port and its pool; and the watch event envelope (`ADDED`,
//! `MODIFIED`, `DELETED`, `BOOKMARK`, `ERROR` with a `Status`).

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Deserialize;
use serde_json::Value;

/// The pod fields discovery reads; everything else is ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Pod {
    /// Name, namespace, labels, annotations, deletion.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Phase, IP, conditions.
    #[serde(default)]
    pub status: PodStatus,
}

/// A pod's metadata (the fields read).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// Name.
    #[serde(default)]
    pub name: String,
    /// Namespace.
    #[serde(default)]
    pub namespace: String,
    /// The version of this state of the object.
    #[serde(default)]
    pub resource_version: Option<String>,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Set once the pod is being deleted (its containers are told to stop).
    #[serde(default)]
    pub deletion_timestamp: Option<String>,
}

/// A pod's status (the fields read).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    /// `Pending`, `Running`, `Succeeded`, `Failed`, `Unknown`.
    #[serde(default)]
    pub phase: Option<String>,
    /// The pod's IP, once it has one.
    #[serde(default, rename = "podIP")]
    pub pod_ip: Option<String>,
    /// Conditions (`Ready` among them).
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// One condition of a pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Condition {
    /// `Ready`, `ContainersReady`, `PodScheduled`, ...
    #[serde(rename = "type", default)]
    pub kind: String,
    /// `True`, `False`, `Unknown`.
    #[serde(default)]
    pub status: String,
}

/// The `Status` an API server sends as an `ERROR` event (or an error body).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Status {
    /// HTTP-like code: 410 means the resource version is too old (a fresh list is needed).
    #[serde(default)]
    pub code: u16,
    /// `Expired`, `Gone`, `Unauthorized`, ...
    #[serde(default)]
    pub reason: String,
    /// The server's words.
    #[serde(default)]
    pub message: String,
}

/// One event of a watch stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// A pod appeared or changed (`ADDED`, `MODIFIED`).
    Applied(Pod),
    /// A pod is gone (`DELETED`, with its last state).
    Deleted(Pod),
    /// Nothing changed up to this resource version (`BOOKMARK`).
    Bookmark(String),
    /// The server ended the watch with a status (`ERROR`; code 410: list again).
    Error(Status),
}

/// A pod that is a worker now: where it listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eligible {
    /// The pod IP.
    pub ip: IpAddr,
}

// === impl Pod ===

impl Pod {
    /// `namespace/name`: the pod's key while it lives.
    pub fn key(&self) -> String {
        format!("{}/{}", self.metadata.namespace, self.metadata.name)
    }

    /// Whether the pod has the `Ready` condition `True`.
    pub fn is_ready(&self) -> bool {
        self.status.conditions.iter().any(|c| c.kind == "Ready" && c.status == "True")
    }

    /// The pod is a worker only when Running, Ready, with a pod IP and no
    /// deletion timestamp; why not otherwise.
    pub fn eligible(&self) -> Result<Eligible, &'static str> {
        if self.metadata.deletion_timestamp.is_some() {
            return Err("being deleted");
        }
        if self.status.phase.as_deref() != Some("Running") {
            return Err("not running");
        }
        if !self.is_ready() {
            return Err("not ready");
        }
        let ip = self.status.pod_ip.as_deref().filter(|s| !s.is_empty()).ok_or("no pod IP")?;
        let ip = ip.parse::<IpAddr>().map_err(|_| "pod IP is not an IP address")?;
        Ok(Eligible { ip })
    }

    /// The bootstrap port in `annotation` (then vLLM's `vllm.ai/bootstrap-port`
    /// when that is absent): `Ok(None)` when the pod has neither.
    pub fn bootstrap_port(&self, annotation: &str) -> Result<Option<u16>, String> {
        let annotations = &self.metadata.annotations;
        let Some((key, value)) =
            [annotation, VLLM_BOOTSTRAP_ANNOTATION].into_iter().find_map(|k| annotations.get(k).map(|v| (k, v)))
        else {
            return Ok(None);
        };
        match value.trim().parse::<u16>() {
            Ok(p) if p != 0 => Ok(Some(p)),
            _ => Err(format!("annotation {key}: {value:?} is not a port")),
        }
    }
}

/// vLLM's bootstrap-port annotation, read when the configured one is absent.
pub const VLLM_BOOTSTRAP_ANNOTATION: &str = "vllm.ai/bootstrap-port";

// === impl WatchEvent ===

/// One line of a watch stream: the event's type and its object, unread.
#[derive(Deserialize)]
pub(crate) struct Envelope {
    /// `ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`, `ERROR`.
    #[serde(rename = "type")]
    pub(crate) kind: String,
    /// The object (a `Status` for `ERROR`).
    #[serde(default)]
    pub(crate) object: Value,
}

impl Envelope {
    /// Parses one line of a watch stream.
    pub(crate) fn parse(line: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(line).map_err(|e| format!("watch event: {e}"))
    }
}

impl WatchEvent {
    /// Parses one line of a watch stream.
    pub fn parse(line: &[u8]) -> Result<Self, String> {
        let e = Envelope::parse(line)?;
        let pod = |v: Value| serde_json::from_value::<Pod>(v).map_err(|e| format!("pod in watch event: {e}"));
        match e.kind.as_str() {
            "ADDED" | "MODIFIED" => Ok(Self::Applied(pod(e.object)?)),
            "DELETED" => Ok(Self::Deleted(pod(e.object)?)),
            "BOOKMARK" => {
                let rv = e.object.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or_default();
                Ok(Self::Bookmark(rv.to_owned()))
            }
            "ERROR" => {
                serde_json::from_value::<Status>(e.object).map(Self::Error).map_err(|e| format!("error event: {e}"))
            }
            other => Err(format!("unknown watch event type {other:?}")),
        }
    }

    /// The resource version this event brings the watch to, if it says.
    pub fn resource_version(&self) -> Option<&str> {
        match self {
            Self::Applied(p) | Self::Deleted(p) => p.metadata.resource_version.as_deref(),
            Self::Bookmark(rv) => Some(rv.as_str()).filter(|rv| !rv.is_empty()),
            Self::Error(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: Value) -> Pod {
        serde_json::from_value(v).expect("pod")
    }

    fn running(ip: &str, ready: &str) -> Value {
        json!({"metadata": {"name": "w0", "namespace": "ns", "resourceVersion": "7"},
               "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": ready}]}})
    }

    #[test]
    fn only_running_ready_addressed_undeleted_pods_are_workers() {
        assert_eq!(pod(running("10.0.0.5", "True")).eligible(), Ok(Eligible { ip: "10.0.0.5".parse().unwrap() }));
        assert_eq!(pod(running("10.0.0.5", "False")).eligible(), Err("not ready"));
        assert_eq!(pod(running("", "True")).eligible(), Err("no pod IP"));
        assert_eq!(pod(running("nope", "True")).eligible(), Err("pod IP is not an IP address"));
        let mut v = running("10.0.0.5", "True");
        v["status"]["phase"] = json!("Pending");
        assert_eq!(pod(v).eligible(), Err("not running"));
        let mut v = running("10.0.0.5", "True");
        v["metadata"]["deletionTimestamp"] = json!("2026-12-02T10:00:00Z");
        assert_eq!(pod(v).eligible(), Err("being deleted"));
        assert_eq!(pod(running("fd00::5", "True")).eligible().map(|e| e.ip.is_ipv6()), Ok(true));
    }

    #[test]
    fn bootstrap_port_from_the_annotation_then_vllms() {
        let mut v = running("10.0.0.5", "True");
        assert_eq!(pod(v.clone()).bootstrap_port("sglang.ai/bootstrap-port"), Ok(None));
        v["metadata"]["annotations"] = json!({"vllm.ai/bootstrap-port": "8998"});
        assert_eq!(pod(v.clone()).bootstrap_port("sglang.ai/bootstrap-port"), Ok(Some(8998)));
        v["metadata"]["annotations"] = json!({"sglang.ai/bootstrap-port": "9001", "vllm.ai/bootstrap-port": "8998"});
        assert_eq!(pod(v.clone()).bootstrap_port("sglang.ai/bootstrap-port"), Ok(Some(9001)));
        v["metadata"]["annotations"] = json!({"sglang.ai/bootstrap-port": "99999"});
        assert!(pod(v).bootstrap_port("sglang.ai/bootstrap-port").is_err());
    }

    #[test]
    fn watch_events_parse_as_the_api_server_sends_them() {
        let added = WatchEvent::parse(
            br#"{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"a","namespace":"n","resourceVersion":"12"}}}"#,
        )
        .unwrap();
        assert!(matches!(&added, WatchEvent::Applied(p) if p.key() == "n/a"));
        assert_eq!(added.resource_version(), Some("12"));
        let bookmark =
            WatchEvent::parse(br#"{"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"40"}}}"#)
                .unwrap();
        assert_eq!(bookmark, WatchEvent::Bookmark("40".into()));
        let gone = WatchEvent::parse(
            br#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 5 (40)","reason":"Expired","code":410}}"#,
        )
        .unwrap();
        assert!(matches!(gone, WatchEvent::Error(Status { code: 410, .. })));
        assert!(WatchEvent::parse(br#"{"type":"SURPRISE","object":{}}"#).is_err());
        assert!(WatchEvent::parse(b"{not json").is_err());
    }
}
