//! The axum front end of the proxied routes (what the HTTP/1.1 fast path
//! does not take: chunked bodies, HTTP/1.0, TLS, and every disaggregated
//! request): admit, read the body, hand PD requests to `pd`, forward the
//! others, judge a cascade's answer, relay.

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use router_types::DpRank;
use tracing::Instrument;

use crate::h1::answer;
use crate::h1::upstream;
use crate::pipeline::account::{InFlight, count_error, request_span};
use crate::pipeline::admission::Admission;
use crate::pipeline::body::read_body;
use crate::pipeline::forward::{Forwarded, forward};
use crate::pipeline::request::{Meta, ROUTE_DEBUG_HEADER, Route};
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
                e.into_response()
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
    // Admitted before the body is read: a chunked body of unknown size is charged the largest one.
    // One routing config for the whole request, whatever a reload does meanwhile.
    let routing = gw.routing();
    let admission = Admission::admit_waiting(&gw, crate::pipeline::admission::declared_charge(&gw, &headers)).await?;
    let bytes = read_body(&gw, body).await?;
    // Who asks, read before the client's credentials give way to the workers'.
    let caller = crate::pipeline::auth::caller(&gw, headers.get(header::AUTHORIZATION).map(HeaderValue::as_bytes));
    let route_debug = Meta::wants_debug(&gw.control_keys, headers.get(ROUTE_DEBUG_HEADER).map(HeaderValue::as_bytes));
    upstream_headers(&gw, &mut headers);
    let headers = Arc::new(headers);
    let meta = Meta {
        id: id.to_string(),
        routing_key: h1_codec::usable_key(headers.get(h1_codec::ROUTING_KEY_HEADER).map(HeaderValue::as_bytes)),
        route_debug,
        signal_headers: crate::pools::wanted_headers(
            routing.as_deref(),
            headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes())),
        ),
        session: h1_codec::usable_key(headers.get(h1_codec::SESSION_HEADER).map(HeaderValue::as_bytes)),
        cache_bypass: crate::pipeline::request::bypassed(
            headers.get_all(header::CACHE_CONTROL).iter().map(HeaderValue::as_bytes),
        ),
        forced: None,
        caller,
    };
    // Sent with the fast path's own client: it reads a worker's early answer (a 413 before the
    // whole body was written), which hyper's drops.
    let extra = answer::extra(&gw, &headers);
    let send = |worker: Arc<Worker>, body: Bytes, rank: Option<DpRank>, edits: Option<Arc<HeaderEdits>>| {
        let extra = extra.edited(edits.as_deref());
        async move { upstream::send(worker, route, body, rank, extra).await.map(answer::into_response) }
    };
    let (mut guard, worker, resp) = match forward(&gw, admission, (route, routing.clone()), bytes, start, &meta, &send)
        .await?
    {
        Forwarded::Sent(guard, worker, resp) => (guard, worker, resp),
        Forwarded::Cached(hit) => return Ok(hit.into_response()),
        Forwarded::Disaggregated(d) => return crate::pd::serve_routed(&gw, d, (route, headers), start, &meta).await,
    };
    let Some((plan, sent)) = guard.cascade.take().map(|b| *b).filter(|_| resp.status() == StatusCode::OK) else {
        return Ok(relay(&gw, guard, worker, resp));
    };
    // The decision's cascade judges the first pool's whole answer.
    use crate::judge::{self, Judged};
    use crate::pools::cascade;
    let verdict = match judge::whole(&gw, guard, worker, resp, &plan, route).await? {
        Judged::Answer(hit, verdict) => {
            let mut answer = hit.into_response();
            answer.headers_mut().insert(cascade::CASCADE_HEADER, verdict);
            return Ok(answer);
        }
        Judged::Pass(guard, worker, resp) => return Ok(relay(&gw, guard, worker, resp)),
        Judged::Escalate(verdict) => verdict,
    };
    let (guard, worker, resp) =
        crate::pipeline::forward::escalate(&gw, (&plan, &sent), (route, routing), start, &meta, &send).await?;
    let mut answer = relay(&gw, guard, worker, resp);
    answer.headers_mut().insert(cascade::CASCADE_HEADER, verdict.header());
    Ok(answer)
}

/// A worker's answer relayed to the client, with the route headers.
fn relay(gw: &Gateway, mut guard: InFlight, worker: Arc<Worker>, resp: axum::http::Response<UpstreamBody>) -> Response {
    let route_headers = guard.route_headers.take();
    let mut answer = stream_back(guard, worker, resp, gw.config.limits.upstream_idle_timeout, Ending::default());
    if let Some(extra) = route_headers {
        answer.headers_mut().extend(extra.0.into_iter().map(|(n, v)| (HeaderName::from_static(n), v)));
    }
    answer
}
