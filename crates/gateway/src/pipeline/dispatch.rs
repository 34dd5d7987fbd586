//! The dispatch phase of a request planned onto one HTTP worker: sent with
//! the front end's client (`send`), under the one retry loop
//! ([`crate::pipeline::retry::run`]): a worker not reached, or one that
//! answered a retryable status, is replaced by the pool's next, the load
//! charge, the rank hint and the decision record following the request.

use std::sync::Arc;

use axum::body::Bytes;
use policy::Decision;
use router_types::{DpRank, WorkerId};
use serde_json::{Value, json};
use tracing::warn;

use crate::pipeline::account::InFlight;
use crate::pipeline::cache_trace::{self, Record};
use crate::pipeline::request::{Meta, Route};
use crate::pipeline::retry::{Dispatch, Ended, next_worker};
use crate::pools::HeaderEdits;
use crate::send::{AnswerHead, SendError};
use crate::{Gateway, GatewayError, RetryConfig};
use fleet::Worker;
use planner::Plan;

/// A request planned onto one HTTP worker, as its attempts see it.
pub(crate) struct OneWorker<'a, F> {
    pub(crate) gw: &'a Arc<Gateway>,
    /// The front end's client.
    pub(crate) send: F,
    pub(crate) plan: &'a Plan,
    /// The fleet as the request saw it when planned (a retry's worker is chosen in it).
    pub(crate) workers: &'a [Arc<Worker>],
    pub(crate) route: Route,
    /// The body parsed (`None`: not parsed), and as it came.
    pub(crate) v: Option<Value>,
    pub(crate) bytes: Bytes,
    /// What the current worker is sent (with its rank on `/generate`).
    pub(crate) body: Bytes,
    /// The current worker's rank hint.
    pub(crate) hint: Option<DpRank>,
    /// The client put a rank in the body: it is its own, never set or reset here.
    pub(crate) client_rank: bool,
    /// Prompt tokens the worker is charged (counted only when the router tokenized the prompt).
    pub(crate) counted: Option<u64>,
    /// The decision's header edits.
    pub(crate) edits: Option<Arc<HeaderEdits>>,
    /// The request's load and accounting, moved from worker to worker.
    pub(crate) guard: InFlight,
    /// The decision record (`x-smg-cache-trace`).
    pub(crate) record: Option<Record>,
    pub(crate) meta: &'a Meta,
}

/// Why an attempt on one HTTP worker did not end the request.
pub(crate) enum Failed<T> {
    /// A retryable status (nothing of it sent to the client yet).
    Status(T),
    /// The worker could not be reached, or broke off before its answer's head.
    Upstream(GatewayError),
    /// No answer's head within `--request-timeout-secs`.
    Timeout,
}

impl<T, F, Fut> Dispatch for OneWorker<'_, F>
where
    T: AnswerHead,
    F: FnMut(Arc<Worker>, Bytes, Option<DpRank>, Option<Arc<HeaderEdits>>) -> Fut,
    Fut: Future<Output = Result<T, SendError>>,
{
    type Target = Arc<Worker>;
    type Answer = T;
    type Failure = Failed<T>;

    async fn attempt(&mut self, worker: &Arc<Worker>) -> Result<T, Failed<T>> {
        let sent = (self.send)(worker.clone(), self.body.clone(), self.hint, self.edits.clone());
        match tokio::time::timeout(self.gw.config.request_timeout, sent).await {
            Ok(Ok(answer)) => {
                let status = answer.status();
                if status >= 500 {
                    worker.answer_failed();
                } else {
                    worker.request_succeeded();
                }
                if RetryConfig::retryable(status) { Err(Failed::Status(answer)) } else { Ok(answer) }
            }
            Ok(Err(e)) => {
                worker.request_failed();
                let url = worker.url.to_string();
                Err(Failed::Upstream(GatewayError::Upstream { worker: url, message: e.message, retryable: e.connect }))
            }
            Err(_) => {
                // A worker that answers its probes but not its requests must not stay in rotation.
                worker.request_failed();
                Err(Failed::Timeout)
            }
        }
    }

    fn retryable(&self, failure: &Failed<T>) -> bool {
        match failure {
            Failed::Status(_) => true,
            // Nothing reached the worker: again, on another worker when there is one.
            Failed::Upstream(e) => e.retryable_elsewhere(),
            // Not retried: the worker may be working on it.
            Failed::Timeout => false,
        }
    }

    fn failed_on(&self, worker: &Arc<Worker>, _: &Failed<T>) -> WorkerId {
        worker.id
    }

    fn next(&mut self, worker: &Arc<Worker>, tried: &[WorkerId]) -> Option<Arc<Worker>> {
        next_worker(self.gw, self.workers, &self.plan.pool, worker, tried)
    }

    fn moving(&mut self, failure: Failed<T>, from: &Arc<Worker>, to: &Arc<Worker>, attempt: u32) {
        let id = self.meta.id.as_str();
        match failure {
            // Nothing of this answer reached the client: it is dropped (its connection closed).
            Failed::Status(answer) => {
                let status = answer.status();
                warn!(request_id = id, worker = %from.url, status, next = %to.url, attempt, "worker answered a retryable status, retrying");
            }
            Failed::Upstream(e) => {
                warn!(request_id = id, worker = %from.url, error = %e, next = %to.url, attempt, "worker unreachable, retrying")
            }
            Failed::Timeout => {}
        }
        // The policy learns where the request really went (the text tree, the turn taken).
        let plan = self.plan;
        let moved = Decision { worker: to.id, reason: plan.decision.reason };
        plan.pool.policy.commit(&moved, &plan.candidates, &plan.request());
        if let Some(r) = self.record.as_mut() {
            r.retried(plan, to);
        }
        // The rank hint was for the first worker; the next one places it itself (or, with
        // --dp-aware, its least loaded rank).
        let rank = to.least_loaded_rank();
        self.hint = to.rank_hint(rank);
        if !self.client_rank {
            self.body = with_rank(self.route, self.v.as_mut(), self.hint, &self.bytes);
        }
        // The load moves: the first worker's charge is released as it is replaced.
        self.guard.load = to.charge_on(self.counted, rank);
        // What the index says the next worker holds; the span names it.
        let held = plan.workers.iter().position(|w| w.id == to.id).map(|i| plan.candidates[i].matched_tokens);
        self.guard.predicted = self.guard.predicted.map(|_| held.unwrap_or(0));
        if let Some(t) = self.guard.trace.as_mut() {
            t.retried(to.url.as_str());
        }
    }
}

