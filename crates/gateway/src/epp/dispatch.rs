//! The dispatch and answer phases of a picked request: the pipeline's
//! `forward` runs with a send that names the worker to the gateway (the
//! header, the `envoy.lb` metadata, the body as routed) and takes the
//! answer's head from the gateway's report; the answer then passes the
//! relay's filters (`relay::Tap`) as the gateway reports its body, and its
//! load is held until it ends.

use std::future::{Future, Pending};
use std::pin::Pin;
use std::sync::Arc;

use axum::http::HeaderValue;
use bytes::Bytes;
use ext_proc::Status;
use ext_proc::proto::{
    BodyResponse, CommonResponse, HeaderMutation, HeaderValueOption, HeadersResponse, HttpBody, Mutation, Phase, Reply,
    StreamedBodyResponse, TrailersResponse, body_mode,
};
use fleet::Worker;
use h1_codec::Route;
use router_types::DpRank;
use tokio::sync::oneshot;

use super::reply::{self, Edits};
use super::{Body, Stream, common, next, said};
use crate::GatewayError;
use crate::pipeline::account::InFlight;
use crate::pipeline::account::count_error;
use crate::pipeline::admission::Admission;
use crate::pipeline::forward::{Forwarded, forward};
use crate::pipeline::request::Meta;
use crate::pipeline::retry::next_worker;
use crate::pools::{HeaderEdits, Routing};
use crate::relay::Tap;
use crate::send::{AnswerHead, SendError};

/// The endpoint the gateway may fall back to when `chosen` fails before answering (the
/// Endpoint Picker Protocol's single fallback): where the router's own retry would go
/// ([`next_worker`]: the least loaded other routable worker of its pool, one a liveness veto
/// leaves out last), within the gateway's subset hint; none when it has no such peer. Read
/// from the fleet as it is when the pick is named.
pub(super) fn fallback(gw: &crate::Gateway, chosen: &Worker, subset: Option<&planner::Subset>) -> Option<String> {
    let pool = gw.pools.iter().find(|p| p.id == chosen.pool)?;
    let allowed: Vec<Arc<Worker>> =
        gw.fleet.snapshot().iter().filter(|w| subset.is_none_or(|s| s.allows(w))).cloned().collect();
    let next = next_worker(gw, &allowed, pool, chosen, &[]).filter(|w| w.id != chosen.id)?;
    Some(planner::authority(next.url.as_str()).to_owned())
}

/// What the router's own legs carry besides their bodies (a disaggregated request's prefill):
/// the workers' credentials as the pick's edits decide them, the request's id.
fn leg_extra(gw: &crate::Gateway, client: Option<&[u8]>, id: &str) -> crate::h1::upstream::Extra {
    let mut lines = Vec::with_capacity(128);
    crate::pipeline::request::push_header(&mut lines, b"content-type", b"application/json");
    if let Some(auth) = crate::pipeline::auth::worker_credentials(gw, client) {
        crate::pipeline::request::push_header(&mut lines, b"authorization", &auth);
    }
    crate::pipeline::request::push_header(&mut lines, h1_codec::REQUEST_ID_HEADER.as_bytes(), id.as_bytes());
    crate::h1::upstream::Extra::new(gw, Bytes::from(lines), None)
}

/// The largest body chunk sent back in the full-duplex mode.
const CHUNK: usize = 64 << 10;

/// The answer's status as the gateway reported it: the dispatch phase's answer head.
pub(super) struct Head(u16);

impl AnswerHead for Head {
    fn status(&self) -> u16 {
        self.0
    }
}

/// What the dispatch phase sends: the worker, the body as routed, its rank and edits.
struct Pick {
    worker: Arc<Worker>,
    body: Bytes,
    rank: Option<DpRank>,
    edits: Option<Arc<HeaderEdits>>,
}

/// What `forward` comes to.
type Forwarding = Result<Forwarded<Head>, GatewayError>;

/// A dispatch waiting for its answer's head.
pub(super) struct Dispatch<'a, F> {
    source: Source<'a, F>,
    route: Route,
}

