//! Prefill/decode disaggregation: each request goes to a pair of workers, a
//! prefill worker chosen by the gateway's policy over the prefill workers
//! (by KV events with cache_aware or min_ttft, pending prefixes credited so a
//! burst of one cold prompt lands on one worker), and a decode worker chosen
//! by load alone (its KV comes from the prefill, never from its own cache).
//! The engines' contracts differ (`../shared/docs/pd.md`):
//!
//! ```text
//! SGLang (sglang.rs): one body + bootstrap_host/port/room ─┬─► prefill ─┐ both at once; either failing
//!                                                           └─► decode ──┴ aborts the other; decode answers
//! vLLM   (vllm.rs):   prefill (max_tokens 1, kv_transfer_params) ─► its params ─► decode (original body + params)
//! ```
//!
//! A leg that fails before the client got a byte (unreachable, or a
//! retryable status) is retried on a new pair (and, for SGLang, in a new
//! room), as `--retry-*` says. `n > 1` is refused: SGLang runs every sample
//! of a request on one bootstrap room (they collide), and vLLM's prefill
//! hands over the KV of one sequence.

mod alone;
mod attempts;
mod dual;
mod grpc;
mod picked;
mod sglang;
#[cfg(test)]
mod tests;
mod vllm;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use router_types::WorkerId;
use serde_json::{Value, json};
use tracing::Span;

use crate::h1::upstream::Extra;
use crate::pipeline::body::parse_json;
use crate::pipeline::request::{Meta, Route};
use crate::send::SendError;
use crate::{Gateway, GatewayError, RetryConfig};
use fleet::Worker;
use planner::{Pair, Pool};

pub use planner::{KvConnector, PdConfig, PdMode, SkipPrefill};

pub(crate) use picked::for_picker;

/// One of a disaggregated request's two legs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leg {
    Prefill,
    Decode,
}

impl Leg {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Leg::Prefill => "prefill",
            Leg::Decode => "decode",
        }
    }

    /// The pair's other leg.
    pub(crate) fn other(self) -> Leg {
        match self {
            Leg::Prefill => Leg::Decode,
            Leg::Decode => Leg::Prefill,
        }
    }
}

/// The router's error `e` for a request's `leg` as the client's answer: counted (the front end
/// counts only the errors it is handed) and named in `x-sgl-router-pd-leg`.
pub(crate) fn leg_error(gw: &Gateway, (route, id): (Route, &str), leg: Leg, e: GatewayError) -> Response {
    crate::pipeline::account::count_error(gw, route, &e, Some(id));
    let mut r = e.into_response();
    r.headers_mut().insert("x-sgl-router-pd-leg", HeaderValue::from_static(leg.as_str()));
    r
}

/// Forgets that `p` pushes (its answer failed, or stopped saying push): its next request goes two-stage.
pub(crate) fn forget_push(p: &fleet::Worker) {
    p.update_pd_facts(|f| f.push_identity = None);
}

/// The client's body with `kv_transfer_params` set to `params`.
pub(crate) fn with_params(v: &Value, params: Value) -> Bytes {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        o.insert("kv_transfer_params".into(), params);
    }
    Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
}

/// Reads a leg's answer whole (capped) within the request timeout.
pub(crate) async fn read_answer(gw: &Gateway, body: crate::relay::UpstreamBody) -> Result<Bytes, String> {
    let limit = gw.config.request_timeout;
    match tokio::time::timeout(limit, read_all(body, MAX_LEG_ANSWER)).await {
        Ok(read) => read,
        Err(_) => Err(format!("no end of the answer within {limit:?}")),
    }
}

