//! The gateway's errors and their one mapping to HTTP: OpenAI-style JSON
//! `{"error": {"message", "type", "code"}}` with a precise status, a
//! `Retry-After` on the answers that invite a retry (429, 503), and for each
//! error the side that caused it (the client, a worker, or the router itself)
//! and whether another worker might succeed.

use axum::Json;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use h1_codec::Route;
use serde_json::json;

/// Seconds a client is told to wait before retrying a 429 or 503.
pub const RETRY_AFTER_SECS: u32 = 1;

/// Everything a request can fail with.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The body is not JSON or misses fields (400).
    #[error("{0}")]
    BadRequest(String),
    /// No or a wrong bearer key (401).
    #[error("{0}")]
    Unauthorized(String),
    /// The route is closed to everyone (403).
    #[error("{0}")]
    Forbidden(String),
    /// The client was too slow sending its request (408).
    #[error("{0}")]
    ClientTimeout(String),
    /// The request line is longer than the head limit (414).
    #[error("{0}")]
    UriTooLong(String),
    /// The head is over the size or header-count limit (431).
    #[error("{0}")]
    HeaderFieldsTooLarge(String),
    /// The body is over the size limit (413).
    #[error("request body larger than {0} bytes")]
    TooLarge(usize),
    /// No healthy worker (503).
    #[error("no healthy worker")]
    NoWorker,
    /// Every worker the request could use is overloaded and such requests are
    /// shed (`--worker-overload-shed`, 503).
    #[error("every worker that could serve the request is overloaded (worker overload protection); retry shortly")]
    WorkersOverloaded,
    /// Every worker's reported waiting queue stayed at `--least-load-max-waiting-requests` for
    /// the request's `--queue-timeout-secs` (503).
    #[error("every worker's waiting queue is at --least-load-max-waiting-requests (waited {0:?}); retry shortly")]
    AtWaitingCap(std::time::Duration),
    /// A higher priority class took this request's place in the queue before it was sent (503).
    #[error("preempted by a higher priority class before it was sent (its class: {0}); retry shortly")]
    Preempted(&'static str),
    /// Over the tenant's requests or prompt tokens per minute (429; `Retry-After` when it fits).
    #[error("over the tenant's rate limit; retry in {0} s")]
    TenantRateLimited(u32),
    /// The priority class's queue is full (429).
    #[error("too many requests of class {0} waiting")]
    ClassQueueFull(&'static str),
    /// The router is shutting down (503).
    #[error("the router is shutting down")]
    Draining,
    /// Too many requests in flight (429).
    #[error("too many requests in flight (limit {0})")]
    Overloaded(usize),
    /// Every slot is taken and the queue for one is full (429).
    #[error("too many requests in flight (limit {0}) and the queue is full ({1} waiting)")]
    QueueFull(usize, usize),
    /// Over `--rate-limit-tokens-per-second` (429).
    #[error("over the rate limit of {0} requests a second")]
    RateLimited(u32),
    /// Feedback over a caller's rate or weight (429).
    #[error("{0}")]
    FeedbackLimited(String),
    /// The request waited its whole `--queue-timeout-secs` for a slot (408).
    #[error("no slot for the request within {0:?} (too many requests in flight)")]
    QueueTimeout(std::time::Duration),
    /// The bytes of requests in progress would exceed the memory budget (429).
    #[error("the router's memory budget for requests in progress ({0} bytes) is spent; retry shortly")]
    OverBudget(usize),
    /// The request names a model no pool serves (400, OpenAI's `model_not_found`).
    #[error("The model `{0}` does not exist")]
    UnknownModel(String),
    /// A decision's `block` plugin refused it (its status).
    #[error("{message}")]
    Blocked {
        /// The answer's status (400..=599).
        status: u16,
        /// The plugin's message.
        message: String,
        /// The decision that blocked it.
        decision: String,
    },
    /// No pool of the decision can serve the request (503).
    #[error("{0}")]
    NoPool(String),
    /// The worker could not be reached (502).
    #[error("upstream worker {worker} unreachable: {message}")]
    Upstream {
        /// The worker.
        worker: String,
        /// Why.
        message: String,
        /// Nothing reached the worker: another worker may serve it.
        retryable: bool,
    },
    /// The worker did not answer in time (504).
    #[error("upstream worker {0} timed out")]
    Timeout(String),
    /// A well-formed request that cannot be carried out (422).
    #[error("{0}")]
    Unprocessable(String),
    /// Unknown route (404).
    #[error("no route for {0}")]
    NotFound(String),
    /// A known route called with the wrong method (405).
    #[error("method not allowed: {0}")]
    MethodNotAllowed(String),
    /// The router's own fault: its template or tokenizer failed on a valid request (500).
    #[error("{0}")]
    Internal(String),
    /// A control-plane resource this router cannot give now (503: an index snapshot
    /// without events, or while its pump is busy).
    #[error("{0}")]
    Unavailable(String),
}

/// Who caused an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The request, or its sender.
    Client,
    /// A worker, or the way to it.
    Upstream,
    /// The router itself (configuration, load, a bug).
    Internal,
}

