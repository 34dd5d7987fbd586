//! The select and plan phases of a request (off the serving thread for a large
//! body): its pool, a response-cache answer, its worker or prefill/decode pair;
//! the worker charged, it goes to its dispatcher (`dispatch` for one HTTP
//! worker, `crate::grpc` for a gRPC one, `crate::pd` for a pair). Front ends
//! pass how to send (`send`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::body::Bytes;
use router_types::DpRank;
use serde_json::Value;
use tracing::Span;

use crate::pipeline::account::InFlight;
use crate::pipeline::admission::Admission;
use crate::pipeline::body::parse_body;
use crate::pipeline::cache_trace::Record;
use crate::pipeline::request::{Meta, Route};
use crate::pools::HeaderEdits;
use crate::send::{AnswerHead, SendError};
use crate::{Gateway, GatewayError};
use fleet::Worker;
use planner::Plan;

/// What `forward` did with a request. Returned once per request and moved on at once: boxing
/// the common variant would cost every request an allocation to save a move of its bytes.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Forwarded<T> {
    /// Sent to a worker: the request's load guard, the worker, its answer's head.
    Sent(InFlight, Arc<Worker>, T),
    /// Answered from the decision's response cache.
    Cached(crate::cache::Hit),
    /// For a disaggregated pool (the CLI's disaggregation makes the default pool one): a
    /// prefill/decode pair serves it (`pd::serve_routed`), with the body as routed.
    Disaggregated(Box<Disaggregated>),
    /// Answered by a gRPC worker, the answer made here (`crate::grpc`).
    Made(axum::response::Response),
}

/// A request routed to a disaggregated pool, for the PD dispatch.
#[derive(Debug)]
pub(crate) struct Disaggregated {
    pub(crate) admission: Admission,
    /// The body as routed (its `model` the pool's, the plugins' rewrites applied), parsed,
    /// checked, its prompt rendered and its first pair chosen.
    pub(crate) planned: crate::pd::Planned,
    /// The answer's route headers (none without a routing config).
    pub(crate) route_headers: crate::pipeline::request::RouteHeaders,
    /// The decision's header edits, for both legs.
    pub(crate) edits: Option<Arc<HeaderEdits>>,
    /// The fleet as the request saw it when planned (a retry's new pair is chosen in it).
    pub(crate) workers: Arc<[Arc<Worker>]>,
    /// The decision's `response_guard`, which reads the pair's answer.
    pub(crate) guard: Option<crate::pools::response_guard::Armed>,
}

/// The outcome of parsing and routing, off the serving thread for a large body
/// (one per request, moved once: its size does not matter).
#[allow(clippy::large_enum_variant)]
enum Step {
    /// To one worker; with the prompt's token ids when the pool has gRPC workers (they take ids).
    Send(Option<Value>, Plan, Option<crate::pools::Routed>, Bytes, Option<Vec<u32>>),
    /// Every worker's reported queue at least_load's waiting cap: planned again after a load
    /// report ([`at_cap`]).
    AtCap(Option<Value>, Option<crate::pools::Routed>, Bytes, Option<Vec<u32>>),
    Cached(crate::cache::Hit),
    /// To a disaggregated pool, with its pair.
    Disaggregated(
        crate::pd::Planned,
        crate::pipeline::request::RouteHeaders,
        Option<Arc<HeaderEdits>>,
        Option<Arc<crate::pools::response_guard::Spec>>,
    ),
}

/// The request planned in its routed pool (`default` without a routing config) to be sent
/// (`Step::Send`), or parked at least_load's waiting cap (`Step::AtCap`, planned again by
/// [`at_cap`]).
fn planned(
    planner: planner::Planner<'_>,
    default: &Arc<planner::Pool>,
    (route, key): (Route, Option<&[u8]>),
    renders: &planner::Renders,
    (v, routed, bytes, ids): (Option<Value>, Option<crate::pools::Routed>, Bytes, Option<Vec<u32>>),
) -> Result<Step, GatewayError> {
    let pool = routed.as_ref().map_or(default, |r| &r.pool);
    match planner.plan(pool, route, v.as_ref(), key, renders, true) {
        Ok(plan) => Ok(Step::Send(v, plan, routed, bytes, ids)),
        Err(planner::PlanError::AtWaitingCap) => Ok(Step::AtCap(v, routed, bytes, ids)),
        Err(e) => Err(e.into()),
    }
}

