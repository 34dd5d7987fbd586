//! SGLang Model Gateway's features end to end, against simulated engines:
//! sticky sessions by `x-smg-routing-key` (under any policy, through other
//! traffic, away and back with their worker's health), the circuit breaker
//! opening on 5xx and closing through half-open, `/flush_cache` sent to every
//! engine (whose `AllBlocksCleared` empties the index), and the routes the
//! router answers itself.

use crate::common;

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use common::app::{ADMIN_KEY, admin_client, admin_get, chat, config, engine_config, post, start};
use common::eventually;
use mock_engine::{Faults, MockEngine};
use serde_json::{Value, json};
use sgl_router::app::PolicyConfig;

async fn engines(n: usize) -> Vec<MockEngine> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(MockEngine::spawn(engine_config()).await.unwrap());
    }
    out
}

fn served(engines: &[MockEngine]) -> Vec<u64> {
    engines.iter().map(|e| e.engine().requests.load(Relaxed)).collect()
}

/// Which engine served the one request sent between `before` and now.
fn which(engines: &[MockEngine], before: &[u64]) -> usize {
    let now = served(engines);
    let moved: Vec<usize> = (0..engines.len()).filter(|&i| now[i] != before[i]).collect();
    assert_eq!(moved.len(), 1, "one engine served it: {before:?} -> {now:?}");
    moved[0]
}

async fn keyed(url: &str, key: Option<&str>, n: usize) -> reqwest::Response {
    let mut r = reqwest::Client::new().post(format!("{url}/v1/chat/completions")).json(&chat("sys", &format!("q{n}")));
    if let Some(k) = key {
        r = r.header("x-smg-routing-key", k);
    }
    r.send().await.unwrap()
}

#[tokio::test]
async fn a_routing_key_keeps_its_worker_through_other_traffic_and_comes_back_with_it() {
    let es = engines(3).await;
    for policy in [PolicyConfig::RoundRobin, PolicyConfig::Manual, PolicyConfig::cache_aware()] {
        let r = start(config(&es.iter().collect::<Vec<_>>(), policy.clone(), true)).await;
        let mut home = None;
        for n in 0..12 {
            // Keyless traffic in between goes wherever the policy sends it.
            assert_eq!(keyed(&r.url, None, n).await.status(), 200);
            let before = served(&es);
            assert_eq!(keyed(&r.url, Some("session-a"), n).await.status(), 200);
            let now = which(&es, &before);
            assert_eq!(*home.get_or_insert(now), now, "{policy:?}: request {n} of the session moved");
        }
        let home = home.unwrap();
        // Its worker leaves rotation (a failed request: a quarantine its probes cannot cut
        // short): the session moves, always to the same other worker.
        let gone = r.gateway.fleet.all().into_iter().find(|w| w.url.as_str() == es[home].url()).unwrap();
        gone.request_failed();
        let mut away = None;
        for n in 0..4 {
            let before = served(&es);
            assert_eq!(keyed(&r.url, Some("session-a"), n).await.status(), 200);
            let now = which(&es, &before);
            assert_ne!(now, home);
            assert_eq!(*away.get_or_insert(now), now);
        }
        // And comes back with it: the quarantine over, its next probe brings it back.
        eventually("the worker is back in rotation", async || gone.is_routable()).await;
        let before = served(&es);
        assert_eq!(keyed(&r.url, Some("session-a"), 99).await.status(), 200);
        assert_eq!(which(&es, &before), home, "{policy:?}");
        let _ = r.stop.send(());
    }
}

#[tokio::test]
async fn server_errors_open_a_breaker_which_closes_again_through_half_open() {
    let es = engines(2).await;
    let mut cfg = config(&[&es[0], &es[1]], PolicyConfig::RoundRobin, false);
    cfg.breaker = fleet::BreakerConfig {
        enabled: true,
        failure_threshold: 2,
        success_threshold: 2,
        // Long enough that the checks while it is open finish on a loaded machine.
        timeout: Duration::from_millis(2000),
        window: Duration::from_secs(60),
    };
    cfg.retry.enabled = false;
    let r = start(cfg).await;
    es[0].engine().set_faults(Faults { fail_next: 2, fail_status: 503, ..Faults::default() }).await;
    let bad = r.gateway.fleet.all().into_iter().find(|w| w.url.as_str() == es[0].url()).unwrap();
    // Round robin: every other request reaches the failing engine; without retries its 503s reach the client.
    let mut statuses = Vec::new();
    for n in 0..4 {
        statuses.push(keyed(&r.url, None, n).await.status().as_u16());
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 503, 503]);
    assert_eq!(bad.breaker_state(), fleet::BreakerState::Open);
    assert!(!bad.is_routable());
    let before = served(&es);
    for n in 0..4 {
        assert_eq!(keyed(&r.url, None, n).await.status(), 200);
    }
    assert_eq!(served(&es)[0], before[0], "no request reaches an open breaker's worker");
    let page = admin_get(&format!("{}/metrics", r.url)).await.text().await.unwrap();
    let label = format!("router_worker_circuit_state{{worker=\"{}\"}} 1", es[0].url());
    assert!(page.contains(&label), "{page}");
    let workers: Value = admin_get(&format!("{}/workers", r.url)).await.json().await.unwrap();
    let listed = workers["workers"].as_array().unwrap().iter().find(|w| w["url"] == es[0].url().as_str()).cloned();
    assert_eq!(listed.unwrap()["circuit"], "open");
    // After the timeout it is on trial; two good answers close it.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(bad.breaker_state(), fleet::BreakerState::HalfOpen);
    for n in 0..6 {
        assert_eq!(keyed(&r.url, None, n).await.status(), 200);
    }
    assert_eq!(bad.breaker_state(), fleet::BreakerState::Closed);
    assert!(served(&es)[0] > before[0], "back in rotation");
    assert_eq!(bad.breaker_opened(), 1);
}

