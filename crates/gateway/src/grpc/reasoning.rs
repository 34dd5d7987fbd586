//! A reasoning model's thinking told apart from its answer on the router's
//! side (`--reasoning-parser`, for gRPC workers: an HTTP engine parses its
//! own), as SGLang 0.5.23's reasoning detectors do: `deepseek_r1` is in its
//! reasoning from the first token (its template opened `<think>`), `qwen3`
//! only once the text opens `<think>` (`qwen3_thinking` from the first
//! token); the reasoning ends at `</think>`, and what follows is the answer.
//! Streamed pieces are split as they come, a partial tag held back until it
//! is whole or proves not to be one.

use crate::GatewayError;

const START: &str = "<think>";
const END: &str = "</think>";

/// The parsers the router knows (smg's names).
pub(crate) const PARSERS: [&str; 3] = ["deepseek_r1", "qwen3", "qwen3_thinking"];

/// Which reasoning format a model writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Format {
    /// In its reasoning from the first token, with or without `<think>`.
    forced: bool,
}

impl Format {
    /// The parser named `name` (one of [`PARSERS`]).
    pub(crate) fn named(name: &str) -> Result<Self, GatewayError> {
        match name {
            "deepseek_r1" | "qwen3_thinking" => Ok(Self { forced: true }),
            "qwen3" => Ok(Self { forced: false }),
            other => Err(GatewayError::BadRequest(format!(
                "unknown reasoning parser {other:?} (known: {})",
                PARSERS.join(", ")
            ))),
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
    /// `<think>` was seen (and taken out) or cannot come any more.
    opened: bool,
}

impl Stream {
    pub(crate) fn new(format: Format) -> Self {
        Self { held: String::new(), in_reasoning: format.forced, opened: false }
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
        // Hold the tail that may be the start of `</think>`.
        let keep = (1..END.len())
            .rev()
            .find(|n| {
                self.held.len() >= *n
                    && self.held.is_char_boundary(self.held.len() - n)
                    && END.starts_with(&self.held[self.held.len() - n..])
            })
            .unwrap_or(0);
        let rest = self.held.split_off(self.held.len() - keep);
        (std::mem::replace(&mut self.held, rest), String::new())
    }

    /// What is held once the sequence ended.
    pub(crate) fn finish(&mut self) -> (String, String) {
        let held = std::mem::take(&mut self.held);
        if self.in_reasoning { (held, String::new()) } else { (String::new(), held) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Streams `text` in pieces of `n` characters; the joined (reasoning, content).
    fn streamed(format: Format, text: &str, n: usize) -> (String, String) {
        let mut s = Stream::new(format);
        let (mut r, mut c) = (String::new(), String::new());
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(n) {
            let (pr, pc) = s.push(&piece.iter().collect::<String>());
            r.push_str(&pr);
            c.push_str(&pc);
        }
        let (pr, pc) = s.finish();
        (r + &pr, c + &pc)
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
}