/// A request every worker's reported queue had no room for (least_load's
/// `--least-load-max-waiting-requests`): as SMG's, it waits, here for each round of load
/// polls, and is planned again (off the serving thread, as its first plan), until one worker's
/// queue is under the cap or its `--queue-timeout-secs` since it came is spent (503). It holds
/// its admission slot and memory meanwhile, so the waiting are bounded as the admitted are.
async fn at_cap(
    gw: &Arc<Gateway>,
    (route, meta): (Route, &Meta),
    workers: &Arc<[Arc<Worker>]>,
    start: Instant,
    (v, routed, bytes, ids): (Option<Value>, Option<crate::pools::Routed>, Bytes, Option<Vec<u32>>),
) -> Result<Step, GatewayError> {
    let deadline = tokio::time::Instant::from_std(start) + gw.config.queue_timeout;
    let mut parked = (v, routed, bytes, ids);
    /// The gauge of the waiting, one while this request waits (whichever way it ends).
    struct Waiting<'a>(&'a std::sync::atomic::AtomicU64);
    impl Drop for Waiting<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::Relaxed);
        }
    }
    gw.metrics.cap_waiting.fetch_add(1, Ordering::Relaxed);
    let _waiting = Waiting(&gw.metrics.cap_waiting);
    loop {
        if tokio::time::timeout_at(deadline, gw.fleet.load_polled()).await.is_err() {
            gw.metrics.cap_timeouts.fetch_add(1, Ordering::Relaxed);
            return Err(GatewayError::AtWaitingCap(start.elapsed()));
        }
        let (gw2, seen, subset, key) = (gw.clone(), workers.clone(), meta.subset.clone(), meta.routing_key.clone());
        let (v, routed, bytes, ids) = parked;
        let len = bytes.len();
        let step = crate::pipeline::admission::render(gw, len, move || {
            let planner = planner::Planner { only: subset.as_deref(), ..gw2.planner(&seen) };
            let renders = planner::Renders::default();
            planned(planner, &gw2.pools[0], (route, key.as_deref()), &renders, (v, routed, bytes, ids))
        })
        .await??;
        match step {
            Step::AtCap(v, routed, bytes, ids) => parked = (v, routed, bytes, ids),
            step => return Ok(step),
        }
    }
}

