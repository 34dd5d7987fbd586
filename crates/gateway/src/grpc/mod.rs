//! A request to a gRPC worker (`grpc://`, SGLang's scheduler service): the
//! router rendered and tokenized the prompt (the same render the index
//! reads), so it sends token ids and sampling parameters ([`request`]),
//! then makes the engine's token stream into the client's answer: detokenized
//! as it comes, stop strings cut, whole or as SSE ([`answer`], [`sequence`]).
//! A worker that cannot be reached is retried on another gRPC worker of the
//! pool, as an HTTP one is; a client that leaves aborts the generation.

#[cfg(test)]
mod against_engines;
mod answer;
mod pythonic;
mod reasoning;
mod request;
mod sequence;
mod tool_formats;
mod tools;

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use engine_grpc::proto::GenerateResponse;
use engine_grpc::{EngineError, Generation};
use fleet::Worker;
use grpc_wire::Status;
use router_types::{DpRank, WorkerId};
use serde_json::Value;
use tracing::{Span, warn};

use crate::pipeline::account::InFlight;
use crate::pipeline::request::{Meta, Route};
use crate::pipeline::retry::Dispatch;
use crate::{Gateway, GatewayError};
use answer::Answer;
pub(crate) use request::Asked;

/// Longest an `Abort` for a client that left may take.
const ABORT_DEADLINE: Duration = Duration::from_secs(2);

/// A request planned onto a gRPC worker.
pub(crate) struct Job {
    pub(crate) route: Route,
    /// Its body, parsed (as routed).
    pub(crate) v: Value,
    /// Its prompt's token ids.
    pub(crate) tokens: Vec<u32>,
    /// The data-parallel rank to pin it to, if any.
    pub(crate) rank: Option<DpRank>,
    /// Prompt tokens the worker does not hold (its load charge).
    pub(crate) uncached: u64,
}

/// Whether `pool` has a gRPC worker among the request's view of the fleet (its requests then
/// keep their token ids).
pub(crate) fn in_pool(workers: &[Arc<Worker>], pool: &planner::Pool) -> bool {
    workers.iter().any(|w| w.engine().is_some() && pool.serves(w))
}

/// Sends `job` to `worker` (another gRPC worker of `pool` among the request's view of the
/// fleet, `workers`, while none could be reached) and
/// answers with what it generates. `guard` holds the request's load and accounting until
/// the answer ends.
pub(crate) async fn serve(
    gw: &Arc<Gateway>,
    guard: InFlight,
    (worker, workers): (Arc<Worker>, &[Arc<Worker>]),
    pool: &Arc<planner::Pool>,
    job: Job,
    meta: &Meta,
) -> Result<Response, GatewayError> {
    let (asked_engine, asked) = prepare(gw, (job.route, &job.v), job.tokens, job.rank, pool, meta)?;
    let mut d = Calls { gw, asked: &asked_engine, guard, workers, pool, uncached: job.uncached, meta };
    let retry = (&gw.config.retry, meta.one_attempt);
    let ended = crate::pipeline::retry::run(&mut d, worker, retry, &gw.metrics.retries).await;
    let (worker, guard) = (ended.target, d.guard);
    let generation = ended.outcome.map_err(|e| failed(&worker, e))?;
    answer(gw, (guard, worker, None), (generation, None), (asked, pool), meta).await
}

/// The engine's request for a body `v` on `route` (its prompt's `tokens`, pinned to `rank`),
/// and what its answer needs to know: the parsers the router runs on it.
pub(crate) fn prepare(
    gw: &Gateway,
    (route, v): (Route, &Value),
    tokens: Vec<u32>,
    rank: Option<DpRank>,
    pool: &planner::Pool,
    meta: &Meta,
) -> Result<(engine_grpc::proto::GenerateRequest, request::Asked), GatewayError> {
    let (asked_engine, mut asked) =
        request::generate(route, v, tokens, (&meta.id, &pool.served_model), rank.map(|r| r.0))?;
    // A chat's reasoning, unless the request asks for it in the content (`separate_reasoning: false`).
    let separate = v.get("separate_reasoning").and_then(Value::as_bool) != Some(false);
    if let Some(name) = gw.config.reasoning_parser.as_deref().filter(|_| route == Route::Chat && separate) {
        asked.reasoning = reasoning::Format::named(name)?.for_prompt(&prompt_tail(&pool.renderer, &asked_engine));
    }
    // A chat that offers tools: its answer read for calls (`--tool-call-parser`).
    if let Some(parser) = gw.config.tool_call_parser.as_deref().filter(|_| route == Route::Chat) {
        asked.tools = tools::Offered::of(parser, v)?;
    }
    Ok((asked_engine, asked))
}

