//! The gateway's HTTP/1.1 front end: the accept loop and, per connection, a
//! hand-written fast path for the proxied routes. A `POST` to a proxied route
//! with a sized body is read, routed, forwarded over a pooled upstream
//! connection and relayed back in this one task, with no per-request hyper or
//! tower machinery; that is most of what separates a proxy from a bare
//! socket copy (see docs/benchmarks.md, "Router overhead"). Anything else
//! (other routes, chunked or HTTP/1.0 requests, upgrades) hands the
//! connection, with the bytes already read, to axum and hyper behind a guard
//! (`fallback`). A malformed or oversized head is refused here with a JSON
//! error (`head`), never handed to hyper.
//!
//! Every wait on a client has a deadline from [`ClientLimits`]: the head from
//! its first byte, the body from its head (both 408, then close), and an idle
//! keep-alive connection (closed without a word); the accept loop holds at
//! most `max_connections`. Each deadline is one timer per phase, registered
//! only when the phase has to wait. A client that half-closes its side after
//! a whole request is still answered; one that resets is gone at once.

pub(crate) mod answer;
mod backoff;
mod fallback;
mod h2;
mod head;
mod made;
pub(crate) mod upstream;

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, warn};

use h1_codec::{Head, Next, Refusal, Route, parse_head};

use self::head::Answer as _;
use crate::pipeline::Outcome;
use crate::pipeline::account::{count_error, request_span};
use crate::pipeline::request::{Meta, Request, Seen, push_header};
use crate::pools::cascade::CASCADE_HEADER;
use crate::{ClientLimits, Gateway, GatewayError};

/// Pipelined bytes buffered while a request waits for its worker.
const MAX_PIPELINED_BYTES: usize = 1 << 20;
/// How long a refused connection's answer may take to write.
const LINGER: Duration = Duration::from_secs(1);
/// After a refusal, how long the client may go quiet before its connection
/// closes (nginx's `lingering_timeout`), and the longest a refused connection
/// is kept taking what the client still sends (nginx's `lingering_time`):
/// long enough for a loaded client to finish writing a body it started,
/// bounded so refused connections do not pile up.
const LINGER_IDLE: Duration = Duration::from_secs(5);
const LINGER_MAX: Duration = Duration::from_secs(30);
/// Sent to a client that ended its side while its request waits for a
/// worker. A client that only half-closed still reads, and every HTTP/1.1
/// client skips an interim answer it did not ask for; one that closed
/// altogether answers it with a reset, so it is noticed as gone at once.
const PROBE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Serves the gateway's routes on `listener` until `drain` is cancelled and
/// every open connection is done. With `fast`, proxied requests take the fast
/// path; without it every request goes through axum.
pub async fn serve(listener: TcpListener, gw: Arc<Gateway>, fast: bool, drain: CancellationToken) -> io::Result<()> {
    let (app, slots) = (crate::routes::router(gw.clone()), gw.connections.clone());
    accept_loop(listener, gw, app, fast, slots, drain).await
}

/// Serves the control plane (and the probes) on a listener of its own
/// (`--admin-port`), through hyper behind the same guard as the client
/// listener's fallback (the same deadlines and JSON refusals), with its own
/// connection cap, until `drain` is cancelled and its connections are done.
pub async fn serve_admin(listener: TcpListener, gw: Arc<Gateway>, drain: CancellationToken) -> io::Result<()> {
    let app = crate::routes::admin_router(gw.clone());
    let slots = Arc::new(tokio::sync::Semaphore::new(gw.config.limits.max_connections.max(1)));
    accept_loop(listener, gw, app, false, slots, drain).await
}

/// Serves `/metrics` alone, without a key, on a listener of its own
/// (`--prometheus-port`), until `drain` is cancelled.
pub async fn serve_metrics(listener: TcpListener, gw: Arc<Gateway>, drain: CancellationToken) -> io::Result<()> {
    let app = crate::routes::metrics_router(gw.clone());
    let slots = Arc::new(tokio::sync::Semaphore::new(64));
    accept_loop(listener, gw, app, false, slots, drain).await
}

