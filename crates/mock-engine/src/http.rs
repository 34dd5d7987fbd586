//! The simulated engine's HTTP API, shaped like SGLang's: OpenAI chat and
//! completions, `/generate`, streaming as server-sent events, `usage` with
//! `prompt_tokens_details.cached_tokens`, and `/server_info` with the
//! `kv_events` block routers discover publishers from.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use renderer::{ChatRequest, Prompt};
use serde_json::{Value, json};

use crate::engine::{Admission, Engine, Faults, RequestFault};

/// What kind of response to shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    Chat,
    Completions,
    Generate,
}

pub(crate) fn router(engine: Arc<Engine>) -> axum::Router {
    let key = engine.config().api_key.clone();
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/health_generate", get(|| async { "ok" }))
        .route("/server_info", get(server_info))
        .route("/v1/loads", get(loads))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/generate", post(generate))
        .route("/flush_cache", post(flush_cache))
        .route("/abort_request", post(abort_request))
        .route("/get_model_info", get(model_info))
        .route("/admin/faults", post(faults))
        .route("/admin/state", get(state))
        .with_state(engine);
    match key {
        Some(key) => app.layer(axum::middleware::from_fn(move |req, next| require_key(key.clone(), req, next))),
        None => app,
    }
}

/// SGLang's `--api-key` rule: probes and metrics are open, everything else
/// needs the bearer token (401 otherwise).
async fn require_key(key: String, req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let path = req.uri().path();
    let open = ["/health", "/ready", "/metrics"].iter().any(|p| path.starts_with(p));
    let given = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let bearer = given.and_then(|v| v.split_once(' ')).filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"));
    if open || bearer.is_some_and(|(_, token)| token == key) {
        return next.run(req).await;
    }
    error(StatusCode::UNAUTHORIZED, "Unauthorized", "authentication_error")
}

pub(crate) fn error(status: StatusCode, message: &str, kind: &str) -> Response {
    (status, Json(json!({"error": {"message": message, "type": kind, "code": status.as_u16()}}))).into_response()
}

async fn server_info(State(e): State<Arc<Engine>>) -> Json<Value> {
    let c = e.config();
    let eps = e.publisher_endpoints();
    let port = |ep: &str| ep.rsplit(':').next().and_then(|p| p.parse::<u16>().ok());
    let kv = eps.first().map(|(pub_ep, replay)| {
        json!({
            "publisher": "zmq",
            "endpoint_host": "127.0.0.1",
            "endpoint_port_base": port(pub_ep),
            "replay_endpoint_port_base": replay.as_deref().and_then(port),
            "topic": "",
            "block_size": c.page_size,
            "dp_size": c.dp_size,
        })
    });
    let mode = match e.pd().map(|pd| pd.config.role) {
        Some(crate::PdRole::Prefill) => "prefill",
        Some(crate::PdRole::Decode) => "decode",
        _ => "null",
    };
    let bootstrap = e.pd().and_then(|pd| pd.bootstrap_port()).unwrap_or(crate::pd::DEFAULT_BOOTSTRAP_PORT);
    // Rank r binds base + r, as in SGLang; the real endpoints are listed too.
    Json(json!({
        "model_path": c.model_id,
        "served_model_name": c.model_id,
        "page_size": c.page_size,
        "dp_size": c.dp_size,
        "kv_events": kv,
        "kv_events_endpoints": eps,
        "speculative_algorithm": null,
        "disaggregation_mode": mode,
        "disaggregation_bootstrap_port": bootstrap,
        "load_balance_method": if mode == "prefill" { "follow_bootstrap_room" } else { "round_robin" },
    }))
}

async fn models(State(e): State<Arc<Engine>>) -> Json<Value> {
    Json(
        json!({"object": "list", "data": [{"id": e.config().model_id, "object": "model", "owned_by": "sgl-mock-engine"}]}),
    )
}

/// SGLang answers a plain-text line.
async fn flush_cache(State(e): State<Arc<Engine>>) -> &'static str {
    e.flush_cache().await;
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n"
}