/// The text of a prompt's last few tokens (where a chat template opens or closes the
/// reasoning), special tokens kept.
fn prompt_tail(renderer: &renderer::Renderer, asked: &engine_grpc::proto::GenerateRequest) -> String {
    let ids = asked.tokenized.as_ref().map_or(&[][..], |t| &t.input_ids[..]);
    let tail = &ids[ids.len().saturating_sub(16)..];
    renderer.tokenizer().decode(tail, false).unwrap_or_default()
}

/// How many bytes at the end of `held` may be the start of `tag` (a proper prefix of it), to
/// be held back until the next piece tells.
fn partial_tag(held: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&n| held.len() >= n && held.is_char_boundary(held.len() - n) && tag.starts_with(&held[held.len() - n..]))
        .unwrap_or(0)
}

/// A call's first message as read within the request timeout.
pub(crate) type FirstRead = Result<Result<Option<GenerateResponse>, EngineError>, tokio::time::error::Elapsed>;

/// The client's answer made of `generation`, the call `worker` took (`guard`: the request's
/// load and accounting until it ends): its first message awaited unless read already (an
/// engine that refuses the request answers its error), then whole or streamed. `partner`: a
/// disaggregated request's prefill worker, told to abort when the answer ends before its end.
pub(crate) async fn answer(
    gw: &Arc<Gateway>,
    (mut guard, worker, partner): (InFlight, Arc<Worker>, Option<Arc<Worker>>),
    (mut generation, first): (Generation, Option<FirstRead>),
    (asked, pool): (request::Asked, &planner::Pool),
    meta: &Meta,
) -> Result<Response, GatewayError> {
    let mut answer = Answer::new(pool.renderer.clone(), asked, &meta.id);
    let deadline = tokio::time::Instant::now() + gw.config.request_timeout;
    // A disaggregated request's prefill, told to stop with (or after) its decode worker.
    let abort_partner = || partner.iter().for_each(|p| abort(p, &meta.id));
    let abort_both = |worker: &Arc<Worker>| {
        abort(worker, &meta.id);
        abort_partner();
    };
    // The first message before the head: an engine that refuses the request answers its error.
    let first = match first {
        Some(read) => read,
        None => tokio::time::timeout_at(deadline, generation.next()).await,
    };
    let first = match first {
        Ok(Ok(Some(m))) => m,
        Ok(Ok(None)) => {
            count(gw, "broken");
            abort_partner();
            return Err(failed(&worker, EngineError::NoAnswer(worker.url.to_string())));
        }
        Ok(Err(e)) => {
            count(gw, kind_of(&e));
            abort_partner();
            return Err(failed(&worker, e));
        }
        Err(_) => {
            count(gw, "deadline");
            worker.request_failed();
            abort_both(&worker);
            return Err(GatewayError::Timeout(worker.url.to_string()));
        }
    };
    guard.load.prefill_done();
    gw.metrics.ttfb.observe(guard.elapsed().as_secs_f64());
    let events = answer.take(first).map_err(|e| {
        count(gw, "bad_message");
        bad(&worker, &e)
    })?;
    guard.status = 200;
    let headers = guard.route_headers.take();
    let mut response = if answer.asked.stream {
        let id = meta.id.clone();
        let relay = Relay { answer, generation, guard, worker, partner, id, deadline, ended: false, failed: None };
        streamed(relay, events)
    } else {
        let whole = collect(&mut answer, &mut generation, deadline).await;
        match whole {
            Ok(()) => worker.request_succeeded(),
            Err(e) => {
                count(gw, e.kind());
                guard.status = 0;
                abort_both(&worker);
                return Err(e.into_gateway(&worker));
            }
        }
        let body = serde_json::to_vec(&answer.whole()).unwrap_or_default();
        let mut r = Response::new(Body::from(body));
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        drop(guard);
        r
    };
    if let Some(extra) = headers {
        for (name, value) in extra.0 {
            response.headers_mut().insert(name, value);
        }
    }
    Ok(response)
}

/// Why a whole answer could not be collected.
enum Broke {
    Engine(EngineError),
    Bad(answer::BadMessage),
    Deadline,
}

impl Broke {
    fn kind(&self) -> &'static str {
        match self {
            Broke::Engine(e) => kind_of(e),
            Broke::Bad(_) => "bad_message",
            Broke::Deadline => "deadline",
        }
    }

    fn into_gateway(self, worker: &Worker) -> GatewayError {
        match self {
            Broke::Engine(e) => failed(worker, e),
            Broke::Bad(e) => bad(worker, &e),
            Broke::Deadline => GatewayError::Timeout(worker.url.to_string()),
        }
    }
}

