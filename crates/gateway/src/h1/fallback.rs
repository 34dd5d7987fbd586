//! The hyper fallback: the rest of a connection the fast path does not serve
//! (other routes, chunked or HTTP/1.0 requests; every connection with the
//! fast path off) goes to axum through hyper, behind a guard on its bytes.
//!
//! ```text
//! client ─► Guarded (heads checked, deadlines) ─► hyper ─► Tracked(axum) ─► answer
//!                 ▲ waits while an answer is open ◄───────────────┘
//! ```
//!
//! The guard reads the client's bytes, checks each request head before hyper
//! sees it ([`head::check`]: what hyper would refuse with an empty body is
//! refused here with a JSON one), follows each body's framing to find the
//! next head, and runs the client deadlines: idle between requests (a silent
//! close), the head from its first byte and the body from its head (408).
//! A request is handed to hyper only once the previous answer is written, so
//! a deadline never cuts an answer in progress. hyper's own header timer
//! counts idle time too and closes without an answer: it is set past both
//! deadlines together, a backstop only. Costs: one timer per connection and
//! one copy of the request bytes, on the path that is not the hot one.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use crate::tls::ClientStream;
use axum::http::{Request, Response};
use bytes::{Buf, BytesMut};
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

use h1_codec::chunked::Decoder;
use h1_codec::{BodyLen, Refusal};

use super::head::Answer as _;
use super::{LINGER, MAX_PIPELINED_BYTES, linger};
use crate::ClientLimits;

/// How far past the guard's idle and head deadlines together hyper's own
/// header timer is set: late enough that the guard's (which answers 408, or
/// closes an idle connection) always fires first.
const HYPER_HEADER_SLACK: Duration = Duration::from_secs(1);

/// Lets hyper serve the rest of a connection, starting with the bytes already read.
pub(super) async fn hand_off(
    app: axum::Router,
    tcp: ClientStream,
    read: BytesMut,
    limits: ClientLimits,
    drain: CancellationToken,
) {
    let progress = Arc::new(Progress::default());
    let guard = Guarded::new(tcp, read, limits, progress.clone());
    let service = Tracked { inner: hyper_util::service::TowerToHyperService::new(app), progress: progress.clone() };
    let mut conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.idle_timeout + limits.header_read_timeout + HYPER_HEADER_SLACK)
        .serve_connection(hyper_util::rt::TokioIo::new(guard), service);
    let mut draining = false;
    loop {
        // Until hyper is done, or the guard ended the request it is reading (too slow, malformed).
        let served = std::future::poll_fn(|cx| match Pin::new(&mut conn).poll(cx) {
            Poll::Pending if progress.abort.load(Ordering::Relaxed) => Poll::Ready(()),
            p => p.map(|_| ()),
        });
        tokio::select! {
            () = served => break,
            () = drain.cancelled(), if !draining => {
                draining = true;
                Pin::new(&mut conn).graceful_shutdown();
            }
        }
    }
    conn.into_parts().io.into_inner().finish().await;
}

/// What the guard knows of hyper's side of the connection.
#[derive(Debug, Default)]
struct Progress {
    /// Requests handed to the service whose answer is not all written yet.
    open: AtomicUsize,
    /// The latest request got its answer's head from the service.
    answered: AtomicBool,
    /// The guard ended the connection in the middle of a request: hyper is
    /// dropped (with the request), not polled to its end.
    abort: AtomicBool,
}

/// The client's socket as hyper reads it (see the module docs).
#[derive(Debug)]
struct Guarded {
    tcp: ClientStream,
    /// Bytes read from the client that hyper has not read; hyper may read the first `checked`.
    input: BytesMut,
    checked: usize,
    /// Where the bytes past `checked` stand.
    at: At,
    /// The client closed its side (or the connection idled out).
    eof: bool,
    /// Why the connection ends with a refusal, once it does, and whether it came mid-body.
    refusal: Option<(Refusal, bool)>,
    /// The deadline that runs now, and its timer.
    lapse: Option<Lapse>,
    timer: Pin<Box<Sleep>>,
    /// When the body in progress must be whole (its timer also runs to the next byte's
    /// deadline, `body_stall_timeout`, whichever comes first).
    body_due: Instant,
    limits: ClientLimits,
    progress: Arc<Progress>,
}

/// Where the guard stands in the client's byte stream.
#[derive(Debug)]
enum At {
    /// At a head: the next request's first byte, or some of its head.
    Head,
    /// In a body: this many bytes to go.
    Length(u64),
    /// In a chunked body.
    Chunked(Decoder),
}

/// A client deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lapse {
    Idle,
    Head,
    Body,
}

/// The service with the guard told when an answer is open.
#[derive(Debug, Clone)]
struct Tracked<S> {
    inner: S,
    progress: Arc<Progress>,
}

/// A request counted open until its answer's body is dropped (written, or abandoned).
#[derive(Debug)]
struct Open(Arc<Progress>);

