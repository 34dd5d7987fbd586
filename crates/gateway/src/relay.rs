//! The relay phase: the answer filters every relayed answer passes
//! ([`Tap`]: the request's load and status, the first byte's prefill mark,
//! the response-cache recorder, a worker failing mid-answer), on both front
//! ends; and the axum front end's relay over them: the answer's head and
//! end-to-end headers, its body frame by frame with the mid-answer deadline,
//! and (for a disaggregated answer) a cut when the prefill leg fails. The
//! fast path's byte relay (`h1::upstream::relay`) runs the same [`Tap`].

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderName, HeaderValue, header};
use axum::response::Response;
use serde_json::json;
use tracing::warn;

use crate::cache::Recorder;
use crate::pipeline::account::InFlight;
use crate::pipeline::request::relayed;
use fleet::Worker;
use h1_codec::Route;

/// The keep-alive frame of an OpenAI-shaped event stream: a comment, which clients skip.
const SSE_KEEPALIVE: &[u8] = b": keep-alive\n\n";
/// The keep-alive frame of Anthropic's event streams: its `ping` event.
const ANTHROPIC_PING: &[u8] = b"event: ping\ndata: {\"type\": \"ping\"}\n\n";

/// How long a worker has been silent mid-answer, for both relays: the deadline that fails it
/// (`--upstream-idle-timeout-secs`) and an event stream's keep-alive period
/// (`--sse-keepalive-secs`), kept by one timer that is re-armed only when it fires (a read
/// notes its time; no timer update per token).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Silence {
    last: tokio::time::Instant,
    pinged: tokio::time::Instant,
    limit: std::time::Duration,
    ping: Option<std::time::Duration>,
}

/// What a fired timer means.
pub(crate) enum Quiet {
    /// Silent past the limit: the worker has failed.
    Failed,
    /// Silent for the keep-alive period: a keep-alive frame may go out; re-armed.
    Ping,
    /// Not yet: re-arm the timer for then.
    Wait(tokio::time::Instant),
}

impl Silence {
    /// From `now`, failing after `limit`, with keep-alives every `ping`.
    pub(crate) fn new(
        now: tokio::time::Instant,
        limit: std::time::Duration,
        ping: Option<std::time::Duration>,
    ) -> Self {
        Self { last: now, pinged: now, limit, ping }
    }

    /// The worker sent something at `now`.
    pub(crate) fn heard(&mut self, now: tokio::time::Instant) {
        self.last = now;
    }

    /// The silence limit.
    pub(crate) fn limit(&self) -> std::time::Duration {
        self.limit
    }

    /// When the timer is next due: the failure deadline or the next keep-alive.
    pub(crate) fn due(&self) -> tokio::time::Instant {
        let fail = self.last + self.limit;
        self.ping.map_or(fail, |every| (self.last.max(self.pinged) + every).min(fail))
    }

    /// The timer fired at `now`.
    pub(crate) fn fired(&mut self, now: tokio::time::Instant) -> Quiet {
        if now >= self.last + self.limit {
            return Quiet::Failed;
        }
        if self.ping.is_some_and(|every| now >= self.last.max(self.pinged) + every) {
            self.pinged = now;
            return Quiet::Ping;
        }
        Quiet::Wait(self.due())
    }
}

/// An answer body from the router's own client (`h1::answer`), boxed for the relay.
pub(crate) type UpstreamBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;
/// Its error.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A worker failed in the middle of its answer: it leaves rotation, and an
/// event stream (`sse`) gets this last event, so the client's stream ends cleanly.
pub(crate) fn failed_mid_answer(worker: &Worker, e: &dyn std::fmt::Display, sse: Option<Route>) -> Option<Bytes> {
    warn!(worker = %worker.url, error = %e, "worker failed mid-response");
    worker.request_failed();
    let message = format!("upstream worker {} failed mid-stream: {e}", worker.url);
    sse.map(|route| last_event(route, &message))
}

/// The last event of a stream the router ends on `route`: OpenAI's error event then `[DONE]`,
/// or Anthropic's `error` event (its streams have no `[DONE]`).
fn last_event(route: Route, message: &str) -> Bytes {
    ending_event(route, (502, "upstream_unreachable"), message)
}

/// The last event of a stream the router ends on `route` with an error of `status` and `kind`
/// (OpenAI's `type`; Anthropic's is its status's).
pub(crate) fn ending_event(route: Route, (status, kind): (u16, &str), message: &str) -> Bytes {
    if route.anthropic() {
        let event = crate::error::anthropic_error(status, message);
        Bytes::from(format!("event: error\ndata: {event}\n\n"))
    } else {
        let event = json!({"error": {"message": message, "type": kind, "code": status}});
        Bytes::from(format!("data: {event}\n\ndata: [DONE]\n\n"))
    }
}