/// Routes an admitted request and delivers it: parse and plan (off the
/// serving thread when the body is large), account, then `send` it to the
/// chosen worker, again (`--retry-*`, after a backoff, on another worker when
/// there is one) while it could not be reached or answered a retryable
/// status: nothing of that answer has reached the client.
/// `routing` is the routing config the front end took when the request came: every phase
/// reads that one, so a reload meanwhile never mixes two configs in one request.
/// Returns the request's load guard, the worker, and what `send` returned
/// (the answer's head).
pub(crate) async fn forward<T, F, Fut>(
    gw: &Arc<Gateway>,
    mut admission: Admission,
    (route, routing): (Route, Option<Arc<crate::pools::Routing>>),
    bytes: Bytes,
    start: Instant,
    meta: &Meta,
    send: F,
) -> Result<Forwarded<T>, GatewayError>
where
    T: AnswerHead,
    F: FnMut(Arc<Worker>, Bytes, Option<DpRank>, Option<Arc<HeaderEdits>>) -> Fut,
    Fut: std::future::Future<Output = Result<T, SendError>>,
{
    let id = meta.id.as_str();
    let (gw2, body, key) = (gw.clone(), bytes.clone(), meta.routing_key.clone());
    let (debug, signal_headers, session) = (meta.route_debug, meta.signal_headers.clone(), meta.session.clone());
    let (cache_bypass, caller, probe) = (meta.cache_bypass, meta.caller, meta.probe);
    let (forced, subset) = (meta.forced.clone(), meta.subset.clone());
    // The vectors embedding signals read, on the embedding pool's threads (none without such signals).
    // The config the request is routed by, for its answer's guard.
    let config = routing.clone();
    let crate::pools::PreRouted { body: parsed, embeddings } =
        crate::pools::pre_route(gw, routing.as_deref(), route, &bytes).await?;
    // The fleet as this request sees it, from its plan to its last retry: one snapshot.
    let workers = gw.fleet.snapshot();
    let seen = workers.clone();
    let step = crate::pipeline::admission::render(gw, bytes.len(), move || {
        let planner = planner::Planner { only: subset.as_deref(), ..gw2.planner(&seen) };
        let mut v = parse_body(&gw2, route, &body, parsed)?;
        // The prompt rendered at most once per renderer, whatever reads it.
        let renders = planner::Renders::default();
        // With a routing config: the pool (the body names its model, the plugins may change it).
        let routed = match (routing, v.as_mut()) {
            (Some(routing), Some(v)) if let Some((pool, decision)) = &forced => {
                Some(crate::pools::forced(&gw2, &routing, v, (pool.clone(), decision), caller))
            }
            (Some(routing), Some(v)) => {
                let (headers, session, embeddings) = (&signal_headers, session.as_deref(), embeddings.as_ref());
                let (caller, renders) = (caller.as_ref(), &renders);
                let ask = crate::pools::Asked {
                    debug,
                    headers,
                    session,
                    embeddings,
                    cache_bypass,
                    caller,
                    renders,
                    planner,
                    probe,
                };
                Some(crate::pools::route(&gw2, &routing, route, v, &ask, None)?)
            }
            _ => None,
        };
        // The decision's response cache holds the answer: nothing is planned or sent.
        if let Some(r) = routed.as_ref()
            && let Some(answer) = r.cache.as_ref().and_then(|(_, outcome)| outcome.answer())
        {
            let headers = crate::pipeline::request::RouteHeaders::of(r);
            return Ok(Step::Cached(crate::cache::Hit { answer: answer.clone(), headers }));
        }
        let bytes = match (&routed, &v) {
            (Some(r), Some(v)) if r.rewritten => Bytes::from(serde_json::to_vec(v).unwrap_or_default()),
            _ => body,
        };
        // The routed pool, or the only one without a routing config.
        let pool = routed.as_ref().map_or(&gw2.pools[0], |r| &r.pool);
        if pool.pd.is_some() {
            let planned = crate::pd::plan(planner, pool, route, (&bytes, v), &renders, key.as_deref())?;
            let headers = routed.as_ref().map(crate::pipeline::request::RouteHeaders::of);
            let guard = routed.as_ref().and_then(|r| r.guard.clone());
            let edits = routed.and_then(|r| r.edits);
            return Ok(Step::Disaggregated(planned, headers.unwrap_or_default(), edits, guard));
        }
        // A gRPC worker takes token ids: the plan's render, kept for it.
        let ids = match v.as_ref() {
            Some(v) if route.has_prompt() && crate::grpc::in_pool(&seen, pool) => {
                Some(renders.tokens(planner, &pool.renderer, route, v)?.tokens)
            }
            _ => None,
        };
        planned(planner, &gw2.pools[0], (route, key.as_deref()), &renders, (v, routed, bytes, ids))
    })
    .await??;
    let step = match step {
        Step::AtCap(v, routed, bytes, ids) => {
            at_cap(gw, (route, meta), &workers, start, (v, routed, bytes, ids)).await?
        }
        step => step,
    };
    // Rendered: the tokenizer's working memory is free again.
    admission.rendered();
    let (mut v, plan, mut routed, bytes, ids) = match step {
        Step::Cached(hit) => return Ok(from_cache(gw, route, start, hit)),
        Step::Disaggregated(planned, route_headers, edits, guard) => {
            // Both legs carry the router's span as their parent.
            let edits = crate::pipeline::trace::edits(meta.trace.as_ref(), edits);
            let guard = armed(guard, config.as_ref());
            let d = Disaggregated { admission, planned, route_headers, edits, workers, guard };
            return Ok(Forwarded::Disaggregated(Box::new(d)));
        }
        Step::AtCap(..) => unreachable!("planned again above"),
        Step::Send(v, plan, mut routed, bytes, ids) => {
            // Missed here: another replica may have kept the answer (`--shared-state`).
            if let Some(hit) = shared_hit(routed.as_mut()).await {
                return Ok(from_cache(gw, route, start, hit));
            }
            (v, plan, routed, bytes, ids)
        }
    };
    plan.commit();
    let pool = &plan.pool;
    let chosen = plan.chosen();
    let matched = plan.candidates[plan.chosen].matched_tokens;
    let span = Span::current();
    span.record("worker", chosen.url.as_str());
    span.record("matched_tokens", matched);
    span.record("reason", plan.decision.reason.as_str());
    // Keyed by the policy's name (a static string: its address and length) and the reason.
    let policy = pool.policy.name();
    let key = (policy.as_ptr() as u64) << 16 | (policy.len() as u64 & 0xff) << 8 | plan.decision.reason as u64;
    gw.metrics.decisions.inc_keyed(key, format_args!("policy=\"{policy}\",reason=\"{}\"", plan.decision.reason));
    gw.metrics.matched_tokens.observe(matched as f64);
    gw.metrics.cached.decided(&plan.regret);
    // The decision record (`x-smg-cache-trace`), when the request asked or the log takes it.
    let record = gw.config.cache_trace.wanted(meta.cache_trace).then(|| Record::of(&plan));
    // Tell a data-parallel engine which rank holds the prefix: SGLang's and
    // vLLM's OpenAI routes read the `X-Data-Parallel-Rank` header; SGLang's native
    // `/generate` reads only the body field `routed_dp_rank`. Only an engine known
    // to have ranks is told (`Worker::rank_hint`): others may refuse the header.
    let worker = chosen.clone();
    // No rank holds a prefix of it: with --dp-aware, the least loaded rank.
    let rank = plan.rank.or_else(|| worker.least_loaded_rank());
    let hint = worker.rank_hint(rank);
    // A rank the client put in the body is its own; the router's is set (and reset on a retry) only without one.
    let client_rank = v.as_ref().is_some_and(|v| v.get("routed_dp_rank").is_some());
    let body =
        if client_rank { bytes.clone() } else { crate::pipeline::dispatch::with_rank(route, v.as_mut(), hint, &bytes) };
    let uncached = plan.input_tokens - matched;
    // Counted only when the router tokenized the prompt.
    let counted = (plan.input_tokens > 0).then_some(uncached);
    let load = worker.charge_on(counted, rank);
    let mut route_headers = routed.as_ref().map(crate::pipeline::request::RouteHeaders::of);
    if meta.probe {
        // Said on the answer by every front end (the endpoint picker's too).
        let probe = (h1_codec::ROUTE_MODE_HEADER, axum::http::HeaderValue::from_static("probe"));
        route_headers.get_or_insert_with(Default::default).0.push(probe);
    }
    let cache = routed.as_mut().and_then(|r| r.cache.take()).map(|(ticket, _)| ticket);
    let cascade = routed.as_mut().and_then(|r| r.cascade.take()).map(|plan| Box::new((plan, bytes.clone())));
    let answer_guard = armed(routed.as_mut().and_then(|r| r.guard.take()), config.as_ref());
    let edits = crate::pipeline::trace::edits(meta.trace.as_ref(), routed.and_then(|r| r.edits));
    let mut guard = InFlight::new(gw.clone(), admission, load, route, start);
    guard.trace = meta.trace.map(|ctx| crate::pipeline::trace::Traced::decided(ctx, id, &plan));
    (guard.route_headers, guard.cache, guard.cascade) = (route_headers, cache, cascade);
    guard.answer_guard = answer_guard.map(Box::new);
    guard.predicted = route.has_prompt().then_some(matched);
    // A gRPC worker: the router sends the token ids and makes the answer.
    if let (Some(tokens), Some(v), true) = (ids, v.take(), worker.engine().is_some()) {
        crate::pipeline::dispatch::traced(gw, &mut guard, record, meta, (1, &worker, "grpc"));
        let job = crate::grpc::Job { route, v, tokens, rank, uncached };
        let armed = guard.answer_guard.take();
        let answer = crate::grpc::serve(gw, guard, (worker, &workers), pool, job, meta).await?;
        return Ok(Forwarded::Made(match armed {
            Some(armed) => crate::answer_guard::made(gw, answer, *armed, route, None).await,
            None => answer,
        }));
    }
    if worker.engine().is_some() {
        return Err(GatewayError::Unprocessable(format!("{} is not served by gRPC workers", route.path())));
    }
    let d = crate::pipeline::dispatch::OneWorker {
        gw,
        send,
        plan: &plan,
        workers: &workers,
        route,
        v,
        bytes,
        body,
        hint,
        client_rank,
        counted,
        edits,
        guard,
        record,
        meta,
    };
    let (guard, worker, answer) = crate::pipeline::dispatch::one_worker(d, worker).await?;
    Ok(Forwarded::Sent(guard, worker, answer))
}

