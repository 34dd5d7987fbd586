//! What a proxied request is before it is routed: what it carries besides
//! its route and body ([`Meta`]) and the route headers an answer carries.
//! The wire-level parts (the routes, which headers cross a hop, their
//! serialized form) are the HTTP/1.1 codec's, re-exported here for the
//! pipeline's phases. Owns no state.

use axum::http::HeaderValue;

pub use h1_codec::PROXIED_PATHS;
pub(crate) use h1_codec::{RANK_HEADER, ROUTE_DEBUG_HEADER, Route, forwarded, header_lines, push_header, relayed};

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
}

impl Meta {
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
