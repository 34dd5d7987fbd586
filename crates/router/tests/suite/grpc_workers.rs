//! gRPC workers: the simulated engine's SGLang scheduler service (`--grpc-listen`) as the
//! real peer sees it: Shepherd Model Gateway 1.13.0 (`smg launch --worker-urls grpc://...`,
//! PyPI) registers it (health, model and server info), answers chats through it, whole and
//! streamed, its prompt cache reported back, and applies its KV events; and `sgl-router` in
//! front of gRPC workers: generation, stop strings, errors, and cache-aware routing from the
//! events the workers stream.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mock_engine::{MockEngine, MockEngineConfig};
use serde_json::{Value, json};

use crate::common::smg::{Smg, smg};

/// The Qwen3 tokenizer and template the project's golden tests use.
fn qwen3() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizers/qwen3").canonicalize().unwrap()
}

/// A simulated engine with Qwen3's tokenizer serving gRPC (its KV events too), its model id
/// the tokenizer's directory (what `smg --model-path` names it).
async fn grpc_engine(dir: &std::path::Path) -> MockEngine {
    grpc_engine_serving(dir, engine_grpc::Service::Sglang).await
}

/// The same, serving `service`.
async fn grpc_engine_serving(dir: &std::path::Path, service: engine_grpc::Service) -> MockEngine {
    let config = MockEngineConfig {
        model_id: dir.display().to_string(),
        grpc_listen: Some("127.0.0.1:0".parse().unwrap()),
        grpc_service: service,
        kv_events: true,
        fast: true,
        ..MockEngineConfig::default()
    };
    MockEngine::spawn_with(config, renderer::Renderer::from_dir(dir, None).unwrap()).await.unwrap()
}

/// A simulated engine serving gRPC with Qwen3's tokenizer, which it hands over on
/// `GetTokenizer` (its model id `qwen3`), and the tokenizer's directory.
async fn handing_its_tokenizer_over() -> (PathBuf, MockEngine) {
    let dir = qwen3();
    let config = MockEngineConfig {
        model_id: "qwen3".into(),
        grpc_listen: Some("127.0.0.1:0".parse().unwrap()),
        tokenizer_dir: Some(dir.clone()),
        fast: true,
        ..MockEngineConfig::default()
    };
    let engine = MockEngine::spawn_with(config, renderer::Renderer::from_dir(&dir, None).unwrap()).await.unwrap();
    (dir, engine)
}