/// Why an attempt failed before any byte reached the client.
pub(crate) enum Failure {
    /// A leg answered this non-2xx head (its body read, capped).
    Status { leg: Leg, worker: Arc<Worker>, status: u16, content_type: Option<HeaderValue>, body: Bytes },
    /// A leg could not be delivered, or broke before its head.
    Transport { leg: Leg, worker: Arc<Worker>, error: SendError },
    /// The legs' heads did not come within the request timeout.
    Timeout { leg: Leg, worker: Arc<Worker> },
    /// vLLM's prefill answered without usable `kv_transfer_params` (decode is never sent one).
    Params { worker: Arc<Worker>, message: String },
    /// A gRPC leg's call failed before it started (`crate::pd::grpc`).
    Engine { leg: Leg, worker: Arc<Worker>, error: engine_grpc::EngineError },
    /// The pair's workers speak different protocols (one gRPC, one HTTP).
    Mixed { worker: Arc<Worker>, message: String },
}

/// What every attempt of a request shares.
pub(crate) struct Ctx<'a> {
    pub(crate) gw: &'a Arc<Gateway>,
    /// The disaggregated pool and its setup.
    pub(crate) pool: &'a Arc<Pool>,
    pub(crate) pd: &'a PdConfig,
    /// What both legs carry besides their bodies (the client's headers made the workers',
    /// the decision's header edits applied).
    pub(crate) extra: Extra,
    pub(crate) meta: &'a Meta,
    pub(crate) route: Route,
    /// The client's body, parsed.
    pub(crate) v: Value,
    /// Items of a batched prompt (`None`: one prompt).
    pub(crate) batch: Option<usize>,
    pub(crate) stream: bool,
    pub(crate) start: Instant,
    /// The fleet as the request saw it when planned: a retry's new pair is chosen in it.
    pub(crate) workers: &'a [Arc<Worker>],
}

/// Largest leg answer the router reads whole (a prefill's answer, an error
/// body, an answer whose logprobs are merged).
pub(crate) const MAX_LEG_ANSWER: usize = 64 << 20;
/// Longest the router waits for the rest of a failed leg's error body.
const ERROR_BODY_WAIT: Duration = Duration::from_secs(1);
/// Longest an `/abort_request` to a worker may take.
const ABORT_TIMEOUT: Duration = Duration::from_secs(2);
/// When an `/abort_request` is sent again.
const ABORT_AGAIN_AFTER: Duration = Duration::from_millis(300);

// === impl Failure ===

impl Failure {
    fn leg(&self) -> Leg {
        match self {
            Failure::Status { leg, .. }
            | Failure::Transport { leg, .. }
            | Failure::Timeout { leg, .. }
            | Failure::Engine { leg, .. } => *leg,
            Failure::Params { .. } => Leg::Prefill,
            Failure::Mixed { .. } => Leg::Decode,
        }
    }

    fn worker(&self) -> &Arc<Worker> {
        match self {
            Failure::Status { worker, .. }
            | Failure::Transport { worker, .. }
            | Failure::Timeout { worker, .. }
            | Failure::Params { worker, .. }
            | Failure::Engine { worker, .. }
            | Failure::Mixed { worker, .. } => worker,
        }
    }

    /// Whether a new pair may be tried (nothing of this attempt reached the client).
    fn retryable(&self) -> bool {
        match self {
            Failure::Status { status, .. } => RetryConfig::retryable(*status),
            Failure::Transport { error, .. } => error.connect,
            Failure::Timeout { .. } => false,
            Failure::Params { .. } | Failure::Mixed { .. } => true,
            Failure::Engine { error, .. } => error.before_sending(),
        }
    }

