//! A client's request head: the proxied routes, the fast path's parse of a
//! proxied `POST` ([`parse_head`]: serve it, hand it to the fallback, or
//! refuse it), the fallback guard's check of any other head ([`check`]), and
//! why a head is refused ([`Refusal`]: the gateway maps each to its answer).

use std::time::Duration;

use crate::{
    CACHE_TRACE_HEADER, MAX_HEAD_BYTES, MAX_HEADERS, RANK_HEADER, REQUEST_ID_HEADER, ROUTE_DEBUG_HEADER,
    ROUTE_MODE_HEADER, ROUTING_KEY_HEADER, SESSION_HEADER, content_length, forwarded, push_header,
};

/// The paths requests are proxied to (every [`Route`]'s), for the fleet to parse once per worker.
pub const PROXIED_PATHS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/generate",
    "/v1/embeddings",
    "/v1/rerank",
    "/v1/classify",
    "/v1/messages",
    "/v1/messages/count_tokens",
];

/// The proxied routes. Chat, completions, generate and Anthropic's messages
/// carry a prompt the policy may read; the others are passed through to the
/// worker the policy picks by load (their bodies are checked to be JSON
/// objects, never rendered).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Chat,
    Completions,
    Generate,
    Embeddings,
    Rerank,
    Classify,
    /// Anthropic's Messages API (`/v1/messages`): rendered as the engine converts it to a chat.
    Messages,
    /// Anthropic's token count (`/v1/messages/count_tokens`), passed through.
    CountTokens,
}

// === impl Route ===

impl Route {
    /// Every proxied route.
    pub const ALL: [Route; 8] = [
        Route::Chat,
        Route::Completions,
        Route::Generate,
        Route::Embeddings,
        Route::Rerank,
        Route::Classify,
        Route::Messages,
        Route::CountTokens,
    ];

    /// Whether the route carries a prompt (rendered, tokenized, matched against the index).
    pub fn has_prompt(self) -> bool {
        matches!(self, Route::Chat | Route::Completions | Route::Generate | Route::Messages)
    }

    /// Whether the route is Anthropic's API (its errors take Anthropic's shape).
    pub fn anthropic(self) -> bool {
        matches!(self, Route::Messages | Route::CountTokens)
    }

    /// The proxied route at `path`, if any.
    pub fn from_path(path: &str) -> Option<Route> {
        Route::ALL.into_iter().find(|r| r.path() == path)
    }

    pub fn path(self) -> &'static str {
        match self {
            Route::Chat => PROXIED_PATHS[0],
            Route::Completions => PROXIED_PATHS[1],
            Route::Generate => PROXIED_PATHS[2],
            Route::Embeddings => PROXIED_PATHS[3],
            Route::Rerank => PROXIED_PATHS[4],
            Route::Classify => PROXIED_PATHS[5],
            Route::Messages => PROXIED_PATHS[6],
            Route::CountTokens => PROXIED_PATHS[7],
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Route::Chat => "chat",
            Route::Completions => "completions",
            Route::Generate => "generate",
            Route::Embeddings => "embeddings",
            Route::Rerank => "rerank",
            Route::Classify => "classify",
            Route::Messages => "messages",
            Route::CountTokens => "count_tokens",
        }
    }
}

/// Why a request is refused at its head or body, before any route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Not HTTP/1.x framing the router can trust (400).
    Malformed(String),
    /// The request line alone is over the head limit (414).
    UriTooLong,
    /// The head is over the size limit (431).
    HeadTooLarge,
    /// More header lines than the limit (431).
    TooManyHeaders,
    /// The head did not arrive whole in time (408).
    HeadTimeout(Duration),
    /// The body did not arrive whole in time (408).
    BodyTimeout(Duration),
    /// No byte of the body came for this long (408; `--stream-body-stall-timeout-secs`).
    BodyStall(Duration),
}

/// How a checked request's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLen {
    /// No body.
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
}

// === impl Refusal ===

impl Refusal {
    /// The refusal for an httparse error.
    pub fn parse(e: httparse::Error) -> Self {
        match e {
            httparse::Error::TooManyHeaders => Refusal::TooManyHeaders,
            e => Refusal::Malformed(format!("malformed request head: {e}")),
        }
    }

    /// The refusal for a head still incomplete at the size limit, `buf` what
    /// was read of it: 414 when the request line does not even end in it.
    pub fn too_large(buf: &[u8]) -> Self {
        if buf.contains(&b'\n') { Refusal::HeadTooLarge } else { Refusal::UriTooLong }
    }
}

