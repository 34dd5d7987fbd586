//! The endpoint picker front end (the Gateway API Inference Extension's EPP):
//! Envoy, or any gateway speaking `ext_proc`, hands each request to the
//! router over a gRPC stream, the router runs the same pipeline as for a
//! request it proxies (admission, select, plan), names the chosen worker in
//! the `x-gateway-destination-endpoint` header and in the `envoy.lb` dynamic
//! metadata, and the gateway proxies the request there. The answer's phase
//! comes back on the same stream: its status and body feed the same answer
//! filters (`relay::Tap`: load, accounting, the response cache). This module
//! owns the listener and what a picker says (`reply`); `session` owns one
//! stream.

mod dispatch;
mod reply;
mod session;

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ext_proc::proto::{BodyMutation, CommonResponse, Mutation, ProcessingRequest, ProcessingResponse, Reply};
use ext_proc::{Messages, Replies, ServingStatus, Status};
use h1_codec::Route;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::pipeline::account::count_error;
use crate::{Gateway, GatewayError};

/// The header (and `envoy.lb` metadata key) that names the chosen endpoint.
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
/// The `envoy.lb` metadata key that names one endpoint the gateway may fall back to.
pub const FALLBACK_KEY: &str = "x-gateway-destination-endpoint-fallback";
/// The dynamic metadata namespace the gateway's load balancer reads.
pub const LB_NAMESPACE: &str = "envoy.lb";
/// The namespace and key of the gateway's subset hint (the endpoints it allows).
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
pub const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// The header GIE gateways carry a request's fairness id (its tenant) in.
pub const FAIRNESS_HEADER: &str = "x-gateway-inference-fairness-id";
/// The conformance suite's test header: the endpoint to pick, named by the test
/// (`--epp-test-endpoint-header`, off by default).
pub const TEST_PICK_HEADER: &str = "test-epp-endpoint-selection";

/// The header naming a request's `InferenceObjective` (its priority).
pub const OBJECTIVE_HEADER: &str = "x-gateway-inference-objective";

/// The `InferenceObjective`s of the router's `InferencePool`: name → priority.
pub type Objectives = tokio::sync::watch::Receiver<Arc<std::collections::HashMap<String, i64>>>;

/// The endpoint picker's settings.
#[derive(Debug, Clone, Default)]
pub struct EppConfig {
    /// Honour [`TEST_PICK_HEADER`] (the GIE conformance suite's test picker does).
    pub test_pick_header: bool,
    /// The pool's objectives, followed on the API server (`--pool-name`): a request naming one
    /// in [`OBJECTIVE_HEADER`] takes its priority's class.
    pub objectives: Option<Objectives>,
}

/// The class a request's [`OBJECTIVE_HEADER`] gives it: its objective's priority's, when it
/// names one of the pool's.
fn objective_class(config: &EppConfig, header: Option<&[u8]>) -> Option<crate::pipeline::scheduler::Class> {
    let name = std::str::from_utf8(header?).ok()?.trim();
    let priority = *config.objectives.as_ref()?.borrow().get(name)?;
    Some(crate::pipeline::scheduler::Class::of_objective_priority(priority))
}

/// Serves the endpoint picker (`ext_proc` and `grpc.health.v1` over HTTP/2) on
/// `listener` until `drain` is cancelled and every open stream is done.
pub async fn serve_epp(
    listener: TcpListener,
    gw: Arc<Gateway>,
    config: EppConfig,
    drain: CancellationToken,
) -> io::Result<()> {
    let picker = Arc::new(Picker { gw: gw.clone(), config, drain: drain.clone() });
    let limits = ext_proc::Limits {
        // A buffered body comes whole in one message, with its framing around it.
        max_message_bytes: gw.config.max_body_bytes.saturating_add(64 << 10),
        ..Default::default()
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(gw.config.limits.max_connections.max(1)));
    let stop = drain.clone();
    crate::h1::accept_each(listener, &gw, slots, &drain, move |tcp| {
        ext_proc::serve_connection(tcp, picker.clone(), limits, stop.clone().cancelled_owned())
    })
    .await
}

