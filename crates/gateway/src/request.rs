//! What a proxied request is before it is routed: its [`Route`], what it carries
//! besides its body ([`Meta`]), which of its headers go on to a worker and
//! which of a worker's come back, and the route headers an answer carries.
//! Owns no state; every phase of the pipeline reads these types.

use axum::http::HeaderValue;

/// The header SGLang and vLLM read a data-parallel rank hint from.
pub(crate) const RANK_HEADER: &str = "x-data-parallel-rank";

/// Headers that describe one hop of a message, not the message: never passed
/// on, in either direction. `proxy-authorization` and `proxy-authenticate`
/// are credentials for (and challenges from) a proxy on this hop: relayed,
/// they would hand a client's proxy credentials to the worker.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Request headers the router sets itself on the way to the worker, or reads and keeps
/// (`x-route-debug` carries a control-plane key).
const SET_BY_ROUTER: [&str; 5] = ["host", "content-length", "content-type", "expect", ROUTE_DEBUG_HEADER];

fn listed(name: &str, list: &[&str]) -> bool {
    list.iter().any(|n| name.eq_ignore_ascii_case(n))
}

/// Whether a client's request header goes on to the worker: end-to-end
/// headers do (`authorization`, `x-request-id`, `traceparent`, ...), hop-by-hop
/// ones, those the client's `connection` header names, and those the router
/// sets do not.
pub(crate) fn forwarded(name: &str, connection: &str) -> bool {
    !listed(name, &HOP_BY_HOP)
        && !listed(name, &SET_BY_ROUTER)
        && !connection.split(',').any(|t| t.trim().eq_ignore_ascii_case(name))
}

/// Whether a worker's answer header goes back to the client: end-to-end ones
/// do, except the length, which the relay sets from the body it sends, and
/// those the answer's own `connection` header (`connection`, its tokens
/// joined by commas) names as hop-only.
pub(crate) fn relayed(name: &str, connection: &str) -> bool {
    !listed(name, &HOP_BY_HOP)
        && !name.eq_ignore_ascii_case("content-length")
        && !connection.split(',').any(|t| t.trim().eq_ignore_ascii_case(name))
}

/// The paths requests are proxied to (every [`Route`]'s), for the fleet to parse once per worker.
pub const PROXIED_PATHS: &[&str] =
    &["/v1/chat/completions", "/v1/completions", "/generate", "/v1/embeddings", "/v1/rerank", "/v1/classify"];

/// The proxied routes. The first three carry a prompt the policy may read;
/// the others are passed through to the worker the policy picks by load
/// (their bodies are checked to be JSON objects, never rendered).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    Chat,
    Completions,
    Generate,
    Embeddings,
    Rerank,
    Classify,
}

// === impl Route ===

impl Route {
    /// Every proxied route.
    pub(crate) const ALL: [Route; 6] =
        [Route::Chat, Route::Completions, Route::Generate, Route::Embeddings, Route::Rerank, Route::Classify];

    /// Whether the route carries a prompt (rendered, tokenized, matched against the index).
    pub(crate) fn has_prompt(self) -> bool {
        matches!(self, Route::Chat | Route::Completions | Route::Generate)
    }

    /// The proxied route at `path`, if any.
    pub(crate) fn from_path(path: &str) -> Option<Route> {
        Route::ALL.into_iter().find(|r| r.path() == path)
    }

    pub(crate) fn path(self) -> &'static str {
        match self {
            Route::Chat => PROXIED_PATHS[0],
            Route::Completions => PROXIED_PATHS[1],
            Route::Generate => PROXIED_PATHS[2],
            Route::Embeddings => PROXIED_PATHS[3],
            Route::Rerank => PROXIED_PATHS[4],
            Route::Classify => PROXIED_PATHS[5],
        }
    }

    pub(crate) fn label(self) -> &'static str {
        match self {
            Route::Chat => "chat",
            Route::Completions => "completions",
            Route::Generate => "generate",
            Route::Embeddings => "embeddings",
            Route::Rerank => "rerank",
            Route::Classify => "classify",
        }
    }
}

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
    /// A cascade's second attempt: this pool (an index) under this decision, not the decisions'.
    pub(crate) forced: Option<(usize, String)>,
    /// The caller's identity for the response caches (with a routing config; `None`: anonymous).
    pub(crate) caller: Option<[u8; 32]>,
}

/// The request header asking for the routing explain.
pub(crate) const ROUTE_DEBUG_HEADER: &str = "x-route-debug";

impl Meta {
    /// Whether an `x-route-debug` value asks for the explain: it must be a control-plane key
    /// (`KEY` or `Bearer KEY`); which signal fired is the operator's to see, not any client's.
    pub(crate) fn wants_debug(control_keys: &crate::auth::Keys, value: Option<&[u8]>) -> bool {
        value.is_some_and(|v| control_keys.accepts_key(v))
    }

    /// A routing key worth routing by: not empty, at most 256 bytes.
    pub(crate) fn key(value: Option<&[u8]>) -> Option<Vec<u8>> {
        value.map(<[u8]>::trim_ascii).filter(|k| !k.is_empty() && k.len() <= 256).map(<[u8]>::to_vec)
    }
}

/// The headers an answer carries back: `x-route-pool`, `x-route-decision`,
/// `x-selected-model`, and with a debug request the explain.
#[derive(Debug, Clone, Default)]
pub(crate) struct RouteHeaders(pub(crate) Vec<(&'static str, HeaderValue)>);

/// Appends a header line, `name: value\r\n`.
pub(crate) fn push_header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// The (name, value) of each line of serialized headers (`name: value\r\n`, as [`push_header`]
/// writes them), the value trimmed; a line without a colon is skipped.
pub(crate) fn header_lines(lines: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> + Clone {
    lines.split(|&b| b == b'\n').filter_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let colon = line.iter().position(|&b| b == b':')?;
        Some((&line[..colon], line[colon + 1..].trim_ascii()))
    })
}

/// Whether `cache-control` values say not to use or keep a cached answer (`no-cache`, `no-store`).
pub(crate) fn bypassed<'h>(values: impl Iterator<Item = &'h [u8]>) -> bool {
    values.into_iter().any(|v| {
        let v = v.to_ascii_lowercase();
        v.windows(8).any(|w| w == b"no-cache" || w == b"no-store")
    })
}
