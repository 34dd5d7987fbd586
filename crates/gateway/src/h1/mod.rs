//! The gateway's HTTP/1.1 front end: the accept loop and, per connection, a
//! hand-written fast path for the proxied routes. A `POST` to a proxied route
//! with a sized body is read, routed, forwarded over a pooled upstream
//! connection and relayed back in this one task, with no per-request hyper or
//! tower machinery; that is most of what separates a proxy from a bare
//! socket copy (see docs/benchmarks.md, "Router overhead"). Anything else
//! (other routes, chunked or HTTP/1.0 requests, upgrades, malformed heads)
//! hands the connection, with the bytes already read, to axum and hyper.

mod chunked;
mod upstream;

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, warn};

use crate::proxy::{RANK_HEADER, Route, count_error, forward, forwarded, request_span};
use crate::{Gateway, GatewayError};

/// Largest request head the fast path reads; a larger one goes to hyper (which refuses it).
const MAX_HEAD_BYTES: usize = 64 << 10;
/// Most headers the fast path parses; more go to hyper.
const MAX_HEADERS: usize = 64;
/// Pipelined bytes buffered while a request waits for its worker.
const MAX_PIPELINED_BYTES: usize = 1 << 20;

/// Serves the gateway's routes on `listener` until `drain` is cancelled and
/// every open connection is done. With `fast`, proxied requests take the fast
/// path; without it every request goes through axum.
pub async fn serve(listener: TcpListener, gw: Arc<Gateway>, fast: bool, drain: CancellationToken) -> io::Result<()> {
    let app = crate::proxy::router(gw.clone());
    let tracker = TaskTracker::new();
    tracker.spawn(timer_anchor(gw.config.request_timeout, drain.clone()));
    loop {
        let tcp = tokio::select! {
            r = listener.accept() => match r {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of descriptors and the like: wait, keep serving the open connections.
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = drain.cancelled() => break,
        };
        // Small answers go out at once (no Nagle delay behind an unacknowledged write).
        let _ = tcp.set_nodelay(true);
        tracker.spawn(connection(gw.clone(), app.clone(), tcp, fast, drain.clone()));
    }
    drop(listener);
    tracker.close();
    tracker.wait().await;
    Ok(())
}

/// Keeps a timer pending on this runtime that is due before any request's
/// timeout. Tokio wakes its own (even a running) driver through an eventfd
/// whenever a timer is registered that is due before every other one; with
/// this anchor in place, a request's timeout never is, which saves a system
/// call and a spurious poll per request. Each time it fires it also closes
/// this thread's upstream connections that have been idle too long.
async fn timer_anchor(request_timeout: Duration, drain: CancellationToken) {
    let period = (request_timeout / 2).clamp(Duration::from_millis(10), Duration::from_secs(60));
    loop {
        tokio::select! {
            () = tokio::time::sleep(period) => upstream::sweep_idle(Instant::now()),
            () = drain.cancelled() => return,
        }
    }
}

/// What the fast path needs of a proxied request's head.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Head {
    route: Route,
    /// Bytes of the head, blank line included.
    len: usize,
    body_len: usize,
    /// The client asked to close after this request.
    close: bool,
    /// The client waits for `100 Continue` before sending the body.
    expect_continue: bool,
    /// The end-to-end headers for the worker, as `name: value\r\n` lines
    /// (the rank hint apart).
    forward: Vec<u8>,
    /// The client's data-parallel rank hint, used when the router has none.
    rank: Option<Vec<u8>>,
    /// The client's `Authorization` value: a client key to check
    /// (`--client-api-keys`), or its own credentials for the worker.
    authorization: Option<Vec<u8>>,
}

/// Who serves the request at the front of the buffer.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    Fast(Head),
    /// Not for the fast path: hyper serves the rest of the connection.
    Hyper,
}

/// Reads the request head at the front of `buf`; `None` while incomplete.
fn parse_head(buf: &[u8]) -> Option<Next> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() <= MAX_HEAD_BYTES => return None,
        _ => return Some(Next::Hyper),
    };
    let route = match (req.method, req.version, req.path.and_then(Route::from_path)) {
        (Some("POST"), Some(1), Some(route)) => route,
        _ => return Some(Next::Hyper),
    };
    // Every `connection` header's tokens: options for this hop, and the headers that are hop-only.
    let connection = req.headers.iter().filter(|h| h.name.eq_ignore_ascii_case("connection"));
    let connection: Vec<&str> = connection.filter_map(|h| std::str::from_utf8(h.value).ok()).collect();
    let connection = connection.join(",");
    let option = |o: &str| connection.split(',').any(|t| t.trim().eq_ignore_ascii_case(o));
    if option("upgrade") {
        return Some(Next::Hyper);
    }
    let close = option("close");
    let (mut body_len, mut expect_continue) = (None, false);
    let (mut forward, mut rank, mut authorization) = (Vec::new(), None, None);
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case(RANK_HEADER) {
            rank = Some(h.value.to_vec());
        } else if h.name.eq_ignore_ascii_case("authorization") {
            // Two credentials are one too many: hyper answers (400).
            if authorization.replace(h.value.to_vec()).is_some() {
                return Some(Next::Hyper);
            }
        } else if forwarded(h.name, &connection) {
            push_header(&mut forward, h.name.as_bytes(), h.value);
        }
        let value = std::str::from_utf8(h.value).unwrap_or("\u{0}").trim();
        if h.name.eq_ignore_ascii_case("content-length") {
            match (body_len, content_length(value).and_then(|n| usize::try_from(n).ok())) {
                (None, Some(n)) => body_len = Some(n),
                _ => return Some(Next::Hyper),
            }
        } else if h.name.eq_ignore_ascii_case("expect") && value.eq_ignore_ascii_case("100-continue") {
            expect_continue = true;
        } else if ["transfer-encoding", "expect", "upgrade"].iter().any(|n| h.name.eq_ignore_ascii_case(n)) {
            return Some(Next::Hyper);
        }
    }
    // No length (an empty body, or a chunked one refused above): hyper decides.
    let Some(body_len) = body_len else { return Some(Next::Hyper) };
    Some(Next::Fast(Head { route, len, body_len, close, expect_continue, forward, rank, authorization }))
}

