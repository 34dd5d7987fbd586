//! The account phase: what a request holds while it is served (its admission
//! slot and memory, the chosen worker's load) and what is counted of it
//! (requests by route and status, latency, errors by side), released and
//! counted once whatever way it ends; and the `request` span.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use tracing::{Span, debug, debug_span, warn};

use crate::pipeline::admission::Admission;
use crate::pipeline::request::{Route, RouteHeaders};
use crate::{Gateway, GatewayError};
use fleet::LoadGuard;

/// Load and accounting of one forwarded request, released once on drop.
pub(crate) struct InFlight {
    gw: Arc<Gateway>,
    /// Its slot and memory reservation.
    _admission: Admission,
    /// The chosen worker's load, held until the answer ends.
    pub(crate) load: LoadGuard,
    /// What the answer tells of the pool and decision (with a routing config).
    pub(crate) route_headers: Option<RouteHeaders>,
    route: Route,
    /// The answer's status; 0 until there is one.
    pub(crate) status: u16,
    start: Instant,
    /// Where a complete answer is kept (a response-cache miss).
    pub(crate) cache: Option<crate::cache::Ticket>,
    /// The decision's cascade judges the answer: its plan and the body the worker got.
    pub(crate) cascade: Option<Box<(crate::pools::cascade::Plan, Bytes)>>,
    /// The decision's `response_guard`, which reads the answer before the client does.
    pub(crate) answer_guard: Option<Box<crate::pools::response_guard::Armed>>,
    /// Prompt tokens the index says the worker holds (a prompt's route on one worker): the
    /// answer's reported cached tokens are compared with it.
    pub(crate) predicted: Option<u64>,
    /// Its span, exported when it is counted (`--enable-trace`).
    pub(crate) trace: Option<Box<crate::pipeline::trace::Traced>>,
    /// Counted when dropped (false: another attempt of the same request answers it).
    counted: bool,
    /// The answer broke off after its head went out (the worker failed or fell silent).
    cut: bool,
}

impl InFlight {
    /// The request's route.
    pub(crate) fn route(&self) -> Route {
        self.route
    }

    /// Time since the request came.
    pub(crate) fn elapsed(&self) -> std::time::Duration {
        self.start.elapsed()
    }

    /// The gateway's metrics.
    pub(crate) fn metrics(&self) -> &crate::metrics::GatewayMetrics {
        &self.gw.metrics
    }

    /// The accounting of a request about to be answered from `load`'s worker.
    pub(crate) fn new(gw: Arc<Gateway>, admission: Admission, load: LoadGuard, route: Route, start: Instant) -> Self {
        Self {
            gw,
            _admission: admission,
            load,
            route_headers: None,
            route,
            status: 0,
            start,
            cache: None,
            cascade: None,
            answer_guard: None,
            predicted: None,
            trace: None,
            counted: true,
            cut: false,
        }
    }

    /// The answer broke off after its head (`status`) went out: the client saw `status`, so
    /// `router_http_requests_total` counts that; `router_http_answers_cut_total` counts the cut.
    pub(crate) fn cut(&mut self) {
        self.cut = true;
    }

    /// Lets go of this attempt's load and admission without counting it: the request is
    /// answered by another attempt (an escalated cascade), counted then, once.
    pub(crate) fn superseded(mut self) {
        self.counted = false;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !self.counted {
            return;
        }
        let m = &self.gw.metrics;
        m.latency.observe(self.start.elapsed().as_secs_f64());
        // Status 0: the request failed before an answer; `handle` counts its error.
        if self.status != 0 {
            count_answered(&self.gw, self.route, self.status);
        }
        if self.cut {
            m.answers_cut.inc(format_args!("route=\"{}\"", self.route.label()));
        }
        if let Some(t) = self.trace.take() {
            t.finish(&self.gw, self.route.path(), self.status, self.cut, self.start);
        }
    }
}

/// Counts a request answered with `status` (by a worker, or from a response cache).
pub(crate) fn count_answered(gw: &Gateway, route: Route, status: u16) {
    let key = (route as u64) << 16 | u64::from(status);
    gw.metrics.requests.inc_keyed(key, format_args!("route=\"{}\",status=\"{}\"", route.label(), status));
}

/// The span a proxied request runs in; `forward` fills in the decision.
/// Debug level (`RUST_LOG=gateway=debug`): at info, recording it cost about
/// 8 µs a request, a sixth of what the router adds (docs/benchmarks.md).
pub(crate) fn request_span(gw: &Gateway, route: Route) -> Span {
    debug_span!(
        "request",
        route = route.label(),
        request_id = tracing::field::Empty,
        policy = gw.default_pool().policy.name(),
        worker = tracing::field::Empty,
        matched_tokens = tracing::field::Empty,
        reason = tracing::field::Empty
    )
}

/// Counts (and logs, by side) a request that failed before any answer from a worker.
pub(crate) fn count_error(gw: &Gateway, route: Route, e: &GatewayError, id: Option<&str>) {
    gw.metrics.requests.inc(format_args!("route=\"{}\",status=\"{}\"", route.label(), e.status().as_u16()));
    let side = e.side();
    gw.metrics.errors.inc(format_args!("side=\"{}\",type=\"{}\"", side.as_str(), e.kind()));
    // A worker's or our own failure is worth a line; refusals and load shedding are not (at that rate).
    match e {
        GatewayError::Upstream { .. } | GatewayError::Timeout(_) | GatewayError::Internal(_) => {
            warn!(request_id = id, route = route.label(), kind = e.kind(), side = side.as_str(), error = %e, "request failed");
        }
        _ => {
            debug!(request_id = id, route = route.label(), kind = e.kind(), side = side.as_str(), error = %e, "request refused")
        }
    }
}
