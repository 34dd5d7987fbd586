//! The RESP2 wire format: commands encoded as arrays of bulk strings, and an incremental,
//! bounded reply decoder. No sockets here: the caller feeds a buffer and gets whole replies.
//!
//! The decoder consumes each element from the buffer as soon as it is complete and keeps the
//! arrays being built on a stack, so a reply split across any number of reads is parsed once.
//! Every length the peer claims is checked against [`Limits`] before anything is reserved for
//! it, and an array's `Vec` is preallocated for at most [`PREALLOC_ITEMS`] elements: memory
//! grows with bytes actually received, never with a claim.

use bytes::{Buf, Bytes, BytesMut};

use crate::{Error, MAX_DEPTH, Reply};

/// The most array slots reserved up front, whatever length the peer claims.
pub(crate) const PREALLOC_ITEMS: usize = 1024;

/// The longest header line: a type byte, `-9223372036854775808`, CRLF.
const MAX_HEADER: usize = 1 + 20 + 2;

/// What one array element costs besides its payload: an array claiming more than
/// `max_reply_bytes / ELEMENT_COST` elements is refused before any element arrives.
pub(crate) const ELEMENT_COST: usize = 8;

/// What one reply may cost: its payload bytes (bulk and simple strings, error messages) plus
/// [`ELEMENT_COST`] per array element, at most `max_reply_bytes`. So a bulk string of
/// `max_reply_bytes` fits, one byte more does not, and decoded memory stays within a small
/// multiple of the limit (an element's in-memory size over [`ELEMENT_COST`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) max_reply_bytes: usize,
}

/// Incremental RESP2 reply decoder; one per connection.
#[derive(Debug)]
pub(crate) struct Decoder {
    limits: Limits,
    /// Arrays being filled, outermost first: (claimed length, elements so far).
    stack: Vec<(usize, Vec<Reply>)>,
    /// What the reply being decoded has cost so far (see [`Limits`]).
    spent: usize,
    /// How far the buffer was searched for CRLF without finding it (no rescans of a long line).
    scanned: usize,
}

/// One element read from the front of the buffer.
enum Item {
    Value(Reply),
    ArrayOf(usize),
}

// === impl Decoder ===

impl Decoder {
    pub(crate) fn new(limits: Limits) -> Self {
        Self { limits, stack: Vec::new(), spent: 0, scanned: 0 }
    }

    /// The next whole reply, consuming its bytes; `Ok(None)` when more bytes are needed (what
    /// was complete is kept). After an error the connection must be dropped.
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Reply>, Error> {
        loop {
            let Some(item) = self.item(buf)? else { return Ok(None) };
            let mut value = match item {
                Item::Value(v) => v,
                Item::ArrayOf(0) => Reply::Array(Vec::new()),
                Item::ArrayOf(n) => {
                    if self.stack.len() >= MAX_DEPTH {
                        return Err(protocol(format!("arrays nested deeper than {MAX_DEPTH}")));
                    }
                    self.stack.push((n, Vec::with_capacity(n.min(PREALLOC_ITEMS))));
                    continue;
                }
            };
            // Attach the value to the innermost open array, closing every array it completes.
            loop {
                let Some((want, items)) = self.stack.last_mut() else {
                    self.spent = 0;
                    return Ok(Some(value));
                };
                items.push(value);
                if items.len() < *want {
                    break;
                }
                let (_, items) = self.stack.pop().unwrap_or_default();
                value = Reply::Array(items);
            }
        }
    }

