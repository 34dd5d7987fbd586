//! Which headers cross a hop, in either direction, and the serialized form
//! (`name: value\r\n` lines) both front ends and the worker client carry
//! headers in.

use crate::{ROUTE_DEBUG_HEADER, ROUTE_MODE_HEADER};

/// Headers that describe one hop of a message, not the message: never passed
/// on, in either direction. `proxy-authorization` and `proxy-authenticate`
/// are credentials for (and challenges from) a proxy on this hop: relayed,
/// they would hand a client's proxy credentials to the worker.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Request headers the router sets itself on the way to the worker, or reads and keeps
/// (`x-route-debug` carries a control-plane key).
const SET_BY_ROUTER: [&str; 6] =
    ["host", "content-length", "content-type", "expect", ROUTE_DEBUG_HEADER, ROUTE_MODE_HEADER];

fn listed(name: &str, list: &[&str]) -> bool {
    list.iter().any(|n| name.eq_ignore_ascii_case(n))
}

/// Whether a client's request header goes on to the worker: end-to-end
/// headers do (`authorization`, `x-request-id`, `traceparent`, ...), hop-by-hop
/// ones, those the client's `connection` header names, and those the router
/// sets do not.
pub fn forwarded(name: &str, connection: &str) -> bool {
    !listed(name, &HOP_BY_HOP)
        && !listed(name, &SET_BY_ROUTER)
        && !connection.split(',').any(|t| t.trim().eq_ignore_ascii_case(name))
}

/// Whether a worker's answer header goes back to the client: end-to-end ones
/// do, except the length, which the relay sets from the body it sends, and
/// those the answer's own `connection` header (`connection`, its tokens
/// joined by commas) names as hop-only.
pub fn relayed(name: &str, connection: &str) -> bool {
    !listed(name, &HOP_BY_HOP)
        && !name.eq_ignore_ascii_case("content-length")
        && !connection.split(',').any(|t| t.trim().eq_ignore_ascii_case(name))
}

/// Appends a header line, `name: value\r\n`.
pub fn push_header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// The (name, value) of each line of serialized headers (`name: value\r\n`, as [`push_header`]
/// writes them), the value trimmed; a line without a colon is skipped.
pub fn header_lines(lines: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> + Clone {
    lines.split(|&b| b == b'\n').filter_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let colon = line.iter().position(|&b| b == b':')?;
        Some((&line[..colon], line[colon + 1..].trim_ascii()))
    })
}
