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

use crate::metrics::head;
use fleet::{Events, Worker};

use crate::pipeline::body::{parse_body, read_body};
use crate::pipeline::request::Route;
use crate::{Gateway, GatewayError};

#[derive(Debug, Deserialize)]
pub(crate) struct DebugQuery {
    route: Option<String>,
}

#[derive(Debug, Deserialize)]
struct AddWorker {
    url: String,
    /// The pool it serves, by name or served model (SMG's `model_id`); the default pool without.
    #[serde(default, alias = "model_id")]
    pool: Option<String>,
}

/// `POST /v1/route/preview`: which pool, decision and worker a request would
/// get, with every signal and every decision's outcome, through the same code
/// as a real request; nothing is sent, counted or learned.
pub(crate) async fn route_preview(
    State(gw): State<Arc<Gateway>>,
    Query(q): Query<DebugQuery>,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Result<Json<Value>, GatewayError> {
    let route = debug_route_of(q.route.as_deref())?;
    let key = h1_codec::usable_key(headers.get(h1_codec::ROUTING_KEY_HEADER).map(HeaderValue::as_bytes));
    let bytes = read_body(&gw, body).await?;
    // One routing config for the whole explain.
    let routing = gw.routing();
    let (signal_headers, session) = routing_headers(routing.as_deref(), &headers);
    let crate::pools::PreRouted { body: parsed, embeddings } =
        crate::pools::pre_route(&gw, routing.as_deref(), route, &bytes).await?;
    let (gw2, len) = (gw.clone(), bytes.len());
    let out = crate::pipeline::admission::render(&gw, len, move || {
        let mut v = parsed.map_or_else(|| crate::pipeline::body::parse_json(&bytes), Ok)?;
        let mut preview = crate::pools::Preview::default();
        let renders = planner::Renders::default();
        let routed = match routing {
            Some(routing) => {
                let (headers, session, embeddings) = (&signal_headers, session.as_deref(), embeddings.as_ref());
                let renders = &renders;
                let ask = crate::pools::Asked {
                    debug: true,
                    headers,
                    session,
                    embeddings,
                    cache_bypass: true,
                    caller: None,
                    renders,
                };
                crate::pools::route(&gw2, &routing, route, &mut v, &ask, Some(&mut preview))
            }
            None => Ok(crate::pools::Routed::default_pool(&gw2)),
        };
        let mut out = json!({
            "signals": preview.signals,
            "decisions": preview.decisions,
            "candidates": preview.candidates,
            "passed_over": preview.passed_over,
            "scores": preview.scores,
            "session": preview.session,
        });
        let routed = match routed {
            Ok(r) => r,
            Err(GatewayError::Blocked { status, message, decision }) => {
                out["decision"] = json!(decision);
                out["blocked"] = json!({"status": status, "message": message});
                return Ok(out);
            }
            Err(e @ GatewayError::NoPool(_)) => {
                out["decision"] = json!(preview.decision);
                out["error"] = e.body()["error"].clone();
                return Ok(out);
            }
            Err(e) => return Err(e),
        };
        let pool = &routed.pool;
        out["pool"] = json!(pool.id);
        out["model"] = json!(pool.served_model);
        out["decision"] = json!(routed.decision);
        out["body_rewritten"] = json!(routed.rewritten);
        // A disaggregated pool: the pair it would pick, never committed.
        if let Some(pd) = pool.pd.clone() {
            match crate::pd::explain_pair(&gw2, (pool, &pd), route, &v, key.as_deref()) {
                Ok(pair) => out["pair"] = pair,
                Err(e) => out["error"] = e.body()["error"].clone(),
            }
            return Ok(out);
        }
        // The worker the pool would pick: the policy's choice, never committed.
        match gw2.planner().plan(pool, route, Some(&v), key.as_deref(), &renders, false) {
            Ok(plan) => {
                out["worker"] = json!(plan.chosen().url);
                out["policy"] = json!(pool.policy.name());
                out["reason"] = json!(plan.decision.reason.as_str());
                out["input_tokens"] = json!(plan.input_tokens);
                out["workers"] = json!(plan.candidates_json());
            }
            Err(e) => {
                out["worker"] = Value::Null;
                out["error"] = GatewayError::from(e).body()["error"].clone();
            }
        }
        Ok::<_, GatewayError>(out)
    });
    Ok(Json(out.await??))
}

/// `POST /v1/route/feedback` (data plane): a verdict on a routed answer (`{"route_id",
/// "verdict": "good" | "bad"}`) or a preference between two (`{"winner", "loser"}`, route ids
/// of one decision from two pools), applied to what the `bandit` algorithm draws from.
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
    slot.learning().feedback_from(&bytes, caller).map(Json)
}