    fn outcome(&self) -> &'static str {
        match self {
            Failure::Status { .. } => "status",
            Failure::Transport { .. } => "unreachable",
            Failure::Timeout { .. } => "timeout",
            Failure::Params { .. } => "incomplete_params",
            Failure::Engine { error, .. } => crate::grpc::kind_of(error),
            Failure::Mixed { .. } => "mixed_protocols",
        }
    }

    /// The worker's side of the failure: its breaker and rotation.
    fn charge(&self) {
        match self {
            Failure::Status { worker, status, .. } if *status >= 500 => worker.answer_failed(),
            Failure::Status { worker, .. } => worker.request_succeeded(),
            Failure::Transport { worker, .. } | Failure::Timeout { worker, .. } => worker.request_failed(),
            Failure::Params { worker, .. } => worker.answer_failed(),
            // An answer's failure reaches its breaker when made the client's error (`error`).
            Failure::Engine {
                worker,
                error: engine_grpc::EngineError::Connect(..) | engine_grpc::EngineError::Deadline(..),
                ..
            } => worker.request_failed(),
            Failure::Engine { .. } | Failure::Mixed { .. } => {}
        }
    }

    /// The router's error for this failure, naming the leg (a failed leg's status and the start
    /// of its body in the message).
    pub(crate) fn error(self) -> GatewayError {
        let leg = self.leg().as_str();
        match self {
            Failure::Status { worker, status, body, .. } => GatewayError::Upstream {
                worker: worker.url.to_string(),
                message: format!(
                    "{leg} leg answered {status}: {}",
                    String::from_utf8_lossy(&body[..body.len().min(512)])
                ),
                retryable: false,
            },
            Failure::Transport { worker, error, .. } => GatewayError::Upstream {
                worker: worker.url.to_string(),
                message: format!("{leg} leg: {}", error.message),
                retryable: error.connect,
            },
            Failure::Timeout { worker, .. } => GatewayError::Timeout(worker.url.to_string()),
            Failure::Params { worker, message } => {
                GatewayError::Upstream { worker: worker.url.to_string(), message, retryable: false }
            }
            Failure::Engine { worker, error, .. } => match crate::grpc::failed(&worker, error) {
                GatewayError::Upstream { worker, message, retryable } => {
                    GatewayError::Upstream { worker, message: format!("{leg} leg: {message}"), retryable }
                }
                other => other,
            },
            Failure::Mixed { message, .. } => GatewayError::Internal(message),
        }
    }

    /// The client's answer: a failed leg's own status and body (its error is
    /// the precise one), or the router's error naming the leg.
    fn into_response(self, gw: &Gateway, route: Route, id: &str) -> Response {
        let leg = self.leg();
        let e = match self {
            Failure::Status { status, content_type, body, .. } => {
                let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
                gw.metrics.requests.inc(format_args!("route=\"{}\",status=\"{}\"", route.label(), status.as_u16()));
                let mut r = (status, body).into_response();
                if let Some(ct) = content_type {
                    r.headers_mut().insert(header::CONTENT_TYPE, ct);
                }
                r.headers_mut().insert("x-sgl-router-pd-leg", HeaderValue::from_static(leg.as_str()));
                return r;
            }
            failure => failure.error(),
        };
        leg_error(gw, (route, id), leg, e)
    }
}

/// A request to a disaggregated pool as the plan phase leaves it: parsed, checked, its prompt
/// rendered and its first pair chosen.
#[derive(Debug)]
pub(crate) struct Planned {
    /// The client's body, parsed.
    pub(crate) v: Value,
    /// Items of a batched prompt (`None`: one prompt).
    pub(crate) batch: Option<usize>,
    /// The prompt's tokens and text by the pool's renderer (none for a batch: balanced by load),
    /// kept for a retry's new pair.
    pub(crate) prompted: planner::Rendered,
    pub(crate) pair: Pair,
}

/// The plan phase of a request to a disaggregated pool (synchronous: in the render pool for a
/// large body, beside the select phase): the body parsed if the select phase did not, what
/// cannot be disaggregated refused, the prompt taken from the select phase's renders (or
/// rendered), the first pair chosen and its prefill worker credited.
pub(crate) fn plan(
    planner: planner::Planner<'_>,
    pool: &Arc<Pool>,
    route: Route,
    (bytes, parsed): (&[u8], Option<Value>),
    renders: &planner::Renders,
    key: Option<&[u8]>,
) -> Result<Planned, GatewayError> {
    let Some(pd) = pool.pd.as_deref() else { return Err(GatewayError::Internal("not disaggregated".into())) };
    let v = match parsed {
        Some(v) => v,
        None => parse_json(bytes)?,
    };
    let (batch, prompted, pair) = choose(planner, (pool, pd), route, &v, renders, key, true)?;
    Ok(Planned { v, batch, prompted, pair })
}