// === impl Side ===

impl Side {
    /// A stable label (metrics, logs).
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Upstream => "upstream",
            Side::Internal => "internal",
        }
    }
}

// === impl GatewayError ===

impl GatewayError {
    /// A stable label (metrics, logs, JSON `error.type`).
    pub fn kind(&self) -> &'static str {
        match self {
            GatewayError::BadRequest(_) => "invalid_request_error",
            GatewayError::Unauthorized(_) => "authentication_error",
            GatewayError::Forbidden(_) => "permission_error",
            GatewayError::ClientTimeout(_) => "request_timeout",
            GatewayError::UriTooLong(_) => "uri_too_long",
            GatewayError::HeaderFieldsTooLarge(_) => "request_header_fields_too_large",
            GatewayError::TooLarge(_) => "request_too_large",
            GatewayError::NoWorker => "no_healthy_worker",
            GatewayError::WorkersOverloaded => "worker_overload_protection_shed",
            GatewayError::AtWaitingCap(_) => "worker_waiting_queue_cap",
            GatewayError::Preempted(_) => "preempted",
            GatewayError::ClassQueueFull(_) => "queue_full",
            GatewayError::TenantRateLimited(_) => "tenant_rate_limit_exceeded",
            GatewayError::UnknownModel(_) => "invalid_request_error",
            GatewayError::Blocked { .. } => "blocked_by_policy",
            GatewayError::NoPool(_) => "no_pool_available",
            GatewayError::Draining => "shutting_down",
            GatewayError::Overloaded(_) => "overloaded",
            GatewayError::OverBudget(_) => "memory_budget_exceeded",
            GatewayError::QueueFull(..) => "queue_full",
            GatewayError::RateLimited(_) => "rate_limited",
            GatewayError::FeedbackLimited(_) => "feedback_limited",
            GatewayError::QueueTimeout(_) => "queue_timeout",
            GatewayError::Upstream { .. } => "upstream_unreachable",
            GatewayError::Timeout(_) => "upstream_timeout",
            GatewayError::NotFound(_) => "not_found",
            GatewayError::MethodNotAllowed(_) => "method_not_allowed",
            GatewayError::Unprocessable(_) => "unprocessable",
            GatewayError::Internal(_) => "internal_error",
            GatewayError::Unavailable(_) => "unavailable",
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            GatewayError::BadRequest(_) => StatusCode::BAD_REQUEST,
            GatewayError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            GatewayError::Forbidden(_) => StatusCode::FORBIDDEN,
            GatewayError::ClientTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            GatewayError::UriTooLong(_) => StatusCode::URI_TOO_LONG,
            GatewayError::HeaderFieldsTooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            GatewayError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            GatewayError::NoWorker
            | GatewayError::WorkersOverloaded
            | GatewayError::AtWaitingCap(_)
            | GatewayError::Preempted(_)
            | GatewayError::Draining
            | GatewayError::NoPool(_)
            | GatewayError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            GatewayError::UnknownModel(_) => StatusCode::BAD_REQUEST,
            GatewayError::Blocked { status, .. } => StatusCode::from_u16(*status).unwrap_or(StatusCode::FORBIDDEN),
            GatewayError::Overloaded(_)
            | GatewayError::OverBudget(_)
            | GatewayError::ClassQueueFull(_)
            | GatewayError::TenantRateLimited(_)
            | GatewayError::QueueFull(..)
            | GatewayError::RateLimited(_)
            | GatewayError::FeedbackLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            GatewayError::QueueTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            GatewayError::Upstream { .. } => StatusCode::BAD_GATEWAY,
            GatewayError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            GatewayError::NotFound(_) => StatusCode::NOT_FOUND,
            GatewayError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            GatewayError::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            GatewayError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Who caused it.
    pub fn side(&self) -> Side {
        match self {
            GatewayError::BadRequest(_)
            | GatewayError::Unauthorized(_)
            | GatewayError::Forbidden(_)
            | GatewayError::ClientTimeout(_)
            | GatewayError::TooLarge(_)
            | GatewayError::UriTooLong(_)
            | GatewayError::HeaderFieldsTooLarge(_)
            | GatewayError::NotFound(_)
            | GatewayError::MethodNotAllowed(_)
            | GatewayError::Unprocessable(_)
            | GatewayError::UnknownModel(_)
            | GatewayError::FeedbackLimited(_)
            | GatewayError::TenantRateLimited(_)
            | GatewayError::Blocked { .. } => Side::Client,
            GatewayError::Upstream { .. } | GatewayError::Timeout(_) => Side::Upstream,
            GatewayError::NoWorker
            | GatewayError::WorkersOverloaded
            | GatewayError::AtWaitingCap(_)
            | GatewayError::Preempted(_)
            | GatewayError::ClassQueueFull(_)
            | GatewayError::Draining
            | GatewayError::Overloaded(_)
            | GatewayError::OverBudget(_)
            | GatewayError::QueueFull(..)
            | GatewayError::RateLimited(_)
            | GatewayError::QueueTimeout(_)
            | GatewayError::NoPool(_)
            | GatewayError::Unavailable(_)
            | GatewayError::Internal(_) => Side::Internal,
        }
    }

    /// Whether the same request may succeed on another worker now.
    pub fn retryable_elsewhere(&self) -> bool {
        matches!(self, GatewayError::Upstream { retryable: true, .. })
    }

    /// Seconds to put in `Retry-After`: the answers that say "not now, later".
    pub fn retry_after(&self) -> Option<u32> {
        if let GatewayError::TenantRateLimited(secs) = self {
            return Some(*secs);
        }
        matches!(self.status(), StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE)
            .then_some(RETRY_AFTER_SECS)
    }

    /// The JSON body of the error answer (an unknown model in OpenAI's own shape).
    pub fn body(&self) -> serde_json::Value {
        match self {
            GatewayError::UnknownModel(_) => json!({"error": {
                "message": self.to_string(), "type": self.kind(), "param": "model", "code": "model_not_found"
            }}),
            _ => json!({"error": {"message": self.to_string(), "type": self.kind(), "code": self.status().as_u16()}}),
        }
    }

    /// The JSON body of the error answer on `route`: Anthropic's shape on its routes
    /// (`{"type": "error", "error": {"type", "message"}}`, the type by status as SGLang maps
    /// it), else [`GatewayError::body`].
    pub fn body_for(&self, route: Option<Route>) -> serde_json::Value {
        if route.is_some_and(Route::anthropic) {
            anthropic_error(self.status().as_u16(), &self.to_string())
        } else {
            self.body()
        }
    }

    /// The error answer on `route` (hyper's front end).
    pub fn response_for(self, route: Option<Route>) -> Response {
        let body = self.body_for(route);
        let mut r = (self.status(), Json(body)).into_response();
        for (name, value) in self.extra_headers() {
            if let Ok(value) = HeaderValue::from_str(&value) {
                r.headers_mut().insert(name, value);
            }
        }
        r
    }

    /// The decision that answered, for `x-route-decision` on a blocked request.
    fn decision(&self) -> Option<&str> {
        match self {
            GatewayError::Blocked { decision, .. } => Some(decision),
            _ => None,
        }
    }

    /// The headers an error answer carries besides its content type, whichever front end
    /// writes it: `Retry-After`, `WWW-Authenticate`, the preempted class, the blocking decision.
    pub fn extra_headers(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(s) = self.retry_after() {
            out.push(("retry-after", s.to_string()));
        }
        if matches!(self, GatewayError::Unauthorized(_)) {
            out.push(("www-authenticate", "Bearer".to_owned()));
        }
        if let GatewayError::Preempted(class) = self {
            out.push((PREEMPTED_HEADER, (*class).to_owned()));
        }
        if let Some(d) = self.decision().filter(|d| d.bytes().all(|b| b.is_ascii_graphic() || b == b' ')) {
            out.push(("x-route-decision", d.to_owned()));
        }
        out
    }

    /// [`Self::extra_headers`] as header lines (`name: value\r\n`), for the HTTP/1.1 fast path.
    pub fn extra_head(&self) -> String {
        self.extra_headers().iter().map(|(name, value)| format!("{name}: {value}\r\n")).collect()
    }
}

/// The header of an answer to a request preempted in the queue: its class.
pub const PREEMPTED_HEADER: &str = "x-smg-preempted";

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        self.response_for(None)
    }
}

