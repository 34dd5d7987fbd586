//! Custom resources the router reads from the Kubernetes API server: its
//! routing config as a `RoutingConfig` resource (read at start, followed, the
//! outcome of each version written to its status), and the Gateway API
//! Inference Extension's `InferencePool` (the workers) and `InferenceObjective`s
//! (the endpoint picker's priority classes). Against the project's
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

/// An `InferencePool` picks the workers (its selector and port, followed as they change), and
/// the endpoint picker gives a request the priority class of the `InferenceObjective` it names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inference_pool_picks_the_workers_and_its_objectives_the_priority_classes() {
    use crate::k8s_discovery::{self as kd, NS, TOKEN};
    use ext_proc::PROCESS_PATH;
    use ext_proc::proto::{
        HeaderMap, HeaderValue, HttpBody, HttpHeaders, Phase, ProcessingRequest, ProcessingResponse,
        ProtocolConfiguration, Reply, body_mode,
    };
    use fleet::k8s::api::ApiServer;
    use fleet::k8s::pool::{DEFAULT_POOL_GROUP, pool_ref};
    use gateway::pipeline::scheduler::{Class, SchedulerConfig};
    use mock_k8s::Pod;
    use sgl_router::app::{DiscoverySetup, PolicyConfig};

    let (_engines, port) = kd::engines_on_one_port(2, common::app::engine_config).await;
    let k8s = kd::api().await;
    k8s.upsert_pod(Pod::running(NS, "w0", kd::ip(0)).label("app", "a").ready(true));
    k8s.upsert_pod(Pod::running(NS, "w1", kd::ip(1)).label("app", "b").ready(true));
    let pool =
        |app: &str| json!({"spec": {"selector": {"matchLabels": {"app": app}}, "targetPorts": [{"number": port}]}});
    let (pools, objectives) = ("inference.networking.k8s.io/v1", "inference.networking.x-k8s.io/v1alpha2");
    k8s.put_object(pools, "inferencepools", "InferencePool", NS, "qwen", pool("a"));
    let objective = |priority: i64, pool: &str| json!({"spec": {"priority": priority, "poolRef": {"name": pool}}});
    k8s.put_object(objectives, "inferenceobjectives", "InferenceObjective", NS, "critical", objective(10, "qwen"));
    k8s.put_object(objectives, "inferenceobjectives", "InferenceObjective", NS, "batch", objective(-1, "qwen"));
    // Another pool's objective is not this pool's.
    k8s.put_object(objectives, "inferenceobjectives", "InferenceObjective", NS, "elsewhere", objective(10, "other"));

    let mut app = common::app::config(&[], PolicyConfig::RoundRobin, false);
    app.discovery = Some(DiscoverySetup {
        api: ApiServer::with_token(&k8s.url(), Some(TOKEN)).unwrap(),
        config: fleet::k8s::DiscoveryConfig {
            namespace: Some(NS.into()),
            port: 1,
            watched: Vec::new(),
            bootstrap_annotation: fleet::k8s::DEFAULT_BOOTSTRAP_ANNOTATION.into(),
            pool_label: None,
            default_pool: router_types::PoolId::default_pool(),
            pools: None,
            inference_pool: Some(pool_ref(DEFAULT_POOL_GROUP, NS, "qwen")),
        },
    });
    // Every class may be taken (a client's ceiling is otherwise `default`).
    app.scheduler = Some(SchedulerConfig { default_max_class: Class::System, ..SchedulerConfig::default() });
    app.epp_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    let router = common::app::start(app).await;
    let url = router.url.clone();
    common::eventually("the pool's pod is the worker", async || kd::routable(&url).await == [kd::worker(0, port)])
        .await;

    // Picks through the picker's gRPC stream, each naming an objective (or none).
    let mut channel = grpc_wire::client::Channel::connect(router.epp.unwrap()).await.unwrap();
    let body = serde_json::to_vec(&common::app::chat("s", "q")).unwrap();
    for named in [Some("critical"), Some("batch"), Some("elsewhere"), None] {
        let len = body.len().to_string();
        let mut head = vec![(":method", "POST"), (":path", "/v1/chat/completions"), ("content-length", len.as_str())];
        head.extend(named.map(|n| ("x-gateway-inference-objective", n)));
        let headers = head
            .iter()
            .map(|(k, v)| HeaderValue { key: (*k).into(), value: String::new(), raw_value: v.as_bytes().to_vec() })
            .collect();
        let phase = Phase::RequestHeaders(HttpHeaders { headers: Some(HeaderMap { headers }), end_of_stream: false });
        let protocol_config = Some(ProtocolConfiguration {
            request_body_mode: body_mode::BUFFERED,
            response_body_mode: body_mode::NONE,
            send_body_without_waiting_for_header_response: false,
        });
        let mut call = channel.call(PROCESS_PATH, 1 << 20).await.unwrap();
        let first = ProcessingRequest { request: Some(phase), protocol_config, ..Default::default() };
        call.requests.send(&first).await.unwrap();
        let said = call.answers.next::<ProcessingResponse>().await.unwrap().unwrap();
        assert!(matches!(said.response, Some(Reply::RequestHeaders(_))), "{said:?}");
        let chunk = Phase::RequestBody(HttpBody { body: body.clone().into(), end_of_stream: true });
        call.requests.send(&ProcessingRequest { request: Some(chunk), ..Default::default() }).await.unwrap();
        let picked = call.answers.next::<ProcessingResponse>().await.unwrap().unwrap();
        assert!(matches!(picked.response, Some(Reply::RequestBody(_))), "{named:?} picked: {picked:?}");
    }
    let admitted = |class: &'static str| {
        let url = url.clone();
        async move { common::app::metric(&url, &format!("router_scheduler_admitted_total{{class=\"{class}\"}}")).await }
    };
    assert_eq!(admitted("interactive").await, 1.0, "critical (priority 10)");
    assert_eq!(admitted("bulk").await, 1.0, "batch (priority -1)");
    assert_eq!(admitted("default").await, 2.0, "another pool's objective, and none");

    // The pool selects other pods: the workers follow.
    k8s.put_object(pools, "inferencepools", "InferencePool", NS, "qwen", pool("b"));
    common::eventually("the new selector's pod only", async || kd::routable(&url).await == [kd::worker(1, port)]).await;
    // Deleted: the workers found so far stay.
    let events = || common::app::metric(&url, "router_k8s_objects_total{what=\"events\"}");
    let before = events().await;
    k8s.delete_object(pools, "inferencepools", NS, "qwen").unwrap();
    common::eventually("the deletion seen", async || events().await > before).await;
    assert_eq!(kd::routable(&url).await, [kd::worker(1, port)]);
    let _ = router.stop.send(());
}
