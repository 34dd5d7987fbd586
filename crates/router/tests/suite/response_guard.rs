//! The response guard end to end (`tests/routing/guard.yaml`): an engine's answer with PII in
//! it (the simulated engine answers a request's `mock_reply`, streamed in 3-byte tokens) is
//! redacted, blocked or annotated before the client reads it, whole and streamed, on every
//! route with a prompt and on both front ends; a response cache keeps the guarded answer only.

use crate::common;

use common::app::{config, metric, pools, start};
use serde_json::{Value, json};
use sgl_router::app::PolicyConfig;

const REPLY: &str = "Write to jane.doe@example.com or call +1 415 555 0100. Again: jane.doe@example.com, thanks!";
const REDACTED: &str = "Write to [EMAIL_1] or call [PHONE_1]. Again: [EMAIL_1], thanks!";

async fn guard_app() -> (common::app::Running, Vec<mock_engine::MockEngine>) {
    let (routing, engines) = pools("tests/routing/guard.yaml").await;
    let mut app = config(&[], PolicyConfig::RoundRobin, false);
    app.routing = Some(routing);
    (start(app).await, engines)
}

fn body(route: &str, word: &str, reply: &str, stream: bool) -> Value {
    let ask = format!("{word}: who should I write to?");
    let mut v = match route {
        "/v1/completions" => json!({"prompt": ask}),
        "/generate" => json!({"text": ask}),
        _ => json!({"messages": [{"role": "user", "content": ask}]}),
    };
    v["model"] = json!("auto");
    v["stream"] = json!(stream);
    v["temperature"] = json!(0);
    v["max_tokens"] = json!(8);
    v["mock_reply"] = json!(reply);
    v
}

