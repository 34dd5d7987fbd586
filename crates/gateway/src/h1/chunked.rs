//! Chunked transfer coding for the fast path: a decoder that takes a worker's
//! chunked body as it arrives, and the encoder of the chunks relayed to the
//! client. Re-framing (not passing chunks through) lets the relay end a
//! stream cleanly at any point, even when the worker dies inside a chunk.

use bytes::{Buf, BytesMut};

/// Longest chunk-size or trailer line accepted.
const MAX_LINE: usize = 4096;

/// Where a chunked body's decoding stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Decoder {
    /// Expecting a chunk-size line.
    #[default]
    Size,
    /// Inside a chunk: this many payload bytes to go.
    Data(u64),
    /// After a chunk's payload: expecting its CRLF.
    DataEnd,
    /// After the last chunk: trailer lines until a blank one.
    Trailer,
    /// The body ended.
    Done,
}

/// The body is not valid chunked coding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid chunked body from the worker")]
pub(crate) struct Invalid;

impl Decoder {
    /// Moves the payload at the front of `input` to `out`, consuming the
    /// framing; true once the body has ended (what follows it stays in `input`).
    pub(crate) fn decode(&mut self, input: &mut BytesMut, out: &mut Vec<u8>) -> Result<bool, Invalid> {
        loop {
            match *self {
                Decoder::Size => {
                    let Some(eol) = line_end(input)? else { return Ok(false) };
                    let digits = input[..eol].split(|b| *b == b';').next().unwrap_or_default();
                    let digits = std::str::from_utf8(digits).map_err(|_| Invalid)?.trim_matches([' ', '\t']);
                    if digits.is_empty() || digits.len() > 15 {
                        return Err(Invalid);
                    }
                    let n = u64::from_str_radix(digits, 16).map_err(|_| Invalid)?;
                    input.advance(eol + 2);
                    *self = if n == 0 { Decoder::Trailer } else { Decoder::Data(n) };
                }
                Decoder::Data(n) => {
                    if input.is_empty() {
                        return Ok(false);
                    }
                    let take = input.len().min(usize::try_from(n).unwrap_or(usize::MAX));
                    out.extend_from_slice(&input[..take]);
                    input.advance(take);
                    let left = n - take as u64;
                    *self = if left == 0 { Decoder::DataEnd } else { Decoder::Data(left) };
                }
                Decoder::DataEnd => {
                    if input.len() < 2 {
                        return Ok(false);
                    }
                    if &input[..2] != b"\r\n" {
                        return Err(Invalid);
                    }
                    input.advance(2);
                    *self = Decoder::Size;
                }
                Decoder::Trailer => {
                    let Some(eol) = line_end(input)? else { return Ok(false) };
                    input.advance(eol + 2);
                    if eol == 0 {
                        *self = Decoder::Done;
                    }
                }
                Decoder::Done => return Ok(true),
            }
        }
    }
}

/// Where the CRLF ending the line at the front of `input` is, once it is there.
fn line_end(input: &[u8]) -> Result<Option<usize>, Invalid> {
    match input.windows(2).position(|w| w == b"\r\n") {
        Some(i) if i <= MAX_LINE => Ok(Some(i)),
        None if input.len() <= MAX_LINE => Ok(None),
        _ => Err(Invalid),
    }
}

/// Appends `payload` to `out` as one chunk (nothing for an empty payload,
/// which would end the body).
pub(crate) fn encode(payload: &[u8], out: &mut Vec<u8>) {
    if payload.is_empty() {
        return;
    }
    out.extend_from_slice(format!("{:x}\r\n", payload.len()).as_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
}

/// The chunk that ends a body.
pub(crate) const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &[u8] = b"5;ext=1\r\nhello\r\n1A\r\n abcdefghijklmnopqrstuvwxy\r\n0\r\nx-trailer: 1\r\n\r\nNEXT";

    fn decode_in_pieces(raw: &[u8], piece: usize) -> (Vec<u8>, bool, Vec<u8>) {
        let (mut d, mut input, mut out, mut done) = (Decoder::default(), BytesMut::new(), Vec::new(), false);
        for part in raw.chunks(piece) {
            assert!(!done, "input after the end was consumed as body");
            input.extend_from_slice(part);
            done = d.decode(&mut input, &mut out).expect("valid");
            if done {
                break;
            }
        }
        (out, done, input.to_vec())
    }

    #[test]
    fn decodes_whatever_the_read_boundaries() {
        for piece in 1..=BODY.len() {
            let (out, done, rest) = decode_in_pieces(BODY, piece);
            assert!(done, "piece {piece}");
            assert_eq!(out, b"hello abcdefghijklmnopqrstuvwxy", "piece {piece}");
            // Whatever followed the body in the last read stays unread.
            assert!(b"NEXT".starts_with(&rest), "piece {piece}: {rest:?}");
        }
    }

    #[test]
    fn a_cut_body_is_not_done() {
        let (out, done, _) = decode_in_pieces(&BODY[..23], 3);
        assert!(!done);
        assert_eq!(out, b"hello ab");
    }

    #[test]
    fn refuses_bad_framing() {
        for raw in [&b"zz\r\n"[..], b"5\r\nhelloXX", b"\r\n", b"1234567890abcdef0\r\n", &[b'1'; MAX_LINE + 3]] {
            let mut input = BytesMut::from(raw);
            assert_eq!(Decoder::default().decode(&mut input, &mut Vec::new()), Err(Invalid), "{raw:?}");
        }
    }

    #[test]
    fn encodes_what_it_decodes() {
        let mut framed = Vec::new();
        encode(b"data: {}\n\n", &mut framed);
        encode(b"", &mut framed);
        framed.extend_from_slice(LAST_CHUNK);
        assert_eq!(framed, b"a\r\ndata: {}\n\n\r\n0\r\n\r\n");
        let (out, done, rest) = decode_in_pieces(&framed, 4);
        assert!(done && rest.is_empty());
        assert_eq!(out, b"data: {}\n\n");
    }
}