/// A cascade's second attempt: the request the first pool got (`sent`), rewritten for the plan's
/// `to` pool, admitted again and forwarded there under the plan's decision (no decision asked
/// again, no response cache read). Both front ends escalate with it.
pub(crate) async fn escalate<T, F, Fut>(
    gw: &Arc<Gateway>,
    (plan, sent): (&crate::pools::cascade::Plan, &Bytes),
    (route, routing): (Route, Option<Arc<crate::pools::Routing>>),
    start: Instant,
    meta: &Meta,
    send: F,
) -> Result<(InFlight, Arc<Worker>, T), GatewayError>
where
    T: AnswerHead,
    F: FnMut(Arc<Worker>, Bytes, Option<DpRank>, Option<Arc<HeaderEdits>>) -> Fut,
    Fut: std::future::Future<Output = Result<T, SendError>>,
{
    let body = crate::pools::cascade::escalated_body(plan, sent);
    let admission = Admission::admit_waiting(gw, body.len()).await?;
    let meta = Meta { forced: Some((plan.to.clone(), plan.decision.clone())), ..meta.clone() };
    match forward(gw, admission, (route, routing), body, start, &meta, send).await? {
        Forwarded::Sent(guard, worker, answer) => Ok((guard, worker, answer)),
        Forwarded::Cached(_) => Err(GatewayError::Internal("a forced route read a response cache".into())),
        // Refused at load: a cascade never escalates to a disaggregated pool.
        Forwarded::Disaggregated(_) => {
            Err(GatewayError::Internal("a cascade escalated to a disaggregated pool".into()))
        }
        Forwarded::Made(_) => Err(GatewayError::Unprocessable("a cascade does not escalate to gRPC workers".into())),
    }
}

