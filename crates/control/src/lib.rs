//! The control plane: the routes that change the fleet (`/workers`), the
//! routing config (`/routing/reload`), show what the router knows
//! (`/workers`, `/get_loads`, `/v1/route/outcomes`, `/index/snapshot`),
//! explain decisions (`/debug/route`, `/v1/route/preview`: the gateway's
//! dry run) and render `/metrics`. Handed to the gateway as it is wired
//! ([`install`]); the gateway serves them behind the control plane's keys.
//! Nothing depends on this crate but the binary.

mod workers;

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use gateway::{ControlRoutes, Gateway, GatewayError};
use serde::Deserialize;
use serde_json::{Value, json};

/// Hands the control plane's routes to `gw`; call it before serving.
pub fn install(gw: &Gateway) {
    if !gw.set_control_plane(routes()) {
        tracing::debug!("control plane already installed");
    }
}

/// The control plane's routes, and the Prometheus listener's `/metrics`.
pub fn routes() -> ControlRoutes {
    let routes = axum::Router::new()
        .route("/debug/route", post(debug_route))
        .route("/v1/route/preview", post(route_preview))
        .route("/v1/route/outcomes", get(route_outcomes))
        .route("/routing/reload", post(reload_routing))
        .route("/metrics", get(metrics))
        .route("/workers", get(workers::list).post(workers::add))
        .route("/workers/{*url}", delete(workers::remove))
        .route("/flush_cache", post(workers::flush_cache))
        .route("/get_loads", get(workers::get_loads))
        .route("/index/snapshot", get(workers::index_snapshot));
    ControlRoutes { routes, metrics: axum::Router::new().route("/metrics", get(metrics)) }
}

/// `?route=` of the explain routes (chat, completions or generate).
#[derive(Debug, Deserialize)]
struct ExplainQuery {
    route: Option<String>,
}

/// `POST /debug/route`: the worker (or pair) a request would get, and why.
async fn debug_route(
    State(gw): State<Arc<Gateway>>,
    Query(q): Query<ExplainQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, GatewayError> {
    explain(&gw, q, &headers, body, Explain::Decide).await
}

/// `POST /v1/route/preview`: which pool, decision and worker a request
/// would get, with every signal and every decision's outcome, through the
/// same code as a real request; nothing is sent, counted or learned.
async fn route_preview(
    State(gw): State<Arc<Gateway>>,
    Query(q): Query<ExplainQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, GatewayError> {
    explain(&gw, q, &headers, body, Explain::Preview).await
}

/// Which explain a route asks for.
enum Explain {
    Decide,
    Preview,
}

/// Reads an explain's body and runs the gateway's dry run on it.
async fn explain(
    gw: &Arc<Gateway>,
    q: ExplainQuery,
    headers: &HeaderMap,
    body: Body,
    which: Explain,
) -> Result<Json<Value>, GatewayError> {
    let bytes = gateway::read_body(gw, body).await?;
    let route = q.route.as_deref();
    let explained = match which {
        Explain::Decide => gateway::explain::decide(gw, route, headers, bytes).await,
        Explain::Preview => gateway::explain::preview(gw, route, headers, bytes).await,
    };
    explained.map(Json)
}

/// `GET /metrics`: the gateway's series, the fleet's, the process's and its runtimes'.
async fn metrics(State(gw): State<Arc<Gateway>>) -> Response {
    let mut out = String::new();
    gw.render_metrics(&mut out);
    gw.fleet.render_metrics(&mut out);
    gateway::metrics::render_process(&mut out);
    gw.runtimes.render(&mut out);
    let mut r = Response::new(Body::from(out));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    r
}

/// `GET /v1/route/outcomes` (control plane): what feedback taught, per decision and pool.
async fn route_outcomes(State(gw): State<Arc<Gateway>>) -> Result<Json<Value>, GatewayError> {
    let l = routing_slot(&gw)?.learning();
    Ok(Json(json!({"routes_held": l.routes_held(), "outcomes": l.snapshot()})))
}

/// The routing config's slot; 404 for the routes that need one when the router has none.
fn routing_slot(gw: &Gateway) -> Result<&gateway::pools::RoutingSlot, GatewayError> {
    gw.routing
        .as_ref()
        .ok_or_else(|| GatewayError::NotFound("a routing config (start the router with --routing-config)".into()))
}

/// `POST /routing/reload`: reads the routing config file again and puts it
/// in force if it is valid and keeps the pools; else 422 with every problem,
/// the config in force unchanged.
async fn reload_routing(State(gw): State<Arc<Gateway>>) -> Result<Response, GatewayError> {
    routing_slot(&gw)?;
    match gateway::pools::reload(&gw).await {
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
