//! Conversation stickiness measured by the KV index: the pool that served a
//! conversation's last turn keeps it while its workers hold at least
//! `min_cached_tokens_to_stick` of the new prompt, unless the decision is not
//! sticky or does not list that pool, or the algorithm's choice wins by more
//! than re-prefilling the cached tokens costs. Owns the bounded table of
//! conversations (session key → pool); a preview reads it, never writes it.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use model_select::{Choice, Stickiness};
use router_types::PoolId;
use serde_json::{Value, json};

use super::choose::Chosen;
use super::{Pool, Routing};
use crate::Gateway;
use crate::pipeline::request::Route;

/// Where a session key came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeySource {
    /// The client's `x-session-id`.
    Header,
    /// A hash of the conversation's first messages.
    Fingerprint,
}

/// The conversations seen lately and the pool each was served by.
pub(crate) struct Sessions {
    config: Stickiness,
    table: Mutex<lru::LruCache<u64, (PoolId, Instant)>>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions").field("config", &self.config).finish()
    }
}

/// What stickiness did to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Not seen before (or forgotten): routed afresh.
    New,
    /// Routed afresh to the pool it was on.
    Same,
    /// Kept on its earlier pool, which the algorithm would have left.
    Stayed,
    /// Moved to another pool.
    Switched,
}

impl Outcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::New => "new",
            Outcome::Same => "same",
            Outcome::Stayed => "stayed",
            Outcome::Switched => "switched",
        }
    }
}

// === impl Sessions ===

impl Sessions {
    pub(crate) fn new(config: Stickiness) -> Self {
        let cap = NonZeroUsize::new(config.max_sessions).unwrap_or(NonZeroUsize::MIN);
        Sessions { config, table: Mutex::new(lru::LruCache::new(cap)) }
    }

    /// The pool that served `key` last, if it is remembered and fresh.
    fn previous(&self, key: u64) -> Option<PoolId> {
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let ttl = Duration::from_secs(self.config.ttl_secs);
        match t.peek(&key) {
            Some((pool, seen)) if seen.elapsed() <= ttl => Some(pool.clone()),
            Some(_) => {
                t.pop(&key);
                None
            }
            None => None,
        }
    }

    fn record(&self, key: u64, pool: PoolId) {
        self.table.lock().unwrap_or_else(|p| p.into_inner()).put(key, (pool, Instant::now()));
    }