/// The service's future, its answer's body then holding the count.
#[derive(Debug)]
struct Tracking<F> {
    inner: F,
    open: Option<Open>,
}

/// An answer's body, counted open until hyper drops it.
#[derive(Debug)]
struct Answered<B> {
    body: B,
    _open: Option<Open>,
}

// === impl Guarded ===

impl Guarded {
    fn new(tcp: ClientStream, input: BytesMut, limits: ClientLimits, progress: Arc<Progress>) -> Self {
        let timer = Box::pin(tokio::time::sleep(limits.idle_timeout));
        let body_due = Instant::now();
        Self {
            tcp,
            input,
            checked: 0,
            at: At::Head,
            eof: false,
            refusal: None,
            lapse: None,
            timer,
            body_due,
            limits,
            progress,
        }
    }

    /// hyper is writing an answer (or has a request it has not answered).
    fn busy(&self) -> bool {
        self.progress.open.load(Ordering::Acquire) > 0
    }

    /// Checks what follows the bytes hyper may read: body bytes by their
    /// framing, and the next head once hyper is done with everything before it.
    fn advance(&mut self) -> Result<(), Refusal> {
        let busy = self.busy();
        loop {
            let rest = &self.input[self.checked..];
            match &mut self.at {
                At::Length(left) => {
                    let take = rest.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
                    self.checked += take;
                    *left -= take as u64;
                    if *left == 0 {
                        self.at = At::Head;
                    }
                    if take > 0 {
                        self.body_progressed();
                    }
                    return Ok(());
                }
                At::Chunked(decoder) => {
                    let (used, done) =
                        decoder.skip(rest).map_err(|_| Refusal::Malformed("malformed chunked request body".into()))?;
                    self.checked += used;
                    if done {
                        self.at = At::Head;
                    }
                    if used > 0 {
                        self.body_progressed();
                    }
                    return Ok(());
                }
                // One request at a time: the next head waits for the answer before it.
                At::Head if self.checked > 0 || rest.is_empty() || busy => return Ok(()),
                At::Head => {
                    let Some((len, body)) = h1_codec::check(rest)? else { return Ok(()) };
                    self.checked += len;
                    // A new request: every deadline after it starts afresh (hyper may answer
                    // it before the guard is polled again, so no change of deadline shows it).
                    self.lapse = None;
                    self.at = match body {
                        BodyLen::Empty => return Ok(()),
                        BodyLen::Length(n) => At::Length(n),
                        BodyLen::Chunked => At::Chunked(Decoder::default()),
                    };
                }
            }
        }
    }

    /// The deadline that applies now: none while hyper answers (the
    /// answer's own limits govern it) or once the connection is ending.
    fn wanted(&self) -> Option<Lapse> {
        match self.at {
            _ if self.eof || self.refusal.is_some() => None,
            At::Length(_) | At::Chunked(_) => Some(Lapse::Body),
            At::Head if self.checked > 0 || self.busy() => None,
            At::Head if self.input.is_empty() => Some(Lapse::Idle),
            At::Head => Some(Lapse::Head),
        }
    }

    /// Which deadline has passed, if one has; a new one starts now.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Option<Lapse> {
        let wanted = self.wanted();
        if wanted != self.lapse {
            self.lapse = wanted;
            if let Some(lapse) = wanted {
                let now = Instant::now();
                let deadline = now + self.limit(lapse);
                if lapse == Lapse::Body {
                    self.body_due = deadline;
                }
                let due = self.next_byte_due(lapse, now).map_or(deadline, |d| d.min(deadline));
                self.timer.as_mut().reset(due);
            }
        }
        let lapse = self.lapse?;
        self.timer.as_mut().poll(cx).is_ready().then_some(lapse)
    }

    /// When the next byte of a body must come, if the stall bound is on and a body runs.
    fn next_byte_due(&self, lapse: Lapse, now: Instant) -> Option<Instant> {
        (lapse == Lapse::Body && !self.limits.body_stall_timeout.is_zero())
            .then(|| now + self.limits.body_stall_timeout)
    }

    /// Bytes of the body came: the stall clock starts again (the whole body's deadline stays).
    fn body_progressed(&mut self) {
        if self.lapse == Some(Lapse::Body)
            && let Some(due) = self.next_byte_due(Lapse::Body, Instant::now())
        {
            self.timer.as_mut().reset(due.min(self.body_due));
        }
    }

    /// Why a body's timer fired: the whole body's deadline, or a stall before it.
    fn body_refusal(&self) -> Refusal {
        if Instant::now() >= self.body_due || self.limits.body_stall_timeout.is_zero() {
            Refusal::BodyTimeout(self.limits.body_read_timeout)
        } else {
            Refusal::BodyStall(self.limits.body_stall_timeout)
        }
    }

    fn limit(&self, lapse: Lapse) -> Duration {
        match lapse {
            Lapse::Idle => self.limits.idle_timeout,
            Lapse::Head => self.limits.header_read_timeout,
            Lapse::Body => self.limits.body_read_timeout,
        }
    }

    /// Ends the connection with `refusal` (see `poll_read` for how hyper learns of it).
    fn refuse(&mut self, refusal: Refusal) {
        let mid_body = !matches!(self.at, At::Head);
        self.refusal = Some((refusal, mid_body));
    }

    /// Reads more of the client into `input`; `Ready(Ok(0))` at its end of stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.input.capacity() - self.input.len() < 4096 {
            self.input.reserve(8192);
        }
        match &mut self.tcp {
            ClientStream::Plain(tcp) => loop {
                ready!(tcp.poll_read_ready(cx))?;
                match tcp.try_read_buf(&mut self.input) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    r => return Poll::Ready(r),
                }
            },
            ClientStream::Tls(tls) => {
                let before = self.input.len();
                ready!(tokio_util::io::poll_read_buf(Pin::new(tls.as_mut()), cx, &mut self.input))?;
                Poll::Ready(Ok(self.input.len() - before))
            }
        }
    }

    /// Answers the refusal the connection ended with, if any, and closes.
    async fn finish(mut self) {
        let Some((refusal, mid_body)) = self.refusal.take() else { return };
        // A request the service already answered is not answered twice.
        if mid_body && self.progress.answered.load(Ordering::Relaxed) {
            return;
        }
        let wrote = tokio::time::timeout(LINGER, self.tcp.write_all(&refusal.answer())).await;
        if matches!(wrote, Ok(Ok(()))) {
            linger(&mut self.tcp, None).await;
        }
    }
}

