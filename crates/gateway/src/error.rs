//! The gateway's errors and their one mapping to HTTP: OpenAI-style JSON
//! `{"error": {"message", "type", "code"}}` with a precise status.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Everything a request can fail with.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The body is not JSON or misses fields (400).
    #[error("{0}")]
    BadRequest(String),
    /// The body is over the size limit (413).
    #[error("request body larger than {0} bytes")]
    TooLarge(usize),
    /// No healthy worker (503).
    #[error("no healthy worker")]
    NoWorker,
    /// Too many requests in flight (429).
    #[error("too many requests in flight (limit {0})")]
    Overloaded(usize),
    /// The worker could not be reached (502).
    #[error("upstream worker {worker} unreachable: {message}")]
    Upstream {
        /// The worker.
        worker: String,
        /// Why.
        message: String,
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
}

// === impl GatewayError ===

impl GatewayError {
    /// A stable label (metrics, logs, JSON `error.type`).
    pub fn kind(&self) -> &'static str {
        match self {
            GatewayError::BadRequest(_) => "invalid_request_error",
            GatewayError::TooLarge(_) => "request_too_large",
            GatewayError::NoWorker => "no_healthy_worker",
            GatewayError::Overloaded(_) => "overloaded",
            GatewayError::Upstream { .. } => "upstream_unreachable",
            GatewayError::Timeout(_) => "upstream_timeout",
            GatewayError::NotFound(_) => "not_found",
            GatewayError::Unprocessable(_) => "unprocessable",
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            GatewayError::BadRequest(_) => StatusCode::BAD_REQUEST,
            GatewayError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            GatewayError::NoWorker => StatusCode::SERVICE_UNAVAILABLE,
            GatewayError::Overloaded(_) => StatusCode::TOO_MANY_REQUESTS,
            GatewayError::Upstream { .. } => StatusCode::BAD_GATEWAY,
            GatewayError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            GatewayError::NotFound(_) => StatusCode::NOT_FOUND,
            GatewayError::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
        }
    }
}

impl GatewayError {
    /// The JSON body of the error answer.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.to_string(), "type": self.kind(), "code": self.status().as_u16()}})
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        (self.status(), Json(self.body())).into_response()
    }
}

impl From<renderer::RenderError> for GatewayError {
    fn from(e: renderer::RenderError) -> Self {
        GatewayError::BadRequest(e.to_string())
    }
}
