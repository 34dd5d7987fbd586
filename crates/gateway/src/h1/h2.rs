//! HTTP/2 towards the workers (`--upstream-http2`, SMG's semantics): h2c by
//! prior knowledge on cleartext, ALPN `h2` in TLS (`https://` workers; one
//! that chooses `http/1.1` stays on it), every request to a worker multiplexed over
//! one connection per serving thread (a per-thread map, as the HTTP/1.1 idle
//! pool is). Whether a worker speaks it is asked once, with a `GET /health`
//! under the connect deadline; one that does not answer HTTP/2 stays on
//! HTTP/1.1 (the answer is kept on its fleet entry, dropped with it). An
//! answer's head is made the relay's [`AnswerHead`]: its length when it
//! declares one, else its end of stream ends it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, Request, Uri, header};
use h1_codec::{AnswerHead, Framing};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::send::SendError;
use crate::tls::Conn;

/// The sending half of a connection to a worker.
type Sender = SendRequest<Full<Bytes>>;

thread_local! {
    /// This thread's connection to each worker (by authority), and when it was last used.
    static CONNECTIONS: RefCell<HashMap<String, (Sender, Instant)>> = RefCell::new(HashMap::new());
}

/// Headers HTTP/2 forbids (RFC 9113 §8.2.2) or carries as pseudo-headers.
const NOT_IN_H2: [&str; 7] =
    ["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "host"];

/// Whether the worker at `base` (`http://authority` or `https://authority`) answers HTTP/2: by
/// prior knowledge in the clear, chosen by ALPN in TLS; then a `GET /health` on the new
/// connection, answered with any status within `deadline`. A worker that cannot be reached at all
/// is an error (nothing learned); one that answers otherwise, or not in time, does not speak it.
pub(super) async fn probe<C, Fut>(base: &str, deadline: Duration, connect: C) -> Result<bool, SendError>
where
    C: FnOnce() -> Fut,
    Fut: Future<Output = Result<Conn, SendError>>,
{
    let tcp = connect().await?;
    if matches!(tcp, Conn::Tls(_)) && !tcp.chose_h2() {
        return Ok(false);
    }
    let authority = base.split_once("://").map_or(base, |(_, a)| a);
    let key = if base.starts_with("https://") { base } else { authority };
    let asked = async {
        let mut sender = handshake(tcp).await.ok()?;
        let uri: Uri = format!("{base}/health").parse().ok()?;
        let request = Request::get(uri).body(Full::new(Bytes::new())).ok()?;
        sender.ready().await.ok()?;
        let answer = sender.send_request(request).await.ok()?;
        drop(answer);
        Some(sender)
    };
    match tokio::time::timeout(deadline, asked).await {
        Ok(Some(sender)) => {
            keep(key, sender);
            Ok(true)
        }
        Ok(None) | Err(_) => Ok(false),
    }
}

/// Sends `POST uri` with `headers` and `body` on this thread's connection to `authority` (a new
/// one when there is none, it closed, or it sat idle past `max_idle`), and returns the answer's
/// head as the relay reads it, with its body. A request refused before it was sent (the
/// connection had closed under it) is sent once more on a new connection.
pub(super) async fn send<C, Fut>(
    authority: &str,
    (uri, headers, body): (Uri, HeaderMap, Bytes),
    max_idle: Duration,
    connect: C,
) -> Result<(AnswerHead, Incoming), SendError>
where
    C: Fn() -> Fut,
    Fut: Future<Output = Result<Conn, SendError>>,
{
    let mut pooled = checkout(authority, max_idle);
    loop {
        let reused = pooled.is_some();
        let mut sender = match pooled.take() {
            Some(sender) => sender,
            None => {
                let conn = connect().await?;
                if matches!(conn, Conn::Tls(_)) && !conn.chose_h2() {
                    let message = "the worker no longer chooses HTTP/2 (ALPN)".to_owned();
                    return Err(SendError { connect: true, message });
                }
                let sender = handshake(conn).await?;
                keep(authority, sender.clone());
                sender
            }
        };
        let mut request = Request::post(uri.clone())
            .body(Full::new(body.clone()))
            .map_err(|e| SendError { connect: true, message: format!("invalid request for HTTP/2: {e}") })?;
        *request.headers_mut() = headers.clone();
        let sent = async {
            sender.ready().await?;
            sender.send_request(request).await
        };
        match sent.await {
            Ok(answer) => {
                let (parts, body) = answer.into_parts();
                return Ok((head(parts.status.as_u16(), &parts.headers), body));
            }
            // The connection went before the request did: nothing reached the worker.
            Err(e) if e.is_canceled() || e.is_closed() => {
                CONNECTIONS.with_borrow_mut(|c| c.remove(authority));
                if reused {
                    continue;
                }
                return Err(SendError { connect: true, message: format!("HTTP/2 connection closed: {e}") });
            }
            Err(e) => return Err(SendError { connect: false, message: format!("HTTP/2: {e}") }),
        }
    }
}

/// The headers a request carries over HTTP/2: `lines` (`name: value\r\n`, the client's
/// end-to-end headers made the worker's) without those HTTP/2 leaves out, and the body's type.
pub(super) fn request_headers(lines: &[u8], rank: Option<(&str, &[u8])>) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(8);
    headers.insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    for (name, value) in crate::pipeline::request::header_lines(lines) {
        let (Ok(name), Ok(value)) = (header::HeaderName::from_bytes(name), header::HeaderValue::from_bytes(value))
        else {
            continue;
        };
        if !NOT_IN_H2.contains(&name.as_str()) && name != header::CONTENT_LENGTH {
            headers.append(name, value);
        }
    }
    if let Some((name, value)) = rank
        && let (Ok(name), Ok(value)) =
            (header::HeaderName::from_bytes(name.as_bytes()), header::HeaderValue::from_bytes(value))
    {
        headers.insert(name, value);
    }
    headers
}

