//! The `response_guard` answer filter: a decision's guard reads every 2xx
//! answer its requests get (a worker's, a disaggregated pair's, a gRPC
//! worker's, a cascade's kept one) before the client does. A whole answer is
//! read whole (within `max_answer_bytes` and the request timeout) and passed,
//! redacted, annotated or replaced by an error; an event stream is rewritten
//! event by event (`sse`), its text held back a bounded look-behind. The
//! findings go in `x-route-response-guard` (a stream's in its last comment)
//! and are counted; a response cache keeps the guarded answer, never the raw one.

mod sse;

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use fleet::Worker;
use http_body_util::BodyExt;
use model_select::{GuardAction, Redactions, StreamGuard};
use serde_json::{Value, json};

use crate::cache::Recorder;
use crate::pipeline::account::InFlight;
use crate::pipeline::request::{Route, RouteHeaders};
use crate::pools::response_guard::Armed;
use crate::relay::{Ending, UpstreamBody, stream_back};
use crate::{Gateway, GatewayError};

/// The header that tells what the guard found in a whole answer (`clean`, or `email=2,jailbreak:attack`).
pub(crate) const GUARD_HEADER: &str = "x-route-response-guard";

/// The error type of a blocked answer.
const BLOCKED: &str = "response_blocked";

/// What the guard made of one answer.
#[derive(Debug, Default)]
struct Findings {
    pii: Redactions,
    /// The jailbreak rule the text matched.
    jailbreak: Option<String>,
    /// A jailbreak rule could not judge it (no model, the pool full or slow): blocked.
    failed: bool,
}

/// A worker's answer to a request whose decision guards its answers: relayed as any answer is
/// (its accounting, end-to-end headers, idle deadline and mid-answer failure the relay's), then
/// read by the guard before the client gets it; a response cache keeps what the guard lets out.
pub(crate) fn sent(
    gw: &Arc<Gateway>,
    mut guard: InFlight,
    worker: Arc<Worker>,
    resp: axum::http::Response<UpstreamBody>,
    armed: Armed,
) -> impl std::future::Future<Output = Response> + Send + 'static {
    let route = guard.route();
    let route_headers = guard.route_headers.take();
    let recorder = guard
        .cache
        .take()
        .and_then(|t| Recorder::new(t, resp.status().as_u16(), resp.headers().get(header::CONTENT_TYPE).cloned()));
    let relayed = stream_back(guard, worker, resp, &gw.config.limits, Ending::default());
    let gw = gw.clone();
    async move {
        let mut answer = made(&gw, relayed, armed, route, recorder).await;
        if let Some(RouteHeaders(extra)) = route_headers {
            answer.headers_mut().extend(extra.into_iter().map(|(n, v)| (axum::http::HeaderName::from_static(n), v)));
        }
        answer
    }
}

/// An answer read by the guard: a relayed worker's, or one the router made (a disaggregated
/// pair's, a gRPC worker's, a cascade's kept one). `recorder` keeps what goes out.
pub(crate) async fn made(
    gw: &Arc<Gateway>,
    answer: Response,
    armed: Armed,
    route: Route,
    recorder: Option<Recorder>,
) -> Response {
    if !answer.status().is_success() {
        return answer;
    }
    let (parts, body) = answer.into_parts();
    if is_stream(&parts.headers) {
        return Response::from_parts(parts, sse::screen(gw.clone(), armed, route, body, recorder));
    }
    let body = body.map_err(boxed).boxed_unsync();
    match read(gw, &armed, body, parts.headers.get(header::CONTENT_LENGTH)).await {
        Ok(raw) => {
            let (answer, kept) = whole(gw, &armed, route, parts.status, parts.headers, raw).await;
            if let (Some(mut r), Some(body)) = (recorder, kept)
                && r.push(&body)
            {
                r.ended();
            }
            answer
        }
        Err(e) => e.response_for(Some(route)),
    }
}

fn boxed(e: axum::Error) -> crate::relay::BoxError {
    Box::new(e)
}

fn is_stream(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).is_some_and(|c| c.as_bytes().starts_with(b"text/event-stream"))
}

/// A whole answer's body, within the guard's bound and the request timeout.
async fn read(
    gw: &Gateway,
    armed: &Armed,
    body: UpstreamBody,
    declared: Option<&HeaderValue>,
) -> Result<Bytes, GatewayError> {
    let max = armed.spec.max_answer_bytes;
    let too_large = || {
        count(armed, "too_large", &Findings::default());
        GatewayError::Upstream {
            worker: "response_guard".into(),
            message: format!("the answer is larger than the response guard reads ({max} bytes)"),
            retryable: false,
        }
    };
    if declared.and_then(|v| v.to_str().ok()?.parse::<u64>().ok()).is_some_and(|n| n > max as u64) {
        return Err(too_large());
    }
    let deadline = tokio::time::Instant::now() + gw.config.request_timeout;
    let mut body = body;
    let mut out = bytes::BytesMut::new();
    loop {
        let failed = |message: String| {
            count(armed, "failed", &Findings::default());
            GatewayError::Upstream { worker: "response_guard".into(), message, retryable: false }
        };
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(None) => return Ok(out.freeze()),
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    if out.len() + data.len() > max {
                        return Err(too_large());
                    }
                    out.extend_from_slice(&data);
                }
            }
            Ok(Some(Err(e))) => return Err(failed(format!("the answer broke off: {e}"))),
            Err(_) => {
                count(armed, "failed", &Findings::default());
                return Err(GatewayError::Timeout("the answer the response guard reads".into()));
            }
        }
    }
}

