//! The read-body phase: a request body read within its bound (413 past it),
//! and parsed as far as the router needs it (JSON, or only its shape checked).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use serde_json::Value;

use crate::error::describe;
use crate::pipeline::request::Route;
use crate::pipeline::shape::Required;
use crate::{Gateway, GatewayError};

/// Reads a request body of at most `max_body_bytes`: over it is 413; a body
/// that is not valid HTTP framing (a bad chunk size, a bare LF) is the
/// client's malformed request (400), not a large one.
pub async fn read_body(gw: &Gateway, body: Body) -> Result<Bytes, GatewayError> {
    read_body_within(body, gw.config.max_body_bytes).await
}

/// [`read_body`] with its own bound (413 past `limit`).
pub(crate) async fn read_body_within(body: Body, limit: usize) -> Result<Bytes, GatewayError> {
    use http_body_util::BodyExt;
    let limited = http_body_util::Limited::new(body, limit);
    match limited.collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) => {
            let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&*e);
            while let Some(c) = cause {
                if c.is::<http_body_util::LengthLimitError>() {
                    return Err(GatewayError::TooLarge(limit));
                }
                cause = c.source();
            }
            Err(GatewayError::BadRequest(format!("the request body could not be read: {}", describe(&*e))))
        }
    }
}

pub(crate) fn parse_json(bytes: &[u8]) -> Result<Value, GatewayError> {
    let v: Value =
        serde_json::from_slice(bytes).map_err(|e| GatewayError::BadRequest(format!("invalid JSON body: {e}")))?;
    if !v.is_object() {
        return Err(GatewayError::BadRequest("the body must be a JSON object".into()));
    }
    Ok(v)
}

/// The body as far as the router needs it: the parsed JSON, or `None` when
/// the policy needs nothing from it and only its shape was checked (no tree built).
/// `parsed` is the body's JSON when it was parsed already (before routing).
pub(crate) fn parse_body(
    gw: &Gateway,
    route: Route,
    bytes: &[u8],
    parsed: Option<Value>,
) -> Result<Option<Value>, GatewayError> {
    let json = move || parsed.map_or_else(|| parse_json(bytes), Ok).map(Some);
    // `/generate` is parsed for --dp-aware too: its rank goes in the body.
    let dp_generate = route == Route::Generate && gw.fleet.dp_aware();
    let reads = |p: &Arc<planner::Pool>| p.policy.needs_tokens() || p.policy.needs_text();
    if route.has_prompt() && (gw.index.is_some() || gw.pools.iter().any(reads) || dp_generate) {
        return json();
    }
    let required = match route {
        Route::Chat | Route::Messages => Required::Messages,
        Route::Completions => Required::Prompt,
        Route::Generate => Required::TextOrIds,
        Route::Embeddings | Route::Rerank | Route::Classify | Route::CountTokens => Required::Object,
    };
    crate::pipeline::shape::check(bytes, required).map_err(GatewayError::BadRequest)?;
    // With a routing config every body names its model (its shape checked above: it may not be rendered).
    if gw.routing.is_some() {
        return json();
    }
    Ok(None)
}
