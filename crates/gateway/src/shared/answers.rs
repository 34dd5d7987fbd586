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

/// The backend's key of the request whose digest is `digest`.
fn key_of(shared: &Shared, digest: &[u8; 32]) -> Vec<u8> {
    shared.key("answer", &hex(digest))
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
    match shared.backend.cmd(&[b"GET", &key_of(shared, digest)]).await {
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
/// and not at all with the backend out of reach or too many writes under way (counted).
pub(crate) fn store(
    shared: &Arc<Shared>,
    digest: &[u8; 32],
    answer: (u16, Option<&HeaderValue>, &[u8]),
    ttl: Duration,
) {
    let args = vec![b"SET".to_vec(), key_of(shared, digest), seal(digest, answer), b"PX".to_vec(), super::ttl_ms(ttl)];
    let done = |c: &super::Counters, ok: bool| {
        let counter = if ok { &c.cache_stores } else { &c.cache_errors };
        counter.fetch_add(1, Ordering::Relaxed);
    };
    if !shared.write_behind(args, |r| matches!(r, Reply::Simple(_)), done) {
        shared.counters.cache_errors.fetch_add(1, Ordering::Relaxed);
    }
}

/// Vectors of one partition kept in the backend at most (a store past it drops one at random).
const MAX_PARTITION_VECTORS: usize = 256;
/// Longest vector read back (an embedding of up to 4,096 dimensions).
const MAX_DIMENSIONS: usize = 4096;

/// KEYS[1]: the partition's hash. ARGV: the entry's digest (hex), its vector, the TTL (ms), the
/// cap. One field per entry; past the cap a random other one goes.
const KEEP_VECTOR: &str = r"
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if redis.call('HLEN', KEYS[1]) > tonumber(ARGV[4]) then
  local f = redis.call('HRANDFIELD', KEYS[1])
  if f and f ~= ARGV[1] then redis.call('HDEL', KEYS[1], f) end
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &[u8]) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in text.chunks_exact(2).enumerate() {
        out[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

/// A vector read back, as a unit vector; `None` for one of another size, or not finite or zero.
fn unit_vector(bytes: &[u8], dimensions: usize) -> Option<Vec<f32>> {
    if bytes.len() != dimensions * 4 || dimensions == 0 || dimensions > MAX_DIMENSIONS {
        return None;
    }
    let v: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let norm = v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
    (norm.is_finite() && norm > 0.0).then(|| v.iter().map(|x| (f64::from(*x) / norm) as f32).collect())
}

/// Keeps the semantic entry `digest`'s `vector` among its partition's in the backend (its
/// answer is written by [`store`]), so another replica's semantic lookup finds it; in the
/// background, bounded as [`store`] is.
pub(crate) fn store_vector(shared: &Arc<Shared>, partition: u64, digest: &[u8; 32], vector: &[f32], ttl: Duration) {
    let key = shared.key("semantic", &format!("{partition:016x}"));
    let value: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
    let (field, cap) = (hex(digest).into_bytes(), MAX_PARTITION_VECTORS.to_string().into_bytes());
    let args = vec![b"EVAL".to_vec(), KEEP_VECTOR.into(), b"1".to_vec(), key, field, value, super::ttl_ms(ttl), cap];
    let done = |c: &super::Counters, ok: bool| {
        if !ok {
            c.cache_errors.fetch_add(1, Ordering::Relaxed);
        }
    };
    if !shared.write_behind(args, |r| matches!(r, Reply::Int(1)), done) {
        shared.counters.cache_errors.fetch_add(1, Ordering::Relaxed);
    }
}

/// The answer of the most similar question another replica kept in `partition` (everything
/// but the last user turn the same), if one is at least `threshold` similar to `vector`: its
/// parts and the similarity. Two round trips (the partition's vectors, then the answer).
pub(crate) async fn lookup_similar(
    shared: &Shared,
    partition: u64,
    vector: &[f32],
    threshold: f64,
    max_body: usize,
) -> Option<(Parts, f64)> {
    if !shared.is_up() {
        return None;
    }
    let key = shared.key("semantic", &format!("{partition:016x}"));
    let fields = match shared.backend.cmd(&[b"HGETALL", &key]).await {
        Ok(Reply::Array(fields)) => fields,
        _ => {
            shared.counters.cache_errors.fetch_add(1, Ordering::Relaxed);
            return None;
        }
    };
    let best = fields
        .chunks_exact(2)
        .take(MAX_PARTITION_VECTORS * 2)
        .filter_map(|pair| {
            let digest = unhex(pair[0].as_bytes()?)?;
            let u = unit_vector(pair[1].as_bytes()?, vector.len())?;
            Some((digest, model_select::cosine(vector, &u)))
        })
        .filter(|(_, sim)| *sim >= threshold)
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    let c = &shared.counters;
    match shared.backend.cmd(&[b"GET", &key_of(shared, &best.0)]).await {
        Ok(Reply::Bulk(bytes)) => {
            let parts = open(&best.0, &bytes, max_body);
            let counter = if parts.is_some() { &c.cache_semantic_hits } else { &c.cache_corrupt };
            counter.fetch_add(1, Ordering::Relaxed);
            parts.map(|p| (p, best.1))
        }
        // Its answer expired first (or was pushed out): a miss.
        _ => None,
    }
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

    /// A replica sharing state through `url`.
    async fn replica(url: &str) -> Arc<Shared> {
        let fleet = fleet::Fleet::start(
            fleet::FleetConfig::unprobed(&[]),
            None,
            &[],
            tokio_util::sync::CancellationToken::new(),
        );
        let (target, options) = (shared_state::Target::parse(url).unwrap(), Default::default());
        let shared = Shared::start(super::super::SharedConfig { target, options, prefix: "t".into() }, fleet, None);
        assert!(shared.backend.wait_up(Duration::from_secs(10)).await);
        shared
    }

    fn unit(v: &[f32]) -> Vec<f32> {
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter().map(|x| x / n).collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn another_replicas_semantic_entry_is_found_by_its_partition_and_similarity() {
        let Ok(redis) = shared_state::testing::RedisServer::start() else {
            assert!(std::env::var_os("CI").is_none(), "redis-server is needed under CI");
            return;
        };
        let (a, b) = (replica(&redis.url()).await, replica(&redis.url()).await);
        let (digest, partition, ttl) = ([3u8; 32], 0xabcdu64, Duration::from_secs(60));
        let ct = json();
        store(&a, &digest, (200, Some(&ct), BODY), ttl);
        store_vector(&a, partition, &digest, &unit(&[1.0, 0.2, 0.0, 0.1]), ttl);
        for _ in 0..400 {
            if a.counters.writes.load(Ordering::Relaxed) == 0 && a.counters.cache_stores.load(Ordering::Relaxed) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        // A similar question in the same partition: the kept answer, with its similarity.
        let (parts, sim) = lookup_similar(&b, partition, &unit(&[1.0, 0.25, 0.0, 0.1]), 0.95, 1 << 20).await.unwrap();
        assert_eq!(parts, (200, Some(json()), Bytes::from_static(BODY)));
        assert!(sim > 0.99 && sim <= 1.0 + 1e-6, "{sim}");
        assert_eq!(b.counters.cache_semantic_hits.load(Ordering::Relaxed), 1);
        // Not a dissimilar one, nor one of another partition, nor one of another size.
        assert!(lookup_similar(&b, partition, &unit(&[0.0, 0.0, 1.0, 0.0]), 0.95, 1 << 20).await.is_none());
        assert!(lookup_similar(&b, 0x1234, &unit(&[1.0, 0.2, 0.0, 0.1]), 0.95, 1 << 20).await.is_none());
        assert!(lookup_similar(&b, partition, &unit(&[1.0, 0.2, 0.0]), 0.5, 1 << 20).await.is_none());
        // Its answer gone (expired, pushed out): a miss, not an error.
        b.backend.cmd(&[b"DEL", &key_of(&b, &digest)]).await.unwrap();
        assert!(lookup_similar(&b, partition, &unit(&[1.0, 0.2, 0.0, 0.1]), 0.95, 1 << 20).await.is_none());
    }

    #[test]
    fn vectors_read_back_are_checked_and_made_unit() {
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let u = unit_vector(&bytes(&[3.0, 4.0]), 2).unwrap();
        assert!((u[0] - 0.6).abs() < 1e-6 && (u[1] - 0.8).abs() < 1e-6);
        assert!(unit_vector(&bytes(&[3.0, 4.0]), 3).is_none(), "another size");
        assert!(unit_vector(&bytes(&[0.0, 0.0]), 2).is_none(), "zero");
        assert!(unit_vector(&bytes(&[f32::NAN, 1.0]), 2).is_none(), "not finite");
        assert!(unit_vector(b"abc", 1).is_none());
        assert_eq!(unhex(hex(&[7u8; 32]).as_bytes()), Some([7u8; 32]));
        assert!(unhex(b"zz").is_none() && unhex(&[b'g'; 64]).is_none());
    }

    #[tokio::test]
    async fn writes_skipped_while_the_backend_is_out_of_reach_leave_the_bound_intact() {
        let fleet = fleet::Fleet::start(
            fleet::FleetConfig::unprobed(&[]),
            None,
            &[],
            tokio_util::sync::CancellationToken::new(),
        );
        // Nothing listens on port 1: the backend is never up.
        let target = shared_state::Target::parse("redis://127.0.0.1:1").unwrap();
        let s = Shared::start(
            super::super::SharedConfig { target, options: Default::default(), prefix: "t".into() },
            fleet,
            None,
        );
        for _ in 0..3 {
            store(&s, &[1u8; 32], (200, None, BODY), Duration::from_secs(1));
        }
        assert_eq!(s.counters.writes.load(Ordering::Relaxed), 0, "nothing under way, nothing owed back");
        assert_eq!(s.counters.cache_errors.load(Ordering::Relaxed), 3);
    }
}
