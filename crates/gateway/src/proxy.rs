//! The routes: request handling (parse, plan, charge, forward, stream back),
//! `/debug/route`, health and readiness, `/metrics`, and the worker admin API.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use policy::{Candidate, Decision, RequestInfo};
use renderer::{ChatRequest, PageHasher, Prompt};
use router_types::{BlockHash, DpRank, WorkerUrl};
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::{Instrument, info_span, warn};

use crate::metrics::{escape, head};
use crate::shape::Required;
use crate::workers::{LoadGuard, Worker};
use crate::{Gateway, GatewayError};

/// The header SGLang and vLLM read a data-parallel rank hint from.
const RANK_HEADER: &str = "x-data-parallel-rank";

/// The proxied routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Chat,
    Completions,
    Generate,
}

/// A routing decision and what it was based on.
#[derive(Debug)]
struct Plan {
    workers: Vec<Arc<Worker>>,
    candidates: Vec<Candidate>,
    decision: Decision,
    input_tokens: u64,
    rank: Option<DpRank>,
    hashes: Vec<BlockHash>,
}

/// Load and accounting of one forwarded request, released once on drop.
struct InFlight {
    gw: Arc<Gateway>,
    load: LoadGuard,
    route: Route,
    status: u16,
    start: Instant,
}

#[derive(Debug, Deserialize)]
struct DebugQuery {
    route: Option<String>,
}

#[derive(Debug, Deserialize)]
struct AddWorker {
    url: String,
}

// === impl Route ===

impl Route {
    fn path(self) -> &'static str {
        match self {
            Route::Chat => "/v1/chat/completions",
            Route::Completions => "/v1/completions",
            Route::Generate => "/generate",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Route::Chat => "chat",
            Route::Completions => "completions",
            Route::Generate => "generate",
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let m = &self.gw.metrics;
        m.latency.observe(self.start.elapsed().as_secs_f64());
        // Status 0: the request failed before an answer; `handle` counts its error.
        if self.status != 0 {
            m.requests.inc(format_args!("route=\"{}\",status=\"{}\"", self.route.label(), self.status));
        }
        self.gw.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The gateway's routes.
pub fn router(gw: Arc<Gateway>) -> axum::Router {
    axum::Router::new()
        .route("/v1/chat/completions", post(|s, b| handle(s, b, Route::Chat)))
        .route("/v1/completions", post(|s, b| handle(s, b, Route::Completions)))
        .route("/generate", post(|s, b| handle(s, b, Route::Generate)))
        .route("/debug/route", post(debug_route))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { "ok" }))
        .route("/readiness", get(readiness))
        .route("/metrics", get(metrics))
        .route("/workers", get(list_workers).post(add_worker))
        .route("/workers/{*url}", delete(remove_worker))
        .fallback(|uri: axum::http::Uri| async move { GatewayError::NotFound(uri.path().to_string()) })
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(gw)
}

async fn read_body(gw: &Gateway, body: Body) -> Result<Bytes, GatewayError> {
    axum::body::to_bytes(body, gw.config.max_body_bytes)
        .await
        .map_err(|_| GatewayError::TooLarge(gw.config.max_body_bytes))
}

fn parse_json(bytes: &[u8]) -> Result<Value, GatewayError> {
    let v: Value =
        serde_json::from_slice(bytes).map_err(|e| GatewayError::BadRequest(format!("invalid JSON body: {e}")))?;
    if !v.is_object() {
        return Err(GatewayError::BadRequest("the body must be a JSON object".into()));
    }
    Ok(v)
}

/// The body as far as the router needs it: the parsed JSON, or `None` when
/// the policy needs nothing from it and only its shape was checked (no tree built).
fn parse_body(gw: &Gateway, route: Route, bytes: &[u8]) -> Result<Option<Value>, GatewayError> {
    if gw.index.is_some() || gw.policy.needs_tokens() || gw.policy.needs_text() {
        return parse_json(bytes).map(Some);
    }
    let required = match route {
        Route::Chat => Required::Messages,
        Route::Completions => Required::Prompt,
        Route::Generate => Required::TextOrIds,
    };
    crate::shape::check(bytes, required).map_err(GatewayError::BadRequest)?;
    Ok(None)
}

