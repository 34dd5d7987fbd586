//! The answers of `response_cache` plugins: per decision, an LRU of complete,
//! successful answers bounded in entries and in bytes, keyed by a SHA-256
//! digest of who asks (the caller's identity), the route, the decision, the
//! pool, the stream flag and the canonical request (minus `model`), found
//! again exactly or, opted in, by the
//! last user turn's embedding with everything else identical (the vectors
//! of each partition, the request without its last user turn, kept apart
//! and scanned outside the lock). Owns the stores and what may be cached;
//! the relay records an answer as it passes (`relay`), and only a complete
//! 2xx answer is kept.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::HeaderValue;
use lru::LruCache;
use model_select::ResponseCache;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The response header saying what the cache did.
pub(crate) const CACHE_HEADER: &str = "x-route-cache";

/// One decision's answers.
#[derive(Debug)]
pub struct Store {
    config: ResponseCache,
    /// Its decision's name, and where stores are counted.
    decision: String,
    metrics: Arc<crate::metrics::RoutingMetrics>,
    entries: Mutex<Entries>,
}

/// The answers, and per partition the vectors of its semantic entries.
#[derive(Debug)]
struct Entries {
    lru: LruCache<u64, Entry>,
    /// Bytes the entries hold (answers, vectors, their bookkeeping), at most `max_bytes`.
    bytes: usize,
    max_bytes: usize,
    /// Partition → (entry key, its vector). Shared with lookups in progress, which scan a
    /// partition without the lock; a store copies it if one still holds it.
    partitions: HashMap<u64, Arc<Partition>>,
}

/// A partition's semantic entries: (entry key, its unit vector).
type Partition = Vec<(u64, Arc<[f32]>)>;

#[derive(Debug)]
struct Entry {
    /// The request's digest, compared on a hit (the map's key is its first 8 bytes).
    exact: Key,
    /// The digest of the request without its last user turn (semantic hits need it equal).
    partition: u64,
    /// What it holds, counted against the store's bytes.
    bytes: usize,
    /// The last user turn's embedding (semantic stores only).
    vector: Option<Arc<[f32]>>,
    answer: Arc<Answer>,
    until: Instant,
}

/// A stored answer.
#[derive(Debug)]
pub struct Answer {
    /// Its status (2xx).
    pub status: u16,
    /// Its content type, if it had one.
    pub content_type: Option<HeaderValue>,
    /// Its body, whole.
    pub body: Bytes,
}

/// A SHA-256 digest of a request as the cache sees it.
type Key = [u8; 32];

/// Bytes an entry is charged beyond its answer and vector: the digest, the map's and the
/// LRU's bookkeeping, the answer's and the entry's headers.
const ENTRY_OVERHEAD_BYTES: usize = 192;

/// Who asks and where: what the cache key holds besides the request itself.
#[derive(Debug, Clone, Copy)]
pub struct Asker<'a> {
    /// The caller's identity (a digest of its credentials), `None` for an anonymous caller.
    pub caller: Option<&'a [u8; 32]>,
    /// The route's path.
    pub route: &'a str,
    /// The decision.
    pub decision: &'a str,
    /// The pool's id.
    pub pool: &'a str,
    /// The replicas' shared answers (`--shared-state`), when on.
    pub shared: Option<&'a Arc<crate::shared::Shared>>,
}

/// A request the cache may answer or learn from.
#[derive(Debug)]
pub struct Ticket {
    store: Arc<Store>,
    /// Where the replicas' answers are (`--shared-state`).
    shared: Option<Arc<crate::shared::Shared>>,
    exact: Key,
    hash: u64,
    partition: u64,
    vector: Option<Arc<[f32]>>,
}

/// What a lookup found.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The same request.
    Exact(Arc<Answer>),
    /// A similar last user turn, everything else the same.
    Semantic(Arc<Answer>, f64),
    /// Nothing: the answer goes to a worker (and maybe into the cache).
    Miss,
}

/// Why a request was not looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Asks for several choices.
    Choices,
    /// Samples, and the plugin does not allow it.
    Sampling,
    /// `cache-control: no-cache` or `no-store`.
    Bypass,
}

impl Outcome {
    /// The stored answer of a hit.
    pub fn answer(&self) -> Option<&Arc<Answer>> {
        match self {
            Outcome::Exact(a) | Outcome::Semantic(a, _) => Some(a),
            Outcome::Miss => None,
        }
    }