/// A decision's guard armed with the config the request was routed by.
fn armed(
    spec: Option<Arc<crate::pools::response_guard::Spec>>,
    config: Option<&Arc<crate::pools::Routing>>,
) -> Option<crate::pools::response_guard::Armed> {
    Some(crate::pools::response_guard::Armed { spec: spec?, routing: config?.clone() })
}

/// A request answered from a response cache: counted as a worker's answer is, with its latency.
fn from_cache<T>(gw: &Gateway, route: Route, start: Instant, hit: crate::cache::Hit) -> Forwarded<T> {
    gw.metrics.latency.observe(start.elapsed().as_secs_f64());
    crate::pipeline::account::count_answered(gw, route, hit.answer.status);
    Forwarded::Cached(hit)
}

/// The answer another replica kept for a request this replica's response cache missed
/// (`--shared-state`), its route headers saying the hit.
async fn shared_hit(routed: Option<&mut crate::pools::Routed>) -> Option<crate::cache::Hit> {
    let r = routed?;
    let (ticket, outcome) = r.cache.as_mut()?;
    if !matches!(outcome, crate::cache::Outcome::Miss) {
        return None;
    }
    let found = ticket.lookup_shared().await?;
    let answer = found.answer()?.clone();
    *outcome = found;
    Some(crate::cache::Hit { answer, headers: crate::pipeline::request::RouteHeaders::of(r) })
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::RetryConfig;

    /// An answer head with this status.
    struct Head(u16);

    impl AnswerHead for Head {
        fn status(&self) -> u16 {
            self.0
        }
    }

    fn meta() -> Meta {
        Meta {
            id: "r1".into(),
            routing_key: None,
            route_debug: false,
            signal_headers: Vec::new(),
            session: None,
            cache_bypass: false,
            forced: None,
            caller: None,
            subset: None,
            one_attempt: false,
            trace: None,
            cache_trace: false,
            probe: false,
        }
    }

    fn retry(max_retries: u32) -> RetryConfig {
        RetryConfig {
            max_retries,
            initial_backoff: std::time::Duration::from_millis(1),
            jitter: 0.0,
            ..Default::default()
        }
    }

    const BODY: &[u8] = br#"{"model": "default", "messages": [{"role": "user", "content": "hi"}]}"#;

    /// Sends `BODY` through `forward` with each worker's answer from `answers` (by host), and
    /// returns what came of it and the hosts tried in order.
    async fn run(
        gw: &Arc<Gateway>,
        answers: &dyn Fn(&str, usize) -> Result<u16, SendError>,
    ) -> (Result<Forwarded<Head>, GatewayError>, Vec<String>) {
        let tried = Mutex::new(Vec::<String>::new());
        let send = |worker: Arc<Worker>, _body: Bytes, _rank: Option<DpRank>, _edits: Option<Arc<HeaderEdits>>| {
            let host = worker.url.as_str().trim_start_matches("http://").to_owned();
            let n = {
                let mut t = tried.lock().unwrap();
                t.push(host.clone());
                t.len()
            };
            let answer = answers(&host, n).map(Head);
            async move { answer }
        };
        let admission = Admission::admit(gw, BODY.len()).unwrap();
        let out =
            forward(gw, admission, (Route::Chat, None), Bytes::from_static(BODY), Instant::now(), &meta(), send).await;
        (out, tried.into_inner().unwrap())
    }

    fn unreachable() -> SendError {
        SendError { connect: true, message: "connection refused".into() }
    }

    #[tokio::test]
    async fn a_worker_not_reached_is_retried_on_another_and_the_answer_holds_its_load() {
        let gw = crate::testing::gateway(&["http://a:1", "http://b:1"], retry(3)).await;
        let (out, tried) = run(&gw, &|host, _| if host == "a:1" { Err(unreachable()) } else { Ok(200) }).await;
        let Ok(Forwarded::Sent(guard, worker, head)) = out else { panic!("answered") };
        assert_eq!((worker.url.as_str(), head.0), ("http://b:1", 200));
        assert!(tried.len() == 2 || tried == ["b:1"], "round robin may start on b: {tried:?}");
        assert_eq!(worker.load().in_flight, 1, "the answer holds its worker's load");
        drop(guard);
        assert_eq!(worker.load().in_flight, 0, "released with it");
        assert_eq!(gw.in_flight(), 0);
    }

    #[tokio::test]
    async fn a_request_that_reached_its_worker_is_never_sent_again() {
        let gw = crate::testing::gateway(&["http://a:1", "http://b:1"], retry(3)).await;
        let written = || SendError { connect: false, message: "connection reset after the request".into() };
        let (out, tried) = run(&gw, &|_, _| Err(written())).await;
        assert!(matches!(out, Err(GatewayError::Upstream { retryable: false, .. })), "not retried");
        assert_eq!(tried.len(), 1, "{tried:?}");
        assert_eq!(gw.metrics.retries.load(Ordering::Relaxed), 0);
        assert_eq!(gw.in_flight(), 0, "the admission is given back");
    }

    #[tokio::test]
    async fn a_retryable_status_goes_elsewhere_and_the_last_attempts_answer_is_the_clients() {
        let gw = crate::testing::gateway(&["http://a:1", "http://b:1"], retry(3)).await;
        // Every attempt answers 503: three attempts in all, the third's answer goes back.
        let (out, tried) = run(&gw, &|_, _| Ok(503)).await;
        let Ok(Forwarded::Sent(_, _, head)) = out else { panic!("the last answer is relayed") };
        assert_eq!(head.0, 503);
        assert_eq!(tried.len(), 3, "{tried:?}");
        assert_ne!(tried[0], tried[1], "the retry goes to the worker not tried yet");
        assert_eq!(gw.metrics.retries.load(Ordering::Relaxed), 2);
        // A 503 then a 200: the 200 is the client's.
        let (out, tried) = run(&gw, &|_, n| Ok(if n == 1 { 503 } else { 200 })).await;
        assert!(matches!(out, Ok(Forwarded::Sent(_, _, Head(200)))));
        assert_eq!(tried.len(), 2);
    }

    #[tokio::test]
    async fn without_retries_a_worker_not_reached_is_the_clients_502() {
        let mut off = retry(3);
        off.enabled = false;
        let gw = crate::testing::gateway(&["http://a:1", "http://b:1"], off).await;
        let (out, tried) = run(&gw, &|_, _| Err(unreachable())).await;
        assert!(matches!(out, Err(GatewayError::Upstream { retryable: true, .. })));
        assert_eq!(tried.len(), 1);
    }
}
