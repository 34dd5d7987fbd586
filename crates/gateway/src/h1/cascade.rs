//! A cascade on the fast path: the first pool's 200 answer, when its length
//! is within the plan's bound, is read whole through [`super::answer`] and
//! judged by the same judge as on the axum front end (`crate::judge`); the
//! caller relays it, writes the kept answer, or sends the request on to the
//! plan's second pool.

use std::sync::Arc;

use axum::http::HeaderValue;
use fleet::Worker;

use super::answer;
use h1_codec::Framing;

use super::upstream::Answer;
use crate::cache::Hit;
use crate::judge::{self, Judged};
use crate::pipeline::account::InFlight;
use crate::pipeline::request::Route;
use crate::pools::cascade::{Plan, Verdict};
use crate::{Gateway, GatewayError};

/// What becomes of the first pool's answer.
#[allow(clippy::large_enum_variant)]
pub(super) enum First {
    /// Not judged (not a 200, no length, over the bound): relayed as it comes.
    Relay(InFlight, Arc<Worker>, Answer),
    /// Kept: the client's answer, and the verdict's `x-route-cascade` value.
    Kept(Hit, HeaderValue),
    /// Unsure: the request goes on to the plan's `to` pool.
    Escalate(Verdict),
}

/// Judges the first pool's `answer` under `plan`.
pub(super) async fn first(
    gw: &Gateway,
    guard: InFlight,
    worker: Arc<Worker>,
    answer: Answer,
    plan: &Plan,
    route: Route,
) -> Result<First, GatewayError> {
    if answer.head.status != 200 {
        return Ok(First::Relay(guard, worker, answer));
    }
    let declared = match answer.head.framing {
        Framing::Length(n) => Some(n),
        _ => None,
    };
    if !judge::judgeable(gw, plan, declared) {
        return Ok(First::Relay(guard, worker, answer));
    }
    match judge::whole(gw, guard, worker, answer::into_response(answer), plan, route).await? {
        Judged::Answer(hit, verdict) => Ok(First::Kept(hit, verdict)),
        Judged::Escalate(verdict) => Ok(First::Escalate(verdict)),
        // Its length was checked above: `whole` reads it.
        Judged::Pass(..) => Err(GatewayError::Internal("a judgeable answer was passed".into())),
    }
}
