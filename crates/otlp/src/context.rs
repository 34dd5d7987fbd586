//! W3C trace context: a request's `traceparent` read (`00-TRACEID-PARENTID-FLAGS`), the
//! router's own span in the same trace, and the `traceparent` sent on to the worker so the
//! engine's spans join the trace.

/// A span's place in a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    /// The trace (the client's, or a new one).
    pub trace_id: [u8; 16],
    /// The client's span this one is a child of (`None`: a new trace's root).
    pub parent: Option<[u8; 8]>,
    /// This span.
    pub span_id: [u8; 8],
    /// W3C trace flags (bit 0: sampled).
    pub flags: u8,
}

impl TraceContext {
    /// A span for a request whose `traceparent` header was `incoming` (ignored unless valid):
    /// in its trace, a child of its span; else the root of a new sampled trace. `random`
    /// draws the ids.
    pub fn child_of(incoming: Option<&[u8]>, mut random: impl FnMut() -> u64) -> TraceContext {
        let mut span_id = random().to_be_bytes();
        if span_id == [0; 8] {
            span_id[7] = 1;
        }
        match incoming.and_then(parse) {
            Some((trace_id, parent, flags)) => TraceContext { trace_id, parent: Some(parent), span_id, flags },
            None => {
                let mut trace_id = [0u8; 16];
                trace_id[..8].copy_from_slice(&random().to_be_bytes());
                trace_id[8..].copy_from_slice(&random().to_be_bytes());
                if trace_id == [0; 16] {
                    trace_id[15] = 1;
                }
                TraceContext { trace_id, parent: None, span_id, flags: 1 }
            }
        }
    }

    /// The `traceparent` naming this span as the parent of the worker's.
    pub fn traceparent(&self) -> String {
        format!("00-{}-{}-{:02x}", hex(&self.trace_id), hex(&self.span_id), self.flags)
    }

    /// Whether the trace is sampled (its spans exported).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

/// A `traceparent` value's trace id, parent span id and flags; `None` unless it is well
/// formed (version `00`, or a later one read by its first four fields), with non-zero ids.
pub fn parse(value: &[u8]) -> Option<([u8; 16], [u8; 8], u8)> {
    let s = std::str::from_utf8(value).ok()?.trim();
    let mut parts = s.split('-');
    let (version, trace, parent, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let rest = parts.next();
    let version = u8::from_str_radix(version, 16).ok().filter(|_| version.len() == 2)?;
    // Version 00 has exactly four fields; ff is invalid; a later version may add fields.
    if version == 0xff || (version == 0 && rest.is_some()) {
        return None;
    }
    let trace_id: [u8; 16] = unhex(trace)?;
    let parent: [u8; 8] = unhex(parent)?;
    let [flags]: [u8; 1] = unhex(flags)?;
    (trace_id != [0; 16] && parent != [0; 8]).then_some((trace_id, parent, flags))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Lowercase hex of exactly `N` bytes.
fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &[u8] = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_is_continued_and_anything_else_starts_a_trace() {
        let mut n = 0u64;
        let mut random = || {
            n += 1;
            n
        };
        let ctx = TraceContext::child_of(Some(GOOD), &mut random);
        assert_eq!(hex(&ctx.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(ctx.parent.map(|p| hex(&p)).as_deref(), Some("00f067aa0ba902b7"));
        assert_eq!(ctx.traceparent(), "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000001-01");
        assert!(ctx.sampled());
        for bad in [
            &b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"[..],
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            b"\xff\xfe",
        ] {
            assert_eq!(parse(bad), None, "{}", String::from_utf8_lossy(bad));
            let fresh = TraceContext::child_of(Some(bad), &mut random);
            assert_eq!((fresh.parent, fresh.flags), (None, 1), "a new sampled root");
        }
        // A later version is read by its first four fields.
        assert!(parse(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what").is_some());
        let unsampled =
            TraceContext::child_of(Some(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"), random);
        assert!(!unsampled.sampled());
    }
}
