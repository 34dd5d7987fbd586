//! A dispatch's decision record, as Shepherd Model Gateway 1.13 gives it: in
//! the answer's `x-smg-cache-trace` header when the request asks for it
//! (`x-smg-cache-trace: 1`) or for every answer (`--cache-trace-header`,
//! `SMG_CACHE_TRACE_HEADER=1`), and as an INFO line (target
//! `smg::cache_trace`) for one dispatch in `--cache-trace-sample`
//! (`--cache-trace`, `SMG_CACHE_TRACE=1`). The header keeps the join fields
//! and the selections' predictions (no candidates, loads or gates) within
//! 2 KiB of ASCII, else it is left out; the line has the candidates too, up
//! to 32, compacted past `--cache-trace-max-bytes`. Predictions are what the
//! router's index or text tree said the worker holds, not the engine's own
//! cache hits. Owns the log sampler's count.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::HeaderValue;
use fleet::Worker;
use planner::Plan;
use policy::Reason;
use serde_json::{Value, json};

/// The header a request asks with and its answer carries the record in.
pub(crate) const HEADER: &str = h1_codec::CACHE_TRACE_HEADER;
/// Longest header kept (SMG's): a longer record goes to the log only.
const MAX_HEADER_BYTES: usize = 2048;
/// Selections and candidates kept per request (SMG's bounds).
const MAX_SELECTIONS: usize = 16;
const MAX_CANDIDATES: usize = 32;

/// Who gets a dispatch's record (`--cache-trace*`; all off: only the requests that ask).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheTraceConfig {
    /// Every answer carries the header (`--cache-trace-header`).
    pub header: bool,
    /// The INFO line (`--cache-trace`).
    pub log: bool,
    /// One line in this many dispatches (at least 1).
    pub sample: u64,
    /// A longer line drops its candidate lists (`None`: no cap).
    pub max_bytes: Option<usize>,
}

impl CacheTraceConfig {
    /// Whether a dispatch keeps a record: the request asked (or every answer carries one), or
    /// the log takes it.
    pub(crate) fn wanted(&self, asked: bool) -> bool {
        asked || self.log
    }
}

impl Default for CacheTraceConfig {
    fn default() -> Self {
        Self { header: false, log: false, sample: 1, max_bytes: None }
    }
}

/// Whether a request's `x-smg-cache-trace` value asks for its record.
pub(crate) fn asks(value: &[u8]) -> bool {
    value.trim_ascii() == b"1"
}

/// The record of one request's selections, kept while it is dispatched.
#[derive(Debug)]
pub(crate) struct Record {
    policy: &'static str,
    selections: Vec<Value>,
    /// The first selection's candidates (for the log line).
    candidates: Vec<Value>,
    candidates_complete: bool,
    truncated: bool,
}

impl Record {
    /// The plan's selection: the policy's choice and what the index said of each candidate.
    pub(crate) fn of(plan: &Plan) -> Self {
        let candidates = plan
            .candidates
            .iter()
            .zip(&plan.workers)
            .take(MAX_CANDIDATES)
            .map(|(c, w)| {
                json!({"worker": w.url, "load": c.load.in_flight, "matched_tokens": c.matched_tokens,
                    "followed": c.followed, "healthy": true})
            })
            .collect();
        let mut record = Record {
            policy: plan.pool.policy.name(),
            selections: Vec::new(),
            candidates,
            candidates_complete: plan.candidates.len() <= MAX_CANDIDATES,
            truncated: false,
        };
        record.add(plan, "policy", true);
        record
    }

    /// Another plan's selection (a disaggregated pair's decode, a retry's new pair), `origin`
    /// naming why it was made; `prefix`: the plan matched the prompt (a decode leg's does not,
    /// so it has no prediction).
    pub(crate) fn add(&mut self, plan: &Plan, origin: &str, prefix: bool) {
        let origin = if plan.decision.reason == Reason::RoutingKey { "sticky" } else { origin };
        let prediction = if prefix { prediction(plan, plan.chosen) } else { Value::Null };
        self.push(plan.pool.policy.name(), origin, plan.chosen(), prediction);
    }

    /// A retry's worker (the next after a failed attempt), with what the index said it holds.
    pub(crate) fn retried(&mut self, plan: &Plan, worker: &Worker) {
        let at = plan.workers.iter().position(|w| w.id == worker.id);
        self.push(self.policy, "retry", worker, at.map_or(Value::Null, |i| prediction(plan, i)));
    }

    /// One selection, within [`MAX_SELECTIONS`] (past it the record says it was truncated).
    fn push(&mut self, policy: &str, origin: &str, worker: &Worker, prediction: Value) {
        if self.selections.len() >= MAX_SELECTIONS {
            self.truncated = true;
            return;
        }
        self.selections
            .push(json!({"policy": policy, "origin": origin, "worker": worker.url, "prediction": prediction}));
    }