/// A routing key or session id worth routing by: trimmed, not empty, at most 256 bytes.
pub fn usable_key(value: Option<&[u8]>) -> Option<Vec<u8>> {
    value.map(<[u8]>::trim_ascii).filter(|k| !k.is_empty() && k.len() <= 256).map(<[u8]>::to_vec)
}

/// What the fast path needs of a proxied request's head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub route: Route,
    /// Bytes of the head, blank line included.
    pub len: usize,
    pub body_len: usize,
    /// The client asked to close after this request.
    pub close: bool,
    /// The client waits for `100 Continue` before sending the body.
    pub expect_continue: bool,
    /// The end-to-end headers for the worker, as `name: value\r\n` lines
    /// (the rank hint apart).
    pub forward: Vec<u8>,
    /// The client's data-parallel rank hint, used when the router has none.
    pub rank: Option<Vec<u8>>,
    /// The client's `Authorization` value (or its `x-api-key` as `Bearer KEY`): a client key
    /// to check (`--client-api-keys`), or its own credentials for the worker.
    pub authorization: Option<Vec<u8>>,
    /// The client's request-id headers: (position in `--request-id-headers`, value), each once.
    pub request_ids: Vec<(usize, Vec<u8>)>,
    /// The page's origin (CORS).
    pub origin: Option<Vec<u8>>,
    /// The client's routing key (`x-smg-routing-key`).
    pub routing_key: Option<Vec<u8>>,
    /// The client asked for the routing explain (`x-route-debug: true`).
    /// The `x-route-debug` value (checked against the control-plane keys once the gateway is at hand).
    pub route_debug: Option<Vec<u8>>,
    /// The client's conversation id (`x-session-id`).
    pub session: Option<Vec<u8>>,
    /// The client asked for the decision record (`x-smg-cache-trace: 1`).
    pub cache_trace: bool,
    /// The client's priority class (`x-smg-priority`), as sent.
    pub priority: Option<Vec<u8>>,
    /// The tenant header's value (the name given to [`parse_head`]), as sent.
    pub tenant: Option<Vec<u8>>,
}

/// The header a client names its priority class in (Shepherd Model Gateway's).
pub const PRIORITY_HEADER: &str = "x-smg-priority";

/// Who serves the request at the front of the buffer.
// One per request, moved once: boxing the head would cost an allocation on the fast path.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    Fast(Head),
    /// Not for the fast path: hyper serves the rest of the connection.
    Hyper,
    /// Not a head to serve: answered with this refusal, then the connection closes.
    Refuse(Refusal),
}

/// Why a request with two credentials is refused.
pub const TWO_CREDENTIALS: &str = "more than one credential (authorization or x-api-key header)";

/// The header Anthropic's clients send their key in, taken as `Authorization: Bearer KEY`.
pub const API_KEY_HEADER: &str = "x-api-key";

/// A client credential header's value as the router reads it: `Authorization` as it is, and
/// Anthropic's `x-api-key: KEY` as `Bearer KEY` (never passed on as sent: what the worker
/// gets is the router's choice). `None` for any other header.
pub fn credential(name: &str, value: &[u8]) -> Option<Vec<u8>> {
    if name.eq_ignore_ascii_case("authorization") {
        Some(value.to_vec())
    } else if name.eq_ignore_ascii_case(API_KEY_HEADER) {
        Some([b"Bearer ", value.trim_ascii()].concat())
    } else {
        None
    }
}

/// Whether a header carries a client credential ([`credential`]'s headers).
fn is_credential(name: &str) -> bool {
    name.eq_ignore_ascii_case("authorization") || name.eq_ignore_ascii_case(API_KEY_HEADER)
}

