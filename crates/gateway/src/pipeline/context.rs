//! What every request carries besides its body, for both front ends: its id
//! (`--request-id-headers`: the client's, or one made here; sent to the
//! worker as `x-request-id`, echoed in the answer's `x-request-id`, in the
//! request's log lines) and the CORS answer to its origin
//! (`--cors-allowed-origins`, preflights included).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::Gateway;

/// The header the id goes to the worker and back to the client in.
pub use h1_codec::REQUEST_ID_HEADER;
/// The headers a client's request id is looked for in, in order (SGLang Model Gateway's).
pub const DEFAULT_REQUEST_ID_HEADERS: [&str; 4] = ["x-request-id", "x-correlation-id", "x-trace-id", "request-id"];
/// Longest client request id kept; a longer one is replaced by a fresh id.
const MAX_ID_BYTES: usize = 256;
/// Seconds a browser may cache a preflight's answer.
const PREFLIGHT_MAX_AGE_SECS: u32 = 3600;

/// Which origins may call the router from a browser.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Cors {
    /// No CORS headers: browsers keep cross-origin pages out.
    #[default]
    Off,
    /// Any origin (`*`).
    Any,
    /// These origins exactly (`https://app.example.com`).
    Origins(Vec<String>),
}

impl Cors {
    /// From the flag's values: none is off, `*` is any.
    pub fn from_flag(origins: &[String]) -> Self {
        let origins: Vec<String> =
            origins.iter().map(|o| o.trim().trim_end_matches('/').to_string()).filter(|o| !o.is_empty()).collect();
        if origins.is_empty() {
            Cors::Off
        } else if origins.iter().any(|o| o == "*") {
            Cors::Any
        } else {
            Cors::Origins(origins)
        }
    }

    /// Whether a page from `origin` may read the answers.
    pub fn allows(&self, origin: &[u8]) -> bool {
        match self {
            Cors::Off => false,
            Cors::Any => true,
            Cors::Origins(list) => list.iter().any(|o| o.as_bytes().eq_ignore_ascii_case(origin)),
        }
    }

    /// The header lines (`name: value\r\n`) an answer to a request from
    /// `origin` carries; empty when the origin is not allowed.
    pub(crate) fn answer_lines(&self, origin: Option<&[u8]>, out: &mut Vec<u8>) {
        let Some(origin) = origin.filter(|o| self.allows(o)) else { return };
        out.extend_from_slice(b"access-control-allow-origin: ");
        out.extend_from_slice(origin);
        out.extend_from_slice(b"\r\nvary: origin\r\naccess-control-expose-headers: x-request-id\r\n");
    }
}

/// The request's id: the first of `names` the client sent with a usable
/// value, else a new one for `path`.
pub(crate) fn request_id<'a>(names: &[String], mut header: impl FnMut(&str) -> Option<&'a [u8]>, path: &str) -> String {
    for name in names {
        if let Some(v) = header(name).filter(|v| usable(v)) {
            return String::from_utf8_lossy(v).into_owned();
        }
    }
    generate(path)
}

/// Visible ASCII, not too long: safe to echo and to log.
fn usable(v: &[u8]) -> bool {
    !v.is_empty() && v.len() <= MAX_ID_BYTES && v.iter().all(|b| b.is_ascii_graphic())
}

/// A new id as SGLang Model Gateway makes them: a prefix by route, then 24 letters and digits.
pub(crate) fn generate(path: &str) -> String {
    const ALPHABET: &[u8; 62] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let prefix = id_prefix(path);
    let mut id = String::with_capacity(prefix.len() + 24);
    id.push_str(prefix);
    // Eight letters from each of three random words, each the next base-62 digit of the word
    // read as a fraction of 2^64 (one multiplication a letter; 8 letters take 48 of its 64 bits,
    // so each is uniform to within 2^-16).
    for _ in 0..3 {
        let mut x = crate::random_u64();
        for _ in 0..8 {
            let wide = u128::from(x) * 62;
            id.push(char::from(ALPHABET[(wide >> 64) as usize]));
            x = wide as u64;
        }
    }
    id
}

/// The id's prefix by route: the routes' own paths told by their ends (a comparison of a few
/// bytes, where a substring search built a searcher for each request), any other path by what it
/// contains.
fn id_prefix(path: &str) -> &'static str {
    const PREFIXES: [(&str, &str); 3] =
        [("/chat/completions", "chatcmpl-"), ("/completions", "cmpl-"), ("/generate", "gnt-")];
    PREFIXES
        .iter()
        .find(|(part, _)| path.ends_with(part))
        .or_else(|| PREFIXES.iter().find(|(part, _)| path.contains(part)))
        .map_or("req-", |(_, prefix)| prefix)
}