/// The answer filters of one relayed answer, whatever writes it: the
/// request's accounting (its status, held until the answer ends, counted
/// once when the tap is dropped), the worker's first byte (the prefill is
/// over), the response-cache recorder of a miss, and a worker failing or
/// falling silent mid-answer (the answer counts as cut, the worker leaves
/// rotation, an event stream gets a last error event).
pub(crate) struct Tap {
    guard: InFlight,
    worker: Arc<Worker>,
    /// The answer is an event stream (`text/event-stream`).
    sse: bool,
    /// The last bytes relayed (an event ends with a blank line); `None` before any.
    tail: Option<[u8; 2]>,
    /// The answer so far, for the response cache (dropped when it fails or grows too large).
    recorder: Option<Recorder>,
    /// The worker's report of its cached prompt tokens, read as the answer passes (a
    /// successful answer to a prompt the router predicted for).
    cached: Option<(u64, crate::cached::CachedScan)>,
}

impl Tap {
    /// Taps the answer of `worker` with `status` and `content_type`.
    pub(crate) fn new(guard: InFlight, worker: Arc<Worker>, status: u16, content_type: Option<HeaderValue>) -> Tap {
        let sse = content_type.as_ref().is_some_and(|c| c.as_bytes().starts_with(b"text/event-stream"));
        Self::read(guard, worker, (status, sse), move || content_type)
    }

    /// Taps the answer of `worker` with `status`, an event stream when `sse`; its content type
    /// (`content_type()`) is read only if the response cache records the answer.
    pub(crate) fn read(
        mut guard: InFlight,
        worker: Arc<Worker>,
        (status, sse): (u16, bool),
        content_type: impl FnOnce() -> Option<HeaderValue>,
    ) -> Tap {
        guard.status = status;
        // A response-cache miss records a successful answer as it passes, to keep it once complete.
        let recorder = guard.cache.take().and_then(|t| Recorder::new(t, status, content_type()));
        let cached = guard.predicted.filter(|_| status == 200).map(|p| (p, crate::cached::CachedScan::default()));
        Tap { guard, worker, sse, tail: None, recorder, cached }
    }

    /// The keep-alive frame an event stream may carry now: between two events (or before the
    /// first), never inside one (a comment line there would end the event early). `None` for
    /// any other answer.
    pub(crate) fn keepalive(&self) -> Option<&'static [u8]> {
        if !self.sse || self.tail.is_some_and(|t| t != *b"\n\n") {
            return None;
        }
        Some(if self.guard.route().anthropic() { ANTHROPIC_PING } else { SSE_KEEPALIVE })
    }

    /// Bytes of the answer's body on their way to the client.
    pub(crate) fn data(&mut self, data: &[u8]) {
        if self.sse
            && let Some(&last) = data.last()
        {
            let before = data.len().checked_sub(2).map_or(self.tail.map_or(0, |t| t[1]), |i| data[i]);
            self.tail = Some([before, last]);
        }
        // The first byte of a streamed answer follows the first token.
        self.guard.load.prefill_done();
        if let Some(r) = self.recorder.as_mut()
            && !r.push(data)
        {
            self.recorder = None;
        }
        if let Some((_, scan)) = self.cached.as_mut() {
            scan.push(data);
        }
    }

    /// The answer went through whole: a recorded one is kept in the response cache.
    pub(crate) fn ended(&mut self) {
        if let Some(r) = self.recorder.take() {
            r.ended();
        }
        if let Some((predicted, scan)) = self.cached.take() {
            self.guard.metrics().cached.answered(predicted, scan.reported());
        }
    }

    /// The worker failed or fell silent mid-answer (`e`): the answer is cut and
    /// the worker leaves rotation. Returns the last event an event stream ends
    /// with, when the answer's framing can still end cleanly (`can_end`).
    pub(crate) fn failed(&mut self, e: &dyn std::fmt::Display, can_end: bool) -> Option<Bytes> {
        self.recorder = None;
        self.guard.cut();
        failed_mid_answer(&self.worker, e, (self.sse && can_end).then(|| self.guard.route()))
    }

    /// The worker failed before any of its answer went out: the client gets a 502 instead.
    pub(crate) fn failed_before_head(&mut self, e: &dyn std::fmt::Display) {
        self.recorder = None;
        self.guard.status = 502;
        let _ = failed_mid_answer(&self.worker, e, None);
    }

    /// The router cut the answer (`why`, a disaggregated answer's prefill leg failed):
    /// counted as cut; an event stream gets a last error event.
    fn cut(&mut self, why: &str) -> Option<Bytes> {
        self.recorder = None;
        self.guard.cut();
        warn!(worker = %self.worker.url, why, "answer cut");
        self.sse.then(|| last_event(self.guard.route(), why))
    }

    /// The request's route.
    pub(crate) fn route(&self) -> Route {
        self.guard.route()
    }

    /// The worker whose answer this is.
    pub(crate) fn worker(&self) -> &Arc<Worker> {
        &self.worker
    }
}

