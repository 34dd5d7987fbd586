//! The `response_guard` plugin as a decision holds it ([`Spec`], compiled with
//! the routing config), a request's armed guard ([`Armed`]: the spec and the
//! config it was routed by), and its judge of an answer's text by the
//! decision's jailbreak rules, on the embedding pool's threads.

use std::sync::Arc;

use model_select::{DecisionConfig, GuardAction, PiiDetector, PiiType, PluginConfig, StreamGuard};

use super::Routing;
use crate::Gateway;

/// A decision's `response_guard`, compiled.
#[derive(Debug)]
pub(crate) struct Spec {
    /// The decision's name (metrics).
    pub(crate) decision: String,
    pub(crate) action: GuardAction,
    /// PII types looked for (none: PII is not looked for).
    types: Vec<PiiType>,
    /// `signals.jailbreak` rules the text is judged by.
    jailbreak: Vec<String>,
    look_behind: usize,
    /// Bytes a rule judges at once (windows overlap by half).
    pub(crate) window: usize,
    pub(crate) max_answer_bytes: usize,
    pub(crate) status: u16,
    pub(crate) message: String,
}

/// A request's guard: the spec, and the routing config whose rules and detector judge it.
#[derive(Clone)]
pub(crate) struct Armed {
    pub(crate) spec: Arc<Spec>,
    pub(crate) routing: Arc<Routing>,
}

impl std::fmt::Debug for Armed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Armed").field("spec", &self.spec).finish_non_exhaustive()
    }
}

impl Spec {
    /// Decision `d`'s guard, if it has one.
    pub(crate) fn of(d: &DecisionConfig) -> Option<Arc<Spec>> {
        d.plugins.iter().find_map(|p| match p {
            PluginConfig::ResponseGuard(g) => Some(Arc::new(Spec {
                decision: d.name.clone(),
                action: g.action,
                types: if g.pii { model_select::redact_types(&g.pii_types) } else { Vec::new() },
                jailbreak: g.jailbreak.clone(),
                look_behind: g.look_behind_chars,
                window: g.window_chars,
                max_answer_bytes: g.max_answer_bytes,
                status: g.status,
                message: g.message.clone(),
            })),
            _ => None,
        })
    }

    /// The PII types looked for.
    pub(crate) fn types(&self) -> &[PiiType] {
        &self.types
    }

    /// Whether the text is judged by jailbreak rules.
    pub(crate) fn judges(&self) -> bool {
        !self.jailbreak.is_empty()
    }
}

impl Armed {
    /// A fresh reader of one streamed answer (redacting unless the guard only annotates or blocks).
    pub(crate) fn stream_guard(&self) -> StreamGuard {
        let redact = self.spec.action == GuardAction::Redact;
        StreamGuard::new(self.spec.types.clone(), self.spec.look_behind, redact)
    }

    /// The PII detector.
    pub(crate) fn detector(&self) -> &PiiDetector {
        self.routing.selector.detector()
    }

    /// The first of the guard's jailbreak rules that `text` matches, judged in windows of
    /// `window` bytes every half window (one embedding each, concurrently); `Err` when a window
    /// could not be embedded (no model, the pool full or slow).
    pub(crate) async fn jailbreak(&self, gw: &Gateway, text: &str) -> Result<Option<String>, String> {
        if self.spec.jailbreak.is_empty() || text.trim().is_empty() {
            return Ok(None);
        }
        let pool = gw.routing.as_ref().and_then(|s| s.embedder()).ok_or("the router has no embedding model")?;
        let mut pending = Vec::new();
        for w in windows(text, self.spec.window) {
            pending.push(pool.embed(w));
        }
        for v in futures_util::future::join_all(pending).await {
            let v = v.map_err(|e| e.to_string())?.embedded.vector;
            for rule in &self.spec.jailbreak {
                if self.routing.selector.jailbreak(rule, &v) == Some(true) {
                    return Ok(Some(rule.clone()));
                }
            }
        }
        Ok(None)
    }
}

/// `text` in windows of `window` bytes (on char boundaries) starting every half window; the
/// last ends with the text.
pub(crate) fn windows(text: &str, window: usize) -> Vec<&str> {
    let floor = |mut at: usize| {
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        at
    };
    let step = (window / 2).max(1);
    let mut out = Vec::new();
    let mut start = 0;
    loop {
        let end = floor((start + window).min(text.len()));
        out.push(&text[start..end.max(start)]);
        if end >= text.len() {
            return out;
        }
        let next = floor(start + step);
        start = if next > start { next } else { end };
    }
}

#[cfg(test)]
mod tests {
    use super::windows;

    #[test]
    fn windows_overlap_by_half_and_cover_the_text() {
        assert_eq!(windows("abcdefgh", 4), ["abcd", "cdef", "efgh"]);
        assert_eq!(windows("abc", 4), ["abc"]);
        assert_eq!(windows("abcdefghi", 4), ["abcd", "cdef", "efgh", "ghi"]);
        // Multi-byte characters are never split.
        let w = windows("ééééé", 3);
        assert!(w.iter().all(|w| !w.is_empty()) && w.concat().contains("ééé"), "{w:?}");
        assert_eq!(w.last().unwrap().chars().last(), Some('é'));
    }
}