/// The axum front end's layer over every route: the request's id (put on
/// the request for the worker and on the answer), the CORS headers, and the
/// answer to a preflight.
pub(crate) async fn layer(
    State(gw): State<Arc<Gateway>>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let origin = req.headers().get(header::ORIGIN).map(|o| o.as_bytes().to_vec());
    if req.method() == Method::OPTIONS
        && gw.config.cors != Cors::Off
        && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
    {
        return preflight(&gw.config.cors, origin.as_deref(), req.headers());
    }
    let path = req.uri().path().to_string();
    let id = request_id(&gw.config.request_id_headers, |n| req.headers().get(n).map(HeaderValue::as_bytes), &path);
    let value = HeaderValue::from_str(&id).unwrap_or_else(|_| HeaderValue::from_static("invalid-request-id"));
    // The worker always sees the id as `x-request-id`, whichever header it came in.
    req.headers_mut().insert(REQUEST_ID_HEADER, value.clone());
    let mut r = next.run(req).await;
    let h = r.headers_mut();
    h.insert(REQUEST_ID_HEADER, value);
    if let Some(origin) = origin.filter(|o| gw.config.cors.allows(o))
        && let Ok(o) = HeaderValue::from_bytes(&origin)
    {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
        h.append(header::VARY, HeaderValue::from_static("origin"));
        h.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, HeaderValue::from_static("x-request-id"));
    }
    r
}

/// A CORS preflight: 204 with what the origin may send, or 403 for an origin not allowed.
fn preflight(cors: &Cors, origin: Option<&[u8]>, headers: &HeaderMap) -> Response {
    let Some(origin) = origin.filter(|o| cors.allows(o)).and_then(|o| HeaderValue::from_bytes(o).ok()) else {
        return crate::GatewayError::Forbidden("this origin may not call the router (--cors-allowed-origins)".into())
            .into_response();
    };
    let mut r = StatusCode::NO_CONTENT.into_response();
    let h = r.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    h.insert(header::VARY, HeaderValue::from_static("origin"));
    h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, DELETE, OPTIONS"));
    let asked = headers.get(header::ACCESS_CONTROL_REQUEST_HEADERS).cloned();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        asked.unwrap_or_else(|| HeaderValue::from_static("content-type, authorization")),
    );
    h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from(PREFLIGHT_MAX_AGE_SECS));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_come_from_the_first_header_listed_else_are_made_by_route() {
        let names: Vec<String> = DEFAULT_REQUEST_ID_HEADERS.iter().map(|s| s.to_string()).collect();
        let sent = [("x-trace-id", &b"trace-7"[..]), ("request-id", b"other")];
        let find = |n: &str| sent.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
        assert_eq!(request_id(&names, find, "/generate"), "trace-7");
        let id = request_id(&names, |_| None, "/v1/chat/completions");
        assert!(id.starts_with("chatcmpl-") && id.len() == 9 + 24, "{id}");
        assert!(id[9..].bytes().all(|b| b.is_ascii_alphanumeric()));
        assert!(generate("/v1/completions").starts_with("cmpl-"));
        assert!(generate("/generate").starts_with("gnt-"));
        assert!(generate("/v1/embeddings").starts_with("req-"));
        assert_ne!(generate("/generate"), generate("/generate"));
        assert_eq!(id_prefix("/v1/chat/completions/extra"), "chatcmpl-");
        // Every position of the 24 takes (nearly) every letter: no position is fixed.
        let ids: Vec<String> = (0..2_000).map(|_| generate("/generate")).collect();
        for at in 4..4 + 24 {
            let seen: std::collections::HashSet<u8> = ids.iter().map(|id| id.as_bytes()[at]).collect();
            assert!(seen.len() >= 60, "position {at}: {} letters", seen.len());
        }
        // An id that cannot be echoed safely is replaced.
        let bad = |_: &str| Some(&b"two words"[..]);
        assert!(request_id(&names, bad, "/generate").starts_with("gnt-"));
        let long = vec![b'a'; MAX_ID_BYTES + 1];
        assert!(request_id(&names, |_| Some(&long[..]), "/generate").starts_with("gnt-"));
    }

    #[test]
    fn origins_are_allowed_exactly() {
        assert_eq!(Cors::from_flag(&[]), Cors::Off);
        assert_eq!(Cors::from_flag(&["*".into()]), Cors::Any);
        let c = Cors::from_flag(&["https://app.example.com/".into()]);
        assert!(c.allows(b"https://app.example.com"));
        assert!(!c.allows(b"https://app.example.com.evil.net"));
        assert!(!Cors::Off.allows(b"https://app.example.com"));
        let mut lines = Vec::new();
        c.answer_lines(Some(b"https://app.example.com"), &mut lines);
        assert!(lines.starts_with(b"access-control-allow-origin: https://app.example.com\r\n"));
        lines.clear();
        c.answer_lines(Some(b"https://elsewhere"), &mut lines);
        assert!(lines.is_empty());
    }
}
