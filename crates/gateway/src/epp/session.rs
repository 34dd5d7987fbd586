//! One `ext_proc` stream, one request: its headers (and body, in the
//! buffered or full-duplex modes) become the pipeline's request; the
//! dispatch phase's send names the chosen worker to the gateway and waits for
//! the answer's head the gateway reports back; the answer's body, when the
//! gateway sends it, passes the same answer filters as a relayed answer.
//! Every wait on the gateway has a deadline.

use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
use ext_proc::proto::{HeaderMap, HeadersResponse, HttpHeaders, Phase, Reply, body_mode};
use ext_proc::{Messages, Replies, Status};
use h1_codec::Route;
use tracing::{debug, warn};

use super::reply::{self, Edits};
use super::{Body, EppConfig, FAIRNESS_HEADER, Stream, TEST_PICK_HEADER, common, next, said};
use crate::pipeline::admission::{Admission, Who};
use crate::pipeline::request::{Meta, Mode, Seen};
use crate::{Gateway, GatewayError};

/// The client's credential as the router reads it: `Authorization`, else Anthropic's
/// `x-api-key` as `Bearer KEY`.
fn client_credential(headers: &HeaderMap) -> Option<Vec<u8>> {
    let key = || h1_codec::credential(h1_codec::API_KEY_HEADER, headers.get(h1_codec::API_KEY_HEADER)?);
    headers.get("authorization").map(<[u8]>::to_vec).or_else(key)
}

/// Serves one stream; the status it ends with.
pub(super) async fn serve(gw: &Arc<Gateway>, config: &EppConfig, mut calls: Messages, replies: Replies) -> Status {
    let limits = gw.config.limits;
    let first = match next(&mut calls, limits.header_read_timeout).await {
        Ok(Some(first)) => first,
        Ok(None) => return Status::ok(),
        Err(status) => return status,
    };
    if first.observability_mode {
        return Status::new(Status::INVALID_ARGUMENT, "an endpoint picker cannot run in observability mode");
    }
    let Some(Phase::RequestHeaders(headers)) = first.request else {
        return Status::new(Status::INVALID_ARGUMENT, "a stream starts with the request's headers");
    };
    let start = Instant::now();
    let request_mode = first.protocol_config.map_or(body_mode::BUFFERED, |p| p.request_body_mode);
    let response_mode = first.protocol_config.map_or(body_mode::NONE, |p| p.response_body_mode);
    let mut subset = match reply::subset(first.metadata_context.as_ref()) {
        Ok(subset) => subset,
        Err(why) => return Status::new(Status::INVALID_ARGUMENT, why),
    };
    let HttpHeaders { headers, end_of_stream } = headers;
    let headers = headers.unwrap_or_default();
    if config.test_pick_header
        && let Some(named) = headers.get(TEST_PICK_HEADER)
    {
        subset = Some(reply::named(named));
    }
    let path = headers.get(":path").map(String::from_utf8_lossy).unwrap_or_default();
    let path = path.split('?').next().unwrap_or_default().to_owned();
    let post = headers.get(":method") == Some(b"POST");
    let route = Route::from_path(&path).filter(|_| post && !end_of_stream);
    let names = &gw.config.request_id_headers;
    let id = crate::pipeline::context::request_id(names, |n| headers.get(n), &path);
    let mut s = Stream { gw, calls, replies, request_mode, response_mode, id, start };
    // The data plane's keys guard every route the gateway sends on to a worker.
    let credential = client_credential(&headers);
    if let Err(e) = crate::pipeline::auth::check_client(gw, credential.as_deref()) {
        return s.refuse(&e, route).await;
    }
    let Some(route) = route else {
        // Not a request the router plans (a GET, a route it does not proxy): the least loaded worker.
        return s.headers_only(credential.as_deref(), subset).await;
    };
    if !matches!(request_mode, body_mode::BUFFERED | body_mode::FULL_DUPLEX_STREAMED) {
        warn!(mode = request_mode, "endpoint picker: the request body mode must be BUFFERED or FULL_DUPLEX_STREAMED");
        return Status::new(Status::INVALID_ARGUMENT, "set request_body_mode to BUFFERED or FULL_DUPLEX_STREAMED");
    }
    let class = super::objective_class(config, headers.get(super::OBJECTIVE_HEADER));
    s.planned(route, &headers, (credential.as_deref(), subset), class).await
}