/// Reads every message of a whole answer, within the deadline.
async fn collect(
    answer: &mut Answer,
    generation: &mut Generation,
    deadline: tokio::time::Instant,
) -> Result<(), Broke> {
    while !answer.done() {
        match tokio::time::timeout_at(deadline, generation.next()).await {
            Ok(Ok(Some(m))) => {
                answer.take(m).map_err(Broke::Bad)?;
            }
            // Ended cleanly with sequences unfinished: the engine owed their completions.
            Ok(Ok(None)) => return Err(Broke::Engine(EngineError::NoAnswer("the engine".into()))),
            Ok(Err(e)) => return Err(Broke::Engine(e)),
            Err(_) => return Err(Broke::Deadline),
        }
    }
    Ok(())
}

/// A streamed answer in progress: it owns the call, the request's accounting and the worker.
struct Relay {
    answer: Answer,
    generation: Generation,
    guard: InFlight,
    worker: Arc<Worker>,
    /// A disaggregated request's prefill worker: told to abort with the worker.
    partner: Option<Arc<Worker>>,
    id: String,
    deadline: tokio::time::Instant,
    /// The answer ended (every sequence finished, or it broke): nothing to abort.
    ended: bool,
    /// A failure met while draining a burst, told once the burst went out.
    failed: Option<Broke>,
}

/// The most bytes of events one write carries.
const BURST_BYTES: usize = 64 << 10;

impl Relay {
    /// Appends to `events` what the messages already received make, without waiting, up to
    /// [`BURST_BYTES`]; a failure among them is kept for the next turn (the events so far go
    /// out first).
    fn drain_ready(&mut self, events: &mut String) {
        use futures_util::FutureExt;
        while events.len() < BURST_BYTES && !self.answer.done() {
            // Not ready: nothing was taken (a message is read whole or left in the buffer).
            let Some(next) = self.generation.next().now_or_never() else { return };
            match next {
                Ok(Some(m)) => match self.answer.take(m) {
                    Ok(more) => events.push_str(&more),
                    Err(e) => {
                        self.failed = Some(Broke::Bad(e));
                        return;
                    }
                },
                // Ended: the next turn reads the end again and says what it lacked.
                Ok(None) => return,
                Err(e) => {
                    self.failed = Some(Broke::Engine(e));
                    return;
                }
            }
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // The client left before the end: the engine stops generating for no one.
        if !self.ended {
            abort(&self.worker, &self.id);
            if let Some(p) = &self.partner {
                abort(p, &self.id);
            }
        }
    }
}

/// The SSE answer: `first` (what the first message made), then each message's events, then
/// the usage and `[DONE]`; an engine failure mid-stream ends it with an error event.
fn streamed(relay: Relay, first: String) -> Response {
    use futures_util::StreamExt;
    let first =
        futures_util::stream::iter((!first.is_empty()).then(|| Ok::<Bytes, std::io::Error>(Bytes::from(first))));
    let rest = futures_util::stream::unfold(Some(relay), |relay| async move {
        let mut relay = relay?;
        loop {
            if relay.answer.done() {
                relay.ended = true;
                relay.worker.request_succeeded();
                let end = relay.answer.end_of_stream();
                return Some((Ok(Bytes::from(end)), None));
            }
            // A failure the last burst met goes first; else the next message, under the deadline.
            let broke = match relay.failed.take() {
                Some(broke) => broke,
                None => match tokio::time::timeout_at(relay.deadline, relay.generation.next()).await {
                    Ok(Ok(Some(m))) => match relay.answer.take(m) {
                        Ok(events) if events.is_empty() => continue,
                        Ok(mut events) => {
                            // The messages already here go out with it: one write for a burst of
                            // tokens, not one each.
                            relay.drain_ready(&mut events);
                            return Some((Ok(Bytes::from(events)), Some(relay)));
                        }
                        Err(e) => Broke::Bad(e),
                    },
                    Ok(Ok(None)) => Broke::Engine(EngineError::NoAnswer(relay.worker.url.to_string())),
                    Ok(Err(e)) => Broke::Engine(e),
                    Err(_) => Broke::Deadline,
                },
            };
            relay.guard.metrics().grpc_failures.inc(format_args!("kind=\"{}\"", broke.kind()));
            let broke = broke.into_gateway(&relay.worker);
            // Broke after the head went out: an error event, and the answer is counted cut.
            relay.guard.cut();
            relay.ended = !matches!(broke, GatewayError::Timeout(_));
            let event = serde_json::json!({"error": broke.body()["error"]});
            return Some((Ok(Bytes::from(format!("data: {event}\n\n"))), None));
        }
    });
    let mut r = Response::new(Body::from_stream(first.chain(rest)));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    *r.status_mut() = StatusCode::OK;
    r
}

/// Tells `worker` to abort request `id` and waits for its answer (at most [`ABORT_DEADLINE`]):
/// for a failed attempt whose next attempt reuses the id, so the abort cannot land on it.
pub(crate) async fn abort_now(worker: &Arc<Worker>, id: &str) {
    if let Some(engine) = worker.engine() {
        let _ = engine.abort(id, "the attempt failed", ABORT_DEADLINE).await;
    }
}

/// Asks `worker` to stop generating request `id` (in the background, bounded).
pub(crate) fn abort(worker: &Arc<Worker>, id: &str) {
    let (worker, id) = (worker.clone(), id.to_owned());
    tokio::spawn(async move {
        if let Some(engine) = worker.engine() {
            let _ = engine.abort(&id, "the client left", ABORT_DEADLINE).await;
        }
    });
}

/// A request's calls to gRPC workers of its pool: another worker while none could be reached.
struct Calls<'a> {
    gw: &'a Arc<Gateway>,
    asked: &'a engine_grpc::proto::GenerateRequest,
    /// The request's load and accounting, moved from worker to worker.
    guard: InFlight,
    /// The fleet as the request saw it when planned.
    workers: &'a [Arc<Worker>],
    pool: &'a Arc<planner::Pool>,
    /// Prompt tokens the worker does not hold (its load charge).
    uncached: u64,
    meta: &'a Meta,
}

