//! The axum front end of the proxied routes (what the HTTP/1.1 fast path
//! does not take: chunked bodies, HTTP/1.0, TLS): admit, read the body,
//! [`crate::pipeline::run`], relay what it came to.

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use router_types::DpRank;
use tracing::Instrument;

use crate::h1::answer;
use crate::h1::upstream;
use crate::pipeline::Outcome;
use crate::pipeline::account::{InFlight, count_error, request_span};
use crate::pipeline::admission::Admission;
use crate::pipeline::body::read_body;
use crate::pipeline::request::{Meta, Mode, ROUTE_DEBUG_HEADER, ROUTE_MODE_HEADER, Request, Route, Seen};
use crate::pools::HeaderEdits;
use crate::relay::{Ending, UpstreamBody, stream_back};
use crate::send::upstream_headers;
use crate::{Gateway, GatewayError};
use fleet::Worker;

pub(crate) async fn handle(State(gw): State<Arc<Gateway>>, headers: HeaderMap, body: Body, route: Route) -> Response {
    let span = request_span(&gw, route);
    // Set by the context layer on every request.
    let id = headers
        .get(crate::pipeline::context::REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    span.record("request_id", id.as_str());
    async move {
        match serve(gw.clone(), headers, body, route, &id).await {
            Ok(r) => r,
            Err(e) => {
                count_error(&gw, route, &e, Some(&id));
                e.response_for(Some(route))
            }
        }
    }
    .instrument(span)
    .await
}

/// The axum front end: read the body, forward with the router's own HTTP/1.1 client (the fast
/// path's), relay the answer.
async fn serve(
    gw: Arc<Gateway>,
    mut headers: HeaderMap,
    body: Body,
    route: Route,
    id: &str,
) -> Result<Response, GatewayError> {
    let start = Instant::now();
    // A plugin mode (`x-route-mode`), checked before anything is admitted or read.
    let mode = match headers.get(ROUTE_MODE_HEADER) {
        Some(v) => Some(Mode::asked(
            &gw.control_keys,
            v.as_bytes(),
            headers.get(ROUTE_DEBUG_HEADER).map(HeaderValue::as_bytes),
        )?),
        None => None,
    };
    // Admitted before the body is read: a chunked body of unknown size is charged the largest one.
    // One routing config for the whole request, whatever a reload does meanwhile.
    let routing = gw.routing();
    let who = crate::pipeline::admission::Who::from_headers(&gw, &headers);
    let admission =
        Admission::admit_waiting_for(&gw, crate::pipeline::admission::declared_charge(&gw, &headers), who).await?;
    let bytes = read_body(&gw, body).await?;
    if mode == Some(Mode::Preview) {
        return preview(&gw, route, &headers, bytes).await;
    }
    // Who asks and whether it wants the explain, read before the client's credentials give way
    // to the workers' (and hop-by-hop headers go).
    let (authorization, route_debug) =
        (headers.get(header::AUTHORIZATION).cloned(), headers.get(ROUTE_DEBUG_HEADER).cloned());
    upstream_headers(&gw, &mut headers);
    let headers = Arc::new(headers);
    let (authorization, route_debug) = (authorization.as_ref(), route_debug.as_ref());
    let seen = Seen {
        authorization: authorization.map(HeaderValue::as_bytes),
        route_debug: route_debug.map(HeaderValue::as_bytes),
        cache_trace: headers
            .get(h1_codec::CACHE_TRACE_HEADER)
            .is_some_and(|v| crate::pipeline::cache_trace::asks(v.as_bytes())),
    };
    let key = |name: &str| h1_codec::usable_key(headers.get(name).map(HeaderValue::as_bytes));
    let keys = (key(h1_codec::ROUTING_KEY_HEADER), key(h1_codec::SESSION_HEADER));
    let lines = || headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes()));
    let mut meta = Meta::new(&gw, id.to_string(), routing.as_deref(), seen, keys, lines);
    if mode == Some(Mode::Probe) {
        (meta.probe, meta.cache_bypass) = (true, true);
    }
    // Sent with the fast path's own client: it reads a worker's early answer (a 413 before the
    // whole body was written), which hyper's drops.
    let extra = answer::extra(&gw, &headers);
    let send = |worker: Arc<Worker>, body: Bytes, rank: Option<DpRank>, edits: Option<Arc<HeaderEdits>>| {
        let extra = extra.edited(edits.as_deref());
        async move { upstream::send(worker, route, body, rank, extra).await.map(answer::into_response) }
    };
    let request = Request { route, routing, admission, body: bytes, start, meta };
    let outcome = crate::pipeline::run(&gw, request, &send, &extra).await?;
    let (mut answer, verdict) = match outcome {
        Outcome::Cached(hit, verdict) => (hit.into_response(), verdict),
        Outcome::Sent(guard, worker, resp, verdict) => (relay(&gw, guard, worker, resp), verdict),
        Outcome::Made(answer) => (answer, None),
    };
    if let Some(verdict) = verdict {
        answer.headers_mut().insert(crate::pools::cascade::CASCADE_HEADER, verdict);
    }
    if let Some(mode) = mode {
        answer.headers_mut().insert(ROUTE_MODE_HEADER, HeaderValue::from_static(mode.as_str()));
    }
    Ok(answer)
}

/// `x-route-mode: preview`: what `POST /v1/route/preview` says of this request, no model called.
async fn preview(gw: &Arc<Gateway>, route: Route, headers: &HeaderMap, bytes: Bytes) -> Result<Response, GatewayError> {
    if !route.has_prompt() {
        return Err(GatewayError::BadRequest(format!(
            "x-route-mode: preview explains chat, completions, generate and messages requests, not {}",
            route.path()
        )));
    }
    let out = crate::explain::preview_of(gw, route, headers, bytes).await?;
    let mut answer = axum::Json(out).into_response();
    answer.headers_mut().insert(ROUTE_MODE_HEADER, HeaderValue::from_static(Mode::Preview.as_str()));
    Ok(answer)
}

/// A worker's answer relayed to the client, with the route headers.
fn relay(gw: &Gateway, mut guard: InFlight, worker: Arc<Worker>, resp: axum::http::Response<UpstreamBody>) -> Response {
    let route_headers = guard.route_headers.take();
    let mut answer = stream_back(guard, worker, resp, &gw.config.limits, Ending::default());
    if let Some(extra) = route_headers {
        answer.headers_mut().extend(extra.0.into_iter().map(|(n, v)| (HeaderName::from_static(n), v)));
    }
    answer
}
