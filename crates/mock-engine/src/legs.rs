//! The HTTP side of the disaggregated roles: each role's checks on the body
//! it gets, the rendezvous ([`crate::pd`]), and the answer it gives (one
//! token from a prefill leg, the generation from a decode leg). A streamed
//! leg answers its head at once and reports a failed rendezvous as an error
//! event, as the engines do; a non-streamed one answers its status.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use futures_util::future::join_all;
use renderer::{ChatRequest, Prompt};
use serde_json::{Value, json};

use crate::digest;
use crate::engine::Engine;
use crate::pd::{self, Flavor, LegError, Pd, PdRole, base_id};
use crate::reply::{Extras, Release, Route, answer, error, events, max_tokens, rank_hint};

/// Serves one leg of a disaggregated request on an engine in a PD role.
pub(crate) async fn serve(e: Arc<Engine>, pd: Arc<Pd>, route: Route, v: Value, headers: HeaderMap) -> Response {
    e.record_leg(crate::engine::Leg::of(&headers, &v));
    let (items, batch) = match prompts(&e, route, &v) {
        Ok(p) => p,
        Err(m) => return error(StatusCode::BAD_REQUEST, &m, "invalid_request_error"),
    };
    let stream = v.get("stream").and_then(Value::as_bool).unwrap_or(false);
    if stream && batch.is_some() {
        return error(StatusCode::BAD_REQUEST, "the simulated engine does not stream batches", "invalid_request_error");
    }
    if let Some(crate::engine::RequestFault::Fail(status)) = e.take_fault(stream) {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return error(status, "injected failure", "server_error");
    }
    match (pd.config.flavor, pd.config.role) {
        (Flavor::Sglang, PdRole::Prefill) => sglang_prefill(e, pd, route, v, &headers, items, batch, stream).await,
        (Flavor::Sglang, _) => sglang_decode(e, pd, route, v, items, batch, stream).await,
        (Flavor::Vllm, PdRole::Prefill) => vllm_prefill(e, pd, route, v, &headers, items).await,
        (Flavor::Vllm, _) => vllm_decode(e, pd, route, v, &headers, items, stream).await,
    }
}

/// The token ids of each prompt, and the batch size (`None`: one prompt, not a list).
fn prompts(e: &Engine, route: Route, v: &Value) -> Result<(Vec<Vec<u32>>, Option<usize>), String> {
    let r = e.renderer();
    let vocab = r.tokenizer().vocab_size();
    let one = |p: Prompt| r.prompt_tokens(&p).map_err(|e| e.to_string());
    match route {
        Route::Chat => {
            let req = ChatRequest::from_value(v).map_err(|e| e.to_string())?;
            Ok((vec![r.render_chat(&req).map_err(|e| e.to_string())?.token_ids], None))
        }
        Route::Completions | Route::Generate => {
            let field = match route {
                Route::Completions => "prompt",
                _ if v.get("input_ids").is_some_and(|x| !x.is_null()) => "input_ids",
                _ => "text",
            };
            match pd::batch(v, field) {
                Some(n) => {
                    let list = v[field].as_array().cloned().unwrap_or_default();
                    let items = list
                        .iter()
                        .map(|x| match x {
                            Value::String(s) => one(Prompt::Text(s.clone())),
                            Value::Array(ids) => {
                                one(Prompt::Tokens(renderer::token_ids(ids, vocab).map_err(|e| e.to_string())?))
                            }
                            _ => Err("a batch item must be a string or a list of token ids".into()),
                        })
                        .collect::<Result<Vec<_>, String>>()?;
                    Ok((items, Some(n)))
                }
                None => {
                    let p = if route == Route::Completions {
                        Prompt::from_completions(v.get("prompt").unwrap_or(&Value::Null), vocab)
                    } else {
                        Prompt::from_generate(v, vocab)
                    };
                    Ok((vec![one(p.map_err(|e| e.to_string())?)?], None))
                }
            }
        }
    }
}

/// The request's `rid` (the first of a batch's).
fn rid(v: &Value) -> Option<String> {
    match v.get("rid")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => list.first()?.as_str().map(str::to_string),
        _ => None,
    }
}

fn leg_error((status, message): LegError) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    error(status, &message, if status.is_client_error() { "invalid_request_error" } else { "server_error" })
}

/// SGLang's prompt logprobs: one `[logprob, token_id, null]` per prompt token.
fn input_logprobs(tokens: &[u32]) -> Value {
    Value::Array(tokens.iter().map(|t| json!([-0.5, t, null])).collect())
}

