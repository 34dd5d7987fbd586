//! The fast path's side towards the workers: a per-thread pool of idle
//! keep-alive connections, sending a request, reading the answer's head, and
//! relaying the answer's body to the client with the same rules as the axum
//! front end (end-to-end headers and length kept, load released at the first
//! body byte, a worker dying mid-stream ends server-sent events with an error
//! event and leaves rotation).
//!
//! Strict towards the workers: an answer's length is one valid
//! `Content-Length` (never two, never beside a `Transfer-Encoding`), chunk
//! sizes are hex digits, and a request is sent again on a new connection only
//! when nothing of it was written to the pooled one (once written, the worker
//! may have started on it). A worker silent mid-body for longer than
//! `upstream_idle_timeout` has failed; a client that resets meanwhile ends
//! the relay at once (and with it the upstream request and its load).

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{self, Write as _};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::StatusCode;
use bytes::{Buf, BytesMut};
use router_types::DpRank;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{Peer, push_header, write_error};
use crate::GatewayError;
use crate::pipeline::account::InFlight;
use crate::pipeline::request::{RANK_HEADER, Route};
use crate::relay::{Quiet, Silence, Tap};
use crate::send::SendError;
use crate::tls::Conn;
use crate::{UPSTREAM_CONNECT_TIMEOUT, UPSTREAM_IDLE_TIMEOUT};
use fleet::Worker;
use h1_codec::chunked::{self, Decoder};
use h1_codec::{AnswerHead, Framing, parse_answer_head};

/// Idle connections kept per worker and serving thread.
const MAX_IDLE_PER_WORKER: usize = 512;

thread_local! {
    /// Idle connections by worker authority, most recently used last.
    static IDLE: RefCell<HashMap<String, Vec<(Conn, Instant)>>> = RefCell::new(HashMap::new());
    /// When this thread's pool was last swept.
    static LAST_SWEEP: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// A worker's answer, its head read.
#[derive(Debug)]
pub(crate) struct Answer {
    /// Where the rest of its body comes from.
    pub(super) from: Source,
    /// Bytes read past the head.
    pub(super) buf: BytesMut,
    /// The pool key.
    pub(super) authority: String,
    pub(super) head: AnswerHead,
}

/// Where an answer's body comes from: the HTTP/1.1 connection it came on (back to the pool
/// when the answer was whole), its HTTP/2 stream (`--upstream-http2`), or an answer the router
/// made (`super::made`: a disaggregated pool's, a gRPC worker's), read frame by frame.
#[derive(Debug)]
pub(crate) enum Source {
    H1(Conn),
    H2(hyper::body::Incoming),
    Made(axum::body::Body),
}

impl Source {
    /// Reads more of the body into `buf`: how many bytes, 0 at the end of its stream.
    /// Cancel-safe: a read given up loses nothing.
    pub(super) async fn read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        match self {
            Source::H1(tcp) => tcp.read_buf(buf).await,
            Source::H2(body) => read_frame(body, buf).await,
            Source::Made(body) => read_frame(body, buf).await,
        }
    }

    /// Gives an HTTP/1.1 connection whose answer was read whole back to this thread's pool.
    pub(super) fn pool(self, authority: String, head: &AnswerHead, buf: &BytesMut) {
        if let Source::H1(tcp) = self
            && head.reusable
            && buf.is_empty()
        {
            checkin(authority, tcp);
        }
    }
}

/// Reads `body`'s next data frame into `buf` (other frames skipped): its length, 0 at its end.
async fn read_frame<B>(body: &mut B, buf: &mut BytesMut) -> io::Result<usize>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    loop {
        match http_body_util::BodyExt::frame(body).await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data()
                    && !data.is_empty()
                {
                    buf.extend_from_slice(&data);
                    return Ok(data.len());
                }
            }
            Some(Err(e)) => return Err(io::Error::other(e)),
            None => return Ok(0),
        }
    }
}

impl crate::send::AnswerHead for Answer {
    fn status(&self) -> u16 {
        self.head.status
    }
}

/// An idle connection to `authority` that still looks open and has been idle less than `max_idle`.
fn checkout(authority: &str, max_idle: Duration) -> Option<Conn> {
    IDLE.with_borrow_mut(|idle| {
        let list = idle.get_mut(authority)?;
        while let Some((tcp, since)) = list.pop() {
            // An idle connection has nothing to read: data or end of stream means the worker closed it.
            if tcp.looks_open() && since.elapsed() < max_idle.min(UPSTREAM_IDLE_TIMEOUT) {
                return Some(tcp);
            }
        }
        None
    })
}