/// Serves the probes alone (`/health`, `/liveness`, `/readiness`) on `listener`
/// (`--health-check-port`), on whatever runtime calls it: the router gives it one
/// of its own, so an orchestrator's probes are answered however busy the serving
/// threads are.
pub async fn serve_probes(listener: TcpListener, gw: Arc<Gateway>, drain: CancellationToken) -> io::Result<()> {
    let app = crate::routes::probes_router(gw.clone());
    let slots = Arc::new(tokio::sync::Semaphore::new(64));
    accept_loop(listener, gw, app, false, slots, drain).await
}

/// Accepts connections on `listener`, each holding one of `slots`, each
/// served by [`connection`].
async fn accept_loop(
    listener: TcpListener,
    gw: Arc<Gateway>,
    app: axum::Router,
    fast: bool,
    slots: Arc<tokio::sync::Semaphore>,
    drain: CancellationToken,
) -> io::Result<()> {
    let tls = gw.config.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    // Ends with the drain.
    tokio::spawn(timer_anchor(anchor_period(gw.config.request_timeout, &gw.config.limits), drain.clone()));
    let served = (gw.clone(), drain.clone());
    accept_each(listener, &gw, slots, &drain, move |tcp| {
        let ((gw, drain), app, tls) = (served.clone(), app.clone(), tls.clone());
        async move {
            match tls {
                None => connection(gw, app, tcp, fast, drain).await,
                Some(acceptor) => tls_connection(acceptor, app, tcp, gw.config.limits, drain).await,
            }
        }
    })
    .await
}

/// Accepts connections on `listener` until `drain` is cancelled, each holding one of `slots`
/// (at the cap the loop stops accepting until one closes; the kernel's backlog holds the
/// rest), each served by `serve` in a task of its own; returns once every one is done. One
/// client's failed connection is skipped; a failure of the listener itself (out of
/// descriptors) is retried later each time, counted and logged once a burst. Every listener
/// of the gateway accepts through it (the client's, the control plane's, the probes', the
/// endpoint picker's).
pub(crate) async fn accept_each<F, Fut>(
    listener: TcpListener,
    gw: &Gateway,
    slots: Arc<tokio::sync::Semaphore>,
    drain: &CancellationToken,
    serve: F,
) -> io::Result<()>
where
    F: Fn(TcpStream) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let tracker = TaskTracker::new();
    let max_connections = gw.config.limits.max_connections.max(1);
    let mut at_cap = false;
    let mut backoff = backoff::Backoff::default();
    loop {
        if slots.available_permits() == 0 && !std::mem::replace(&mut at_cap, true) {
            warn!(max_connections, "connection cap reached: not accepting until a connection closes");
        }
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            () = drain.cancelled() => break,
        };
        at_cap &= slots.available_permits() == 0;
        let tcp = tokio::select! {
            r = listener.accept() => match r {
                Ok((tcp, _)) => {
                    backoff.succeeded();
                    tcp
                }
                // One client's connection failed before it was taken (reset, aborted): the next.
                Err(e) if backoff::per_connection(&e) => continue,
                Err(e) => {
                    // Out of descriptors and the like: wait longer each time, keep serving the
                    // open connections, say it once a burst.
                    gw.metrics.accept_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let pause = backoff.failed(Instant::now());
                    if pause.report > 0 {
                        warn!(error = %e, failures = pause.report, next_try_ms = pause.wait.as_millis() as u64, "accept failed");
                    }
                    drop(slot);
                    tokio::select! {
                        () = tokio::time::sleep(pause.wait) => continue,
                        () = drain.cancelled() => break,
                    }
                }
            },
            () = drain.cancelled() => break,
        };
        // Small answers go out at once (no Nagle delay behind an unacknowledged write).
        let _ = tcp.set_nodelay(true);
        let served = serve(tcp);
        tracker.spawn(async move {
            let _slot = slot;
            served.await;
        });
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
async fn timer_anchor(period: Duration, drain: CancellationToken) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(period) => upstream::sweep_idle(Instant::now()),
            () = drain.cancelled() => return,
        }
    }
}

