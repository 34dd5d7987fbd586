//! A reasoning model's thinking told apart from its answer on the router's
//! side (`--reasoning-parser`, for gRPC workers: an HTTP engine parses its
//! own), as SGLang 0.5.23's reasoning detectors do: `deepseek_r1` is in its
//! reasoning from the first token (its template opened `<think>`), `qwen3`
//! only once the text opens `<think>` (`qwen3_thinking` from the first
//! token); the reasoning ends at `</think>`, and what follows is the answer.
//! Qwen's also end at a `<tool_call>` when no `</think>` closes them (Qwen3.5
//! may open a call without closing its reasoning): the call is the answer's,
//! for the tool-call parser. Streamed pieces are split as they come, a
//! partial tag held back until it is whole or proves not to be one, and a
//! tool call in the reasoning held until a `</think>` makes it reasoning or
//! the answer ends (then it is the answer's), so a stream splits as the whole
//! answer does.
//! Checked against SGLang's own detectors (`tests/fixtures/reasoning`).

use crate::GatewayError;

const START: &str = "<think>";
const END: &str = "</think>";
/// Qwen's tool-call tag: it ends a reasoning `</think>` did not.
const TOOL_START: &str = "<tool_call>";

/// The parsers the router knows (smg's names).
pub(crate) const PARSERS: [&str; 3] = ["deepseek_r1", "qwen3", "qwen3_thinking"];

/// Which reasoning format a model writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Format {
    /// In its reasoning from the first token, with or without `<think>`.
    forced: bool,
    /// A tool call ends its reasoning (Qwen's).
    tool_ends: bool,
}

impl Format {
    /// The parser named `name` (one of [`PARSERS`]).
    pub(crate) fn named(name: &str) -> Result<Self, GatewayError> {
        match name {
            "deepseek_r1" => Ok(Self { forced: true, tool_ends: false }),
            "qwen3_thinking" => Ok(Self { forced: true, tool_ends: true }),
            "qwen3" => Ok(Self { forced: false, tool_ends: true }),
            other => Err(GatewayError::BadRequest(format!(
                "unknown reasoning parser {other:?} (known: {})",
                PARSERS.join(", ")
            ))),
        }
    }

    /// The format for an answer to a prompt ending in `tail` (its last tokens' text), as the
    /// engines read the chat template: a prompt that opened `<think>` (a thinking template,
    /// DeepSeek R1's, Qwen3 thinking models') has an answer in its reasoning from the first
    /// token; one that closed it (`enable_thinking: false`: `<think>\n\n</think>`) has no
    /// reasoning to split (`None`); any other is the parser's own.
    pub(crate) fn for_prompt(self, tail: &str) -> Option<Self> {
        let tail = tail.trim_end();
        if tail.ends_with(END) {
            None
        } else if tail.ends_with(START) {
            Some(Self { forced: true, ..self })
        } else {
            Some(self)
        }
    }

    /// A whole answer's (reasoning, content); no reasoning when it has none.
    pub(crate) fn split(self, text: &str) -> (Option<String>, String) {
        if !self.forced && !text.contains(START) {
            return (None, text.to_owned());
        }
        let mut rest = text;
        while let Some(r) = rest.strip_prefix(START) {
            rest = r;
        }
        match rest.split_once(END) {
            Some((reasoning, content)) => (Some(reasoning.to_owned()), content.to_owned()),
            // A tool call before any end: the call is the answer's.
            None if self.tool_ends && rest.contains(TOOL_START) => {
                let at = rest.find(TOOL_START).unwrap_or(rest.len());
                (Some(rest[..at].to_owned()), rest[at..].to_owned())
            }
            // Cut off before its end: all of it was reasoning.
            None => (Some(rest.to_owned()), String::new()),
        }
    }
}

/// One streamed sequence's split.
#[derive(Debug)]
pub(crate) struct Stream {
    held: String,
    in_reasoning: bool,
    /// A tool call ends the reasoning (Qwen's).
    tool_ends: bool,
    /// `<think>` was seen (and taken out) or cannot come any more.
    opened: bool,
}