/// An error in Anthropic's shape: its type by HTTP status, as SGLang's Messages API maps them.
pub(crate) fn anthropic_error(status: u16, message: &str) -> serde_json::Value {
    let kind = match status {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        408 => "request_timeout_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    };
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

impl From<planner::PlanError> for GatewayError {
    fn from(e: planner::PlanError) -> Self {
        match e {
            planner::PlanError::NoWorker => GatewayError::NoWorker,
            planner::PlanError::Overloaded => GatewayError::WorkersOverloaded,
            planner::PlanError::AtWaitingCap => GatewayError::AtWaitingCap(std::time::Duration::ZERO),
            planner::PlanError::Render(e) => e.into(),
        }
    }
}

impl From<renderer::RenderError> for GatewayError {
    /// The client's mistakes are 400; a template or tokenizer that fails on a
    /// valid request is the router's own fault (500).
    fn from(e: renderer::RenderError) -> Self {
        if e.is_client_error() {
            GatewayError::BadRequest(e.to_string())
        } else {
            tracing::error!(error = %e, kind = e.kind(), "rendering failed on the router's side");
            GatewayError::Internal(format!("the router could not render this request: {e}"))
        }
    }
}

/// An error and its causes, on one line ("client error (Connect): tcp connect error: Connection refused").
pub(crate) fn describe(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::header;

    #[test]
    fn render_errors_keep_their_side() {
        let client: GatewayError = renderer::RenderError::InvalidRequest("no messages".into()).into();
        assert_eq!((client.status().as_u16(), client.side()), (400, Side::Client));
        let ours: GatewayError = renderer::RenderError::Template { message: "undefined".into(), line: 3 }.into();
        assert_eq!((ours.status().as_u16(), ours.side()), (500, Side::Internal));
        let ours: GatewayError = renderer::RenderError::Tokenizer("bad".into()).into();
        assert_eq!(ours.status().as_u16(), 500);
    }

    #[test]
    fn not_now_answers_say_when_to_retry() {
        for e in [GatewayError::Overloaded(1), GatewayError::NoWorker, GatewayError::OverBudget(1)] {
            let r = e.into_response();
            assert_eq!(r.headers().get(header::RETRY_AFTER).unwrap(), "1");
        }
        assert!(GatewayError::BadRequest("x".into()).into_response().headers().get(header::RETRY_AFTER).is_none());
        assert_eq!(GatewayError::NoWorker.extra_head(), "retry-after: 1\r\n");
    }
}
