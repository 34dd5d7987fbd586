//! A worker's answer head: its status, the end-to-end headers the relay passes
//! back, and how its body is framed ([`parse_answer_head`]). Strict where two
//! hops could read one answer two ways.

use std::io;

use crate::{REQUEST_ID_HEADER, content_length, push_header, relayed};

/// Largest answer head read from a worker (interim 1xx answers included).
pub const MAX_ANSWER_HEAD_BYTES: usize = 64 << 10;

/// How an answer's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (204, 304).
    Empty,
    Length(u64),
    Chunked,
    /// Until the worker closes.
    Close,
}

/// What the relay needs of a worker's answer head.
#[derive(Debug)]
pub struct AnswerHead {
    pub status: u16,
    /// The end-to-end headers, serialized.
    pub headers: Vec<u8>,
    pub framing: Framing,
    /// `text/event-stream`.
    pub sse: bool,
    /// Transfer codings other than a final `chunked` (say `gzip`), kept when the body is re-framed.
    pub codings: String,
    /// The connection may carry another request once the body is read.
    pub reusable: bool,
}

/// The worker's answer head at the front of `buf` (interim 1xx answers
/// skipped): its length with what precedes it, and what the relay needs of
/// it; `None` while incomplete. A head whose framing another hop could read
/// otherwise (two lengths, a length with a transfer coding, a length not all
/// digits) is refused.
pub fn parse_answer_head(buf: &[u8]) -> io::Result<Option<(usize, AnswerHead)>> {
    let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, format!("invalid answer from the worker: {m}"));
    let mut at = 0;
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 96];
        let mut resp = httparse::Response::new(&mut headers);
        let len = match resp.parse(&buf[at..]) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() - at <= MAX_ANSWER_HEAD_BYTES => return Ok(None),
            Ok(httparse::Status::Partial) => return Err(bad("head too large")),
            Err(e) => return Err(bad(&e.to_string())),
        };
        let status = resp.code.unwrap_or(0);
        if (100..200).contains(&status) && status != 101 {
            at += len;
            continue;
        }
        let mut out = Vec::with_capacity(256);
        let (mut length, mut chunked, mut te, mut close, mut sse) = (None, false, false, false, false);
        let mut codings = String::new();
        // The answer's `connection` tokens: options, and the headers that are hop-only.
        let connection: Vec<&str> = resp
            .headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("connection"))
            .filter_map(|h| std::str::from_utf8(h.value).ok())
            .collect();
        let connection = connection.join(",");
        for h in resp.headers.iter() {
            let value = std::str::from_utf8(h.value).unwrap_or("").trim();
            if h.name.eq_ignore_ascii_case("content-length") {
                let n = content_length(value).ok_or_else(|| bad("content-length"))?;
                // Two lengths (even equal) are no length: which one another hop takes is anyone's guess.
                if length.replace(n).is_some() {
                    return Err(bad("several content-length headers"));
                }
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                // Several lines make one list, in order.
                if te {
                    codings.push_str(", ");
                }
                codings.push_str(value);
                te = true;
            } else if h.name.eq_ignore_ascii_case("connection") {
                close |= value.split(',').any(|t| t.trim().eq_ignore_ascii_case("close"));
            } else if h.name.eq_ignore_ascii_case("content-type") {
                sse = value.starts_with("text/event-stream");
            }
            // The router sets the answer's `x-request-id` itself.
            if relayed(h.name, &connection) && !h.name.eq_ignore_ascii_case(REQUEST_ID_HEADER) {
                push_header(&mut out, h.name.as_bytes(), h.value);
            }
        }
        if te && length.is_some() {
            return Err(bad("content-length with transfer-encoding"));
        }
        if te {
            // The codings other than a final `chunked`, kept when the body is re-framed.
            let (rest, last) = codings.rsplit_once(',').unwrap_or(("", &codings));
            chunked = last.trim().eq_ignore_ascii_case("chunked");
            if chunked {
                codings = rest.trim().to_owned();
            }
        }
        let framing = match (status, te, chunked, length) {
            (204 | 304, ..) => Framing::Empty,
            (_, true, true, _) => Framing::Chunked,
            (_, true, false, _) => Framing::Close,
            (_, false, _, Some(n)) => Framing::Length(n),
            _ => Framing::Close,
        };
        let reusable = resp.version == Some(1) && !close && framing != Framing::Close;
        return Ok(Some((at + len, AnswerHead { status, headers: out, framing, sse, reusable, codings })));
    }
}