    /// The `x-route-cache` value.
    pub fn header(&self) -> HeaderValue {
        match self {
            Outcome::Exact(_) => HeaderValue::from_static("hit-exact"),
            Outcome::Semantic(_, sim) => {
                HeaderValue::from_str(&format!("hit-semantic;sim={sim:.3}")).unwrap_or(HeaderValue::from_static("hit"))
            }
            Outcome::Miss => HeaderValue::from_static("miss"),
        }
    }
}

// === impl Store ===

impl Store {
    /// An empty store for `decision`'s `config`, counting into `metrics`.
    pub fn new(config: &ResponseCache, decision: &str, metrics: Arc<crate::metrics::RoutingMetrics>) -> Store {
        let cap = NonZeroUsize::new(config.max_entries).unwrap_or(NonZeroUsize::MIN);
        let entries =
            Entries { lru: LruCache::new(cap), bytes: 0, max_bytes: config.max_bytes, partitions: HashMap::new() };
        Store { config: config.clone(), decision: decision.to_owned(), metrics, entries: Mutex::new(entries) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Answers kept now.
    pub fn len(&self) -> usize {
        self.lock().lru.len()
    }

    /// Bytes its answers hold now.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Whether it keeps no answer.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ticket of the request `v` (after the plugins, `model` ignored) from `asker`, or why
    /// it is not cached. `vector` is the last user turn's embedding, for semantic stores.
    pub fn ticket(self: &Arc<Self>, v: &Value, asker: Asker<'_>, vector: Option<Arc<[f32]>>) -> Result<Ticket, Skip> {
        if v.get("n").and_then(Value::as_u64).is_some_and(|n| n > 1) {
            return Err(Skip::Choices);
        }
        let temperature = v.get("temperature").and_then(Value::as_f64);
        if !self.config.allow_sampling && temperature.is_none_or(|t| t > 0.0) {
            return Err(Skip::Sampling);
        }
        let stream = v.get("stream").and_then(Value::as_bool).unwrap_or(false);
        // Each part length-prefixed: no two askers' parts run into each other.
        let mut head = Sha256::new();
        for part in [asker.caller.map_or(&[][..], |c| &c[..]), asker.route.as_bytes(), asker.decision.as_bytes()] {
            head.update((part.len() as u64).to_le_bytes());
            head.update(part);
        }
        head.update((asker.pool.len() as u64).to_le_bytes());
        head.update(asker.pool.as_bytes());
        head.update([u8::from(stream)]);
        let model = |path: &[String]| path.len() == 1 && path[0] == "model";
        let mut exact = head.clone();
        canonical(v, &mut exact, &mut |path| model(path));
        let exact: Key = exact.finalize().into();
        // The rest is read only for a semantic store: the request but its last user turn, and
        // that turn's polarity (its negations and number words: "is X safe" and "is X not
        // safe" embed alike, so they are never in one partition, never each other's hit).
        let (partition, last) = if self.config.semantic {
            let last = model_select::user_turns(v).pop().unwrap_or_default();
            let mut rest = head;
            canonical(v, &mut rest, &mut |path| model(path) || is_last_user_content(v, path));
            let polarity = model_select::polarity(&last);
            rest.update((polarity.len() as u64).to_le_bytes());
            rest.update(&polarity);
            (first_u64(&rest.finalize().into()), last)
        } else {
            (0, String::new())
        };
        // A semantic hit stands for the same question asked otherwise: not when tools may be
        // called, nor when the question holds digits (2 + 3 and 2 + 4 embed alike).
        // (Read only when a vector came, and for a semantic store.)
        let semantic = |_: &Arc<[f32]>| {
            self.config.semantic
                && v.get("tools").and_then(Value::as_array).is_none_or(|t| t.is_empty())
                && !last.bytes().any(|b| b.is_ascii_digit())
        };
        let shared = asker.shared.cloned();
        Ok(Ticket {
            hash: first_u64(&exact),
            partition,
            exact,
            vector: vector.filter(semantic),
            store: self.clone(),
            shared,
        })
    }
}

/// A digest's first eight bytes, the maps' key.
fn first_u64(k: &Key) -> u64 {
    u64::from_le_bytes(k[..8].try_into().unwrap_or_default())
}

// === impl Entries ===

impl Entries {
    /// Keeps `entry` under `key`, in its partition's vectors too; what it replaces or pushes out
    /// (past the entries' or the bytes' bound, least recently used first) goes from both.
    fn put(&mut self, key: u64, entry: Entry) {
        self.remove(key);
        while self.bytes + entry.bytes > self.max_bytes
            && let Some((old_key, old)) = self.lru.pop_lru()
        {
            self.forget(old_key, &old);
        }
        let indexed = entry.vector.clone().map(|v| (entry.partition, v));
        self.bytes += entry.bytes;
        if let Some((old_key, old)) = self.lru.push(key, entry) {
            self.forget(old_key, &old);
        }
        if let Some((partition, v)) = indexed {
            Arc::make_mut(self.partitions.entry(partition).or_default()).push((key, v));
        }
    }

    /// Drops the entry under `key`.
    fn remove(&mut self, key: u64) {
        if let Some(old) = self.lru.pop(&key) {
            self.forget(key, &old);
        }
    }

    /// An entry out of the LRU: out of its partition and of the bytes held.
    fn forget(&mut self, key: u64, old: &Entry) {
        self.bytes -= old.bytes;
        if old.vector.is_none() {
            return;
        }
        if let Some(p) = self.partitions.get_mut(&old.partition) {
            let list = Arc::make_mut(p);
            if let Some(i) = list.iter().position(|(k, _)| *k == key) {
                list.swap_remove(i);
            }
            if list.is_empty() {
                self.partitions.remove(&old.partition);
            }
        }
    }
}

// === impl Ticket ===

impl Ticket {
    /// The cached answer for this request, if any (expired entries go).
    pub fn lookup(&self) -> Outcome {
        let now = Instant::now();
        let partition = {
            let mut entries = self.store.lock();
            match entries.lru.get(&self.hash) {
                Some(e) if e.until > now && e.exact == self.exact => return Outcome::Exact(e.answer.clone()),
                Some(e) if e.until <= now => entries.remove(self.hash),
                _ => {}
            }
            if self.vector.is_none() {
                return Outcome::Miss;
            }
            match entries.partitions.get(&self.partition) {
                Some(p) => p.clone(),
                None => return Outcome::Miss,
            }
        };
        let Some(v) = &self.vector else { return Outcome::Miss };
        // Outside the lock: every vector of the partition (unit vectors: the dot product is the cosine).
        let threshold = self.store.config.threshold;
        let mut hits: Vec<(u64, f64)> = partition
            .iter()
            .map(|(k, u)| (*k, model_select::cosine(v, u)))
            .filter(|(_, sim)| *sim >= threshold)
            .collect();
        drop(partition);
        if hits.is_empty() {
            return Outcome::Miss;
        }
        hits.sort_unstable_by(|a, b| b.1.total_cmp(&a.1));
        // The most similar that is still there and fresh.
        let mut entries = self.store.lock();
        for (k, sim) in hits {
            match entries.lru.get(&k) {
                Some(e) if e.until > now && e.partition == self.partition => {
                    return Outcome::Semantic(e.answer.clone(), sim);
                }
                Some(e) if e.until <= now => entries.remove(k),
                _ => {}
            }
        }
        Outcome::Miss
    }

    /// Largest answer kept.
    pub(crate) fn max_answer_bytes(&self) -> usize {
        self.store.config.max_answer_bytes
    }

    /// What another replica kept (`--shared-state`): the answer to this very request (kept
    /// here too, for this replica's next asker), else, for a semantic store, the answer to the
    /// most similar question of the same partition, if similar enough.
    pub(crate) async fn lookup_shared(&self) -> Option<Outcome> {
        let shared = self.shared.as_ref()?;
        let max = self.store.config.max_answer_bytes;
        if let Some((status, content_type, body)) = crate::shared::answers::lookup(shared, &self.exact, max).await {
            return self.keep(Answer { status, content_type, body }).map(Outcome::Exact);
        }
        let v = self.vector.as_ref()?;
        let threshold = self.store.config.threshold;
        let ((status, content_type, body), sim) =
            crate::shared::answers::lookup_similar(shared, self.partition, v, threshold, max).await?;
        let answer = Answer { status, content_type, body };
        successful(&answer).then(|| Outcome::Semantic(Arc::new(answer), sim))
    }

    /// Keeps a complete, successful answer: within `max_answer_bytes` and the store's bytes, no
    /// error object or event in it, and every choice finished. With `--shared-state` it is
    /// written through for the other replicas.
    pub fn store(self, answer: Answer) {
        let Some(kept) = self.keep(answer) else { return };
        let decision = crate::metrics::escape(&self.store.decision);
        self.store.metrics.cache_stores.inc(format_args!("decision=\"{decision}\""));
        if let Some(shared) = &self.shared {
            let ttl = Duration::from_secs(self.store.config.ttl_secs);
            let parts = (kept.status, kept.content_type.as_ref(), &kept.body[..]);
            crate::shared::answers::store(shared, &self.exact, parts, ttl);
            if let Some(v) = &self.vector {
                crate::shared::answers::store_vector(shared, self.partition, &self.exact, v, ttl);
            }
        }
    }

    /// Keeps `answer` in this replica's store, if it is worth keeping.
    fn keep(&self, answer: Answer) -> Option<Arc<Answer>> {
        let config = &self.store.config;
        if answer.body.len() > config.max_answer_bytes || !successful(&answer) {
            return None;
        }
        let vector_bytes = self.vector.as_ref().map_or(0, |v| v.len() * size_of::<f32>());
        let ct = answer.content_type.as_ref().map_or(0, |c| c.len());
        let bytes = answer.body.len() + vector_bytes + ct + ENTRY_OVERHEAD_BYTES;
        if bytes > config.max_bytes {
            return None;
        }
        let answer = Arc::new(answer);
        let entry = Entry {
            exact: self.exact,
            partition: self.partition,
            bytes,
            vector: self.vector.clone(),
            answer: answer.clone(),
            until: Instant::now() + Duration::from_secs(config.ttl_secs),
        };
        self.store.lock().put(self.hash, entry);
        Some(answer)
    }
}

/// Whether an answer is a complete success worth replaying: its JSON (or each event of its
/// stream) holds no `error`, and every choice ends with a finish reason (a native `/generate`
/// answer, its `meta_info.finish_reason`). Answers of other shapes need only be error-free.
fn successful(answer: &Answer) -> bool {
    let event_stream = answer.content_type.as_ref().is_some_and(|c| c.as_bytes().starts_with(b"text/event-stream"));
    if !event_stream {
        return serde_json::from_slice::<Value>(&answer.body).is_ok_and(|v| finished(&v) == Some(true));
    }
    let mut done = false;
    for line in answer.body.split(|&b| b == b'\n') {
        let Some(data) = line.strip_prefix(b"data:") else { continue };
        let data = data.trim_ascii();
        if data == b"[DONE]" {
            continue;
        }
        match serde_json::from_slice::<Value>(data).ok().map(|v| finished(&v)) {
            Some(Some(true)) => done = true,
            Some(Some(false)) | None => return false,
            Some(None) => {}
        }
    }
    done
}

/// Of one answer or event: `Some(false)` an error, `Some(true)` finished (or a shape without
/// choices), `None` a chunk still under way.
fn finished(v: &Value) -> Option<bool> {
    let Some(obj) = v.as_object() else { return Some(false) };
    if obj.get("error").is_some_and(|e| !e.is_null()) || obj.get("object").and_then(Value::as_str) == Some("error") {
        return Some(false);
    }
    let reason = |c: &Value| c.get("finish_reason").is_some_and(|r| !r.is_null());
    if let Some(choices) = obj.get("choices").and_then(Value::as_array) {
        return (!choices.is_empty() && choices.iter().all(reason)).then_some(true);
    }
    if let Some(meta) = obj.get("meta_info") {
        return reason(meta).then_some(true);
    }
    Some(true)
}

/// Whether `path` is the content of the request's last user message (or a completion's prompt).
fn is_last_user_content(v: &Value, path: &[String]) -> bool {
    let Some(messages) = v.get("messages").and_then(Value::as_array) else {
        return path.len() == 1 && path[0] == "prompt";
    };
    let last = messages.iter().rposition(|m| m.get("role").and_then(Value::as_str) == Some("user"));
    match (last, path) {
        (Some(i), [messages, index, content]) => {
            messages == "messages" && content == "content" && index.parse::<usize>().ok() == Some(i)
        }
        _ => false,
    }
}

/// Writes `v` as JSON with every object's keys sorted into a digest, leaving out the
/// members whose path (keys and array indices) `skip` accepts.
fn canonical(v: &Value, out: &mut Sha256, skip: &mut dyn FnMut(&[String]) -> bool) {
    fn walk(v: &Value, path: &mut Vec<String>, out: &mut Sha256, skip: &mut dyn FnMut(&[String]) -> bool) {
        match v {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.update(b"{");
                for k in keys {
                    path.push(k.clone());
                    if !skip(path) {
                        json(&Value::String(k.clone()), out);
                        out.update(b":");
                        walk(&map[k], path, out, skip);
                        out.update(b",");
                    }
                    path.pop();
                }
                out.update(b"}");
            }
            Value::Array(items) => {
                out.update(b"[");
                for (i, item) in items.iter().enumerate() {
                    path.push(i.to_string());
                    if !skip(path) {
                        walk(item, path, out, skip);
                    }
                    out.update(b",");
                    path.pop();
                }
                out.update(b"]");
            }
            other => json(other, out),
        }
    }
    walk(v, &mut Vec::new(), out, skip);
}

/// A scalar's JSON written into the digest as it is made (a long string never copied whole).
fn json(v: &Value, out: &mut Sha256) {
    struct Into<'a>(&'a mut Sha256);
    impl std::io::Write for Into<'_> {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.update(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    // Writing a `Value` into memory cannot fail.
    let _ = serde_json::to_writer(Into(out), v);
}