/// The answer's text, content and reasoning together (smg's Qwen3 reasoning parser takes an
/// answer without `</think>` for reasoning).
fn text_of(message: &Value) -> String {
    ["reasoning_content", "content"].iter().filter_map(|k| message.get(*k).and_then(Value::as_str)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smg_answers_chats_through_the_simulated_engines_grpc_service() {
    let Some(smg) = smg("the smg gRPC interop test") else { return };
    let dir = qwen3();
    let engine = grpc_engine(&dir).await;
    let grpc = engine.grpc_url().unwrap();
    let log = std::env::temp_dir().join(format!("smg-grpc-{}.log", std::process::id()));
    let model = dir.display().to_string();
    let router = Smg::launch(&smg, &["--worker-urls", &grpc, "--model-path", &model], &log);
    let http = reqwest::Client::new();
    // Registered once smg asked its health, model and server info: a healthy gRPC worker.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let workers = http.get(format!("{}/workers", router.url)).send().await.ok();
        let workers: Option<Value> = match workers {
            Some(r) => r.json().await.ok(),
            None => None,
        };
        let ready = workers.as_ref().and_then(|w| w["workers"].as_array()).is_some_and(|w| {
            w.iter().any(|w| w["url"] == grpc.as_str() && w["connection_mode"] == "grpc" && w["is_healthy"] == true)
        });
        if ready {
            break;
        }
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(Instant::now() < deadline, "smg never registered {grpc}: {workers:?}\n{log}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The mock's answer, token ids in, token ids out: its words, detokenized by smg.
    let expected = " the cache is warm and routing works.";
    let content = "Tell me about prefix caches in LLM serving, and how a router keeps them warm across replicas.";
    let body = json!({"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": content}]});
    // Its tokenizer registers in the background: until then smg answers 503 `tokenizer_not_ready`.
    let whole: Value = loop {
        let r = http.post(format!("{}/v1/chat/completions", router.url)).json(&body).send().await.unwrap();
        let answer: Value = r.json().await.unwrap();
        if answer["error"]["code"] != "tokenizer_not_ready" {
            break answer;
        }
        assert!(Instant::now() < deadline, "smg's tokenizer never registered: {answer}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let message = &whole["choices"][0]["message"];
    assert_eq!(text_of(message), expected, "{whole}");
    assert_eq!(whole["choices"][0]["finish_reason"], "length", "{whole}");
    assert_eq!(whole["usage"]["completion_tokens"], 8, "{whole}");
    let prompt = whole["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt >= 16, "the prompt as smg tokenized it: {whole}");

    // Streamed, the same prompt: the same words in deltas, and the pages the first one stored
    // reported back as cached.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let sse = http
        .post(format!("{}/v1/chat/completions", router.url))
        .json(&streamed)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let chunks: Vec<Value> = sse
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(sse.trim_end().ends_with("data: [DONE]"), "{sse}");
    let text: String = chunks.iter().filter_map(|c| c["choices"].get(0)).map(|c| text_of(&c["delta"])).collect();
    assert_eq!(text, expected, "{sse}");
    let usage = chunks.iter().rev().find_map(|c| c.get("usage").filter(|u| !u.is_null())).expect("a usage chunk");
    assert_eq!(usage["prompt_tokens"].as_u64(), Some(prompt), "{usage}");
    let cached = usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
    assert_eq!(cached, prompt / 16 * 16, "the first chat's full pages, cached: {usage}");
    assert_eq!(engine.engine().requests.load(Ordering::Relaxed), 2, "both chats reached the engine over gRPC");
    // smg took the engine's KV events from its SubscribeKvEvents stream: batches applied, blocks stored.
    let series = |page: &str, name: &str| -> f64 {
        page.lines().filter(|l| l.starts_with(name)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
    };
    let page = loop {
        let page = http.get(&router.metrics).send().await.unwrap().text().await.unwrap();
        if series(&page, "smg_kv_event_batches_total{") >= 1.0 || Instant::now() > deadline {
            break page;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let applied = format!("smg_kv_event_batches_total{{worker=\"{grpc}\",disposition=\"applied\"}}");
    assert!(series(&page, &applied) >= 1.0, "smg applied the engine's event batches:\n{page}");
    let stored = format!("smg_kv_event_blocks_total{{worker=\"{grpc}\",op=\"stored\"}}");
    assert!(series(&page, &stored) >= (prompt / 16) as f64, "the first chat's pages:\n{page}");
    drop(router);
    let _ = std::fs::remove_file(&log);
}

/// smg 1.13 given no `--model-path` takes the model's tokenizer from the simulated engine
/// (`GetTokenizer`: its tokenizer files as one zip, the SHA-256 on the last chunk), as it does
/// from SGLang's servicer, and tokenizes the prompt with it: the archive's form, checked by the
/// real peer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smg_takes_the_simulated_engines_tokenizer_over_grpc() {
    let Some(smg) = smg("the smg GetTokenizer interop test") else { return };
    let (dir, engine) = handing_its_tokenizer_over().await;
    let grpc = engine.grpc_url().unwrap();
    let log = std::env::temp_dir().join(format!("smg-grpc-tokenizer-{}.log", std::process::id()));
    let router = Smg::launch(&smg, &["--worker-urls", &grpc], &log);
    let http = reqwest::Client::new();
    let content = "Routing by KV cache: 缓存命中 🚀";
    let body = json!({"model": "qwen3", "max_tokens": 4, "messages": [{"role": "user", "content": content}]});
    // Until the worker registers and its tokenizer is fetched, smg answers with an error.
    let deadline = Instant::now() + Duration::from_secs(60);
    let whole: Value = loop {
        let answer: Option<Value> =
            match http.post(format!("{}/v1/chat/completions", router.url)).json(&body).send().await {
                Ok(r) => r.json().await.ok(),
                Err(_) => None,
            };
        if let Some(a) = answer.filter(|a| a.get("choices").is_some()) {
            break a;
        }
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(Instant::now() < deadline, "smg never answered with the engine's tokenizer:\n{log}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let asked = renderer::ChatRequest::from_json(body.to_string().as_bytes()).unwrap();
    let qwen = renderer::Renderer::from_dir(&dir, None).unwrap().render_chat(&asked).unwrap().token_ids;
    // smg has no model of its own here (no --model-path, no hub): Qwen3's count is the fetched one's.
    assert_eq!(whole["usage"]["prompt_tokens"], json!(qwen.len()), "Qwen3's tokens of the prompt: {whole}");
    drop(router);
    let _ = std::fs::remove_file(&log);
}

/// Two simulated engines serving gRPC to the router (the built-in byte-level model), their KV
/// events on its `SubscribeKvEvents` when `kv_events`.
async fn engines(kv_events: bool) -> (MockEngine, MockEngine) {
    let config = || MockEngineConfig {
        grpc_listen: Some("127.0.0.1:0".parse().unwrap()),
        kv_events,
        fast: true,
        ..MockEngineConfig::default()
    };
    (MockEngine::spawn(config()).await.unwrap(), MockEngine::spawn(config()).await.unwrap())
}

async fn grpc_engines() -> (MockEngine, MockEngine) {
    engines(false).await
}

/// A router in front of `engines`' gRPC services.
async fn grpc_router(engines: &[&MockEngine]) -> crate::common::app::Running {
    grpc_router_with(engines, false).await
}

/// A router in front of `engines`' gRPC services, following their KV events when `kv`.
async fn grpc_router_with(engines: &[&MockEngine], kv: bool) -> crate::common::app::Running {
    use crate::common::app::{config, start};
    let mut c = config(&[], sgl_router::app::PolicyConfig::cache_aware(), kv);
    c.workers = engines.iter().map(|e| router_types::WorkerUrl::parse(&e.grpc_url().unwrap()).unwrap()).collect();
    start(c).await
}

/// An engine whose gRPC answers are `reply`'s tokens, behind a router configured by `configure`.
async fn replying(
    reply: &str,
    configure: impl FnOnce(&mut sgl_router::app::AppConfig),
) -> (MockEngine, crate::common::app::Running) {
    let config = MockEngineConfig {
        grpc_listen: Some("127.0.0.1:0".parse().unwrap()),
        kv_events: false,
        fast: true,
        reply_text: Some(reply.into()),
        ..MockEngineConfig::default()
    };
    let engine = MockEngine::spawn(config).await.unwrap();
    let mut c = crate::common::app::config(&[], sgl_router::app::PolicyConfig::cache_aware(), false);
    c.workers = vec![router_types::WorkerUrl::parse(&engine.grpc_url().unwrap()).unwrap()];
    configure(&mut c);
    (engine, crate::common::app::start(c).await)
}

/// The JSON answer to `body` posted to the router's chat route.
async fn chat_json(router: &crate::common::app::Running, body: &Value) -> Value {
    let r = reqwest::Client::new().post(format!("{}/v1/chat/completions", router.url)).json(body).send().await.unwrap();
    r.json().await.unwrap()
}

/// The SSE answer to `body` streamed from the router's chat route, and its events.
async fn chat_streamed(router: &crate::common::app::Running, body: &Value) -> (String, Vec<Value>) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let r =
        reqwest::Client::new().post(format!("{}/v1/chat/completions", router.url)).json(&body).send().await.unwrap();
    let sse = r.text().await.unwrap();
    let chunks = events(&sse);
    (sse, chunks)
}

/// The SSE events of a streamed answer, `[DONE]` last.
fn events(sse: &str) -> Vec<Value> {
    assert!(sse.trim_end().ends_with("data: [DONE]"), "{sse}");
    sse.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_answers_chats_completions_and_generate_through_grpc_workers() {
    let (e0, e1) = grpc_engines().await;
    let router = grpc_router(&[&e0, &e1]).await;
    let http = reqwest::Client::new();
    let post = |path: &str, body: Value| {
        let req = http.post(format!("{}{path}", router.url)).json(&body);
        async move {
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 200);
            r
        }
    };
    let chat = |extra: Value| {
        let mut body = json!({"model": "default", "max_tokens": 64,
                              "messages": [{"role": "user", "content": "Where do requests go?"}]});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    // Whole, two sequences, a stop string that spans tokens: cut, never shown.
    let whole: Value =
        post("/v1/chat/completions", chat(json!({"n": 2, "stop": ["routing"]}))).await.json().await.unwrap();
    for i in 0..2 {
        let choice = &whole["choices"][i];
        assert_eq!(choice["message"]["content"], " the cache is warm and ", "{whole}");
        assert_eq!(choice["finish_reason"], "stop", "{whole}");
        assert_eq!(choice["matched_stop"], "routing", "{whole}");
    }
    assert!(whole["usage"]["prompt_tokens"].as_u64().unwrap() > 0, "{whole}");
    assert_eq!(whole["object"], "chat.completion");
    // Streamed: the same text in deltas, the role first, the finish last, then the usage.
    let sse = post(
        "/v1/chat/completions",
        chat(json!({"stream": true, "stop": "routing", "stream_options": {"include_usage": true}})),
    )
    .await
    .text()
    .await
    .unwrap();
    let chunks = events(&sse);
    let deltas: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"].get(0)).collect();
    assert_eq!(deltas[0]["delta"]["role"], "assistant", "{sse}");
    let text: String = deltas.iter().filter_map(|c| c["delta"]["content"].as_str()).collect();
    assert_eq!(text, " the cache is warm and ", "{sse}");
    assert_eq!(deltas.last().unwrap()["finish_reason"], "stop", "{sse}");
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"].as_u64(), Some(" the cache is warm and routing".len() as u64), "{sse}");
    // Logprobs, as the engine reports them (every token -0.1 here), one entry a token.
    let with_lp: Value =
        post("/v1/chat/completions", chat(json!({"max_tokens": 4, "logprobs": true}))).await.json().await.unwrap();
    let content = with_lp["choices"][0]["logprobs"]["content"].as_array().expect("logprobs.content");
    assert_eq!(content.len(), 4, "{with_lp}");
    assert!(content.iter().all(|t| (t["logprob"].as_f64().unwrap() + 0.1).abs() < 1e-6), "{with_lp}");
    let tokens: String = content.iter().map(|t| t["token"].as_str().unwrap()).collect();
    assert_eq!(tokens, with_lp["choices"][0]["message"]["content"], "each entry names its token: {with_lp}");
    // No stop: max_tokens ends it ("length"); a completion and SGLang's /generate.
    let body = json!({"model": "default", "prompt": "Say it", "max_tokens": 10});
    let done: Value = post("/v1/completions", body).await.json().await.unwrap();
    assert_eq!(
        (done["choices"][0]["text"].as_str(), done["choices"][0]["finish_reason"].as_str()),
        (Some(" the cache"), Some("length")),
        "{done}"
    );
    let body = json!({"text": "Say it", "sampling_params": {"max_new_tokens": 4}});
    let generated: Value = post("/generate", body).await.json().await.unwrap();
    assert_eq!(generated["text"], " the", "{generated}");
    assert_eq!(generated["meta_info"]["finish_reason"]["type"], "length", "{generated}");
    assert_eq!(generated["output_ids"].as_array().map(Vec::len), Some(4), "{generated}");
    // Every request reached an engine over gRPC (none over HTTP: the engines' HTTP ports are unknown to the router).
    let served = e0.engine().requests.load(Ordering::Relaxed) + e1.engine().requests.load(Ordering::Relaxed);
    assert_eq!(served, 5);
    let _ = router.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_failure_is_the_clients_502_and_a_bad_parameter_is_named() {
    let (e0, _e1) = grpc_engines().await;
    let router = grpc_router(&[&e0]).await;
    let http = reqwest::Client::new();
    let chat = json!({"model": "default", "n": 99, "messages": [{"role": "user", "content": "hi"}]});
    let r = http.post(format!("{}/v1/chat/completions", router.url)).json(&chat).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("`n` must be 1 to 16"));
    // The engine ends the call with an error status: a 502 naming it, nothing made up.
    e0.engine().set_faults(mock_engine::Faults { fail_next: 1, fail_status: 503, ..Default::default() }).await;
    let body = json!({"model": "default", "prompt": "Say it", "max_tokens": 2});
    let r = http.post(format!("{}/v1/completions", router.url)).json(&body).send().await.unwrap();
    let status = r.status();
    let text = r.text().await.unwrap();
    assert_eq!(status, 502, "{text}");
    assert!(text.contains("injected failure"), "{text}");
    // And the next one is served.
    let r = http.post(format!("{}/v1/completions", router.url)).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let _ = router.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_aware_routing_follows_the_kv_events_a_grpc_worker_streams() {
    use crate::common::app::admin_post;
    let (w0, w1) = engines(true).await;
    let router = grpc_router_with(&[&w0, &w1], true).await;
    let (g0, g1) = (w0.grpc_url().unwrap(), w1.grpc_url().unwrap());
    let system = "A long shared system prompt about prefix caches. ".repeat(40);
    let chat = |user: &str| {
        json!({"model": "default", "max_tokens": 2,
               "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]})
    };
    // w1 alone holds the system prompt (served on its HTTP port, which the router does not know):
    // the router learns it from w1's gRPC event stream only.
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", w1.url()))
        .json(&chat("warm up"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let q = chat("a question");
    let debug = async |body: &Value| -> Value {
        admin_post(&format!("{}/debug/route", router.url), body).await.json().await.unwrap()
    };
    crate::common::eventually("the index learned w1's cache over gRPC", async || {
        let d = debug(&q).await;
        d["worker"] == g1.as_str() && d["reason"] == "cache_hit"
    })
    .await;
    let d = debug(&q).await;
    let matched = |url: &str| {
        d["candidates"].as_array().unwrap().iter().find(|c| c["worker"] == url).unwrap()["matched_tokens"]
            .as_u64()
            .unwrap()
    };
    assert!(matched(&g1) >= 1024 && matched(&g0) == 0, "{d}");
    // Sent there, its engine reports the cached prefix.
    let answer: Value = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", router.url))
        .json(&q)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached >= matched(&g1) / 16 * 16 && cached > 0, "{answer} {d}");
    // The engine empties its cache: its AllBlocksCleared comes over gRPC too, and the hit is gone.
    w1.engine().flush_cache().await;
    crate::common::eventually("the index forgot w1's cache", async || {
        let d = debug(&q).await;
        d["candidates"].as_array().unwrap().iter().all(|c| c["matched_tokens"] == 0)
    })
    .await;
    let _ = router.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_stream_stops_the_generation() {
    // Real decode time: 1,000 tokens would take 10 s.
    let config = MockEngineConfig {
        grpc_listen: Some("127.0.0.1:0".parse().unwrap()),
        kv_events: false,
        ..MockEngineConfig::default()
    };
    let engine = MockEngine::spawn(config).await.unwrap();
    let router = grpc_router(&[&engine]).await;
    let body = json!({"model": "default", "max_tokens": 1000, "stream": true,
                      "messages": [{"role": "user", "content": "Tell me everything."}]});
    let mut r =
        reqwest::Client::new().post(format!("{}/v1/chat/completions", router.url)).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let first = r.chunk().await.unwrap().expect("a first event");
    assert!(String::from_utf8_lossy(&first).starts_with("data: "), "{first:?}");
    drop(r);
    let started = Instant::now();
    crate::common::eventually("the engine stopped generating for no one", async || {
        engine.engine().cancelled_streams.load(Ordering::Relaxed) == 1
            && engine.engine().loads().iter().all(|l| l.num_running_reqs == 0)
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(5), "stopped long before its 1,000 tokens");
    // The router let go of the request's load.
    crate::common::eventually("the router released its load", async || router.gateway.in_flight() == 0).await;
    let _ = router.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reasoning_models_thinking_is_told_apart_from_its_answer() {
    let reply = "Let me think: 6 times 7.</think>The answer is 42.";
    let (_engine, router) = replying(reply, |c| c.reasoning_parser = Some("deepseek_r1".into())).await;
    // Every token of the reply (the byte-level model: one a byte), no stop.
    let body =
        json!({"model": "default", "max_tokens": reply.len(), "messages": [{"role": "user", "content": "6 x 7?"}]});
    let whole = chat_json(&router, &body).await;
    let message = &whole["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "Let me think: 6 times 7.", "{whole}");
    assert_eq!(message["content"], "The answer is 42.", "{whole}");
    let (sse, chunks) = chat_streamed(&router, &body).await;
    let joined =
        |field: &str| -> String { chunks.iter().filter_map(|c| c["choices"][0]["delta"][field].as_str()).collect() };
    assert_eq!(joined("reasoning_content"), "Let me think: 6 times 7.", "{sse}");
    assert_eq!(joined("content"), "The answer is 42.", "{sse}");
    // Asked to keep it in the content: as the model wrote it.
    let mut together = body.clone();
    together["separate_reasoning"] = json!(false);
    let whole = chat_json(&router, &together).await;
    assert_eq!(whole["choices"][0]["message"]["content"], reply, "{whole}");
    let _ = router.stop.send(());
}

/// A chat template that opens the reasoning in the prompt (a thinking model's), or closes it
/// when the request turns thinking off (`chat_template_kwargs.enable_thinking: false`), as
/// Qwen3's does: the answer's split follows the prompt, as the engines' own servers split it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prompt_decides_whether_the_answer_starts_in_its_reasoning() {
    // Removed when dropped, a failed test's too.
    let file = tempfile::Builder::new().prefix("sgl-router-thinking-").suffix(".jinja").tempfile().unwrap();
    let template = file.path().to_path_buf();
    std::fs::write(
        &template,
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>\
         {% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}",
    )
    .unwrap();
    let reply = "Six sevens.</think>42";
    let (_engine, router) = replying(reply, |c| {
        c.reasoning_parser = Some("qwen3".into());
        c.chat_template = Some(template.clone());
    })
    .await;
    let body =
        json!({"model": "default", "max_tokens": reply.len(), "messages": [{"role": "user", "content": "6 x 7?"}]});
    // The prompt opened `<think>`: the answer, with none of its own, is reasoning until `</think>`
    // (`qwen3` on its own would wait for a `<think>` that never comes).
    let whole = chat_json(&router, &body).await;
    let message = &whole["choices"][0]["message"];
    assert_eq!(
        (message["reasoning_content"].as_str(), message["content"].as_str()),
        (Some("Six sevens."), Some("42")),
        "{whole}"
    );
    let (sse, chunks) = chat_streamed(&router, &body).await;
    let joined =
        |field: &str| -> String { chunks.iter().filter_map(|c| c["choices"][0]["delta"][field].as_str()).collect() };
    assert_eq!((joined("reasoning_content"), joined("content")), ("Six sevens.".into(), "42".into()), "{sse}");
    // Thinking off: the prompt closed the reasoning, so the answer is all content.
    let mut off = body.clone();
    off["chat_template_kwargs"] = json!({"enable_thinking": false});
    let whole = chat_json(&router, &off).await;
    assert_eq!(whole["choices"][0]["message"]["content"], reply, "{whole}");
    assert!(whole["choices"][0]["message"]["reasoning_content"].is_null(), "{whole}");
    let _ = router.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_are_read_out_of_the_answer_whole_and_streamed() {
    // Ended by a tab, the sequence's stop token here (as an end-of-turn token would end it).
    let reply =
        "I will look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n</tool_call>\t";
    let (_engine, router) = replying(reply, |c| c.tool_call_parser = Some("qwen".into())).await;
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
    // The byte-level model: one token a byte; the engine ends the sequence ("stop") with its last.
    let body = json!({"model": "default", "max_tokens": reply.len(), "stop_token_ids": [u32::from(b'\t')], "tools": tools,
                      "messages": [{"role": "user", "content": "Weather in Zürich?"}]});
    let whole = chat_json(&router, &body).await;
    let choice = &whole["choices"][0];
    assert_eq!(choice["message"]["content"], "I will look.", "{whole}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function", "{whole}");
    assert_eq!(call["function"]["name"], "get_weather", "{whole}");
    assert_eq!(call["function"]["arguments"], r#"{"city": "Zürich"}"#, "{whole}");
    assert!(call["id"].as_str().unwrap().starts_with("call_"), "{whole}");
    assert_eq!(choice["finish_reason"], "tool_calls", "{whole}");
    // Streamed: the content, then the call whole in one delta, then the finish.
    let (sse, chunks) = chat_streamed(&router, &body).await;
    let content: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(content.trim(), "I will look.", "{sse}");
    let calls: Vec<&Value> =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array()).flatten().collect();
    assert_eq!(calls.len(), 1, "{sse}");
    assert_eq!(
        (calls[0]["index"].as_u64(), calls[0]["function"]["name"].as_str()),
        (Some(0), Some("get_weather")),
        "{sse}"
    );
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls", "{sse}");
    // A request that offers no tools: the text as the model wrote it.
    let mut plain = body.clone();
    plain.as_object_mut().unwrap().remove("tools");
    let whole = chat_json(&router, &plain).await;
    assert_eq!(whole["choices"][0]["message"]["content"], reply, "{whole}");
    assert_eq!(whole["choices"][0]["finish_reason"], "stop", "{whole}");
    let _ = router.stop.send(());
}

/// A gRPC engine that answers `Generate` wrongly, as `mode` says: healthy otherwise.
struct Hostile {
    mode: std::sync::atomic::AtomicU8,
}

const OTHER_REQUEST: u8 = 0;
const ENDS_EARLY: u8 = 1;
const BAD_TOKEN: u8 = 2;
const HUGE_FRAME: u8 = 3;
const NO_SUCH_SEQUENCE: u8 = 4;
const FINE: u8 = 5;

impl grpc_wire::Handler for Hostile {
    fn call(
        self: std::sync::Arc<Self>,
        path: &str,
        mut calls: grpc_wire::Messages,
        replies: grpc_wire::Replies,
    ) -> Option<grpc_wire::Started> {
        use engine_grpc::proto::*;
        let path = path.to_owned();
        Some(Box::pin(async move {
            let ok = grpc_wire::Status::ok();
            match path.as_str() {
                engine_grpc::path::HEALTH_CHECK => {
                    let _ = replies.send(&HealthCheckResponse { healthy: true, message: String::new() }).await;
                }
                engine_grpc::path::GET_MODEL_INFO => {
                    let _ = replies
                        .send(&GetModelInfoResponse { served_model_name: "hostile".into(), ..Default::default() })
                        .await;
                }
                engine_grpc::path::GET_SERVER_INFO => {
                    let _ = replies.send(&GetServerInfoResponse::default()).await;
                }
                engine_grpc::path::GET_LOADS => {
                    let _ = replies.send(&GetLoadsResponse::default()).await;
                }
                engine_grpc::path::GENERATE => {
                    let Ok(Some(asked)) = calls.next::<GenerateRequest>().await else { return ok };
                    let id = asked.request_id.clone();
                    let chunk = |ids: Vec<u32>, index| GenerateResponse {
                        request_id: id.clone(),
                        response: Some(Generated::Chunk(GenerateStreamChunk {
                            token_ids: ids,
                            prompt_tokens: 3,
                            index,
                            ..Default::default()
                        })),
                    };
                    match self.mode.load(Ordering::Relaxed) {
                        OTHER_REQUEST => {
                            let mut m = chunk(vec![104], 0);
                            m.request_id = "someone-else".into();
                            let _ = replies.send(&m).await;
                        }
                        ENDS_EARLY => {
                            let _ = replies.send(&chunk(vec![104], 0)).await;
                        }
                        BAD_TOKEN => {
                            let _ = replies.send(&chunk(vec![1_000_000_000], 0)).await;
                        }
                        HUGE_FRAME => {
                            // A message claiming 64 MiB: past the router's bound, never read.
                            let mut frame = vec![0u8];
                            frame.extend_from_slice(&(64u32 << 20).to_be_bytes());
                            let _ = replies.send_frame(http_body::Frame::data(bytes::Bytes::from(frame))).await;
                        }
                        NO_SUCH_SEQUENCE => {
                            let _ = replies.send(&chunk(vec![104], 5)).await;
                        }
                        _ => {
                            let _ = replies.send(&chunk(vec![104, 105], 0)).await;
                            let complete = GenerateComplete {
                                finish_reason: "stop".into(),
                                completion_tokens: 2,
                                prompt_tokens: 3,
                                ..Default::default()
                            };
                            let m = GenerateResponse {
                                request_id: id.clone(),
                                response: Some(Generated::Complete(complete)),
                            };
                            let _ = replies.send(&m).await;
                        }
                    }
                }
                _ => return grpc_wire::Status::new(grpc_wire::Status::UNIMPLEMENTED, "no such method"),
            }
            ok
        }))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_grpc_engine_gets_precise_errors_counted_and_the_router_serves_on() {
    let hostile = std::sync::Arc::new(Hostile { mode: std::sync::atomic::AtomicU8::new(FINE) });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = hostile.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let h = server.clone();
            tokio::spawn(grpc_wire::serve_connection(tcp, h, grpc_wire::Limits::default(), std::future::pending()));
        }
    });
    let mut c = crate::common::app::config(&[], sgl_router::app::PolicyConfig::cache_aware(), false);
    c.workers = vec![router_types::WorkerUrl::parse(&format!("grpc://{addr}")).unwrap()];
    let router = crate::common::app::start(c).await;
    let body = |stream: bool| json!({"model": "default", "max_tokens": 4, "stream": stream, "messages": [{"role": "user", "content": "hi"}]});
    let post = async |stream: bool| {
        let r = reqwest::Client::new()
            .post(format!("{}/v1/chat/completions", router.url))
            .json(&body(stream))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };
    let fine = post(false).await;
    assert_eq!(fine.0, 200, "{}", fine.1);
    // Each misbehaviour, whole: a 502 that says what went wrong; streamed: an error event after the head.
    for (mode, says) in [
        (OTHER_REQUEST, "not this one"),
        (ENDS_EARLY, "ended the call without an answer"),
        (BAD_TOKEN, "outside the vocabulary"),
        (HUGE_FRAME, "over this server's"),
        (NO_SUCH_SEQUENCE, "sequence 5 of 1"),
    ] {
        hostile.mode.store(mode, Ordering::Relaxed);
        let (status, text) = post(false).await;
        assert_eq!(status, 502, "mode {mode}: {text}");
        assert!(text.contains(says), "mode {mode}: {text}");
        if mode != OTHER_REQUEST && mode != BAD_TOKEN && mode != NO_SUCH_SEQUENCE {
            continue;
        }
        let (status, sse) = post(true).await;
        // The first message is read before the head: a bad one is still the client's 502.
        assert_eq!(status, 502, "mode {mode} streamed: {sse}");
    }
    let page = crate::common::app::admin_get(&format!("{}/metrics", router.url)).await.text().await.unwrap();
    let failures = |kind: &str| -> f64 {
        let series = format!("router_grpc_failures_total{{kind=\"{kind}\"}}");
        page.lines().find_map(|l| l.strip_prefix(series.as_str())?.trim().parse().ok()).unwrap_or(0.0)
    };
    assert_eq!(failures("bad_message"), 6.0, "{page}");
    assert_eq!(failures("broken"), 1.0, "{page}");
    assert_eq!(failures("status"), 1.0, "the huge frame: {page}");
    // And it serves on.
    hostile.mode.store(FINE, Ordering::Relaxed);
    let (status, text) = post(false).await;
    assert_eq!(status, 200, "{text}");
    let _ = router.stop.send(());
}

/// With no `--tokenizer-path`, the router takes its gRPC workers' own tokenizer (`GetTokenizer`,
/// the model directory's files as one zip): its prompts are then Qwen3's tokens and chat
/// template, as the engine's, not the built-in byte-level model's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_tokenizer_path_the_router_takes_its_grpc_workers_own() {
    let (dir, engine) = handing_its_tokenizer_over().await;
    let qwen = renderer::Renderer::from_dir(&dir, None).unwrap();
    let mut c = crate::common::app::config(&[], sgl_router::app::PolicyConfig::cache_aware(), false);
    c.workers = vec![router_types::WorkerUrl::parse(&engine.grpc_url().unwrap()).unwrap()];
    assert!(c.tokenizer_path.is_none());
    let router = crate::common::app::start(c).await;

    let text = "Routing by KV cache: 缓存命中 🚀";
    let v: Value = crate::common::app::post(&format!("{}/v1/tokenize", router.url), &json!({"prompt": text}))
        .await
        .json()
        .await
        .unwrap();
    let expected = qwen.tokenizer().encode(text, false).unwrap();
    assert_ne!(expected, renderer::Renderer::builtin().unwrap().tokenizer().encode(text, false).unwrap());
    assert_eq!(v["tokens"], json!(expected), "{v}");

    // A chat: the prompt the worker counts is Qwen3's render of it.
    let body = json!({"model": "qwen3", "max_tokens": 4, "messages": [{"role": "user", "content": text}]});
    let answer = chat_json(&router, &body).await;
    let asked = renderer::ChatRequest::from_json(body.to_string().as_bytes()).unwrap();
    let rendered = qwen.render_chat(&asked).unwrap().token_ids;
    assert_eq!(answer["usage"]["prompt_tokens"], json!(rendered.len()), "{answer}");

    // A worker with no model directory refuses (as SGLang's servicer): the router serves with its
    // built-in byte-level model, as without gRPC workers.
    let bare = MockEngine::spawn(MockEngineConfig {
        grpc_listen: Some("127.0.0.1:0".parse().unwrap()),
        fast: true,
        ..MockEngineConfig::default()
    })
    .await
    .unwrap();
    let mut c = crate::common::app::config(&[], sgl_router::app::PolicyConfig::cache_aware(), false);
    c.workers = vec![router_types::WorkerUrl::parse(&bare.grpc_url().unwrap()).unwrap()];
    let router = crate::common::app::start(c).await;
    let builtin = renderer::Renderer::builtin().unwrap().tokenizer().encode(text, false).unwrap();
    assert_eq!(router.gateway.default_pool().renderer.tokenizer().encode(text, false).unwrap(), builtin);
}

/// vLLM's engine service (`vllm serve --grpc`, `vllm_engine.proto`): the router finds which
/// service a worker serves (SGLang's is unknown to it), speaks vLLM's messages to it, and
/// follows its KV events over the same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllms_grpc_service_answers_and_its_kv_events_steer_cache_aware_routing() {
    use crate::common::app::admin_post;
    let config = || MockEngineConfig {
        grpc_listen: Some("127.0.0.1:0".parse().unwrap()),
        grpc_service: engine_grpc::Service::Vllm,
        kv_events: true,
        fast: true,
        ..MockEngineConfig::default()
    };
    let (w0, w1) = (MockEngine::spawn(config()).await.unwrap(), MockEngine::spawn(config()).await.unwrap());
    let router = grpc_router_with(&[&w0, &w1], true).await;
    let chat = json!({"model": "default", "max_tokens": 64, "n": 2, "stop": ["routing"], "logprobs": true,
                      "messages": [{"role": "user", "content": "Where do requests go?"}]});
    // Whole: two sequences, the stop string cut, vLLM's logprobs read.
    let whole = chat_json(&router, &chat).await;
    for i in 0..2 {
        let choice = &whole["choices"][i];
        assert_eq!(choice["message"]["content"], " the cache is warm and ", "{whole}");
        assert_eq!(choice["finish_reason"], "stop", "{whole}");
        assert!(!choice["logprobs"]["content"].as_array().unwrap().is_empty(), "{whole}");
    }
    // Streamed: the same text.
    let (sse, chunks) = chat_streamed(
        &router,
        &json!({"model": "default", "max_tokens": 64, "stop": "routing",
        "messages": [{"role": "user", "content": "Where do requests go?"}]}),
    )
    .await;
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, " the cache is warm and ", "{sse}");
    // Its KV events over gRPC: a prompt w1 alone holds goes to w1.
    let system = "A long shared system prompt about prefix caches. ".repeat(40);
    let ask = |user: &str| {
        json!({"model": "default", "max_tokens": 2,
               "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]})
    };
    let r = reqwest::Client::new().post(format!("{}/v1/chat/completions", w1.url())).json(&ask("warm")).send().await;
    assert_eq!(r.unwrap().status(), 200);
    let q = ask("a question");
    let g1 = w1.grpc_url().unwrap();
    crate::common::eventually("the index learned w1's cache from vLLM's service", async || {
        let d: Value = admin_post(&format!("{}/debug/route", router.url), &q).await.json().await.unwrap();
        d["worker"] == g1.as_str() && d["reason"] == "cache_hit"
    })
    .await;
    let answer = chat_json(&router, &q).await;
    assert!(answer["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0, "{answer}");
    let served = w0.engine().requests.load(Ordering::Relaxed) + w1.engine().requests.load(Ordering::Relaxed);
    assert_eq!(served, 4, "three over gRPC, and w1's warm-up over HTTP");
    let _ = router.stop.send(());
}

/// smg 1.13 with `--backend vllm` (its vLLM gRPC client, built from the same protocol) answers a
/// chat through the simulated engine's vLLM service: the messages' form, checked by the real peer.
/// The engine serves vLLM's service only (SGLang's methods are UNIMPLEMENTED there), so an
/// answer came through vLLM's `Generate`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smg_answers_a_chat_through_the_simulated_engines_vllm_service() {
    let Some(smg) = smg("the smg vLLM gRPC interop test") else { return };
    let dir = qwen3();
    let engine = grpc_engine_serving(&dir, engine_grpc::Service::Vllm).await;
    let grpc = engine.grpc_url().unwrap();
    let log = std::env::temp_dir().join(format!("smg-vllm-grpc-{}.log", std::process::id()));
    let model = dir.display().to_string();
    let args = ["--backend", "vllm", "--worker-urls", &grpc, "--model-path", &model];
    let router = Smg::launch(&smg, &args, &log);
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let content = "Tell me about prefix caches in LLM serving, and how a router keeps them warm across replicas.";
    let body = json!({"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": content}]});
    // Until smg registered the worker and its tokenizer it answers with an error: asked again.
    let whole: Value = loop {
        let answer: Option<Value> =
            match http.post(format!("{}/v1/chat/completions", router.url)).json(&body).send().await {
                Ok(r) => r.json().await.ok(),
                Err(_) => None,
            };
        if let Some(a) = answer.as_ref().filter(|a| a["choices"].is_array()) {
            break a.clone();
        }
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(Instant::now() < deadline, "smg never answered through {grpc}: {answer:?}\n{log}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(text_of(&whole["choices"][0]["message"]), " the cache is warm and routing works.", "{whole}");
    assert_eq!(whole["usage"]["completion_tokens"], 8, "{whole}");
    assert!(engine.engine().requests.load(Ordering::Relaxed) >= 1, "answered by the engine over gRPC");
    drop(router);
    let _ = std::fs::remove_file(&log);
}