#[tokio::test]
async fn flush_cache_reaches_every_engine_and_empties_the_index() {
    let es = engines(2).await;
    let r = start(config(&[&es[0], &es[1]], PolicyConfig::cache_aware(), true)).await;
    let long = "a shared system prompt that fills many pages of the cache. ".repeat(30);
    for n in 0..4 {
        assert_eq!(post(&format!("{}/v1/chat/completions", r.url), &chat(&long, &format!("q{n}"))).await.status(), 200);
    }
    let index = r.gateway.index.clone().unwrap();
    eventually("the index holds the prompt", async || index.stats().holdings > 0).await;
    // The control plane's: without its key, refused.
    let anon = reqwest::Client::new().post(format!("{}/flush_cache", r.url)).send().await.unwrap();
    assert_eq!(anon.status(), 401);
    let answer = admin_client().post(format!("{}/flush_cache", r.url)).send().await.unwrap();
    assert_eq!(answer.status(), 200);
    let v: Value = answer.json().await.unwrap();
    assert_eq!((v["status"].as_str(), v["workers_flushed"].as_u64()), (Some("success"), Some(2)), "{v}");
    for e in &es {
        assert_eq!(e.engine().flushes.load(Relaxed), 1);
        assert!(e.engine().cached_pages().iter().all(|p| *p == 0));
    }
    eventually("the engines' AllBlocksCleared empty the index", async || index.stats().holdings == 0).await;
    // One engine gone: a partial success, naming it.
    let dead = es[1].url();
    drop(es);
    let answer = admin_client().post(format!("{}/flush_cache", r.url)).send().await.unwrap();
    assert_eq!(answer.status(), 206);
    let v: Value = answer.json().await.unwrap();
    assert_eq!(v["status"], "partial_success");
    assert!(v["failed"].as_array().unwrap().iter().any(|f| f["worker"] == dead.as_str()), "{v}");
}

#[tokio::test]
async fn the_router_answers_tokenize_detokenize_loads_and_model_info() {
    let es = engines(1).await;
    let r = start(config(&[&es[0]], PolicyConfig::RoundRobin, false)).await;
    let http = reqwest::Client::new();
    let v: Value = http
        .post(format!("{}/v1/tokenize", r.url))
        .json(&json!({"prompt": "héllo"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let expected = r.gateway.default_pool().renderer.tokenizer().encode("héllo", false).unwrap();
    assert_eq!(v["tokens"], json!(expected));
    assert_eq!((v["count"].as_u64(), v["char_count"].as_u64()), (Some(expected.len() as u64), Some(5)));
    let v: Value = http
        .post(format!("{}/v1/tokenize", r.url))
        .json(&json!({"prompt": ["a", "bc"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["count"].as_array().unwrap().len(), 2);
    let v: Value = http
        .post(format!("{}/v1/detokenize", r.url))
        .json(&json!({"tokens": expected}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["text"], "héllo");
    for bad in [json!({"prompt": 5}), json!({"tokens": [-1]}), json!({"tokens": "x"})] {
        let path = if bad.get("prompt").is_some() { "tokenize" } else { "detokenize" };
        let r = http.post(format!("{}/v1/{path}", r.url)).json(&bad).send().await.unwrap();
        assert_eq!(r.status(), 400, "{bad}");
    }
    let info: Value = http.get(format!("{}/get_model_info", r.url)).send().await.unwrap().json().await.unwrap();
    assert_eq!(info["model_path"], "mock-model", "passed through from the worker: {info}");
    let loads = admin_client().get(format!("{}/get_loads", r.url)).bearer_auth(ADMIN_KEY).send().await.unwrap();
    let loads: Value = loads.json().await.unwrap();
    assert_eq!(loads["workers"][0]["worker"], es[0].url().as_str(), "{loads}");
    assert!(loads["workers"][0]["load"].is_i64());
}

/// A worker without `/server_info` (vLLM, any OpenAI-compatible server): `/health` and chats only.
async fn plain_openai_worker() -> String {
    use axum::routing::{get, post};
    let app = axum::Router::new().route("/health", get(|| async { "ok" })).route(
        "/v1/chat/completions",
        post(|| async { axum::Json(json!({"choices": [{"message": {"role": "assistant", "content": "hi"}}]})) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

#[tokio::test]
async fn cache_aware_routes_a_worker_without_server_info_at_once() {
    let es = engines(1).await;
    let mut cfg = config(&[&es[0]], PolicyConfig::cache_aware(), true);
    cfg.workers.push(router_types::WorkerUrl::parse(&plain_openai_worker().await).unwrap());
    let started = std::time::Instant::now();
    let r = start(cfg).await;
    eventually("both workers in rotation", async || r.gateway.fleet.all().iter().all(|w| w.is_routable())).await;
    assert!(started.elapsed() < Duration::from_secs(5), "not after the 30 s discovery deadline");
    let plain = r.gateway.fleet.all().into_iter().find(|w| w.url.as_str() != es[0].url()).unwrap();
    assert!(matches!(plain.events(), fleet::Events::NotFollowed(_)), "{:?}", plain.events());
    for n in 0..4 {
        assert_eq!(post(&format!("{}/v1/chat/completions", r.url), &chat("s", &format!("q{n}"))).await.status(), 200);
    }
}
