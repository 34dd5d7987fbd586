//! What every upstream request shares, whichever front end sent it: the worker's URL and path, the client's
//! end-to-end headers made the worker's, the router's rank hint.

use axum::http::{HeaderMap, HeaderName, HeaderValue, header};

use crate::Gateway;
use crate::pipeline::auth::worker_credentials;
use crate::pipeline::request::forwarded;

/// Why a request could not be delivered to a worker.
#[derive(Debug)]
pub(crate) struct SendError {
    /// Nothing reached the worker (it may be retried elsewhere).
    pub(crate) connect: bool,
    pub(crate) message: String,
}

/// Makes a client's headers the worker's: hop-by-hop ones out, and the
/// credentials the worker gets ([`worker_credentials`]) in.
pub(crate) fn upstream_headers(gw: &Gateway, headers: &mut HeaderMap) {
    let connection: Vec<&str> = headers.get_all(header::CONNECTION).iter().filter_map(|v| v.to_str().ok()).collect();
    let connection = connection.join(",");
    let names: Vec<HeaderName> = headers.keys().cloned().collect();
    for name in names {
        if !forwarded(name.as_str(), &connection) {
            headers.remove(&name);
        }
    }
    // The client's credentials were checked by the route's layer; what the worker gets is decided here.
    let client_auth = headers.remove(header::AUTHORIZATION);
    if let Some(auth) = worker_credentials(gw, client_auth.as_ref().map(HeaderValue::as_bytes))
        && let Ok(mut v) = HeaderValue::from_bytes(&auth)
    {
        v.set_sensitive(true);
        headers.insert(header::AUTHORIZATION, v);
    }
}

/// What `forward` needs of a worker's answer head.
pub(crate) trait AnswerHead {
    /// Its status code.
    fn status(&self) -> u16;
}

impl<B> AnswerHead for axum::http::Response<B> {
    fn status(&self) -> u16 {
        self.status().as_u16()
    }
}
