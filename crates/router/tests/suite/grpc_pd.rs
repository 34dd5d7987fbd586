//! Prefill/decode disaggregation over gRPC, end to end: the router in front
//! of simulated engines in SGLang's prefill and decode roles serving SGLang's
//! scheduler service (`grpc://`), the legs meeting over the engines' real
//! bootstrap rendezvous (TCP). The router renders and tokenizes, sends one
//! `GenerateRequest` with `disaggregated_params` to both legs at once, and
//! makes decode's token stream the client's answer; and vLLM's two stages
//! over vLLM's engine service (`kv_transfer_params_json` handed from the
//! prefill's completion to the decode leg).

use crate::common;

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use common::app::{Running, admin_get, chat, post, start};
use common::pd::{pd_config, role_config};
use gateway::pd::PdMode;
use mock_engine::{Faults, Flavor, MockEngine, PdRole};
use router_types::{Bootstrap, WorkerUrl};
use serde_json::{Value, json};
use sgl_router::app::PolicyConfig;

/// `n` engines in `role` (SGLang's flavour) serving gRPC.
async fn grpc_engines(role: PdRole, n: usize, dp_size: usize) -> Vec<MockEngine> {
    let mut out = Vec::new();
    for _ in 0..n {
        let c = mock_engine::MockEngineConfig {
            grpc_listen: Some("127.0.0.1:0".parse().unwrap()),
            ..role_config(role, Flavor::Sglang, dp_size)
        };
        out.push(MockEngine::spawn(c).await.unwrap());
    }
    out
}

fn grpc_url(m: &MockEngine) -> WorkerUrl {
    WorkerUrl::parse(&m.grpc_url().unwrap()).unwrap()
}

/// A router over `prefill` and `decode` by their gRPC services (the bootstrap port from each
/// prefill's `GetServerInfo`), `mode`'s disaggregation, round robin on both legs.
fn grpc_pd_config(mode: PdMode, prefill: &[MockEngine], decode: &[MockEngine]) -> sgl_router::app::AppConfig {
    let mut c = pd_config(mode, prefill, decode, PolicyConfig::RoundRobin, PolicyConfig::RoundRobin);
    let setup = c.pd.as_mut().unwrap();
    setup.prefill = prefill.iter().map(|m| (grpc_url(m), Bootstrap::Discover)).collect();
    setup.decode = decode.iter().map(grpc_url).collect();
    c.kv_events = None;
    c
}

fn counters(m: &MockEngine) -> &mock_engine::PdCounters {
    &m.engine().pd().unwrap().counters
}

