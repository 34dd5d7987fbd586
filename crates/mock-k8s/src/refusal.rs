//! Why the mock API server refuses a request, and the one mapping of a
//! refusal to an HTTP status and a Kubernetes `Status` object (also what a
//! watch's `ERROR` event carries). Deciding to refuse is `http.rs`'s and
//! `watch.rs`'s; this module only names and answers.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::store::VersionError;

/// The message of a continue token too old to resume, as the real server words it.
const EXPIRED_CONTINUE: &str = "The provided continue parameter is too old to display a consistent list result. \
     You can start a new list without the continue parameter.";

/// Why a request is refused; each is answered as a `Status` object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No or a wrong bearer token: 401.
    Unauthorized,
    /// A malformed parameter: 400.
    BadRequest(String),
    /// Not a route, or no such object: 404.
    NotFound,
    /// Not a GET (nor a status PATCH): 405.
    MethodNotAllowed,
    /// A status PATCH that is not a JSON merge patch: 415.
    UnsupportedMediaType(String),
    /// A version compacted away: 410 `Expired`; `continued` when it came in a continue token.
    Expired { requested: u64, oldest: u64, continued: bool },
    /// A version not reached yet: 504 `Timeout`.
    TooLarge { requested: u64, current: u64 },
}

/// A `Status` object (`kind: Status`) with `status: Failure`.
fn status_json(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

// === impl Refusal ===

impl Refusal {
    pub(crate) fn version(e: VersionError, continued: bool) -> Self {
        match e {
            VersionError::TooOld { requested, oldest } => Refusal::Expired { requested, oldest, continued },
            VersionError::TooLarge { requested, current } => Refusal::TooLarge { requested, current },
        }
    }

    /// The HTTP status and the `Status` reason.
    fn code(&self) -> (StatusCode, &'static str) {
        match self {
            Refusal::Unauthorized => (StatusCode::UNAUTHORIZED, "Unauthorized"),
            Refusal::BadRequest(_) => (StatusCode::BAD_REQUEST, "BadRequest"),
            Refusal::NotFound => (StatusCode::NOT_FOUND, "NotFound"),
            Refusal::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed"),
            Refusal::UnsupportedMediaType(_) => (StatusCode::UNSUPPORTED_MEDIA_TYPE, "UnsupportedMediaType"),
            Refusal::Expired { .. } => (StatusCode::GONE, "Expired"),
            Refusal::TooLarge { .. } => (StatusCode::GATEWAY_TIMEOUT, "Timeout"),
        }
    }

    /// The `Status` object for this refusal (also what a watch's `ERROR` event carries).
    pub(crate) fn status(&self) -> Value {
        let message = match self {
            Refusal::Unauthorized => "Unauthorized".to_owned(),
            Refusal::BadRequest(why) => why.clone(),
            Refusal::NotFound => "the server could not find the requested resource".to_owned(),
            Refusal::MethodNotAllowed => "the server does not allow this method on the requested resource".to_owned(),
            Refusal::UnsupportedMediaType(given) => {
                format!("the body of the request was in an unknown format: {given}")
            }
            Refusal::Expired { continued: true, .. } => EXPIRED_CONTINUE.to_owned(),
            Refusal::Expired { requested, oldest, .. } => format!("too old resource version: {requested} ({oldest})"),
            Refusal::TooLarge { requested, current } => {
                format!("Too large resource version: {requested}, current: {current}")
            }
        };
        let (code, reason) = self.code();
        status_json(code.as_u16(), reason, &message)
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (code, _) = self.code();
        (code, [(header::CONTENT_TYPE, "application/json")], self.status().to_string()).into_response()
    }
}
