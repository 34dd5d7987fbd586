//! The simulated engine over real HTTP and ZMQ on 127.0.0.1: responses and
//! usage, a warm cache reported as cached tokens, streaming, its KV events
//! driving a real index, eviction events, and every fault knob.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use kv_events::{EventMetrics, discover, spawn_subscriber};
use kv_index::{IndexConfig, KvIndex, MatchOptions, SystemClock};
use kv_ingest::{Pump, PumpMetrics, StreamHashing};
use mock_engine::{Faults, MockEngine, MockEngineConfig};
use renderer::{ChatRequest, HashMode, PageHasher};
use router_types::WorkerUrl;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

fn fast(page: usize, capacity_tokens: usize) -> MockEngineConfig {
    MockEngineConfig {
        page_size: page,
        capacity_tokens,
        fast: true,
        default_max_tokens: 4,
        ..MockEngineConfig::default()
    }
}

fn chat_body(user: &str) -> Value {
    json!({"model": "mock-model", "messages": [
        {"role": "system", "content": "You are a careful assistant. ".repeat(4)},
        {"role": "user", "content": user}
    ]})
}

async fn post(url: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new().post(url).json(body).send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_reports_cached_tokens_on_a_warm_prefix() {
    let m = MockEngine::spawn(fast(4, 100_000)).await.unwrap();
    let url = format!("{}/v1/chat/completions", m.url());
    let first: Value = post(&url, &chat_body("hello")).await.json().await.unwrap();
    assert_eq!(first["object"], "chat.completion");
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(first["choices"][0]["message"]["content"].as_str().unwrap().len() > 3);
    // Same system prompt, another question: the shared full pages are cached.
    let second: Value = post(&url, &chat_body("hi there")).await.json().await.unwrap();
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached >= 100 && cached.is_multiple_of(4) && cached < prompt, "cached {cached} of {prompt}");
    let again: Value = post(&url, &chat_body("hello")).await.json().await.unwrap();
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(), prompt / 4 * 4);
    // Other routes.
    let c: Value = post(&format!("{}/v1/completions", m.url()), &json!({"prompt": "abc", "max_tokens": 2}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(c["usage"]["completion_tokens"], 2);
    let g: Value =
        post(&format!("{}/generate", m.url()), &json!({"input_ids": [1, 2, 3, 4, 5]})).await.json().await.unwrap();
    assert_eq!(g["meta_info"]["prompt_tokens"], 5);
    let models: Value = reqwest::get(format!("{}/v1/models", m.url())).await.unwrap().json().await.unwrap();
    assert_eq!(models["data"][0]["id"], "mock-model");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_server_sent_events() {
    let m = MockEngine::spawn(fast(4, 100_000)).await.unwrap();
    let mut body = chat_body("stream please");
    body["stream"] = json!(true);
    body["max_tokens"] = json!(3);
    let r = post(&format!("{}/v1/chat/completions", m.url()), &body).await;
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let text = r.text().await.unwrap();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 3 + 2, "3 tokens, usage, [DONE]: {text}");
    assert_eq!(*events.last().unwrap(), "data: [DONE]");
    let first: Value = serde_json::from_str(events[0].trim_start_matches("data: ")).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_and_bad_requests() {
    let m = MockEngine::spawn(fast(4, 100_000)).await.unwrap();
    let url = format!("{}/v1/chat/completions", m.url());
    let bad = reqwest::Client::new().post(&url).body("{not json").send().await.unwrap();
    assert_eq!(bad.status(), 400);
    let err: Value = bad.json().await.unwrap();
    assert_eq!(err["error"]["type"], "invalid_request_error");
    m.engine().set_faults(Faults { fail_next: 1, die_mid_stream_next: 1, ..Faults::default() }).await;
    assert_eq!(post(&url, &chat_body("x")).await.status(), 500);
    assert_eq!(post(&url, &chat_body("x")).await.status(), 200, "one failure only");
    let mut body = chat_body("stream");
    body["stream"] = json!(true);
    let r = reqwest::Client::new().post(&url).json(&body).send().await.expect("headers arrive before the break");
    assert_eq!(r.status(), 200);
    assert!(r.text().await.is_err(), "the stream breaks after its first chunk");
    // Hang: no answer within the client's patience.
    m.engine().set_faults(Faults { hang_next: 1, ..Faults::default() }).await;
    let hung = reqwest::Client::new().post(&url).json(&chat_body("x")).timeout(Duration::from_millis(300)).send().await;
    assert!(hung.is_err());
    // The admin endpoint sets the same knobs.
    let r = post(&format!("{}/admin/faults", m.url()), &json!({"fail_next": 1})).await;
    assert_eq!(r.status(), 200);
    assert_eq!(post(&url, &chat_body("x")).await.status(), 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_events_drive_a_router_index_including_evictions() {
    // 40 pages of 4 tokens: small enough to evict.
    let m = MockEngine::spawn(fast(4, 160)).await.unwrap();
    let url = WorkerUrl::new(m.url());
    let found = discover(&reqwest::Client::new(), &url, Duration::from_millis(10), Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found.block_size, 4);
    let index = Arc::new(KvIndex::new(IndexConfig::default(), Arc::new(SystemClock::new())));
    let mut pump = Pump::new(index.clone(), Arc::new(PumpMetrics::default()));
    let hashing = StreamHashing {
        page_size: NonZeroUsize::new(4).unwrap(),
        mode: HashMode::Unigram,
        engine_hash_is_router_hash: true,
    };
    let cancel = CancellationToken::new();
    let _stop = cancel.clone().drop_guard();
    let (tx, rx) = mpsc::channel(64);
    for s in found.streams {
        pump.add_stream(s.key.clone(), hashing).unwrap();
        spawn_subscriber(s, Default::default(), tx.clone(), Arc::new(EventMetrics::default()), cancel.clone());
    }
    tokio::spawn(pump.run(rx, cancel.clone()));

    let renderer = renderer::Renderer::builtin().unwrap();
    let hashes = |body: &Value| {
        let tokens = renderer.render_chat(&ChatRequest::from_value(body).unwrap()).unwrap().token_ids;
        let full = tokens.len() / 4 * 4;
        PageHasher::new(NonZeroUsize::new(4).unwrap(), HashMode::Unigram).block_hashes(&tokens[..full], None).unwrap()
    };
    let depth = |q: &[router_types::BlockHash]| {
        index.prefix_depths(q, &MatchOptions::default()).first().map_or(0, |m| m.blocks)
    };
    let a = json!({"messages": [{"role": "user", "content": "a".repeat(60)}]});
    post(&format!("{}/v1/chat/completions", m.url()), &a).await;
    let qa = hashes(&a);
    for _ in 0..200 {
        if depth(&qa) as usize == qa.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(depth(&qa) as usize, qa.len(), "the engine's events taught the index its cache");
    // Fill the cache with other prompts: a's pages are evicted, and the index learns it.
    for i in 0..6 {
        let b = json!({"messages": [{"role": "user", "content": format!("{i}").repeat(60)}]});
        post(&format!("{}/v1/chat/completions", m.url()), &b).await;
    }
    for _ in 0..200 {
        if (depth(&qa) as usize) < qa.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!((depth(&qa) as usize) < qa.len(), "evictions reached the index");
    assert!(m.engine().cached_pages()[0] <= 40);
}

/// A restart (the publisher-restart fault clears the cache) while a request
/// prefills takes that request's pins with it: the request must not later
/// unpin pages another request stored and still holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_prefill_does_not_release_another_requests_pins() {
    let config = MockEngineConfig {
        page_size: 16,
        capacity_tokens: 64, // 4 pages
        prefill_fixed: Duration::from_millis(200),
        decode_per_token: Duration::ZERO,
        ..MockEngineConfig::default()
    };
    let w = MockEngine::spawn(config).await.unwrap();
    let engine = w.engine().clone();
    let p: Vec<u32> = (0..48).collect(); // 3 pages
    let warm = engine.admit(&p, None).await;
    engine.release(&warm);
    // A finds p cached and pins it; the cache is cleared while A prefills.
    let a = tokio::spawn({
        let engine = engine.clone();
        let p = p.clone();
        async move { engine.admit(&p, None).await }
    });
    tokio::time::sleep(Duration::from_millis(80)).await;
    engine.set_faults(Faults { restart_publisher: true, ..Faults::default() }).await;
    let a = a.await.unwrap();
    assert_eq!(a.cached_tokens, 48, "A was served from the cache before the restart");
    // B runs p too and holds it; A ends.
    let b = engine.admit(&p, None).await;
    engine.release(&a);
    // Another prompt needs room: only the page B does not hold may go.
    let other: Vec<u32> = (1000..1048).collect();
    let d = engine.admit(&other, None).await;
    engine.release(&d);
    let e = engine.admit(&p, None).await;
    assert_eq!(e.cached_tokens, 48, "B's pages stayed pinned while B ran");
    engine.release(&e);
    engine.release(&b);
}

/// A streamed answer whose client hangs up after the first chunk is counted as cancelled; one
/// read to its end is not (the overload benchmark counts the router's hang-ups with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_dropped_before_its_end_is_counted_cancelled() {
    let cfg = MockEngineConfig {
        kv_events: false,
        decode_per_token: Duration::from_millis(20),
        default_max_tokens: 20,
        ..MockEngineConfig::default()
    };
    let m = MockEngine::spawn(cfg).await.unwrap();
    let url = format!("{}/v1/chat/completions", m.url());
    let mut body = chat_body("hang up on me");
    body["stream"] = json!(true);
    let cancelled = || m.engine().cancelled_streams.load(std::sync::atomic::Ordering::Relaxed);
    let mut whole = reqwest::Client::new().post(&url).json(&body).send().await.unwrap();
    while whole.chunk().await.unwrap().is_some() {}
    drop(whole);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(cancelled(), 0, "a stream read to its end is not cancelled");
    let mut cut = reqwest::Client::new().post(&url).json(&body).send().await.unwrap();
    assert!(cut.chunk().await.unwrap().is_some());
    drop(cut);
    for _ in 0..200 {
        if cancelled() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(cancelled(), 1);
}

/// The body limit is the router's default (5 MiB), so the engine takes whatever the router
/// admits; a test of a router's own limit sets it lower. Past it: 413, before any handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_are_taken_up_to_the_routers_default_limit() {
    assert_eq!(mock_engine::DEFAULT_MAX_BODY_BYTES, 5 << 20);
    let send = async |url: String, body: String| {
        let client = reqwest::Client::new();
        let r = client.post(url).header("content-type", "application/json").body(body);
        r.timeout(Duration::from_secs(10)).send().await.unwrap().status().as_u16()
    };
    let m = MockEngine::spawn(MockEngineConfig { kv_events: false, ..fast(16, 400_000) }).await.unwrap();
    let abort = format!("{}/abort_request", m.url());
    // Over axum's own default (2 MB), under 5 MiB.
    let (at, over) = (mock_engine::DEFAULT_MAX_BODY_BYTES, mock_engine::DEFAULT_MAX_BODY_BYTES + 1);
    let sized = |n: usize| format!("{{\"rid\": \"{}\"}}", "x".repeat(n - 11));
    assert_eq!(sized(at).len(), at);
    assert_eq!(send(abort.clone(), sized(3 << 20)).await, 200);
    assert_eq!(send(abort.clone(), sized(at)).await, 200);
    assert_eq!(send(abort, sized(over)).await, 413);

    let small = MockEngine::spawn(MockEngineConfig { kv_events: false, max_body_bytes: 1024, ..fast(16, 400_000) })
        .await
        .unwrap();
    let chat = format!("{}/v1/chat/completions", small.url());
    assert_eq!(send(chat.clone(), chat_body("short").to_string()).await, 200);
    assert_eq!(send(chat, chat_body(&"long ".repeat(400)).to_string()).await, 413);
}