/// The `ext_proc` service over the gateway.
#[derive(Debug)]
struct Picker {
    gw: Arc<Gateway>,
    config: EppConfig,
    drain: CancellationToken,
}

impl ext_proc::Service for Picker {
    async fn process(self: Arc<Self>, calls: Messages, replies: Replies) -> Status {
        let status = session::serve(&self.gw, &self.config, calls, replies).await;
        if status.code != Status::OK {
            self.gw.metrics.epp_streams.inc(format_args!("outcome=\"error\""));
            tracing::debug!(code = status.code, message = %status.message, "endpoint picker: stream ended in error");
        }
        status
    }

    /// Serving while some worker can take a request and the router is not draining: the
    /// readiness the HTTP listener's `/readiness` reports.
    fn health(&self, service: &str) -> ServingStatus {
        if !service.is_empty() && service != ext_proc::PROCESSOR_SERVICE {
            return ServingStatus::ServiceUnknown;
        }
        let routable = self.gw.fleet.snapshot().iter().any(|w| w.is_routable());
        let draining = self.drain.is_cancelled() || self.gw.draining.load(std::sync::atomic::Ordering::Relaxed);
        if routable && !draining { ServingStatus::Serving } else { ServingStatus::NotServing }
    }
}

/// Reads the next message within `wait`.
async fn next(calls: &mut Messages, wait: Duration) -> Result<Option<ProcessingRequest>, Status> {
    match tokio::time::timeout(wait, calls.next::<ProcessingRequest>()).await {
        Ok(r) => r,
        Err(_) => Err(Status::new(Status::DEADLINE_EXCEEDED, format!("the gateway sent nothing for {wait:?}"))),
    }
}

/// A reply carrying `reply`.
fn said(reply: Reply) -> ProcessingResponse {
    ProcessingResponse { response: Some(reply), dynamic_metadata: None }
}

/// A `CONTINUE` with `mutation` (and a body mutation).
fn common(mutation: Option<ext_proc::proto::HeaderMutation>, body: Option<Mutation>) -> Option<CommonResponse> {
    let body_mutation = body.map(|m| BodyMutation { mutation: Some(m) });
    Some(CommonResponse { header_mutation: mutation, body_mutation, ..Default::default() })
}

/// One stream's state.
struct Stream<'g> {
    gw: &'g Arc<Gateway>,
    calls: Messages,
    replies: Replies,
    request_mode: i32,
    response_mode: i32,
    /// The request's id.
    id: String,
    start: Instant,
}

/// A request's body, and whether trailers ended it.
struct Body {
    bytes: Bytes,
    trailers: bool,
}

impl Stream<'_> {
    /// Sends a reply; a gateway that takes none of it for as long as a worker may stay silent
    /// mid-answer (`--upstream-idle-timeout-secs`) is given up on.
    async fn send(&self, message: &ProcessingResponse) -> Result<(), Status> {
        let wait = self.gw.config.limits.upstream_idle_timeout;
        match tokio::time::timeout(wait, self.replies.send(message)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(Status::new(Status::CANCELLED, "the gateway left")),
            Err(_) => Err(Status::new(Status::DEADLINE_EXCEEDED, format!("the gateway took no reply for {wait:?}"))),
        }
    }

    /// Answers in the gateway's stead (`e`), ending the request.
    async fn refuse(&self, e: &GatewayError, route: Option<Route>) -> Status {
        count_error(self.gw, route.unwrap_or(Route::Chat), e, Some(&self.id));
        self.counted("answered");
        let _ = self.send(&reply::error(e, route, &self.id)).await;
        Status::ok()
    }

    /// Counts the stream's `outcome`.
    fn counted(&self, outcome: &str) {
        self.gw.metrics.epp_streams.inc(format_args!("outcome=\"{outcome}\""));
    }
}
