//! What a proxied request is when its front end hands it to the pipeline
//! ([`Request`]: its route, routing snapshot, admission, body and [`Meta`],
//! what it carries besides, made from its headers in one place) and the
//! route headers an answer carries.
//! The wire-level parts (the routes, which headers cross a hop, their
//! serialized form) are the HTTP/1.1 codec's, re-exported here for the
//! pipeline's phases. Owns no state.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::http::HeaderValue;

use crate::Gateway;
use crate::pipeline::admission::Admission;
use crate::pools::Routing;

pub use h1_codec::PROXIED_PATHS;
pub(crate) use h1_codec::{
    RANK_HEADER, ROUTE_DEBUG_HEADER, ROUTE_MODE_HEADER, Route, forwarded, header_lines, push_header, relayed,
};

/// What a request carries besides its route and body.
#[derive(Debug, Clone, Default)]
pub(crate) struct Meta {
    /// Its id (`x-request-id`).
    pub(crate) id: String,
    /// The client's routing key (`x-smg-routing-key`): its worker by rendezvous hashing.
    pub(crate) routing_key: Option<Vec<u8>>,
    /// The routing explain in the answer's headers (`x-route-debug: KEY`, a control-plane key).
    pub(crate) route_debug: bool,
    /// The headers the routing config's header rules read (none without such rules).
    pub(crate) signal_headers: Vec<(String, String)>,
    /// The client's conversation id (`x-session-id`), at most 256 bytes.
    pub(crate) session: Option<Vec<u8>>,
    /// `cache-control: no-cache` or `no-store`: no response cache is read or written.
    pub(crate) cache_bypass: bool,
    /// A cascade's second attempt: this pool under this decision, not the decisions'.
    pub(crate) forced: Option<(std::sync::Arc<planner::Pool>, String)>,
    /// The caller's identity for the response caches (with a routing config; `None`: anonymous).
    pub(crate) caller: Option<[u8; 32]>,
    /// The only workers it may go to (an endpoint picker's subset hint; `None`: any).
    pub(crate) subset: Option<Arc<planner::Subset>>,
    /// Sent once, never retried here: the front end's proxy owns retries (the endpoint picker).
    pub(crate) one_attempt: bool,
    /// Its span in a trace (`--enable-trace`; `None`: off).
    pub(crate) trace: Option<otlp::TraceContext>,
    /// Its answer carries the decision record (`x-smg-cache-trace: 1`, or `--cache-trace-header`).
    pub(crate) cache_trace: bool,
    /// `x-route-mode: probe`: sent, no plugin storage written (see [`Mode`]).
    pub(crate) probe: bool,
}

/// A plugin mode (`x-route-mode`, a control-plane caller's, with `x-route-debug: KEY`): try a
/// routing config on live traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The decision and its plugins run; no model is called: the answer is what
    /// `POST /v1/route/preview` says of this request.
    Preview,
    /// The model is called; no plugin storage is written: the response cache is neither read
    /// nor written, no route id is issued (so no feedback), no conversation is remembered.
    Probe,
}

impl Mode {
    /// The mode `value` asks for, once `debug` (the `x-route-debug` value) is a control-plane
    /// key (checked first: nothing is said to anyone else); a precise error otherwise.
    pub(crate) fn asked(
        control_keys: &crate::pipeline::auth::Keys,
        value: &[u8],
        debug: Option<&[u8]>,
    ) -> Result<Mode, crate::GatewayError> {
        if !Meta::wants_debug(control_keys, debug) {
            return Err(crate::GatewayError::Forbidden(
                "x-route-mode needs x-route-debug with a control-plane key".into(),
            ));
        }
        match value.trim_ascii() {
            b"preview" => Ok(Mode::Preview),
            b"probe" => Ok(Mode::Probe),
            other => {
                let shown = String::from_utf8_lossy(&other[..other.len().min(32)]).into_owned();
                Err(crate::GatewayError::BadRequest(format!("x-route-mode: {shown:?} is not a mode (preview, probe)")))
            }
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Mode::Preview => "preview",
            Mode::Probe => "probe",
        }
    }
}