/// A `Content-Length` value: digits only (`+5` or `5 5`, which a lenient
/// parser would take, could make this hop and another disagree on where a
/// message ends).
pub(crate) fn content_length(value: &str) -> Option<u64> {
    if value.is_empty() || value.len() > 19 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

/// Appends a header line, `name: value\r\n`.
pub(crate) fn push_header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Reads more of `tcp` into `buf`; 0 at end of stream.
async fn fill(tcp: &mut TcpStream, buf: &mut BytesMut) -> io::Result<usize> {
    if buf.capacity() - buf.len() < 4096 {
        buf.reserve(8192);
    }
    tcp.read_buf(buf).await
}

/// One client connection: fast-path requests until one is not, then hyper for the rest.
async fn connection(gw: Arc<Gateway>, app: axum::Router, mut tcp: TcpStream, fast: bool, drain: CancellationToken) {
    let mut buf = BytesMut::with_capacity(8192);
    if fast {
        loop {
            let next = loop {
                if !buf.is_empty()
                    && let Some(next) = parse_head(&buf)
                {
                    break next;
                }
                let read = if buf.is_empty() {
                    // Idle between requests: a drain closes the connection here.
                    tokio::select! {
                        r = fill(&mut tcp, &mut buf) => r,
                        () = drain.cancelled() => return,
                    }
                } else {
                    fill(&mut tcp, &mut buf).await
                };
                if !matches!(read, Ok(n) if n > 0) {
                    return;
                }
            };
            let Next::Fast(head) = next else { break };
            buf.advance(head.len);
            if !serve_fast(&gw, &mut tcp, &mut buf, head, &drain).await {
                return;
            }
        }
    }
    hand_off(app, tcp, buf.freeze(), drain).await;
}

/// Serves one fast-path request; false when the connection must close.
async fn serve_fast(
    gw: &Arc<Gateway>,
    tcp: &mut TcpStream,
    buf: &mut BytesMut,
    head: Head,
    drain: &CancellationToken,
) -> bool {
    let start = Instant::now();
    let route = head.route;
    if head.body_len > gw.config.max_body_bytes {
        // The body is not read: answer and close.
        let e = GatewayError::TooLarge(gw.config.max_body_bytes);
        count_error(gw, route, &e);
        if write_error(tcp, &e, true).await.is_ok() {
            linger(tcp).await;
        }
        return false;
    }
    // A client without a valid key gets no further: its body is not read.
    let worker_auth = match crate::proxy::worker_authorization(gw, head.authorization.as_deref()) {
        Ok(auth) => auth,
        Err(e) => {
            count_error(gw, route, &e);
            if write_error(tcp, &e, true).await.is_ok() {
                linger(tcp).await;
            }
            return false;
        }
    };
    if head.expect_continue
        && buf.len() < head.body_len
        && tcp.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await.is_err()
    {
        return false;
    }
    while buf.len() < head.body_len {
        // Room past the body: a read that ends short of the buffer's end tells
        // tokio the socket is drained, so the next poll of it (waiting for a
        // hang-up) costs no system call.
        buf.reserve(head.body_len - buf.len() + 4096);
        if !matches!(tcp.read_buf(buf).await, Ok(n) if n > 0) {
            return false;
        }
    }
    let body = buf.split_to(head.body_len).freeze();
    let close = head.close || drain.is_cancelled();
    let mut headers = head.forward;
    if let Some(auth) = worker_auth {
        push_header(&mut headers, b"authorization", &auth);
    }
    let extra = upstream::Extra { headers: Bytes::from(headers), rank: head.rank.map(Bytes::from) };
    async move {
        let send = |worker, body, rank| upstream::send(worker, route, body, rank, extra.clone());
        let sent = tokio::select! {
            sent = forward(gw, route, body, start, send) => sent,
            // A client that goes away drops its upstream request.
            () = client_gone(tcp, buf) => return false,
        };
        match sent {
            Ok((guard, worker, answer)) => upstream::relay(tcp, guard, worker, answer, close).await && !close,
            Err(e) => {
                count_error(gw, route, &e);
                write_error(tcp, &e, close).await.is_ok() && !close
            }
        }
    }
    .instrument(request_span(gw, route))
    .await
}

/// Resolves when the client closes its side; bytes it pipelines meanwhile are kept.
async fn client_gone(tcp: &mut TcpStream, buf: &mut BytesMut) {
    while buf.len() < MAX_PIPELINED_BYTES {
        if !matches!(fill(tcp, buf).await, Ok(n) if n > 0) {
            return;
        }
    }
    std::future::pending::<()>().await;
}

/// Closes our side and reads what the client still sends (the body of a
/// refused request) for up to a second, so its socket does not answer the
/// data with a reset that could destroy the answer before the client reads it.
async fn linger(tcp: &mut TcpStream) {
    if tcp.shutdown().await.is_err() {
        return;
    }
    let mut sink = [0u8; 16384];
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while matches!(tcp.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// Writes a gateway error as the OpenAI-style JSON answer.
async fn write_error(tcp: &mut TcpStream, e: &GatewayError, close: bool) -> io::Result<()> {
    let body = e.body().to_string();
    let status = e.status();
    let head = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{}{}\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len(),
        e.extra_head(),
        if close { "connection: close\r\n" } else { "" }
    );
    let mut out = head.into_bytes();
    out.extend_from_slice(body.as_bytes());
    tcp.write_all(&out).await
}

/// Lets hyper serve the rest of a connection, starting with the bytes already read.
async fn hand_off(app: axum::Router, tcp: TcpStream, read: Bytes, drain: CancellationToken) {
    let io = hyper_util::rt::TokioIo::new(Prefixed { read, tcp });
    let service = hyper_util::service::TowerToHyperService::new(app);
    let conn = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        () = drain.cancelled() => conn.as_mut().graceful_shutdown(),
    }
    let _ = conn.await;
}

/// A connection whose first bytes were already read.
#[derive(Debug)]
struct Prefixed {
    read: Bytes,
    tcp: TcpStream,
}

impl AsyncRead for Prefixed {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.read.is_empty() {
            return Pin::new(&mut this.tcp).poll_read(cx, buf);
        }
        let n = this.read.len().min(buf.remaining());
        buf.put_slice(&this.read.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fast(raw: &str) -> Head {
        match parse_head(raw.as_bytes()) {
            Some(Next::Fast(h)) => h,
            other => panic!("{raw:?}: {other:?}"),
        }
    }

    #[test]
    fn proxied_posts_with_a_length_take_the_fast_path() {
        let raw = "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 12\r\n\r\n{\"messages\"";
        let h = fast(raw);
        assert_eq!(
            (h.route, h.len, h.body_len, h.close, h.expect_continue),
            (Route::Chat, raw.len() - 11, 12, false, false)
        );
        let h = fast(
            "POST /generate HTTP/1.1\r\ncontent-length: 0\r\nConnection: keep-alive, Close\r\nExpect: 100-continue\r\n\r\n",
        );
        assert_eq!((h.route, h.close, h.expect_continue), (Route::Generate, true, true));
        assert_eq!(fast("POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\n\r\n").route, Route::Completions);
    }

    #[test]
    fn an_incomplete_head_waits_for_more() {
        assert_eq!(parse_head(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Len"), None);
        assert_eq!(parse_head(b"POS"), None);
    }

    #[test]
    fn everything_else_goes_to_hyper() {
        for raw in [
            "GET /metrics HTTP/1.1\r\n\r\n",
            "POST /v1/chat/completions HTTP/1.0\r\nContent-Length: 2\r\n\r\n",
            "POST /v1/chat/completions?x=1 HTTP/1.1\r\nContent-Length: 2\r\n\r\n",
            "POST /debug/route HTTP/1.1\r\nContent-Length: 2\r\n\r\n",
            "POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST /v1/chat/completions HTTP/1.1\r\n\r\n",
            "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n",
            "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: x\r\n\r\n",
            "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: +2\r\n\r\n",
            "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2, 2\r\n\r\n",
            "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
            "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\nExpect: something\r\n\r\n",
            "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
            "BAD\0 REQUEST\r\n\r\n",
        ] {
            assert_eq!(parse_head(raw.as_bytes()), Some(Next::Hyper), "{raw:?}");
        }
        let huge = format!("POST /v1/chat/completions HTTP/1.1\r\nx: {}", "a".repeat(MAX_HEAD_BYTES));
        assert_eq!(parse_head(huge.as_bytes()), Some(Next::Hyper));
        let many: String = (0..=MAX_HEADERS).map(|i| format!("h{i}: v\r\n")).collect();
        let raw = format!("POST /generate HTTP/1.1\r\nContent-Length: 2\r\n{many}\r\n");
        assert_eq!(parse_head(raw.as_bytes()), Some(Next::Hyper));
    }
}
