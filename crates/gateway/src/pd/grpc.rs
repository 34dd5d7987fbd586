//! SGLang's disaggregation over gRPC (a disaggregated pool of `grpc://`
//! workers, SGLang's scheduler service): the router renders and tokenizes, and
//! sends one `GenerateRequest` to both workers at once, with
//! `disaggregated_params` (the prefill worker's bootstrap host and port, a
//! fresh room whose `room % dp_size` is the prefill rank), as Shepherd Model
//! Gateway does. Decode's token stream is the client's answer, made as a
//! single gRPC worker's is (`crate::grpc`); prefill's is read to its end in
//! the background (its load released then). A leg that cannot be called
//! aborts the other and the attempt fails (retried on a new pair when the
//! worker could not be reached); a prefill that fails after both started
//! aborts decode; a decode that fails, or a client that leaves, aborts prefill.

use std::sync::Arc;
use std::time::Instant;

use axum::response::Response;
use engine_grpc::{EngineError, Generation};
use fleet::{LoadGuard, Worker};
use router_types::DpRank;

use super::{Ctx, Failure, Leg, Pair, sglang};
use crate::Gateway;
use crate::pipeline::account::InFlight;
use crate::pipeline::admission::Admission;

/// SGLang's bootstrap port when a prefill worker names none (as smg assumes).
const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;

/// A request as gRPC workers take it, made once for every attempt: the engine's request and
/// what its answer needs to know.
pub(super) type Prepared = (engine_grpc::proto::GenerateRequest, crate::grpc::Asked);

/// Whether `pair` is of gRPC workers (either: a pair of one of each is refused by its attempt).
pub(super) fn speaks_grpc(pair: &Pair) -> bool {
    pair.prefill.chosen().engine().is_some() || pair.decode.chosen().engine().is_some()
}

/// One attempt on `pair`, both of gRPC workers, with the request `prepared` once, as the
/// pool's disaggregation says; on failure, why, and the admission back for the next attempt.
pub(super) async fn attempt(
    ctx: &Ctx<'_>,
    pair: &Pair,
    admission: Admission,
    prepared: &Prepared,
) -> Result<Response, (Failure, Admission)> {
    let (p, d) = (pair.prefill.chosen().clone(), pair.decode.chosen().clone());
    let (Some(pe), Some(de)) = (p.engine().cloned(), d.engine().cloned()) else {
        let message = format!(
            "a disaggregated pair speaks one protocol: prefill {} and decode {} do not (one is gRPC, one HTTP)",
            p.url, d.url
        );
        return Err((Failure::Mixed { worker: d, message }, admission));
    };
    let legs = Legs { p, d, pe, de };
    match ctx.pd.mode {
        super::PdMode::Sglang => dual(ctx, pair, admission, prepared, legs).await,
        super::PdMode::Vllm => two_stages(ctx, pair, admission, prepared, legs).await,
    }
}

/// A pair's workers and their gRPC services.
struct Legs {
    p: Arc<Worker>,
    d: Arc<Worker>,
    pe: Arc<engine_grpc::Engine>,
    de: Arc<engine_grpc::Engine>,
}