/// Reads the request head at the front of `buf`; `None` while incomplete.
/// `id_names` are the headers a request id is looked for in, in order;
/// `tenant_header` the header a trusted tenant id comes in, if any.
pub fn parse_head(buf: &[u8], id_names: &[String], tenant_header: Option<&str>) -> Option<Next> {
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
    let (mut request_ids, mut origin) = (Vec::new(), None);
    let (mut routing_key, mut route_debug, mut session) = (None, None, None);
    let (mut priority, mut tenant, mut cache_trace) = (None, None, false);
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case(PRIORITY_HEADER) {
            priority = Some(h.value.to_vec());
        } else if tenant_header.is_some_and(|t| h.name.eq_ignore_ascii_case(t)) {
            tenant = Some(h.value.to_vec());
        }
        if let Some(i) = id_names.iter().position(|n| h.name.eq_ignore_ascii_case(n))
            && !request_ids.iter().any(|(j, _)| *j == i)
        {
            request_ids.push((i, h.value.to_vec()));
        }
        if h.name.eq_ignore_ascii_case("origin") {
            origin = Some(h.value.to_vec());
        } else if h.name.eq_ignore_ascii_case(ROUTING_KEY_HEADER) {
            routing_key = usable_key(Some(h.value));
        } else if h.name.eq_ignore_ascii_case(ROUTE_DEBUG_HEADER) {
            route_debug = Some(h.value.to_vec());
        } else if h.name.eq_ignore_ascii_case(SESSION_HEADER) {
            session = usable_key(Some(h.value));
        } else if h.name.eq_ignore_ascii_case(CACHE_TRACE_HEADER) {
            cache_trace = h.value.trim_ascii() == b"1";
        }
        if h.name.eq_ignore_ascii_case(RANK_HEADER) {
            rank = Some(h.value.to_vec());
        } else if let Some(credential) = credential(h.name, h.value) {
            // Two credentials: which one a hop honours is a guess; none is.
            if authorization.replace(credential).is_some() {
                return Some(Next::Refuse(Refusal::Malformed(TWO_CREDENTIALS.into())));
            }
        } else if forwarded(h.name, &connection) && !h.name.eq_ignore_ascii_case(REQUEST_ID_HEADER) {
            // The request's id goes to the worker as the router chose it, once.
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
        } else if ["transfer-encoding", "expect", "upgrade", ROUTE_MODE_HEADER]
            .iter()
            .any(|n| h.name.eq_ignore_ascii_case(n))
        {
            // A plugin mode (`x-route-mode`) is a control-plane caller's: the hyper front end serves it.
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
        origin,
        routing_key,
        route_debug,
        session,
        cache_trace,
        priority,
        tenant,
    }))
}

