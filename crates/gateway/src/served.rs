//! The data-plane routes the router answers itself rather than proxying one
//! request: `/v1/models`, `/get_model_info` and `/get_server_info` (the first
//! healthy worker's answer, passed through), `/v1/tokenize`,
//! `/v1/detokenize` (the router's own tokenizer, which gives the engine's
//! tokens exactly), `/v1/route/feedback`; and the readiness probe. Every
//! worker answer is read with a cap and a deadline.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::atomic::Ordering;

use crate::pipeline::admission::{self, Admission};
use crate::pipeline::body::read_body;
use crate::{Gateway, GatewayError};

/// Longest a worker may take on one of these calls.
const WORKER_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Most token lists, or texts, one tokenize or detokenize call may carry.
const MAX_BATCH: usize = 1024;

/// `GET /v1/models`: the served model, or with a routing config its auto
/// names and every pool's served model.
pub(crate) async fn models(State(gw): State<Arc<Gateway>>) -> Json<Value> {
    let model = |id: &str| json!({"id": id, "object": "model", "owned_by": "sgl-router"});
    let Some(routing) = gw.routing() else {
        return Json(json!({"object": "list", "data": [model(&gw.config.model_id)]}));
    };
    let auto = routing.selector.config().auto_model_names.iter().map(|a| model(a));
    let pools = gw.pools.iter().map(|p| {
        let mut m = model(&p.served_model);
        m["pool"] = json!(p.id);
        m
    });
    Json(json!({"object": "list", "data": auto.chain(pools).collect::<Vec<_>>()}))
}

/// Ready means "can route": a healthy worker, the listener up (it answers
/// this), and not draining. Subscriptions that are down degrade routing
/// quality, not availability: they are reported here and in `/metrics`,
/// never a readiness failure (one engine down must not take every router
/// replica out of its Service).
pub(crate) async fn readiness(State(gw): State<Arc<Gateway>>) -> Response {
    let all = gw.fleet.snapshot();
    let routable = all.iter().filter(|w| w.is_routable()).count();
    // Followed workers whose subscribers are down: degraded cache knowledge, still routable.
    let degraded = gw.fleet.event_metrics().map_or(0, |e| e.connected().iter().filter(|(_, up)| !*up).count());
    let draining = gw.draining.load(Ordering::Relaxed);
    let ready = routable > 0 && !draining;
    let body = json!({
        "ready": ready,
        "healthy_workers": routable,
        "workers": all.len(),
        "degraded_subscriptions": degraded,
        "draining": draining,
        // Out of reach, it degrades herding and sharing, never availability.
        "shared_state": gw.shared.as_ref().map(|s| s.readiness()),
    });
    (if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, Json(body)).into_response()
}

/// `POST /v1/route/feedback` (data plane): a verdict on a routed answer (`{"route_id",
/// "verdict": "good" | "bad"}`) or a preference between two (`{"winner", "loser"}`, route ids
/// of one decision from two pools), applied to what the `bandit` algorithm draws from; with
/// `--shared-state`, for a route id any replica gave out, judged once by all.
pub(crate) async fn route_feedback(
    State(gw): State<Arc<Gateway>>,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Result<Json<Value>, GatewayError> {
    let slot = routing_slot(&gw)?;
    // Only the caller who got an answer judges it.
    let caller =
        crate::pipeline::auth::caller(&gw, headers.get(axum::http::header::AUTHORIZATION).map(|v| v.as_bytes()));
    let bytes = crate::pipeline::body::read_body_within(body, crate::pools::feedback::MAX_FEEDBACK_BYTES).await?;
    // Sharing state, the backend is asked first (within its command deadline).
    slot.learning().judge(&bytes, caller).await.map(Json)
}

/// The routing config's slot; 404 for the routes that need one when the router has none.
fn routing_slot(gw: &Gateway) -> Result<&crate::pools::RoutingSlot, GatewayError> {
    gw.routing
        .as_ref()
        .ok_or_else(|| GatewayError::NotFound("a routing config (start the router with --routing-config)".into()))
}

/// `GET /get_model_info`, `GET /get_server_info`: the first healthy worker's
/// answer to the same path, status and JSON body passed through.
pub(crate) async fn first_worker(
    State(gw): State<Arc<Gateway>>,
    uri: axum::http::Uri,
) -> Result<Response, GatewayError> {
    let path = uri.path();
    let worker = gw.fleet.snapshot().iter().find(|w| w.is_routable()).cloned().ok_or(GatewayError::NoWorker)?;
    let upstream =
        |message: String| GatewayError::Upstream { worker: worker.url.to_string(), message, retryable: false };
    let r = gw
        .fleet
        .client()
        .get(worker.endpoint_url(path))
        .timeout(WORKER_CALL_TIMEOUT)
        .send()
        .await
        .map_err(|e| upstream(e.to_string()))?;
    let status = StatusCode::from_u16(r.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let content_type = r.headers().get(header::CONTENT_TYPE).and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok());
    let too_large = || upstream(format!("answer broken off or larger than {} bytes", fleet::MAX_ANSWER_BYTES));
    let body = fleet::read_capped(r).await.ok_or_else(too_large)?;
    let mut out = Response::new(Body::from(body));
    *out.status_mut() = status;
    if let Some(ct) = content_type {
        out.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    Ok(out)
}

/// One text or several, one token list or several (the request's shape is the answer's).
#[derive(Debug)]
enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

impl<T> OneOrMany<T> {
    fn map<U>(self, f: impl Fn(T) -> Result<U, GatewayError>) -> Result<OneOrMany<U>, GatewayError> {
        Ok(match self {
            OneOrMany::One(x) => OneOrMany::One(f(x)?),
            OneOrMany::Many(xs) => OneOrMany::Many(xs.into_iter().map(f).collect::<Result<_, _>>()?),
        })
    }
}

fn parse_object(bytes: &[u8]) -> Result<serde_json::Map<String, Value>, GatewayError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(GatewayError::BadRequest("the body must be a JSON object".into())),
        Err(e) => Err(GatewayError::BadRequest(format!("invalid JSON body: {e}"))),
    }
}

