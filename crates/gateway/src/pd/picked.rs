//! Disaggregation through the endpoint picker: the gateway (Envoy) carries
//! the decode leg to the endpoint the picker names, with the body the picker
//! writes; the router sends the prefill leg itself, as its own dispatch does.
//!
//! ```text
//! SGLang: bootstrap fields in both bodies ─┬─► prefill (sent here; drained, its load held to its end)
//!                                          └─► decode  (the gateway's; the answer the client gets)
//! vLLM:   prefill (sent here, one token) ─► its kv_transfer_params ─► decode body (the gateway's)
//! a pair that skips the prefill: the client's body to decode
//! ```
//!
//! One attempt (the gateway owns retries). A SGLang prefill that fails after
//! the pick aborts the decode leg by its `rid` (the gateway's connection is
//! not the router's to close). Not served through the picker, refused with
//! 422: Mooncake and push-mode NIXL prefills (both legs at once with ids the
//! router keeps), and prompt logprobs (prefill's would have to be merged into
//! the answer the gateway carries).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use fleet::{LoadGuard, Worker};
use serde_json::Value;
use tracing::warn;

use super::{Ctx, Failure, KvConnector, Leg, PdMode, abort, leg_body, send_leg, sglang, vllm};
use crate::h1::upstream::Extra;
use crate::pipeline::account::InFlight;
use crate::pipeline::forward::Disaggregated;
use crate::pipeline::request::{Meta, Route};
use crate::{Gateway, GatewayError};

/// The decode leg the gateway carries: where, with what body, and the request's accounting
/// (its admission, the decode worker's load, the route headers), held until the answer ends.
pub(crate) struct DecodeLeg {
    /// The decode worker.
    pub(crate) worker: Arc<Worker>,
    /// Its body.
    pub(crate) body: Bytes,
    /// The request's guard.
    pub(crate) guard: InFlight,
    /// The decision's header edits, for the gateway's request too.
    pub(crate) edits: Option<Arc<crate::pools::HeaderEdits>>,
}

/// Why a request cannot be disaggregated through the picker.
fn refused(what: &str) -> GatewayError {
    GatewayError::Unprocessable(format!(
        "{what} is not served through the endpoint picker with prefill/decode disaggregation; send it to the router's HTTP port"
    ))
}

/// A failed prefill leg as the picker's refusal (its worker charged and the leg counted).
fn failed(gw: &Gateway, f: Failure) -> GatewayError {
    f.charge();
    gw.metrics.pd_legs.inc(format_args!("leg=\"{}\",outcome=\"{}\"", f.leg().as_str(), f.outcome()));
    f.error()
}