/// The anchor's period: half the shortest deadline a request or connection
/// sets (the request timeout and every client limit), so the anchor is
/// always due before any of them.
fn anchor_period(request_timeout: Duration, l: &ClientLimits) -> Duration {
    let deadlines = [l.header_read_timeout, l.body_read_timeout, l.idle_timeout, l.upstream_idle_timeout];
    let shortest = deadlines.into_iter().fold(request_timeout, Duration::min);
    (shortest / 2).clamp(Duration::from_millis(10), Duration::from_secs(60))
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
    let limits = gw.config.limits;
    let mut buf = BytesMut::with_capacity(8192);
    if fast {
        loop {
            let names = (gw.config.request_id_headers.as_slice(), gw.config.tenants.trusted_header.as_deref());
            let next = match next_head(&mut tcp, &mut buf, &limits, names, &drain).await {
                Ok(Some(next)) => next,
                Ok(None) => return,
                Err(refusal) => Next::Refuse(refusal),
            };
            // One routing config for the whole request, whatever a reload does meanwhile.
            let routing = gw.routing();
            let head = match next {
                Next::Fast(head) => head,
                Next::Hyper => break,
                Next::Refuse(refusal) => return refuse(&mut tcp, &refusal, None).await,
            };
            buf.advance(head.len);
            if !serve_fast(&gw, &mut tcp, &mut buf, (head, routing), &drain).await {
                return;
            }
        }
    }
    fallback::hand_off(app, crate::tls::ClientStream::Plain(tcp), buf, limits, drain).await;
}

/// One HTTPS client connection: the handshake (within the head deadline),
/// then hyper for every request (the fast path is plain HTTP/1.1).
async fn tls_connection(
    acceptor: tokio_rustls::TlsAcceptor,
    app: axum::Router,
    tcp: TcpStream,
    limits: ClientLimits,
    drain: CancellationToken,
) {
    match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => {
            let stream = crate::tls::ClientStream::Tls(Box::new(tls));
            fallback::hand_off(app, stream, BytesMut::new(), limits, drain).await;
        }
        Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
        Err(_) => tracing::debug!("TLS handshake too slow"),
    }
}

/// Reads until `buf` starts with a whole head (or one to refuse): `None`
/// when the connection ends first (closed, idle too long, drained between
/// requests), a refusal when the head is too slow to arrive.
async fn next_head(
    tcp: &mut TcpStream,
    buf: &mut BytesMut,
    limits: &ClientLimits,
    (id_names, tenant_header): (&[String], Option<&str>),
    drain: &CancellationToken,
) -> Result<Option<Next>, Refusal> {
    if buf.is_empty() {
        // Idle between requests: a drain or the idle deadline closes the connection here.
        let read = tokio::select! {
            r = tokio::time::timeout(limits.idle_timeout, fill(tcp, buf)) => r,
            () = drain.cancelled() => return Ok(None),
        };
        if !matches!(read, Ok(Ok(n)) if n > 0) {
            return Ok(None);
        }
    }
    if let Some(next) = parse_head(buf, id_names, tenant_header) {
        return Ok(Some(next));
    }
    // Only a head that did not come whole in one read takes a timer: from (about) its first byte.
    let whole = async {
        loop {
            if !matches!(fill(tcp, buf).await, Ok(n) if n > 0) {
                return None;
            }
            if let Some(next) = parse_head(buf, id_names, tenant_header) {
                return Some(next);
            }
        }
    };
    tokio::time::timeout(limits.header_read_timeout, whole)
        .await
        .map_err(|_| Refusal::HeadTimeout(limits.header_read_timeout))
}