/// Closes the connections of `list` idle for [`UPSTREAM_IDLE_TIMEOUT`] at `now`. The
/// list is in check-in order, so they are the ones at its front.
fn expire(list: &mut Vec<(Conn, Instant)>, now: Instant) {
    let expired = list.partition_point(|(_, since)| now.saturating_duration_since(*since) >= UPSTREAM_IDLE_TIMEOUT);
    list.drain(..expired);
}

/// Closes this thread's expired idle connections for every worker, at most
/// once per [`UPSTREAM_IDLE_TIMEOUT`]: those of a worker that left the fleet would
/// otherwise stay open until its address is used again. Called from the
/// serving thread's timer anchor and on check-in (on a shared multi-threaded
/// runtime, `--serve-threads 0`, the anchor runs on one thread only).
pub(crate) fn sweep_idle(now: Instant) {
    if LAST_SWEEP.get().is_some_and(|last| now.saturating_duration_since(last) < UPSTREAM_IDLE_TIMEOUT) {
        return;
    }
    LAST_SWEEP.set(Some(now));
    super::h2::sweep(now, UPSTREAM_IDLE_TIMEOUT);
    IDLE.with_borrow_mut(|idle| {
        idle.retain(|_, list| {
            expire(list, now);
            !list.is_empty()
        });
    });
}

/// Idle connections this thread holds, over all workers.
#[cfg(test)]
pub(super) fn idle_count() -> usize {
    IDLE.with_borrow(|idle| idle.values().map(Vec::len).sum())
}

pub(super) fn checkin(authority: String, tcp: Conn) {
    let now = Instant::now();
    sweep_idle(now);
    IDLE.with_borrow_mut(|idle| {
        let list = idle.entry(authority).or_default();
        expire(list, now);
        if list.len() < MAX_IDLE_PER_WORKER {
            list.push((tcp, now));
        }
    });
}

/// A new connection to `host:port`, in TLS when `tls` is given (an
/// `https://` worker). A failed handshake is a connect failure: nothing of
/// the request reached the worker.
async fn connect(host: &str, port: u16, tls: Option<&tokio_rustls::TlsConnector>) -> Result<Conn, SendError> {
    let refused = |e: String| SendError { connect: true, message: format!("tcp connect error: {e}") };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let tcp = match tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, TcpStream::connect((host, port))).await {
        Ok(Ok(tcp)) => tcp,
        Ok(Err(e)) => return Err(refused(e.to_string())),
        Err(_) => return Err(refused("timed out".into())),
    };
    let _ = tcp.set_nodelay(true);
    let Some(tls) = tls else { return Ok(Conn::Plain(tcp)) };
    let failed = |e: String| SendError { connect: true, message: format!("TLS handshake with the worker failed: {e}") };
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|e| failed(e.to_string()))?;
    match tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, tls.connect(name, tcp)).await {
        Ok(Ok(s)) => Ok(Conn::Tls(Box::new(s))),
        Ok(Err(e)) => Err(failed(e.to_string())),
        Err(_) => Err(failed("timed out".into())),
    }
}

/// What a request carries to the worker besides its body.
#[derive(Clone)]
pub(crate) struct Extra {
    /// The client's end-to-end headers as `name: value\r\n` lines, with the
    /// `authorization` the router decided the worker gets (if any).
    pub(crate) headers: Bytes,
    /// The client's data-parallel rank hint, sent when the router has none.
    pub(crate) rank: Option<Bytes>,
    /// TLS towards `https://` workers (HTTP/1.1, and ALPN `h2` for `--upstream-http2`).
    pub(crate) tls: crate::tls::WorkerConnectors,
    /// A pooled connection idle this long is not reused (`--upstream-pool-idle-timeout-secs`).
    pub(crate) pool_idle: Duration,
    /// Speak HTTP/2 to the workers that answer it (`--upstream-http2`: h2c by prior knowledge in
    /// the clear, ALPN `h2` in TLS).
    pub(crate) http2: bool,
}

impl Extra {
    /// `headers` (made the worker's) and the client's rank hint, with the gateway's TLS, idle
    /// bound and HTTP/2 setting.
    pub(crate) fn new(gw: &crate::Gateway, headers: Bytes, rank: Option<Bytes>) -> Extra {
        Extra {
            headers,
            rank,
            tls: gw.upstream_tls.clone(),
            pool_idle: gw.config.upstream_pool_idle,
            http2: gw.config.upstream_http2,
        }
    }

