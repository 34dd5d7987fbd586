//! The simulated engine's Anthropic Messages API, as SGLang serves it: `POST
//! /v1/messages` (the request converted to the chat SGLang makes of it,
//! rendered, admitted and decoded like a chat; the answer a `message`, or its
//! stream of `message_start`, content block and `message_delta` /
//! `message_stop` events) and `POST /v1/messages/count_tokens`; errors in
//! Anthropic's shape. Usage as SGLang reports it: `input_tokens` the prompt's
//! uncached tokens, `cache_read_input_tokens` its cached ones.

use std::sync::Arc;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use renderer::ChatRequest;
use serde_json::{Value, json};

use crate::engine::{Admission, Engine};
use crate::reply::{Release, Script, injected_failure, max_tokens, now_secs, rank_hint, tool_call};

/// An error in Anthropic's shape.
fn error(status: StatusCode, kind: &str, message: &str) -> Response {
    (status, Json(json!({"type": "error", "error": {"type": kind, "message": message}}))).into_response()
}

/// The request's prompt tokens, as the engine renders the chat it converts the request to;
/// else why it is refused (a 400).
fn prompt(e: &Engine, body: &Bytes) -> Result<(Value, Vec<u32>), String> {
    let v: Value = serde_json::from_slice(body).map_err(|err| format!("invalid JSON body: {err}"))?;
    let renderer = e.renderer();
    let tokens = renderer
        .anthropic_chat(&v)
        .and_then(|chat| ChatRequest::from_value(&chat))
        .and_then(|req| renderer.render_chat(&req))
        .map_err(|err| err.to_string())?;
    Ok((v, tokens.token_ids))
}

fn invalid(message: &str) -> Response {
    error(StatusCode::BAD_REQUEST, "invalid_request_error", message)
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens.
pub(crate) async fn count_tokens(State(e): State<Arc<Engine>>, body: Bytes) -> Response {
    match prompt(&e, &body) {
        Ok((_, tokens)) => Json(json!({"input_tokens": tokens.len()})).into_response(),
        Err(why) => invalid(&why),
    }
}

/// `POST /v1/messages`.
pub(crate) async fn messages(State(e): State<Arc<Engine>>, headers: HeaderMap, body: Bytes) -> Response {
    let (v, tokens) = match prompt(&e, &body) {
        Ok(p) => p,
        Err(why) => return invalid(&why),
    };
    if v.get("max_tokens").and_then(Value::as_u64).is_none_or(|n| n == 0) {
        return invalid("max_tokens: a positive integer is required");
    }
    if e.config().record_requests {
        e.record_leg(crate::engine::Leg::of(&headers, &v));
    }
    let stream = v.get("stream").and_then(Value::as_bool).unwrap_or(false);
    // A strict engine serves its own model only, as on the OpenAI routes.
    if let Some(model) =
        v.get("model").and_then(Value::as_str).filter(|m| e.config().strict_model && *m != e.config().model_id)
    {
        return error(StatusCode::NOT_FOUND, "not_found_error", &format!("The model `{model}` does not exist."));
    }
    if let Some(status) = injected_failure(&e, stream).await {
        return error(status, "api_error", "injected failure");
    }
    let die = stream && e.take_fault_mid_stream_pending();
    let n = max_tokens(&v, e.config().default_max_tokens);
    let admission = e.admit(&tokens, rank_hint(&headers, &v)).await;
    let guard = Release { engine: e.clone(), admission };
    let model = v.get("model").and_then(Value::as_str).unwrap_or(&e.config().model_id).to_string();
    let id = format!("msg_mock{}", now_secs());
    if !stream {
        for _ in 0..n {
            e.decode_step().await;
        }
        let text = Script::of(&v).text(n);
        // A tool call (`mock_tool_call`): the text is its input, as JSON.
        let (content, stop) = if tool_call(&v) {
            let input: Value = serde_json::from_str(&text).unwrap_or_else(|_| json!({}));
            (json!([{"type": "tool_use", "id": "toolu_mock", "name": "mock_tool", "input": input}]), "tool_use")
        } else {
            (json!([{"type": "text", "text": text}]), "max_tokens")
        };
        return Json(json!({
            "id": id, "type": "message", "role": "assistant", "model": model,
            "content": content,
            "stop_reason": stop, "stop_sequence": null,
            "usage": usage(&guard.admission, Some(n)),
        }))
        .into_response();
    }
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(events(guard, model, id, (n, Script::of(&v), tool_call(&v)), die)))
        .unwrap_or_else(|_| error(StatusCode::INTERNAL_SERVER_ERROR, "api_error", "response build failed"))
}

fn usage(a: &Admission, output: Option<usize>) -> Value {
    let mut u = json!({"input_tokens": a.prompt_tokens.saturating_sub(a.cached_tokens)});
    if a.cached_tokens > 0 {
        u["cache_read_input_tokens"] = json!(a.cached_tokens);
    }
    if let Some(n) = output {
        u["output_tokens"] = json!(n);
    }
    u
}

fn event(kind: &str, data: Value) -> Bytes {
    Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
}

/// A streamed answer: `message_start`, one text block of `n` deltas (with `tool`, one
/// `tool_use` block of `input_json_delta`s), `message_delta` with the stop reason and usage,
/// `message_stop`; `die`: the connection breaks after the first delta.
fn events(
    guard: Release,
    model: String,
    id: String,
    (n, script, tool): (usize, Script, bool),
    die: bool,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    let start = json!({"type": "message_start", "message": {
        "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": null, "stop_sequence": null, "usage": usage(&guard.admission, Some(0)),
    }});
    let head = [
        event("message_start", start),
        event(
            "content_block_start",
            if tool {
                json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "tool_use", "id": "toolu_mock", "name": "mock_tool", "input": {}}})
            } else {
                json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}})
            },
        ),
    ];
    let head = futures_util::stream::iter(head.map(Ok));
    let deltas = futures_util::stream::unfold((0usize, Some(guard)), move |(i, guard)| {
        let script = script.clone();
        async move {
            let guard = guard?;
            if i == n {
                let end = [
                    event("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
                    event(
                        "message_delta",
                        json!({"type": "message_delta",
                    "delta": {"stop_reason": if tool { "tool_use" } else { "max_tokens" }, "stop_sequence": null},
                    "usage": {"output_tokens": n}}),
                    ),
                    event("message_stop", json!({"type": "message_stop"})),
                ]
                .concat();
                return Some((Ok(Bytes::from(end)), (i + 1, None)));
            }
            if die && i == 1 {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                return Some((Err(std::io::Error::other("injected: engine died mid-stream")), (n + 1, None)));
            }
            guard.engine.decode_step().await;
            let delta = if tool {
                json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": script.word(i)}})
            } else {
                json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": script.word(i)}})
            };
            Some((Ok(event("content_block_delta", delta)), (i + 1, Some(guard))))
        }
    });
    futures_util::StreamExt::chain(head, deltas)
}
