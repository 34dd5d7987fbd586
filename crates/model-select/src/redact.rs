//! The `pii_redact` plugin on an OpenAI-style body: every text the model
//! will read has its PII replaced by numbered placeholders. For a chat, every
//! message of every role (system, developer, user, assistant, tool): its
//! content (a string, strings, or the `text` and `refusal` parts of a list),
//! its `name`, `refusal` and `reasoning_content`, and its tool calls'
//! arguments (legacy `function_call` too); for Anthropic's Messages API also
//! its `system` and the texts inside its blocks (thinking, a tool call's
//! input, tool and search results); for a completion its `prompt` (a
//! string or strings) and `suffix`; for `/generate` its `text`. Whether the
//! plugin runs is the caller's (a decision's plugins); what counts as PII is
//! [`PiiDetector`]'s.

use std::collections::HashMap;

use serde_json::Value;

use crate::normalize::Normalized;
use crate::pii::{PiiDetector, PiiType};

/// What a redaction replaced: how many values of each type (never the values).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Redactions {
    /// Values replaced, by type, in type order.
    pub counts: Vec<(PiiType, usize)>,
}

/// One redaction in progress: the detector, the types, the placeholders given so far.
struct Redactor<'d> {
    detector: &'d PiiDetector,
    types: &'d [PiiType],
    numbers: Placeholders,
}

/// The placeholders one body or answer gave: one value, one placeholder, however it was
/// written (`a&#64;b.io` is `a@b.io`), numbered per type in order of appearance; and how
/// many values of each type were replaced. The values live only as long as it does.
#[derive(Debug, Clone, Default)]
pub struct Placeholders {
    /// (type, normalized value) → its number.
    seen: HashMap<(PiiType, String), usize>,
    next: HashMap<PiiType, usize>,
    replaced: HashMap<PiiType, usize>,
}

/// Replaces every finding of `types` in every text of the body listed in
/// this module's docs with a placeholder `[EMAIL_1]`, `[PHONE_2]`...:
/// numbered per type in order of appearance, one value keeping one
/// placeholder across the request. The values stay in this function's
/// memory only.
pub fn redact(body: &mut Value, detector: &PiiDetector, types: &[PiiType]) -> Redactions {
    let mut r = Redactor { detector, types, numbers: Placeholders::default() };
    if body.get("messages").is_some_and(Value::is_array) {
        // Anthropic's Messages API: its system prompt first, beside the messages.
        if let Some(system) = body.get_mut("system") {
            r.content(system);
        }
        if let Some(Value::Array(messages)) = body.get_mut("messages") {
            messages.iter_mut().for_each(|m| r.message(m));
        }
    } else {
        for key in ["prompt", "suffix", "text"] {
            if let Some(v) = body.get_mut(key) {
                r.content(v);
            }
        }
    }
    r.numbers.redactions()
}

/// [`redact`] on an answer: a chat's (every choice's message: its content, reasoning and tool
/// calls), a completion's (every choice's `text`), Anthropic's (its `content` blocks) or
/// `/generate`'s (its `text`, or each item's in a list).
pub fn redact_answer(answer: &mut Value, detector: &PiiDetector, types: &[PiiType]) -> Redactions {
    let mut r = Redactor { detector, types, numbers: Placeholders::default() };
    let one = |r: &mut Redactor<'_>, item: &mut Value| {
        if let Some(Value::Array(choices)) = item.get_mut("choices") {
            for choice in choices {
                if let Some(m) = choice.get_mut("message") {
                    r.message(m);
                }
                if let Some(Value::String(s)) = choice.get_mut("text") {
                    r.text(s);
                }
            }
        } else if let Some(content) = item.get_mut("content").filter(|c| c.is_array()) {
            r.content(content);
        } else if let Some(Value::String(s)) = item.get_mut("text") {
            r.text(s);
        }
    };
    match answer {
        Value::Array(items) => items.iter_mut().for_each(|item| one(&mut r, item)),
        item => one(&mut r, item),
    }
    r.numbers.redactions()
}

/// The texts [`redact_answer`] reads of an answer (message contents and text blocks,
/// reasoning, texts), one per line: what a `response_guard` judges by its jailbreak rules.
pub fn answer_text(answer: &Value) -> String {
    let mut out = String::new();
    let mut add = |s: &str| {
        if !s.is_empty() {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(s);
        }
    };
    let items = match answer {
        Value::Array(items) => items.as_slice(),
        item => std::slice::from_ref(item),
    };
    for item in items {
        for choice in item.get("choices").and_then(Value::as_array).into_iter().flatten() {
            for key in ["/message/reasoning_content", "/message/content", "/text"] {
                choice.pointer(key).and_then(Value::as_str).map(&mut add);
            }
        }
        for block in item.get("content").and_then(Value::as_array).into_iter().flatten() {
            for key in ["thinking", "text"] {
                block.get(key).and_then(Value::as_str).map(&mut add);
            }
        }
        if item.get("choices").is_none() {
            item.get("text").and_then(Value::as_str).map(&mut add);
        }
    }
    out
}

