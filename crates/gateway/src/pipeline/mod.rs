//! The request pipeline: the phases every proxied request goes through, in
//! order, on both front ends (the fast path `h1`, hyper's `proxy`), each in
//! its own module. The front end parses the head and takes one routing
//! snapshot; then:
//!
//! 1. **context** (`context`, `request`): the request id, the CORS answer,
//!    what the request carries besides its body (`request::Meta`, made from
//!    its headers by `Meta::new` for both front ends), and the one value a
//!    front end hands on (`request::Request`);
//! 2. **authenticate and admit** (`auth`, `admission`): the client key, the
//!    caller's identity, a slot (or the queue), memory for the body and render;
//! 3. **read the body** (`body`, `shape`): within its limit and deadline,
//!    parsed as far as routing needs;
//! 4. **select and plan** (`forward`, with `crate::pools` and the `planner`
//!    crate): the pool, the response-cache lookup, the prompt rendered once per
//!    renderer, the worker or the prefill/decode pair;
//! 5. **dispatch** (`forward`'s one retry loop, sending with the front end's
//!    client; `crate::pd` for a pair);
//! 6. **answer filters** (`crate::judge`): a cascade's judge of the first
//!    pool's answer, and its escalation to the second pool;
//! 7. **relay** (the front end's: `h1::upstream` or `crate::relay`);
//! 8. **account** (`account`): the admission, the worker's load charge and the
//!    metrics held by one guard (`account::InFlight`), every request counted once.
//!
//! [`run`] takes a request from its body to what its front end writes:
//! both front ends call it, each with its own client (`send`) and answer type.

pub(crate) mod account;
pub mod admission;
pub mod auth;
pub(crate) mod body;
pub mod cache_trace;
pub mod context;
pub(crate) mod dispatch;
pub(crate) mod forward;
pub(crate) mod request;
pub(crate) mod retry;
pub mod scheduler;
pub(crate) mod shape;
pub mod tenant_limits;
pub(crate) mod trace;

use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::http::HeaderValue;
use axum::response::Response;
use fleet::Worker;
use router_types::DpRank;

use crate::cache::Hit;
use crate::h1::upstream::Extra;
use crate::judge::{First, Judgeable};
use crate::pools::HeaderEdits;
use crate::send::SendError;
use crate::{Gateway, GatewayError};
use account::InFlight;
use forward::{Forwarded, escalate, forward};
use request::Request;

/// What a proxied request came to, for its front end to write.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Outcome<T> {
    /// Answered without a worker's answer to relay: a response-cache hit, or
    /// a cascade's kept first answer (with the verdict's `x-route-cascade`).
    Cached(Hit, Option<HeaderValue>),
    /// A worker's answer to relay, with the verdict's `x-route-cascade` when
    /// a cascade escalated to it.
    Sent(InFlight, Arc<Worker>, T, Option<HeaderValue>),
    /// An answer the router made: a disaggregated pool's (the decode leg's, merged where
    /// asked) or a gRPC worker's.
    Made(Response),
}

/// A request's life from its admitted body to its answer: select and plan,
/// dispatch with `send` (the front end's client) under one retry loop, a
/// disaggregated pool's pair (its legs carry `extra`, as `send` does), a cascade's judge
/// and escalation. The front end relays or writes the [`Outcome`].
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run<T, F, Fut>(
    gw: &Arc<Gateway>,
    request: Request,
    send: &F,
    extra: &Extra,
) -> Result<Outcome<T>, GatewayError>
where
    T: Judgeable,
    F: Fn(Arc<Worker>, Bytes, Option<DpRank>, Option<Arc<HeaderEdits>>) -> Fut,
    Fut: Future<Output = Result<T, SendError>>,
{
    let Request { route, routing, admission, body, start, meta } = request;
    let meta = &meta;
    let (mut guard, worker, answer) =
        match forward(gw, admission, (route, routing.clone()), body, start, meta, send).await? {
            Forwarded::Sent(guard, worker, answer) => (guard, worker, answer),
            Forwarded::Cached(hit) => return Ok(Outcome::Cached(hit, None)),
            Forwarded::Disaggregated(mut d) => {
                let armed = d.guard.take();
                let served = crate::pd::serve_routed(gw, d, (route, extra), start, meta).await?;
                return Ok(Outcome::Made(match armed {
                    Some(armed) => crate::answer_guard::made(gw, served, armed, route, None).await,
                    None => served,
                }));
            }
            Forwarded::Made(answer) => return Ok(Outcome::Made(answer)),
        };
    // A decision's response guard reads whatever answer the client gets.
    let armed = guard.answer_guard.take().map(|a| *a);
    // A decision's cascade judges the first pool's answer: relayed, kept, or sent on to its second pool.
    let Some((plan, sent)) = guard.cascade.take().map(|b| *b) else {
        return guarded(gw, (guard, worker, answer, None), armed).await;
    };
    let verdict = match crate::judge::first(gw, guard, worker, answer, &plan, route).await? {
        First::Relay(guard, worker, answer) => return guarded(gw, (guard, worker, answer, None), armed).await,
        First::Kept(hit, verdict) => {
            let Some(armed) = armed else { return Ok(Outcome::Cached(hit, Some(verdict))) };
            let mut answer = crate::answer_guard::made(gw, hit.into_response(), armed, route, None).await;
            answer.headers_mut().insert(crate::pools::cascade::CASCADE_HEADER, verdict);
            return Ok(Outcome::Made(answer));
        }
        First::Escalate(verdict) => verdict,
    };
    let (guard, worker, answer) = escalate(gw, (&plan, &sent), (route, routing), start, meta, send).await?;
    guarded(gw, (guard, worker, answer, Some(verdict.header())), armed).await
}

/// A worker's answer, read by the decision's response guard when it has one (then an answer
/// made here, its route and cascade headers on it), else relayed as it comes.
async fn guarded<T: Judgeable>(
    gw: &Arc<Gateway>,
    (guard, worker, answer, verdict): (InFlight, Arc<Worker>, T, Option<HeaderValue>),
    armed: Option<crate::pools::response_guard::Armed>,
) -> Result<Outcome<T>, GatewayError> {
    let Some(armed) = armed else { return Ok(Outcome::Sent(guard, worker, answer, verdict)) };
    let mut answer = crate::answer_guard::sent(gw, guard, worker, answer.into_response(), armed).await;
    if let Some(verdict) = verdict {
        answer.headers_mut().insert(crate::pools::cascade::CASCADE_HEADER, verdict);
    }
    Ok(Outcome::Made(answer))
}
