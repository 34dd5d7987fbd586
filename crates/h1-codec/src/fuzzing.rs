//! Entry points for the coverage-guided fuzz targets (`fuzz/`), behind the
//! `fuzzing` feature: the codec driven as the front ends and the worker
//! client drive it (a chunked body in reads of given sizes), with plain
//! verdicts to compare against httparse. Not an API.

use bytes::BytesMut;

use crate::chunked::{self, Decoder, Invalid};
use crate::{BodyLen, Framing, Next, parse_answer_head, parse_head};

/// What the fast path makes of the request head at the front of a buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FastHead {
    /// More bytes needed.
    Incomplete,
    /// Served by the fast path: the head's length and the body's.
    Fast { head_len: usize, body_len: usize },
    /// Handed to the hyper fallback.
    Hyper,
    /// Refused (400, 414, 431).
    Refused,
}

/// The body framing the fallback's guard finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    Empty,
    Length(u64),
    Chunked,
}

/// How a worker's answer body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerFraming {
    Empty,
    Length(u64),
    Chunked,
    Close,
}

/// A worker's answer head as the relay reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// Bytes of the head, interim 1xx answers before it included.
    pub len: usize,
    pub status: u16,
    pub framing: AnswerFraming,
    /// The end-to-end headers relayed, serialized.
    pub headers: Vec<u8>,
    /// Transfer codings other than a final `chunked`.
    pub codings: String,
    pub reusable: bool,
}

/// The fast path's verdict on `buf` (no request-id headers configured but `x-request-id`).
pub fn fast_head(buf: &[u8]) -> FastHead {
    match parse_head(buf, &["x-request-id".to_owned()], Some("x-smg-tenant-id")) {
        None => FastHead::Incomplete,
        Some(Next::Fast(h)) => FastHead::Fast { head_len: h.len, body_len: h.body_len },
        Some(Next::Hyper) => FastHead::Hyper,
        Some(Next::Refuse(_)) => FastHead::Refused,
    }
}

/// The fallback guard's verdict on `buf`: `Ok(None)` while incomplete, the
/// head's length and body framing, or why it is refused.
pub fn fallback_head(buf: &[u8]) -> Result<Option<(usize, Body)>, String> {
    match crate::check(buf) {
        Ok(None) => Ok(None),
        Ok(Some((len, body))) => Ok(Some((
            len,
            match body {
                BodyLen::Empty => Body::Empty,
                BodyLen::Length(n) => Body::Length(n),
                BodyLen::Chunked => Body::Chunked,
            },
        ))),
        Err(r) => Err(format!("{r:?}")),
    }
}

/// Decodes a chunked body arriving in reads of the sizes `pieces` (the rest
/// in one last read): its payload, whether it ended, and the bytes consumed.
pub fn chunked_decode(input: &[u8], pieces: &[usize]) -> Result<(Vec<u8>, bool, usize), Invalid> {
    let mut decoder = Decoder::default();
    let (mut buf, mut out, mut fed) = (BytesMut::new(), Vec::new(), 0);
    let ends = pieces.iter().scan(0usize, |at, p| {
        *at = (*at + p).min(input.len());
        Some(*at)
    });
    for end in ends.chain(std::iter::once(input.len())) {
        if end <= fed {
            continue;
        }
        buf.extend_from_slice(&input[fed..end]);
        fed = end;
        if decoder.decode(&mut buf, &mut out)? {
            return Ok((out, true, fed - buf.len()));
        }
    }
    Ok((out, false, fed - buf.len()))
}

/// How many bytes at the front of `input` a chunked body takes, and whether it ends there.
pub fn chunked_skip(input: &[u8]) -> Result<(usize, bool), Invalid> {
    Decoder::default().skip(input)
}

/// `payload` as one chunk (nothing for an empty payload).
pub fn chunked_encode(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    chunked::encode(payload, &mut out);
    out
}

/// The worker's answer head at the front of `buf`: `Ok(None)` while incomplete.
pub fn answer_head(buf: &[u8]) -> Result<Option<Answer>, String> {
    match parse_answer_head(buf) {
        Ok(None) => Ok(None),
        Ok(Some((len, h))) => Ok(Some(Answer {
            len,
            status: h.status,
            framing: match h.framing {
                Framing::Empty => AnswerFraming::Empty,
                Framing::Length(n) => AnswerFraming::Length(n),
                Framing::Chunked => AnswerFraming::Chunked,
                Framing::Close => AnswerFraming::Close,
            },
            headers: h.headers,
            codings: h.codings,
            reusable: h.reusable,
        })),
        Err(e) => Err(e.to_string()),
    }
}