impl Stream {
    pub(crate) fn new(format: Format) -> Self {
        Self { held: String::new(), in_reasoning: format.forced, tool_ends: format.tool_ends, opened: false }
    }

    /// The (reasoning, content) a new piece of text makes.
    pub(crate) fn push(&mut self, piece: &str) -> (String, String) {
        self.held.push_str(piece);
        if !self.opened {
            // Wait while the text so far may still be the opening tag.
            if START.starts_with(self.held.as_str()) && self.held != START {
                return (String::new(), String::new());
            }
            if let Some(rest) = self.held.strip_prefix(START) {
                self.held = rest.to_owned();
                self.in_reasoning = true;
            }
            self.opened = true;
        }
        if !self.in_reasoning {
            return (String::new(), std::mem::take(&mut self.held));
        }
        if let Some((reasoning, content)) = self.held.split_once(END) {
            let out = (reasoning.to_owned(), content.to_owned());
            self.held.clear();
            self.in_reasoning = false;
            return out;
        }
        // A tool call before any end: held from its tag on until an end makes it reasoning
        // or the answer ends, when it is the answer's (as a whole answer is split).
        if let Some(at) = self.held.find(TOOL_START).filter(|_| self.tool_ends) {
            let call = self.held.split_off(at);
            return (std::mem::replace(&mut self.held, call), String::new());
        }
        // Hold the tail that may be the start of `</think>` (or of a tool call).
        let partial = |tag| super::partial_tag(&self.held, tag);
        let keep = partial(END).max(if self.tool_ends { partial(TOOL_START) } else { 0 });
        let rest = self.held.split_off(self.held.len() - keep);
        (std::mem::replace(&mut self.held, rest), String::new())
    }