/// Tokens and text of the request.
fn prompt(gw: &Gateway, route: Route, v: &Value) -> Result<(Vec<u32>, Option<String>), GatewayError> {
    let need_tokens = gw.index.is_some() || gw.policy.needs_tokens();
    let vocab = gw.renderer.tokenizer().vocab_size();
    match route {
        Route::Chat => {
            let req = ChatRequest::from_value(v)?;
            if need_tokens {
                let r = gw.renderer.render_chat(&req)?;
                Ok((r.token_ids, Some(r.text)))
            } else {
                Ok((Vec::new(), Some(gw.renderer.render_text(&req)?)))
            }
        }
        Route::Completions | Route::Generate => {
            let p = if route == Route::Completions {
                Prompt::from_completions(v.get("prompt").unwrap_or(&Value::Null), vocab)?
            } else {
                Prompt::from_generate(v, vocab)?
            };
            let text = match &p {
                Prompt::Text(t) => Some(t.clone()),
                Prompt::Tokens(_) => None,
            };
            let tokens = if need_tokens { gw.renderer.prompt_tokens(&p)? } else { Vec::new() };
            Ok((tokens, text))
        }
    }
}

/// Chooses a worker: candidates with their load and cached prefix, then the policy.
fn plan(gw: &Gateway, route: Route, v: Option<&Value>) -> Result<Plan, GatewayError> {
    let (tokens, text) = match v {
        Some(v) => prompt(gw, route, v)?,
        None => (Vec::new(), None),
    };
    let workers: Vec<Arc<Worker>> = gw.workers.all().into_iter().filter(|w| w.is_healthy()).collect();
    if workers.is_empty() {
        return Err(GatewayError::NoWorker);
    }
    let input_tokens = tokens.len() as u64;
    let mut matched: HashMap<kv_index::WorkerId, (u32, Option<DpRank>)> = HashMap::new();
    let mut hashes = Vec::new();
    if let (Some(index), Some(v)) = (&gw.index, v) {
        let page = NonZeroUsize::new(gw.config.block_size).unwrap_or(NonZeroUsize::MIN);
        // The request's namespace starts its chain, as the engine's does.
        let served = || {
            let mut names: Vec<String> = workers.iter().filter_map(|w| w.info()?.model_id).collect();
            names.push(gw.config.model_id.clone());
            names
        };
        let ns = crate::namespace::of_request(v, served, Some(index));
        let prior = renderer::hash::namespace_prior(ns.adapter, ns.salt);
        // A mixed fleet is matched in each mode; a worker's blocks exist in its own mode only.
        for mode in gw.config.hash_modes.modes() {
            let chain = gw.chain_memo.block_hashes(&PageHasher::new(page, mode), &tokens, prior.as_ref());
            for m in index.prefix_depths(&chain, &kv_index::MatchOptions::default()) {
                let e = matched.entry(m.worker).or_insert((0, None));
                if m.blocks > e.0 {
                    *e = (m.blocks, m.rank);
                }
            }
            if hashes.is_empty() {
                hashes = chain;
            }
        }
    }
    let bs = gw.config.block_size as u64;
    let candidates: Vec<Candidate> = workers
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let blocks = w.index_id.and_then(|id| matched.get(&id)).map_or(0, |m| u64::from(m.0));
            Candidate { worker: i, load: w.load(), matched_tokens: (blocks * bs).min(input_tokens) }
        })
        .collect();
    let decision = gw
        .policy
        .select(&candidates, &RequestInfo { input_tokens, text: text.as_deref() })
        .map_err(|_| GatewayError::NoWorker)?;
    let rank = workers[decision.worker].index_id.and_then(|id| matched.get(&id)).and_then(|m| m.1);
    Ok(Plan { workers, candidates, decision, input_tokens, rank, hashes })
}

async fn handle(State(gw): State<Arc<Gateway>>, body: Body, route: Route) -> Response {
    let span = info_span!(
        "request",
        route = route.label(),
        policy = gw.policy.name(),
        worker = tracing::field::Empty,
        matched_tokens = tracing::field::Empty,
        reason = tracing::field::Empty
    );
    async move {
        match serve(gw.clone(), body, route).await {
            Ok(r) => r,
            Err(e) => {
                gw.metrics.requests.inc(format_args!("route=\"{}\",status=\"{}\"", route.label(), e.status().as_u16()));
                e.into_response()
            }
        }
    }
    .instrument(span)
    .await
}

