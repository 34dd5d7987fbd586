//! The simulated engine's HTTP API, shaped like SGLang's: the routes (OpenAI
//! chat and completions, `/generate`, `/v1/loads`, the admin knobs), the
//! `--api-key` rule, and `/server_info` with the `kv_events` block routers
//! discover publishers from. A request in a disaggregated role goes to
//! `legs.rs`; the answers' bodies and streams are `reply.rs`'s.

use std::sync::Arc;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use renderer::{ChatRequest, Prompt};
use serde_json::{Value, json};

use crate::engine::{Engine, Faults};
use crate::reply::{
    Extras, Release, Route, answer, bad_json, error, events, injected_failure, max_tokens, now_secs, rank_hint,
};

pub(crate) fn router(engine: Arc<Engine>) -> axum::Router {
    let key = engine.config().api_key.clone();
    let refuse_rank = engine.config().refuse_rank_header;
    let max_body = engine.config().max_body_bytes;
    let engine_for_count = engine.clone();
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/health_generate", get(|| async { "ok" }))
        .route("/server_info", get(server_info))
        .route("/v1/loads", get(loads))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/generate", post(generate))
        .route("/v1/messages", post(crate::anthropic::messages))
        .route("/v1/messages/count_tokens", post(crate::anthropic::count_tokens))
        .route("/flush_cache", post(flush_cache))
        .route("/abort_request", post(abort_request))
        .route("/get_model_info", get(model_info))
        .route("/admin/faults", post(faults))
        .route("/admin/release", post(release))
        .route("/admin/state", get(state))
        // axum's default would be 2 MB, under the router's 5 MiB.
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(engine);
    let counted = engine_for_count;
    let app = app.layer(axum::middleware::from_fn(move |req: axum::extract::Request, next: axum::middleware::Next| {
        if req.version() == axum::http::Version::HTTP_2 {
            counted.http2_requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        } else {
            counted.http1_requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        next.run(req)
    }));
    let app = match refuse_rank {
        true => app.layer(axum::middleware::from_fn(refuse_rank_header)),
        false => app,
    };
    match key {
        Some(key) => app.layer(axum::middleware::from_fn(move |req, next| require_key(key.clone(), req, next))),
        None => app,
    }
}

/// An engine that knows no data-parallel ranks and refuses the hint (Dynamo 1.6's frontend
/// answers any request carrying `X-Data-Parallel-Rank` with 400 `Invalid request`).
async fn refuse_rank_header(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    if req.headers().contains_key("x-data-parallel-rank") {
        return error(StatusCode::BAD_REQUEST, "Invalid request", "invalid_request_error");
    }
    next.run(req).await
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

/// Lets `n` held or wedged requests go on (`{"n": N}`, default 1, at most 1,000,000).
async fn release(State(e): State<Arc<Engine>>, Json(v): Json<Value>) -> Json<Value> {
    let n = v.get("n").and_then(Value::as_u64).unwrap_or(1).min(1_000_000) as usize;
    e.release_held(n);
    Json(json!({"released": n}))
}

async fn state(State(e): State<Arc<Engine>>) -> Json<Value> {
    use std::sync::atomic::Ordering::Relaxed;
    Json(json!({
        "cached_pages": e.cached_pages(),
        "flushes": e.flushes.load(Relaxed),
        "requests": e.requests.load(Relaxed),
        "held": e.held.load(Relaxed),
        "prompt_tokens": e.prompt_tokens.load(Relaxed),
        "cached_tokens": e.cached_tokens.load(Relaxed),
    }))
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
    if let Some(status) = injected_failure(&e, stream).await {
        return error(status, "injected failure", "server_error");
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