/// What cannot be disaggregated refused (the batch size of a batched prompt returned), the
/// prompt taken from `renders` (or rendered), a pair chosen; `credit`: the request goes to it
/// (never for an explain).
fn choose(
    planner: planner::Planner<'_>,
    (pool, pd): (&Arc<Pool>, &PdConfig),
    route: Route,
    v: &Value,
    renders: &planner::Renders,
    key: Option<&[u8]>,
    credit: bool,
) -> Result<(Option<usize>, planner::Rendered, Pair), GatewayError> {
    let batch = check(v, route, pd.mode)?;
    // A batch is balanced by load: one prefill worker serves every item.
    let prompted = match batch {
        Some(_) => planner::Rendered::default(),
        // gRPC workers take token ids, whatever the policy reads.
        None if crate::grpc::in_pool(planner.workers, pool) => renders.tokens(planner, &pool.renderer, route, v)?,
        None => match renders.take(&pool.renderer) {
            Some(r) => r,
            None => planner.prompt(pool, route, v)?,
        },
    };
    let pair = planner::pair(planner, (pool, pd), v, &prompted, key, &[], credit)?;
    Ok((batch, prompted, pair))
}

/// Serves a request the select and plan phases sent to a disaggregated pool (both front ends):
/// the decision's header edits made to the client's `headers`, the planned pair, the route
/// headers on the answer.
pub(crate) async fn serve_routed(
    gw: &Arc<Gateway>,
    d: Box<crate::pipeline::forward::Disaggregated>,
    (route, extra): (Route, &Extra),
    start: Instant,
    meta: &Meta,
) -> Result<Response, GatewayError> {
    // The pool is the planned pair's (a retry's new pair is of the same pool).
    let pool = d.planned.pair.prefill.pool.clone();
    let Some(pd) = pool.pd.clone() else { return Err(GatewayError::Internal("not disaggregated".into())) };
    let extra = extra.edited(d.edits.as_deref());
    let d = *d;
    let planned = (d.planned, &d.workers[..]);
    let mut answer = attempts::serve(gw, (&pool, &pd), d.admission, route, planned, extra, start, meta).await?;
    let route_headers = d.route_headers.0.into_iter().map(|(n, v)| (axum::http::HeaderName::from_static(n), v));
    answer.headers_mut().extend(route_headers);
    Ok(answer)
}

/// Refuses what cannot be disaggregated; returns the batch size of a batched prompt.
fn check(v: &Value, route: Route, mode: PdMode) -> Result<Option<usize>, GatewayError> {
    if route == Route::Messages {
        // Neither engine's Anthropic endpoint is known here to take the legs' bootstrap or
        // KV-transfer fields: refused rather than sent to fail on the engines.
        return Err(GatewayError::BadRequest(
            "/v1/messages is not served with prefill/decode disaggregation yet: send the request as a chat \
             (/v1/chat/completions), or to a pool that is not disaggregated"
                .into(),
        ));
    }
    if !route.has_prompt() {
        return Err(GatewayError::BadRequest(format!(
            "{} is not served with prefill/decode disaggregation",
            route.path()
        )));
    }
    if let Some(n) = v
        .get("n")
        .and_then(Value::as_u64)
        .filter(|n| *n > 1)
        .or_else(|| v.pointer("/sampling_params/n").and_then(Value::as_u64).filter(|n| *n > 1))
    {
        return Err(GatewayError::BadRequest(format!(
            "n = {n} is refused with prefill/decode disaggregation: {}; send {n} requests instead",
            match mode {
                PdMode::Sglang => "SGLang runs every sample of a request on one bootstrap room, where they collide",
                PdMode::Vllm => "vLLM's prefill hands one sequence's KV to its decode",
            }
        )));
    }
    let batch = batch_size(v, route);
    if batch.is_some() && mode == PdMode::Vllm {
        return Err(GatewayError::BadRequest(
            "batched prompts are refused with vLLM disaggregation: its prefill answers the kv_transfer_params of the first prompt only".into(),
        ));
    }
    Ok(batch)
}