/// A worker's answer recorded as it passes to the client (a response-cache miss), kept once
/// it ended whole: one recorder for both relays.
#[derive(Debug)]
pub(crate) struct Recorder {
    ticket: Ticket,
    status: u16,
    content_type: Option<HeaderValue>,
    body: bytes::BytesMut,
}

impl Recorder {
    /// Records the answer with `status` and `content_type` for `ticket`: `None` unless it succeeded.
    pub(crate) fn new(ticket: Ticket, status: u16, content_type: Option<HeaderValue>) -> Option<Self> {
        (200..300).contains(&status).then(|| Recorder { ticket, status, content_type, body: bytes::BytesMut::new() })
    }

    /// Takes the next bytes of the body; false once it grew past what is kept (drop the recorder).
    pub(crate) fn push(&mut self, data: &[u8]) -> bool {
        if self.body.len() + data.len() > self.ticket.max_answer_bytes() {
            return false;
        }
        self.body.extend_from_slice(data);
        true
    }

    /// The answer ended whole: kept if it is a complete success.
    pub(crate) fn ended(self) {
        let Recorder { ticket, status, content_type, body } = self;
        ticket.store(Answer { status, content_type, body: body.freeze() });
    }
}

/// A request answered from the cache: the stored answer and the route headers.
#[derive(Debug)]
pub(crate) struct Hit {
    /// What was stored.
    pub(crate) answer: Arc<Answer>,
    /// `x-route-pool`, `x-route-decision`, `x-route-cache`...
    pub(crate) headers: crate::pipeline::request::RouteHeaders,
}