/// SGLang's `/abort_request`: `{"rid": ...}` or `{"abort_all": true}`.
async fn abort_request(State(e): State<Arc<Engine>>, body: Bytes) -> Response {
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(err) => return bad_json(err),
    };
    let rid = v.get("rid").and_then(Value::as_str);
    let all = v.get("abort_all").and_then(Value::as_bool).unwrap_or(false);
    let n = e.pd().map_or(0, |pd| pd.abort(rid, all));
    Json(json!({"aborted": n})).into_response()
}

async fn model_info(State(e): State<Arc<Engine>>) -> Json<Value> {
    let c = e.config();
    Json(json!({"model_path": c.model_id, "tokenizer_path": c.model_id, "is_generation": true}))
}

async fn faults(State(e): State<Arc<Engine>>, Json(f): Json<Faults>) -> Json<Value> {
    e.set_faults(f).await;
    Json(json!({"ok": true}))
}

async fn state(State(e): State<Arc<Engine>>) -> Json<Value> {
    use std::sync::atomic::Ordering::Relaxed;
    Json(json!({
        "cached_pages": e.cached_pages(),
        "flushes": e.flushes.load(Relaxed),
        "requests": e.requests.load(Relaxed),
        "prompt_tokens": e.prompt_tokens.load(Relaxed),
        "cached_tokens": e.cached_tokens.load(Relaxed),
    }))
}

pub(crate) fn bad_json(err: serde_json::Error) -> Response {
    error(StatusCode::BAD_REQUEST, &format!("invalid JSON body: {err}"), "invalid_request_error")
}

pub(crate) fn max_tokens(v: &Value, default: usize) -> usize {
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

async fn chat(State(e): State<Arc<Engine>>, headers: HeaderMap, body: Bytes) -> Response {
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(err) => return bad_json(err),
    };
    if let Some(pd) = e.pd().filter(|pd| pd.config.role != crate::PdRole::Regular).cloned() {
        return crate::legs::serve(e, pd, Route::Chat, v, headers).await;
    }
    if e.config().record_requests {
        e.record_leg(crate::engine::Leg::of(&headers, &v));
    }
    let tokens = match ChatRequest::from_value(&v).and_then(|req| e.renderer().render_chat(&req)) {
        Ok(r) => r.token_ids,
        Err(err) => return error(StatusCode::BAD_REQUEST, &err.to_string(), "invalid_request_error"),
    };
    serve(e, Route::Chat, &v, tokens, rank_hint(&headers, &v)).await
}

async fn completions(State(e): State<Arc<Engine>>, headers: HeaderMap, body: Bytes) -> Response {
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(err) => return bad_json(err),
    };
    if let Some(pd) = e.pd().filter(|pd| pd.config.role != crate::PdRole::Regular).cloned() {
        return crate::legs::serve(e, pd, Route::Completions, v, headers).await;
    }
    if e.config().record_requests {
        e.record_leg(crate::engine::Leg::of(&headers, &v));
    }
    let vocab = e.renderer().tokenizer().vocab_size();
    let tokens = match Prompt::from_completions(v.get("prompt").unwrap_or(&Value::Null), vocab)
        .and_then(|p| e.renderer().prompt_tokens(&p))
    {
        Ok(t) => t,
        Err(err) => return error(StatusCode::BAD_REQUEST, &err.to_string(), "invalid_request_error"),
    };
    serve(e, Route::Completions, &v, tokens, rank_hint(&headers, &v)).await
}

async fn generate(State(e): State<Arc<Engine>>, headers: HeaderMap, body: Bytes) -> Response {
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(err) => return bad_json(err),
    };
    if let Some(pd) = e.pd().filter(|pd| pd.config.role != crate::PdRole::Regular).cloned() {
        return crate::legs::serve(e, pd, Route::Generate, v, headers).await;
    }
    if e.config().record_requests {
        e.record_leg(crate::engine::Leg::of(&headers, &v));
    }
    let vocab = e.renderer().tokenizer().vocab_size();
    let tokens = match Prompt::from_generate(&v, vocab).and_then(|p| e.renderer().prompt_tokens(&p)) {
        Ok(t) => t,
        Err(err) => return error(StatusCode::BAD_REQUEST, &err.to_string(), "invalid_request_error"),
    };
    serve(e, Route::Generate, &v, tokens, rank_hint(&headers, &v)).await
}

