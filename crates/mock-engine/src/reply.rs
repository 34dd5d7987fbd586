//! The simulated engine's answers, shaped like SGLang's and vLLM's: the
//! OpenAI chat and completions bodies and `/generate`'s, streamed as
//! server-sent events or whole, `usage` with `prompt_tokens_details.cached_tokens`,
//! logprobs when asked, the error body, and the guard that releases a
//! request's pinned pages however its answer ends. Shared by the regular
//! routes (`http.rs`) and the disaggregated legs (`legs.rs`); it decides
//! nothing about admission or roles.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::engine::{Admission, Engine, RequestFault};

/// What kind of response to shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    Chat,
    Completions,
    Generate,
}

pub(crate) fn error(status: StatusCode, message: &str, kind: &str) -> Response {
    (status, Json(json!({"error": {"message": message, "type": kind, "code": status.as_u16()}}))).into_response()
}

/// The fault injected into a request before it is admitted: a hang or a hold waits here; an
/// injected failure's status is returned, for the route to answer in its own shape.
pub(crate) async fn injected_failure(e: &Engine, stream: bool) -> Option<StatusCode> {
    match e.take_fault(stream) {
        Some(RequestFault::Fail(status)) => {
            return Some(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR));
        }
        Some(RequestFault::Hang) => std::future::pending::<()>().await,
        Some(RequestFault::Hold) => e.hold().await,
        _ => {}
    }
    None
}

pub(crate) fn bad_json(err: serde_json::Error) -> Response {
    error(StatusCode::BAD_REQUEST, &format!("invalid JSON body: {err}"), "invalid_request_error")
}

pub(crate) fn max_tokens(v: &Value, default: usize) -> usize {
    if let Script(Some(pieces)) = Script::of(v) {
        return pieces.len();
    }
    ["max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|k| v.get(*k).and_then(Value::as_u64))
        .or_else(|| v.pointer("/sampling_params/max_new_tokens").and_then(Value::as_u64))
        .map_or(default, |n| n as usize)
        .min(4096)
}

/// The requested dp rank: the `X-Data-Parallel-Rank` header (SGLang and vLLM),
/// which wins over SGLang's body field `routed_dp_rank` (or its deprecated name).
pub(crate) fn rank_hint(headers: &HeaderMap, v: &Value) -> Option<usize> {
    let header = headers.get("x-data-parallel-rank").and_then(|h| h.to_str().ok()).and_then(|h| h.trim().parse().ok());
    header.or_else(|| {
        ["routed_dp_rank", "data_parallel_rank"]
            .iter()
            .find_map(|k| v.get(*k).and_then(Value::as_u64))
            .map(|r| r as usize)
    })
}

/// Whether a chat's answer is a call of the tool `mock_tool` whose arguments are its text (the
/// request's `mock_tool_call: true`, a test's), instead of content.
pub(crate) fn tool_call(v: &Value) -> bool {
    v.get("mock_tool_call").and_then(Value::as_bool) == Some(true)
}

/// The answer's tokens: a test's scripted text (the request's `mock_reply`, in pieces of three
/// bytes on char boundaries: the whole of it, whatever `max_tokens` says), else eight words
/// over and over.
#[derive(Debug, Clone, Default)]
pub(crate) struct Script(Option<Arc<[String]>>);

impl Script {
    pub(crate) fn of(v: &Value) -> Script {
        let Some(text) = v.get("mock_reply").and_then(Value::as_str) else { return Script(None) };
        let mut pieces = Vec::new();
        let mut at = 0;
        while at < text.len() {
            let mut end = (at + 3).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            pieces.push(text[at..end].to_owned());
            at = end;
        }
        Script(Some(pieces.into()))
    }

    /// Token `i`.
    pub(crate) fn word(&self, i: usize) -> &str {
        const WORDS: [&str; 8] = [" the", " cache", " is", " warm", " and", " routing", " works", "."];
        match &self.0 {
            Some(pieces) => pieces.get(i).map_or("", String::as_str),
            None => WORDS[i % WORDS.len()],
        }
    }

    /// Tokens `0..n` as one text.
    pub(crate) fn text(&self, n: usize) -> String {
        (0..n).map(|i| self.word(i)).collect()
    }
}

fn usage(a: &Admission, completion: usize) -> Value {
    json!({
        "prompt_tokens": a.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": a.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": a.cached_tokens},
    })
}

