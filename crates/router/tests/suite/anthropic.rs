//! Anthropic's Messages API through the router: `POST /v1/messages` routed by
//! the prompt the engine renders of it (the same page hashes as the chat it
//! converts to, matched against the KV events of simulated engines), answered
//! and streamed in Anthropic's shape, `count_tokens` passed through, the
//! router's own errors in Anthropic's shape (a worker dying mid-stream too),
//! `x-api-key` taken as the client's key; and Anthropic's own Python SDK as the
//! client (`tests/anthropic/sdk_client.py`, from the venv of
//! `tests/kv_events/setup_venv.sh`: `SGL_ROUTER_KV_PYTHON`, set by `.ci/run`).

use crate::common;

use common::app::{admin_post, chat, config, engine_config, start};
use common::eventually as until;
use mock_engine::{Faults, MockEngine};
use serde_json::{Value, json};
use sgl_router::app::PolicyConfig;

/// A Messages request: `system` and one user turn (as blocks, as Claude Code sends them).
fn messages(system: &str, user: &str) -> Value {
    json!({"model": "default", "max_tokens": 4, "system": system,
           "messages": [{"role": "user", "content": [{"type": "text", "text": user}]}]})
}

async fn post(url: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new().post(url).json(body).send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_are_routed_by_the_prompt_the_engine_renders_and_answered_in_anthropics_shape() {
    let (w0, w1) =
        (MockEngine::spawn(engine_config()).await.unwrap(), MockEngine::spawn(engine_config()).await.unwrap());
    let r = start(config(&[&w0, &w1], PolicyConfig::cache_aware(), true)).await;
    let system = "Shared system prompt of a coding agent. ".repeat(60);
    // w1 alone holds the prompt, warmed as an OpenAI chat straight at the engine: the router
    // learns it from the engine's KV events only.
    assert_eq!(post(&format!("{}/v1/chat/completions", w1.url()), &chat(&system, "warm up")).await.status(), 200);
    let q = messages(&system, "Fix the bug.");
    let explain = async || -> Value {
        admin_post(&format!("{}/debug/route?route=messages", r.url), &q).await.json().await.unwrap()
    };
    until("the index learned w1's cache", async || {
        let d = explain().await;
        d["worker"] == w1.url() && d["reason"] == "cache_hit"
    })
    .await;
    // The Anthropic request renders to the chat's pages: all but its own tail match.
    let d = explain().await;
    let (matched, input) =
        (d["candidates"][1]["matched_tokens"].as_u64().unwrap(), d["input_tokens"].as_u64().unwrap());
    assert!(matched >= 2048 && input - matched < 64, "{d}");

    // Through the router: the answer is Anthropic's, from w1's cache.
    let answer = post(&format!("{}/v1/messages", r.url), &q).await;
    assert_eq!(answer.status(), 200);
    let a: Value = answer.json().await.unwrap();
    assert_eq!(
        (a["type"].as_str(), a["role"].as_str(), a["stop_reason"].as_str()),
        (Some("message"), Some("assistant"), Some("max_tokens"))
    );
    assert!(a["usage"]["cache_read_input_tokens"].as_u64().unwrap() >= matched, "{a}");
    assert_eq!(a["usage"]["output_tokens"], 4);

    // Streamed: Anthropic's events relayed as the engine sends them.
    let mut s = q.clone();
    s["stream"] = json!(true);
    let text = reqwest::Client::new().post(format!("{}/v1/messages", r.url)).json(&s).send().await.unwrap();
    assert_eq!(text.headers()["content-type"], "text/event-stream");
    let text = text.text().await.unwrap();
    let kinds: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    assert_eq!(kinds.first(), Some(&"message_start"));
    assert_eq!(kinds.last(), Some(&"message_stop"));
    assert_eq!(kinds.iter().filter(|k| **k == "content_block_delta").count(), 4, "{text}");
    assert!(!text.contains("[DONE]"), "{text}");

    // count_tokens passes through to a worker: the engine's count of the same prompt.
    let count: Value = post(&format!("{}/v1/messages/count_tokens", r.url), &q).await.json().await.unwrap();
    assert_eq!(count["input_tokens"].as_u64(), Some(input), "{count}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_routers_own_errors_on_anthropics_routes_are_in_anthropics_shape() {
    // Both front ends: the HTTP/1.1 fast path and hyper.
    for fast_proxy in [true, false] {
        errors_in_anthropics_shape(fast_proxy).await;
    }
}

async fn errors_in_anthropics_shape(fast_proxy: bool) {
    let w =
        MockEngine::spawn(mock_engine::MockEngineConfig { record_requests: true, ..engine_config() }).await.unwrap();
    let mut c = config(&[&w], PolicyConfig::cache_aware(), false);
    c.client_keys = vec!["ck".into()];
    c.fast_proxy = fast_proxy;
    let r = start(c).await;
    let client = reqwest::Client::new();
    let send = |body: &str, key: Option<(&'static str, String)>| {
        let mut req = client.post(format!("{}/v1/messages", r.url)).header("content-type", "application/json");
        if let Some((name, value)) = key {
            req = req.header(name, value);
        }
        req.body(body.to_string()).send()
    };
    let error = async |resp: reqwest::Response| -> (u16, Value) {
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap())
    };
    let key = || Some(("x-api-key", "ck".to_string()));
    let good = messages("Be brief.", "Hi").to_string();
    // x-api-key is the client's key; a wrong one, or none, is Anthropic's authentication error.
    assert_eq!(send(&good, key()).await.unwrap().status(), 200);
    assert_eq!(send(&good, Some(("authorization", "Bearer ck".into()))).await.unwrap().status(), 200);
    let (status, e) = error(send(&good, Some(("x-api-key", "nope".into()))).await.unwrap()).await;
    assert_eq!(
        (status, e["type"].as_str(), e["error"]["type"].as_str()),
        (401, Some("error"), Some("authentication_error"))
    );
    let (status, e) = error(send(&good, None).await.unwrap()).await;
    assert_eq!((status, e["error"]["type"].as_str()), (401, Some("authentication_error")));
    // The worker never sees the client's key: no x-api-key, and no authorization (the router
    // has no workers' key to give it here).
    let seen = w.engine().legs();
    assert_eq!(seen.len(), 2);
    for leg in &seen {
        let credentials = leg.headers.iter().filter(|(n, _)| n == "x-api-key" || n == "authorization");
        assert_eq!(credentials.count(), 0, "{:?}", leg.headers);
    }
    // Malformed: Anthropic's invalid_request_error with the reason.
    let (status, e) = error(send("{not json", key()).await.unwrap()).await;
    assert_eq!((status, e["error"]["type"].as_str()), (400, Some("invalid_request_error")));
    let robot = json!({"model": "default", "max_tokens": 4, "messages": [{"role": "robot", "content": "x"}]});
    let (status, e) = error(send(&robot.to_string(), key()).await.unwrap()).await;
    assert_eq!((status, e["error"]["type"].as_str()), (400, Some("invalid_request_error")), "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("role"), "{e}");
    // An OpenAI route keeps OpenAI's shape.
    let openai = client
        .post(format!("{}/v1/chat/completions", r.url))
        .header("authorization", "Bearer nope")
        .json(&chat("s", "u"))
        .send()
        .await
        .unwrap();
    let (status, e) = error(openai).await;
    assert_eq!((status, e["error"]["code"].as_u64(), e.get("type")), (401, Some(401), None));

    // A worker dying mid-stream: the stream ends with Anthropic's error event, no [DONE].
    w.engine().set_faults(Faults { die_mid_stream_next: 1, ..Faults::default() }).await;
    let mut s = messages("Be brief.", "Stream, then die.");
    s["stream"] = json!(true);
    let text = send(&s.to_string(), key()).await.unwrap().text().await.unwrap();
    assert!(text.contains("event: message_start"), "{text}");
    let last = text.trim_end().rsplit("\n\n").next().unwrap();
    assert!(last.starts_with("event: error\ndata: "), "{text}");
    let event: Value = serde_json::from_str(last.trim_start_matches("event: error\ndata: ")).unwrap();
    assert_eq!((event["type"].as_str(), event["error"]["type"].as_str()), (Some("error"), Some("api_error")));
    assert!(!text.contains("[DONE]"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropics_python_sdk_is_served_streaming_and_not() {
    let Some(python) = common::venv_python("the Anthropic SDK test") else { return };
    let (w0, w1) =
        (MockEngine::spawn(engine_config()).await.unwrap(), MockEngine::spawn(engine_config()).await.unwrap());
    let mut c = config(&[&w0, &w1], PolicyConfig::cache_aware(), true);
    c.client_keys = vec!["sdk-key".into()];
    let r = start(c).await;
    let script = common::app::repo("tests/anthropic/sdk_client.py");
    // The router serves on this test's runtime: the client runs off it.
    let (py, path, url) = (python.clone(), script.clone(), r.url.clone());
    let out =
        tokio::task::spawn_blocking(move || std::process::Command::new(py).arg(path).arg(url).arg("sdk-key").output())
            .await
            .unwrap()
            .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{} failed: {stderr}", script.display());
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    let words = " the cache is warm and routing";
    assert_eq!(seen["create"]["type"], "message");
    assert_eq!(seen["create"]["stop_reason"], "max_tokens");
    assert_eq!(seen["create"]["text"], words);
    assert_eq!(seen["create"]["output_tokens"], 6);
    // The SDK's stream parser put the deltas together; its final message agrees.
    assert_eq!(seen["stream"]["text"], " the cache is warm and");
    assert_eq!(seen["stream"]["final_text"], seen["stream"]["text"]);
    assert_eq!(seen["stream"]["stop_reason"], "max_tokens");
    assert_eq!(seen["stream"]["output_tokens"], 5);
    // count_tokens is the engine's count of the prompt the first message had.
    let input = seen["create"]["input_tokens"].as_u64().unwrap();
    assert_eq!(seen["count_tokens"].as_u64(), Some(input));
    assert_eq!(seen["refused"]["status"], 400);
    assert_eq!(seen["refused"]["type"], "invalid_request_error");
    assert_eq!(seen["wrong_key"], json!({"status": 401, "type": "authentication_error"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disaggregated_pool_refuses_messages_with_the_reason() {
    use mock_engine::{Flavor, PdRole};
    let p = MockEngine::spawn(common::pd::role_config(PdRole::Prefill, Flavor::Sglang, 1)).await.unwrap();
    let d = MockEngine::spawn(common::pd::role_config(PdRole::Decode, Flavor::Sglang, 1)).await.unwrap();
    let (ps, ds) = (std::slice::from_ref(&p), std::slice::from_ref(&d));
    let mode = gateway::pd::PdMode::Sglang;
    let r = start(common::pd::pd_config(mode, ps, ds, PolicyConfig::cache_aware(), PolicyConfig::power_of_two())).await;
    let resp = post(&format!("{}/v1/messages", r.url), &messages("Be brief.", "Hi")).await;
    assert_eq!(resp.status(), 400);
    let e: Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["type"], "invalid_request_error");
    assert!(e["error"]["message"].as_str().unwrap().contains("disaggregation"), "{e}");
    // A chat on the same router is served disaggregated.
    assert_eq!(post(&format!("{}/v1/chat/completions", r.url), &chat("Be brief.", "Hi")).await.status(), 200);
}

/// `--backend vllm`: the router renders a Messages request as vLLM converts it (Claude Code's
/// billing-header block dropped, system blocks joined with nothing), so it matches the pages a
/// vLLM engine holds for it; rendered as SGLang converts it, the same request matches nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backend_flag_renders_as_that_engine_converts() {
    let (w0, w1) =
        (MockEngine::spawn(engine_config()).await.unwrap(), MockEngine::spawn(engine_config()).await.unwrap());
    let mut c = config(&[&w0, &w1], PolicyConfig::cache_aware(), true);
    c.backend = renderer::anthropic::Backend::Vllm;
    let vllm = start(c).await;
    let sglang = start(config(&[&w0, &w1], PolicyConfig::cache_aware(), true)).await;
    let shared = "Shared system prompt of a coding agent. ".repeat(60);
    let q = json!({"model": "default", "max_tokens": 4,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=5e1f;"},
                   {"type": "text", "text": shared}, {"type": "text", "text": "Be terse."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Fix the bug."}]}]});
    // What a vLLM engine holds after serving that request: the chat vLLM makes of it.
    let as_vllm = chat(&format!("{shared}Be terse."), "Fix the bug.");
    assert_eq!(post(&format!("{}/v1/chat/completions", w1.url()), &as_vllm).await.status(), 200);
    let explain = async |r: &common::app::Running, route: &str, body: &Value| -> Value {
        admin_post(&format!("{}/debug/route?route={route}", r.url), body).await.json().await.unwrap()
    };
    let hit = |d: &Value| d["worker"] == w1.url() && d["reason"] == "cache_hit";
    until("the vllm router matches the request on w1", async || hit(&explain(&vllm, "messages", &q).await)).await;
    let d = explain(&vllm, "messages", &q).await;
    assert!(d["input_tokens"].as_u64().unwrap() - d["candidates"][1]["matched_tokens"].as_u64().unwrap() < 64, "{d}");
    // The SGLang-rendering router knows w1's pages too (the chat matches there)...
    until("the sglang router learned w1's cache", async || hit(&explain(&sglang, "chat", &as_vllm).await)).await;
    // ... but renders the request otherwise (the billing header first): no page of it matches.
    let d = explain(&sglang, "messages", &q).await;
    assert_eq!(d["candidates"][1]["matched_tokens"], 0, "{d}");
}