impl Hit {
    /// The answer as the axum front end sends it: the stored status, content
    /// type and body (an event stream is replayed as it came), and the route headers.
    pub(crate) fn into_response(self) -> axum::response::Response {
        let answer = self.answer;
        let mut r = axum::response::Response::new(axum::body::Body::from(answer.body.clone()));
        *r.status_mut() = axum::http::StatusCode::from_u16(answer.status).unwrap_or(axum::http::StatusCode::OK);
        if let Some(ct) = &answer.content_type {
            r.headers_mut().insert(axum::http::header::CONTENT_TYPE, ct.clone());
        }
        for (name, value) in self.headers.0 {
            r.headers_mut().insert(axum::http::HeaderName::from_static(name), value);
        }
        r
    }

    /// The answer as the fast path writes it: head (with `extra` header lines) and body.
    pub(crate) fn to_bytes(&self, close: bool, extra: &[u8]) -> Vec<u8> {
        let answer = &self.answer;
        let status = axum::http::StatusCode::from_u16(answer.status).unwrap_or(axum::http::StatusCode::OK);
        let mut out = format!(
            "HTTP/1.1 {} {}\r\ncontent-length: {}\r\n",
            status.as_u16(),
            status.canonical_reason().unwrap_or(""),
            answer.body.len()
        )
        .into_bytes();
        if let Some(ct) = &answer.content_type {
            crate::pipeline::request::push_header(&mut out, b"content-type", ct.as_bytes());
        }
        for (name, value) in &self.headers.0 {
            crate::pipeline::request::push_header(&mut out, name.as_bytes(), value.as_bytes());
        }
        if close {
            out.extend_from_slice(b"connection: close\r\n");
        }
        out.extend_from_slice(extra);
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&answer.body);
        out
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn store(semantic: bool) -> Arc<Store> {
        let config: ResponseCache =
            serde_json::from_value(json!({"semantic": semantic, "threshold": 0.9, "max_entries": 2})).unwrap();
        let metrics = Arc::new(crate::metrics::RoutingMetrics::new());
        Arc::new(Store::new(&config, "d", metrics))
    }

