//! Request heads both front ends refuse before any route sees them, and how:
//! a malformed head (400), a request line longer than the head limit (414),
//! a head over the size or header-count limit (431), a client too slow with
//! its head or body (408). Each gets the gateway's JSON error body and the
//! connection closes: after such a head the byte stream cannot be trusted.
//!
//! [`check`] is the rule for heads the hyper fallback is to serve: it takes
//! what hyper would refuse (with an empty body) and says where the request's
//! body ends, so the fallback's guard never hands hyper a malformed head and
//! knows where the next one starts. It does not own the fast path's own
//! parse (`parse_head`), which shares its limits and its refusals.

use std::time::Duration;

use super::{MAX_HEAD_BYTES, MAX_HEADERS, content_length};
use crate::GatewayError;

/// Why a request is refused at its head or body, before any route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
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
}

/// How a checked request's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyLen {
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
    pub(crate) fn parse(e: httparse::Error) -> Self {
        match e {
            httparse::Error::TooManyHeaders => Refusal::TooManyHeaders,
            e => Refusal::Malformed(format!("malformed request head: {e}")),
        }
    }

    /// The refusal for a head still incomplete at the size limit, `buf` what
    /// was read of it: 414 when the request line does not even end in it.
    pub(crate) fn too_large(buf: &[u8]) -> Self {
        if buf.contains(&b'\n') { Refusal::HeadTooLarge } else { Refusal::UriTooLong }
    }

    /// The gateway error this refusal answers with (its one mapping to HTTP).
    pub(crate) fn gateway_error(&self) -> GatewayError {
        match self {
            Refusal::Malformed(m) => GatewayError::BadRequest(m.clone()),
            Refusal::HeadTimeout(t) => {
                GatewayError::ClientTimeout(format!("the request head did not arrive within {t:?}"))
            }
            Refusal::BodyTimeout(t) => {
                GatewayError::ClientTimeout(format!("the request body did not arrive within {t:?}"))
            }
            Refusal::UriTooLong => GatewayError::UriTooLong(format!("request line longer than {MAX_HEAD_BYTES} bytes")),
            Refusal::TooManyHeaders => {
                GatewayError::HeaderFieldsTooLarge(format!("more than {MAX_HEADERS} header fields"))
            }
            Refusal::HeadTooLarge => {
                GatewayError::HeaderFieldsTooLarge(format!("request head larger than {MAX_HEAD_BYTES} bytes"))
            }
        }
    }

    /// The whole answer, closing the connection.
    pub(crate) fn answer(&self) -> Vec<u8> {
        let e = self.gateway_error();
        let body = e.body().to_string();
        let status = e.status();
        let mut out = format!(
            "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            status.as_u16(),
            status.canonical_reason().unwrap_or(""),
            body.len()
        )
        .into_bytes();
        out.extend_from_slice(body.as_bytes());
        out
    }
}

/// Checks the request head at the front of `buf` as hyper would take it:
/// `Ok(None)` while incomplete, else its length and its body's framing, or
/// why it is refused. Stricter than hyper in one way: a request with both a
/// `Content-Length` and a `Transfer-Encoding` is refused, not taken as
/// chunked (the two hops in front of a smuggled request disagree exactly there).
pub(crate) fn check(buf: &[u8]) -> Result<Option<(usize, BodyLen)>, Refusal> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) if n <= MAX_HEAD_BYTES => n,
        Ok(httparse::Status::Partial) if buf.len() <= MAX_HEAD_BYTES => return Ok(None),
        Ok(_) => return Err(Refusal::too_large(&buf[..buf.len().min(MAX_HEAD_BYTES)])),
        Err(e) => return Err(Refusal::parse(e)),
    };
    // httparse takes request targets that `http::Uri` (and so hyper) does not.
    if req.path.unwrap_or_default().parse::<axum::http::Uri>().is_err() {
        return Err(Refusal::Malformed("malformed request target".into()));
    }
    let http11 = req.version == Some(1);
    let (mut length, mut chunked, mut credentials) = (None, None, 0);
    for h in req.headers.iter() {
        let value = std::str::from_utf8(h.value).unwrap_or("\u{0}").trim();
        if h.name.eq_ignore_ascii_case("authorization") {
            // Two credentials: which one a hop honours is a guess; none is.
            credentials += 1;
            if credentials > 1 {
                return Err(Refusal::Malformed("more than one authorization header".into()));
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

    #[test]
    fn every_refusal_answers_json_and_closes() {
        for (r, status) in [
            (Refusal::Malformed("x".into()), 400),
            (Refusal::UriTooLong, 414),
            (Refusal::HeadTooLarge, 431),
            (Refusal::TooManyHeaders, 431),
            (Refusal::HeadTimeout(Duration::from_secs(1)), 408),
            (Refusal::BodyTimeout(Duration::from_secs(1)), 408),
        ] {
            let answer = String::from_utf8(r.answer()).unwrap();
            let (head, body) = answer.split_once("\r\n\r\n").unwrap();
            assert!(head.starts_with(&format!("HTTP/1.1 {status} ")), "{head}");
            assert!(head.contains("\r\nconnection: close") && head.contains("application/json"), "{head}");
            let v: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(v["error"]["code"], status, "{v}");
            assert!(v["error"]["type"].is_string() && v["error"]["message"].is_string(), "{v}");
        }
    }
}