/// `GET /v1/route/outcomes` (control plane): what feedback taught, per decision and pool.
pub(crate) async fn route_outcomes(State(gw): State<Arc<Gateway>>) -> Result<Json<Value>, GatewayError> {
    let l = routing_slot(&gw)?.learning();
    Ok(Json(json!({"routes_held": l.routes_held(), "outcomes": l.snapshot()})))
}

/// The routing config's slot; 404 for the routes that need one when the router has none.
fn routing_slot(gw: &Gateway) -> Result<&crate::pools::RoutingSlot, GatewayError> {
    gw.routing
        .as_ref()
        .ok_or_else(|| GatewayError::NotFound("a routing config (start the router with --routing-config)".into()))
}

/// `POST /routing/reload`: reads the routing config file again and puts it
/// in force if it is valid and keeps the pools; else 422 with every problem,
/// the config in force unchanged.
pub(crate) async fn reload_routing(State(gw): State<Arc<Gateway>>) -> Result<Response, GatewayError> {
    routing_slot(&gw)?;
    match crate::pools::reload(&gw).await {
        Ok(r) => {
            tracing::info!(decisions = r.decisions, signals = r.signals, "routing config reloaded");
            Ok(Json(json!({"reloaded": true, "decisions": r.decisions, "signals": r.signals})).into_response())
        }
        Err(problems) => {
            tracing::warn!(?problems, "routing config not reloaded: the config in force is kept");
            let body = json!({"reloaded": false, "problems": problems, "error": {
                "message": "the routing config was not reloaded; the config in force is kept",
                "type": "invalid_routing_config", "code": 422}});
            Ok((StatusCode::UNPROCESSABLE_ENTITY, Json(body)).into_response())
        }
    }
}

/// What routing reads of an explain's headers: those header signals read, and `x-session-id`.
fn routing_headers(
    routing: Option<&crate::pools::Routing>,
    headers: &axum::http::HeaderMap,
) -> (Vec<(String, String)>, Option<Vec<u8>>) {
    let signal_headers = crate::pools::wanted_headers(routing, headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes())));
    let session = h1_codec::usable_key(headers.get(h1_codec::SESSION_HEADER).map(HeaderValue::as_bytes));
    (signal_headers, session)
}

/// The route an explain is about (`?route=`, chat by default).
fn debug_route_of(q: Option<&str>) -> Result<Route, GatewayError> {
    match q {
        None | Some("chat") => Ok(Route::Chat),
        Some("completions") => Ok(Route::Completions),
        Some("generate") => Ok(Route::Generate),
        Some(other) => Err(GatewayError::BadRequest(format!("unknown route {other:?}: chat, completions or generate"))),
    }
}

