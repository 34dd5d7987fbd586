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
mod cascade;
mod chunked;
mod fallback;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod head;
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

use self::head::Refusal;
use crate::account::{count_error, request_span};
use crate::forward::{Forwarded, escalate, forward};
use crate::pools::cascade::CASCADE_HEADER;
use crate::request::{RANK_HEADER, Route, forwarded, push_header};
use crate::{ClientLimits, Gateway, GatewayError};

/// Largest request head either front end reads; a larger one is refused
/// (431, or 414 when even the request line does not end within it).
const MAX_HEAD_BYTES: usize = 64 << 10;
/// Most header lines a request may have; more are refused (431).
const MAX_HEADERS: usize = 64;
/// Pipelined bytes buffered while a request waits for its worker.
const MAX_PIPELINED_BYTES: usize = 1 << 20;
/// How long a refused connection is kept to deliver its answer and take what
/// the client still sends: long enough for a client that reads, short enough
/// that refused connections do not pile up.
const LINGER: Duration = Duration::from_secs(1);
/// Sent to a client that ended its side while its request waits for a
/// worker. A client that only half-closed still reads, and every HTTP/1.1
/// client skips an interim answer it did not ask for; one that closed
/// altogether answers it with a reset, so it is noticed as gone at once.
const PROBE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Serves the gateway's routes on `listener` until `drain` is cancelled and
/// every open connection is done. With `fast`, proxied requests take the fast
/// path; without it every request goes through axum.
pub async fn serve(listener: TcpListener, gw: Arc<Gateway>, fast: bool, drain: CancellationToken) -> io::Result<()> {
    // A disaggregated request (two legs, a merged answer) is served by the axum front end.
    let fast = fast && gw.pd.is_none();
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
    let tracker = TaskTracker::new();
    let tls = gw.config.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    tracker.spawn(timer_anchor(anchor_period(gw.config.request_timeout, &gw.config.limits), drain.clone()));
    // One slot per open connection, held by its task: at the cap the loop stops accepting.
    // The client listener's slots are the gateway's, shared by every serving thread's loop.
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
        let (gw, app, drain, tls) = (gw.clone(), app.clone(), drain.clone(), tls.clone());
        tracker.spawn(async move {
            let _slot = slot;
            match tls {
                None => connection(gw, app, tcp, fast, drain).await,
                Some(acceptor) => tls_connection(acceptor, app, tcp, gw.config.limits, drain).await,
            }
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
    /// The client's request-id headers: (position in `--request-id-headers`, value), each once.
    request_ids: Vec<(usize, Vec<u8>)>,
    /// It sent `x-request-id` itself (the worker gets it as sent).
    sent_x_request_id: bool,
    /// The page's origin (CORS).
    origin: Option<Vec<u8>>,
    /// The client's routing key (`x-smg-routing-key`).
    routing_key: Option<Vec<u8>>,
    /// The client asked for the routing explain (`x-route-debug: true`).
    /// The `x-route-debug` value (checked against the control-plane keys once the gateway is at hand).
    route_debug: Option<Vec<u8>>,
    /// The client's conversation id (`x-session-id`).
    session: Option<Vec<u8>>,
}

/// Who serves the request at the front of the buffer.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    Fast(Head),
    /// Not for the fast path: hyper serves the rest of the connection.
    Hyper,
    /// Not a head to serve: answered with this refusal, then the connection closes.
    Refuse(Refusal),
}

/// Reads the request head at the front of `buf`; `None` while incomplete.
/// `id_names` are the headers a request id is looked for in, in order.
fn parse_head(buf: &[u8], id_names: &[String]) -> Option<Next> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) if n <= MAX_HEAD_BYTES => n,
        Ok(httparse::Status::Partial) if buf.len() <= MAX_HEAD_BYTES => return None,
        Ok(_) => return Some(Next::Refuse(Refusal::too_large(&buf[..buf.len().min(MAX_HEAD_BYTES)]))),
        Err(e) => return Some(Next::Refuse(Refusal::parse(e))),
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
    let (mut request_ids, mut sent_x_request_id, mut origin) = (Vec::new(), false, None);
    let (mut routing_key, mut route_debug, mut session) = (None, None, None);
    for h in req.headers.iter() {
        if let Some(i) = id_names.iter().position(|n| h.name.eq_ignore_ascii_case(n))
            && !request_ids.iter().any(|(j, _)| *j == i)
        {
            request_ids.push((i, h.value.to_vec()));
        }
        sent_x_request_id |= h.name.eq_ignore_ascii_case(crate::context::REQUEST_ID_HEADER);
        if h.name.eq_ignore_ascii_case("origin") {
            origin = Some(h.value.to_vec());
        } else if h.name.eq_ignore_ascii_case(policy::ROUTING_KEY_HEADER) {
            routing_key = crate::request::Meta::key(Some(h.value));
        } else if h.name.eq_ignore_ascii_case(crate::request::ROUTE_DEBUG_HEADER) {
            route_debug = Some(h.value.to_vec());
        } else if h.name.eq_ignore_ascii_case(crate::pools::SESSION_HEADER) {
            session = crate::request::Meta::key(Some(h.value));
        }
        if h.name.eq_ignore_ascii_case(RANK_HEADER) {
            rank = Some(h.value.to_vec());
        } else if h.name.eq_ignore_ascii_case("authorization") {
            // Two credentials: which one a hop honours is a guess; none is.
            if authorization.replace(h.value.to_vec()).is_some() {
                return Some(Next::Refuse(Refusal::Malformed("more than one authorization header".into())));
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
    Some(Next::Fast(Head {
        route,
        len,
        body_len,
        close,
        expect_continue,
        forward,
        rank,
        authorization,
        request_ids,
        sent_x_request_id,
        origin,
        routing_key,
        route_debug,
        session,
    }))
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
            let next = match next_head(&mut tcp, &mut buf, &limits, &gw.config.request_id_headers, &drain).await {
                Ok(Some(next)) => next,
                Ok(None) => return,
                Err(refusal) => Next::Refuse(refusal),
            };
            // One routing config for the whole request, whatever a reload does meanwhile.
            let routing = gw.routing();
            let head = match next {
                Next::Fast(head) => head,
                Next::Hyper => break,
                Next::Refuse(refusal) => return refuse(&mut tcp, &refusal).await,
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
    id_names: &[String],
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
    if let Some(next) = parse_head(buf, id_names) {
        return Ok(Some(next));
    }
    // Only a head that did not come whole in one read takes a timer: from (about) its first byte.
    let whole = async {
        loop {
            if !matches!(fill(tcp, buf).await, Ok(n) if n > 0) {
                return None;
            }
            if let Some(next) = parse_head(buf, id_names) {
                return Some(next);
            }
        }
    };
    tokio::time::timeout(limits.header_read_timeout, whole)
        .await
        .map_err(|_| Refusal::HeadTimeout(limits.header_read_timeout))
}

/// Answers a refused request and closes the connection.
async fn refuse(tcp: &mut TcpStream, refusal: &Refusal) {
    let wrote = tokio::time::timeout(LINGER, tcp.write_all(&refusal.answer())).await;
    if matches!(wrote, Ok(Ok(()))) {
        linger(tcp).await;
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
    let (id, made) = crate::context::request_id(names, sent, route.path());
    // What every answer to this request carries: its id, and the CORS headers for its origin.
    let mut answer_head = Vec::with_capacity(64);
    push_header(&mut answer_head, crate::context::REQUEST_ID_HEADER.as_bytes(), id.as_bytes());
    gw.config.cors.answer_lines(head.origin.as_deref(), &mut answer_head);
    // Each check before the body is read; a refusal answers and closes, the body unread.
    let checked = async {
        if head.body_len > gw.config.max_body_bytes {
            return Err(GatewayError::TooLarge(gw.config.max_body_bytes));
        }
        // A client without a valid key gets no further.
        crate::auth::check_client(gw, head.authorization.as_deref())?;
        let worker_auth = crate::auth::worker_credentials(gw, head.authorization.as_deref());
        // Admitted: a slot (perhaps after a wait in the queue), and memory for its body and render.
        Ok((worker_auth, crate::admission::Admission::admit_waiting(gw, head.body_len).await?))
    }
    .await;
    let (worker_auth, admission) = match checked {
        Ok(checked) => checked,
        Err(e) => {
            count_error(gw, route, &e, Some(&id));
            if write_error(tcp, &e, true, &answer_head).await.is_ok() {
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
    if buf.len() < head.body_len {
        // Only a body that did not come with its head takes a timer.
        let limit = gw.config.limits.body_read_timeout;
        match tokio::time::timeout(limit, fill_body(tcp, buf, head.body_len)).await {
            Ok(true) => {}
            Ok(false) => return false,
            Err(_) => {
                let refusal = Refusal::BodyTimeout(limit);
                count_error(gw, route, &refusal.gateway_error(), Some(&id));
                refuse(tcp, &refusal).await;
                return false;
            }
        }
    }
    let body = buf.split_to(head.body_len).freeze();
    let mut headers = head.forward;
    let lines = crate::request::header_lines(&headers).filter_map(|(n, v)| Some((std::str::from_utf8(n).ok()?, v)));
    let signal_headers = crate::pools::wanted_headers(routing.as_deref(), lines.clone());
    let cache_bypass =
        crate::request::bypassed(lines.filter(|(n, _)| n.eq_ignore_ascii_case("cache-control")).map(|(_, v)| v));
    if let Some(auth) = worker_auth {
        push_header(&mut headers, b"authorization", &auth);
    }
    // The worker sees the id as `x-request-id`, whichever header it came in (or made here).
    if made || !head.sent_x_request_id {
        push_header(&mut headers, crate::context::REQUEST_ID_HEADER.as_bytes(), id.as_bytes());
    }
    let extra = upstream::Extra {
        headers: Bytes::from(headers),
        rank: head.rank.map(Bytes::from),
        tls: gw.upstream_tls.clone(),
    };
    let upstream_idle = gw.config.limits.upstream_idle_timeout;
    let mut peer = Peer { tcp, pipelined: buf, open: true };
    let span = request_span(gw, route);
    span.record("request_id", id.as_str());
    let meta = crate::request::Meta {
        id,
        routing_key: head.routing_key,
        route_debug: crate::request::Meta::wants_debug(&gw.control_keys, head.route_debug.as_deref()),
        signal_headers,
        session: head.session,
        cache_bypass,
        forced: None,
        caller: crate::auth::caller(gw, head.authorization.as_deref()),
    };
    async move {
        let send = |worker, body, rank, edits: Option<Arc<crate::pools::HeaderEdits>>| {
            upstream::send(worker, route, body, rank, extra.edited(edits.as_deref()))
        };
        let sent = tokio::select! {
            sent = forward(gw, admission, (route, routing.clone()), body, start, &meta, &send) => sent,
            // A client that resets drops its upstream request; one that half-closed is still answered.
            () = peer.gone() => return false,
        };
        // A decision's cascade judges the first pool's answer: kept, or sent on to its second pool.
        let sent = match sent {
            Ok(Forwarded::Sent(mut guard, worker, answer)) if guard.cascade.is_some() => {
                let Some((plan, sent_body)) = guard.cascade.take().map(|b| *b) else { return false };
                let judged = tokio::select! {
                    judged = cascade::first(gw, guard, worker, answer, &plan, route) => judged,
                    () = peer.gone() => return false,
                };
                match judged {
                    Ok(cascade::First::Relay(guard, worker, answer)) => Ok(Forwarded::Sent(guard, worker, answer)),
                    Ok(cascade::First::Kept(hit, verdict)) => {
                        push_header(&mut answer_head, CASCADE_HEADER.as_bytes(), verdict.as_bytes());
                        Ok(Forwarded::Cached(hit))
                    }
                    Ok(cascade::First::Escalate(verdict)) => {
                        push_header(&mut answer_head, CASCADE_HEADER.as_bytes(), verdict.header().as_bytes());
                        let again = escalate(gw, (&plan, &sent_body), (route, routing), start, &meta, &send);
                        tokio::select! {
                            sent = again => sent.map(|(guard, worker, answer)| Forwarded::Sent(guard, worker, answer)),
                            () = peer.gone() => return false,
                        }
                    }
                    Err(e) => Err(e),
                }
            }
            other => other,
        };
        // After a half-close nothing more comes: the answer is the last unless requests were pipelined before it.
        let close = head.close || drain.is_cancelled() || (!peer.open && peer.pipelined.is_empty());
        match sent {
            // Answered from a response cache, or a cascade's kept answer.
            Ok(Forwarded::Cached(hit)) => {
                peer.tcp.write_all(&hit.to_bytes(close, &answer_head)).await.is_ok() && !close
            }
            Ok(Forwarded::Sent(mut guard, worker, answer)) => {
                if let Some(extra) = guard.route_headers.take() {
                    for (name, value) in extra.0 {
                        push_header(&mut answer_head, name.as_bytes(), value.as_bytes());
                    }
                }
                let to = upstream::Relayed { close, idle: upstream_idle, head: &answer_head };
                upstream::relay(&mut peer, guard, worker, answer, to).await && !close
            }
            Err(e) => {
                count_error(gw, route, &e, Some(&meta.id));
                write_error(peer.tcp, &e, close, &answer_head).await.is_ok() && !close
            }
        }
    }
    .instrument(span)
    .await
}

/// Reads until `buf` holds `len` bytes; false when the client ends or fails first.
async fn fill_body(tcp: &mut TcpStream, buf: &mut BytesMut, len: usize) -> bool {
    while buf.len() < len {
        // Room past the body: a read that ends short of the buffer's end tells
        // tokio the socket is drained, so the next poll of it (waiting for a
        // hang-up) costs no system call.
        buf.reserve(len - buf.len() + 4096);
        if !matches!(tcp.read_buf(buf).await, Ok(n) if n > 0) {
            return false;
        }
    }
    true
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
/// refused request) for up to a second, so its socket does not answer the
/// data with a reset that could destroy the answer before the client reads it.
async fn linger<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(tcp: &mut S) {
    if tcp.shutdown().await.is_err() {
        return;
    }
    let mut sink = [0u8; 16384];
    let _ = tokio::time::timeout(LINGER, async { while matches!(tcp.read(&mut sink).await, Ok(n) if n > 0) {} }).await;
}

/// Writes a gateway error as the OpenAI-style JSON answer, with the header
/// lines `extra` (the request's id and CORS headers).
async fn write_error(tcp: &mut TcpStream, e: &GatewayError, close: bool, extra: &[u8]) -> io::Result<()> {
    let body = e.body().to_string();
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

    fn fast(raw: &str) -> Head {
        match parse_head(raw.as_bytes(), &[]) {
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
        assert_eq!(parse_head(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Len", &[]), None);
        assert_eq!(parse_head(b"POS", &[]), None);
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
        ] {
            assert_eq!(parse_head(raw.as_bytes(), &[]), Some(Next::Hyper), "{raw:?}");
        }
    }

    #[test]
    fn heads_hyper_could_only_refuse_are_refused_here() {
        let refused = |raw: &[u8]| match parse_head(raw, &[]) {
            Some(Next::Refuse(r)) => r,
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(raw)),
        };
        assert!(matches!(refused(b"BAD\0 REQUEST\r\n\r\n"), Refusal::Malformed(_)));
        assert!(matches!(refused(b"POST /generate HTTP/1.1\r\nbad header\r\n\r\n"), Refusal::Malformed(_)));
        let huge = format!("POST /v1/chat/completions HTTP/1.1\r\nx: {}", "a".repeat(MAX_HEAD_BYTES));
        assert_eq!(refused(huge.as_bytes()), Refusal::HeadTooLarge);
        // Whole, but over the limit (it came in one large read).
        let whole = format!("POST /v1/chat/completions HTTP/1.1\r\nx: {}\r\n\r\n", "a".repeat(MAX_HEAD_BYTES));
        assert_eq!(refused(whole.as_bytes()), Refusal::HeadTooLarge);
        let long = format!("POST /{}", "a".repeat(MAX_HEAD_BYTES));
        assert_eq!(refused(long.as_bytes()), Refusal::UriTooLong);
        let many: String = (0..=MAX_HEADERS).map(|i| format!("h{i}: v\r\n")).collect();
        let raw = format!("POST /generate HTTP/1.1\r\nContent-Length: 2\r\n{many}\r\n");
        assert_eq!(refused(raw.as_bytes()), Refusal::TooManyHeaders);
    }

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
