//! Kubernetes discovery against a local stand-in of the API server
//! (`mock-k8s`: the real list/watch protocol, chunked JSON events,
//! resourceVersion, bookmarks, 410), since no cluster is reachable here.
//! Pods are simulated engines on 127.0.0.N, all on one port, as pods on
//! their own IPs are.

use crate::common;

use std::time::Duration;

use common::app::{admin_get, chat, config, engine_config, post, start};
use common::eventually;
use fleet::k8s::api::ApiServer;
use fleet::k8s::{DiscoveryConfig, PodRole, Watched};
use mock_engine::{Flavor, MockEngine, MockEngineConfig, PdRole};
use mock_k8s::{MockApiConfig, MockApiServer, Pod};
use serde_json::Value;
use sgl_router::app::{DiscoverySetup, PolicyConfig};

pub(crate) const NS: &str = "inference";
pub(crate) const TOKEN: &str = "sa-token";

/// Engines on 127.0.0.2, .3, ... sharing one port; returns them and the port.
pub(crate) async fn engines_on_one_port(n: usize, config: impl Fn() -> MockEngineConfig) -> (Vec<MockEngine>, u16) {
    let first =
        MockEngine::spawn(MockEngineConfig { listen: "127.0.0.2:0".parse().unwrap(), ..config() }).await.unwrap();
    let port: u16 = first.url().rsplit(':').next().unwrap().parse().unwrap();
    let mut out = vec![first];
    for i in 1..n {
        let listen = format!("127.0.0.{}:{port}", 2 + i).parse().unwrap();
        out.push(MockEngine::spawn(MockEngineConfig { listen, ..config() }).await.unwrap());
    }
    (out, port)
}

pub(crate) fn ip(i: usize) -> String {
    format!("127.0.0.{}", 2 + i)
}

fn discovery(api: &MockApiServer, port: u16, watched: Vec<Watched>) -> DiscoverySetup {
    DiscoverySetup {
        api: ApiServer::with_token(&api.url(), Some(TOKEN)).unwrap(),
        config: DiscoveryConfig {
            namespace: Some(NS.into()),
            port,
            watched,
            bootstrap_annotation: fleet::k8s::DEFAULT_BOOTSTRAP_ANNOTATION.into(),
            pool_label: None,
            default_pool: router_types::PoolId::default_pool(),
            pools: None,
            inference_pool: None,
        },
    }
}

pub(crate) async fn api() -> MockApiServer {
    MockApiServer::spawn(MockApiConfig { token: Some(TOKEN.into()), ..MockApiConfig::default() }).await.unwrap()
}