/// SGLang's: both legs at once, met in a room.
async fn dual(
    ctx: &Ctx<'_>,
    pair: &Pair,
    admission: Admission,
    (asked, answer_asked): &Prepared,
    Legs { p, d, pe, de }: Legs,
) -> Result<Response, (Failure, Admission)> {
    let gw = ctx.gw;
    let (rank, dp) = sglang::rank_of(ctx, pair, &p);
    let hinted = (dp > 1).then_some(rank);
    let mut asked = asked.clone();
    asked.data_parallel_rank = hinted.map(|r| r.0 as i32);
    asked.disaggregated_params = Some(engine_grpc::proto::DisaggregatedParams {
        bootstrap_host: host_of(p.url.as_str()).to_string(),
        bootstrap_port: i32::from(p.bootstrap_port().unwrap_or(DEFAULT_BOOTSTRAP_PORT)),
        bootstrap_room: room_for(rank, dp),
    });
    // Decode's own ranks are its business: only the prefill leg is pinned.
    let mut decode_asked = asked.clone();
    decode_asked.data_parallel_rank = None;
    let (p_load, d_load) = pair.charge(hinted);
    let sent = Instant::now();
    let timeout = gw.config.request_timeout;
    let started = both_started(pe.generate(&asked, timeout), de.generate(&decode_asked, timeout)).await;
    let (pg, dg) = match started {
        Ok(calls) => calls,
        Err((leg, error)) => {
            // The other leg may be waiting for its peer: told to stop, and that done before the
            // next attempt starts its legs under the same request id.
            let (worker, other) = if leg == Leg::Prefill { (p, d) } else { (d, p) };
            crate::grpc::abort_now(&other, &ctx.meta.id).await;
            gw.metrics.pd_aborts.inc(format_args!("leg=\"{}\"", leg.other().as_str()));
            crate::grpc::count(gw, crate::grpc::kind_of(&error));
            return Err((Failure::Engine { leg, worker, error }, admission));
        }
    };
    // Until decode's first message: a prefill that fails first is the attempt's failure (its
    // error the client's), decode aborted.
    let deadline = tokio::time::Instant::now() + timeout;
    let (mut pg, mut dg, mut prefill_ended) = (pg, dg, false);
    let first = loop {
        tokio::select! {
            m = tokio::time::timeout_at(deadline, dg.next()) => break m,
            m = pg.next(), if !prefill_ended => match m {
                Ok(Some(_)) => continue,
                Ok(None) => prefill_ended = true,
                Err(error) => {
                    crate::grpc::count(gw, crate::grpc::kind_of(&error));
                    crate::grpc::abort_now(&d, &ctx.meta.id).await;
                    gw.metrics.pd_aborts.inc(format_args!("leg=\"decode\""));
                    return Err((Failure::Engine { leg: Leg::Prefill, worker: p, error }, admission));
                }
            },
        }
    };
    super::dual::heads_ok(gw, ctx, sent, &p, &d);
    match prefill_ended {
        true => drop(p_load),
        false => drop(tokio::spawn(drained(gw.clone(), (p.clone(), pg, p_load), (d.clone(), ctx.meta.id.clone())))),
    }
    // Decode's first message (or why there is none) is the answer's.
    let guard = InFlight::new(gw.clone(), admission, d_load, ctx.route, ctx.start);
    let calls = (guard, d, Some(p));
    let made = crate::grpc::answer(gw, calls, (dg, Some(first)), (answer_asked.clone(), ctx.pool), ctx.meta).await;
    Ok(decode_failed_as_answer(ctx, made))
}

/// vLLM's (NIXL pull): the prefill leg (one token, not streamed, `do_remote_decode`) read to
/// its end, then the decode leg with the parameters its completion handed over. A prefill
/// whose parameters are incomplete fails the attempt (decode would prefill it all itself).
async fn two_stages(
    ctx: &Ctx<'_>,
    pair: &Pair,
    admission: Admission,
    (asked, answer_asked): &Prepared,
    Legs { p, d, pe, de }: Legs,
) -> Result<Response, (Failure, Admission)> {
    let gw = ctx.gw;
    let rank = pair.vllm_rank();
    let (p_load, d_load) = pair.charge(rank);
    let mut prefill = asked.clone();
    prefill.stream = false;
    prefill.data_parallel_rank = rank.map(|r| r.0 as i32);
    if let Some(s) = prefill.sampling_params.as_mut() {
        (s.max_new_tokens, s.n) = (Some(1), 1);
    }
    let timeout = gw.config.request_timeout;
    let sent = Instant::now();
    let fail = |leg: Leg, worker: &Arc<Worker>, error: EngineError| {
        crate::grpc::count(gw, crate::grpc::kind_of(&error));
        Failure::Engine { leg, worker: worker.clone(), error }
    };
    let pull = super::vllm::nixl_pull().to_string();
    let called = async {
        let mut generation = pe.generate_with(&prefill, Some(&pull), timeout).await?;
        while generation.next().await?.is_some() {}
        Ok::<_, EngineError>(generation)
    };
    let generation = match tokio::time::timeout(timeout, called).await {
        Ok(Ok(generation)) => generation,
        Ok(Err(error)) => return Err((fail(Leg::Prefill, &p, error), admission)),
        Err(_) => return Err((Failure::Timeout { leg: Leg::Prefill, worker: p }, admission)),
    };
    drop(p_load);
    let handed: Option<serde_json::Value> = generation.kv_transfer_params().and_then(|j| serde_json::from_str(j).ok());
    let params = match super::vllm::complete_params(handed.as_ref()) {
        Ok(params) => params.to_string(),
        Err(missing) => {
            let message = format!(
                "the prefill worker handed over incomplete kv_transfer_params_json (missing {missing}); decode is not sent it (vLLM would prefill locally)"
            );
            return Err((Failure::Params { worker: p, message }, admission));
        }
    };
    p.request_succeeded();
    gw.metrics.pd_legs.inc(format_args!("leg=\"prefill\",outcome=\"ok\""));
    let dg = match de.generate_with(asked, Some(&params), timeout).await {
        Ok(dg) => dg,
        Err(error) => return Err((fail(Leg::Decode, &d, error), admission)),
    };
    gw.metrics.pd_heads.observe(sent.elapsed().as_secs_f64());
    d.request_succeeded();
    gw.metrics.pd_legs.inc(format_args!("leg=\"decode\",outcome=\"ok\""));
    gw.metrics.ttfb.observe(ctx.start.elapsed().as_secs_f64());
    let guard = InFlight::new(gw.clone(), admission, d_load, ctx.route, ctx.start);
    let made = crate::grpc::answer(gw, (guard, d, None), (dg, None), (answer_asked.clone(), ctx.pool), ctx.meta).await;
    Ok(decode_failed_as_answer(ctx, made))
}