impl Stream<'_> {
    /// A request with no body to plan by: the least loaded worker the gateway allows.
    async fn headers_only(&mut self, authorization: Option<&[u8]>, subset: Option<planner::Subset>) -> Status {
        let pool = self.gw.default_pool();
        let workers = self.gw.fleet.snapshot();
        let planner = planner::Planner { only: subset.as_ref(), ..self.gw.planner(&workers) };
        let chosen = planner
            .routable(|w| pool.serves(w))
            .ok()
            .and_then(|ws| ws.into_iter().min_by_key(|w| (w.load().in_flight, w.load().uncached_tokens)));
        let Some(worker) = chosen else { return self.refuse(&GatewayError::NoWorker, None).await };
        let endpoint = planner::authority(worker.url.as_str()).to_owned();
        let edits = Edits::new(self.gw, authorization, &self.id);
        let mut said = said(Reply::RequestHeaders(HeadersResponse {
            response: common(Some(reply::pick(&endpoint, edits)), None),
        }));
        let fallback = super::dispatch::fallback(self.gw, &worker, subset.as_ref());
        said.dynamic_metadata = Some(reply::lb_metadata(&endpoint, fallback.as_deref()));
        // The load it adds, held until its answer ends.
        let _load = worker.charge_on(None, None);
        if let Err(status) = self.send(&said).await {
            return status;
        }
        self.counted("picked");
        // A body the full-duplex mode still sends is echoed as it comes.
        self.answer_phase(super::dispatch::NO_DISPATCH).await
    }

    /// A request the pipeline plans: read its body, admit it, select and plan, name the
    /// worker, then follow its answer.
    async fn planned(
        &mut self,
        route: Route,
        headers: &HeaderMap,
        (authorization, subset): (Option<&[u8]>, Option<planner::Subset>),
        class: Option<crate::pipeline::scheduler::Class>,
    ) -> Status {
        let gw = self.gw;
        // A plugin mode (`x-route-mode`), checked before anything is admitted or read.
        let mode = match headers.get(h1_codec::ROUTE_MODE_HEADER) {
            None => None,
            Some(v) => match Mode::asked(&gw.control_keys, v, headers.get(h1_codec::ROUTE_DEBUG_HEADER)) {
                Ok(mode) => Some(mode),
                Err(e) => return self.refuse(&e, Some(route)).await,
            },
        };
        let declared = headers.get("content-length").and_then(|v| std::str::from_utf8(v).ok()?.parse::<usize>().ok());
        if declared.is_some_and(|n| n > gw.config.max_body_bytes) {
            return self.refuse(&GatewayError::TooLarge(gw.config.max_body_bytes), Some(route)).await;
        }
        // A trusted tenant header (--trust-tenant-header) names the tenant, else GIE's fairness id.
        let trusted = gw.config.tenants.trusted_header.as_deref();
        let tenant_header = trusted.and_then(|n| headers.get(n).or_else(|| headers.get(FAIRNESS_HEADER)));
        // The request's InferenceObjective names its class, else its `x-smg-priority`.
        let priority = class.map(|c| c.as_str().as_bytes()).or_else(|| headers.get(h1_codec::PRIORITY_HEADER));
        let who = Who { priority, tenant_header, authorization };
        // Admitted before its body is read: a slot, and memory for what it declared (more as it comes).
        let mut admission = match Admission::admit_waiting_for(gw, declared.unwrap_or(0), who).await {
            Ok(a) => a,
            Err(e) => return self.refuse(&e, Some(route)).await,
        };
        if self.request_mode != body_mode::FULL_DUPLEX_STREAMED {
            // Buffered: the body comes whole once the headers are answered.
            let go_on = said(Reply::RequestHeaders(HeadersResponse { response: None }));
            if let Err(status) = self.send(&go_on).await {
                return status;
            }
        }
        let body = match self.body(route, &mut admission, declared.unwrap_or(0)).await {
            Ok(Ok(body)) => body,
            Ok(Err(e)) => return self.refuse(&e, Some(route)).await,
            Err(status) => return status,
        };
        if mode == Some(Mode::Preview) {
            return self.preview(route, headers, body.bytes).await;
        }
        let routing = gw.routing();
        let key = |name: &str| h1_codec::usable_key(headers.get(name));
        let cache_trace = headers.get(h1_codec::CACHE_TRACE_HEADER).is_some_and(crate::pipeline::cache_trace::asks);
        let seen = Seen { authorization, route_debug: headers.get(h1_codec::ROUTE_DEBUG_HEADER), cache_trace };
        let lines = || headers.headers.iter().filter(|h| !h.key.starts_with(':')).map(|h| (h.key.as_str(), h.bytes()));
        let keys = (key(h1_codec::ROUTING_KEY_HEADER), key(h1_codec::SESSION_HEADER));
        let mut meta = Meta::new(gw, self.id.clone(), routing.as_deref(), seen, keys, lines);
        (meta.subset, meta.one_attempt) = (subset.map(Arc::new), true);
        if mode == Some(Mode::Probe) {
            (meta.probe, meta.cache_bypass) = (true, true);
        }
        self.dispatch(route, (routing, admission, meta), body, authorization).await
    }

    /// `x-route-mode: preview`: what `POST /v1/route/preview` says of the request, answered
    /// by the picker itself; no worker is named.
    async fn preview(&mut self, route: Route, headers: &HeaderMap, bytes: bytes::Bytes) -> Status {
        if !route.has_prompt() {
            let e = GatewayError::BadRequest(format!(
                "x-route-mode: preview explains chat, completions, generate and messages requests, not {}",
                route.path()
            ));
            return self.refuse(&e, Some(route)).await;
        }
        let mut map = axum::http::HeaderMap::new();
        for h in headers.headers.iter().filter(|h| !h.key.starts_with(':')) {
            if let (Ok(n), Ok(v)) =
                (axum::http::HeaderName::from_bytes(h.key.as_bytes()), axum::http::HeaderValue::from_bytes(h.bytes()))
            {
                map.append(n, v);
            }
        }
        match crate::explain::preview_of(self.gw, route, &map, bytes).await {
            Ok(out) => {
                self.counted("answered");
                let headers: [(&str, &[u8]); 2] =
                    [("content-type", b"application/json"), (h1_codec::ROUTE_MODE_HEADER, b"preview")];
                let body = bytes::Bytes::from(out.to_string());
                let _ = self.send(&reply::immediate(200, &headers, (body, &self.id), "route_preview")).await;
                Status::ok()
            }
            Err(e) => self.refuse(&e, Some(route)).await,
        }
    }

    /// The request's body: whole (buffered) or gathered from its chunks (full duplex), within
    /// the body limit and deadline, its memory reserved beyond the `reserved` bytes admitted.
    async fn body(
        &mut self,
        route: Route,
        admission: &mut Admission,
        mut reserved: usize,
    ) -> Result<Result<Body, GatewayError>, Status> {
        let limit = self.gw.config.max_body_bytes;
        let deadline = tokio::time::Instant::now() + self.gw.config.limits.body_read_timeout;
        let stall = self.gw.config.limits.body_stall_timeout;
        let mut body = BytesMut::new();
        loop {
            // The whole body's deadline, and the next chunk's (`--stream-body-stall-timeout-secs`).
            let wait = deadline.saturating_duration_since(tokio::time::Instant::now());
            let wait = if stall.is_zero() { wait } else { wait.min(stall) };
            let Some(m) = next(&mut self.calls, wait).await? else {
                return Err(Status::new(Status::CANCELLED, "the gateway ended the stream inside the request"));
            };
            match m.request {
                Some(Phase::RequestBody(chunk)) => {
                    let len = body.len() + chunk.body.len();
                    if len > limit {
                        return Ok(Err(GatewayError::TooLarge(limit)));
                    }
                    if len > reserved {
                        if let Err(e) = admission.grow(len - reserved) {
                            return Ok(Err(e));
                        }
                        reserved = len;
                    }
                    body.extend_from_slice(&chunk.body);
                    if chunk.end_of_stream {
                        return Ok(Ok(Body { bytes: body.freeze(), trailers: false }));
                    }
                }
                // Trailers end a body too (answered once the request is planned).
                Some(Phase::RequestTrailers(_)) => return Ok(Ok(Body { bytes: body.freeze(), trailers: true })),
                _ => {
                    debug!(route = route.label(), "endpoint picker: out of order message in the request");
                    return Err(Status::new(Status::INVALID_ARGUMENT, "expected the request's body"));
                }
            }
        }
    }
}
