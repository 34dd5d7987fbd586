//! Chunked transfer coding for the fast path: a decoder that takes a worker's
//! chunked body as it arrives (or, for the hyper fallback's guard, finds
//! where a client's chunked body ends without copying it), and the encoder of
//! the chunks relayed to the client. Re-framing (not passing chunks through)
//! lets the relay end a stream cleanly at any point, even when the worker
//! dies inside a chunk. Chunk sizes are strict: hex digits only, so this hop
//! and another never disagree on where a chunk ends.

use bytes::{Buf, BytesMut};

/// Longest chunk-size or trailer line accepted.
const MAX_LINE: usize = 4096;

/// Where a chunked body's decoding stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Decoder {
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
pub struct Invalid;

impl Decoder {
    /// Moves the payload at the front of `input` to `out`, consuming the
    /// framing; true once the body has ended (what follows it stays in `input`).
    pub fn decode(&mut self, input: &mut BytesMut, out: &mut Vec<u8>) -> Result<bool, Invalid> {
        let (used, done) = self.run(input, |payload| out.extend_from_slice(payload))?;
        input.advance(used);
        Ok(done)
    }

    /// How many bytes at the front of `input` belong to the body, framing
    /// included, and whether the body ends there; nothing is copied.
    pub fn skip(&mut self, input: &[u8]) -> Result<(usize, bool), Invalid> {
        self.run(input, |_| {})
    }

    /// Walks the framing at the front of `input`, handing each piece of
    /// payload to `payload`: the bytes used and whether the body ended.
    fn run(&mut self, input: &[u8], mut payload: impl FnMut(&[u8])) -> Result<(usize, bool), Invalid> {
        let mut at = 0;
        loop {
            let rest = &input[at..];
            match *self {
                Decoder::Size => {
                    let Some(eol) = line_end(rest)? else { return Ok((at, false)) };
                    let n = chunk_size(&rest[..eol + 2])?;
                    at += eol + 2;
                    *self = if n == 0 { Decoder::Trailer } else { Decoder::Data(n) };
                }
                Decoder::Data(n) => {
                    if rest.is_empty() {
                        return Ok((at, false));
                    }
                    let take = rest.len().min(usize::try_from(n).unwrap_or(usize::MAX));
                    payload(&rest[..take]);
                    at += take;
                    let left = n - take as u64;
                    *self = if left == 0 { Decoder::DataEnd } else { Decoder::Data(left) };
                }
                Decoder::DataEnd => {
                    if rest.len() < 2 {
                        return Ok((at, false));
                    }
                    if &rest[..2] != b"\r\n" {
                        return Err(Invalid);
                    }
                    at += 2;
                    *self = Decoder::Size;
                }
                Decoder::Trailer => {
                    let Some(eol) = line_end(rest)? else { return Ok((at, false)) };
                    at += eol + 2;
                    if eol == 0 {
                        *self = Decoder::Done;
                    }
                }
                Decoder::Done => return Ok((at, true)),
            }
        }
    }
}

/// The size on a chunk-size line (CRLF included): at least one hex digit and
/// nothing else before the optional whitespace and extensions. httparse does
/// the rest; on its own it takes an empty size as 0, which is checked first
/// (`u64::from_str_radix`, used before, took a leading `+` as well).
fn chunk_size(line: &[u8]) -> Result<u64, Invalid> {
    if !line.first().is_some_and(u8::is_ascii_hexdigit) {
        return Err(Invalid);
    }
    match httparse::parse_chunk_size(line) {
        Ok(httparse::Status::Complete((used, n))) if used == line.len() => Ok(n),
        _ => Err(Invalid),
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
pub fn encode(payload: &[u8], out: &mut Vec<u8>) {
    if payload.is_empty() {
        return;
    }
    out.extend_from_slice(format!("{:x}\r\n", payload.len()).as_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
}

/// The chunk that ends a body.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

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
        for raw in [
            &b"zz\r\n"[..],
            b"5\r\nhelloXX",
            b"\r\n",
            b"1234567890abcdef0\r\n",
            &[b'1'; MAX_LINE + 3],
            // Signs, prefixes, inner and leading blanks: only hex digits make a size.
            b"+5\r\nhello\r\n",
            b"-0\r\n",
            b"0x5\r\nhello\r\n",
            b" 5\r\nhello\r\n",
            b"5 5\r\nhello\r\n",
            b";ext\r\n",
        ] {
            let mut input = BytesMut::from(raw);
            assert_eq!(Decoder::default().decode(&mut input, &mut Vec::new()), Err(Invalid), "{raw:?}");
        }
    }

    #[test]
    fn skips_a_body_in_pieces_without_copying() {
        for piece in 1..=BODY.len() {
            let (mut d, mut used, mut done) = (Decoder::default(), 0, false);
            let mut seen = 0;
            while !done && seen < BODY.len() {
                seen = (seen + piece).min(BODY.len());
                let (n, end) = d.skip(&BODY[used..seen]).expect("valid");
                (used, done) = (used + n, end);
            }
            assert!(done, "piece {piece}");
            assert_eq!(&BODY[used..], b"NEXT", "piece {piece}");
        }
        // Trailing blanks and extensions after the digits are fine.
        assert_eq!(Decoder::default().skip(b"5 ;a=b\r\nhello\r\n0\r\n\r\n"), Ok((20, true)));
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