/// A whole answer read: the client's answer, and what a response cache may keep of it (none
/// when blocked).
async fn whole(
    gw: &Gateway,
    armed: &Armed,
    route: Route,
    status: StatusCode,
    mut headers: HeaderMap,
    raw: Bytes,
) -> (Response, Option<Bytes>) {
    let spec = &armed.spec;
    let mut found = Findings::default();
    let (text, body) = match serde_json::from_slice::<Value>(&raw) {
        Ok(v) => {
            let mut redacted = v.clone();
            found.pii = model_select::redact_answer(&mut redacted, armed.detector(), spec.types());
            let body = (spec.action == GuardAction::Redact && found.pii.total() > 0).then(|| {
                strip_logprobs(&mut redacted);
                Bytes::from(serde_json::to_vec(&redacted).unwrap_or_default())
            });
            (model_select::answer_text(&v), body.unwrap_or_else(|| raw.clone()))
        }
        // Not JSON: the body is the text.
        Err(_) => {
            let text = String::from_utf8_lossy(&raw).into_owned();
            let mut g = StreamGuard::new(spec.types().to_vec(), text.len().max(1), spec.action == GuardAction::Redact);
            let mut lane = model_select::Lane::default();
            let mut out = g.push(armed.detector(), &mut lane, &text);
            out.push_str(&g.finish(armed.detector(), &mut lane));
            found.pii = g.found();
            (text, Bytes::from(out))
        }
    };
    match armed.jailbreak(gw, &text).await {
        Ok(rule) => found.jailbreak = rule,
        Err(e) => {
            tracing::warn!(decision = %spec.decision, error = %e, "response guard: the answer could not be judged");
            found.failed = true;
        }
    }
    let outcome = outcome(armed, &found);
    count(armed, outcome, &found);
    let summary = HeaderValue::from_str(&summary(&found)).unwrap_or(HeaderValue::from_static("found"));
    if outcome == "blocked" || outcome == "failed" {
        let mut answer = blocked(armed, route);
        answer.headers_mut().insert(GUARD_HEADER, summary);
        return (answer, None);
    }
    headers.remove(header::CONTENT_LENGTH);
    headers.remove(header::TRANSFER_ENCODING);
    headers.insert(GUARD_HEADER, summary);
    let mut answer = Response::new(Body::from(body.clone()));
    *answer.status_mut() = status;
    *answer.headers_mut() = headers;
    (answer, Some(body))
}

/// The outcome's label in `router_response_guard_total`: a jailbreak finding blocks unless the
/// guard only annotates; PII blocks under `block`, is redacted under `redact`.
fn outcome(armed: &Armed, found: &Findings) -> &'static str {
    let action = armed.spec.action;
    let any = found.pii.total() > 0 || found.jailbreak.is_some();
    match action {
        _ if found.failed => "failed",
        GuardAction::Annotate if any => "annotated",
        _ if found.jailbreak.is_some() => "blocked",
        GuardAction::Block if any => "blocked",
        GuardAction::Redact if any => "redacted",
        _ => "clean",
    }
}

/// Counts one answer and what was found in it.
fn count(armed: &Armed, outcome: &str, found: &Findings) {
    let m = &armed.routing.metrics;
    let decision = crate::metrics::escape(&armed.spec.decision);
    m.guarded.inc(format_args!("decision=\"{decision}\",outcome=\"{outcome}\""));
    for (kind, n) in &found.pii.counts {
        m.guard_findings.add(format_args!("decision=\"{decision}\",finding=\"{}\"", kind.as_str()), *n as u64);
    }
    if let Some(rule) = &found.jailbreak {
        let rule = crate::metrics::escape(rule);
        m.guard_findings.inc(format_args!("decision=\"{decision}\",finding=\"jailbreak:{rule}\""));
    }
}

/// `clean`, or the findings: `email=2,phone=1,jailbreak:attack` (`unjudged` when a rule could not judge).
fn summary(found: &Findings) -> String {
    let mut parts: Vec<String> = found.pii.counts.iter().map(|(k, n)| format!("{}={n}", k.as_str())).collect();
    parts.extend(found.jailbreak.iter().map(|r| format!("jailbreak:{r}")));
    if found.failed {
        parts.push("unjudged".into());
    }
    if parts.is_empty() { "clean".into() } else { parts.join(",") }
}

/// The error a blocked whole answer becomes, in the route's shape.
fn blocked(armed: &Armed, route: Route) -> Response {
    let (status, message) = (armed.spec.status, armed.spec.message.as_str());
    let body = if route.anthropic() {
        crate::error::anthropic_error(status, message)
    } else {
        json!({"error": {"message": message, "type": BLOCKED, "code": status}})
    };
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::FORBIDDEN);
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// `/generate`'s per-token logprobs taken out of its `meta_info`.
fn strip_meta_logprobs(meta: &mut serde_json::Map<String, Value>) {
    meta.retain(|k, _| !k.starts_with("output_token_logprobs") && !k.starts_with("output_top_logprobs"));
}

/// Logprobs name every token, redacted or not: a changed answer goes without them.
fn strip_logprobs(v: &mut Value) {
    let items = match v {
        Value::Array(items) => items.iter_mut().collect::<Vec<_>>(),
        item => vec![item],
    };
    for item in items {
        if let Some(Value::Array(choices)) = item.get_mut("choices") {
            for c in choices.iter_mut().filter_map(Value::as_object_mut) {
                c.remove("logprobs");
            }
        }
        if let Some(meta) = item.get_mut("meta_info").and_then(Value::as_object_mut) {
            strip_meta_logprobs(meta);
        }
    }
}
