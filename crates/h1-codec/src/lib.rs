//! The router's HTTP/1.1 wire codec, with no sockets and no router state: which
//! paths are proxied ([`Route`]), the fast path's parse of a request head
//! ([`parse_head`]), the fallback guard's check of any other head ([`check`]),
//! chunked transfer coding ([`chunked`]), a worker's answer head
//! ([`parse_answer_head`]), and which headers cross a hop ([`forwarded`],
//! [`relayed`]). Every function is pure over byte slices: the gateway's front
//! ends and its worker client call them, and the fuzz targets (`fuzz/`) link
//! this crate alone.

mod answer;
pub mod chunked;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod headers;
mod request;

pub use answer::{AnswerHead, Framing, MAX_ANSWER_HEAD_BYTES, parse_answer_head};
pub use headers::{forwarded, header_lines, push_header, relayed};
pub use request::{
    API_KEY_HEADER, BodyLen, Head, Next, PRIORITY_HEADER, PROXIED_PATHS, Refusal, Route, TWO_CREDENTIALS, check,
    credential, parse_head, usable_key,
};

/// Largest request head taken (bytes, blank line included).
pub const MAX_HEAD_BYTES: usize = 64 << 10;
/// Most header fields a request head may carry.
pub const MAX_HEADERS: usize = 64;

/// The header SGLang and vLLM read a data-parallel rank hint from.
pub const RANK_HEADER: &str = "x-data-parallel-rank";
/// The request header asking for the routing explain (its value a control-plane key).
pub const ROUTE_DEBUG_HEADER: &str = "x-route-debug";
/// The plugin mode a control-plane caller asks for (`preview` or `probe`, with
/// `x-route-debug: KEY`): served by the hyper front end, never forwarded.
pub const ROUTE_MODE_HEADER: &str = "x-route-mode";
/// The client's conversation id, for session-sticky pools.
pub const SESSION_HEADER: &str = "x-session-id";
/// The client's routing key (`smg`'s name): its worker by rendezvous hashing.
pub const ROUTING_KEY_HEADER: &str = "x-smg-routing-key";
/// A request asks for its dispatch's decision record with `1` here; the answer carries the
/// record in it (Shepherd Model Gateway's name).
pub const CACHE_TRACE_HEADER: &str = "x-smg-cache-trace";
/// The request id the router sets on the worker's request and on the answer.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// A `Content-Length` value: digits only (`+5` or `5 5`, which a lenient
/// parser would take, could make this hop and another disagree on where a
/// message ends).
pub fn content_length(value: &str) -> Option<u64> {
    // At most 19 digits: below u64::MAX whatever they are.
    if value.is_empty() || value.len() > 19 {
        return None;
    }
    value.bytes().try_fold(0u64, |n, b| b.is_ascii_digit().then(|| n * 10 + u64::from(b - b'0')))
}

#[cfg(test)]
mod tests {
    use super::content_length;

    #[test]
    fn a_content_length_is_digits_only() {
        assert_eq!(content_length("0"), Some(0));
        assert_eq!(content_length("0042"), Some(42));
        assert_eq!(content_length("9999999999999999999"), Some(9_999_999_999_999_999_999));
        for bad in ["", "+5", "-1", "5 5", " 5", "5 ", "1a", "0x10", "12345678901234567890"] {
            assert_eq!(content_length(bad), None, "{bad:?}");
        }
    }
}