pub(crate) async fn debug_route(
    State(gw): State<Arc<Gateway>>,
    Query(q): Query<DebugQuery>,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Result<Json<Value>, GatewayError> {
    let key = h1_codec::usable_key(headers.get(h1_codec::ROUTING_KEY_HEADER).map(HeaderValue::as_bytes));
    let route = debug_route_of(q.route.as_deref())?;
    let bytes = read_body(&gw, body).await?;
    // Rendered like a request: a large body off the serving thread; with a routing config, in
    // the pool the request would get (nothing counted, remembered or learned).
    // One routing config for the whole explain.
    let routing = gw.routing();
    let (signal_headers, session) = routing_headers(routing.as_deref(), &headers);
    let crate::pools::PreRouted { body: parsed, embeddings } =
        crate::pools::pre_route(&gw, routing.as_deref(), route, &bytes).await?;
    let (gw2, len, key) = (gw.clone(), bytes.len(), key);
    let plan = crate::pipeline::admission::render(&gw, len, move || {
        let mut v = parse_body(&gw2, route, &bytes, parsed)?;
        let renders = planner::Renders::default();
        let pool = match (routing, v.as_mut()) {
            (Some(routing), Some(v)) => {
                let (headers, session, embeddings) = (&signal_headers, session.as_deref(), embeddings.as_ref());
                let ask = crate::pools::Asked {
                    debug: false,
                    headers,
                    session,
                    embeddings,
                    cache_bypass: true,
                    caller: None,
                    renders: &renders,
                };
                let mut preview = crate::pools::Preview::default();
                crate::pools::route(&gw2, &routing, route, v, &ask, Some(&mut preview))?.pool
            }
            _ => gw2.pools[0].clone(),
        };
        // A disaggregated pool: both legs' choices and why.
        if let Some(pd) = pool.pd.clone() {
            let v = v.map_or_else(|| crate::pipeline::body::parse_json(&bytes), Ok)?;
            return crate::pd::explain_pair(&gw2, (&pool, &pd), route, &v, key.as_deref()).map(Explained::Pair);
        }
        Ok(Explained::Plan(gw2.planner().plan(&pool, route, v.as_ref(), key.as_deref(), &renders, false)?))
    })
    .await??;
    let plan = match plan {
        Explained::Plan(plan) => plan,
        Explained::Pair(pair) => return Ok(Json(pair)),
    };
    // An explain: the policy's choice, never committed (nothing it learns or advances).
    let candidates = plan.candidates_json();
    Ok(Json(json!({
        "worker": plan.chosen().url,
        "pool": plan.pool.id,
        "dp_rank": plan.rank.map(|r| r.0),
        "policy": plan.pool.policy.name(),
        "reason": plan.decision.reason.as_str(),
        "input_tokens": plan.input_tokens,
        "candidates": candidates,
    })))
}

/// What an explain planned: one worker, or a disaggregated pool's pair.
enum Explained {
    Plan(planner::Plan),
    Pair(Value),
}

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
    });
    (if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, Json(body)).into_response()
}