async fn serve(gw: Arc<Gateway>, body: Body, route: Route) -> Result<Response, GatewayError> {
    if gw.draining.load(Ordering::Relaxed) {
        return Err(GatewayError::NoWorker);
    }
    let start = Instant::now();
    let bytes = read_body(&gw, body).await?;
    let mut v = parse_body(&gw, route, &bytes)?;
    let plan = plan(&gw, route, v.as_ref())?;
    let chosen = &plan.workers[plan.decision.worker];
    let matched = plan.candidates[plan.decision.worker].matched_tokens;
    let span = tracing::Span::current();
    span.record("worker", chosen.url.as_str());
    span.record("matched_tokens", matched);
    span.record("reason", plan.decision.reason.as_str());
    gw.metrics.decisions.inc(format_args!("policy=\"{}\",reason=\"{}\"", gw.policy.name(), plan.decision.reason));
    gw.metrics.matched_tokens.observe(matched as f64);
    if gw.config.credit_pending
        && let (Some(index), Some(id)) = (&gw.index, chosen.index_id)
    {
        index.credit_pending(id, &plan.hashes);
    }
    // Tell a data-parallel engine which rank holds the prefix: SGLang's and
    // vLLM's OpenAI routes read the `X-Data-Parallel-Rank` header (rank 0 on a
    // single-rank engine is accepted by both); SGLang's native `/generate`
    // reads only the body field `routed_dp_rank`.
    let mut body = match (plan.rank, route, v.as_mut()) {
        (Some(rank), Route::Generate, Some(v)) if v.get("routed_dp_rank").is_none() => {
            v["routed_dp_rank"] = json!(rank.0);
            Bytes::from(serde_json::to_vec(&*v).unwrap_or_default())
        }
        _ => bytes.clone(),
    };
    let mut rank_header = plan.rank.map(|r| HeaderValue::from(r.0));
    if gw.in_flight.fetch_add(1, Ordering::Relaxed) >= gw.config.max_concurrent {
        gw.in_flight.fetch_sub(1, Ordering::Relaxed);
        return Err(GatewayError::Overloaded(gw.config.max_concurrent));
    }
    let uncached = plan.input_tokens - matched;
    let mut worker = chosen.clone();
    let mut retried = false;
    loop {
        let guard = InFlight { gw: gw.clone(), load: worker.charge(uncached), route, status: 0, start };
        let Some(endpoint) = worker.endpoint(route.path()) else {
            return Err(GatewayError::Upstream {
                worker: worker.url.to_string(),
                message: "invalid worker URL".into(),
            });
        };
        let mut req = axum::http::Request::post(endpoint).header(header::CONTENT_TYPE, "application/json");
        if let Some(rank) = &rank_header {
            req = req.header(RANK_HEADER, rank.clone());
        }
        let req = match req.body(http_body_util::Full::new(body.clone())) {
            Ok(r) => r,
            Err(e) => return Err(GatewayError::Upstream { worker: worker.url.to_string(), message: e.to_string() }),
        };
        match tokio::time::timeout(gw.config.request_timeout, gw.client().request(req)).await {
            Ok(Ok(resp)) => {
                gw.metrics.ttfb.observe(start.elapsed().as_secs_f64());
                return Ok(stream_back(guard, worker, resp));
            }
            Ok(Err(e)) if e.is_connect() && !retried => {
                // Nothing was sent: try once more on another worker.
                warn!(worker = %worker.url, error = %e, "worker unreachable, retrying elsewhere");
                worker.set_healthy(false);
                gw.metrics.retries.fetch_add(1, Ordering::Relaxed);
                retried = true;
                let others: Vec<Arc<Worker>> =
                    gw.workers.all().into_iter().filter(|w| w.is_healthy() && w.url != worker.url).collect();
                let Some(next) = others.iter().min_by_key(|w| {
                    let l = w.load();
                    (l.in_flight, l.uncached_tokens)
                }) else {
                    return Err(GatewayError::Upstream { worker: worker.url.to_string(), message: describe(&e) });
                };
                drop(guard);
                gw.in_flight.fetch_add(1, Ordering::Relaxed); // the dropped guard released one
                worker = next.clone();
                // The rank hint was for the first worker; the next one places it itself.
                (body, rank_header) = (bytes.clone(), None);
            }
            Ok(Err(e)) => {
                if e.is_connect() {
                    worker.set_healthy(false);
                }
                return Err(GatewayError::Upstream { worker: worker.url.to_string(), message: describe(&e) });
            }
            Err(_) => return Err(GatewayError::Timeout(worker.url.to_string())),
        }
    }
}