    /// One element from the front of `buf`: consumed and returned, or `None` (nothing consumed).
    fn item(&mut self, buf: &mut BytesMut) -> Result<Option<Item>, Error> {
        let Some(&marker) = buf.first() else { return Ok(None) };
        let max = self.limits.max_reply_bytes;
        // What this element may still spend: the reply's budget less its own slot in an array.
        let slot = if self.stack.is_empty() { 0 } else { ELEMENT_COST };
        let avail = (max - self.spent).checked_sub(slot).ok_or_else(|| too_big("reply", max))?;
        let max_line = match marker {
            b'+' | b'-' => avail.saturating_add(3),
            b':' | b'$' | b'*' => MAX_HEADER,
            other => return Err(protocol(format!("unexpected type byte 0x{other:02x}"))),
        };
        let Some(end) = self.line_end(buf, max_line)? else { return Ok(None) };
        let line = &buf[1..end];
        let header = end + 2;
        let (item, payload, body) = match marker {
            b'+' => {
                let s = std::str::from_utf8(line).map_err(|_| protocol("simple string is not UTF-8"))?;
                (Item::Value(Reply::Simple(s.to_owned())), line.len(), 0)
            }
            b'-' => (Item::Value(Reply::Error(String::from_utf8_lossy(line).into_owned())), line.len(), 0),
            b':' => (Item::Value(Reply::Int(parse_int(line)?)), 0, 0),
            b'$' => match parse_len(line)? {
                None => (Item::Value(Reply::Nil), 0, 0),
                Some(len) => {
                    if len > max {
                        return Err(too_big(&format!("bulk string of {len} bytes"), max));
                    }
                    if len > avail {
                        return Err(too_big("reply", max));
                    }
                    if buf.len() < header + len + 2 {
                        return Ok(None);
                    }
                    if &buf[header + len..header + len + 2] != b"\r\n" {
                        return Err(protocol("bulk string not followed by CRLF"));
                    }
                    (Item::Value(Reply::Bulk(Bytes::copy_from_slice(&buf[header..header + len]))), len, len + 2)
                }
            },
            _ => match parse_len(line)? {
                None => (Item::Value(Reply::Nil), 0, 0),
                Some(n) if n > max / ELEMENT_COST => {
                    return Err(too_big(&format!("array of {n} elements"), max));
                }
                Some(n) if n > avail / ELEMENT_COST => return Err(too_big("reply", max)),
                Some(n) => (Item::ArrayOf(n), 0, 0),
            },
        };
        self.spent += slot + payload;
        self.scanned = 0;
        buf.advance(header + body);
        Ok(Some(item))
    }

    /// The index of the CRLF ending the line at the front of `buf`, if there is one yet.
    fn line_end(&mut self, buf: &BytesMut, max_line: usize) -> Result<Option<usize>, Error> {
        let from = self.scanned.max(1);
        let found = buf[from..].windows(2).position(|w| w == b"\r\n").map(|i| i + from);
        match found {
            Some(end) if end + 2 <= max_line => Ok(Some(end)),
            None if buf.len() < max_line => {
                // A trailing '\r' may be half of the CRLF: look at it again next time.
                self.scanned = buf.len().saturating_sub(1);
                Ok(None)
            }
            _ => Err(protocol("header line too long")),
        }
    }
}

/// Appends `args` as one command: an array of bulk strings.
pub(crate) fn encode<A: AsRef<[u8]>>(args: &[A], out: &mut Vec<u8>) {
    out.reserve(16 + args.iter().map(|a| a.as_ref().len() + 16).sum::<usize>());
    push_header(out, b'*', args.len());
    for arg in args {
        let arg = arg.as_ref();
        push_header(out, b'$', arg.len());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

fn push_header(out: &mut Vec<u8>, marker: u8, n: usize) {
    out.push(marker);
    out.extend_from_slice(n.to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
}

fn too_big(what: &str, max: usize) -> Error {
    protocol(format!("{what} exceeds the reply limit of {max} bytes"))
}

fn protocol(why: impl Into<String>) -> Error {
    Error::Protocol(why.into())
}

/// A RESP integer: optional '-', then 1..=19 digits, in range.
fn parse_int(line: &[u8]) -> Result<i64, Error> {
    let digits = line.strip_prefix(b"-").unwrap_or(line);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(protocol("integer is not a decimal number"));
    }
    std::str::from_utf8(line).ok().and_then(|s| s.parse().ok()).ok_or_else(|| protocol("integer out of range"))
}

/// A bulk or array length: `-1` is `None` (nil); any other negative is an error.
fn parse_len(line: &[u8]) -> Result<Option<usize>, Error> {
    match parse_int(line)? {
        -1 => Ok(None),
        n if n < 0 => Err(protocol(format!("negative length {n}"))),
        n => usize::try_from(n).map(Some).map_err(|_| protocol("length out of range")),
    }
}

#[cfg(test)]
mod tests;
