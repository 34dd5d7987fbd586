//! The route table of the listeners (axum): the data plane (the OpenAI
//! routes, behind `--client-api-keys` when set), the open probes, and the
//! control plane's routes (made by the `control` crate above, handed over as
//! [`ControlRoutes`]) behind its keys, on the client listener or on its own
//! (`--admin-port`); plus the layers every route shares (a declared body over
//! the limit refused before it is read, JSON errors for unknown routes and methods).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use axum::routing::{get, post};

use crate::pipeline::account::count_error;
use crate::pipeline::auth::Plane;
use crate::pipeline::request::Route;
use crate::proxy::handle;
use crate::served;
use crate::{Gateway, GatewayError};

/// The control plane's routes, made by the layer above the gateway (the
/// `control` crate) and handed over as the router is wired
/// ([`Gateway::set_control_plane`]). The gateway serves them behind the
/// control plane's keys, on the client listener or on `--admin-port`.
#[derive(Clone, Debug, Default)]
pub struct ControlRoutes {
    /// Every control route (`/metrics` among them); no probe (the gateway's own).
    pub routes: axum::Router<Arc<Gateway>>,
    /// What the Prometheus listener serves (`--prometheus-port`), open.
    pub metrics: axum::Router<Arc<Gateway>>,
}

/// The gateway's routes (axum): the data plane (the OpenAI routes, behind
/// `--client-api-keys` when set), the probes (open), and, unless the control
/// plane has a listener of its own (`--admin-port`), the control plane.
pub(crate) fn router(gw: Arc<Gateway>) -> axum::Router {
    let data = axum::Router::new()
        .route("/v1/chat/completions", post(|s, h, b| handle(s, h, b, Route::Chat)))
        .route("/v1/completions", post(|s, h, b| handle(s, h, b, Route::Completions)))
        .route("/generate", post(|s, h, b| handle(s, h, b, Route::Generate)))
        .route("/v1/embeddings", post(|s, h, b| handle(s, h, b, Route::Embeddings)))
        .route("/v1/rerank", post(|s, h, b| handle(s, h, b, Route::Rerank)))
        .route("/rerank", post(|s, h, b| handle(s, h, b, Route::Rerank)))
        .route("/v1/classify", post(|s, h, b| handle(s, h, b, Route::Classify)))
        .route("/v1/messages", post(|s, h, b| handle(s, h, b, Route::Messages)))
        .route("/v1/messages/count_tokens", post(|s, h, b| handle(s, h, b, Route::CountTokens)))
        .route("/v1/models", get(served::models))
        .route("/v1/tokenize", post(served::tokenize))
        .route("/v1/detokenize", post(served::detokenize))
        .route("/v1/route/feedback", post(served::route_feedback))
        .route("/get_model_info", get(served::first_worker))
        .route("/get_server_info", get(served::first_worker))
        .route_layer(axum::middleware::from_fn_with_state((gw.clone(), Plane::Data), require_key));
    let router = probes().merge(data);
    let router = if gw.config.admin_listener { router } else { router.merge(control_plane(gw.clone())) };
    finish(router, gw)
}

/// The control plane's own listener (`--admin-port`): its routes and the probes.
pub(crate) fn admin_router(gw: Arc<Gateway>) -> axum::Router {
    finish(probes().merge(control_plane(gw.clone())), gw)
}

/// The dedicated probe listener's routes (`--health-check-port`): the probes alone, open.
pub(crate) fn probes_router(gw: Arc<Gateway>) -> axum::Router {
    finish(probes(), gw)
}

/// The Prometheus listener's one route (`--prometheus-port`): `/metrics`, open.
pub(crate) fn metrics_router(gw: Arc<Gateway>) -> axum::Router {
    let metrics = gw.control.get().map(|c| c.metrics.clone()).unwrap_or_default();
    finish(metrics, gw)
}

/// Liveness and readiness: open to all (orchestrators call them without keys).
fn probes() -> axum::Router<Arc<Gateway>> {
    axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/liveness", get(|| async { "ok" }))
        .route("/readiness", get(served::readiness))
}

/// The control plane's routes (fleet changes, topology, explains, metrics), a
/// control-plane key each; none until the control plane is handed over.
fn control_plane(gw: Arc<Gateway>) -> axum::Router<Arc<Gateway>> {
    match gw.control.get() {
        Some(c) => {
            c.routes.clone().route_layer(axum::middleware::from_fn_with_state((gw, Plane::Control), require_key))
        }
        None => axum::Router::new(),
    }
}

