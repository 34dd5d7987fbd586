//! The routes around the proxy: `/debug/route` (a decision without the
//! request), `/v1/models`, readiness, `/metrics`, and the worker admin API.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use router_types::WorkerUrl;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::metrics::{escape, head};
use crate::proxy::{Route, parse_body, plan, read_body};
use crate::workers::Worker;
use crate::{Gateway, GatewayError};

#[derive(Debug, Deserialize)]
pub(crate) struct DebugQuery {
    route: Option<String>,
}

#[derive(Debug, Deserialize)]
struct AddWorker {
    url: String,
}

pub(crate) async fn debug_route(
    State(gw): State<Arc<Gateway>>,
    Query(q): Query<DebugQuery>,
    body: Body,
) -> Result<Json<Value>, GatewayError> {
    let route = match q.route.as_deref() {
        None | Some("chat") => Route::Chat,
        Some("completions") => Route::Completions,
        Some("generate") => Route::Generate,
        Some(other) => {
            return Err(GatewayError::BadRequest(format!("unknown route {other:?}: chat, completions or generate")));
        }
    };
    let bytes = read_body(&gw, body).await?;
    let v = parse_body(&gw, route, &bytes)?;
    let plan = plan(&gw, route, v.as_ref())?;
    let candidates: Vec<Value> = plan
        .candidates
        .iter()
        .map(|c| json!({"worker": plan.workers[c.worker].url, "matched_tokens": c.matched_tokens, "in_flight": c.load.in_flight}))
        .collect();
    Ok(Json(json!({
        "worker": plan.workers[plan.decision.worker].url,
        "dp_rank": plan.rank.map(|r| r.0),
        "policy": gw.policy.name(),
        "reason": plan.decision.reason.as_str(),
        "input_tokens": plan.input_tokens,
        "candidates": candidates,
    })))
}

pub(crate) async fn models(State(gw): State<Arc<Gateway>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{"id": gw.config.model_id, "object": "model", "owned_by": "sgl-router"}]}))
}

/// Ready means "can route": a healthy worker, the listener up (it answers
/// this), and not draining. Subscriptions that are down degrade routing
/// quality, not availability: they are reported here and in `/metrics`,
/// never a readiness failure (one engine down must not take every router
/// replica out of its Service).
pub(crate) async fn readiness(State(gw): State<Arc<Gateway>>) -> Response {
    let all = gw.workers.all();
    let healthy = all.iter().filter(|w| w.is_healthy()).count();
    let subscriptions_ok = gw.ready.as_ref().is_none_or(|h| h());
    let draining = gw.draining.load(Ordering::Relaxed);
    let ready = healthy > 0 && !draining;
    let body = json!({
        "ready": ready,
        "healthy_workers": healthy,
        "workers": all.len(),
        "subscriptions_degraded": !subscriptions_ok,
        "draining": draining,
    });
    (if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, Json(body)).into_response()
}

pub(crate) async fn metrics(State(gw): State<Arc<Gateway>>) -> Response {
    let mut out = String::new();
    let m = &gw.metrics;
    m.requests.render(&mut out, "router_http_requests_total", "Requests by route and status.");
    m.decisions.render(&mut out, "router_policy_decisions_total", "Routing decisions by policy and reason.");
    head(
        &mut out,
        "router_http_retries_total",
        "counter",
        "Requests retried on another worker after a connect failure.",
    );
    out.push_str(&format!("router_http_retries_total {}\n", m.retries.load(Ordering::Relaxed)));
    m.latency.render(&mut out, "router_http_request_duration_seconds", "Whole-request latency, streaming included.");
    m.ttfb.render(&mut out, "router_http_time_to_first_byte_seconds", "Time until the worker's response headers.");
    m.matched_tokens.render(&mut out, "router_policy_matched_tokens", "Prompt tokens the chosen worker already held.");
    let memo = gw.chain_memo.stats();
    head(
        &mut out,
        "router_page_hashes_total",
        "counter",
        "Request pages hashed (SHA-256) or reused from the chain memo.",
    );
    out.push_str(&format!("router_page_hashes_total{{source=\"hashed\"}} {}\n", memo.pages_hashed));
    out.push_str(&format!("router_page_hashes_total{{source=\"memo\"}} {}\n", memo.pages_reused));
    let workers = gw.workers.all();
    let per_worker = |out: &mut String, name: &str, help: &str, value: &dyn Fn(&Worker) -> u64| {
        head(out, name, "gauge", help);
        for w in &workers {
            out.push_str(&format!("{name}{{worker=\"{}\"}} {}\n", escape(w.url.as_str()), value(w)));
        }
    };
    per_worker(&mut out, "router_worker_in_flight", "Requests in flight per worker.", &|w| {
        u64::from(w.load().in_flight)
    });
    per_worker(
        &mut out,
        "router_worker_reported_queued_tokens",
        "Uncached prompt tokens the worker last reported queued (SGLang /v1/loads; 0 when unknown).",
        &|w| w.reported_uncached_tokens(),
    );
    per_worker(&mut out, "router_worker_healthy", "1 while the worker is in rotation.", &|w| u64::from(w.is_healthy()));
    if let Some(hook) = &gw.extra_metrics {
        hook(&mut out);
    }
    let mut r = Response::new(Body::from(out));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    r
}

pub(crate) async fn list_workers(State(gw): State<Arc<Gateway>>) -> Json<Value> {
    let list: Vec<Value> = gw
        .workers
        .all()
        .iter()
        .map(|w| {
            let load = w.load();
            let info = w.info().unwrap_or_default();
            json!({
                "url": w.url,
                "healthy": w.is_healthy(),
                "down_for_s": w.down_for().map(|d| d.as_secs()),
                "in_flight": load.in_flight,
                "uncached_tokens": w.own_uncached_tokens(),
                "reported_uncached_tokens": w.reported_uncached_tokens(),
                "model_id": info.model_id,
                "dp_size": info.dp_size,
                "page_size": info.page_size,
            })
        })
        .collect();
    Json(json!({"workers": list}))
}

pub(crate) async fn add_worker(State(gw): State<Arc<Gateway>>, body: Body) -> Result<Response, GatewayError> {
    let bytes = read_body(&gw, body).await?;
    let req: AddWorker = serde_json::from_slice(&bytes)
        .map_err(|e| GatewayError::BadRequest(format!("expected {{\"url\": ...}}: {e}")))?;
    let url = crate::check_worker_url(&req.url).map_err(GatewayError::BadRequest)?;
    let known = gw.workers.all().iter().any(|w| w.url == url);
    if !known && let Some(hook) = &gw.add_worker {
        // Follow its KV events first: routing to it before would be blind.
        if let Err(reason) = hook(url.clone()).await {
            return Err(GatewayError::Unprocessable(format!("worker {url} refused: {reason}")));
        }
    }
    let added = gw.workers.add(url.clone(), gw.index.as_deref());
    let status = if added { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(json!({"url": url, "added": added}))).into_response())
}

pub(crate) async fn remove_worker(
    State(gw): State<Arc<Gateway>>,
    Path(url): Path<String>,
) -> Result<Json<Value>, GatewayError> {
    // The URL as listed by `/workers` (or any spelling of it).
    let url = WorkerUrl::parse(&url).unwrap_or_else(|_| WorkerUrl::new(url.as_str()));
    if !gw.workers.remove(&url) {
        return Err(GatewayError::NotFound(format!("worker {url}")));
    }
    if let Some(index) = &gw.index {
        index.remove_worker(&url);
    }
    Ok(Json(json!({"removed": url})))
}