pub(crate) async fn metrics(State(gw): State<Arc<Gateway>>) -> Response {
    let mut out = String::new();
    let m = &gw.metrics;
    m.requests.render(&mut out, "router_http_requests_total", "Requests by route and status.");
    m.answers_cut.render(
        &mut out,
        "router_http_answers_cut_total",
        "Answers that broke off after their head went out (the worker failed or fell silent mid-answer), by route.",
    );
    m.decisions.render(&mut out, "router_policy_decisions_total", "Routing decisions by policy and reason.");
    m.errors.render(
        &mut out,
        "router_http_errors_total",
        "Requests that failed before a worker's answer, by side (client, upstream, internal) and error type.",
    );
    head(
        &mut out,
        "router_http_retries_total",
        "counter",
        "Attempts sent again (--retry-*): after a worker could not be reached or answered 408, 429 or 5xx.",
    );
    out.push_str(&format!("router_http_retries_total {}\n", m.retries.load(Ordering::Relaxed)));
    head(
        &mut out,
        "router_http_queue_rejected_total",
        "counter",
        "Requests refused while waiting for a slot, by cause.",
    );
    out.push_str(&format!(
        "router_http_queue_rejected_total{{cause=\"full\"}} {}\nrouter_http_queue_rejected_total{{cause=\"timeout\"}} {}\n",
        m.queue_full.load(Ordering::Relaxed),
        m.queue_timeouts.load(Ordering::Relaxed)
    ));
    head(&mut out, "router_http_queue_waiting", "gauge", "Requests waiting for a slot now.");
    out.push_str(&format!("router_http_queue_waiting {}\n", gw.queue.waiting.load(Ordering::Relaxed)));
    m.queue_wait.render(&mut out, "router_http_queue_wait_seconds", "How long queued requests waited for a slot.");
    head(
        &mut out,
        "router_http_over_budget_total",
        "counter",
        "Requests refused (429) because the memory of requests in progress was at its budget.",
    );
    out.push_str(&format!("router_http_over_budget_total {}\n", m.over_budget.load(Ordering::Relaxed)));
    head(
        &mut out,
        "router_prompt_renders_total",
        "counter",
        "Prompts rendered and tokenized (at most once per request and renderer).",
    );
    out.push_str(&format!("router_prompt_renders_total {}\n", m.renders.load(Ordering::Relaxed)));
    head(
        &mut out,
        "router_accept_errors_total",
        "counter",
        "Failed accepts on the client listener (out of file descriptors and the like); each backs off 10 ms to 1 s.",
    );
    out.push_str(&format!("router_accept_errors_total {}\n", m.accept_errors.load(Ordering::Relaxed)));
    head(&mut out, "router_http_request_memory_bytes", "gauge", "Memory reserved by the requests in progress.");
    out.push_str(&format!("router_http_request_memory_bytes {}\n", gw.budget.used()));
    m.latency.render(&mut out, "router_http_request_duration_seconds", "Whole-request latency, streaming included.");
    m.ttfb.render(&mut out, "router_http_time_to_first_byte_seconds", "Time until the worker's response headers.");
    m.matched_tokens.render(&mut out, "router_policy_matched_tokens", "Prompt tokens the chosen worker already held.");
    if gw.disaggregated() {
        m.pd_decisions.render(
            &mut out,
            "router_pd_decisions_total",
            "Disaggregated decisions by leg, policy and reason.",
        );
        m.pd_legs.render(&mut out, "router_pd_legs_total", "Disaggregated requests' legs by leg and outcome.");
        m.pd_aborts.render(
            &mut out,
            "router_pd_aborts_total",
            "Legs aborted (connection closed, /abort_request) because the other leg failed, by the leg aborted.",
        );
        m.pd_heads.render(
            &mut out,
            "router_pd_heads_seconds",
            "Time from a disaggregated dispatch until both legs answered their heads.",
        );
    }
    if let (Some(slot), Some(r)) = (&gw.routing, gw.routing()) {
        slot.reloads.render(
            &mut out,
            "router_model_reloads_total",
            "Routing config reloads by outcome (ok, invalid, unreadable).",
        );
        let m = &r.metrics;
        m.requests.render(
            &mut out,
            "router_model_requests_total",
            "Requests by the pool that served them and the decision.",
        );
        m.blocks.render(
            &mut out,
            "router_model_blocks_total",
            "Requests a decision's block plugin answered, by decision.",
        );
        m.redactions.render(
            &mut out,
            "router_model_redactions_total",
            "Values pii_redact replaced with placeholders, by type.",
        );
        m.sessions.render(
            &mut out,
            "router_model_sessions_total",
            "Auto-routed conversations by what stickiness did: new, same pool, stayed (kept by its cached prefix), switched.",
        );
        head(&mut out, "router_model_sessions", "gauge", "Conversations remembered for stickiness now.");
        out.push_str(&format!("router_model_sessions {}\n", r.sessions.len()));
        m.signal_seconds.render(
            &mut out,
            "router_model_signal_seconds",
            "Time computing signals and choosing the decision, per auto-routed request.",
        );
        m.cache_lookups.render(
            &mut out,
            "router_response_cache_lookups_total",
            "Response-cache lookups by decision and outcome (hit_exact, hit_semantic, miss, skip_sampling, skip_choices, skip_bypass).",
        );
        m.cache_stores.render(
            &mut out,
            "router_response_cache_stores_total",
            "Complete answers stored in a response cache, by decision.",
        );
        m.cascades.render(
            &mut out,
            "router_cascade_total",
            "Requests a cascade plugin judged or let pass, by decision and outcome (kept, escalated, no_logprobs, skip_stream, skip_route, too_large, failed).",
        );
        let learning = slot.learning();
        learning.counts.render(
            &mut out,
            "router_route_feedback_total",
            "Feedback by kind (verdict, preference) and outcome (accepted, unknown_route, already_judged, invalid, rate_limited, over_weight).",
        );
        head(&mut out, "router_route_ids", "gauge", "Route ids (x-route-id) remembered for feedback now.");
        out.push_str(&format!("router_route_ids {}\n", learning.routes_held()));
        head(&mut out, "router_route_feedback_arms", "gauge", "(decision, pool) pairs with feedback evidence now.");
        out.push_str(&format!("router_route_feedback_arms {}\n", learning.arms_held()));
        if r.caches_answers() {
            head(
                &mut out,
                "router_response_cache_entries",
                "gauge",
                "Answers a response cache holds now, by decision.",
            );
            for (d, store) in r.selector.config().decisions.iter().zip(&r.caches) {
                if let Some(store) = store {
                    let name = crate::metrics::escape(&d.name);
                    out.push_str(&format!("router_response_cache_entries{{decision=\"{name}\"}} {}\n", store.len()));
                }
            }
        }
        if let Some(pool) = slot.embedder() {
            crate::pools::render_embedding(pool, &mut out);
        }
    }
    let (hashed, reused) = gw
        .pools
        .iter()
        .map(|p| p.chain_memo.stats())
        .fold((0, 0), |(h, r), s| (h + s.pages_hashed, r + s.pages_reused));
    head(
        &mut out,
        "router_page_hashes_total",
        "counter",
        "Request pages hashed (SHA-256) or reused from the chain memo.",
    );
    out.push_str(&format!("router_page_hashes_total{{source=\"hashed\"}} {hashed}\n"));
    out.push_str(&format!("router_page_hashes_total{{source=\"memo\"}} {reused}\n"));
    head(&mut out, "router_page_hash_memo_pages", "gauge", "Page digests the page-hash memos hold now.");
    let memo: usize = gw.pools.iter().map(|p| p.chain_memo.len()).sum();
    out.push_str(&format!("router_page_hash_memo_pages {memo}\n"));
    head(
        &mut out,
        "router_policy_tree_bytes",
        "gauge",
        "Bytes the policies' text trees hold now (their text and their nodes), by pool; bounded by --approx-max-tree-bytes each.",
    );
    for p in &gw.pools {
        let pool = crate::metrics::escape(&p.id.0);
        let decode = p.pd.as_ref().map_or(0, |pd| pd.decode_policy.held_bytes());
        out.push_str(&format!("router_policy_tree_bytes{{pool=\"{pool}\"}} {}\n", p.policy.held_bytes() + decode));
    }
    // Each renderer once (pools may share the router's).
    let mut renderers: Vec<&Arc<renderer::Renderer>> = Vec::new();
    for p in &gw.pools {
        if !renderers.iter().any(|r| Arc::ptr_eq(r, &p.renderer)) {
            renderers.push(&p.renderer);
        }
    }
    let stats: Vec<renderer::CacheStats> = renderers.iter().map(|r| r.tokenizer().cache_stats()).collect();
    head(
        &mut out,
        "router_tokenizer_cache_bytes",
        "gauge",
        "Bytes the tokenizers' caches hold now, by cache (segment: text bytes; word: the fast path's words with ids and overhead).",
    );
    out.push_str(&format!(
        "router_tokenizer_cache_bytes{{cache=\"segment\"}} {}\n",
        stats.iter().map(|s| s.segment_bytes).sum::<usize>()
    ));
    out.push_str(&format!(
        "router_tokenizer_cache_bytes{{cache=\"word\"}} {}\n",
        stats.iter().map(|s| s.word_bytes).sum::<usize>()
    ));
    head(&mut out, "router_tokenizer_cache_segments", "gauge", "Segments the tokenizers' segment caches hold now.");
    out.push_str(&format!(
        "router_tokenizer_cache_segments {}\n",
        stats.iter().map(|s| s.segment_entries).sum::<usize>()
    ));
    gw.fleet.render_metrics(&mut out);
    crate::metrics::render_process(&mut out);
    let mut r = Response::new(Body::from(out));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    r
}