/// The items of a batched prompt: `/generate`'s `text` list or `input_ids`
/// list of lists, completions' `prompt` list of prompts.
pub(crate) fn batch_size(v: &Value, route: Route) -> Option<usize> {
    let list = |field: &str| v.get(field).and_then(Value::as_array);
    match route {
        Route::Generate => match (list("text"), list("input_ids")) {
            (Some(t), _) => Some(t.len()),
            (_, Some(ids)) if ids.first().is_some_and(Value::is_array) => Some(ids.len()),
            _ => None,
        },
        Route::Completions => {
            list("prompt").filter(|p| p.first().is_some_and(|x| x.is_string() || x.is_array())).map(Vec::len)
        }
        _ => None,
    }
}

/// A new pair for a retry, avoiding the workers that failed.
fn pair_again(gw: &Gateway, ctx: &Ctx<'_>, prompt: &planner::Rendered, avoid: &[WorkerId]) -> Option<Pair> {
    let key = ctx.meta.routing_key.as_deref();
    planner::pair(gw.planner(ctx.workers), (ctx.pool, ctx.pd), &ctx.v, prompt, key, avoid, true).ok()
}

/// The policies learn where the request goes; the pair is traced and counted.
fn commit(gw: &Gateway, pd: &PdConfig, pair: &Pair) {
    pair.commit(pd);
    let (p, d) = (pair.prefill.chosen(), pair.decode.chosen());
    let matched = pair.prefill.matched_tokens();
    let span = Span::current();
    span.record("worker", p.url.as_str());
    span.record("matched_tokens", matched);
    span.record("reason", pair.prefill.decision.reason.as_str());
    let m = &gw.metrics;
    m.pd_decisions.inc(format_args!(
        "leg=\"prefill\",policy=\"{}\",reason=\"{}\"",
        pair.prefill.pool.policy.name(),
        pair.prefill.decision.reason
    ));
    m.pd_decisions.inc(format_args!(
        "leg=\"decode\",policy=\"{}\",reason=\"{}\"",
        pd.decode_policy.name(),
        pair.decode.decision.reason
    ));
    m.matched_tokens.observe(matched as f64);
    m.cached.decided(&pair.prefill.regret);
    tracing::debug!(prefill = %p.url, decode = %d.url, matched, "disaggregated pair");
}

/// Tells `worker` to abort request `rid` (SGLang's `/abort_request`), in the
/// background; the leg's connection is closed too, which aborts it anyway.
pub(crate) fn abort(gw: &Gateway, leg: Leg, worker: &Worker, rid: Option<&str>) {
    gw.metrics.pd_aborts.inc(format_args!("leg=\"{}\"", leg.as_str()));
    let Some(rid) = rid else { return };
    let (client, url, rid) = (gw.fleet.client().clone(), worker.endpoint_url("/abort_request"), rid.to_string());
    tokio::spawn(async move {
        // Sent twice: SGLang ignores a rid it has not registered yet, and a leg sent at the
        // same moment may still be on its way in (its closed connection aborts it anyway, later).
        for wait in [Duration::ZERO, ABORT_AGAIN_AFTER] {
            tokio::time::sleep(wait).await;
            let body = json!({"rid": rid}).to_string();
            let sent = client
                .post(&url)
                .header(header::CONTENT_TYPE, "application/json")
                .body(body)
                .timeout(ABORT_TIMEOUT)
                .send()
                .await;
            if let Err(e) = sent {
                tracing::debug!(url, error = %e, "abort_request failed");
            }
        }
    });
}