    /// These, with a decision's header changes applied (`None`: as they are).
    pub(crate) fn edited(&self, edits: Option<&crate::pools::HeaderEdits>) -> Extra {
        let mut extra = self.clone();
        if let Some(edits) = edits {
            extra.headers = Bytes::from(edits.applied_to_lines(&self.headers));
        }
        extra
    }
}

impl std::fmt::Debug for Extra {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Extra").field("headers", &self.headers.len()).field("rank", &self.rank).finish()
    }
}

/// Longest the router waits for a worker's early answer after its request could not be written whole.
const EARLY_ANSWER_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Sends the request to `worker` and reads its answer's head. A pooled
/// connection that takes no byte of the request (the worker had closed it)
/// is replaced by a new one; a request written in part or whole is never
/// sent again (`connect` says whether nothing of it reached the worker).
pub(crate) async fn send(
    worker: Arc<Worker>,
    route: Route,
    body: Bytes,
    rank: Option<DpRank>,
    extra: Extra,
) -> Result<Answer, SendError> {
    let invalid = || SendError { connect: false, message: "invalid worker URL".into() };
    let uri = worker.endpoint(route.path()).ok_or_else(invalid)?;
    let (Some(authority), Some(host)) = (uri.authority(), uri.host()) else { return Err(invalid()) };
    let https = uri.scheme_str() == Some("https");
    // Pooled by scheme and authority: a TLS connection never carries a plain request.
    let pool_key = if https { format!("https://{authority}") } else { authority.to_string() };
    // Boxed: the HTTP/2 path's state would otherwise grow every request's future.
    if extra.http2 && worker.upstream_http2() != Some(false) {
        let sent = Box::pin(send_h2(&worker, (&uri, authority, host), body.clone(), rank, &extra)).await?;
        if let Some(answer) = sent {
            return Ok(answer);
        }
    }
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut msg = Vec::with_capacity(192 + extra.headers.len());
    let _ = write!(
        msg,
        "POST {path} HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    msg.extend_from_slice(&extra.headers);
    if let Some(rank) = rank_hint(rank, extra.rank.as_ref()) {
        push_header(&mut msg, RANK_HEADER.as_bytes(), &rank);
    }
    msg.extend_from_slice(b"\r\n");
    let mut pooled = checkout(&pool_key, extra.pool_idle);
    loop {
        let reused = pooled.is_some();
        let mut tcp = match pooled.take() {
            Some(tcp) => tcp,
            None => {
                let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
                connect(host, port, https.then_some(&extra.tls.http1)).await?
            }
        };
        // Head and body in one vectored write: the body is not copied.
        let mut request = Buf::chain(&msg[..], &body[..]);
        let size = request.remaining();
        if let Err(e) = tcp.write_all_buf(&mut request).await {
            let untouched = request.remaining() == size;
            // The worker had closed the idle connection: no byte went, nothing was processed.
            if reused && untouched {
                continue;
            }
            // A worker may answer before it has read the whole request (a 413 past its body
            // limit) and close: that answer, already sent, is read and relayed (RFC 9112 §9.5),
            // not taken for the worker's failure. The connection is not used again.
            if !untouched {
                let mut buf = BytesMut::with_capacity(8192);
                if let Ok(Ok(mut head)) = tokio::time::timeout(EARLY_ANSWER_WAIT, read_head(&mut tcp, &mut buf)).await {
                    head.reusable = false;
                    return Ok(Answer { from: Source::H1(tcp), buf, authority: pool_key, head });
                }
            }
            return Err(SendError { connect: untouched, message: e.to_string() });
        }
        let mut buf = BytesMut::with_capacity(8192);
        return match read_head(&mut tcp, &mut buf).await {
            Ok(head) => Ok(Answer { from: Source::H1(tcp), buf, authority: pool_key, head }),
            // Written, then no answer: the worker may have started on it, so it is not sent again.
            Err(e) => Err(SendError { connect: false, message: e.to_string() }),
        };
    }
}

/// Sends over HTTP/2 (`--upstream-http2`) when `worker` speaks it, asking it first if it was never
/// asked; `None`: it does not, the request goes over HTTP/1.1.
async fn send_h2(
    worker: &Worker,
    (uri, authority, host): (&axum::http::Uri, &axum::http::uri::Authority, &str),
    body: Bytes,
    rank: Option<DpRank>,
    extra: &Extra,
) -> Result<Option<Answer>, SendError> {
    let https = uri.scheme_str() == Some("https");
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let connect = || connect(host, port, https.then_some(&extra.tls.h2));
    if worker.upstream_http2().is_none() {
        let base = format!("{}://{authority}", if https { "https" } else { "http" });
        let speaks = super::h2::probe(&base, UPSTREAM_CONNECT_TIMEOUT, connect).await?;
        worker.set_upstream_http2(speaks);
        if speaks {
            tracing::info!(worker = %worker.url, "the worker speaks HTTP/2: its requests go over one multiplexed connection");
        } else {
            tracing::warn!(worker = %worker.url, "the worker does not answer HTTP/2 (--upstream-http2): it stays on HTTP/1.1");
        }
    }
    if worker.upstream_http2() != Some(true) {
        return Ok(None);
    }
    let rank = rank_hint(rank, extra.rank.as_ref());
    let headers = super::h2::request_headers(&extra.headers, rank.as_deref().map(|r| (RANK_HEADER, r)));
    let key = if https { format!("https://{authority}") } else { authority.to_string() };
    let (head, body) = super::h2::send(&key, (uri.clone(), headers, body), extra.pool_idle, connect).await?;
    Ok(Some(Answer { from: Source::H2(body), buf: BytesMut::new(), authority: key, head }))
}

/// The rank hint a worker gets: the router's, which wins over one the client sent.
fn rank_hint(rank: Option<DpRank>, client: Option<&Bytes>) -> Option<Bytes> {
    rank.map(|r| Bytes::from(r.0.to_string())).or_else(|| client.cloned())
}

/// Reads a final answer head (skipping 1xx ones); leaves the bytes after it in `buf`.
async fn read_head(tcp: &mut Conn, buf: &mut BytesMut) -> io::Result<AnswerHead> {
    loop {
        if let Some((len, head)) = parse_answer_head(buf)? {
            buf.advance(len);
            return Ok(head);
        }
        buf.reserve(8192);
        if tcp.read_buf(buf).await? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed before an answer"));
        }
    }
}

