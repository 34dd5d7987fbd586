//! A minimal msgpack reader and writer: exactly what the KV-event wire format
//! needs, with every length checked against the bytes left before anything is
//! allocated. No `unsafe`, no recursion deeper than `MAX_DEPTH`.

use crate::WireError;

/// Deepest nesting `skip` follows (events are 3 levels deep; extensions may add a few).
const MAX_DEPTH: usize = 32;

/// One msgpack item header: scalars carry their value, containers their length.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Item<'a> {
    Nil,
    Bool(bool),
    /// A non-negative integer (msgpack uint or positive int).
    Uint(u64),
    /// A negative integer.
    Int(i64),
    Float(f64),
    Str(&'a str),
    Bin(&'a [u8]),
    Array(usize),
    Map(usize),
    /// Extension types are skipped whole.
    Ext,
}

/// Reads items from a byte slice.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

// === impl Reader ===

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// Bytes consumed so far (for error positions).
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if n > self.remaining() {
            return Err(WireError::Truncated { at: self.pos });
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// A container length, refused if even one byte per element would not fit.
    fn len_checked(&self, n: usize, per_item: usize) -> Result<usize, WireError> {
        if n.saturating_mul(per_item) > self.remaining() {
            return Err(WireError::Truncated { at: self.pos });
        }
        Ok(n)
    }

    /// The next item header.
    pub(crate) fn next(&mut self) -> Result<Item<'a>, WireError> {
        let at = self.pos;
        let m = self.u8()?;
        Ok(match m {
            0x00..=0x7f => Item::Uint(u64::from(m)),
            0x80..=0x8f => Item::Map(self.len_checked(usize::from(m & 0x0f), 2)?),
            0x90..=0x9f => Item::Array(self.len_checked(usize::from(m & 0x0f), 1)?),
            0xa0..=0xbf => self.str(usize::from(m & 0x1f))?,
            0xc0 => Item::Nil,
            0xc2 => Item::Bool(false),
            0xc3 => Item::Bool(true),
            0xc4 => {
                let n = usize::from(self.u8()?);
                Item::Bin(self.take(n)?)
            }
            0xc5 => {
                let n = usize::from(u16::from_be_bytes(self.be()?));
                Item::Bin(self.take(n)?)
            }
            0xc6 => {
                let n = u32::from_be_bytes(self.be()?) as usize;
                Item::Bin(self.take(n)?)
            }
            0xc7 => {
                let n = usize::from(self.u8()?);
                self.take(n + 1)?;
                Item::Ext
            }
            0xc8 => {
                let n = usize::from(u16::from_be_bytes(self.be()?));
                self.take(n + 1)?;
                Item::Ext
            }
            0xc9 => {
                let n = u32::from_be_bytes(self.be()?) as usize;
                self.take(n.saturating_add(1))?;
                Item::Ext
            }
            0xca => Item::Float(f64::from(f32::from_be_bytes(self.be()?))),
            0xcb => Item::Float(f64::from_be_bytes(self.be()?)),
            0xcc => Item::Uint(u64::from(self.u8()?)),
            0xcd => Item::Uint(u64::from(u16::from_be_bytes(self.be()?))),
            0xce => Item::Uint(u64::from(u32::from_be_bytes(self.be()?))),
            0xcf => Item::Uint(u64::from_be_bytes(self.be()?)),
            0xd0 => int(i64::from(self.u8()? as i8)),
            0xd1 => int(i64::from(i16::from_be_bytes(self.be()?))),
            0xd2 => int(i64::from(i32::from_be_bytes(self.be()?))),
            0xd3 => int(i64::from_be_bytes(self.be()?)),
            0xd4 => {
                self.take(2)?;
                Item::Ext
            }
            0xd5 => {
                self.take(3)?;
                Item::Ext
            }
            0xd6 => {
                self.take(5)?;
                Item::Ext
            }
            0xd7 => {
                self.take(9)?;
                Item::Ext
            }
            0xd8 => {
                self.take(17)?;
                Item::Ext
            }
            0xd9 => {
                let n = usize::from(self.u8()?);
                self.str(n)?
            }
            0xda => {
                let n = usize::from(u16::from_be_bytes(self.be()?));
                self.str(n)?
            }
            0xdb => {
                let n = u32::from_be_bytes(self.be()?) as usize;
                self.str(n)?
            }
            0xdc => {
                let n = usize::from(u16::from_be_bytes(self.be()?));
                Item::Array(self.len_checked(n, 1)?)
            }
            0xdd => {
                let n = u32::from_be_bytes(self.be()?) as usize;
                Item::Array(self.len_checked(n, 1)?)
            }
            0xde => {
                let n = usize::from(u16::from_be_bytes(self.be()?));
                Item::Map(self.len_checked(n, 2)?)
            }
            0xdf => {
                let n = u32::from_be_bytes(self.be()?) as usize;
                Item::Map(self.len_checked(n, 2)?)
            }
            0xe0..=0xff => Item::Int(i64::from(m as i8)),
            0xc1 => return Err(WireError::Malformed { at, what: "reserved marker 0xc1" }),
        })
    }

    fn str(&mut self, n: usize) -> Result<Item<'a>, WireError> {
        let at = self.pos;
        let bytes = self.take(n)?;
        std::str::from_utf8(bytes).map(Item::Str).map_err(|_| WireError::Malformed { at, what: "string is not UTF-8" })
    }

    /// Skips one whole value (a container with everything in it).
    pub(crate) fn skip(&mut self) -> Result<(), WireError> {
        self.skip_depth(0)
    }

    fn skip_depth(&mut self, depth: usize) -> Result<(), WireError> {
        if depth > MAX_DEPTH {
            return Err(WireError::Malformed { at: self.pos, what: "nesting too deep" });
        }
        match self.next()? {
            Item::Array(n) => (0..n).try_for_each(|_| self.skip_depth(depth + 1)),
            Item::Map(n) => (0..n * 2).try_for_each(|_| self.skip_depth(depth + 1)),
            _ => Ok(()),
        }
    }
}