/// The answer, or decode's failure before its head as the router's error naming the leg.
fn decode_failed_as_answer(ctx: &Ctx<'_>, made: Result<Response, crate::GatewayError>) -> Response {
    made.unwrap_or_else(|e| super::leg_error(ctx.gw, (ctx.route, &ctx.meta.id), Leg::Decode, e))
}

/// Starts both calls at once (a prefill answers only once its decode peer met it); the first
/// failure ends the wait, the other call dropped.
async fn both_started<P, D>(pf: P, df: D) -> Result<(Generation, Generation), (Leg, EngineError)>
where
    P: std::future::Future<Output = Result<Generation, EngineError>>,
    D: std::future::Future<Output = Result<Generation, EngineError>>,
{
    let (mut pf, mut df) = (Box::pin(pf), Box::pin(df));
    let (mut pg, mut dg) = (None, None);
    loop {
        if let (Some(_), Some(_)) = (&pg, &dg) {
            return Ok((pg.take().expect("set"), dg.take().expect("set")));
        }
        tokio::select! {
            r = &mut pf, if pg.is_none() => pg = Some(r.map_err(|e| (Leg::Prefill, e))?),
            r = &mut df, if dg.is_none() => dg = Some(r.map_err(|e| (Leg::Decode, e))?),
        }
    }
}

/// Reads the prefill leg's answer to its end (within the request timeout), its load held until
/// then; a failure aborts the decode leg (its answer then ends with an error).
async fn drained(
    gw: Arc<Gateway>,
    (p, mut generation, load): (Arc<Worker>, Generation, LoadGuard),
    (d, id): (Arc<Worker>, String),
) {
    let deadline = tokio::time::Instant::now() + gw.config.request_timeout;
    let failure = loop {
        match tokio::time::timeout_at(deadline, generation.next()).await {
            Ok(Ok(Some(_))) => continue,
            Ok(Ok(None)) => break None,
            Ok(Err(e)) => break Some(crate::grpc::kind_of(&e)),
            Err(_) => break Some("deadline"),
        }
    };
    drop(load);
    let Some(kind) = failure else { return };
    crate::grpc::count(&gw, kind);
    p.answer_failed();
    // As an HTTP prefill's error after both heads (this leg was counted `ok` then).
    gw.metrics.pd_legs.inc(format_args!("leg=\"prefill\",outcome=\"failed_after_head\""));
    tracing::warn!(request_id = id, prefill = %p.url, kind, "the prefill leg failed: decode aborted");
    gw.metrics.pd_aborts.inc(format_args!("leg=\"decode\""));
    crate::grpc::abort(&d, &id);
}

/// The host of a `grpc://host:port` URL (an IPv6 address without its brackets).
fn host_of(url: &str) -> &str {
    let authority = url.split_once("://").map_or(url, |(_, rest)| rest).trim_end_matches('/');
    let host = authority.rsplit_once(':').map_or(authority, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// A room in [0, `i32::MAX`] (the field's range in SGLang's gRPC service) with
/// `room % dp == rank`.
fn room_for(rank: DpRank, dp: u32) -> i32 {
    i32::try_from(sglang::room_within(rank.0, dp, i32::MAX as u64)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_room_names_its_rank_within_the_fields_range() {
        for dp in [1, 2, 3, 7, 8] {
            for rank in 0..dp {
                for _ in 0..200 {
                    let room = room_for(DpRank(rank), dp);
                    assert!(room >= 0, "{room}");
                    assert_eq!(room as u32 % dp, rank, "dp {dp}");
                }
            }
        }
    }

    #[test]
    fn the_bootstrap_host_is_the_urls() {
        assert_eq!(host_of("grpc://10.0.0.7:30001"), "10.0.0.7");
        assert_eq!(host_of("grpc://prefill-0.svc:30001/"), "prefill-0.svc");
        assert_eq!(host_of("grpc://[::1]:30001"), "::1");
    }
}