/// Where the answer's accounting comes from.
enum Source<'a, F> {
    /// The pipeline's future, and where the head goes (it returns the request's guard).
    Pending { fwd: Pin<&'a mut F>, head: oneshot::Sender<u16> },
    /// Placed already (a disaggregated request's decode leg): its guard and worker.
    Placed(Box<InFlight>, Arc<Worker>),
}

/// No dispatch: a request the picker placed without the pipeline.
pub(super) const NO_DISPATCH: Option<Dispatch<'static, Pending<Forwarding>>> = None;

/// What came of the select and plan phases (one per request, moved once: its size does not matter).
#[allow(clippy::large_enum_variant)]
enum Planned {
    Picked(Pick),
    Done(Forwarding),
    /// The gateway ended the stream (or broke the protocol) meanwhile.
    Left(Status),
}

impl Stream<'_> {
    /// Selects and plans `body` with the pipeline, names the worker to the gateway, then
    /// follows the answer.
    pub(super) async fn dispatch(
        &mut self,
        route: Route,
        (routing, admission, meta): (Option<Arc<Routing>>, Admission, Meta),
        body: Body,
        authorization: Option<&[u8]>,
    ) -> Status {
        let gw = self.gw;
        let (pick_tx, pick_rx) = oneshot::channel::<Pick>();
        let (head_tx, head_rx) = oneshot::channel::<u16>();
        let mut once = Some((pick_tx, head_rx));
        let send = move |worker, body, rank, edits| {
            let once = once.take();
            async move {
                let gone = |message: &str| SendError { connect: false, message: message.into() };
                let Some((pick, head)) = once else { return Err(gone("an endpoint picker sends a request once")) };
                pick.send(Pick { worker, body, rank, edits }).map_err(|_| gone("the gateway left"))?;
                head.await.map(Head).map_err(|_| gone("the gateway reported no answer"))
            }
        };
        let original = body.bytes.clone();
        let fwd = forward(gw, admission, (route, routing), body.bytes, self.start, &meta, send);
        tokio::pin!(fwd);
        let planned = tokio::select! {
            out = &mut fwd => Planned::Done(out),
            pick = pick_rx => match pick {
                Ok(pick) => Planned::Picked(pick),
                Err(_) => Planned::Left(Status::new(Status::INTERNAL, "the pipeline dropped its send")),
            },
            m = self.calls.next::<ext_proc::proto::ProcessingRequest>() => Planned::Left(match m {
                Ok(None) => Status::new(Status::CANCELLED, "the gateway ended the stream before the pick"),
                Ok(Some(_)) => Status::new(Status::INVALID_ARGUMENT, "a message before the pick was answered"),
                Err(status) => status,
            }),
        };
        let pick = match planned {
            Planned::Picked(pick) => pick,
            Planned::Left(status) => return status,
            Planned::Done(Ok(Forwarded::Cached(hit))) => {
                self.counted("answered");
                let _ = self.send(&reply::cached(&hit, &self.id)).await;
                return Status::ok();
            }
            Planned::Done(Ok(Forwarded::Disaggregated(d))) => {
                return self.disaggregated(route, d, (body.trailers, authorization), &meta).await;
            }
            Planned::Done(Ok(Forwarded::Made(_))) => {
                let why =
                    "gRPC workers are not served through the endpoint picker; route them to the router's HTTP listener";
                return self.refuse(&GatewayError::Unprocessable(why.into()), Some(route)).await;
            }
            Planned::Done(Ok(Forwarded::Sent(..))) => {
                return Status::new(Status::INTERNAL, "the pipeline answered without its send");
            }
            Planned::Done(Err(e)) => return self.refuse(&e, Some(route)).await,
        };
        let Pick { worker, body: routed, rank, edits } = pick;
        let endpoint = planner::authority(worker.url.as_str()).to_owned();
        let changed = routed != original;
        let edits = Edits {
            rank: rank.map(|r| r.0),
            edits: edits.as_deref(),
            content_length: changed.then_some(routed.len()),
            ..Edits::new(gw, authorization, &self.id)
        };
        let mutation = reply::pick(&endpoint, edits);
        let fallback = fallback(gw, &worker, meta.subset.as_deref());
        let named = (endpoint.as_str(), fallback.as_deref());
        if let Err(status) = self.name(named, mutation, routed, changed, body.trailers).await {
            return status;
        }
        self.counted("picked");
        self.answer_phase(Some(Dispatch { source: Source::Pending { fwd, head: head_tx }, route })).await
    }

    /// A request planned to a disaggregated pool: the router sends its prefill leg, the
    /// gateway carries its decode leg (`pd::for_picker`).
    async fn disaggregated(
        &mut self,
        route: Route,
        d: Box<crate::pipeline::forward::Disaggregated>,
        (trailers, authorization): (bool, Option<&[u8]>),
        meta: &Meta,
    ) -> Status {
        let gw = self.gw;
        let extra = leg_extra(gw, authorization, &self.id);
        let leg = match crate::pd::for_picker(gw, d, route, &extra, self.start, meta).await {
            Ok(leg) => leg,
            Err(e) => return self.refuse(&e, Some(route)).await,
        };
        let endpoint = planner::authority(leg.worker.url.as_str()).to_owned();
        let edits = Edits {
            edits: leg.edits.as_deref(),
            content_length: Some(leg.body.len()),
            ..Edits::new(gw, authorization, &self.id)
        };
        let mutation = reply::pick(&endpoint, edits);
        if let Err(status) = self.name((&endpoint, None), mutation, leg.body, true, trailers).await {
            return status;
        }
        self.counted("picked");
        let placed = Source::Placed(Box::new(leg.guard), leg.worker);
        self.answer_phase(Some(Dispatch::<Pending<Forwarding>> { source: placed, route })).await
    }

    /// Tells the gateway where the request goes (and the body to send there).
    async fn name(
        &mut self,
        (endpoint, fallback): (&str, Option<&str>),
        mutation: HeaderMutation,
        body: Bytes,
        changed: bool,
        trailers: bool,
    ) -> Result<(), Status> {
        let metadata = Some(reply::lb_metadata(endpoint, fallback));
        if self.request_mode != body_mode::FULL_DUPLEX_STREAMED {
            // Buffered: the answer to the body carries the headers' changes and the new body.
            let body = changed.then_some(Mutation::Body(body));
            let mut said = said(Reply::RequestBody(BodyResponse { response: common(Some(mutation), body) }));
            said.dynamic_metadata = metadata;
            return self.send(&said).await;
        }
        // Full duplex: the headers' answer, then the body streamed back in chunks.
        let mut head = said(Reply::RequestHeaders(HeadersResponse { response: common(Some(mutation), None) }));
        head.dynamic_metadata = metadata;
        self.send(&head).await?;
        let mut rest = body;
        loop {
            let chunk = rest.split_to(rest.len().min(CHUNK));
            let last = rest.is_empty();
            let streamed = StreamedBodyResponse { body: chunk, end_of_stream: last && !trailers };
            let part = common(None, Some(Mutation::StreamedResponse(streamed)));
            self.send(&said(Reply::RequestBody(BodyResponse { response: part }))).await?;
            if last {
                break;
            }
        }
        if trailers {
            self.send(&said(Reply::RequestTrailers(TrailersResponse::default()))).await?;
        }
        Ok(())
    }

    /// Follows the answer as the gateway reports it: its head goes to the dispatch (which
    /// returns the request's load and accounting), its body through the answer filters,
    /// each part answered (echoed in the full-duplex mode). Ends with the answer or the stream.
    pub(super) async fn answer_phase<F>(&mut self, dispatch: Option<Dispatch<'_, F>>) -> Status
    where
        F: Future<Output = Forwarding>,
    {
        match self.follow(dispatch).await {
            Ok(()) => Status::ok(),
            Err(status) => status,
        }
    }

    async fn follow<F>(&mut self, mut dispatch: Option<Dispatch<'_, F>>) -> Result<(), Status>
    where
        F: Future<Output = Forwarding>,
    {
        let gw = self.gw;
        let mut tap: Option<Tap> = None;
        let streamed = self.response_mode != body_mode::NONE;
        let mut answered = false;
        loop {
            // Until the head: the request's timeout; then between parts of a streamed answer (the
            // request's timeout again when the gateway sends none).
            let wait = match answered && streamed {
                true => gw.config.limits.upstream_idle_timeout,
                false => gw.config.request_timeout,
            };
            let m = match next(&mut self.calls, wait).await {
                Ok(Some(m)) => m,
                // The gateway is done with the request: so is its load.
                Ok(None) => return Ok(()),
                // The gateway sends nothing of the answer's body (`NONE`): past the deadline
                // the load is let go, the answer left to the gateway.
                Err(_) if answered && !streamed => return Ok(()),
                Err(status) => {
                    if let Some(t) = tap.as_mut() {
                        t.failed(&status, false);
                    }
                    return Err(status);
                }
            };
            // Each message answered; `ended`: the answer is over.
            let (reply, ended) = match m.request {
                Some(Phase::ResponseHeaders(h)) => {
                    answered = true;
                    let headers = h.headers.unwrap_or_default();
                    let status = headers.get(":status").and_then(|s| std::str::from_utf8(s).ok()?.parse().ok());
                    let status: u16 = status.unwrap_or(0);
                    let content_type = headers.get("content-type").and_then(|v| HeaderValue::from_bytes(v).ok());
                    let mut route_headers = HeaderMutation::default();
                    if let Some(Dispatch { source, route }) = dispatch.take() {
                        let sent = match source {
                            Source::Placed(guard, worker) => Some((*guard, worker)),
                            Source::Pending { fwd, head } => {
                                let _ = head.send(status);
                                match fwd.await {
                                    Ok(Forwarded::Sent(guard, worker, _)) => Some((guard, worker)),
                                    Ok(_) => None,
                                    Err(e) => {
                                        count_error(gw, route, &e, Some(&self.id));
                                        None
                                    }
                                }
                            }
                        };
                        if let Some((mut guard, worker)) = sent {
                            let edits = guard.route_headers.take().map(|h| h.0).unwrap_or_default();
                            route_headers.set_headers.extend(
                                edits.iter().map(|(name, value)| HeaderValueOption::overwrite(name, value.as_bytes())),
                            );
                            tap = Some(Tap::new(guard, worker, status, content_type));
                        }
                    }
                    let edits = (!route_headers.set_headers.is_empty()).then_some(route_headers);
                    (Reply::ResponseHeaders(HeadersResponse { response: common(edits, None) }), h.end_of_stream)
                }
                Some(Phase::ResponseBody(b)) => {
                    if let Some(t) = tap.as_mut() {
                        t.data(&b.body);
                    }
                    let ended = b.end_of_stream;
                    let echo = self.response_mode == body_mode::FULL_DUPLEX_STREAMED;
                    (Reply::ResponseBody(BodyResponse { response: passed(b, echo) }), ended)
                }
                Some(Phase::ResponseTrailers(_)) => (Reply::ResponseTrailers(TrailersResponse::default()), true),
                // A request the picker placed by its headers alone: its body passes as it is.
                Some(Phase::RequestBody(b)) => {
                    let echo = self.request_mode == body_mode::FULL_DUPLEX_STREAMED;
                    (Reply::RequestBody(BodyResponse { response: passed(b, echo) }), false)
                }
                Some(Phase::RequestTrailers(_)) => (Reply::RequestTrailers(TrailersResponse::default()), false),
                Some(Phase::RequestHeaders(_)) | None => {
                    return Err(Status::new(Status::INVALID_ARGUMENT, "unexpected message in the answer phase"));
                }
            };
            if ended && let Some(t) = tap.as_mut() {
                // Whole: a recorded answer is kept before the gateway passes its end on.
                t.ended();
            }
            self.send(&said(reply)).await?;
            if ended {
                return Ok(());
            }
        }
    }
}

/// The answer to a body chunk the picker lets pass: in the full-duplex modes (`echo`) the
/// chunk itself, sent back as it came; otherwise a plain `CONTINUE`.
fn passed(chunk: HttpBody, echo: bool) -> Option<CommonResponse> {
    let streamed = StreamedBodyResponse { body: chunk.body, end_of_stream: chunk.end_of_stream };
    common(None, echo.then_some(Mutation::StreamedResponse(streamed)))
}