    fn chat(last: &str) -> Value {
        json!({"model": "a", "temperature": 0, "messages": [
            {"role": "user", "content": "first"}, {"role": "assistant", "content": "x"}, {"role": "user", "content": last}]})
    }

    /// A complete chat answer saying `content`.
    fn answer(content: &str) -> Answer {
        let body = json!({"choices": [{"index": 0, "message": {"content": content}, "finish_reason": "stop"}]});
        Answer { status: 200, content_type: None, body: Bytes::from(body.to_string()) }
    }

    fn text(a: &Answer) -> String {
        let v: Value = serde_json::from_slice(&a.body).unwrap();
        v["choices"][0]["message"]["content"].as_str().unwrap().to_owned()
    }

    fn at<'a>(decision: &'a str, pool: &'a str) -> Asker<'a> {
        Asker { caller: None, route: "/v1/chat/completions", decision, pool, shared: None }
    }

    fn unit(v: &[f32]) -> Option<Arc<[f32]>> {
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        Some(v.iter().map(|x| x / n).collect())
    }

    #[test]
    fn the_key_is_the_request_but_its_model_in_any_key_order() {
        let s = store(false);
        s.ticket(&chat("q"), at("d", "p"), None).unwrap().store(answer("A"));
        let reordered = json!({"messages": chat("q")["messages"], "temperature": 0, "model": "other"});
        assert!(
            matches!(s.ticket(&reordered, at("d", "p"), None).unwrap().lookup(), Outcome::Exact(a) if text(&a) == "A")
        );
        for (v, decision, pool) in [
            (chat("q2"), "d", "p"),
            (chat("q"), "e", "p"),
            (chat("q"), "d", "p2"),
            (json!({"temperature": 0, "stream": true, "messages": chat("q")["messages"]}), "d", "p"),
        ] {
            assert!(
                matches!(s.ticket(&v, at(decision, pool), None).unwrap().lookup(), Outcome::Miss),
                "{v} {decision} {pool}"
            );
        }
        // Bounded: the least recently used goes.
        s.ticket(&chat("b"), at("d", "p"), None).unwrap().store(answer("B"));
        s.ticket(&chat("c"), at("d", "p"), None).unwrap().store(answer("C"));
        assert_eq!(s.len(), 2);
        assert!(matches!(s.ticket(&chat("q"), at("d", "p"), None).unwrap().lookup(), Outcome::Miss));
    }