/// An admitted request with its body, as a front end hands it to [`crate::pipeline::run`]:
/// everything later phases read of it besides the headers sent on to the worker.
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) route: Route,
    /// The one routing-config snapshot every phase reads (a reload meanwhile never mixes two).
    pub(crate) routing: Option<Arc<Routing>>,
    /// Its slot and memory reservation.
    pub(crate) admission: Admission,
    pub(crate) body: Bytes,
    /// When its head came (its latency is counted from here).
    pub(crate) start: Instant,
    pub(crate) meta: Meta,
}

/// What a front end read of a request's headers, for [`Meta::new`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Seen<'a> {
    /// The client's `authorization` (read before the workers' credentials replace it).
    pub(crate) authorization: Option<&'a [u8]>,
    /// `x-route-debug`.
    pub(crate) route_debug: Option<&'a [u8]>,
    /// `x-smg-cache-trace: 1`.
    pub(crate) cache_trace: bool,
}

impl Meta {
    /// What request `id` carries, from what its front end read of its headers: `seen`, its
    /// routing key and session (already checked by `h1_codec::usable_key`), and the header
    /// lines sent on to the worker (`lines` walks them: the routing config's header rules and
    /// `cache-control` read them), under the request's routing snapshot.
    pub(crate) fn new<'h, I>(
        gw: &Gateway,
        id: String,
        routing: Option<&Routing>,
        seen: Seen<'_>,
        (routing_key, session): (Option<Vec<u8>>, Option<Vec<u8>>),
        lines: impl Fn() -> I,
    ) -> Meta
    where
        I: Iterator<Item = (&'h str, &'h [u8])>,
    {
        let cache_control = lines().filter(|(n, _)| n.eq_ignore_ascii_case("cache-control"));
        // `x-smg-routing-key` (the front end's) first, then `--routing-key-headers` in order.
        let routing_key = routing_key.or_else(|| {
            gw.config.routing_key_headers.iter().find_map(|want| {
                lines().filter(|(n, _)| n.eq_ignore_ascii_case(want)).find_map(|(_, v)| h1_codec::usable_key(Some(v)))
            })
        });
        Meta {
            id,
            routing_key,
            route_debug: Meta::wants_debug(&gw.control_keys, seen.route_debug),
            signal_headers: crate::pools::wanted_headers(routing, lines()),
            session,
            cache_bypass: bypassed(cache_control.map(|(_, v)| v)),
            forced: None,
            caller: crate::pipeline::auth::caller(gw, seen.authorization),
            subset: None,
            one_attempt: false,
            trace: crate::pipeline::trace::context(gw, lines()),
            cache_trace: gw.config.cache_trace.header || seen.cache_trace,
            probe: false,
        }
    }

    /// Whether an `x-route-debug` value asks for the explain: it must be a control-plane key
    /// (`KEY` or `Bearer KEY`); which signal fired is the operator's to see, not any client's.
    pub(crate) fn wants_debug(control_keys: &crate::pipeline::auth::Keys, value: Option<&[u8]>) -> bool {
        value.is_some_and(|v| control_keys.accepts_key(v))
    }
}

/// The headers an answer carries back: `x-route-pool`, `x-route-decision`,
/// `x-selected-model`, and with a debug request the explain.
#[derive(Debug, Clone, Default)]
pub(crate) struct RouteHeaders(pub(crate) Vec<(&'static str, HeaderValue)>);

/// Whether `cache-control` values say not to use or keep a cached answer (`no-cache`, `no-store`).
pub(crate) fn bypassed<'h>(values: impl Iterator<Item = &'h [u8]>) -> bool {
    values.into_iter().any(|v| {
        let v = v.to_ascii_lowercase();
        v.windows(8).any(|w| w == b"no-cache" || w == b"no-store")
    })
}