/// An error and its causes, on one line ("client error (Connect): tcp connect error: Connection refused").
fn describe(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

/// Passes the worker's answer through frame by frame: its status, its
/// end-to-end headers and its length (a sized answer goes out in one write,
/// not chunked); a redirect goes back to the client, not followed. A worker that dies
/// mid-stream ends the stream with an error event (server-sent events) and
/// leaves rotation; a client that goes away drops the upstream request.
fn stream_back(
    mut guard: InFlight,
    worker: Arc<Worker>,
    resp: axum::http::Response<hyper::body::Incoming>,
) -> Response {
    let (mut parts, body) = resp.into_parts();
    guard.status = parts.status.as_u16();
    let sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|c| c.to_str().ok())
        .is_some_and(|c| c.starts_with("text/event-stream"));
    // The worker's headers pass through, except hop-by-hop ones and the length (set from the body).
    for h in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::CONTENT_LENGTH,
        header::TE,
        header::TRAILER,
        header::UPGRADE,
    ] {
        parts.headers.remove(h);
    }
    parts.headers.remove("keep-alive");
    let relay = Relay { inner: body, guard: Some(guard), worker, sse };
    let mut response = Response::new(Body::new(relay));
    *response.status_mut() = parts.status;
    *response.headers_mut() = parts.headers;
    response
}

/// The body of a proxied answer; holds the request's load until it ends.
struct Relay {
    inner: hyper::body::Incoming,
    guard: Option<InFlight>,
    worker: Arc<Worker>,
    sse: bool,
}

impl http_body::Body for Relay {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        use std::task::Poll;
        let this = self.get_mut();
        let Some(g) = this.guard.as_mut() else { return Poll::Ready(None) };
        match std::pin::Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if frame.is_data() {
                    // The first byte of a streamed answer follows the first token.
                    g.load.prefill_done();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                warn!(worker = %this.worker.url, error = %e, "worker failed mid-response");
                this.worker.set_healthy(false);
                g.status = 502;
                this.guard = None;
                if this.sse {
                    let event = json!({"error": {"message": format!("upstream worker {} failed mid-stream: {e}", this.worker.url), "type": "upstream_unreachable", "code": 502}});
                    Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from(format!(
                        "data: {event}\n\ndata: [DONE]\n\n"
                    ))))))
                } else {
                    Poll::Ready(Some(Err(std::io::Error::other(e.to_string()))))
                }
            }
            Poll::Ready(None) => {
                this.guard = None;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.guard.is_none() || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

async fn debug_route(
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

async fn models(State(gw): State<Arc<Gateway>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{"id": gw.config.model_id, "object": "model", "owned_by": "sgl-router"}]}))
}

async fn readiness(State(gw): State<Arc<Gateway>>) -> Response {
    let workers_up = gw.workers.all().iter().any(|w| w.is_healthy());
    let hook = gw.ready.as_ref().is_none_or(|h| h());
    let draining = gw.draining.load(Ordering::Relaxed);
    let ready = workers_up && hook && !draining;
    let body = json!({"ready": ready, "healthy_workers": workers_up, "subscriptions": hook, "draining": draining});
    (if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, Json(body)).into_response()
}

async fn metrics(State(gw): State<Arc<Gateway>>) -> Response {
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

async fn list_workers(State(gw): State<Arc<Gateway>>) -> Json<Value> {
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

async fn add_worker(State(gw): State<Arc<Gateway>>, body: Body) -> Result<Response, GatewayError> {
    let bytes = read_body(&gw, body).await?;
    let req: AddWorker = serde_json::from_slice(&bytes)
        .map_err(|e| GatewayError::BadRequest(format!("expected {{\"url\": ...}}: {e}")))?;
    crate::check_worker_url(&req.url).map_err(GatewayError::BadRequest)?;
    let url = WorkerUrl::new(req.url.as_str());
    let known = gw.workers.all().iter().any(|w| w.url == url);
    if !known && let Some(hook) = &gw.add_worker {
        // Follow its KV events first: routing to it before would be blind.
        if let Err(reason) = hook(url.clone()).await {
            return Err(GatewayError::Unprocessable(format!("worker {url} refused: {reason}")));
        }
    }
    let added = gw.workers.add(url, gw.index.as_deref());
    let status = if added { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(json!({"url": WorkerUrl::new(req.url.as_str()), "added": added}))).into_response())
}

async fn remove_worker(State(gw): State<Arc<Gateway>>, Path(url): Path<String>) -> Result<Json<Value>, GatewayError> {
    let url = WorkerUrl::new(url.as_str());
    if !gw.workers.remove(&url) {
        return Err(GatewayError::NotFound(format!("worker {url}")));
    }
    if let Some(index) = &gw.index {
        index.remove_worker(&url);
    }
    Ok(Json(json!({"removed": url})))
}