fn total(ms: &[MockEngine], f: impl Fn(&MockEngine) -> u64) -> u64 {
    ms.iter().map(f).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_legs_meet_over_grpc_and_decode_answers_every_route() {
    let prefill = grpc_engines(PdRole::Prefill, 2, 2).await;
    let decode = grpc_engines(PdRole::Decode, 2, 1).await;
    let r = start(grpc_pd_config(PdMode::Sglang, &prefill, &decode)).await;
    let bodies = [
        ("/v1/chat/completions", chat("You are brief. ", "What is a KV cache?")),
        ("/v1/completions", json!({"model": "default", "prompt": "Once upon a time", "max_tokens": 4})),
        ("/generate", json!({"text": "Once upon a time", "sampling_params": {"max_new_tokens": 4}})),
    ];
    for (path, body) in &bodies {
        for stream in [false, true] {
            let mut body = body.clone();
            body["stream"] = json!(stream);
            if stream && *path != "/generate" {
                body["stream_options"] = json!({"include_usage": true});
            }
            let resp = post(&format!("{}{path}", r.url), &body).await;
            assert_eq!(resp.status(), 200, "{path} stream={stream}");
            let text = resp.text().await.unwrap();
            if stream {
                assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
                let last = text.lines().filter_map(|l| l.strip_prefix("data: ")).rfind(|d| *d != "[DONE]");
                let usage: Value = serde_json::from_str(last.unwrap()).unwrap();
                let n =
                    usage.pointer("/usage/completion_tokens").or_else(|| usage.pointer("/meta_info/completion_tokens"));
                assert_eq!(n, Some(&json!(4)), "{path}: decode's four tokens, not prefill's one: {text}");
            } else {
                let v: Value = serde_json::from_str(&text).unwrap();
                let n = v.pointer("/usage/completion_tokens").or_else(|| v.pointer("/meta_info/completion_tokens"));
                assert_eq!(n, Some(&json!(4)), "{path}: the answer is decode's, not prefill's: {v}");
            }
        }
    }
    // Every request met in its own room, on a prefill and a decode worker.
    assert_eq!(total(&prefill, |m| counters(m).rendezvous.load(Relaxed)), 6);
    assert_eq!(total(&prefill, |m| m.engine().requests.load(Relaxed)), 6, "prefill legs on prefill workers");
    assert_eq!(total(&decode, |m| m.engine().requests.load(Relaxed)), 6, "decode legs on decode workers");
    // With dp_size 2 the room names the prefill rank (SGLang's gRPC params carry no rank of
    // their own): a room off the rank fails the transfer, counted here.
    assert_eq!(total(&prefill, |m| counters(m).dp_mismatch.load(Relaxed)), 0);
    assert_eq!(total(&prefill, |m| counters(m).bootstrap_timeouts.load(Relaxed)), 0);
    let m = admin_get(&format!("{}/metrics", r.url)).await.text().await.unwrap();
    assert!(m.contains("router_pd_legs_total{leg=\"prefill\",outcome=\"ok\"} 6"), "{m}");
    assert!(m.contains("router_pd_legs_total{leg=\"decode\",outcome=\"ok\"} 6"), "{m}");
    assert!(!m.contains("router_pd_aborts_total{"), "answered requests abort nothing: {m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_grpc_prefill_aborts_decode_at_once() {
    let prefill = grpc_engines(PdRole::Prefill, 1, 1).await;
    let decode = grpc_engines(PdRole::Decode, 1, 1).await;
    let mut c = grpc_pd_config(PdMode::Sglang, &prefill, &decode);
    c.retry.enabled = false;
    let r = start(c).await;
    // The prefill refuses the call; decode would wait its 10 s bootstrap timeout for a peer.
    prefill[0].engine().set_faults(Faults { fail_next: 1, ..Faults::default() }).await;
    let t = Instant::now();
    let resp = post(&format!("{}/v1/chat/completions", r.url), &chat("", "hi")).await;
    assert_eq!(resp.status(), 502, "the prefill's failure");
    assert_eq!(resp.headers()["x-sgl-router-pd-leg"], "prefill");
    let body = resp.text().await.unwrap();
    assert!(body.contains("prefill leg") && body.contains("injected failure"), "{body}");
    assert!(t.elapsed() < Duration::from_secs(5), "answered in {:?}", t.elapsed());
    // The decode leg was aborted by request id, not left waiting for its peer.
    wait_for(|| counters(&decode[0]).aborted.load(Relaxed) == 1).await;
    assert_eq!(counters(&decode[0]).rendezvous.load(Relaxed), 0);
    let m = admin_get(&format!("{}/metrics", r.url)).await.text().await.unwrap();
    assert!(m.contains("router_pd_aborts_total{leg=\"decode\"} 1"), "{m}");
    assert!(m.contains("router_pd_legs_total{leg=\"prefill\",outcome=\"status\"} 1"), "{m}");
    // The pair serves the next request.
    let resp = post(&format!("{}/v1/chat/completions", r.url), &chat("", "hi again")).await;
    assert_eq!(resp.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_grpc_decode_aborts_prefill_and_is_counted_once() {
    let prefill = grpc_engines(PdRole::Prefill, 1, 1).await;
    let decode = grpc_engines(PdRole::Decode, 1, 1).await;
    let mut c = grpc_pd_config(PdMode::Sglang, &prefill, &decode);
    c.retry.enabled = false;
    let r = start(c).await;
    decode[0].engine().set_faults(Faults { fail_next: 1, ..Faults::default() }).await;
    let t = Instant::now();
    let resp = post(&format!("{}/v1/chat/completions", r.url), &chat("", "hi")).await;
    assert_eq!(resp.status(), 502);
    assert_eq!(resp.headers()["x-sgl-router-pd-leg"], "decode");
    assert!(t.elapsed() < Duration::from_secs(5), "answered in {:?}", t.elapsed());
    // The prefill leg, waiting in its room for a peer that will not come, was aborted.
    wait_for(|| counters(&prefill[0]).aborted.load(Relaxed) == 1).await;
    let m = admin_get(&format!("{}/metrics", r.url)).await.text().await.unwrap();
    assert!(m.contains("router_http_requests_total{route=\"chat\",status=\"502\"} 1"), "counted once: {m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_grpc_prefill_is_retried_on_a_new_pair() {
    let prefill = grpc_engines(PdRole::Prefill, 2, 1).await;
    let decode = grpc_engines(PdRole::Decode, 1, 1).await;
    let r = start(grpc_pd_config(PdMode::Sglang, &prefill, &decode)).await;
    // One prefill engine stops; the router has not probed it since (hourly probes here), so
    // round robin still picks it: its call cannot connect, and the request moves to a new pair.
    prefill[0].shutdown();
    for i in 0..4 {
        let resp = post(&format!("{}/v1/chat/completions", r.url), &chat("", &format!("question {i}"))).await;
        assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    }
    assert_eq!(counters(&prefill[1]).rendezvous.load(Relaxed), 4, "every request met on the live pair");
    assert_eq!(counters(&decode[0]).rendezvous.load(Relaxed), 0, "(counted on the prefill side)");
    let m = admin_get(&format!("{}/metrics", r.url)).await.text().await.unwrap();
    let retries: u64 = m
        .lines()
        .filter(|l| l.starts_with("router_http_retries_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(retries >= 1, "the stopped engine was picked and the request retried: {m}");
    assert!(m.contains("router_pd_legs_total{leg=\"prefill\",outcome=\"unreachable\"}"), "{m}");
}

/// `n` engines in `role`, vLLM's flavour, serving vLLM's engine service.
async fn vllm_grpc_engines(role: PdRole, n: usize) -> Vec<MockEngine> {
    let mut out = Vec::new();
    for _ in 0..n {
        let c = mock_engine::MockEngineConfig {
            grpc_listen: Some("127.0.0.1:0".parse().unwrap()),
            grpc_service: engine_grpc::Service::Vllm,
            ..role_config(role, Flavor::Vllm, 1)
        };
        out.push(MockEngine::spawn(c).await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_two_stages_over_grpc_hand_the_prefills_params_to_decode() {
    let prefill = vllm_grpc_engines(PdRole::Prefill, 2).await;
    let decode = vllm_grpc_engines(PdRole::Decode, 2).await;
    let r = start(grpc_pd_config(PdMode::Vllm, &prefill, &decode)).await;
    for stream in [false, true] {
        let mut body = chat("You are brief. ", "What is a KV cache?");
        body["stream"] = json!(stream);
        body["stream_options"] = json!({"include_usage": true});
        let resp = post(&format!("{}/v1/chat/completions", r.url), &body).await;
        assert_eq!(resp.status(), 200, "stream={stream}");
        let text = resp.text().await.unwrap();
        let usage = match stream {
            false => serde_json::from_str::<Value>(&text).unwrap()["usage"].clone(),
            true => {
                let last = text.lines().filter_map(|l| l.strip_prefix("data: ")).rfind(|d| *d != "[DONE]");
                serde_json::from_str::<Value>(last.unwrap()).unwrap()["usage"].clone()
            }
        };
        assert_eq!(usage["completion_tokens"], 4, "decode's four tokens, not prefill's one: {text}");
    }
    // Each decode pulled the blocks its prefill kept (the params its completion handed over):
    // none prefilled locally, and no prefill call had the wrong shape.
    assert_eq!(total(&prefill, |m| counters(m).rendezvous.load(Relaxed)), 2);
    assert_eq!(total(&decode, |m| counters(m).local_prefill_fallbacks.load(Relaxed)), 0);
    assert_eq!(total(&prefill, |m| counters(m).bad_prefill_shape.load(Relaxed)), 0);
    assert_eq!(total(&prefill, |m| m.engine().requests.load(Relaxed)), 2);
    assert_eq!(total(&decode, |m| m.engine().requests.load(Relaxed)), 2);
    let m = admin_get(&format!("{}/metrics", r.url)).await.text().await.unwrap();
    assert!(m.contains("router_pd_legs_total{leg=\"prefill\",outcome=\"ok\"} 2"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_mooncake_over_grpc_is_refused_with_the_reason() {
    let prefill = vllm_grpc_engines(PdRole::Prefill, 1).await;
    let decode = vllm_grpc_engines(PdRole::Decode, 1).await;
    let mut c = grpc_pd_config(PdMode::Vllm, &prefill, &decode);
    c.pd.as_mut().unwrap().connector = gateway::pd::KvConnector::Mooncake;
    let r: Running = start(c).await;
    let resp = post(&format!("{}/v1/chat/completions", r.url), &chat("", "hi")).await;
    assert_eq!(resp.status(), 422);
    let body = resp.text().await.unwrap();
    assert!(body.contains("Mooncake connector over gRPC is not built"), "{body}");
    assert_eq!(total(&prefill, |m| m.engine().requests.load(Relaxed)), 0, "nothing was sent");
}

async fn wait_for(f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "not within 10 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Shepherd Model Gateway 1.13 (`smg launch --pd-disaggregation`, PyPI) as the client of the
/// simulated engines' gRPC roles: smg reads the prefill's bootstrap port from its
/// `GetServerInfo`, sends its `disaggregated_params` to both legs, and the legs meet: the
/// engines' side of the protocol is the one smg speaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smg_disaggregates_over_the_simulated_engines_grpc_roles() {
    let Some(smg) = crate::common::smg::smg("the smg gRPC disaggregation interop test") else { return };
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tokenizers/qwen3")
        .canonicalize()
        .unwrap();
    let spawn = |role| {
        let c = mock_engine::MockEngineConfig {
            model_id: dir.display().to_string(),
            grpc_listen: Some("127.0.0.1:0".parse().unwrap()),
            default_max_tokens: 8,
            ..role_config(role, Flavor::Sglang, 1)
        };
        MockEngine::spawn_with(c, renderer::Renderer::from_dir(&dir, None).unwrap())
    };
    let (prefill, decode) = (spawn(PdRole::Prefill).await.unwrap(), spawn(PdRole::Decode).await.unwrap());
    let (p, d) = (prefill.grpc_url().unwrap(), decode.grpc_url().unwrap());
    let bootstrap = prefill.engine().pd().unwrap().bootstrap_port().unwrap().to_string();
    let log = std::env::temp_dir().join(format!("smg-grpc-pd-{}.log", std::process::id()));
    let model = dir.display().to_string();
    let args = ["--pd-disaggregation", "--prefill", &p, &bootstrap, "--decode", &d, "--model-path", &model];
    let router = crate::common::smg::Smg::launch(&smg, &args, &log);
    let http = reqwest::Client::new();
    let body = json!({"model": model, "max_tokens": 8,
                      "messages": [{"role": "user", "content": "Tell me about prefix caches in LLM serving."}]});
    // Until smg registered both workers and its tokenizer it answers 503.
    let deadline = Instant::now() + Duration::from_secs(60);
    let whole: Value = loop {
        let answer = match http.post(format!("{}/v1/chat/completions", router.url)).json(&body).send().await {
            Ok(r) if r.status() == 200 => Some(r.json().await.unwrap()),
            _ => None,
        };
        if let Some(answer) = answer {
            break answer;
        }
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(Instant::now() < deadline, "smg never answered through the pair:\n{log}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // smg reads a Qwen3 model's answer as reasoning (the model path names it): either field.
    let message = &whole["choices"][0]["message"];
    let text = message["content"].as_str().or(message["reasoning_content"].as_str());
    assert_eq!(text, Some(" the cache is warm and routing works."), "{whole}");
    assert_eq!(whole["usage"]["completion_tokens"], 8, "decode's answer, not prefill's one token: {whole}");
    assert_eq!(counters(&prefill).rendezvous.load(Relaxed), 1, "the legs met in smg's room");
    assert_eq!(counters(&prefill).missing_room.load(Relaxed), 0);
    assert_eq!(decode.engine().requests.load(Relaxed), 1);
    drop(router);
    let _ = std::fs::remove_file(&log);
}

/// The real binary, started from its flags as docs/grpc.md's quick start says, serves a chat
/// through a pair of gRPC workers (its command line once refused gRPC legs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_takes_a_grpc_pair_from_its_flags() {
    let prefill = grpc_engines(PdRole::Prefill, 1, 1).await;
    let decode = grpc_engines(PdRole::Decode, 1, 1).await;
    let (p, d) = (prefill[0].grpc_url().unwrap(), decode[0].grpc_url().unwrap());
    #[rustfmt::skip]
    let (_router, url, _) = crate::smg_compat::launch(&[
        "--pd-disaggregation", "--prefill", &p, "--decode", &d, "--log-level", "warn",
        "--prometheus-port", "0", "--prometheus-host", "127.0.0.1", "--host", "127.0.0.1", "--port", "0",
    ]);
    let http = reqwest::Client::new();
    let body = chat("", "Hello!");
    // Answered once both workers were found healthy.
    crate::common::eventually("a chat answered through the pair", async || {
        let r = http.post(format!("{url}/v1/chat/completions")).json(&body).send().await;
        r.is_ok_and(|r| r.status() == 200)
    })
    .await;
    // Met in a room (a chat sent while the workers were still being probed is answered 503
    // by the router and sends no leg).
    assert!(counters(&prefill[0]).rendezvous.load(Relaxed) >= 1, "the legs met");
}