impl Dispatch for Calls<'_> {
    type Target = Arc<Worker>;
    type Answer = Generation;
    type Failure = EngineError;

    async fn attempt(&mut self, worker: &Arc<Worker>) -> Result<Generation, EngineError> {
        // Never met: a gRPC request's retry goes to gRPC workers only (`next_worker`).
        let Some(engine) = worker.engine() else {
            return Err(EngineError::Malformed(worker.url.to_string(), "not a gRPC worker".into()));
        };
        let called = engine.generate(self.asked, self.gw.config.request_timeout).await;
        if let Err(e) = &called {
            count(self.gw, kind_of(e));
            worker.request_failed();
        }
        called
    }

    fn retryable(&self, e: &EngineError) -> bool {
        e.before_sending()
    }

    fn failed_on(&self, worker: &Arc<Worker>, _: &EngineError) -> WorkerId {
        worker.id
    }

    fn next(&mut self, worker: &Arc<Worker>, tried: &[WorkerId]) -> Option<Arc<Worker>> {
        crate::pipeline::retry::next_worker(self.gw, self.workers, self.pool, worker, tried)
    }

    fn moving(&mut self, e: EngineError, from: &Arc<Worker>, to: &Arc<Worker>, attempt: u32) {
        warn!(request_id = self.meta.id, worker = %from.url, error = %e, next = %to.url, attempt, "gRPC worker unreachable, retrying");
        self.guard.load = to.charge_on(Some(self.uncached), to.least_loaded_rank());
        Span::current().record("worker", to.url.as_str());
    }
}

/// Counts a failed call by `kind` (`router_grpc_failures_total`).
pub(crate) fn count(gw: &Gateway, kind: &str) {
    gw.metrics.grpc_failures.inc(format_args!("kind=\"{kind}\""));
}

/// The kind of a failed call, as counted.
pub(crate) fn kind_of(e: &EngineError) -> &'static str {
    match e {
        EngineError::Connect(..) => "unreachable",
        EngineError::Status(_) => "status",
        EngineError::Deadline(..) => "deadline",
        EngineError::Transport(..) | EngineError::NoAnswer(_) | EngineError::Malformed(..) => "broken",
    }
}

/// A call that failed, as the client's error; the worker's breaker hears of its own failures.
pub(crate) fn failed(worker: &Worker, e: EngineError) -> GatewayError {
    let upstream =
        |message: String, retryable| GatewayError::Upstream { worker: worker.url.to_string(), message, retryable };
    match e {
        EngineError::Status(Status { code, message }) if code == Status::INVALID_ARGUMENT => {
            GatewayError::BadRequest(format!("the engine refused the request: {message}"))
        }
        EngineError::Status(s) => {
            worker.answer_failed();
            upstream(format!("gRPC status {}: {}", s.code, s.message), false)
        }
        EngineError::Deadline(..) => GatewayError::Timeout(worker.url.to_string()),
        e @ EngineError::Connect(..) => upstream(e.to_string(), true),
        e => {
            worker.answer_failed();
            upstream(e.to_string(), false)
        }
    }
}

/// An engine message that makes no sense for this request.
fn bad(worker: &Worker, e: &answer::BadMessage) -> GatewayError {
    worker.answer_failed();
    GatewayError::Upstream { worker: worker.url.to_string(), message: e.to_string(), retryable: false }
}