/// `POST /v1/tokenize` `{"prompt": "..." | ["...", ...]}`: `{"tokens", "count", "char_count"}`,
/// each a list when the prompt was. No special tokens are added (as the engine tokenizes a rendered prompt).
/// Admitted like a proxied request, and a large body parsed and tokenized in the render pool.
pub(crate) async fn tokenize(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, GatewayError> {
    answered_in_pool(&gw, &headers, body, tokenize_body).await
}

fn tokenize_body(bytes: &[u8], renderer: &renderer::Renderer) -> Result<Json<Value>, GatewayError> {
    let mut v = parse_object(bytes)?;
    let prompt = match v.remove("prompt") {
        Some(Value::String(s)) => OneOrMany::One(s),
        Some(Value::Array(a)) if a.len() <= MAX_BATCH && a.iter().all(Value::is_string) => {
            OneOrMany::Many(a.into_iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
        }
        _ => return Err(GatewayError::BadRequest(format!("`prompt` must be a string or at most {MAX_BATCH} strings"))),
    };
    let tokenizer = renderer.tokenizer();
    let counted = prompt.map(|text| {
        let ids = tokenizer.encode(&text, false)?;
        Ok((ids, text.chars().count()))
    })?;
    Ok(Json(match counted {
        OneOrMany::One((ids, chars)) => json!({"tokens": ids, "count": ids.len(), "char_count": chars}),
        OneOrMany::Many(all) => {
            let counts: Vec<usize> = all.iter().map(|(ids, _)| ids.len()).collect();
            let chars: Vec<usize> = all.iter().map(|(_, c)| *c).collect();
            let tokens: Vec<&Vec<u32>> = all.iter().map(|(ids, _)| ids).collect();
            json!({"tokens": tokens, "count": counts, "char_count": chars})
        }
    }))
}

/// A request the router answers itself with the default pool's renderer: admitted (charged
/// before its body is read, as a proxied one is), its body read, and `answer` run on it in
/// the render pool when it is large.
async fn answered_in_pool(
    gw: &Arc<Gateway>,
    headers: &HeaderMap,
    body: Body,
    answer: fn(&[u8], &renderer::Renderer) -> Result<Json<Value>, GatewayError>,
) -> Result<Json<Value>, GatewayError> {
    let _admitted = Admission::admit_waiting_to_tokenize(gw, admission::declared_charge(gw, headers)).await?;
    let bytes: Bytes = read_body(gw, body).await?;
    let renderer = gw.default_pool().renderer.clone();
    admission::render(gw, bytes.len(), move || answer(&bytes, &renderer)).await?
}

/// `POST /v1/detokenize` `{"tokens": [..] | [[..], ..], "skip_special_tokens": true}`: `{"text"}`.
pub(crate) async fn detokenize(
    State(gw): State<Arc<Gateway>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, GatewayError> {
    answered_in_pool(&gw, &headers, body, detokenize_body).await
}

fn detokenize_body(bytes: &[u8], renderer: &renderer::Renderer) -> Result<Json<Value>, GatewayError> {
    let mut v = parse_object(bytes)?;
    let skip = match v.get("skip_special_tokens") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(GatewayError::BadRequest("`skip_special_tokens` must be a boolean".into())),
    };
    let vocab = renderer.tokenizer().vocab_size();
    let ids = |v: &Value| -> Option<Vec<u32>> {
        v.as_array()?
            .iter()
            .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()).filter(|t| (*t as usize) < vocab))
            .collect()
    };
    let bad = || {
        GatewayError::BadRequest(format!(
            "`tokens` must be token ids below {vocab}, or at most {MAX_BATCH} lists of them"
        ))
    };
    let tokens = match v.remove("tokens") {
        Some(Value::Array(a)) if a.iter().all(Value::is_array) && !a.is_empty() => {
            if a.len() > MAX_BATCH {
                return Err(bad());
            }
            OneOrMany::Many(a.iter().map(ids).collect::<Option<Vec<_>>>().ok_or_else(bad)?)
        }
        Some(t @ Value::Array(_)) => OneOrMany::One(ids(&t).ok_or_else(bad)?),
        _ => return Err(bad()),
    };
    let tokenizer = renderer.tokenizer();
    Ok(Json(match tokens.map(|ids| Ok(tokenizer.decode(&ids, skip)?))? {
        OneOrMany::One(text) => json!({"text": text}),
        OneOrMany::Many(texts) => json!({"text": texts}),
    }))
}