    /// The dispatch that answered: attempt `attempt` to `engines` (`mode`: `http`, `grpc`).
    /// Logs the line when `--cache-trace` is on and the sampler takes it; returns the header
    /// when the request asked for it (or every answer carries it) and it fits.
    pub(crate) fn dispatched(
        self,
        config: &CacheTraceConfig,
        (root_id, asked): (&str, bool),
        attempt: u32,
        (engines, mode): (&[&str], &str),
    ) -> Option<HeaderValue> {
        let header = (asked || config.header).then(|| {
            let v = json!({"schema": 1, "root_id": root_id, "dispatch_id": uuid_v7(), "attempt": attempt,
                "engine_ids": engines, "engine_ids_complete": true,
                "selections": self.selections, "truncated": self.truncated});
            let text = v.to_string();
            (text.len() <= MAX_HEADER_BYTES && text.is_ascii()).then_some(text)
        });
        if config.log && sampled(config.sample) {
            let mut selections = self.selections;
            if let Some(first) = selections.first_mut() {
                first["candidates"] = Value::Array(self.candidates);
                first["candidates_complete"] = json!(self.candidates_complete);
            }
            let mut v = json!({"schema": 1, "router_epoch": epoch(), "dispatch_timestamp_ns": now_ns(),
                "root_id": root_id, "dispatch_id": uuid_v7(), "attempt": attempt, "engine_ids": engines,
                "mode": mode, "engine_ids_complete": true, "selections": selections,
                "truncated": self.truncated, "cache_evidence": "unknown"});
            let mut line = v.to_string();
            if config.max_bytes.is_some_and(|cap| line.len() > cap) {
                compact(&mut v);
                line = v.to_string();
            }
            tracing::info!(target: "smg::cache_trace", evidence = %line, "Cache routing dispatch");
        }
        match header {
            Some(Some(text)) => HeaderValue::from_str(&text).ok(),
            Some(None) => {
                tracing::debug!(target: "smg::cache_trace", "Cache trace header omitted: size or encoding limit");
                None
            }
            None => None,
        }
    }
}

/// What the router predicted candidate `at` holds, and where the prediction came from.
fn prediction(plan: &Plan, at: usize) -> Value {
    let (c, reason) = (&plan.candidates[at], plan.decision.reason);
    let source = match reason {
        _ if c.followed && c.matched_tokens > 0 => "event_index",
        Reason::TextTreeHit | Reason::TreeMatch => "approximate_tree",
        _ if c.followed => "event_index",
        _ => "none",
    };
    json!({"source": source, "matched_tokens": c.matched_tokens, "input_tokens": plan.input_tokens,
        "reason": reason.as_str()})
}

/// Whether this dispatch's line is logged: one in every `every`.
fn sampled(every: u64) -> bool {
    static DISPATCHES: AtomicU64 = AtomicU64::new(0);
    every <= 1 || DISPATCHES.fetch_add(1, Ordering::Relaxed).is_multiple_of(every)
}

/// Drops the lists that grow with the fleet, keeping the decision record.
fn compact(v: &mut Value) {
    if let Some(selections) = v.get_mut("selections").and_then(Value::as_array_mut) {
        for s in selections.iter_mut().filter_map(Value::as_object_mut) {
            if let Some(dropped) = s.remove("candidates") {
                s.insert("elided".into(), json!({"candidates": dropped.as_array().map_or(0, Vec::len)}));
            }
        }
    }
    v["capped"] = json!(true);
}

/// This process's id in the log lines.
fn epoch() -> &'static str {
    static EPOCH: OnceLock<String> = OnceLock::new();
    EPOCH.get_or_init(uuid_v7)
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// A time-ordered random id (RFC 9562 version 7): the milliseconds since the epoch, then random bits.
fn uuid_v7() -> String {
    let ms = now_ns() / 1_000_000;
    let (a, b) = (crate::random_u64(), crate::random_u64());
    let hi = (ms << 16) | 0x7000 | (a & 0x0fff);
    let lo = (b & 0x3fff_ffff_ffff_ffff) | 0x8000_0000_0000_0000;
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_version_7_and_time_ordered() {
        let (a, b) = (uuid_v7(), uuid_v7());
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "7", "{a}");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "the RFC variant: {a}");
        assert!(a[..8] <= b[..8], "{a} {b}");
        assert_ne!(a, b);
    }

    #[test]
    fn only_1_asks_and_the_sampler_takes_one_in_n() {
        assert!(asks(b"1") && asks(b" 1 "));
        assert!(!asks(b"0") && !asks(b"true") && !asks(b""));
        let taken = (0..30).filter(|_| sampled(3)).count();
        assert!((9..=11).contains(&taken), "{taken}");
    }

    #[test]
    fn a_capped_line_keeps_the_decision_and_counts_what_it_dropped() {
        let mut v = json!({"selections": [{"policy": "cache_aware", "worker": "http://w:1",
            "candidates": [{"worker": "a"}, {"worker": "b"}]}]});
        compact(&mut v);
        assert_eq!(v["selections"][0]["worker"], "http://w:1");
        assert_eq!(v["selections"][0]["elided"]["candidates"], 2);
        assert!(v["selections"][0].get("candidates").is_none());
        assert_eq!(v["capped"], true);
    }
}