pub(crate) async fn list_workers(State(gw): State<Arc<Gateway>>) -> Json<Value> {
    let list: Vec<Value> = gw
        .fleet
        .all()
        .iter()
        .map(|w| {
            let mut v = describe(w);
            v["kv_streams_connected"] = json!(gw.fleet.connected_streams(w));
            let history: Vec<Value> = gw
                .fleet
                .stream_history(w)
                .into_iter()
                .map(|(rank, h)| match h {
                    fleet::StreamHistory::Missed { batches } => json!({"dp_rank": rank.0, "missed_batches": batches}),
                    fleet::StreamHistory::Resumed { after } => json!({"dp_rank": rank.0, "resumed_after_seq": after}),
                    fleet::StreamHistory::SnapshotReset => json!({"dp_rank": rank.0, "snapshot_reset": true}),
                })
                .collect();
            if !history.is_empty() {
                v["kv_history"] = json!(history);
            }
            v
        })
        .collect();
    Json(json!({"workers": list}))
}

/// `GET /index/snapshot`: a consistent snapshot of the KV index for a peer
/// replica starting late (`--index-peers`), in the binary form of
/// `kv_ingest::snapshot`, within `--index-snapshot-max-blocks` and
/// `--index-snapshot-timeout-secs`. 503 when the router follows no events
/// or the pump does not answer in time.
pub(crate) async fn index_snapshot(State(gw): State<Arc<Gateway>>) -> Result<Response, GatewayError> {
    let limits = gw.config.index_snapshot;
    let started = std::time::Instant::now();
    let Some(taken) = gw.fleet.snapshot_index(limits.max_blocks, limits.timeout).await else {
        gw.fleet.metrics.snapshots_refused.fetch_add(1, Ordering::Relaxed);
        return Err(GatewayError::Unavailable(
            "no index snapshot: this router follows no KV events, or its pump did not answer in time".into(),
        ));
    };
    let (streams, blocks) = (taken.snapshot.streams.len(), taken.snapshot.blocks());
    let body = tokio::task::spawn_blocking(move || taken.snapshot.encode())
        .await
        .map_err(|e| GatewayError::Internal(format!("snapshot encoding: {e}")))?;
    gw.fleet.metrics.snapshots_served.fetch_add(1, Ordering::Relaxed);
    tracing::info!(streams, blocks, left_out = taken.left_out, bytes = body.len(), took = ?started.elapsed(), "kv index: snapshot served");
    let mut r = Response::new(Body::from(body));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    h.insert("x-index-streams", HeaderValue::from(streams));
    h.insert("x-index-blocks", HeaderValue::from(blocks));
    h.insert("x-index-streams-left-out", HeaderValue::from(taken.left_out));
    Ok(r)
}