/// Answers a leg: JSON after `work` (one object, or one per batch item), or
/// a stream whose head goes at once and whose events follow `work`.
async fn respond<W>(e: Arc<Engine>, route: Route, v: Value, stream: bool, batch: Option<usize>, work: W) -> Response
where
    W: std::future::Future<Output = Result<Vec<(Release, usize, Extras)>, LegError>> + Send + 'static,
{
    if !stream {
        let done = match work.await {
            Ok(done) => done,
            Err(e) => return leg_error(e),
        };
        let mut out = Vec::with_capacity(done.len());
        for (guard, n, extras) in done {
            out.push(answer(&e, route, &v, &guard, n, extras).await);
        }
        return match batch {
            Some(_) => Json(Value::Array(out)).into_response(),
            None => Json(out.pop().unwrap_or(Value::Null)).into_response(),
        };
    }
    let body = futures_util::stream::once(work).flat_map(move |r| match r {
        Ok(mut done) => match done.pop() {
            Some((guard, n, extras)) => events(e.clone(), route, &v, guard, n, false, extras.meta).left_stream(),
            None => futures_util::stream::empty().boxed().right_stream(),
        },
        Err((status, message)) => {
            let event = json!({"error": {"message": message, "type": "server_error", "code": status}});
            futures_util::stream::iter([Ok(Bytes::from(format!("data: {event}\n\ndata: [DONE]\n\n")))])
                .boxed()
                .right_stream()
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| error(StatusCode::INTERNAL_SERVER_ERROR, "response build failed", "server_error"))
}

/// The request's rooms, or its 400 (counted).
fn rooms(pd: &Pd, v: &Value, batch: Option<usize>) -> Result<Vec<u64>, Box<Response>> {
    pd::rooms(v, batch).map_err(|m| {
        pd.counters.missing_room.fetch_add(1, Ordering::Relaxed);
        Box::new(error(StatusCode::BAD_REQUEST, &m, "invalid_request_error"))
    })
}

/// Runs a leg's rendezvous unless `/abort_request` comes first.
pub(crate) async fn until_aborted<T>(
    work: impl std::future::Future<Output = T>,
    abort: &pd::RidGuard,
) -> Result<T, LegError> {
    let done = tokio::select! {
        done = work => done,
        () = abort.token.cancelled() => return Err((500, "the request was aborted".to_string())),
    };
    abort.finish();
    Ok(done)
}

#[allow(clippy::too_many_arguments)]
async fn sglang_prefill(
    e: Arc<Engine>,
    pd: Arc<Pd>,
    route: Route,
    v: Value,
    headers: &HeaderMap,
    items: Vec<Vec<u32>>,
    batch: Option<usize>,
    stream: bool,
) -> Response {
    let rooms = match rooms(&pd, &v, batch) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    let mut claimed = Vec::with_capacity(rooms.len());
    for room in &rooms {
        match pd.claim_room(*room) {
            Some(g) => claimed.push(g),
            None => {
                let m = format!("bootstrap_room {room} is already in flight");
                return error(StatusCode::BAD_REQUEST, &m, "invalid_request_error");
            }
        }
    }
    let dp = e.config().dp_size.max(1);
    let routed = rank_hint(headers, &v);
    let logprobs = v.get("return_logprob").and_then(Value::as_bool).unwrap_or(false) && route == Route::Generate;
    let abort = pd.register_rid(rid(&v));
    let (e2, pd2) = (e.clone(), pd.clone());
    let work = async move {
        let _claimed = claimed;
        let legs = items.iter().zip(&rooms).map(|(tokens, room)| {
            let rank = routed.filter(|r| *r < dp).unwrap_or((*room % dp as u64) as usize);
            let e3 = e2.clone();
            let admit = async move {
                let admission = e3.admit(tokens, Some(rank)).await;
                let cached = admission.cached_tokens;
                (Release { engine: e3.clone(), admission }, cached)
            };
            pd2.meet_as_prefill(*room, digest(tokens), rank, routed, dp, admit)
        });
        let met = until_aborted(join_all(legs), &abort).await?;
        let mut done = Vec::with_capacity(met.len());
        for (r, tokens) in met.into_iter().zip(&items) {
            let mut extras = Extras::default();
            if logprobs {
                extras.meta.insert("input_token_logprobs".into(), input_logprobs(tokens));
            }
            done.push((r?, 1, extras));
        }
        Ok(done)
    };
    respond(e, route, v, stream, batch, work).await
}

async fn sglang_decode(
    e: Arc<Engine>,
    pd: Arc<Pd>,
    route: Route,
    v: Value,
    items: Vec<Vec<u32>>,
    batch: Option<usize>,
    stream: bool,
) -> Response {
    let rooms = match rooms(&pd, &v, batch) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    let mut peers = Vec::with_capacity(rooms.len());
    for i in 0..rooms.len() {
        let Some(host) = pd::per_item(&v, "bootstrap_host", i).and_then(|h| h.as_str().map(str::to_string)) else {
            return error(
                StatusCode::BAD_REQUEST,
                "bootstrap_host is required in disaggregated mode",
                "invalid_request_error",
            );
        };
        let own = match pd.config.bootstrap_port {
            0 => pd::DEFAULT_BOOTSTRAP_PORT,
            p => p,
        };
        let port = pd::per_item(&v, "bootstrap_port", i).and_then(|p| p.as_u64()).map_or(own, |p| p as u16);
        let rank = pd::per_item(&v, "disagg_prefill_dp_rank", i).and_then(|r| r.as_u64());
        peers.push((host, port, rank));
    }
    let n = max_tokens(&v, e.config().default_max_tokens);
    let logprobs = v.get("return_logprob").and_then(Value::as_bool).unwrap_or(false) && route == Route::Generate;
    let abort = pd.register_rid(rid(&v));
    let e2 = e.clone();
    let work = async move {
        let legs = items.iter().zip(&rooms).zip(&peers).map(|((tokens, room), (host, port, rank))| {
            pd::meet_as_decode(&pd, host, *port, *room, digest(tokens), *rank)
        });
        let met = until_aborted(join_all(legs), &abort).await?;
        let mut done = Vec::with_capacity(met.len());
        for (r, tokens) in met.into_iter().zip(&items) {
            let cached = r?;
            let mut extras = Extras::default();
            if logprobs {
                // Decode computed no prompt logprobs: the router prefixes prefill's.
                extras.meta.insert("input_token_logprobs".into(), json!([]));
            }
            done.push((Release { engine: e2.clone(), admission: e2.admit_remote(tokens, cached, false) }, n, extras));
        }
        Ok(done)
    };
    respond(e, route, v, stream, batch, work).await
}

/// vLLM's internal id of a request with `X-Request-Id` `id`: the route's
/// prefix, the id, a random 8-hex suffix (`chatcmpl-ID-1a2b3c4d`).
fn internal_id(route: Route, id: &str) -> String {
    let prefix = if route == Route::Chat { "chatcmpl" } else { "cmpl" };
    format!("{prefix}-{id}-{:08x}", digest(&[id.len() as u32, std::process::id()]) as u32)
}

/// vLLM's prompt logprobs: `null` for the first token, then one map per token.
fn prompt_logprobs(tokens: &[u32]) -> Value {
    let mut out = vec![Value::Null];
    out.extend(tokens.iter().skip(1).map(|t| json!({t.to_string(): {"logprob": -0.5, "rank": 1}})));
    Value::Array(out)
}

fn wants_prompt_logprobs(v: &Value) -> bool {
    v.get("prompt_logprobs").is_some_and(|p| !p.is_null())
}

async fn vllm_prefill(
    e: Arc<Engine>,
    pd: Arc<Pd>,
    route: Route,
    v: Value,
    headers: &HeaderMap,
    items: Vec<Vec<u32>>,
) -> Response {
    let params = v.get("kv_transfer_params");
    let one = |k: &str| v.get(k).is_none_or(|x| x.is_null() || x.as_u64() == Some(1));
    let shape = if params.and_then(|p| p.get("do_remote_decode")).and_then(Value::as_bool) != Some(true) {
        Some("kv_transfer_params.do_remote_decode must be true on a prefill worker")
    } else if v.get("max_tokens").and_then(Value::as_u64) != Some(1) || !one("max_completion_tokens") {
        Some("a prefill request must have max_tokens 1")
    } else if v.get("stream").and_then(Value::as_bool) == Some(true) {
        Some("a prefill request must not stream")
    } else if pd.config.mooncake && params.and_then(|p| p.get("transfer_id")).and_then(Value::as_str).is_none() {
        Some("Missing transfer_id in kv_transfer_params from router!")
    } else {
        None
    };
    if let Some(m) = shape {
        pd.counters.bad_prefill_shape.fetch_add(1, Ordering::Relaxed);
        return error(StatusCode::BAD_REQUEST, m, "invalid_request_error");
    }
    let Some(tokens) = items.into_iter().next() else {
        return error(StatusCode::BAD_REQUEST, "no prompt", "invalid_request_error");
    };
    let request_id = headers
        .get("x-request-id")
        .and_then(|h| h.to_str().ok())
        .map_or_else(|| format!("mock-{:x}", digest(&tokens)), str::to_string);
    let admission = e.admit(&tokens, rank_hint(headers, &v)).await;
    let admission_cached = admission.cached_tokens;
    let pages = tokens.len().div_ceil(e.config().page_size.max(1));
    let internal = internal_id(route, &request_id);
    if pd.config.mooncake {
        // Kept under the router's transfer id; Mooncake's prefill answers no params.
        let transfer = params.and_then(|p| p.get("transfer_id")).and_then(Value::as_str).unwrap_or_default();
        pd.keep(transfer, digest(&tokens), pages);
        let guard = Release { engine: e.clone(), admission };
        return Json(answer(&e, route, &v, &guard, 1, Extras::default()).await).into_response();
    }
    let block_ids = pd.keep(&internal, digest(&tokens), pages);
    let mut extras = Extras::default();
    let broken = e.take_drop_kv_params();
    extras.top.insert(
        if broken { "no_kv_transfer_params" } else { "kv_transfer_params" }.into(),
        json!({
            "do_remote_prefill": true,
            "do_remote_decode": false,
            "remote_block_ids": block_ids,
            "remote_engine_id": pd.engine_id,
            "remote_request_id": internal,
            "remote_host": "127.0.0.1",
            "remote_port": pd.bootstrap_port(),
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": tokens.len(),
            "remote_blocks_expiry_time": 480.0,
            "remote_registration_generation": 0,
            "transfer_mode": if pd.config.push { "push" } else { "pull" },
            "remote_prefill_cached_tokens": admission_cached,
        }),
    );
    let bloat = e.take_bloat_kv_params();
    if bloat > 0
        && let Some(Value::Object(params)) = extras.top.get_mut("kv_transfer_params")
    {
        params.insert("padding".into(), Value::String("x".repeat(bloat)));
    }
    if wants_prompt_logprobs(&v) {
        // vLLM: chat reports them at the top, completions in each choice.
        let at = if route == Route::Completions { &mut extras.choice } else { &mut extras.top };
        at.insert("prompt_logprobs".into(), prompt_logprobs(&tokens));
    }
    let guard = Release { engine: e.clone(), admission };
    Json(answer(&e, route, &v, &guard, 1, extras).await).into_response()
}

async fn vllm_decode(
    e: Arc<Engine>,
    pd: Arc<Pd>,
    route: Route,
    v: Value,
    headers: &HeaderMap,
    items: Vec<Vec<u32>>,
    stream: bool,
) -> Response {
    let Some(tokens) = items.into_iter().next() else {
        return error(StatusCode::BAD_REQUEST, "no prompt", "invalid_request_error");
    };
    let params = v.get("kv_transfer_params").cloned().unwrap_or(Value::Null);
    let own_id = headers.get("x-request-id").and_then(|h| h.to_str().ok()).map(|id| internal_id(route, id));
    let served_id = params.get("remote_request_id").and_then(Value::as_str).map(base_id);
    if own_id.is_some() && served_id.is_some() && own_id.as_deref().map(base_id) != served_id {
        pd.counters.request_id_mismatch.fetch_add(1, Ordering::Relaxed);
    }
    let n = max_tokens(&v, e.config().default_max_tokens);
    let rank = rank_hint(headers, &v);
    let e2 = e.clone();
    let work = async move {
        let admission = match pd::pull(&pd, &params, digest(&tokens), own_id.as_deref()).await {
            Ok(cached) => e2.admit_remote(&tokens, cached, true),
            Err(why) => {
                // vLLM's silent fallback: the answer is right, the disaggregation is lost.
                tracing::debug!(why, "mock vllm decode: prefilling locally");
                pd.counters.local_prefill_fallbacks.fetch_add(1, Ordering::Relaxed);
                e2.admit(&tokens, rank).await
            }
        };
        Ok(vec![(Release { engine: e2.clone(), admission }, n, Extras::default())])
    };
    respond(e, route, v, stream, None, work).await
}