/// Checks the request head at the front of `buf` as hyper would take it:
/// `Ok(None)` while incomplete, else its length and its body's framing, or
/// why it is refused. Stricter than hyper in one way: a request with both a
/// `Content-Length` and a `Transfer-Encoding` is refused, not taken as
/// chunked (the two hops in front of a smuggled request disagree exactly there).
pub fn check(buf: &[u8]) -> Result<Option<(usize, BodyLen)>, Refusal> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) if n <= MAX_HEAD_BYTES => n,
        Ok(httparse::Status::Partial) if buf.len() <= MAX_HEAD_BYTES => return Ok(None),
        Ok(_) => return Err(Refusal::too_large(&buf[..buf.len().min(MAX_HEAD_BYTES)])),
        Err(e) => return Err(Refusal::parse(e)),
    };
    // httparse takes request targets that `http::Uri` (and so hyper) does not.
    if req.path.unwrap_or_default().parse::<http::Uri>().is_err() {
        return Err(Refusal::Malformed("malformed request target".into()));
    }
    let http11 = req.version == Some(1);
    let (mut length, mut chunked, mut credentials) = (None, None, 0);
    for h in req.headers.iter() {
        let value = std::str::from_utf8(h.value).unwrap_or("\u{0}").trim();
        if is_credential(h.name) {
            // Two credentials: which one a hop honours is a guess; none is.
            credentials += 1;
            if credentials > 1 {
                return Err(Refusal::Malformed(TWO_CREDENTIALS.into()));
            }
        } else if h.name.eq_ignore_ascii_case("content-length") {
            let n = content_length(value).ok_or_else(|| Refusal::Malformed("invalid content-length".into()))?;
            // Equal repeats are one length (hyper's rule); different ones are no length at all.
            if length.replace(n).is_some_and(|prev| prev != n) {
                return Err(Refusal::Malformed("conflicting content-length headers".into()));
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            if !http11 {
                return Err(Refusal::Malformed("transfer-encoding in an HTTP/1.0 request".into()));
            }
            // The last coding of the last line is the one that frames the body.
            let last = value.rsplit(',').next().unwrap_or_default().trim();
            chunked = Some(last.eq_ignore_ascii_case("chunked"));
        }
    }
    let body = match (chunked, length) {
        (Some(_), Some(_)) => {
            return Err(Refusal::Malformed("both content-length and transfer-encoding".into()));
        }
        (Some(true), None) => BodyLen::Chunked,
        (Some(false), None) => {
            return Err(Refusal::Malformed("a request's last transfer coding must be chunked".into()));
        }
        (None, Some(0) | None) => BodyLen::Empty,
        (None, Some(n)) => BodyLen::Length(n),
    };
    Ok(Some((len, body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(raw: &[u8]) -> Refusal {
        check(raw).expect_err(&String::from_utf8_lossy(raw))
    }

    #[test]
    fn well_formed_heads_pass_with_their_framing() {
        let get = b"GET /metrics HTTP/1.1\r\nhost: r\r\n\r\nGET";
        assert_eq!(check(get), Ok(Some((get.len() - 3, BodyLen::Empty))));
        let post = b"POST /x HTTP/1.0\r\ncontent-length: 7\r\nContent-Length: 7\r\n\r\n";
        assert_eq!(check(post), Ok(Some((post.len(), BodyLen::Length(7)))));
        let chunked = b"POST /x HTTP/1.1\r\ntransfer-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n";
        assert_eq!(check(chunked), Ok(Some((chunked.len(), BodyLen::Chunked))));
        assert_eq!(check(b"GET / HTTP/1.1\r\nhost"), Ok(None));
    }

    #[test]
    fn malformed_heads_are_refused_precisely() {
        for raw in [
            &b"BAD\0 REQUEST\r\n\r\n"[..],
            b"GET / HTTP/2.0\r\n\r\n",
            b"GET / HTTP/1.1\r\nbad header\r\n\r\n",
            b"POST / HTTP/1.1\r\ncontent-length: +2\r\n\r\n",
            b"POST / HTTP/1.1\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n",
            b"POST / HTTP/1.1\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\ntransfer-encoding: chunked, gzip\r\n\r\n",
            b"POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n",
        ] {
            assert!(matches!(refused(raw), Refusal::Malformed(_)), "{:?}", String::from_utf8_lossy(raw));
        }
        let many: String = (0..=MAX_HEADERS).map(|i| format!("h{i}: v\r\n")).collect();
        assert_eq!(refused(format!("GET / HTTP/1.1\r\n{many}\r\n").as_bytes()), Refusal::TooManyHeaders);
        let big = format!("GET / HTTP/1.1\r\nx: {}", "a".repeat(MAX_HEAD_BYTES));
        assert_eq!(refused(big.as_bytes()), Refusal::HeadTooLarge);
        let long = format!("GET /{}", "a".repeat(MAX_HEAD_BYTES));
        assert_eq!(refused(long.as_bytes()), Refusal::UriTooLong);
    }

    fn fast(raw: &str) -> Head {
        match parse_head(raw.as_bytes(), &[], None) {
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
    fn an_anthropic_api_key_is_the_requests_bearer_credential_and_never_passed_on() {
        let h = fast(
            "POST /v1/messages HTTP/1.1\r\nx-api-key:  sk-1 \r\nanthropic-version: 2023-06-01\r\nContent-Length: 2\r\n\r\n",
        );
        assert_eq!(h.route, Route::Messages);
        assert_eq!(h.authorization.as_deref(), Some(&b"Bearer sk-1"[..]));
        let forward = String::from_utf8(h.forward).unwrap();
        assert!(!forward.contains("sk-1") && forward.contains("anthropic-version: 2023-06-01"), "{forward}");
        let both = "POST /v1/messages HTTP/1.1\r\nAuthorization: Bearer a\r\nX-Api-Key: b\r\nContent-Length: 2\r\n\r\n";
        assert_eq!(
            parse_head(both.as_bytes(), &[], None),
            Some(Next::Refuse(Refusal::Malformed(TWO_CREDENTIALS.into())))
        );
        assert_eq!(check(both.as_bytes()), Err(Refusal::Malformed(TWO_CREDENTIALS.into())));
        assert_eq!(
            fast("POST /v1/messages/count_tokens HTTP/1.1\r\nContent-Length: 2\r\n\r\n").route,
            Route::CountTokens
        );
    }

    #[test]
    fn an_incomplete_head_waits_for_more() {
        assert_eq!(parse_head(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Len", &[], None), None);
        assert_eq!(parse_head(b"POS", &[], None), None);
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
            assert_eq!(parse_head(raw.as_bytes(), &[], None), Some(Next::Hyper), "{raw:?}");
        }
    }

    #[test]
    fn heads_hyper_could_only_refuse_are_refused_here() {
        let refused = |raw: &[u8]| match parse_head(raw, &[], None) {
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
}