/// The word generated at position `i`.
fn word(i: usize) -> &'static str {
    const WORDS: [&str; 8] = [" the", " cache", " is", " warm", " and", " routing", " works", "."];
    WORDS[i % WORDS.len()]
}

fn usage(a: &Admission, completion: usize) -> Value {
    json!({
        "prompt_tokens": a.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": a.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": a.cached_tokens},
    })
}

fn now_secs() -> u64 {
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

/// SGLang's `/v1/loads` (core fields): per rank, running and queued requests and the queued uncached tokens.
async fn loads(State(e): State<Arc<Engine>>) -> Json<Value> {
    Json(json!({"timestamp": now_secs(), "version": "mock", "loads": e.loads()}))
}

async fn serve(e: Arc<Engine>, route: Route, v: &Value, tokens: Vec<u32>, rank: Option<usize>) -> Response {
    let stream = v.get("stream").and_then(Value::as_bool).unwrap_or(false);
    if let Some(model) =
        v.get("model").and_then(Value::as_str).filter(|m| e.config().strict_model && *m != e.config().model_id)
    {
        return error(StatusCode::NOT_FOUND, &format!("The model `{model}` does not exist."), "NotFoundError");
    }
    match e.take_fault(stream) {
        Some(RequestFault::Fail(status)) => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return error(status, "injected failure", "server_error");
        }
        Some(RequestFault::Hang) => {
            std::future::pending::<()>().await;
        }
        _ => {}
    }
    let die = stream && e.take_fault_mid_stream_pending();
    let n = max_tokens(v, e.config().default_max_tokens);
    let admission = e.admit(&tokens, rank).await;
    let guard = Release { engine: e.clone(), admission };
    if !stream {
        return Json(answer(&e, route, v, &guard, n, Extras::default()).await).into_response();
    }
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(events(e, route, v, guard, n, die, serde_json::Map::new())))
        .unwrap_or_else(|_| error(StatusCode::INTERNAL_SERVER_ERROR, "response build failed", "server_error"))
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
        let text: String = (0..n).map(word).collect();
        let mut body = match route {
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
        let words: Vec<&str> = (0..n).map(word).collect();
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
    futures_util::stream::unfold(state, move |(i, guard, e, model, id)| {
        let meta = meta.clone();
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
            e.decode_step().await;
            let chunk = match route {
                Route::Chat => {
                    json!({"id": id, "object": "chat.completion.chunk", "created": now_secs(), "model": model,
                "choices": [{"index": 0, "delta": if i == 0 { json!({"role": "assistant", "content": word(i)}) } else { json!({"content": word(i)}) }, "finish_reason": if i + 1 == n { json!("length") } else { Value::Null }}]})
                }
                Route::Completions => {
                    json!({"id": id, "object": "text_completion", "created": now_secs(), "model": model,
                "choices": [{"index": 0, "text": word(i), "finish_reason": if i + 1 == n { json!("length") } else { Value::Null }}]})
                }
                Route::Generate if logprobs => {
                    let mut chunk = json!({"text": (0..=i).map(word).collect::<String>(),
                    "meta_info": {"prompt_tokens": guard.admission.prompt_tokens, "completion_tokens": i + 1, "cached_tokens": guard.admission.cached_tokens, "input_token_logprobs": []}});
                    if let Some(m) = chunk.get_mut("meta_info").and_then(Value::as_object_mut) {
                        m.extend(meta.as_ref().clone());
                    }
                    chunk
                }
                Route::Generate => json!({"text": (0..=i).map(word).collect::<String>(),
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