/// Sends `leg` (its `body`, hinted to `rank`) to `worker` and waits for a successful head
/// within the request timeout; a timeout, a transport error or a non-2xx head is the leg's
/// failure.
pub(crate) async fn leg_head(
    ctx: &Ctx<'_>,
    leg: Leg,
    worker: &Arc<Worker>,
    body: Bytes,
    rank: Option<router_types::DpRank>,
) -> Result<axum::http::Response<crate::relay::UpstreamBody>, Failure> {
    send_leg(ctx.gw, (ctx.extra.clone(), ctx.route), (leg, worker), body, rank).await
}

/// [`leg_head`] with what it needs of a request's context given apart (a leg followed by a task
/// of its own).
pub(crate) async fn send_leg(
    gw: &Gateway,
    (extra, route): (Extra, Route),
    (leg, worker): (Leg, &Arc<Worker>),
    body: Bytes,
    rank: Option<router_types::DpRank>,
) -> Result<axum::http::Response<crate::relay::UpstreamBody>, Failure> {
    let sent = crate::h1::answer::send(extra, worker, route, body, rank);
    match tokio::time::timeout(gw.config.request_timeout, sent).await {
        Err(_) => Err(Failure::Timeout { leg, worker: worker.clone() }),
        Ok(Err(error)) => Err(Failure::Transport { leg, worker: worker.clone(), error }),
        Ok(Ok(resp)) if !resp.status().is_success() => Err(status_failure(leg, worker, resp).await),
        Ok(Ok(resp)) => Ok(resp),
    }
}

/// A leg's answer read whole, at most `cap` bytes, within the request timeout.
pub(crate) async fn leg_body(
    gw: &Gateway,
    (leg, worker): (Leg, &Arc<Worker>),
    resp: axum::http::Response<crate::relay::UpstreamBody>,
    cap: usize,
) -> Result<Bytes, Failure> {
    match tokio::time::timeout(gw.config.request_timeout, read_all(resp.into_body(), cap)).await {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(message)) => {
            let error = SendError { connect: false, message };
            Err(Failure::Transport { leg, worker: worker.clone(), error })
        }
        Err(_) => Err(Failure::Timeout { leg, worker: worker.clone() }),
    }
}

/// A failed leg's answer head, with its body read (capped, briefly).
pub(crate) async fn status_failure(
    leg: Leg,
    worker: &Arc<Worker>,
    resp: axum::http::Response<crate::relay::UpstreamBody>,
) -> Failure {
    let status = resp.status().as_u16();
    let content_type = resp.headers().get(header::CONTENT_TYPE).cloned();
    let body = tokio::time::timeout(ERROR_BODY_WAIT, read_all(resp.into_body(), 64 << 10)).await;
    let body = match body {
        Ok(Ok(b)) => b,
        _ => Bytes::from(format!("{{\"error\":{{\"message\":\"the {} worker answered {status}\"}}}}", leg.as_str())),
    };
    Failure::Status { leg, worker: worker.clone(), status, content_type, body }
}

/// Reads a body whole, up to `cap` bytes.
pub(crate) async fn read_all(mut body: crate::relay::UpstreamBody, cap: usize) -> Result<Bytes, String> {
    use http_body_util::BodyExt;
    let mut out = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| e.to_string())?;
        if let Some(data) = frame.data_ref() {
            if out.len() + data.len() > cap {
                return Err(format!("length limit exceeded: larger than {cap} bytes"));
            }
            out.extend_from_slice(data);
        }
    }
    Ok(out.freeze())
}

/// A JSON answer built by the router (a merged one), with the leg's status.
pub(crate) fn json_answer(status: u16, v: &Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    let mut r = (status, serde_json::to_vec(v).unwrap_or_default()).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// Plans a pair of `pool` for an explain (never committed).
pub(crate) fn explain_pair(
    planner: planner::Planner<'_>,
    (pool, pd): (&Arc<Pool>, &PdConfig),
    route: Route,
    v: &Value,
    key: Option<&[u8]>,
) -> Result<Value, GatewayError> {
    let (_, _, pair) = choose(planner, (pool, pd), route, v, &planner::Renders::default(), key, false)?;
    Ok(planner::pair_json(pd, &pair))
}