/// Passes the worker's answer through frame by frame: its status, its
/// end-to-end headers and its length (a sized answer goes out in one write,
/// not chunked); a redirect goes back to the client, not followed. A worker that dies
/// mid-stream ends the stream with an error event (server-sent events) and
/// leaves rotation; a client that goes away drops the upstream request.
pub(crate) fn stream_back(
    guard: InFlight,
    worker: Arc<Worker>,
    resp: axum::http::Response<UpstreamBody>,
    limits: &crate::ClientLimits,
    ending: Ending,
) -> Response {
    let (mut parts, body) = resp.into_parts();
    // The worker's headers pass through, except hop-by-hop ones and the length (set from the body).
    // Transfer codings other than `chunked` (say `gzip, chunked`) stay: the body is still coded,
    // and hyper frames it in chunks whatever the worker's framing was.
    let coded = parts
        .headers
        .get(header::TRANSFER_ENCODING)
        .is_some_and(|te| !te.as_bytes().trim_ascii().eq_ignore_ascii_case(b"chunked"));
    let connection: Vec<&str> =
        parts.headers.get_all(header::CONNECTION).iter().filter_map(|v| v.to_str().ok()).collect();
    let connection = connection.join(",");
    let dropped: Vec<HeaderName> = parts
        .headers
        .keys()
        .filter(|n| !relayed(n.as_str(), &connection) && (!coded || *n != header::TRANSFER_ENCODING))
        .cloned()
        .collect();
    for name in dropped {
        parts.headers.remove(name);
    }
    let tap = Tap::new(guard, worker, parts.status.as_u16(), parts.headers.get(header::CONTENT_TYPE).cloned());
    // An event stream's keep-alive, when it is one and they are on.
    let every = limits.sse_keepalive;
    let ping = (tap.keepalive().is_some() && !every.is_zero()).then_some(every);
    let silence = Silence::new(tokio::time::Instant::now(), limits.upstream_idle_timeout, ping);
    let timer = Box::pin(tokio::time::sleep_until(silence.due()));
    let relay = Relay { inner: body, tap: Some(tap), timer, silence, ending };
    let mut response = Response::new(Body::new(relay));
    *response.status_mut() = parts.status;
    *response.headers_mut() = parts.headers;
    response
}

/// How a relayed answer may end besides its own end (a disaggregated
/// request's decode answer: cut when its prefill leg fails, and telling the
/// prefill leg when it ends).
#[derive(Default)]
pub(crate) struct Ending {
    /// Resolves with a reason to end the answer now, as a failure.
    pub(crate) cut: Option<futures_util::future::BoxFuture<'static, String>>,
    /// Dropped when the answer ends, however it ends (held, never sent on).
    pub(crate) _ended: Option<tokio::sync::oneshot::Sender<()>>,
}

/// The body of a proxied answer; its tap holds the request's load until it ends.
struct Relay {
    inner: UpstreamBody,
    /// `None` once the answer ended, whole or not.
    tap: Option<Tap>,
    /// Fires when the worker's silence is due a verdict ([`Silence`]).
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
    silence: Silence,
    ending: Ending,
}

