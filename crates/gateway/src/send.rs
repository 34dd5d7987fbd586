//! Sending one request to one worker over hyper's pooled client (the
//! disaggregated legs): the worker's URL and path, the client's
//! end-to-end headers made the worker's, the router's rank hint.

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use router_types::DpRank;

use crate::Gateway;
use crate::auth::worker_credentials;
use crate::error::describe;
use crate::request::{RANK_HEADER, forwarded};
use fleet::Worker;

/// Why a request could not be delivered to a worker.
#[derive(Debug)]
pub(crate) struct SendError {
    /// Nothing reached the worker (it may be retried elsewhere).
    pub(crate) connect: bool,
    pub(crate) message: String,
}

/// POSTs a JSON `body` to `path` on `worker` with the client's (prepared)
/// `headers`, and the router's rank hint, which wins over one the client sent.
pub(crate) async fn send_to(
    client: &crate::UpstreamClient,
    headers: &HeaderMap,
    worker: &Worker,
    path: &str,
    body: Bytes,
    rank: Option<DpRank>,
) -> Result<axum::http::Response<hyper::body::Incoming>, SendError> {
    let Some(endpoint) = worker.endpoint(path) else {
        return Err(SendError { connect: false, message: "invalid worker URL".into() });
    };
    let mut req = axum::http::Request::post(endpoint);
    if let Some(h) = req.headers_mut() {
        h.clone_from(headers);
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(rank) = rank {
            h.insert(RANK_HEADER, HeaderValue::from(rank.0));
        }
    }
    let req =
        req.body(http_body_util::Full::new(body)).map_err(|e| SendError { connect: false, message: e.to_string() })?;
    client.request(req).await.map_err(|e| SendError { connect: e.is_connect(), message: describe(&e) })
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