/// A worker as `/workers` shows it.
fn describe(w: &Worker) -> Value {
    let load = w.load();
    let info = w.info().unwrap_or_default();
    let (events, streams, reason) = match w.events() {
        Events::Off => ("off", None, None),
        Events::Discovering => ("discovering", None, None),
        Events::Followed { streams } => ("followed", Some(streams), None),
        Events::NotFollowed(reason) => ("not_followed", None, Some(reason)),
        Events::Refused(reason) => ("refused", None, Some(reason)),
    };
    json!({
        "id": w.id,
        "url": w.url,
        "role": w.role.as_str(),
        "pool": w.pool,
        "state": w.state().as_str(),
        "healthy": w.is_routable(),
        "circuit": w.breaker_state().as_str(),
        "circuit_opened": w.breaker_opened(),
        "down_for_s": w.down_for().map(|d| d.as_secs()),
        "in_flight": load.in_flight,
        "uncached_tokens": w.own_uncached_tokens(),
        "reported_uncached_tokens": w.reported_uncached_tokens(),
        "model_id": info.model_id,
        "dp_size": info.dp_size,
        "page_size": info.page_size,
        "kv_events": events,
        "kv_streams": streams,
        "kv_events_reason": reason,
    })
}

/// How long `POST /workers` waits for a new worker's publishers to be found
/// before answering 202 (still discovering; followed when it comes up).
const ADD_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

