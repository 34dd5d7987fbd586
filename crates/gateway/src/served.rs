//! The SGLang routes the router answers itself rather than proxying one
//! request: `/flush_cache` (sent to every worker at once), `/get_loads`
//! (what the fleet knows of each worker's load), `/get_model_info` and
//! `/get_server_info` (the first healthy worker's answer, passed through),
//! and `/v1/tokenize`, `/v1/detokenize` (the router's own tokenizer, which
//! gives the engine's tokens exactly). Every worker answer is read with a
//! cap and a deadline.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::future::join_all;
use serde_json::{Value, json};

use crate::pipeline::admission::{self, Admission};
use crate::pipeline::body::read_body;
use crate::{Gateway, GatewayError};

/// Longest a worker may take on one of these calls.
const WORKER_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Most token lists, or texts, one tokenize or detokenize call may carry.
const MAX_BATCH: usize = 1024;

/// `POST /flush_cache`: every worker's `/flush_cache` at once. 200 when all
/// flushed, 206 with the failures otherwise (SGLang Model Gateway's answer).
pub(crate) async fn flush_cache(State(gw): State<Arc<Gateway>>) -> Response {
    let workers = gw.fleet.snapshot();
    let calls = workers.iter().map(|w| {
        let client = gw.fleet.client().clone();
        async move {
            let sent = client.post(w.endpoint_url("/flush_cache")).timeout(WORKER_CALL_TIMEOUT).send().await;
            let outcome = match sent {
                Ok(r) if r.status().is_success() => Ok(()),
                Ok(r) => Err(format!("HTTP {}", r.status())),
                Err(e) => Err(e.to_string()),
            };
            (w.url.to_string(), outcome)
        }
    });
    let results = join_all(calls).await;
    let total = results.len();
    let (ok, failed): (Vec<_>, Vec<_>) = results.into_iter().partition(|(_, r)| r.is_ok());
    let successful: Vec<&String> = ok.iter().map(|(u, _)| u).collect();
    if failed.is_empty() {
        let body = json!({
            "status": "success",
            "message": format!("Cache flushed on all {total} workers"),
            "workers_flushed": total,
            "total_http_workers": total,
            "total_workers": total,
        });
        return (StatusCode::OK, Json(body)).into_response();
    }
    let failures: Vec<Value> = failed
        .iter()
        .map(|(u, r)| json!({"worker": u, "error": r.as_ref().err().cloned().unwrap_or_default()}))
        .collect();
    tracing::warn!(failed = failures.len(), total, "flush_cache failed on some workers");
    let body = json!({
        "status": "partial_success",
        "message": format!("Cache flushed on {} of {total} workers", successful.len()),
        "workers_flushed": successful.len(),
        "total_http_workers": total,
        "total_workers": total,
        "successful": successful,
        "failed": failures,
    });
    (StatusCode::PARTIAL_CONTENT, Json(body)).into_response()
}

/// `GET /get_loads`: each worker's load as the fleet knows it, in SGLang
/// Model Gateway's shape (`load`: the prefill tokens the worker reports
/// queued, -1 when it reports none) with this router's own view beside it.
pub(crate) async fn get_loads(State(gw): State<Arc<Gateway>>) -> Json<Value> {
    let workers: Vec<Value> = gw
        .fleet
        .snapshot()
        .iter()
        .map(|w| {
            let load = w.load();
            let reported = if w.reports_load() { w.reported_uncached_tokens() as i64 } else { -1 };
            json!({
                "worker": w.url,
                "load": reported,
                "in_flight": load.in_flight,
                "uncached_tokens": w.own_uncached_tokens(),
                "healthy": w.is_routable(),
            })
        })
        .collect();
    Json(json!({"workers": workers}))
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