    /// Conversations remembered now.
    pub(crate) fn len(&self) -> usize {
        self.table.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// The session key of a request: its `x-session-id`, else a hash of its
/// first system and first user message (the part of a conversation every
/// turn repeats). `None`: nothing to key by (no chat, no header).
pub(crate) fn key(session: Option<&[u8]>, v: &Value) -> Option<(u64, KeySource)> {
    use std::hash::{Hash, Hasher};
    // Fixed keys: every router replica fingerprints a conversation alike.
    let mut h = std::hash::DefaultHasher::new();
    if let Some(id) = session {
        (b"session", id).hash(&mut h);
        return Some((h.finish(), KeySource::Header));
    }
    let messages = v.get("messages")?.as_array()?;
    let first = |role: &str| messages.iter().find(|m| m.get("role").and_then(Value::as_str) == Some(role));
    let user = first("user")?;
    // The contents as JSON, written straight into the hasher (no copy of a long message).
    b"conversation".hash(&mut h);
    for content in [first("system").and_then(|m| m.get("content")), user.get("content")] {
        h.write_u8(u8::from(content.is_some()));
        if let Some(c) = content {
            let _ = serde_json::to_writer(HashWriter(&mut h), c);
        }
    }
    Some((h.finish(), KeySource::Fingerprint))
}

/// An `io::Write` into a hasher.
struct HashWriter<'a, H: std::hash::Hasher>(&'a mut H);

impl<H: std::hash::Hasher> std::io::Write for HashWriter<'_, H> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Applies stickiness to the algorithm's choice; returns the pool that
/// serves the request. With `preview`, nothing is remembered or counted and
/// the explain says what happened.
pub(crate) fn apply(
    gw: &Gateway,
    routing: &Routing,
    choice: &Choice<'_>,
    chosen: &Chosen,
    (route, v, ask): (Route, &Value, &super::Asked<'_>),
    key: Option<(u64, KeySource)>,
    preview: Option<&mut Value>,
) -> (usize, Outcome) {
    let (sessions, probe) = (&*routing.sessions, ask.probe);
    let Some((key, source)) = key.filter(|_| sessions.config.enabled) else { return (chosen.pool, Outcome::New) };
    // Remembered by id: a pool the config in force no longer lists is not kept to.
    let previous = sessions.previous(key);
    let at = previous.as_ref().map(|id| routing.pools.iter().position(|p| p.id == *id));
    let sticky = choice.decision.is_none_or(|d| d.sticky);
    let mut cached = None;
    let (pool, outcome) = match at {
        None => (chosen.pool, Outcome::New),
        Some(None) => (chosen.pool, Outcome::Switched),
        Some(Some(p)) if p == chosen.pool => (p, Outcome::Same),
        // Not this decision's to keep: it does not list the pool, or that pool cannot serve it now.
        Some(Some(_)) if !sticky => (chosen.pool, Outcome::Switched),
        Some(Some(p)) if !chosen.eligible.contains(&p) => (chosen.pool, Outcome::Switched),
        Some(Some(p)) => {
            let held = cached_tokens(gw, routing.pool(p), route, v, ask);
            cached = Some(held);
            let c = &sessions.config;
            let score = |pool: usize| chosen.scores.iter().find(|(q, _)| *q == pool).map(|(_, s)| *s);
            // The re-prefill cost in score points; without scores (static) nothing outweighs it.
            let gain = match (score(chosen.pool), score(p)) {
                (Some(new), Some(old)) => new - old,
                _ => 0.0,
            };
            let cost = held as f64 / c.reprefill_tokens_per_point as f64;
            if held >= c.min_cached_tokens_to_stick && gain <= cost {
                (p, Outcome::Stayed)
            } else {
                (chosen.pool, Outcome::Switched)
            }
        }
    };
    match preview {
        Some(out) => {
            *out = json!({
                "key": match source { KeySource::Header => "x-session-id", KeySource::Fingerprint => "fingerprint" },
                "previous_pool": previous.map(|p| p.0),
                "cached_tokens": cached,
                "outcome": outcome.as_str(),
            });
        }
        // A probe (`x-route-mode: probe`) leaves the table as it found it.
        None if probe => {}
        None => sessions.record(key, routing.pool(pool).id.clone()),
    }
    (pool, outcome)
}

/// The most prompt tokens any of `pool`'s workers holds, as the pool's own
/// plan measures it (its tokenizer, page size and index); never committed.
fn cached_tokens(gw: &Gateway, pool: &Arc<Pool>, route: Route, v: &Value, ask: &super::Asked<'_>) -> u64 {
    if gw.index.is_none() {
        return 0;
    }
    // As it would be sent there: the body names the pool's model (the namespace of its blocks).
    let mut v = v.clone();
    if let Some(fields) = v.as_object_mut() {
        fields.insert("model".into(), Value::String(pool.served_model.clone()));
    }
    match ask.planner.plan(pool, route, Some(&v), None, ask.renders, false) {
        Ok(plan) => plan.candidates.iter().map(|c| c.matched_tokens).max().unwrap_or(0),
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_from_the_header_or_the_first_messages() {
        let turn1 = json!({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q1"}]});
        let turn2 = json!({"messages": [
            {"role": "system", "content": "s"}, {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}
        ]});
        let other = json!({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "other"}]});
        let (k1, s1) = key(None, &turn1).unwrap();
        assert_eq!(s1, KeySource::Fingerprint);
        assert_eq!(key(None, &turn2).unwrap().0, k1, "every turn of a conversation has its key");
        assert_ne!(key(None, &other).unwrap().0, k1);
        let (h, s) = key(Some(b"abc"), &other).unwrap();
        assert_eq!(s, KeySource::Header);
        assert_eq!(key(Some(b"abc"), &turn1).unwrap().0, h);
        assert!(key(None, &json!({"prompt": "x"})).is_none());
    }

    #[test]
    fn the_table_is_bounded_and_forgets_stale_sessions() {
        let s = Sessions::new(Stickiness { max_sessions: 2, ..Stickiness::default() });
        let (a, b) = (PoolId("a".into()), PoolId("b".into()));
        s.record(1, a.clone());
        s.record(2, b.clone());
        s.record(3, b.clone());
        assert_eq!((s.len(), s.previous(1), s.previous(3)), (2, None, Some(b)));
        let stale = Sessions::new(Stickiness { ttl_secs: 0, ..Stickiness::default() });
        stale.record(1, a);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(stale.previous(1), None);
    }
}
