//! The response cache's answers shared by every replica: an answer kept by one is written
//! through to the backend under its request's digest (expiring with the plugin's TTL), and a
//! replica whose own store misses looks there before asking a worker. A stored answer is
//! sealed with a SHA-256 over its key and bytes and checked on read: a corrupt, truncated or
//! misplaced entry is a miss (counted), never an answer.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::HeaderValue;
use sha2::{Digest, Sha256};
use shared_state::Reply;

use super::Shared;

/// A stored answer's parts: its status, content type and body (the response cache's
/// `Answer`, which this module does not name: the cache calls it, not the other way).
pub(crate) type Parts = (u16, Option<HeaderValue>, Bytes);

/// The first bytes of a stored answer (the format's version is its last byte).
const MAGIC: &[u8; 4] = b"SGA1";
/// Writes to the backend under way at most; past it an answer is kept locally only (counted).
const MAX_WRITES: usize = 64;

/// The backend's key of the request whose digest is `digest`.
fn key(shared: &Shared, digest: &[u8; 32]) -> Vec<u8> {
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    shared.key("answer", &hex)
}

/// An answer sealed for the request `digest`.
fn seal(digest: &[u8; 32], (status, content_type, body): (u16, Option<&HeaderValue>, &[u8])) -> Vec<u8> {
    let ct = content_type.map_or(&b""[..], HeaderValue::as_bytes);
    let mut out = Vec::with_capacity(4 + 2 + 2 + ct.len() + 4 + body.len() + 32);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&status.to_le_bytes());
    out.extend_from_slice(&(ct.len() as u16).to_le_bytes());
    out.extend_from_slice(ct);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(body);
    let seal: [u8; 32] = Sha256::new().chain_update(digest).chain_update(&out).finalize().into();
    out.extend_from_slice(&seal);
    out
}

/// The answer in `bytes` if it is whole, sealed for `digest`, a success and at most
/// `max_body` bytes.
fn open(digest: &[u8; 32], bytes: &[u8], max_body: usize) -> Option<Parts> {
    let (sealed, seal) = bytes.split_at_checked(bytes.len().checked_sub(32)?)?;
    let expected: [u8; 32] = Sha256::new().chain_update(digest).chain_update(sealed).finalize().into();
    if seal != expected || !sealed.starts_with(MAGIC) {
        return None;
    }
    let rest = &sealed[4..];
    let status = u16::from_le_bytes(rest.get(..2)?.try_into().ok()?);
    let ct_len = u16::from_le_bytes(rest.get(2..4)?.try_into().ok()?) as usize;
    let ct = rest.get(4..4 + ct_len)?;
    let body_len = u32::from_le_bytes(rest.get(4 + ct_len..8 + ct_len)?.try_into().ok()?) as usize;
    let body = rest.get(8 + ct_len..)?;
    if body.len() != body_len || body_len > max_body || !(200..300).contains(&status) {
        return None;
    }
    let content_type = if ct.is_empty() { None } else { Some(HeaderValue::from_bytes(ct).ok()?) };
    Some((status, content_type, Bytes::copy_from_slice(body)))
}

/// The answer another replica kept for the request `digest`, if the backend has a sound one
/// (within the backend's command deadline; none when it is out of reach).
pub(crate) async fn lookup(shared: &Shared, digest: &[u8; 32], max_body: usize) -> Option<Parts> {
    let c = &shared.counters;
    if !shared.is_up() {
        return None;
    }
    match shared.backend.cmd(&[b"GET", &key(shared, digest)]).await {
        Ok(Reply::Bulk(bytes)) => {
            let answer = open(digest, &bytes, max_body);
            let counter = if answer.is_some() { &c.cache_hits } else { &c.cache_corrupt };
            counter.fetch_add(1, Ordering::Relaxed);
            answer
        }
        Ok(Reply::Nil) => {
            c.cache_misses.fetch_add(1, Ordering::Relaxed);
            None
        }
        _ => {
            c.cache_errors.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Writes `answer` through for the request `digest`, to expire after `ttl`; in the background,
/// and not at all past [`MAX_WRITES`] under way or with the backend out of reach.
pub(crate) fn store(
    shared: &Arc<Shared>,
    digest: &[u8; 32],
    answer: (u16, Option<&HeaderValue>, &[u8]),
    ttl: Duration,
) {
    let writes = &shared.counters.answer_writes;
    if !shared.is_up() || writes.fetch_add(1, Ordering::Relaxed) >= MAX_WRITES {
        writes.fetch_sub(1, Ordering::Relaxed);
        shared.counters.cache_errors.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let (shared, key, value) = (shared.clone(), key(shared, digest), seal(digest, answer));
    let ttl_ms = ttl.as_millis().max(1).to_string();
    tokio::spawn(async move {
        let r = shared.backend.cmd(&[b"SET", &key, &value, b"PX", ttl_ms.as_bytes()]).await;
        shared.counters.answer_writes.fetch_sub(1, Ordering::Relaxed);
        let counter = if matches!(r, Ok(Reply::Simple(_))) {
            &shared.counters.cache_stores
        } else {
            &shared.counters.cache_errors
        };
        counter.fetch_add(1, Ordering::Relaxed);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &[u8] = br#"{"choices":[{"finish_reason":"stop"}]}"#;

    fn json() -> HeaderValue {
        HeaderValue::from_static("application/json")
    }

    #[test]
    fn a_sealed_answer_opens_for_its_own_request_only() {
        let (d, other) = ([7u8; 32], [8u8; 32]);
        let ct = json();
        let sealed = seal(&d, (200, Some(&ct), BODY));
        let back = open(&d, &sealed, 1 << 20).unwrap();
        assert_eq!(back, (200, Some(json()), Bytes::from_static(BODY)));
        assert!(open(&other, &sealed, 1 << 20).is_none(), "moved under another request's key");
        assert!(open(&d, &sealed, 10).is_none(), "larger than the plugin keeps");
        assert!(open(&d, &seal(&d, (200, None, BODY)), 1 << 20).unwrap().1.is_none());
    }

    #[test]
    fn every_corruption_is_refused() {
        let d = [1u8; 32];
        let ct = json();
        let sealed = seal(&d, (200, Some(&ct), BODY));
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 0x40;
            assert!(open(&d, &bad, 1 << 20).is_none(), "a flipped byte at {i}");
        }
        for n in 0..sealed.len() {
            assert!(open(&d, &sealed[..n], 1 << 20).is_none(), "cut at {n}");
        }
        assert!(open(&d, b"garbage", 1 << 20).is_none());
        assert!(open(&d, &seal(&d, (500, Some(&ct), BODY)), 1 << 20).is_none(), "only successes");
    }
}