/// The answer's text: a whole answer's, or a stream's deltas joined (`/generate`: its last
/// cumulative text); and the stream's comments.
fn text_of(route: &str, raw: &str, stream: bool) -> (String, Vec<String>) {
    if !stream {
        let v: Value = serde_json::from_str(raw).unwrap();
        let text = match route {
            "/v1/chat/completions" => &v["choices"][0]["message"]["content"],
            "/v1/completions" => &v["choices"][0]["text"],
            "/v1/messages" => &v["content"][0]["text"],
            _ => &v["text"],
        };
        return (text.as_str().unwrap().to_owned(), Vec::new());
    }
    let mut text = String::new();
    let mut comments = Vec::new();
    for event in raw.split("\n\n").filter(|e| !e.is_empty()) {
        for line in event.lines() {
            if let Some(c) = line.strip_prefix(": ") {
                comments.push(c.to_owned());
            }
            let Some(data) = line.strip_prefix("data: ").filter(|d| *d != "[DONE]") else { continue };
            let v: Value = serde_json::from_str(data).unwrap();
            let piece = match route {
                "/v1/chat/completions" => v.pointer("/choices/0/delta/content").and_then(Value::as_str),
                "/v1/completions" => v.pointer("/choices/0/text").and_then(Value::as_str),
                "/v1/messages" => v.pointer("/delta/text").and_then(Value::as_str),
                _ => {
                    text.clear();
                    v["text"].as_str()
                }
            };
            text.push_str(piece.unwrap_or(""));
        }
    }
    (text, comments)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_redacted_whole_and_streamed_on_every_route() {
    let (router, _engines) = guard_app().await;
    let http = reqwest::Client::new();
    for route in ["/v1/chat/completions", "/v1/completions", "/generate", "/v1/messages"] {
        for stream in [false, true] {
            let r = http.post(format!("{}{route}", router.url)).json(&body(route, "redact-me", REPLY, stream));
            let r = r.send().await.unwrap();
            assert_eq!(r.status(), 200, "{route} stream={stream}");
            let header = r.headers().get("x-route-response-guard").map(|v| v.to_str().unwrap().to_owned());
            let raw = r.text().await.unwrap();
            assert!(!raw.contains("jane") && !raw.contains("555"), "{route} stream={stream}: {raw}");
            let (text, comments) = text_of(route, &raw, stream);
            assert_eq!(text, REDACTED, "{route} stream={stream}: {raw}");
            if stream {
                assert_eq!(comments, ["x-route-response-guard: email=2,phone=1"], "{route}: {raw}");
                assert_eq!(header, None);
            } else {
                assert_eq!(header.as_deref(), Some("email=2,phone=1"), "{route}");
            }
        }
    }
    // A clean answer passes as it came, said clean.
    let url = format!("{}/v1/chat/completions", router.url);
    let r = http.post(&url).json(&body("/v1/chat/completions", "redact-me", "Nothing to hide here.", false));
    let r = r.send().await.unwrap();
    assert_eq!(r.headers()["x-route-response-guard"], "clean");
    assert_eq!(text_of("/v1/chat/completions", &r.text().await.unwrap(), false).0, "Nothing to hide here.");
    // A decision without a guard: the engine's answer, raw.
    let r = http.post(&url).json(&body("/v1/chat/completions", "plain", REPLY, false)).send().await.unwrap();
    assert!(r.headers().get("x-route-response-guard").is_none());
    assert_eq!(text_of("/v1/chat/completions", &r.text().await.unwrap(), false).0, REPLY);
    // Hyper's front end (a chunked request body) guards alike.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        vec![Ok(serde_json::to_vec(&body("/v1/chat/completions", "redact-me", REPLY, true)).unwrap())];
    let r = http
        .post(&url)
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_eq!(text_of("/v1/chat/completions", &r.text().await.unwrap(), true).0, REDACTED);
    let redacted = "router_response_guard_total{decision=\"redact\",outcome=\"redacted\"}";
    assert_eq!(metric(&router.url, redacted).await, 9.0);
    let emails = "router_response_guard_findings_total{decision=\"redact\",finding=\"email\"}";
    assert_eq!(metric(&router.url, emails).await, 18.0);
}

/// A chat answer that calls a tool (`mock_tool_call`: the reply is the call's arguments): the
/// arguments are redacted whole and streamed (each call's arguments a lane of their own, its
/// rest sent with the choice's last chunk), and a block stops a stream whose call holds PII.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_calls_arguments_are_read_whole_and_streamed() {
    let (router, _engines) = guard_app().await;
    let http = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", router.url);
    let arguments = r#"{"to": "jane.doe@example.com", "phone": "+1 415 555 0100", "cc": "jane.doe@example.com"}"#;
    let redacted = r#"{"to": "[EMAIL_1]", "phone": "[PHONE_1]", "cc": "[EMAIL_1]"}"#;
    let ask = |word: &str, stream: bool| {
        let mut v = body("/v1/chat/completions", word, arguments, stream);
        v["mock_tool_call"] = json!(true);
        v
    };
    let whole: Value = http.post(&url).json(&ask("redact-me", false)).send().await.unwrap().json().await.unwrap();
    let call = &whole["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "mock_tool");
    // A whole answer's arguments are redacted as JSON (their values), written back compact.
    let said: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(said, serde_json::from_str::<Value>(redacted).unwrap());
    let r = http.post(&url).json(&ask("redact-me", true)).send().await.unwrap();
    let raw = r.text().await.unwrap();
    assert!(!raw.contains("jane") && !raw.contains("555"), "{raw}");
    let mut joined = String::new();
    let mut names = Vec::new();
    for data in raw.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|d| *d != "[DONE]") {
        let v: Value = serde_json::from_str(data).unwrap();
        for call in v.pointer("/choices/0/delta/tool_calls").and_then(Value::as_array).into_iter().flatten() {
            assert_eq!(call["index"], 0, "{call}");
            joined.push_str(call.pointer("/function/arguments").and_then(Value::as_str).unwrap_or(""));
            names.extend(call.pointer("/function/name").and_then(Value::as_str).map(str::to_owned));
        }
    }
    assert_eq!(joined, redacted, "{raw}");
    assert_eq!(names, ["mock_tool"], "the call's name once, as the engine sent it");
    // Blocked: nothing of the arguments out, the stream ended with the guard's error.
    let raw = http.post(&url).json(&ask("block-me", true)).send().await.unwrap().text().await.unwrap();
    assert!(!raw.contains("jane") && !raw.contains("555") && raw.contains("response_blocked"), "{raw}");
    // Anthropic's Messages: a `tool_use` block's input, whole and streamed (`input_json_delta`).
    let url = format!("{}/v1/messages", router.url);
    let ask = |stream: bool| {
        let mut v = body("/v1/messages", "redact-me", arguments, stream);
        v["mock_tool_call"] = json!(true);
        v
    };
    let whole: Value = http.post(&url).json(&ask(false)).send().await.unwrap().json().await.unwrap();
    assert_eq!(whole["content"][0]["type"], "tool_use", "{whole}");
    assert_eq!(whole["content"][0]["input"], serde_json::from_str::<Value>(redacted).unwrap(), "{whole}");
    let raw = http.post(&url).json(&ask(true)).send().await.unwrap().text().await.unwrap();
    assert!(!raw.contains("jane") && !raw.contains("555"), "{raw}");
    let joined: String = raw
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v.pointer("/delta/partial_json").and_then(Value::as_str).map(str::to_owned))
        .collect();
    assert_eq!(joined, redacted, "{raw}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_answer_never_reaches_the_client_and_annotation_changes_nothing() {
    let (router, _engines) = guard_app().await;
    let http = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", router.url);
    // Whole: the decision's status and message instead of the answer.
    let r = http.post(&url).json(&body("/v1/chat/completions", "block-me", REPLY, false)).send().await.unwrap();
    assert_eq!(r.status(), 451);
    assert_eq!(r.headers()["x-route-response-guard"], "email=2,phone=1");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "response_blocked");
    assert_eq!(v["error"]["message"], "withheld: personal data");
    // Streamed: the text before the finding goes out, the finding never; an error event ends it.
    let r = http.post(&url).json(&body("/v1/chat/completions", "block-me", REPLY, true)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let raw = r.text().await.unwrap();
    assert!(!raw.contains("jane") && !raw.contains("@"), "{raw}");
    assert!(raw.ends_with("data: [DONE]\n\n"), "{raw}");
    assert!(raw.contains("\"type\":\"response_blocked\""), "{raw}");
    // Anthropic's stream ends with its error event.
    let r = http.post(format!("{}/v1/messages", router.url)).json(&body("/v1/messages", "block-me", REPLY, true));
    let raw = r.send().await.unwrap().text().await.unwrap();
    assert!(!raw.contains("jane") && raw.contains("event: error\n"), "{raw}");
    // A clean answer passes a blocking guard.
    let r = http.post(&url).json(&body("/v1/chat/completions", "block-me", "All clear.", true)).send().await.unwrap();
    assert_eq!(text_of("/v1/chat/completions", &r.text().await.unwrap(), true).0, "All clear.");
    let blocked = "router_response_guard_total{decision=\"block\",outcome=\"blocked\"}";
    assert_eq!(metric(&router.url, blocked).await, 3.0);

    // Annotate: the answer as it came (emails only are looked for), what was found told.
    let r = http.post(&url).json(&body("/v1/chat/completions", "note-me", REPLY, false)).send().await.unwrap();
    assert_eq!(r.headers()["x-route-response-guard"], "email=2");
    assert_eq!(text_of("/v1/chat/completions", &r.text().await.unwrap(), false).0, REPLY);
    let r = http.post(&url).json(&body("/v1/chat/completions", "note-me", REPLY, true)).send().await.unwrap();
    let (text, comments) = text_of("/v1/chat/completions", &r.text().await.unwrap(), true);
    assert_eq!((text.as_str(), comments), (REPLY, vec!["x-route-response-guard: email=2".to_owned()]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_cache_keeps_the_guarded_answer_only() {
    let (router, engines) = guard_app().await;
    let http = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", router.url);
    for stream in [false, true] {
        let ask = body("/v1/chat/completions", "cache-me", REPLY, stream);
        let first = http.post(&url).json(&ask).send().await.unwrap();
        assert_eq!(first.headers()["x-route-cache"], "miss");
        let first = first.text().await.unwrap();
        let again = http.post(&url).json(&ask).send().await.unwrap();
        assert_eq!(again.headers()["x-route-cache"], "hit-exact", "stream={stream}");
        let again = again.text().await.unwrap();
        assert_eq!(first, again, "the hit is the guarded answer, byte for byte");
        assert_eq!(text_of("/v1/chat/completions", &again, stream).0, REDACTED);
    }
    assert_eq!(engines[0].engine().legs().len(), 2, "one engine call per stream flag");
}
