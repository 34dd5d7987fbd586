//! The cascade's answer filter: a first pool's 200 answer, when its length is
//! within the plan's bound, read whole (within the request timeout), judged
//! by the decision's `cascade` plugin (`pools::cascade`), and kept (as the
//! client's answer, stored in a response cache) or escalated; any other
//! answer relayed as it comes. Counted by outcome. The pipeline runs it for
//! both front ends, over whichever answer type their client gives
//! ([`Judgeable`]).

use std::sync::Arc;

use axum::http::{HeaderValue, header};
use fleet::Worker;
use serde_json::Value;

use crate::cache::{Answer, Hit};
use crate::pipeline::account::InFlight;
use crate::pipeline::request::Route;
use crate::pools::cascade::{Plan, Verdict, judge, kept_body};
use crate::{Gateway, GatewayError};

/// A worker's answer as the judge reads it, whichever front end's client got it.
pub(crate) trait Judgeable: crate::send::AnswerHead + Sized {
    /// Its declared `content-length`, if it has one.
    fn declared_len(&self) -> Option<u64>;
    /// The answer as a response whose body is read whole.
    fn into_response(self) -> axum::http::Response<crate::relay::UpstreamBody>;
}

impl Judgeable for axum::http::Response<crate::relay::UpstreamBody> {
    fn declared_len(&self) -> Option<u64> {
        self.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
    }

    fn into_response(self) -> axum::http::Response<crate::relay::UpstreamBody> {
        self
    }
}

/// What becomes of the first pool's answer (one per request, moved once: its size does not matter).
#[allow(clippy::large_enum_variant)]
pub(crate) enum First<T> {
    /// Not judged (not a 200, no length, over the bound): relayed as it comes.
    Relay(InFlight, Arc<Worker>, T),
    /// Kept: the client's answer, and the verdict's `x-route-cascade` value.
    Kept(Hit, HeaderValue),
    /// Unsure: the request goes on to the plan's `to` pool.
    Escalate(Verdict),
}

/// Judges the first pool's `answer` under `plan`.
pub(crate) async fn first<T: Judgeable>(
    gw: &Gateway,
    guard: InFlight,
    worker: Arc<Worker>,
    answer: T,
    plan: &Plan,
    route: Route,
) -> Result<First<T>, GatewayError> {
    if answer.status() != 200 || !judgeable(gw, plan, answer.declared_len()) {
        return Ok(First::Relay(guard, worker, answer));
    }
    match whole(gw, guard, worker, answer.into_response(), plan, route).await? {
        Judged::Answer(hit, verdict) => Ok(First::Kept(hit, verdict)),
        Judged::Escalate(verdict) => Ok(First::Escalate(verdict)),
    }
}

/// The first pool's whole answer, judged.
enum Judged {
    /// Kept (or without logprobs): the client's answer (built as a response-cache hit is), and
    /// the verdict's `x-route-cascade` value.
    Answer(Hit, HeaderValue),
    /// Unsure: the caller sends the request to the plan's `to` pool.
    Escalate(Verdict),
}

/// Reads the first pool's 200 answer whole (its declared length checked within the plan's
/// bound by the caller; within the request timeout) and judges it; counted by outcome.
async fn whole(
    gw: &Gateway,
    mut guard: InFlight,
    worker: Arc<Worker>,
    resp: axum::http::Response<crate::relay::UpstreamBody>,
    plan: &Plan,
    route: Route,
) -> Result<Judged, GatewayError> {
    use http_body_util::BodyExt;
    let count = |outcome: &str| {
        if let Some(r) = gw.routing() {
            r.metrics.count_cascade(&plan.decision, outcome);
        }
    };
    let content_type = resp.headers().get(header::CONTENT_TYPE).cloned();
    let read = tokio::time::timeout(gw.config.request_timeout, resp.into_body().collect()).await;
    let raw = match read {
        Ok(Ok(body)) => body.to_bytes(),
        Ok(Err(e)) => {
            count("failed");
            worker.answer_failed();
            return Err(GatewayError::Upstream {
                worker: worker.url.to_string(),
                message: format!("the answer broke off: {e}"),
                retryable: false,
            });
        }
        Err(_) => {
            count("failed");
            return Err(GatewayError::Timeout(worker.url.to_string()));
        }
    };
    let answer: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    let verdict = judge(plan, route, &answer);
    count(verdict.label());
    if let Verdict::Escalated(_) = verdict {
        // The first answer is done with: its accounting ends here, and its route id, which the
        // client never sees, takes no room among those kept for feedback.
        guard.superseded();
        if let (Some(id), Some(slot)) = (plan.route_id, gw.routing.as_ref()) {
            slot.learning().forget(id);
        }
        return Ok(Judged::Escalate(verdict));
    }
    let body = kept_body(plan, answer, raw);
    guard.status = 200;
    if let Some(ticket) = guard.cache.take() {
        ticket.store(Answer { status: 200, content_type: content_type.clone(), body: body.clone() });
    }
    // Built as a response-cache hit is: the answer, its route headers.
    let headers = guard.route_headers.take().unwrap_or_else(|| crate::pipeline::request::RouteHeaders(Vec::new()));
    Ok(Judged::Answer(Hit { answer: Arc::new(Answer { status: 200, content_type, body }), headers }, verdict.header()))
}

/// Whether an answer of `declared` length is read whole and judged (a length, within the plan's
/// bound); one that is not is counted `too_large` and relayed as it comes.
pub(crate) fn judgeable(gw: &Gateway, plan: &Plan, declared: Option<u64>) -> bool {
    let fits = declared.is_some_and(|n| n <= plan.max_bytes as u64);
    if !fits && let Some(r) = gw.routing() {
        r.metrics.count_cascade(&plan.decision, "too_large");
    }
    fits
}