    #[test]
    fn what_is_not_cached() {
        let s = store(true);
        let mut n = chat("q");
        n["n"] = json!(2);
        assert_eq!(s.ticket(&n, at("d", "p"), None).err(), Some(Skip::Choices));
        let mut sampled = chat("q");
        sampled["temperature"] = json!(0.7);
        assert_eq!(s.ticket(&sampled, at("d", "p"), None).err(), Some(Skip::Sampling));
        sampled.as_object_mut().unwrap().remove("temperature");
        assert_eq!(s.ticket(&sampled, at("d", "p"), None).err(), Some(Skip::Sampling));
        use crate::pipeline::request::bypassed;
        assert!(bypassed([&b"max-age=0, No-Cache"[..]].into_iter()) && !bypassed([&b"max-age=0"[..]].into_iter()));
        // Digits in the question or tools offered: exact hits only (no vector kept).
        assert!(s.ticket(&chat("what is 2 + 3"), at("d", "p"), unit(&[1.0, 0.0])).unwrap().vector.is_none());
        let mut tools = chat("q");
        tools["tools"] = json!([{"type": "function"}]);
        assert!(s.ticket(&tools, at("d", "p"), unit(&[1.0, 0.0])).unwrap().vector.is_none());
        // Too large an answer is not kept.
        let big = answer(&"x".repeat(1 << 20));
        s.ticket(&chat("q"), at("d", "p"), None).unwrap().store(big);
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn what_leaves_the_cache_leaves_its_partition_and_is_never_a_semantic_hit() {
        let s = store(true);
        let indexed = |s: &Store| s.lock().partitions.values().map(|p| p.len()).sum::<usize>();
        // Bound 2: the first of three similar answers is pushed out.
        s.ticket(&chat("reset my password"), at("d", "p"), unit(&[1.0, 0.0])).unwrap().store(answer("A"));
        s.ticket(&chat("change my password"), at("d", "p"), unit(&[0.0, 1.0])).unwrap().store(answer("B"));
        s.ticket(&chat("update my password"), at("d", "p"), unit(&[0.0, 1.0])).unwrap().store(answer("C"));
        assert_eq!((s.len(), indexed(&s)), (2, 2));
        let near_a = s.ticket(&chat("restore my password"), at("d", "p"), unit(&[1.0, 0.05])).unwrap().lookup();
        assert!(matches!(near_a, Outcome::Miss), "A was pushed out: {near_a:?}");
        // The same request stored again replaces its vector, not adds one.
        s.ticket(&chat("update my password"), at("d", "p"), unit(&[0.0, 1.0])).unwrap().store(answer("C2"));
        assert_eq!((s.len(), indexed(&s)), (2, 2));
    }

    #[test]
    fn a_semantic_hit_needs_a_similar_last_turn_and_the_rest_identical() {
        let s = store(true);
        s.ticket(&chat("how do I reset my password"), at("d", "p"), unit(&[1.0, 0.0])).unwrap().store(answer("R"));
        let near = s.ticket(&chat("how can I reset my password"), at("d", "p"), unit(&[0.99, 0.1])).unwrap().lookup();
        assert!(matches!(&near, Outcome::Semantic(a, sim) if text(a) == "R" && *sim > 0.99), "{near:?}");
        assert!(near.header().to_str().unwrap().starts_with("hit-semantic;sim=0.99"));
        let far = s.ticket(&chat("what is my balance"), at("d", "p"), unit(&[0.5, 0.87])).unwrap().lookup();
        assert!(matches!(far, Outcome::Miss));
        // The same last turn after another first turn: the rest differs, no hit.
        let mut other = chat("how can I reset my password");
        other["messages"][0]["content"] = json!("something else");
        assert!(matches!(s.ticket(&other, at("d", "p"), unit(&[0.99, 0.1])).unwrap().lookup(), Outcome::Miss));
        // Without the plugin's opt-in, no semantic hits.
        let exact_only = store(false);
        exact_only.ticket(&chat("reset password"), at("d", "p"), unit(&[1.0, 0.0])).unwrap().store(answer("R"));
        let t = exact_only.ticket(&chat("reset my password"), at("d", "p"), unit(&[1.0, 0.0])).unwrap();
        assert!(matches!(t.lookup(), Outcome::Miss));
    }

    /// The polarity guard: a question that differs from a kept one only by a negation or a
    /// number word is never its semantic hit, however close their vectors; the same polarity
    /// in other words still is.
    #[test]
    fn a_negated_question_or_another_number_is_never_a_semantic_hit() {
        let s = store(true);
        let near = unit(&[0.999, 0.04]);
        s.ticket(&chat("is it safe to delete the cache folder"), at("d", "p"), unit(&[1.0, 0.0]))
            .unwrap()
            .store(answer("yes"));
        for asked in [
            "is it not safe to delete the cache folder",
            "isn't it safe to delete the cache folder",
            "is it never safe to delete the cache folder",
        ] {
            let found = s.ticket(&chat(asked), at("d", "p"), near.clone()).unwrap().lookup();
            assert!(matches!(found, Outcome::Miss), "{asked}: {found:?}");
        }
        let reworded = s.ticket(&chat("can I safely delete the cache folder"), at("d", "p"), near.clone()).unwrap();
        assert!(matches!(reworded.lookup(), Outcome::Semantic(a, _) if text(&a) == "yes"));
        s.ticket(&chat("name three prime numbers"), at("d", "p"), unit(&[0.0, 1.0])).unwrap().store(answer("2, 3, 5"));
        let four = s.ticket(&chat("name four prime numbers"), at("d", "p"), unit(&[0.04, 0.999])).unwrap();
        assert!(matches!(four.lookup(), Outcome::Miss));
        let same = s.ticket(&chat("list three prime numbers"), at("d", "p"), unit(&[0.04, 0.999])).unwrap();
        assert!(matches!(same.lookup(), Outcome::Semantic(a, _) if text(&a) == "2, 3, 5"));
    }

    #[test]
    fn callers_and_routes_never_share_an_answer() {
        let s = store(false);
        let (a, b) = ([1u8; 32], [2u8; 32]);
        let by = |caller: Option<&'static [u8; 32]>, route: &'static str| Asker { caller, route, ..at("d", "p") };
        let a: &'static [u8; 32] = Box::leak(Box::new(a));
        let b: &'static [u8; 32] = Box::leak(Box::new(b));
        s.ticket(&chat("q"), by(Some(a), "/v1/chat/completions"), None).unwrap().store(answer("for A"));
        let found = |asker| s.ticket(&chat("q"), asker, None).unwrap().lookup();
        assert!(matches!(found(by(Some(a), "/v1/chat/completions")), Outcome::Exact(x) if text(&x) == "for A"));
        assert!(matches!(found(by(Some(b), "/v1/chat/completions")), Outcome::Miss), "another caller");
        assert!(matches!(found(by(None, "/v1/chat/completions")), Outcome::Miss), "an anonymous caller");
        assert!(matches!(found(by(Some(a), "/v1/completions")), Outcome::Miss), "another route");
    }

    #[test]
    fn the_store_is_bounded_in_bytes_least_recently_used_out_first() {
        let config: ResponseCache = serde_json::from_value(json!({"max_bytes": 10_000})).unwrap();
        let s = Arc::new(Store::new(&config, "d", store(false).metrics.clone()));
        let long = |c: &str| answer(&format!("{c}{}", "x".repeat(3_000)));
        for q in ["a", "b", "c", "d"] {
            s.ticket(&chat(q), at("d", "p"), None).unwrap().store(long(q));
            assert!(s.bytes() <= 10_000, "{}", s.bytes());
        }
        assert_eq!(s.len(), 3, "three answers of about 3.2 KB fit in 10,000 bytes");
        assert!(matches!(s.ticket(&chat("a"), at("d", "p"), None).unwrap().lookup(), Outcome::Miss));
        assert!(matches!(s.ticket(&chat("d"), at("d", "p"), None).unwrap().lookup(), Outcome::Exact(_)));
        // An answer larger than the whole bound is not kept, and pushes nothing out.
        s.ticket(&chat("e"), at("d", "p"), None).unwrap().store(answer(&"y".repeat(20_000)));
        assert_eq!(s.len(), 3);
        // Stored again, an answer is charged once.
        let before = s.bytes();
        s.ticket(&chat("d"), at("d", "p"), None).unwrap().store(long("d"));
        assert_eq!(s.bytes(), before);
        // A 5 MB request is kept as its 32-byte digest: the store holds what the answers hold.
        let huge = chat(&"z".repeat(5 << 20));
        s.ticket(&huge, at("d", "p"), None).unwrap().store(answer("short"));
        assert!(s.bytes() <= 10_000);
    }

    #[test]
    fn only_complete_successful_answers_are_kept() {
        let s = store(false);
        let keep = |q: &str, content_type: Option<&'static str>, body: &str| {
            let answer = Answer {
                status: 200,
                content_type: content_type.map(HeaderValue::from_static),
                body: Bytes::from(body.to_owned()),
            };
            s.ticket(&chat(q), at("d", "p"), None).unwrap().store(answer);
            matches!(s.ticket(&chat(q), at("d", "p"), None).unwrap().lookup(), Outcome::Exact(_))
        };
        let sse = Some("text/event-stream");
        assert!(keep("1", None, r#"{"choices":[{"finish_reason":"stop","message":{"content":"hi"}}]}"#));
        assert!(!keep("2", None, r#"{"error":{"message":"overloaded","code":503}}"#), "an error object");
        assert!(!keep("3", None, r#"{"object":"error","message":"bad"}"#), "vLLM's error shape");
        assert!(!keep("4", None, r#"{"choices":[{"finish_reason":null,"message":{"content":"h"}}]}"#), "unfinished");
        assert!(!keep("5", None, r#"{"choices":[]}"#), "no choice");
        assert!(!keep("6", None, "not json"), "not JSON");
        assert!(keep("7", None, r#"{"text":"hi","meta_info":{"finish_reason":{"type":"stop"}}}"#), "native");
        assert!(!keep("8", None, r#"{"text":"hi","meta_info":{"finish_reason":null}}"#), "native, cut");
        let done = "data: {\"choices\":[{\"delta\":{\"content\":\"h\"},\"finish_reason\":null}]}\n\n\
                    data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
        assert!(keep("9", sse, done), "a finished stream");
        let errored = "data: {\"choices\":[{\"delta\":{\"content\":\"h\"},\"finish_reason\":null}]}\n\n\
                       data: {\"error\":{\"message\":\"engine died\"}}\n\ndata: [DONE]\n\n";
        assert!(!keep("10", sse, errored), "an error event");
        let cut = "data: {\"choices\":[{\"delta\":{\"content\":\"h\"},\"finish_reason\":null}]}\n\n";
        assert!(!keep("11", sse, cut), "no finish reason");
    }
}