    /// What is held once the sequence ended: a tool call no end followed is the answer's.
    pub(crate) fn finish(&mut self) -> (String, String) {
        let held = std::mem::take(&mut self.held);
        let call = self.tool_ends && held.starts_with(TOOL_START);
        if self.in_reasoning && !call { (held, String::new()) } else { (String::new(), held) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Streams `text` in pieces of `n` characters; the joined (reasoning, content).
    fn streamed(format: Format, text: &str, n: usize) -> (String, String) {
        let (mut s, r, c) = pushed(format, text, n);
        let (pr, pc) = s.finish();
        (r + &pr, c + &pc)
    }

    /// Pushes `text` in pieces of `n` characters; the stream (not finished) and what it gave.
    fn pushed(format: Format, text: &str, n: usize) -> (Stream, String, String) {
        let mut s = Stream::new(format);
        let (mut r, mut c) = (String::new(), String::new());
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(n) {
            let (pr, pc) = s.push(&piece.iter().collect::<String>());
            r.push_str(&pr);
            c.push_str(&pc);
        }
        (s, r, c)
    }

    #[test]
    fn a_prompt_that_opened_or_closed_the_reasoning_decides_where_the_answer_starts() {
        let qwen3 = Format::named("qwen3").unwrap();
        // Opened by the template: the answer, with no `<think>`, is reasoning until `</think>`.
        let opened = qwen3.for_prompt("<|im_start|>assistant\n<think>\n").unwrap();
        assert_eq!(opened.split("hmm</think>42"), (Some("hmm".into()), "42".into()));
        // Closed (`enable_thinking: false`): no reasoning at all, even a literal `<think>`.
        assert_eq!(qwen3.for_prompt("<|im_start|>assistant\n<think>\n\n</think>\n\n"), None);
        // Neither: the parser's own (`qwen3` only once the answer opens `<think>`).
        assert_eq!(qwen3.for_prompt("<|im_start|>assistant\n"), Some(qwen3));
        assert_eq!(qwen3.split("hmm</think>42"), (None, "hmm</think>42".into()));
    }

    #[test]
    fn each_format_splits_whole_and_streamed_answers_alike() {
        let r1 = Format::named("deepseek_r1").unwrap();
        let q3 = Format::named("qwen3").unwrap();
        // (format, answer, reasoning, content): SGLang's documented formats.
        let cases = [
            (
                r1,
                "I need to think about this...</think>The answer is 42.",
                Some("I need to think about this..."),
                "The answer is 42.",
            ),
            (
                r1,
                "<think>I need to think about this...</think>The answer is 42.",
                Some("I need to think about this..."),
                "The answer is 42.",
            ),
            (r1, "Cut off while thinking", Some("Cut off while thinking"), ""),
            (q3, "<think>reasoning content</think>The answer is 42.", Some("reasoning content"), "The answer is 42."),
            (q3, "The answer is 42.", None, "The answer is 42."),
            (q3, "<thin is not a tag", None, "<thin is not a tag"),
            (q3, "<think>思考 🤔 中</think>答案 </thi", Some("思考 🤔 中"), "答案 </thi"),
        ];
        for (format, text, reasoning, content) in cases {
            assert_eq!(format.split(text), (reasoning.map(str::to_owned), content.to_owned()), "{text:?}");
            for n in [1, 2, 3, 7, 100] {
                let (r, c) = streamed(format, text, n);
                assert_eq!((r.as_str(), c.as_str()), (reasoning.unwrap_or(""), content), "{text:?} in pieces of {n}");
            }
        }
        assert!(Format::named("nope").is_err());
    }

    /// Against SGLang 0.5.23's own detectors (`tests/fixtures/reasoning/gen_reasoning.py`): a
    /// whole answer as `detect_and_parse` splits it, a streamed one as its increments join
    /// (before the end: SGLang's stream never gives out a partial tag it held at the end; the
    /// router's `finish` does, as the whole answer shows it).
    #[test]
    fn answers_split_as_sglangs_own_detectors_split_them() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/reasoning/reasoning.json");
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut differ = Vec::new();
        for case in doc["cases"].as_array().unwrap() {
            let (parser, text) = (case["parser"].as_str().unwrap(), case["text"].as_str().unwrap());
            let format = Format::named(parser).unwrap();
            let (reasoning, normal) = format.split(text);
            let whole = (case["reasoning"].as_str().unwrap(), case["normal"].as_str().unwrap());
            if (reasoning.as_deref().unwrap_or(""), normal.as_str()) != whole {
                differ.push(format!("{parser} whole {text:?}: {reasoning:?} {normal:?}, SGLang {whole:?}"));
            }
            for s in case["streamed"].as_array().unwrap() {
                let n = s["n"].as_u64().unwrap() as usize;
                let (mut st, r, c) = pushed(format, text, n);
                let theirs = (s["reasoning"].as_str().unwrap(), s["normal"].as_str().unwrap());
                // Three of SGLang's streams are left alone, where its stream departs from its own
                // whole parse: a `<think>` opened mid-text (its stream takes it out wherever it
                // is; the router's, like its whole parse, only at the start), a partial tag
                // its stream holds at the end and never gives out (the router gives out what
                // its whole parse shows).
                let mid_start = text.find(START).is_some_and(|at| at > 0);
                let dropped = theirs.0.len() + theirs.1.len() < whole.0.len() + whole.1.len();
                // And a third: a tool call in the reasoning, which SGLang's stream makes the
                // answer at once and its whole parse only when no `</think>` follows; the
                // router's stream holds it until it knows, and splits as the whole parse.
                let tool_held = format.tool_ends && text.contains(TOOL_START);
                if mid_start || dropped || tool_held {
                    let (fr, fc) = st.finish();
                    let (r, c) = (r + &fr, c + &fc);
                    if !mid_start && (r.as_str(), c.as_str()) != whole {
                        differ.push(format!("{parser} streamed by {n} {text:?}: {r:?} {c:?}, SGLang whole {whole:?}"));
                    }
                } else if (r.as_str(), c.as_str()) != theirs {
                    differ.push(format!("{parser} streamed by {n} {text:?}: {r:?} {c:?}, SGLang {theirs:?}"));
                }
            }
        }
        assert!(differ.is_empty(), "{}", differ.join("\n"));
    }
}