/// How an answer goes to the client.
#[derive(Debug)]
pub(crate) struct Relayed<'a> {
    /// Tell the client this answer is the last on its connection.
    pub(crate) close: bool,
    /// How long the worker may stay silent mid-body.
    pub(crate) idle: Duration,
    /// An event stream's keep-alive period (`--sse-keepalive-secs`; zero: none).
    pub(crate) keepalive: Duration,
    /// Header lines the router adds (the request's id, CORS).
    pub(crate) head: &'a [u8],
}

/// Writes `answer` to the client: the fast path's one writer, for a worker's answer (passing
/// the answer filters, [`Tap`], with the request's accounting `from`: its guard and worker)
/// and for an answer the router made (`from` is `None`: its maker filtered and counted it).
/// True when it went out whole and the client connection can carry another request.
pub(crate) async fn relay(
    peer: &mut Peer<'_>,
    from: Option<(InFlight, Arc<Worker>)>,
    mut answer: Answer,
    to: Relayed<'_>,
) -> bool {
    let Relayed { close, idle, keepalive, head: extra } = to;
    // The head's parse saw the content type: it is read again only for the response cache.
    let headers = &answer.head.headers;
    let content_type = || header_value(headers, b"content-type");
    let mut tap =
        from.map(|(guard, worker)| Tap::read(guard, worker, (answer.head.status, answer.head.sse), content_type));
    let reason = StatusCode::from_u16(answer.head.status).ok().and_then(|s| s.canonical_reason()).unwrap_or("");
    let mut out = Vec::with_capacity(256 + answer.head.headers.len() + answer.buf.len());
    let _ = write!(out, "HTTP/1.1 {} {reason}\r\n", answer.head.status);
    out.extend_from_slice(&answer.head.headers);
    let framing = answer.head.framing;
    match framing {
        Framing::Empty => {}
        Framing::Length(n) => {
            let _ = write!(out, "content-length: {n}\r\n");
        }
        Framing::Chunked | Framing::Close if answer.head.codings.is_empty() => {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
        }
        Framing::Chunked | Framing::Close => {
            let _ = write!(out, "transfer-encoding: {}, chunked\r\n", answer.head.codings);
        }
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(extra);
    out.extend_from_slice(b"\r\n");
    // One timer for the whole body, created here and registered only if a read has to wait.
    // Keep-alive frames go only in a body the relay frames in chunks (never into a sized one).
    let chunks = matches!(framing, Framing::Chunked | Framing::Close);
    let ping = (chunks && keepalive_frame(&tap).is_some() && !keepalive.is_zero()).then_some(keepalive);
    let silence = Silence::new(tokio::time::Instant::now(), idle, ping);
    let timer = std::pin::pin!(tokio::time::sleep_until(silence.due()));
    let mut stall = Stall { timer, silence };
    let result = match framing {
        Framing::Empty => {
            if let Some(tap) = tap.as_mut() {
                tap.ended();
            }
            peer.tcp.write_all(&out).await.map(|()| out.clear()).map_err(|_| Failure::Client)
        }
        Framing::Length(n) => relay_sized(peer, &mut tap, &mut answer, &mut out, n, &mut stall).await,
        Framing::Chunked | Framing::Close => relay_chunked(peer, &mut tap, &mut answer, &mut out, &mut stall).await,
    };
    match result {
        Ok(()) => {
            answer.from.pool(answer.authority, &answer.head, &answer.buf);
            true
        }
        // The client went away: dropping the upstream connection cancels the request.
        Err(Failure::Client) => false,
        Err(Failure::Worker(e)) => {
            // Only a body the relay frames in chunks can still end cleanly; a
            // sized one cannot, and the client sees the connection close.
            let chunked = matches!(framing, Framing::Chunked | Framing::Close);
            // A made answer that broke: the client sees it cut (no last chunk).
            let Some(tap) = tap.as_mut() else {
                let _ = peer.tcp.write_all(&out).await;
                return false;
            };
            // Nothing went out yet (the first bytes of the body were invalid): a plain 502.
            if !out.is_empty() {
                tap.failed_before_head(&e);
                let url = tap.worker().url.to_string();
                let e = GatewayError::Upstream { worker: url, message: e.to_string(), retryable: false };
                let _ = write_error(peer.tcp, &e, tap.route(), true, extra).await;
                return false;
            }
            let tail = tap.failed(&e, chunked);
            let Some(tail) = tail else { return false };
            let mut end = Vec::new();
            chunked::encode(&tail, &mut end);
            end.extend_from_slice(chunked::LAST_CHUNK);
            peer.tcp.write_all(&end).await.is_ok()
        }
    }
}

/// The keep-alive frame an event stream may carry now (a worker's answer; a made one has none).
fn keepalive_frame(tap: &Option<Tap>) -> Option<&'static [u8]> {
    tap.as_ref().and_then(Tap::keepalive)
}