/// Sends a request planned onto `first` (an HTTP worker) with the one retry loop; the answer
/// that ends it (a retryable status included, once no other attempt is due) with its guard.
pub(crate) async fn one_worker<T, F, Fut>(
    mut d: OneWorker<'_, F>,
    first: Arc<Worker>,
) -> Result<(InFlight, Arc<Worker>, T), GatewayError>
where
    T: AnswerHead,
    F: FnMut(Arc<Worker>, Bytes, Option<DpRank>, Option<Arc<HeaderEdits>>) -> Fut,
    Fut: Future<Output = Result<T, SendError>>,
{
    let gw = d.gw;
    let retry = (&gw.config.retry, d.meta.one_attempt);
    let Ended { outcome, target: worker, attempt } =
        crate::pipeline::retry::run(&mut d, first, retry, &gw.metrics.retries).await;
    let answer = match outcome {
        Ok(answer) | Err(Failed::Status(answer)) => answer,
        Err(Failed::Upstream(e)) => return Err(e),
        Err(Failed::Timeout) => return Err(GatewayError::Timeout(worker.url.to_string())),
    };
    gw.metrics.ttfb.observe(d.guard.elapsed().as_secs_f64());
    let OneWorker { mut guard, record, meta, .. } = d;
    traced(gw, &mut guard, record, meta, (attempt, &worker, "http"));
    Ok((guard, worker, answer))
}

/// Ends a dispatch's decision record (`x-smg-cache-trace`): attempt `attempt` answered by
/// `worker` in `mode`; the header goes among the answer's route headers.
pub(crate) fn traced(
    gw: &Gateway,
    guard: &mut InFlight,
    record: Option<Record>,
    meta: &Meta,
    to: (u32, &Worker, &str),
) {
    let (attempt, worker, mode) = to;
    let Some(r) = record else { return };
    let ask = (meta.id.as_str(), meta.cache_trace);
    if let Some(v) = r.dispatched(&gw.config.cache_trace, ask, attempt, (&[worker.url.as_str()], mode)) {
        guard.route_headers.get_or_insert_with(Default::default).0.push((cache_trace::HEADER, v));
    }
}

/// The body to send for `rank` on a request whose client set no rank: on
/// `/generate`, `routed_dp_rank` set in the parsed body (SGLang's native route
/// reads no header), or taken out again for a retry without one; else as it came.
pub(crate) fn with_rank(route: Route, v: Option<&mut Value>, rank: Option<DpRank>, bytes: &Bytes) -> Bytes {
    let Some(v) = v.filter(|_| route == Route::Generate) else { return bytes.clone() };
    let Some(fields) = v.as_object_mut() else { return bytes.clone() };
    match rank {
        Some(rank) => fields.insert("routed_dp_rank".into(), json!(rank.0)),
        None if fields.remove("routed_dp_rank").is_some() => None,
        None => return bytes.clone(),
    };
    Bytes::from(serde_json::to_vec(&*v).unwrap_or_default())
}
