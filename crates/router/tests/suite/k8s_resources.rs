//! Custom resources the router reads from the Kubernetes API server: its
//! routing config as a `RoutingConfig` resource (read at start, followed, the
//! outcome of each version written to its status). Against the project's
//! stand-in of the API server (`mock-k8s`), since no cluster runs here; the
//! real binary finds it through `KUBECONFIG` as a user's would.

use crate::common;

use std::time::Duration;

use common::app::{ADMIN_KEY, admin_client, repo};
use mock_k8s::{MockApiConfig, MockApiServer};
use serde_json::{Value, json};

const NS: &str = "serving";
const API: &str = "router.sglang.ai/v1alpha1";
const PLURAL: &str = "routingconfigs";
/// How long a change may take to show in the resource's status.
const DEADLINE: Duration = Duration::from_secs(20);

/// The `sgl-router` binary, killed when dropped.
struct Binary(std::process::Child);

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn kubeconfig(k8s: &MockApiServer, name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("sgl-router-crd-{}-{name}.yaml", std::process::id()));
    std::fs::write(&path, k8s.kubeconfig(NS)).unwrap();
    path
}

fn router(kubeconfig: &std::path::Path, args: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_sgl-router"));
    c.args(["--host", "127.0.0.1", "--control-plane-api-keys", ADMIN_KEY, "--log-level", "warn"])
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST");
    c
}

/// A resource body whose spec is the YAML `config`.
fn resource(config: &str) -> Value {
    json!({"spec": serde_norway::from_str::<Value>(config).unwrap()})
}

/// The resource's `Accepted` condition once its status reports `generation`: (status, message).
async fn outcome(k8s: &MockApiServer, generation: u64) -> (String, String) {
    let seen = k8s
        .wait_object((API, PLURAL, NS, "routing"), DEADLINE, |o| o["status"]["observedGeneration"] == generation)
        .await
        .unwrap_or_else(|| panic!("generation {generation} reported: {:?}", k8s.object(API, PLURAL, NS, "routing")));
    let c = &seen["status"]["conditions"][0];
    assert_eq!((c["type"].as_str(), c["observedGeneration"].as_u64()), (Some("Accepted"), Some(generation)), "{seen}");
    (c["status"].as_str().unwrap().to_owned(), c["message"].as_str().unwrap().to_owned())
}

async fn decision(url: &str) -> String {
    let ask = json!({"model": "auto", "messages": [{"role": "user", "content": "what is a matrix?"}]});
    let r = admin_client().post(format!("{url}/v1/route/preview")).json(&ask).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.json::<Value>().await.unwrap()["decision"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_routing_config_follows_its_resource_and_reports_each_version_in_its_status() {
    let k8s = MockApiServer::spawn(MockApiConfig::default()).await.unwrap();
    let original = std::fs::read_to_string(repo("examples/routing.yaml")).unwrap();
    let put = |config: &str| k8s.put_object(API, PLURAL, "RoutingConfig", NS, "routing", resource(config));
    put(&original);
    let file = kubeconfig(&k8s, "follow");
    let port = common::free_port().to_string();
    let resource_flag = format!("{NS}/routing");
    let child = router(&file, &["--port", &port, "--routing-config-resource", &resource_flag, "--mock-workers", "1"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _router = Binary(child);
    let url = format!("http://127.0.0.1:{port}");
    // Read at start: reported as in force once the router is built.
    assert_eq!(outcome(&k8s, 1).await.0, "True");
    assert_eq!(decision(&url).await, "default");

    // "matrix" becomes a math keyword: the new generation is applied, the same request is "hard".
    put(&original.replace("keywords: [integral,", "keywords: [matrix, integral,"));
    let (status, message) = outcome(&k8s, 2).await;
    assert_eq!(status, "True", "{message}");
    assert!(message.starts_with("applied: 5 decisions"), "{message}");
    assert_eq!(decision(&url).await, "hard");

    // A broken version is refused with its problem in the status; the config in force stays.
    put(&original.replace("{type: keyword, name: math}", "{type: keyword, name: maths}"));
    let (status, message) = outcome(&k8s, 3).await;
    assert_eq!(status, "False");
    assert!(message.contains("decision `hard` refers to undefined signal keyword:maths"), "{message}");
    assert!(message.contains("RoutingConfig serving/routing"), "the problem names the resource: {message}");
    assert_eq!(decision(&url).await, "hard", "the config in force is kept");
    // Pools are built at start: a changed pools section is refused and says so.
    put(&original.replace("served_model: qwen3-32b", "served_model: qwen3-72b"));
    let (status, message) = outcome(&k8s, 4).await;
    assert_eq!(status, "False");
    assert!(message.contains("the pools section changed"), "{message}");

    // A reload has no file to read: it says where the config comes from.
    let reload = admin_client().post(format!("{url}/routing/reload")).send().await.unwrap();
    assert_eq!(reload.status(), 422);
    let body: Value = reload.json().await.unwrap();
    assert!(body["problems"][0].as_str().unwrap().contains("comes from the RoutingConfig serving/routing"), "{body}");

    // Deleted: the config in force is kept. Made again (a new object, generation 1): applied.
    k8s.delete_object(API, PLURAL, NS, "routing").unwrap();
    assert_eq!(decision(&url).await, "hard");
    put(&original);
    assert_eq!(outcome(&k8s, 1).await.0, "True");
    assert_eq!(decision(&url).await, "default");
    let page = admin_client().get(format!("{url}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("router_model_reloads_total{outcome=\"ok\"} 2"), "{page}");
    assert!(page.contains("router_model_reloads_total{outcome=\"invalid\"} 2"), "{page}");
    assert!(page.contains("router_k8s_objects_total{what=\"lists\"} 1"), "{page}");
    let _ = std::fs::remove_file(file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_invalid_routing_config_resource_stops_the_start_with_the_reason() {
    let k8s = MockApiServer::spawn(MockApiConfig::default()).await.unwrap();
    let file = kubeconfig(&k8s, "missing");
    let run = |name: &'static str| {
        let mut c = router(&file, &["--port", "0", "--routing-config-resource", name, "--mock-workers", "1"]);
        tokio::task::spawn_blocking(move || c.output().unwrap())
    };
    // The namespace: the kubeconfig's is not read; without one in the flag, `default`.
    let out = run("serving/absent").await.unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("RoutingConfig serving/absent: not found"), "{err}");
    k8s.put_object(API, PLURAL, "RoutingConfig", NS, "bad", resource("decisions: [{name: x, pool: nowhere}]\n"));
    let out = run("serving/bad").await.unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("RoutingConfig serving/bad"), "the problems name the resource: {err}");
    let _ = std::fs::remove_file(file);
}