pub(crate) fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Releases a request's pinned pages however its response ends.
pub(crate) struct Release {
    pub(crate) engine: Arc<Engine>,
    pub(crate) admission: Admission,
}

impl Drop for Release {
    fn drop(&mut self) {
        self.engine.release(&self.admission);
    }
}

/// Fields a disaggregated leg adds to its answer.
#[derive(Debug, Default)]
pub(crate) struct Extras {
    /// Top-level fields (vLLM's `kv_transfer_params`, `prompt_logprobs`).
    pub(crate) top: serde_json::Map<String, Value>,
    /// `/generate`'s `meta_info` fields (SGLang's logprobs).
    pub(crate) meta: serde_json::Map<String, Value>,
    /// Fields of the first choice (vLLM completions' `prompt_logprobs`).
    pub(crate) choice: serde_json::Map<String, Value>,
}

/// The answer of a non-streamed request, once its `n` tokens are decoded.
pub(crate) async fn answer(e: &Engine, route: Route, v: &Value, guard: &Release, n: usize, extras: Extras) -> Value {
    let model = v.get("model").and_then(Value::as_str).unwrap_or(&e.config().model_id).to_string();
    let id = format!("mock-{}", now_secs());
    {
        for _ in 0..n {
            e.decode_step().await;
        }
        let script = Script::of(v);
        let text = script.text(n);
        let mut body = match route {
            Route::Chat if tool_call(v) => json!({
                "id": id, "object": "chat.completion", "created": now_secs(), "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_0", "type": "function", "function": {"name": "mock_tool", "arguments": text}}]},
                    "finish_reason": "tool_calls"}],
                "usage": usage(&guard.admission, n),
            }),
            Route::Chat => json!({
                "id": id, "object": "chat.completion", "created": now_secs(), "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
                "usage": usage(&guard.admission, n),
            }),
            Route::Completions => json!({
                "id": id, "object": "text_completion", "created": now_secs(), "model": model,
                "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                "usage": usage(&guard.admission, n),
            }),
            Route::Generate => json!({
                "text": text,
                "meta_info": {"id": id, "prompt_tokens": guard.admission.prompt_tokens, "completion_tokens": n,
                              "cached_tokens": guard.admission.cached_tokens, "finish_reason": {"type": "length"}},
            }),
        };
        // Logprobs, as vLLM and SGLang report them, when asked for: a chat's `logprobs: true`
        // (`choices[].logprobs.content[]`), a completion's `logprobs: N` (`token_logprobs`).
        let lp = e.token_logprob();
        let words: Vec<&str> = (0..n).map(|i| script.word(i)).collect();
        match route {
            Route::Chat if v.get("logprobs").and_then(Value::as_bool) == Some(true) => {
                let content: Vec<Value> = words
                    .iter()
                    .map(|w| json!({"token": w, "logprob": lp, "bytes": w.as_bytes(), "top_logprobs": []}))
                    .collect();
                if let Some(c) = body.pointer_mut("/choices/0").and_then(Value::as_object_mut) {
                    c.insert("logprobs".into(), json!({"content": content}));
                }
            }
            Route::Completions if v.get("logprobs").is_some_and(Value::is_u64) => {
                let offsets: Vec<usize> =
                    words.iter().scan(0, |at, w| Some(std::mem::replace(at, *at + w.len()))).collect();
                if let Some(c) = body.pointer_mut("/choices/0").and_then(Value::as_object_mut) {
                    c.insert(
                        "logprobs".into(),
                        json!({"tokens": words, "token_logprobs": vec![lp; n], "top_logprobs": null, "text_offset": offsets}),
                    );
                }
            }
            _ => {}
        }
        if let Some(meta) = body.get_mut("meta_info").and_then(Value::as_object_mut) {
            meta.extend(extras.meta);
        }
        if let Some(choice) = body.pointer_mut("/choices/0").and_then(Value::as_object_mut) {
            choice.extend(extras.choice);
        }
        if let Some(top) = body.as_object_mut() {
            top.extend(extras.top);
        }
        body
    }
}