pub(crate) async fn add_worker(State(gw): State<Arc<Gateway>>, body: Body) -> Result<Response, GatewayError> {
    let bytes = read_body(&gw, body).await?;
    let req: AddWorker = serde_json::from_slice(&bytes)
        .map_err(|e| GatewayError::BadRequest(format!("expected {{\"url\": ...}}: {e}")))?;
    let url = crate::check_worker_url(&req.url).map_err(GatewayError::BadRequest)?;
    let pool = match req.pool.as_deref() {
        None => gw.default_pool().id.clone(),
        Some(name) => {
            let found = gw.pools.iter().find(|p| p.id.0 == name || p.served_model == name);
            found.ok_or_else(|| GatewayError::BadRequest(format!("no pool is named or serves `{name}`")))?.id.clone()
        }
    };
    let added = gw.fleet.add_in(url.clone(), router_types::Role::Regular, pool.clone(), fleet::Source::Admin);
    if !added.new {
        let (id, serves) = (added.worker.id, &added.worker.pool);
        if req.pool.is_some() && *serves != pool {
            // A URL is one worker, in one pool.
            let message = format!("worker {url} is already in the fleet, serving pool {serves}; remove it first");
            let body = json!({"error": {"message": message, "type": "conflict", "code": 409}, "pool": serves});
            return Ok((StatusCode::CONFLICT, Json(body)).into_response());
        }
        return Ok(
            (StatusCode::OK, Json(json!({"url": url, "id": id, "added": false, "pool": serves}))).into_response()
        );
    }
    // Follow its KV events first: routing to it before would be blind.
    let status = match gw.fleet.wait_discovered(&added.worker, ADD_WAIT).await {
        Events::Refused(reason) => {
            gw.fleet.remove(&url).await;
            return Err(GatewayError::Unprocessable(format!("worker {url} refused: {reason}")));
        }
        Events::Discovering => StatusCode::ACCEPTED,
        _ => StatusCode::CREATED,
    };
    let body = json!({"url": url, "id": added.worker.id, "added": true, "worker": describe(&added.worker)});
    Ok((status, Json(body)).into_response())
}

pub(crate) async fn remove_worker(
    State(gw): State<Arc<Gateway>>,
    Path(url): Path<String>,
) -> Result<Json<Value>, GatewayError> {
    // The URL as listed by `/workers` (or any spelling of it).
    let url = WorkerUrl::parse(&url).unwrap_or_else(|_| WorkerUrl::new(url.as_str()));
    let Some(w) = gw.fleet.remove(&url).await else {
        return Err(GatewayError::NotFound(format!("worker {url}")));
    };
    Ok(Json(json!({"removed": url, "id": w.id, "in_flight": w.load().in_flight})))
}
