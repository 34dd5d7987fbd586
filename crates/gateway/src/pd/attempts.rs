//! The dispatch phase of a request planned onto a prefill/decode pair: one
//! attempt per pair (SGLang's dual dispatch, vLLM's two stages or push,
//! Mooncake, or the decode worker alone), under the one retry loop
//! ([`crate::pipeline::retry::run`]): a leg that failed before the client got
//! a byte moves the request to a new pair of the pool.

use std::sync::Arc;
use std::time::Instant;

use axum::response::Response;
use router_types::WorkerId;
use serde_json::Value;
use tracing::warn;

use super::{Ctx, Failure, Planned, alone, commit, pair_again, sglang, vllm};
use crate::h1::upstream::Extra;
use crate::pipeline::admission::Admission;
use crate::pipeline::cache_trace::{self, Record};
use crate::pipeline::request::{Meta, Route};
use crate::pipeline::retry::{Dispatch, Ended};
use crate::{Gateway, GatewayError};
use fleet::Worker;
use planner::{Pair, PdConfig, PdMode, Pool};

/// A request's attempts on pairs of its pool.
struct Pairs<'a> {
    ctx: Ctx<'a>,
    /// The prompt's tokens and text, for a retry's new pair.
    prompted: planner::Rendered,
    /// The request's admission, lent to each attempt (its guard holds it once answered).
    admission: Option<Admission>,
    /// The decision record (`x-smg-cache-trace`): the pair's choices, a retry's.
    record: Option<Record>,
    /// The request as gRPC workers take it (a pool of gRPC workers).
    grpc: Option<super::grpc::Prepared>,
}

impl Dispatch for Pairs<'_> {
    type Target = Pair;
    type Answer = Response;
    type Failure = Failure;

    async fn attempt(&mut self, pair: &Pair) -> Result<Response, Failure> {
        let (ctx, gw) = (&self.ctx, self.ctx.gw);
        commit(gw, ctx.pd, pair);
        let Some(adm) = self.admission.take() else {
            // Each attempt gives the admission back when it fails: never reached.
            let worker = pair.prefill.chosen().clone();
            return Err(Failure::Params { worker, message: "the request's admission was lost".into() });
        };
        let path = if pair.decode_alone { "decode_alone" } else { "disaggregated" };
        gw.metrics.pd_paths.inc(format_args!("path=\"{path}\""));
        let outcome = if let Some(prepared) = &self.grpc {
            super::grpc::attempt(ctx, pair, adm, prepared).await
        } else if pair.decode_alone {
            alone::attempt(ctx, pair, adm).await
        } else {
            match ctx.pd.mode {
                PdMode::Sglang => sglang::attempt(ctx, pair, adm).await,
                PdMode::Vllm => vllm::attempt(ctx, pair, adm).await,
            }
        };
        let (failure, adm) = match outcome {
            Ok(response) => return Ok(response),
            Err(failed) => failed,
        };
        self.admission = Some(adm);
        failure.charge();
        gw.metrics.pd_legs.inc(format_args!("leg=\"{}\",outcome=\"{}\"", failure.leg().as_str(), failure.outcome()));
        Err(failure)
    }

    fn retryable(&self, failure: &Failure) -> bool {
        // Without its admission (never: each failed attempt gives it back) nothing is tried again.
        self.admission.is_some() && failure.retryable()
    }

    fn failed_on(&self, _: &Pair, failure: &Failure) -> WorkerId {
        failure.worker().id
    }

    fn next(&mut self, _: &Pair, tried: &[WorkerId]) -> Option<Pair> {
        pair_again(self.ctx.gw, &self.ctx, &self.prompted, tried)
    }

    fn moving(&mut self, failure: Failure, _: &Pair, next: &Pair, attempt: u32) {
        warn!(
            request_id = self.ctx.meta.id,
            leg = failure.leg().as_str(),
            worker = %failure.worker().url,
            outcome = failure.outcome(),
            attempt,
            "disaggregated attempt failed, retrying on a new pair"
        );
        if let Some(r) = self.record.as_mut() {
            r.add(&next.prefill, "retry", true);
            r.add(&next.decode, "retry", next.decode_alone);
        }
    }
}

/// Serves a planned request on its prefill/decode pair of `pool`: dispatch, retry on a new pair.
#[allow(clippy::too_many_arguments)]
pub(super) async fn serve(
    gw: &Arc<Gateway>,
    (pool, pd): (&Arc<Pool>, &PdConfig),
    admission: Admission,
    route: Route,
    (planned, workers): (Planned, &[Arc<Worker>]),
    extra: Extra,
    start: Instant,
    meta: &Meta,
) -> Result<Response, GatewayError> {
    let Planned { v, batch, prompted, pair } = planned;
    let stream = v.get("stream").and_then(Value::as_bool).unwrap_or(false);
    // vLLM's prefill answer is read whole: bounded, and counted in the memory budget first
    // (the render's reservation was released when the plan phase ended).
    let mut admission = admission;
    if pd.mode == PdMode::Vllm {
        admission.grow(vllm::prefill_answer_cap(&v))?;
    }
    let record = gw.config.cache_trace.wanted(meta.cache_trace).then(|| {
        let mut r = Record::of(&pair.prefill);
        r.add(&pair.decode, "policy", pair.decode_alone);
        r
    });
    // A pool of gRPC workers takes token ids: the request made once for every attempt.
    let grpc = match super::grpc::speaks_grpc(&pair) {
        true if pd.connector == super::KvConnector::Mooncake || batch.is_some() => {
            return Err(GatewayError::Unprocessable(
                "gRPC workers are disaggregated with one prompt a request, SGLang's way or vLLM's NIXL pull; \
                 vLLM's Mooncake connector over gRPC is not built"
                    .into(),
            ));
        }
        true => Some(crate::grpc::prepare(gw, (route, &v), prompted.tokens.clone(), None, pool, meta)?),
        false => None,
    };
    let ctx = Ctx { gw, pool, pd, extra, meta, route, v, batch, stream, start, workers };
    let mut d = Pairs { ctx, prompted, admission: Some(admission), record, grpc };
    let retry = (&gw.config.retry, meta.one_attempt);
    let Ended { outcome, target: pair, attempt } =
        crate::pipeline::retry::run(&mut d, pair, retry, &gw.metrics.retries).await;
    let mut response = match outcome {
        Ok(response) => response,
        Err(failure) => return Ok(failure.into_response(gw, route, &meta.id)),
    };
    if let Some(r) = d.record.take() {
        let (p, dw) = (pair.prefill.chosen().url.as_str(), pair.decode.chosen().url.as_str());
        let (engines, mode): (&[&str], _) = if pair.decode_alone { (&[dw], "decode_alone") } else { (&[p, dw], "pd") };
        if let Some(v) = r.dispatched(&gw.config.cache_trace, (&meta.id, meta.cache_trace), attempt, (engines, mode)) {
            response.headers_mut().insert(cache_trace::HEADER, v);
        }
    }
    Ok(response)
}