// === impl Placeholders ===

impl Placeholders {
    /// The placeholder of `value` (as written) of type `kind`, counted as one replacement.
    pub fn of(&mut self, kind: PiiType, value: &str) -> String {
        let key = (kind, Normalized::new(value).as_str().to_owned());
        let n = *self.seen.entry(key).or_insert_with(|| {
            let n = self.next.entry(kind).or_insert(0);
            *n += 1;
            *n
        });
        *self.replaced.entry(kind).or_insert(0) += 1;
        format!("[{}_{n}]", kind.as_str().to_ascii_uppercase())
    }

    /// The values replaced so far, by type.
    pub fn redactions(&self) -> Redactions {
        let mut counts: Vec<(PiiType, usize)> = self.replaced.iter().map(|(k, n)| (*k, *n)).collect();
        counts.sort();
        Redactions { counts }
    }
}

// === impl Redactions ===

impl Redactions {
    /// Values replaced in all.
    pub fn total(&self) -> usize {
        self.counts.iter().map(|(_, n)| n).sum()
    }
}

// === impl Redactor ===

impl Redactor<'_> {
    /// One chat message, whatever its role.
    fn message(&mut self, m: &mut Value) {
        let Some(m) = m.as_object_mut() else { return };
        if let Some(content) = m.get_mut("content") {
            self.content(content);
        }
        for key in ["name", "refusal", "reasoning_content"] {
            if let Some(Value::String(s)) = m.get_mut(key) {
                self.text(s);
            }
        }
        if let Some(Value::Array(calls)) = m.get_mut("tool_calls") {
            for call in calls {
                if let Some(arguments) = call.pointer_mut("/function/arguments") {
                    self.arguments(arguments);
                }
            }
        }
        if let Some(arguments) = m.get_mut("function_call").and_then(|f| f.get_mut("arguments")) {
            self.arguments(arguments);
        }
    }

    /// A content value: a string, a list of strings, or a list of parts (their `text`,
    /// `refusal` or `thinking`; Anthropic's `tool_use` input values and the `content` of its
    /// `tool_result` and `search_result` blocks; other parts, images, hold no text).
    fn content(&mut self, v: &mut Value) {
        match v {
            Value::String(s) => {
                self.text(s);
            }
            Value::Array(items) => {
                for item in items {
                    match item {
                        Value::String(s) => {
                            self.text(s);
                        }
                        Value::Object(part) => {
                            for key in ["text", "refusal", "thinking"] {
                                if let Some(Value::String(s)) = part.get_mut(key) {
                                    self.text(s);
                                }
                            }
                            // Anthropic's blocks: a tool call's input, a tool's or search's result.
                            if let Some(input) = part.get_mut("input").filter(|i| i.is_object()) {
                                self.values(input);
                            }
                            if let Some(content) = part.get_mut("content") {
                                self.content(content);
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }

    /// Tool-call arguments: a string of JSON is parsed and its values
    /// redacted (an escaped `\u0040` is an `@` there), then written again
    /// only if a value changed; a string that is no JSON is redacted as
    /// text; arguments given as an object have their values redacted.
    fn arguments(&mut self, v: &mut Value) {
        match v {
            Value::String(s) => match serde_json::from_str::<Value>(s) {
                Ok(mut parsed) if parsed.is_object() || parsed.is_array() => {
                    if self.values(&mut parsed) {
                        *s = parsed.to_string();
                    }
                }
                _ => {
                    self.text(s);
                }
            },
            other => {
                self.values(other);
            }
        }
    }

    /// Every string and number inside a JSON value (a number that holds PII,
    /// a card or a phone, becomes its placeholder string); true if any changed.
    fn values(&mut self, v: &mut Value) -> bool {
        match v {
            Value::String(s) => self.text(s),
            Value::Number(n) => {
                let mut s = n.to_string();
                let changed = self.text(&mut s);
                if changed {
                    *v = Value::String(s);
                }
                changed
            }
            Value::Array(items) => items.iter_mut().fold(false, |changed, x| self.values(x) | changed),
            Value::Object(map) => map.values_mut().fold(false, |changed, x| self.values(x) | changed),
            Value::Null | Value::Bool(_) => false,
        }
    }

    /// Replaces the findings in one text; true if any.
    fn text(&mut self, text: &mut String) -> bool {
        let mut findings = self.detector.detect(text, self.types);
        if findings.is_empty() {
            return false;
        }
        findings.sort_by_key(|f| (f.span.start, std::cmp::Reverse(f.span.end)));
        let mut out = String::with_capacity(text.len());
        let mut at = 0;
        for f in findings {
            if f.span.start < at {
                continue; // inside a finding already replaced
            }
            out.push_str(&text[at..f.span.start]);
            out.push_str(&self.numbers.of(f.kind, &text[f.span.clone()]));
            at = f.span.end;
        }
        out.push_str(&text[at..]);
        *text = out;
        true
    }
}

#[cfg(test)]
mod tests;
