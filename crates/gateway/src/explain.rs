//! The explain routes' dry run (`/debug/route`, `/v1/route/preview`): a
//! request taken through the select and plan phases as the pipeline takes
//! it, one routing config for the whole explain, nothing sent, counted,
//! remembered or learned. The control plane (the `control` crate) serves them.

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue};
use serde_json::{Value, json};

use crate::pipeline::body::parse_body;
use crate::pipeline::request::{Meta, Route, Seen};
use crate::{Gateway, GatewayError};

/// `POST /v1/route/preview`: which pool, decision and worker a request would
/// get, with every signal and every decision's outcome, through the same code
/// as a real request; nothing is sent, counted or learned.
pub async fn preview(
    gw: &Arc<Gateway>,
    route: Option<&str>,
    headers: &HeaderMap,
    bytes: Bytes,
) -> Result<Value, GatewayError> {
    preview_of(gw, route_named(route)?, headers, bytes).await
}

/// [`preview`] of a request on `route` (one with a prompt: `Route::has_prompt`).
pub(crate) async fn preview_of(
    gw: &Arc<Gateway>,
    route: Route,
    headers: &HeaderMap,
    bytes: Bytes,
) -> Result<Value, GatewayError> {
    let Asking { route, routing, meta, parsed, embeddings } = prologue(gw, route, headers, &bytes).await?;
    let (gw2, len) = (gw.clone(), bytes.len());
    let out = crate::pipeline::admission::render(gw, len, move || {
        let mut v = parsed.map_or_else(|| crate::pipeline::body::parse_json(&bytes), Ok)?;
        let mut preview = crate::pools::Preview::default();
        let renders = planner::Renders::default();
        let workers = gw2.fleet.snapshot();
        let planner = gw2.planner(&workers);
        let routed = match routing {
            Some(routing) => {
                let ask = asked(&meta, true, embeddings.as_ref(), (&renders, planner));
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
            match crate::pd::explain_pair(planner, (pool, &pd), route, &v, meta.routing_key.as_deref()) {
                Ok(pair) => out["pair"] = pair,
                Err(e) => out["error"] = e.body()["error"].clone(),
            }
            return Ok(out);
        }
        // The worker the pool would pick: the policy's choice, never committed.
        match planner.plan(pool, route, Some(&v), meta.routing_key.as_deref(), &renders, false) {
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
    out.await?
}

/// `POST /debug/route`: the worker (or a disaggregated pool's pair) a request
/// would get, the policy's reason and every candidate's score; nothing committed.
pub async fn decide(
    gw: &Arc<Gateway>,
    route: Option<&str>,
    headers: &HeaderMap,
    bytes: Bytes,
) -> Result<Value, GatewayError> {
    // Rendered like a request: a large body off the serving thread; with a routing config, in
    // the pool the request would get (nothing counted, remembered or learned).
    let Asking { route, routing, meta, parsed, embeddings } =
        prologue(gw, route_named(route)?, headers, &bytes).await?;
    let (gw2, len) = (gw.clone(), bytes.len());
    let plan = crate::pipeline::admission::render(gw, len, move || {
        let mut v = parse_body(&gw2, route, &bytes, parsed)?;
        let renders = planner::Renders::default();
        let workers = gw2.fleet.snapshot();
        let planner = gw2.planner(&workers);
        let key = meta.routing_key.as_deref();
        let pool = match (routing, v.as_mut()) {
            (Some(routing), Some(v)) => {
                let ask = asked(&meta, false, embeddings.as_ref(), (&renders, planner));
                let mut preview = crate::pools::Preview::default();
                crate::pools::route(&gw2, &routing, route, v, &ask, Some(&mut preview))?.pool
            }
            _ => gw2.pools[0].clone(),
        };
        // A disaggregated pool: both legs' choices and why.
        if let Some(pd) = pool.pd.clone() {
            let v = v.map_or_else(|| crate::pipeline::body::parse_json(&bytes), Ok)?;
            return crate::pd::explain_pair(planner, (&pool, &pd), route, &v, key).map(Explained::Pair);
        }
        Ok(Explained::Plan(planner.plan(&pool, route, v.as_ref(), key, &renders, false)?))
    })
    .await??;
    let plan = match plan {
        Explained::Plan(plan) => plan,
        Explained::Pair(pair) => return Ok(pair),
    };
    // An explain: the policy's choice, never committed (nothing it learns or advances).
    let candidates = plan.candidates_json();
    Ok(json!({
        "worker": plan.chosen().url,
        "pool": plan.pool.id,
        "dp_rank": plan.rank.map(|r| r.0),
        "policy": plan.pool.policy.name(),
        "reason": plan.decision.reason.as_str(),
        "input_tokens": plan.input_tokens,
        "regret": plan.regret.to_json(),
        "candidates": candidates,
        "images": plan.images_json(),
    }))
}

/// What an explain planned: one worker, or a disaggregated pool's pair.
enum Explained {
    Plan(planner::Plan),
    Pair(Value),
}

/// What both explains read before the select phase, as the pipeline reads a request.
struct Asking {
    route: Route,
    /// One routing config for the whole explain.
    routing: Option<Arc<crate::pools::Routing>>,
    /// Its routing key, the headers its header signals read, its session; no caller, no cache.
    meta: Meta,
    /// The body as the signals parsed it, and the vectors the decisions read.
    parsed: Option<Value>,
    embeddings: Option<model_select::RequestEmbeddings>,
}

/// The explained request's route (`?route=`), routing snapshot, what it carries and its
/// embeddings, read from its `headers` and `bytes` as the pipeline reads them.
async fn prologue(gw: &Arc<Gateway>, route: Route, headers: &HeaderMap, bytes: &Bytes) -> Result<Asking, GatewayError> {
    let routing = gw.routing();
    let key = |name: &str| h1_codec::usable_key(headers.get(name).map(HeaderValue::as_bytes));
    let keys = (key(h1_codec::ROUTING_KEY_HEADER), key(h1_codec::SESSION_HEADER));
    let lines = || headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes()));
    // Anonymous (no caller) and reading no response cache.
    let mut meta = Meta::new(gw, String::new(), routing.as_deref(), Seen::default(), keys, lines);
    meta.cache_bypass = true;
    let crate::pools::PreRouted { body: parsed, embeddings } =
        crate::pools::pre_route(gw, routing.as_deref(), route, bytes).await?;
    Ok(Asking { route, routing, meta, parsed, embeddings })
}

/// What the select phase is asked of an explained request (`debug`: with every signal).
fn asked<'a>(
    meta: &'a Meta,
    debug: bool,
    embeddings: Option<&'a model_select::RequestEmbeddings>,
    (renders, planner): (&'a planner::Renders, planner::Planner<'a>),
) -> crate::pools::Asked<'a> {
    let (headers, session) = (&meta.signal_headers[..], meta.session.as_deref());
    crate::pools::Asked {
        debug,
        headers,
        session,
        embeddings,
        cache_bypass: true,
        caller: None,
        renders,
        planner,
        probe: false,
    }
}

/// The route an explain is about (`?route=`, chat by default).
fn route_named(q: Option<&str>) -> Result<Route, GatewayError> {
    match q {
        None | Some("chat") => Ok(Route::Chat),
        Some("completions") => Ok(Route::Completions),
        Some("generate") => Ok(Route::Generate),
        Some("messages") => Ok(Route::Messages),
        Some(other) => {
            Err(GatewayError::BadRequest(format!("unknown route {other:?}: chat, completions, generate or messages")))
        }
    }
}