/// Answers a refused request and closes the connection; `unread` is what is
/// left of its declared body, if known.
async fn refuse(tcp: &mut TcpStream, refusal: &Refusal, unread: Option<usize>) {
    let wrote = tokio::time::timeout(LINGER, tcp.write_all(&refusal.answer())).await;
    if matches!(wrote, Ok(Ok(()))) {
        linger(tcp, unread).await;
    }
}

/// Serves one fast-path request; false when the connection must close.
async fn serve_fast(
    gw: &Arc<Gateway>,
    tcp: &mut TcpStream,
    buf: &mut BytesMut,
    (head, routing): (Head, Option<Arc<crate::pools::Routing>>),
    drain: &CancellationToken,
) -> bool {
    let start = Instant::now();
    let route = head.route;
    let names = &gw.config.request_id_headers;
    let sent = |name: &str| {
        let i = names.iter().position(|n| n == name)?;
        head.request_ids.iter().find(|(j, _)| *j == i).map(|(_, v)| v.as_slice())
    };
    let id = crate::pipeline::context::request_id(names, sent, route.path());
    // What every answer to this request carries: its id, and the CORS headers for its origin.
    let mut answer_head = Vec::with_capacity(64);
    push_header(&mut answer_head, crate::pipeline::context::REQUEST_ID_HEADER.as_bytes(), id.as_bytes());
    gw.config.cors.answer_lines(head.origin.as_deref(), &mut answer_head);
    // Each check before the body is read; a refusal answers and closes, the body unread.
    let checked = async {
        if head.body_len > gw.config.max_body_bytes {
            return Err(GatewayError::TooLarge(gw.config.max_body_bytes));
        }
        // A client without a valid key gets no further.
        crate::pipeline::auth::check_client(gw, head.authorization.as_deref())?;
        let worker_auth = crate::pipeline::auth::worker_credentials(gw, head.authorization.as_deref());
        // Admitted: a slot (perhaps after a wait in the queue), and memory for its body and render.
        let who = crate::pipeline::admission::Who {
            priority: head.priority.as_deref(),
            tenant_header: head.tenant.as_deref(),
            authorization: head.authorization.as_deref(),
        };
        Ok((worker_auth, crate::pipeline::admission::Admission::admit_waiting_for(gw, head.body_len, who).await?))
    }
    .await;
    let (worker_auth, admission) = match checked {
        Ok(checked) => checked,
        Err(e) => {
            count_error(gw, route, &e, Some(&id));
            if write_error(tcp, &e, route, true, &answer_head).await.is_ok() {
                linger(tcp, Some(head.body_len.saturating_sub(buf.len()))).await;
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
    if buf.len() < head.body_len {
        // Only a body that did not come with its head takes a timer.
        let (limit, stall) = (gw.config.limits.body_read_timeout, gw.config.limits.body_stall_timeout);
        let refusal = match tokio::time::timeout(limit, fill_body(tcp, buf, head.body_len, stall)).await {
            Ok(Filled::Whole) => None,
            Ok(Filled::Closed) => return false,
            Ok(Filled::Stalled) => Some(Refusal::BodyStall(stall)),
            Err(_) => Some(Refusal::BodyTimeout(limit)),
        };
        if let Some(refusal) = refusal {
            count_error(gw, route, &refusal.gateway_error(), Some(&id));
            refuse(tcp, &refusal, Some(head.body_len.saturating_sub(buf.len()))).await;
            return false;
        }
    }
    let body = buf.split_to(head.body_len).freeze();
    let mut headers = head.forward;
    let lines = || {
        crate::pipeline::request::header_lines(&headers).filter_map(|(n, v)| Some((std::str::from_utf8(n).ok()?, v)))
    };
    let seen = Seen {
        authorization: head.authorization.as_deref(),
        route_debug: head.route_debug.as_deref(),
        cache_trace: head.cache_trace,
    };
    let meta = Meta::new(gw, id, routing.as_deref(), seen, (head.routing_key, head.session), lines);
    if let Some(auth) = worker_auth {
        push_header(&mut headers, b"authorization", &auth);
    }
    // The worker sees the id as `x-request-id`, whichever header it came in (or made here).
    push_header(&mut headers, crate::pipeline::context::REQUEST_ID_HEADER.as_bytes(), meta.id.as_bytes());
    let extra = upstream::Extra::new(gw, Bytes::from(headers), head.rank.map(Bytes::from));
    let upstream_idle = gw.config.limits.upstream_idle_timeout;
    let mut peer = Peer { tcp, pipelined: buf, open: true };
    let span = request_span(gw, route);
    span.record("request_id", meta.id.as_str());
    // Kept for the error's log line.
    let id = meta.id.clone();
    let request = Request { route, routing, admission, body, start, meta };
    async move {
        let send = |worker, body, rank, edits: Option<Arc<crate::pools::HeaderEdits>>| {
            upstream::send(worker, route, body, rank, extra.edited(edits.as_deref()))
        };
        let outcome = tokio::select! {
            outcome = crate::pipeline::run(gw, request, &send, &extra) => outcome,
            // A client that resets drops its upstream request (both legs of a pair); one that
            // half-closed is still answered.
            () = peer.gone() => return false,
        };
        // After a half-close nothing more comes: the answer is the last unless requests were pipelined before it.
        let close = head.close || drain.is_cancelled() || (!peer.open && peer.pipelined.is_empty());
        match outcome {
            // Answered from a response cache, or a cascade's kept answer.
            Ok(Outcome::Cached(hit, verdict)) => {
                if let Some(verdict) = verdict {
                    push_header(&mut answer_head, CASCADE_HEADER.as_bytes(), verdict.as_bytes());
                }
                peer.tcp.write_all(&hit.to_bytes(close, &answer_head)).await.is_ok() && !close
            }
            Ok(Outcome::Sent(mut guard, worker, answer, verdict)) => {
                if let Some(verdict) = verdict {
                    push_header(&mut answer_head, CASCADE_HEADER.as_bytes(), verdict.as_bytes());
                }
                if let Some(extra) = guard.route_headers.take() {
                    for (name, value) in extra.0 {
                        push_header(&mut answer_head, name.as_bytes(), value.as_bytes());
                    }
                }
                let keepalive = gw.config.limits.sse_keepalive;
                let to = upstream::Relayed { close, idle: upstream_idle, keepalive, head: &answer_head };
                upstream::relay(&mut peer, Some((guard, worker)), answer, to).await && !close
            }
            // Made here: a disaggregated pool's answer (the CLI's disaggregation makes the default
            // pool one), a gRPC worker's.
            Ok(Outcome::Made(answer)) => {
                made::write(&mut peer, answer, (close, &answer_head, upstream_idle)).await && !close
            }
            Err(e) => {
                count_error(gw, route, &e, Some(&id));
                write_error(peer.tcp, &e, route, close, &answer_head).await.is_ok() && !close
            }
        }
    }
    .instrument(span)
    .await
}

/// Reads until `buf` holds `len` bytes; false when the client ends or fails first.
async fn fill_body(tcp: &mut TcpStream, buf: &mut BytesMut, len: usize, stall: Duration) -> Filled {
    while buf.len() < len {
        // Room past the body: a read that ends short of the buffer's end tells
        // tokio the socket is drained, so the next poll of it (waiting for a
        // hang-up) costs no system call.
        buf.reserve(len - buf.len() + 4096);
        let read = if stall.is_zero() {
            tcp.read_buf(buf).await
        } else {
            match tokio::time::timeout(stall, tcp.read_buf(buf)).await {
                Ok(read) => read,
                Err(_) => return Filled::Stalled,
            }
        };
        if !matches!(read, Ok(n) if n > 0) {
            return Filled::Closed;
        }
    }
    Filled::Whole
}

/// How reading a body ended.
enum Filled {
    Whole,
    /// The client closed or broke the connection.
    Closed,
    /// No byte came for the stall bound.
    Stalled,
}

/// The client of a request in progress, watched while the request waits for
/// (and streams from) its worker.
#[derive(Debug)]
pub(crate) struct Peer<'a> {
    pub(crate) tcp: &'a mut TcpStream,
    /// Bytes the client pipelines meanwhile, kept for the requests they hold.
    pub(crate) pipelined: &'a mut BytesMut,
    /// The client has not ended its side: a half-close (an end of stream
    /// after a whole request) is no disconnect, the answer still goes out.
    pub(crate) open: bool,
}

// === impl Peer ===

impl Peer<'_> {
    /// Resolves when the client is gone (its connection reset), keeping what
    /// it pipelines; before the answer starts, an end of stream is probed.
    async fn gone(&mut self) {
        while self.watch(true).await.is_ok() {}
    }

    /// Waits for the client's next move: bytes it pipelines (kept) or a
    /// half-close (`open` cleared; with `probe`, sent [`PROBE`]), or `Err`
    /// once it is gone. With nothing more to read, only a reset is watched
    /// for (an error on the socket), so an ended client costs no busy loop.
    pub(crate) async fn watch(&mut self, probe: bool) -> io::Result<()> {
        if !self.open || self.pipelined.len() >= MAX_PIPELINED_BYTES {
            self.tcp.ready(Interest::ERROR).await?;
            return Err(io::ErrorKind::ConnectionReset.into());
        }
        if fill(self.tcp, self.pipelined).await? == 0 {
            self.open = false;
            if probe {
                let _ = self.tcp.try_write(PROBE);
            }
        }
        Ok(())
    }
}

/// Closes our side and reads what the client still sends (the body of a
/// refused request, `unread` bytes of it if known) until it ends, goes quiet
/// for [`LINGER_IDLE`] or [`LINGER_MAX`] passes, so the client's socket does
/// not get a reset that could destroy the answer before the client reads it
/// (a client still writing a large body when the refusal came).
async fn linger<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(tcp: &mut S, unread: Option<usize>) {
    if tcp.shutdown().await.is_err() {
        return;
    }
    let mut left = unread.unwrap_or(usize::MAX);
    let deadline = tokio::time::Instant::now() + LINGER_MAX;
    let mut sink = [0u8; 16384];
    while left > 0 {
        let idle = LINGER_IDLE.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        match tokio::time::timeout(idle, tcp.read(&mut sink)).await {
            Ok(Ok(n)) if n > 0 => left = left.saturating_sub(n),
            _ => return,
        }
    }
}

/// Writes a gateway error as the JSON answer `route` speaks (OpenAI's, or Anthropic's on its
/// routes), with the header lines `extra` (the request's id and CORS headers).
pub(crate) async fn write_error(
    tcp: &mut TcpStream,
    e: &GatewayError,
    route: Route,
    close: bool,
    extra: &[u8],
) -> io::Result<()> {
    let body = e.body_for(Some(route)).to_string();
    let status = e.status();
    let head = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{}{}",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len(),
        e.extra_head(),
        if close { "connection: close\r\n" } else { "" }
    );
    let mut out = head.into_bytes();
    out.extend_from_slice(extra);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body.as_bytes());
    tcp.write_all(&out).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timer_anchor_is_due_before_every_deadline() {
        let (request, mut limits) = (Duration::from_secs(600), ClientLimits::default());
        limits.header_read_timeout = Duration::from_secs(4);
        assert_eq!(anchor_period(request, &limits), Duration::from_secs(2));
        limits.upstream_idle_timeout = Duration::from_millis(1);
        assert_eq!(anchor_period(request, &limits), Duration::from_millis(10), "floored");
        assert_eq!(anchor_period(Duration::from_secs(3600), &ClientLimits::default()), Duration::from_secs(15));
    }
}