/// Why a relay stopped.
#[derive(Debug)]
enum Failure {
    Client,
    Worker(io::Error),
}

/// The worker's silence in a relay ([`Silence`]) and the one timer that judges it.
struct Stall<'a> {
    timer: Pin<&'a mut tokio::time::Sleep>,
    silence: Silence,
}

/// What a wait for the worker's answer came to.
enum Read {
    /// More bytes (`true`: its end of stream).
    More(bool),
    /// Silent for the keep-alive period: a keep-alive frame may go out.
    Quiet,
}

/// Reads more of the worker's answer; true at its end of stream. Meanwhile
/// the client is watched: bytes it pipelines are kept, a half-close is no
/// failure, a reset is (and the worker's silence past the limit is too).
async fn read_more(answer: &mut Answer, peer: &mut Peer<'_>, stall: &mut Stall<'_>) -> Result<Read, Failure> {
    answer.buf.reserve(16 << 10);
    loop {
        tokio::select! {
            biased;
            read = answer.from.read_buf(&mut answer.buf) => {
                let n = read.map_err(Failure::Worker)?;
                stall.silence.heard(tokio::time::Instant::now());
                return Ok(Read::More(n == 0));
            }
            watched = peer.watch(false) => watched.map_err(|_| Failure::Client)?,
            () = stall.timer.as_mut() => match stall.silence.fired(tokio::time::Instant::now()) {
                Quiet::Failed => {
                    let silent = format!("the worker sent nothing for {:?} mid-answer", stall.silence.limit());
                    return Err(Failure::Worker(io::Error::new(io::ErrorKind::TimedOut, silent)));
                }
                Quiet::Ping => {
                    let due = stall.silence.due();
                    stall.timer.as_mut().reset(due);
                    return Ok(Read::Quiet);
                }
                Quiet::Wait(at) => stall.timer.as_mut().reset(at),
            },
        }
    }
}