/// Counts a stream dropped before its end in [`Engine::cancelled_streams`].
struct Unfinished {
    engine: Arc<Engine>,
    done: bool,
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if !self.done {
            self.engine.cancelled_streams.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// The events of a streamed request: `n` tokens, usage, `[DONE]`; `die`: break after the first.
/// A stream dropped before its end (the client went away) is counted as cancelled.
pub(crate) fn events(
    e: Arc<Engine>,
    route: Route,
    v: &Value,
    guard: Release,
    n: usize,
    die: bool,
    meta: serde_json::Map<String, Value>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + use<> {
    use futures_util::StreamExt;
    // Reached only once the events below have all been taken: the stream ended whole.
    let watch = Unfinished { engine: e.clone(), done: false };
    let end = futures_util::stream::once(async move {
        let mut watch = watch;
        watch.done = true;
        None
    })
    .filter_map(std::future::ready);
    let model = v.get("model").and_then(Value::as_str).unwrap_or(&e.config().model_id).to_string();
    let id = format!("mock-{}", now_secs());
    // SGLang's streamed /generate chunks carry the prompt logprobs the engine computed (none on a decode worker).
    let logprobs = v.get("return_logprob").and_then(Value::as_bool) == Some(true) && e.pd().is_some();
    let state = (0usize, Some(guard), e, model, id);
    let meta = std::sync::Arc::new(meta);
    let script = Script::of(v);
    let tool = tool_call(v);
    futures_util::stream::unfold(state, move |(i, guard, e, model, id)| {
        let (meta, script) = (meta.clone(), script.clone());
        async move {
            let guard = guard?;
            if i > n {
                return None;
            }
            if i == n {
                // The last event: usage, then [DONE]; the guard drops here and releases the pages.
                let last = match route {
                    Route::Generate => String::new(),
                    _ => format!(
                        "data: {}\n\n",
                        json!({"id": id, "object": chunk_object(route), "model": model, "choices": [], "usage": usage(&guard.admission, n)})
                    ),
                };
                return Some((
                    Ok::<Bytes, std::io::Error>(Bytes::from(format!("{last}data: [DONE]\n\n"))),
                    (i + 1, None, e, model, id),
                ));
            }
            if die && i == 1 {
                // Let the headers and the first chunk reach the client, then break the connection.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                return Some((
                    Err(std::io::Error::other("injected: engine died mid-stream")),
                    (n + 1, None, e, model, id),
                ));
            }
            if i == 1 && e.take_wedge_mid_stream() {
                // Wedged: the first chunk went out; the rest waits for the test's release.
                e.hold().await;
            }
            e.decode_step().await;
            let chunk = match route {
                Route::Chat if tool => {
                    let call = if i == 0 {
                        json!({"index": 0, "id": "call_0", "type": "function", "function": {"name": "mock_tool", "arguments": script.word(i)}})
                    } else {
                        json!({"index": 0, "function": {"arguments": script.word(i)}})
                    };
                    let delta = if i == 0 { json!({"role": "assistant", "tool_calls": [call]}) } else { json!({"tool_calls": [call]}) };
                    json!({"id": id, "object": "chat.completion.chunk", "created": now_secs(), "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": if i + 1 == n { json!("tool_calls") } else { Value::Null }}]})
                }
                Route::Chat => {
                    json!({"id": id, "object": "chat.completion.chunk", "created": now_secs(), "model": model,
                "choices": [{"index": 0, "delta": if i == 0 { json!({"role": "assistant", "content": script.word(i)}) } else { json!({"content": script.word(i)}) }, "finish_reason": if i + 1 == n { json!("length") } else { Value::Null }}]})
                }
                Route::Completions => {
                    json!({"id": id, "object": "text_completion", "created": now_secs(), "model": model,
                "choices": [{"index": 0, "text": script.word(i), "finish_reason": if i + 1 == n { json!("length") } else { Value::Null }}]})
                }
                Route::Generate if logprobs => {
                    let mut chunk = json!({"text": script.text(i + 1),
                    "meta_info": {"prompt_tokens": guard.admission.prompt_tokens, "completion_tokens": i + 1, "cached_tokens": guard.admission.cached_tokens, "input_token_logprobs": []}});
                    if let Some(m) = chunk.get_mut("meta_info").and_then(Value::as_object_mut) {
                        m.extend(meta.as_ref().clone());
                    }
                    chunk
                }
                Route::Generate => json!({"text": script.text(i + 1),
                "meta_info": {"prompt_tokens": guard.admission.prompt_tokens, "completion_tokens": i + 1, "cached_tokens": guard.admission.cached_tokens}}),
            };
            Some((Ok(Bytes::from(format!("data: {chunk}\n\n"))), (i + 1, Some(guard), e, model, id)))
        }
    })
    .chain(end)
}

fn chunk_object(route: Route) -> &'static str {
    match route {
        Route::Chat => "chat.completion.chunk",
        _ => "text_completion",
    }
}