fn finish(router: axum::Router<Arc<Gateway>>, gw: Arc<Gateway>) -> axum::Router {
    router
        .fallback(|uri: axum::http::Uri| async move { GatewayError::NotFound(uri.path().to_string()) })
        .method_not_allowed_fallback(|method: axum::http::Method, uri: axum::http::Uri| async move {
            GatewayError::MethodNotAllowed(format!("{method} {}", uri.path()))
        })
        .layer(axum::middleware::from_fn_with_state(gw.clone(), refuse_oversized))
        .layer(axum::middleware::from_fn_with_state(gw.clone(), crate::pipeline::context::layer))
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(gw)
}

/// Lets a request through when it carries a key of `plane` (see [`crate::pipeline::auth::Keys::check`]).
async fn require_key(
    State((gw, plane)): State<(Arc<Gateway>, Plane)>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    // Anthropic's clients send their key as `x-api-key`: it is the request's `Authorization`
    // from here on (two credentials are refused, as on the fast path, whose guard already did).
    if let Some(key) = req.headers_mut().remove(h1_codec::API_KEY_HEADER) {
        let bearer = h1_codec::credential(h1_codec::API_KEY_HEADER, key.as_bytes()).unwrap_or_default();
        match HeaderValue::from_bytes(&bearer) {
            Ok(v) if !req.headers().contains_key(header::AUTHORIZATION) => {
                req.headers_mut().insert(header::AUTHORIZATION, v);
            }
            _ => {
                let route = Route::from_path(req.uri().path());
                return GatewayError::BadRequest(h1_codec::TWO_CREDENTIALS.into()).response_for(route);
            }
        }
    }
    let keys = match plane {
        Plane::Control => &gw.control_keys,
        Plane::Data => &gw.client_keys,
    };
    let checked = match (keys.check_headers(plane, req.headers()), plane) {
        // Who, for the audit log: no allocation for the common case, a key.
        (Ok(()), _) => Ok(std::borrow::Cow::Borrowed("key")),
        (Err(e), Plane::Control) => control_token(&gw, req.headers(), e).await,
        (Err(e), Plane::Data) => Err(e),
    };
    let audit =
        (gw.config.audit && plane == Plane::Control).then(|| (req.method().clone(), req.uri().path().to_string()));
    match checked {
        Ok(principal) => {
            let resp = next.run(req).await;
            if let Some((method, path)) = audit {
                tracing::info!(target: "audit", %method, path, principal = &*principal, status = resp.status().as_u16(), "control plane");
            }
            resp
        }
        Err(e) => {
            if let Some((method, path)) = &audit {
                tracing::info!(target: "audit", %method, path, status = e.status().as_u16(), refused = %e, "control plane");
            }
            let route = Route::from_path(req.uri().path());
            if let Some(route) = route {
                let id = req.headers().get(crate::pipeline::context::REQUEST_ID_HEADER).and_then(|v| v.to_str().ok());
                count_error(&gw, route, &e, id);
            }
            e.response_for(route)
        }
    }
}

/// A control-plane request the keys refused (`refused`): an identity provider's token opens it
/// when its role maps to admin (the holder's subject, for the audit log).
async fn control_token(
    gw: &Gateway,
    headers: &axum::http::HeaderMap,
    refused: GatewayError,
) -> Result<std::borrow::Cow<'static, str>, GatewayError> {
    let Some(jwt) = &gw.jwt else { return Err(refused) };
    let token = headers.get(header::AUTHORIZATION).and_then(|v| crate::pipeline::auth::bearer_token(v.as_bytes()));
    let Some(token) = token.and_then(|t| std::str::from_utf8(t).ok()).filter(|t| t.matches('.').count() == 2) else {
        return Err(refused);
    };
    match jwt.verify(token).await {
        Ok((sub, crate::jwt::Role::Admin)) => Ok(format!("jwt:{}", sub.unwrap_or_default()).into()),
        Ok((_, crate::jwt::Role::User)) => Err(GatewayError::Forbidden(
            "the token's role is user: the control plane needs a role --jwt-role-mapping maps to admin".into(),
        )),
        Err(e) => Err(GatewayError::Unauthorized(e.to_string())),
    }
}

/// A declared length over the limit is refused before the body is polled, so
/// a client waiting on `Expect: 100-continue` is never invited to send it.
async fn refuse_oversized(
    State(gw): State<Arc<Gateway>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > gw.config.max_body_bytes as u64) {
        let route = Route::from_path(req.uri().path());
        let mut r = GatewayError::TooLarge(gw.config.max_body_bytes).response_for(route);
        r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        return r;
    }
    next.run(req).await
}