impl AsyncRead for Guarded {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.checked > 0 {
                let n = this.checked.min(buf.remaining());
                buf.put_slice(&this.input[..n]);
                this.input.advance(n);
                this.checked -= n;
                return Poll::Ready(Ok(()));
            }
            if this.refusal.is_some() {
                // Mid-request, hyper is dropped (`abort`: the hand-off sees it as soon as
                // this poll returns); idle, it takes the end of stream and closes. Either
                // way `finish` answers.
                if this.busy() {
                    this.progress.abort.store(true, Ordering::Relaxed);
                    return Poll::Pending;
                }
                return Poll::Ready(Ok(()));
            }
            if let Err(refusal) = this.advance() {
                this.refuse(refusal);
                continue;
            }
            if this.checked > 0 {
                continue;
            }
            if this.eof {
                // Requests the client sent before its end wait for the answer in progress.
                let held = matches!(this.at, At::Head) && !this.input.is_empty() && this.busy();
                return if held { Poll::Pending } else { Poll::Ready(Ok(())) };
            }
            match this.poll_deadline(cx) {
                // Idle too long: hyper sees the end of stream and closes, without a word.
                Some(Lapse::Idle) => {
                    this.eof = true;
                    continue;
                }
                Some(Lapse::Head) => {
                    this.refuse(Refusal::HeadTimeout(this.limits.header_read_timeout));
                    continue;
                }
                Some(Lapse::Body) => {
                    let refusal = this.body_refusal();
                    this.refuse(refusal);
                    continue;
                }
                None => {}
            }
            // Requests pipelined behind an answer are held, up to a bound.
            if matches!(this.at, At::Head) && this.busy() && this.input.len() >= MAX_PIPELINED_BYTES {
                return Poll::Pending;
            }
            if ready!(this.poll_fill(cx))? == 0 {
                this.eof = true;
            }
        }
    }
}

impl AsyncWrite for Guarded {
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
        let this = self.get_mut();
        // A refused connection stays open for its answer (`finish`).
        if this.refusal.is_some() {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.tcp).poll_shutdown(cx)
    }
}

// === impl Tracked ===

impl<S, B> hyper::service::Service<Request<Incoming>> for Tracked<S>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>>,
    S::Future: Unpin,
{
    type Response = Response<Answered<B>>;
    type Error = S::Error;
    type Future = Tracking<S::Future>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        self.progress.open.fetch_add(1, Ordering::AcqRel);
        self.progress.answered.store(false, Ordering::Relaxed);
        Tracking { inner: self.inner.call(req), open: Some(Open(self.progress.clone())) }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<F, B, E> std::future::Future for Tracking<F>
where
    F: std::future::Future<Output = Result<Response<B>, E>> + Unpin,
{
    type Output = Result<Response<Answered<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let answer = ready!(Pin::new(&mut this.inner).poll(cx));
        let open = this.open.take();
        Poll::Ready(answer.map(|r| {
            if let Some(open) = &open {
                open.0.answered.store(true, Ordering::Relaxed);
            }
            r.map(|body| Answered { body, _open: open })
        }))
    }
}

impl<B: http_body::Body + Unpin> http_body::Body for Answered<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