/// Sends the prefill leg of a planned disaggregated request (or none, for a pair that skips
/// it) and returns the decode leg for the gateway to carry.
pub(crate) async fn for_picker(
    gw: &Arc<Gateway>,
    d: Box<Disaggregated>,
    route: Route,
    extra: &Extra,
    start: Instant,
    meta: &Meta,
) -> Result<DecodeLeg, GatewayError> {
    let pool = d.planned.pair.prefill.pool.clone();
    let Some(pd) = pool.pd.clone() else { return Err(GatewayError::Internal("not disaggregated".into())) };
    let Disaggregated { mut admission, planned, route_headers, edits, workers, .. } = *d;
    let super::Planned { v, batch, pair, .. } = planned;
    let stream = v.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let logprobs = match pd.mode {
        PdMode::Sglang => route == Route::Generate && v.get("return_logprob").and_then(Value::as_bool) == Some(true),
        PdMode::Vllm => vllm::wants_prompt_logprobs(&v),
    };
    if logprobs && !pair.decode_alone {
        return Err(refused("a request for prompt logprobs"));
    }
    let leg_edits = edits.clone();
    let extra = extra.edited(edits.as_deref());
    let ctx = Ctx { gw, pool: &pool, pd: &pd, extra, meta, route, v, batch, stream, start, workers: &workers };
    super::commit(gw, &pd, &pair);
    let (p, dw) = (pair.prefill.chosen().clone(), pair.decode.chosen().clone());
    let (body, load): (Bytes, LoadGuard) = if pair.decode_alone {
        gw.metrics.pd_paths.inc(format_args!("path=\"decode_alone\""));
        let held = pair.decode.matched_tokens();
        let counted = (pair.prefill.input_tokens > 0).then(|| pair.prefill.input_tokens.saturating_sub(held));
        (Bytes::from(serde_json::to_vec(&ctx.v).unwrap_or_default()), dw.charge_on(counted, None))
    } else {
        gw.metrics.pd_paths.inc(format_args!("path=\"disaggregated\""));
        match pd.mode {
            PdMode::Sglang => sglang_prefill(&ctx, &pair),
            PdMode::Vllm if pd.connector == KvConnector::Mooncake => return Err(refused("a Mooncake pool")),
            PdMode::Vllm if vllm::push_identity(&p).is_some() => {
                return Err(refused("a push-mode (NIXL push) prefill"));
            }
            PdMode::Vllm => {
                admission.grow(vllm::prefill_answer_cap(&ctx.v))?;
                vllm_prefill(&ctx, &pair).await.map_err(|f| failed(gw, f))?
            }
        }
    };
    let mut guard = InFlight::new(gw.clone(), admission, load, route, start);
    guard.route_headers = Some(route_headers);
    Ok(DecodeLeg { worker: dw, body, guard, edits: leg_edits })
}

/// SGLang: both bodies with one bootstrap room; the prefill leg sent now, followed in the
/// background (its load held until its answer ends; a failure aborts the decode leg).
fn sglang_prefill(ctx: &Ctx<'_>, pair: &planner::Pair) -> (Bytes, LoadGuard) {
    let (p, d) = (pair.prefill.chosen().clone(), pair.decode.chosen().clone());
    let (rank, dp) = sglang::rank_of(ctx, pair, &p);
    let rooms: Vec<u64> = (0..ctx.batch.unwrap_or(1)).map(|_| sglang::room_for(rank.0, dp)).collect();
    let (prefill_body, decode_body, rid) = sglang::bodies(ctx, &p, &rooms, rank, dp);
    let (p_load, d_load) = pair.charge((dp > 1).then_some(rank));
    let (gw, route, extra) = (ctx.gw.clone(), ctx.route, ctx.extra.clone());
    let prefill_rank = (dp > 1).then_some(rank);
    tokio::spawn(async move {
        let _load = p_load;
        let leg = (Leg::Prefill, &p);
        let outcome = match send_leg(&gw, (extra, route), leg, prefill_body, prefill_rank).await {
            Ok(resp) => leg_body(&gw, leg, resp, super::MAX_LEG_ANSWER).await.map(drop),
            Err(f) => Err(f),
        };
        match outcome {
            Ok(()) => {
                p.request_succeeded();
                gw.metrics.pd_legs.inc(format_args!("leg=\"prefill\",outcome=\"ok\""));
            }
            Err(f) => {
                warn!(worker = %p.url, outcome = f.outcome(), "endpoint picker: the prefill leg failed; the decode leg is aborted");
                let _ = failed(&gw, f);
                abort(&gw, Leg::Decode, &d, rid.as_deref());
            }
        }
    });
    (decode_body, d_load)
}

/// vLLM (NIXL pull): the prefill leg first; decode's body carries its `kv_transfer_params`.
async fn vllm_prefill(ctx: &Ctx<'_>, pair: &planner::Pair) -> Result<(Bytes, LoadGuard), Failure> {
    let rank = pair.vllm_rank();
    let (p_load, d_load) = pair.charge(rank);
    let (_, params) = vllm::pull_params(ctx, pair.prefill.chosen(), rank).await?;
    drop(p_load);
    Ok((super::with_params(&ctx.v, params), d_load))
}