impl http_body::Body for Relay {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        use std::task::Poll;
        let this = self.get_mut();
        let Some(tap) = this.tap.as_mut() else { return Poll::Ready(None) };
        // A failed answer's last frame: an event stream's error event, or an error (the client sees it cut).
        let last = |tail: Option<Bytes>, e: String| match tail {
            Some(tail) => Poll::Ready(Some(Ok(http_body::Frame::data(tail)))),
            None => Poll::Ready(Some(Err(std::io::Error::other(e)))),
        };
        if let Some(cut) = this.ending.cut.as_mut()
            && let Poll::Ready(why) = cut.as_mut().poll(cx)
        {
            let tail = tap.cut(&why);
            this.tap = None;
            this.ending = Ending::default();
            return last(tail, why);
        }
        match std::pin::Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    tap.data(data);
                }
                this.silence.heard(tokio::time::Instant::now());
                if this.inner.is_end_stream() {
                    tap.ended();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                let tail = tap.failed(&e, true);
                this.tap = None;
                last(tail, e.to_string())
            }
            Poll::Ready(None) => {
                tap.ended();
                this.tap = None;
                Poll::Ready(None)
            }
            // Silent: past the limit the worker has failed, as one that broke the connection; an
            // event stream gets a keep-alive frame each period, between events.
            Poll::Pending => loop {
                if this.timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                match this.silence.fired(tokio::time::Instant::now()) {
                    Quiet::Failed => {
                        let e = format!("no data from the worker within {:?}", this.silence.limit());
                        let tail = tap.failed(&e, true);
                        this.tap = None;
                        return last(tail, e);
                    }
                    Quiet::Ping => {
                        this.timer.as_mut().reset(this.silence.due());
                        if let Some(frame) = tap.keepalive() {
                            return Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(frame)))));
                        }
                    }
                    Quiet::Wait(at) => this.timer.as_mut().reset(at),
                }
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.tap.is_none() || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use http_body_util::BodyExt;
    use tokio::sync::mpsc;

    use super::*;
    use crate::pipeline::admission::Admission;
    use crate::pipeline::request::Route;

    /// A worker's answer whose body frames the test sends on the channel (an error breaks it).
    fn answer(content_type: &str) -> (mpsc::Sender<Result<Bytes, BoxError>>, axum::http::Response<UpstreamBody>) {
        let (tx, rx) = mpsc::channel::<Result<Bytes, BoxError>>(8);
        let frames = futures_util::stream::unfold(rx, |mut rx| async move {
            let next = rx.recv().await?;
            Some((next.map(http_body::Frame::data), rx))
        });
        let body = http_body_util::StreamBody::new(frames).boxed_unsync();
        let mut resp = axum::http::Response::new(body);
        resp.headers_mut().insert(header::CONTENT_TYPE, content_type.parse().unwrap());
        resp.headers_mut().insert(header::CONNECTION, "keep-alive".parse().unwrap());
        (tx, resp)
    }

    /// A relay of `resp` from the test gateway's one worker, holding its load and admission.
    async fn relayed(resp: axum::http::Response<UpstreamBody>, idle: Duration) -> (Arc<crate::Gateway>, Response) {
        relayed_with(resp, idle, Duration::ZERO, Route::Chat).await
    }

    /// The same with keep-alive frames every `keepalive` on `route`.
    async fn relayed_with(
        resp: axum::http::Response<UpstreamBody>,
        idle: Duration,
        keepalive: Duration,
        route: Route,
    ) -> (Arc<crate::Gateway>, Response) {
        let gw = crate::testing::gateway(&["http://127.0.0.1:1"], crate::RetryConfig::default()).await;
        let worker = gw.fleet.all()[0].clone();
        let guard =
            InFlight::new(gw.clone(), Admission::admit(&gw, 10).unwrap(), worker.charge(0), route, Instant::now());
        let limits =
            crate::ClientLimits { upstream_idle_timeout: idle, sse_keepalive: keepalive, ..Default::default() };
        (gw, stream_back(guard, worker, resp, &limits, Ending::default()))
    }

    fn requests(gw: &crate::Gateway, status: &str) -> u64 {
        gw.metrics.requests.get(&format!("route=\"chat\",status=\"{status}\""))
    }

    #[tokio::test]
    async fn a_whole_answer_passes_with_its_end_to_end_headers_and_is_counted_once_at_its_end() {
        let (tx, resp) = answer("application/json");
        let (gw, out) = relayed(resp, Duration::from_secs(10)).await;
        assert!(out.headers().get(header::CONNECTION).is_none(), "hop-by-hop headers stay on the hop");
        assert_eq!(out.headers()[header::CONTENT_TYPE], "application/json");
        let worker = gw.fleet.all()[0].clone();
        assert_eq!(worker.load().in_flight, 1, "held while the body streams");
        tx.send(Ok(Bytes::from_static(b"{\"a\":"))).await.unwrap();
        tx.send(Ok(Bytes::from_static(b"1}"))).await.unwrap();
        drop(tx);
        let body = out.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "{\"a\":1}");
        assert_eq!(worker.load().in_flight, 0, "released at its end");
        assert_eq!((requests(&gw, "200"), gw.in_flight()), (1, 0));
        assert_eq!(gw.metrics.answers_cut.get("route=\"chat\""), 0);
    }

    #[tokio::test]
    async fn a_stream_broken_mid_answer_ends_with_an_error_event_and_counts_as_cut() {
        let (tx, resp) = answer("text/event-stream");
        let (gw, out) = relayed(resp, Duration::from_secs(10)).await;
        tx.send(Ok(Bytes::from_static(b"data: {\"x\":1}\n\n"))).await.unwrap();
        tx.send(Err("connection reset".into())).await.unwrap();
        let body = out.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&body);
        assert!(text.starts_with("data: {\"x\":1}\n\n"), "{text}");
        assert!(text.contains("\"type\":\"upstream_unreachable\"") && text.ends_with("data: [DONE]\n\n"), "{text}");
        assert_eq!(requests(&gw, "200"), 1, "the client saw a 200 head");
        assert_eq!(gw.metrics.answers_cut.get("route=\"chat\""), 1);
        assert!(!gw.fleet.all()[0].is_routable(), "the worker left rotation");
    }

    /// The next frame of `body`'s stream, or `None` when none comes within `wait` (virtual time).
    async fn next_frame(body: &mut Body, wait: Duration) -> Option<Bytes> {
        let frame = tokio::time::timeout(wait, body.frame()).await.ok()??.ok()?;
        frame.into_data().ok()
    }

    #[tokio::test]
    async fn a_silent_event_stream_gets_keep_alive_frames_between_events_only() {
        let hour = Duration::from_secs(3600);
        let every = Duration::from_secs(15);
        let (tx, resp) = answer("text/event-stream");
        let (_gw, out) = relayed_with(resp, hour, every, Route::Chat).await;
        // Virtual time from here (the test gateway is up): a quarter hour of silence at once.
        tokio::time::pause();
        let mut body = out.into_body();
        tx.send(Ok(Bytes::from_static(b"data: {\"x\":1}\n\n"))).await.unwrap();
        assert_eq!(next_frame(&mut body, hour).await.unwrap(), "data: {\"x\":1}\n\n");
        // The worker falls silent between events: a comment after the period, and again.
        assert_eq!(next_frame(&mut body, every * 2).await.unwrap(), ": keep-alive\n\n");
        assert_eq!(next_frame(&mut body, every * 2).await.unwrap(), ": keep-alive\n\n");
        // Inside an event (a line cut short) none goes: it would end the event early.
        tx.send(Ok(Bytes::from_static(b"data: {\"x\":"))).await.unwrap();
        assert_eq!(next_frame(&mut body, hour).await.unwrap(), "data: {\"x\":");
        assert_eq!(next_frame(&mut body, every * 4).await, None, "nothing mid-event");
        tx.send(Ok(Bytes::from_static(b"2}\n\n"))).await.unwrap();
        assert_eq!(next_frame(&mut body, hour).await.unwrap(), "2}\n\n");
        drop(tx);
        assert!(body.frame().await.is_none(), "the stream ends when the worker's does");
    }

    #[tokio::test]
    async fn anthropic_streams_get_its_ping_event_and_other_answers_nothing() {
        let (hour, every) = (Duration::from_secs(3600), Duration::from_secs(15));
        let (tx, resp) = answer("text/event-stream");
        let (_gw, out) = relayed_with(resp, hour, every, Route::Messages).await;
        tokio::time::pause();
        let mut body = out.into_body();
        assert_eq!(next_frame(&mut body, every * 2).await.unwrap(), "event: ping\ndata: {\"type\": \"ping\"}\n\n");
        drop(tx);
        tokio::time::resume();
        // A whole (JSON) answer never gets one, nor does any stream with keep-alives off.
        let (tx, resp) = answer("application/json");
        let (_gw, json) = relayed_with(resp, hour, every, Route::Chat).await;
        let (tx2, resp) = answer("text/event-stream");
        let (_gw2, off) = relayed_with(resp, hour, Duration::ZERO, Route::Chat).await;
        tokio::time::pause();
        assert_eq!(next_frame(&mut json.into_body(), every * 4).await, None);
        assert_eq!(next_frame(&mut off.into_body(), every * 4).await, None);
        drop((tx, tx2));
    }

    #[tokio::test]
    async fn a_worker_silent_mid_answer_past_the_limit_is_cut() {
        let (tx, resp) = answer("application/json");
        let (gw, out) = relayed(resp, Duration::from_millis(50)).await;
        tx.send(Ok(Bytes::from_static(b"{\"partial\":"))).await.unwrap();
        // Nothing more comes (the sender stays open): the relay's own deadline ends it.
        let collected = out.into_body().collect().await;
        assert!(collected.is_err(), "a sized body cannot end cleanly: the client sees it fail");
        assert_eq!(gw.metrics.answers_cut.get("route=\"chat\""), 1);
        assert_eq!(gw.in_flight(), 0);
        drop(tx);
    }
}