/// The value of header `name` in serialized header lines.
fn header_value(lines: &[u8], name: &[u8]) -> Option<axum::http::HeaderValue> {
    crate::pipeline::request::header_lines(lines)
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .and_then(|(_, value)| axum::http::HeaderValue::from_bytes(value).ok())
}

/// The worker closed its connection before the body's end.
fn cut_short() -> Failure {
    Failure::Worker(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed mid-body"))
}

/// A body of known length: the first bytes go out with the head (`out`,
/// emptied as it is written).
async fn relay_sized(
    peer: &mut Peer<'_>,
    tap: &mut Option<Tap>,
    answer: &mut Answer,
    out: &mut Vec<u8>,
    mut left: u64,
    stall: &mut Stall<'_>,
) -> Result<(), Failure> {
    loop {
        let take = answer.buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        if take > 0 {
            if let Some(tap) = tap.as_mut() {
                tap.data(&answer.buf[..take]);
            }
            out.extend_from_slice(&answer.buf[..take]);
            answer.buf.advance(take);
            left -= take as u64;
        }
        if left == 0 {
            // Whole: kept before its last bytes go out, so the client's next ask finds it.
            if let Some(tap) = tap.as_mut() {
                tap.ended();
            }
        }
        if !out.is_empty() {
            peer.tcp.write_all(out).await.map_err(|_| Failure::Client)?;
            out.clear();
        }
        if left == 0 {
            return Ok(());
        }
        // No keep-alive in a sized body (its stall has none).
        if let Read::More(true) = read_more(answer, peer, stall).await? {
            return Err(cut_short());
        }
    }
}

/// A chunked or close-delimited body, re-framed into chunks for the client.
async fn relay_chunked(
    peer: &mut Peer<'_>,
    tap: &mut Option<Tap>,
    answer: &mut Answer,
    out: &mut Vec<u8>,
    stall: &mut Stall<'_>,
) -> Result<(), Failure> {
    let chunked = answer.head.framing == Framing::Chunked;
    let (mut decoder, mut payload, mut eof) = (Decoder::default(), Vec::new(), false);
    loop {
        let done = if chunked {
            decoder.decode(&mut answer.buf, &mut payload).map_err(|e| Failure::Worker(io::Error::other(e)))?
        } else {
            // Close-delimited: everything read is body, and the worker's close ends it.
            payload.extend_from_slice(&answer.buf);
            answer.buf.clear();
            eof
        };
        if !payload.is_empty() {
            if let Some(tap) = tap.as_mut() {
                tap.data(&payload);
            }
            chunked::encode(&payload, out);
            payload.clear();
        }
        if done {
            out.extend_from_slice(chunked::LAST_CHUNK);
            if let Some(tap) = tap.as_mut() {
                tap.ended();
            }
        }
        if !out.is_empty() {
            peer.tcp.write_all(out).await.map_err(|_| Failure::Client)?;
            out.clear();
        }
        if done {
            return Ok(());
        }
        eof = match read_more(answer, peer, stall).await? {
            Read::More(eof) => eof,
            // Silent: a keep-alive frame, if between events.
            Read::Quiet => {
                if let Some(frame) = keepalive_frame(tap) {
                    chunked::encode(frame, out);
                }
                false
            }
        };
        if eof && chunked {
            return Err(cut_short());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_sweep_closes_connections_idle_too_long_for_every_worker() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accept = tokio::spawn(async move {
            let mut held = Vec::new();
            for _ in 0..2 {
                held.push(listener.accept().await.unwrap().0);
            }
            held
        });
        checkin("gone:1".into(), Conn::Plain(TcpStream::connect(addr).await.unwrap()));
        checkin("kept:2".into(), Conn::Plain(TcpStream::connect(addr).await.unwrap()));
        let mut held = accept.await.unwrap();
        assert_eq!(idle_count(), 2);

        // Not yet idle for long: both stay.
        sweep_idle(Instant::now());
        assert_eq!(idle_count(), 2);
        // Past the idle timeout every worker's connections go, and the worker's entry with them.
        sweep_idle(Instant::now() + UPSTREAM_IDLE_TIMEOUT + Duration::from_secs(1));
        assert_eq!(idle_count(), 0);
        assert!(IDLE.with_borrow(HashMap::is_empty));
        // The worker side sees them closed.
        for peer in &mut held {
            let mut byte = [0u8; 1];
            assert_eq!(peer.read(&mut byte).await.unwrap(), 0);
        }
    }
}