/// The routable workers' URLs, sorted.
pub(crate) async fn routable(url: &str) -> Vec<String> {
    let v: Value = admin_get(&format!("{url}/workers")).await.json().await.unwrap();
    let mut out: Vec<String> = v["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["healthy"] == true)
        .map(|w| w["url"].as_str().unwrap().to_owned())
        .collect();
    out.sort();
    out
}

pub(crate) fn worker(i: usize, port: u16) -> String {
    format!("http://{}:{port}", ip(i))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_join_and_leave_as_they_become_and_stop_being_workers() {
    let slow = || MockEngineConfig { fast: false, decode_per_token: Duration::from_millis(20), ..engine_config() };
    let (_engines, port) = engines_on_one_port(4, slow).await;
    let k8s = api().await;
    let sglang = |i: usize| Pod::running(NS, format!("w{i}"), ip(i)).label("app", "sglang");
    k8s.upsert_pod(sglang(0).ready(true));
    k8s.upsert_pod(sglang(1).ready(false)); // not ready yet
    k8s.upsert_pod(Pod::running(NS, "other", ip(2)).label("app", "other").ready(true)); // not selected
    k8s.upsert_pod(Pod::running("elsewhere", "w9", ip(2)).label("app", "sglang").ready(true)); // other namespace
    let mut c = config(&[], PolicyConfig::RoundRobin, false);
    c.discovery = Some(discovery(&k8s, port, vec![Watched { selector: "app=sglang".into(), role: PodRole::Regular }]));
    let r = start(c).await;
    eventually("w0 routes", async || routable(&r.url).await == [worker(0, port)]).await;
    for _ in 0..4 {
        assert!(post(&format!("{}/v1/chat/completions", r.url), &chat("s", "u")).await.status().is_success());
    }
    // A pod turning ready joins.
    k8s.set_ready(NS, "w1", true);
    eventually("w1 joins", async || routable(&r.url).await == [worker(0, port), worker(1, port)]).await;

    // A request in flight on w0, then w0's pod is deleted: it finishes; new requests go to w1.
    let long =
        serde_json::json!({"model": "default", "max_tokens": 100, "messages": [{"role": "user", "content": "long"}]});
    let gw = r.gateway.clone();
    let base = r.url.clone();
    let in_flight = tokio::spawn(async move {
        reqwest::Client::new().post(format!("{base}/v1/chat/completions")).json(&long).send().await.unwrap().status()
    });
    eventually("a request in flight on w0", async || {
        gw.fleet.all().iter().any(|w| w.url.as_str() == worker(0, port) && w.load().in_flight > 0)
            || gw.fleet.all().iter().any(|w| w.url.as_str() == worker(1, port) && w.load().in_flight > 0)
    })
    .await;
    let busy = gw.fleet.all().into_iter().find(|w| w.load().in_flight > 0).unwrap();
    let (busy_pod, other) = if busy.url.as_str() == worker(0, port) { ("w0", 1) } else { ("w1", 0) };
    k8s.delete_pod(NS, busy_pod);
    eventually("the deleted pod leaves rotation", async || routable(&r.url).await == [worker(other, port)]).await;
    assert_eq!(busy.state(), fleet::State::Retained, "kept until its request finishes");
    for _ in 0..3 {
        assert!(post(&format!("{}/v1/chat/completions", r.url), &chat("s", "u")).await.status().is_success());
    }
    assert_eq!(busy.load().in_flight, 1, "no new request reached the deleted pod");
    assert!(in_flight.await.unwrap().is_success(), "the in-flight request finished");
    eventually("then it is gone", async || busy.state() == fleet::State::Removed).await;

    // A pod that turns NotReady leaves too (unlike SMG's discovery).
    k8s.upsert_pod(sglang(2).ready(true));
    eventually("w2 joins", async || routable(&r.url).await.len() == 2).await;
    k8s.set_ready(NS, "w2", false);
    eventually("w2 leaves when not ready", async || routable(&r.url).await == [worker(other, port)]).await;

    // Every watch dropped, a pod added, the history compacted past it: the watch cannot resume
    // (410), yet the new pod is found, by a fresh list.
    let lists = k8s.lists();
    k8s.drop_watches();
    k8s.upsert_pod(sglang(3).ready(true));
    k8s.compact();
    eventually("w3 found after the re-list", async || routable(&r.url).await == [worker(other, port), worker(3, port)])
        .await;
    assert!(k8s.lists() > lists, "a fresh list followed the expired watch");
    let m = admin_get(&format!("{}/metrics", r.url)).await.text().await.unwrap();
    assert!(m.contains("router_discovery_expired_total 1"), "{m}");
    assert!(m.contains("router_discovery_workers 2"), "{m}");
    // Every request the API server saw carried the token and the namespace's path.
    assert!(k8s.requests().iter().all(|q| q.contains(&format!("/api/v1/namespaces/{NS}/pods"))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pd_selectors_give_roles_and_bootstrap_ports() {
    let role = |r: PdRole| move || common::pd::role_config(r, Flavor::Sglang, 1);
    let (prefill, port) = engines_on_one_port(1, role(PdRole::Prefill)).await;
    // Decode engines on the same port, further along 127/8.
    let listen = format!("127.0.0.3:{port}").parse().unwrap();
    let decode = MockEngine::spawn(MockEngineConfig { listen, ..role(PdRole::Decode)() }).await.unwrap();
    let k8s = api().await;
    k8s.upsert_pod(
        Pod::running(NS, "p0", ip(0))
            .label("app", "sglang")
            .label("component", "prefill")
            .annotation("sglang.ai/bootstrap-port", "9001")
            .ready(true),
    );
    k8s.upsert_pod(Pod::running(NS, "d0", ip(1)).label("app", "sglang").label("component", "decode").ready(true));
    let mut c = common::pd::pd_config(
        gateway::pd::PdMode::Sglang,
        &[],
        &[],
        PolicyConfig::RoundRobin,
        PolicyConfig::RoundRobin,
    );
    c.discovery = Some(discovery(
        &k8s,
        port,
        vec![
            Watched { selector: "app=sglang,component=prefill".into(), role: PodRole::Prefill },
            Watched { selector: "app=sglang,component=decode".into(), role: PodRole::Decode },
        ],
    ));
    let r = start(c).await;
    eventually("both pods are workers", async || routable(&r.url).await.len() == 2).await;
    let all = r.gateway.fleet.all();
    let p = all.iter().find(|w| w.url.as_str() == worker(0, port)).unwrap();
    let d = all.iter().find(|w| w.url.as_str() == worker(1, port)).unwrap();
    assert_eq!((p.role.as_str(), p.bootstrap_port()), ("prefill", Some(9001)));
    assert_eq!(d.role.as_str(), "decode");
    drop((prefill, decode));
}

/// The `sgl-router` binary, killed when dropped, and its kubeconfig, removed then.
struct Binary(
    std::process::Child,
    #[allow(dead_code, reason = "held for its Drop: the file goes with the binary")] tempfile::NamedTempFile,
);

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the binary with `args` on a free port, the API server found through `KUBECONFIG`
/// as a user's would be; its URL.
fn binary(k8s: &MockApiServer, name: &str, args: &[&str]) -> (Binary, String) {
    let kubeconfig =
        tempfile::Builder::new().prefix(&format!("sgl-router-k8s-{name}-")).suffix(".yaml").tempfile().unwrap();
    std::fs::write(kubeconfig.path(), k8s.kubeconfig(NS)).unwrap();
    let port = crate::common::free_port().to_string();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_sgl-router"))
        .args(["--host", "127.0.0.1", "--port", &port, "--control-plane-api-keys", common::app::ADMIN_KEY])
        .args(["--service-discovery", "--service-discovery-namespace", NS, "--log-level", "warn"])
        .args(args)
        .env("KUBECONFIG", kubeconfig.path())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    (Binary(child, kubeconfig), format!("http://127.0.0.1:{port}"))
}

/// As a user runs it: no worker on the command line, every worker from the pods of the
/// selector, the API server from `KUBECONFIG`; not ready until a pod joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_starts_with_no_worker_and_routes_to_the_pods_it_finds() {
    let (_engines, port) = engines_on_one_port(1, engine_config).await;
    let k8s = api().await;
    let (_router, url) =
        binary(&k8s, "regular", &["--selector", "app=sglang", "--service-discovery-port", &port.to_string()]);
    let readiness = || async { reqwest::get(format!("{url}/readiness")).await.map(|r| r.status().as_u16()).ok() };
    eventually("the router serves, not ready without workers", async || readiness().await == Some(503)).await;
    k8s.upsert_pod(Pod::running(NS, "w0", ip(0)).label("app", "sglang").ready(true));
    eventually("ready once the pod joins", async || readiness().await == Some(200)).await;
    let answer = post(&format!("{url}/v1/chat/completions"), &chat("s", "u")).await;
    assert!(answer.status().is_success());
    assert_eq!(routable(&url).await, [worker(0, port)]);

    // Disaggregated: both roles from their selectors, no --prefill or --decode.
    let (_pd, pd_url) = binary(
        &k8s,
        "pd",
        &["--pd-disaggregation", "--prefill-selector", "component=prefill", "--decode-selector", "component=decode"],
    );
    k8s.upsert_pod(
        Pod::running(NS, "p0", ip(1))
            .label("component", "prefill")
            .annotation("sglang.ai/bootstrap-port", "9001")
            .ready(true),
    );
    k8s.upsert_pod(Pod::running(NS, "d0", ip(2)).label("component", "decode").ready(true));
    eventually("the PD router finds both pods", async || {
        let Ok(answer) = common::app::admin_client().get(format!("{pd_url}/workers")).send().await else {
            return false; // not listening yet
        };
        let Ok(v) = answer.json::<Value>().await else { return false };
        let mut roles: Vec<String> = v["workers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|w| w["role"].as_str().map(str::to_owned))
            .collect();
        roles.sort();
        roles == ["decode", "prefill"]
    })
    .await;
}