/// Closes this thread's connections unused for `max_idle` at `now` (those of workers that left).
pub(super) fn sweep(now: Instant, max_idle: Duration) {
    CONNECTIONS.with_borrow_mut(|c| c.retain(|_, (_, used)| now.saturating_duration_since(*used) < max_idle));
}

/// Keeps `sender` as this thread's connection to `authority` (replacing any other).
fn keep(authority: &str, sender: Sender) {
    CONNECTIONS.with_borrow_mut(|c| c.insert(authority.to_string(), (sender, Instant::now())));
}

/// This thread's open connection to `authority`, if it was used within `max_idle`.
fn checkout(authority: &str, max_idle: Duration) -> Option<Sender> {
    CONNECTIONS.with_borrow_mut(|c| {
        let (sender, used) = c.get_mut(authority)?;
        if sender.is_closed() || used.elapsed() >= max_idle {
            c.remove(authority);
            return None;
        }
        *used = Instant::now();
        Some(sender.clone())
    })
}

/// HTTP/2 by prior knowledge on `tcp`; the connection is driven by a task of this thread.
async fn handshake(tcp: Conn) -> Result<Sender, SendError> {
    let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| SendError { connect: true, message: format!("HTTP/2 handshake: {e}") })?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "HTTP/2 connection to a worker ended");
        }
    });
    Ok(sender)
}

/// An HTTP/2 answer's head as the relay reads an HTTP/1.1 one: its end-to-end headers as lines,
/// its declared length (else its end of stream ends it).
fn head(status: u16, headers: &HeaderMap) -> AnswerHead {
    let mut lines = Vec::with_capacity(256);
    let mut length = None;
    let mut sse = false;
    for (name, value) in headers {
        if name == header::CONTENT_LENGTH {
            length = std::str::from_utf8(value.as_bytes()).ok().and_then(|v| v.trim().parse::<u64>().ok());
            continue;
        }
        if NOT_IN_H2.contains(&name.as_str()) {
            continue;
        }
        if name == header::CONTENT_TYPE {
            sse = value.as_bytes().starts_with(b"text/event-stream");
        }
        crate::pipeline::request::push_header(&mut lines, name.as_str().as_bytes(), value.as_bytes());
    }
    let framing = match length {
        _ if status == 204 || status == 304 || (100..200).contains(&status) => Framing::Empty,
        Some(n) => Framing::Length(n),
        None => Framing::Close,
    };
    AnswerHead { status, headers: lines, framing, sse, codings: String::new(), reusable: false }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_head_keeps_its_length_and_end_to_end_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        h.insert(header::CONTENT_LENGTH, "12".parse().unwrap());
        h.insert("x-engine", "e1".parse().unwrap());
        let head = head(200, &h);
        assert_eq!(head.framing, Framing::Length(12));
        assert!(!head.sse && !head.reusable);
        let lines = String::from_utf8(head.headers).unwrap();
        assert_eq!(lines, "content-type: application/json\r\nx-engine: e1\r\n");
        let mut s = HeaderMap::new();
        s.insert(header::CONTENT_TYPE, "text/event-stream".parse().unwrap());
        let stream = super::head(200, &s);
        assert_eq!(stream.framing, Framing::Close, "its end of stream ends it");
        assert!(stream.sse);
        assert_eq!(super::head(204, &HeaderMap::new()).framing, Framing::Empty);
    }

    #[test]
    fn a_request_leaves_out_what_http2_forbids_and_the_routers_rank_wins() {
        let lines = b"host: w:1\r\nconnection: keep-alive\r\nx-request-id: r1\r\nte: trailers\r\ncontent-length: 3\r\nx-data-parallel-rank: 0\r\n";
        let h = request_headers(lines, Some(("x-data-parallel-rank", b"2")));
        assert_eq!(h.get("x-request-id").unwrap(), "r1");
        assert_eq!(h.get("x-data-parallel-rank").unwrap(), "2");
        assert_eq!(h.get(header::CONTENT_TYPE).unwrap(), "application/json");
        for gone in ["host", "connection", "te", "content-length"] {
            assert!(h.get(gone).is_none(), "{gone}");
        }
    }
}
