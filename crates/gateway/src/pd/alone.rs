//! Conditional disaggregation: a request whose decode worker would prefill little of it
//! itself (a short prompt, or one it mostly holds; [`planner::SkipPrefill`]) skips the
//! prefill leg and goes to the decode worker alone, as the client sent it. A vLLM engine
//! without `kv_transfer_params` prefills locally; SGLang's decode-mode servers cannot, so
//! the rules are vLLM's only.

use axum::body::Bytes;
use axum::response::Response;

use super::{Ctx, Failure, Leg, Pair, leg_head};
use crate::pipeline::account::InFlight;
use crate::pipeline::admission::Admission;
use crate::relay::{Ending, stream_back};

/// One attempt on `pair`'s decode worker alone; on failure, why, and the admission back.
pub(super) async fn attempt(
    ctx: &Ctx<'_>,
    pair: &Pair,
    admission: Admission,
) -> Result<Response, (Failure, Admission)> {
    let gw = ctx.gw;
    let d = pair.decode.chosen().clone();
    // It prefills what it does not hold: charged as a prefill worker would be.
    let held = pair.decode.matched_tokens();
    let counted = (pair.prefill.input_tokens > 0).then(|| pair.prefill.input_tokens.saturating_sub(held));
    let load = d.charge_on(counted, None);
    let body = Bytes::from(serde_json::to_vec(&ctx.v).unwrap_or_default());
    let resp = match leg_head(ctx, Leg::Decode, &d, body, None).await {
        Ok(resp) => resp,
        Err(failure) => return Err((failure, admission)),
    };
    d.request_succeeded();
    gw.metrics.pd_legs.inc(format_args!("leg=\"decode\",outcome=\"ok\""));
    gw.metrics.ttfb.observe(ctx.start.elapsed().as_secs_f64());
    let mut guard = InFlight::new(gw.clone(), admission, load, ctx.route, ctx.start);
    guard.predicted = Some(held);
    Ok(stream_back(guard, d, resp, &gw.config.limits, Ending::default()))
}