/// msgpack's signed markers may carry non-negative values: normalize them.
fn int(v: i64) -> Item<'static> {
    if v >= 0 { Item::Uint(v as u64) } else { Item::Int(v) }
}

/// Appends msgpack items to a buffer.
#[derive(Debug, Default)]
pub(crate) struct Writer {
    pub(crate) buf: Vec<u8>,
}

// === impl Writer ===

impl Writer {
    pub(crate) fn nil(&mut self) {
        self.buf.push(0xc0);
    }

    pub(crate) fn uint(&mut self, v: u64) {
        match v {
            0..=0x7f => self.buf.push(v as u8),
            0x80..=0xff => self.buf.extend_from_slice(&[0xcc, v as u8]),
            0x100..=0xffff => {
                self.buf.push(0xcd);
                self.buf.extend_from_slice(&(v as u16).to_be_bytes());
            }
            0x1_0000..=0xffff_ffff => {
                self.buf.push(0xce);
                self.buf.extend_from_slice(&(v as u32).to_be_bytes());
            }
            _ => {
                self.buf.push(0xcf);
                self.buf.extend_from_slice(&v.to_be_bytes());
            }
        }
    }

    pub(crate) fn int(&mut self, v: i64) {
        if v >= 0 {
            self.uint(v as u64);
        } else if v >= -32 {
            self.buf.push(v as i8 as u8);
        } else {
            self.buf.push(0xd3);
            self.buf.extend_from_slice(&v.to_be_bytes());
        }
    }

    pub(crate) fn float(&mut self, v: f64) {
        self.buf.push(0xcb);
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub(crate) fn str(&mut self, s: &str) {
        let n = s.len();
        if n < 32 {
            self.buf.push(0xa0 | n as u8);
        } else if n <= 0xff {
            self.buf.extend_from_slice(&[0xd9, n as u8]);
        } else if n <= 0xffff {
            self.buf.push(0xda);
            self.buf.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.buf.push(0xdb);
            self.buf.extend_from_slice(&(n as u32).to_be_bytes());
        }
        self.buf.extend_from_slice(s.as_bytes());
    }

    pub(crate) fn bin(&mut self, b: &[u8]) {
        let n = b.len();
        if n <= 0xff {
            self.buf.extend_from_slice(&[0xc4, n as u8]);
        } else if n <= 0xffff {
            self.buf.push(0xc5);
            self.buf.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.buf.push(0xc6);
            self.buf.extend_from_slice(&(n as u32).to_be_bytes());
        }
        self.buf.extend_from_slice(b);
    }

    pub(crate) fn array(&mut self, n: usize) {
        if n < 16 {
            self.buf.push(0x90 | n as u8);
        } else if n <= 0xffff {
            self.buf.push(0xdc);
            self.buf.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.buf.push(0xdd);
            self.buf.extend_from_slice(&(n as u32).to_be_bytes());
        }
    }

    pub(crate) fn map(&mut self, n: usize) {
        if n < 16 {
            self.buf.push(0x80 | n as u8);
        } else {
            self.buf.push(0xde);
            self.buf.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_scalars_and_containers() {
        let mut w = Writer::default();
        w.array(7);
        w.uint(300);
        w.int(-5);
        w.int(-1_000_000);
        w.float(1.5);
        w.str("héllo");
        w.bin(&[1, 2, 3]);
        w.map(1);
        w.str("k");
        w.nil();
        let mut r = Reader::new(&w.buf);
        assert_eq!(r.next().unwrap(), Item::Array(7));
        assert_eq!(r.next().unwrap(), Item::Uint(300));
        assert_eq!(r.next().unwrap(), Item::Int(-5));
        assert_eq!(r.next().unwrap(), Item::Int(-1_000_000));
        assert_eq!(r.next().unwrap(), Item::Float(1.5));
        assert_eq!(r.next().unwrap(), Item::Str("héllo"));
        assert_eq!(r.next().unwrap(), Item::Bin(&[1, 2, 3]));
        assert_eq!(r.next().unwrap(), Item::Map(1));
        r.skip().unwrap();
        r.skip().unwrap();
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn lengths_are_checked_before_allocating() {
        // An array header claiming 2^32-1 elements with nothing after it.
        let mut r = Reader::new(&[0xdd, 0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(r.next(), Err(WireError::Truncated { .. })));
        let mut r = Reader::new(&[0xdb, 0x7f, 0, 0, 0]);
        assert!(matches!(r.next(), Err(WireError::Truncated { .. })));
        let mut r = Reader::new(&[0xc1]);
        assert!(matches!(r.next(), Err(WireError::Malformed { .. })));
    }

    #[test]
    fn deep_nesting_is_refused() {
        let buf = vec![0x91; 100];
        assert!(Reader::new(&buf).skip().is_err());
    }
}
