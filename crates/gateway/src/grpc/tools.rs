//! Tool calls read out of a gRPC worker's chat answer on the router's side
//! (`--tool-call-parser`; an HTTP engine parses its own), as SGLang 0.5.23's
//! `Qwen25Detector` (smg's `qwen`, Qwen 2.5 and Qwen 3, Hermes-style) reads
//! them: each call a JSON object `{"name": ..., "arguments": {...}}` between
//! `<tool_call>\n` and `\n</tool_call>`; the text before the first call is
//! the answer's content; a call to a function the request did not offer, or
//! one that is not JSON, is dropped; the arguments are written as Python's
//! `json.dumps(..., ensure_ascii=False)` writes them. Streamed, the content
//! goes out as it comes (a partial `<tool_call>` held back) and each call
//! whole once its closing tag comes. `llama`, `mistral` and `deepseek`
//! ([`super::tool_formats`]) and `pythonic` ([`super::pythonic`]) stream the
//! content up to their calls' start and read the calls once the answer ends.

use serde_json::{Value, json};

use crate::GatewayError;

const BOT: &str = "<tool_call>\n";
const EOT: &str = "\n</tool_call>";

/// The parsers the router knows (smg's names, then vLLM's for the same formats), and the
/// format each reads.
const PARSERS: [(&str, Format); 10] = [
    ("qwen", Format::Qwen),
    ("qwen2.5", Format::Qwen),
    ("qwen3", Format::Qwen),
    ("llama", Format::Llama),
    ("mistral", Format::Mistral),
    ("deepseek", Format::DeepSeek),
    ("pythonic", Format::Pythonic),
    ("hermes", Format::Qwen),
    ("llama3_json", Format::Llama),
    ("deepseek_v3", Format::DeepSeek),
];

/// How a model writes its calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// `<tool_call>\n{...}\n</tool_call>` blocks (Qwen, Hermes).
    Qwen,
    /// JSON objects after `<|python_tag|>`, or a bare JSON answer (Llama 3).
    Llama,
    /// `[TOOL_CALLS] [...]` or `[TOOL_CALLS]name[ARGS]{...}` (Mistral).
    Mistral,
    /// `<｜tool▁calls▁begin｜>` and a fenced JSON block per call (DeepSeek V3).
    DeepSeek,
    /// A Python list of calls with keyword arguments, `[f(a=1)]` (Llama 4 and others).
    Pythonic,
}

impl Format {
    /// The format the parser `name` reads (one of [`PARSERS`]).
    pub(crate) fn named(name: &str) -> Option<Self> {
        PARSERS.iter().find(|(n, _)| *n == name).map(|&(_, format)| format)
    }

    /// Where the calls may start (pythonic: Llama 4's `<|python_start|>` or the list).
    fn markers(self) -> &'static [&'static str] {
        match self {
            Format::Qwen => &[BOT],
            Format::Llama => &[super::tool_formats::PYTHON_TAG],
            Format::Mistral => &[super::tool_formats::TOOL_CALLS],
            Format::DeepSeek => &[super::tool_formats::DEEPSEEK_CALLS],
            Format::Pythonic => &["<|python_start|>", "["],
        }
    }
}

/// The tools a request offers, by name, when the answer is to be read for calls.
#[derive(Debug, Clone)]
pub(crate) struct Offered {
    pub(crate) names: Vec<String>,
    pub(crate) format: Format,
}

impl Offered {
    /// The function names `tools` offers, unless `tool_choice` is `none` or there are none;
    /// `parser` must be one of [`PARSERS`].
    pub(crate) fn of(parser: &str, v: &Value) -> Result<Option<Self>, GatewayError> {
        let Some(format) = Format::named(parser) else {
            let known: Vec<&str> = PARSERS.iter().map(|(name, _)| *name).collect();
            let known = known.join(", ");
            return Err(GatewayError::BadRequest(format!("unknown tool-call parser {parser:?} (known: {known})")));
        };
        if v.get("tool_choice").and_then(Value::as_str) == Some("none") {
            return Ok(None);
        }
        let names: Vec<String> = v
            .get("tools")
            .and_then(Value::as_array)
            .map(|tools| {
                tools.iter().filter_map(|t| t.pointer("/function/name")?.as_str().map(str::to_owned)).collect()
            })
            .unwrap_or_default();
        Ok((!names.is_empty()).then_some(Self { names, format }))
    }
}

/// One call: the function and its arguments (a JSON text).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Call {
    pub(crate) name: String,
    pub(crate) arguments: String,
}

impl Call {
    /// OpenAI's form of the `index`th call of request `request_id`.
    pub(crate) fn json(&self, request_id: &str, index: usize) -> Value {
        json!({"id": call_id(request_id, index), "type": "function",
               "function": {"name": self.name, "arguments": self.arguments}})
    }
}

/// A call's id: `call_` and 24 hex digits, unique per request and call.
fn call_id(request_id: &str, index: usize) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in request_id.bytes().chain((index as u64).to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("call_{h:016x}{:08x}", index as u32)
}

/// The call one block holds, if it is a call to an offered function.
fn call_of(block: &str, offered: &Offered) -> Option<Call> {
    call_from(&serde_json::from_str(block.trim()).ok()?, offered)
}

/// The call a call object is, if it calls an offered function.
fn call_from(v: &Value, offered: &Offered) -> Option<Call> {
    let name = v.get("name")?.as_str()?;
    if !offered.names.iter().any(|n| n == name) {
        tracing::debug!(name, "the model called a function the request did not offer: dropped");
        return None;
    }
    let arguments = match v.get("parameters").filter(|p| !p.is_null()).or_else(|| v.get("arguments")) {
        Some(a) => a.clone(),
        None => json!({}),
    };
    Some(Call { name: name.to_owned(), arguments: renderer::python_json(&arguments, false) })
}

/// A whole answer's content and calls.
pub(crate) fn parse(text: &str, offered: &Offered) -> (String, Vec<Call>) {
    let (content, objects) = match offered.format {
        Format::Qwen => return parse_qwen(text, offered),
        Format::Llama => super::tool_formats::llama(text),
        Format::Mistral => super::tool_formats::mistral(text),
        Format::DeepSeek => super::tool_formats::deepseek(text),
        Format::Pythonic => super::pythonic::pythonic(text),
    };
    (content, objects.iter().filter_map(|o| call_from(o, offered)).collect())
}

/// Qwen's: the content the text before the first call, trimmed.
fn parse_qwen(text: &str, offered: &Offered) -> (String, Vec<Call>) {
    let Some(at) = text.find(BOT) else { return (text.to_owned(), Vec::new()) };
    let content = text[..at].trim().to_owned();
    let mut calls = Vec::new();
    let mut rest = &text[at..];
    while let Some(start) = rest.find(BOT) {
        let after = &rest[start + BOT.len()..];
        let Some(end) = after.find(EOT) else { break };
        calls.extend(call_of(&after[..end], offered));
        rest = &after[end + EOT.len()..];
    }
    (content, calls)
}

/// One streamed sequence's calls.
#[derive(Debug)]
pub(crate) struct Stream {
    offered: Offered,
    held: String,
    /// Inside the calls: content no longer goes out.
    calling: bool,
    /// A piece was taken.
    started: bool,
}

impl Stream {
    pub(crate) fn new(offered: Offered) -> Self {
        Self { offered, held: String::new(), calling: false, started: false }
    }

    /// The content a piece makes, and the calls it completes.
    pub(crate) fn push(&mut self, piece: &str) -> (String, Vec<Call>) {
        let first = !self.started;
        self.started = true;
        self.held.push_str(piece);
        // Llama: an answer that opens with a JSON object is its calls.
        if first && self.offered.format == Format::Llama && self.held.starts_with('{') {
            self.calling = true;
        }
        let markers = self.offered.format.markers();
        let mut content = String::new();
        if !self.calling {
            match markers.iter().filter_map(|m| self.held.find(m)).min() {
                Some(at) => {
                    content = self.held[..at].to_owned();
                    self.held.drain(..at);
                    self.calling = true;
                }
                None => {
                    // Hold the tail that may be the start of a marker.
                    let keep = markers.iter().map(|m| super::partial_tag(&self.held, m)).max().unwrap_or(0);
                    let rest = self.held.split_off(self.held.len() - keep);
                    return (std::mem::replace(&mut self.held, rest), Vec::new());
                }
            }
        }
        let mut calls = Vec::new();
        if self.offered.format != Format::Qwen {
            // Read once the answer ends.
            return (content, calls);
        }
        while let Some(start) = self.held.find(BOT) {
            let after = start + BOT.len();
            let Some(end) = self.held[after..].find(EOT) else { break };
            calls.extend(call_of(&self.held[after..after + end], &self.offered));
            self.held.drain(..after + end + EOT.len());
        }
        (content, calls)
    }

    /// What is held once the sequence ended: content not yet given out (an unfinished call
    /// is not content, as a whole answer's is not), and the calls of a format read whole.
    pub(crate) fn finish(&mut self) -> (String, Vec<Call>) {
        let held = std::mem::take(&mut self.held);
        match (self.calling, self.offered.format) {
            (false, _) => (held, Vec::new()),
            (true, Format::Qwen) => (String::new(), Vec::new()),
            (true, _) => parse(&held, &self.offered),
        }
    }

    /// Whether the answer turned to calls.
    pub(crate) fn calling(&self) -> bool {
        self.calling
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offered() -> Offered {
        Offered { names: vec!["get_weather".into(), "search".into()], format: Format::Qwen }
    }

    const ANSWER: &str = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"days\": [1, 2]}}\n</tool_call>\n<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"parameters\": {\"q\": \"a\"}}\n</tool_call>";

    #[test]
    fn calls_are_read_as_sglangs_qwen25_detector_reads_them() {
        let (content, calls) = parse(ANSWER, &offered());
        assert_eq!(content, "Let me check.");
        assert_eq!(
            calls,
            [
                Call { name: "get_weather".into(), arguments: r#"{"city": "Zürich", "days": [1, 2]}"#.into() },
                Call { name: "search".into(), arguments: r#"{"q": "a"}"#.into() },
            ],
            "the unoffered function dropped, the arguments as Python writes them"
        );
        assert_eq!(parse("No calls here.", &offered()), ("No calls here.".into(), Vec::new()));
        // Not JSON, or never closed: no call.
        assert_eq!(parse("x <tool_call>\n{nope}\n</tool_call>", &offered()).1, []);
        assert_eq!(parse("x <tool_call>\n{\"name\": \"search\"", &offered()), ("x".into(), Vec::new()));
    }

    #[test]
    fn streamed_in_any_pieces_the_calls_and_content_are_the_whole_answers() {
        let (content, calls) = parse(ANSWER, &offered());
        for n in [1, 2, 5, 13, 1000] {
            let (c, k, calling) = streamed(&offered(), ANSWER, n);
            assert_eq!((c.trim(), &k), (content.as_str(), &calls), "pieces of {n}");
            assert!(calling);
        }
        assert!(call_id("r", 0) != call_id("r", 1) && call_id("r", 0).len() == 29);
    }
}

/// `text` streamed in pieces of `n` characters: the content, the calls, and whether the answer
/// turned to calls.
#[cfg(test)]
fn streamed(offered: &Offered, text: &str, n: usize) -> (String, Vec<Call>, bool) {
    let mut s = Stream::new(offered.clone());
    let (mut c, mut k) = (String::new(), Vec::new());
    let chars: Vec<char> = text.chars().collect();
    for piece in chars.chunks(n) {
        let (pc, pk) = s.push(&piece.iter().collect::<String>());
        c.push_str(&pc);
        k.extend(pk);
    }
    let (rest, more) = s.finish();
    c.push_str(&rest);
    k.extend(more);
    (c, k, s.calling())
}

#[cfg(test)]
mod formats_streamed {
    use super::*;

    /// Streams `text` in pieces of `n` characters: the content and calls, as a whole answer's.
    fn both_ways(format: Format, text: &str) {
        let offered = Offered { names: vec!["a".into(), "b".into()], format };
        let whole = parse(text, &offered);
        for n in [1, 3, 1000] {
            let (c, k, _) = streamed(&offered, text, n);
            assert_eq!(&k, &whole.1, "{format:?} in pieces of {n}");
            assert!(c.contains(whole.0.trim()), "{format:?} in pieces of {n}: {c:?} {whole:?}");
        }
        assert!(!whole.1.is_empty(), "{format:?}: {whole:?}");
    }

    #[test]
    fn llama_mistral_deepseek_and_pythonic_calls_come_out_alike_whole_and_streamed() {
        both_ways(
            Format::Llama,
            r#"Sure.<|python_tag|>{"name": "a", "parameters": {"x": 1}};{"name": "c", "parameters": {}}"#,
        );
        both_ways(Format::Llama, r#"{"name": "b", "parameters": {"q": "ü"}}"#);
        both_ways(Format::Mistral, r#"Let me see. [TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}}]"#);
        both_ways(Format::Mistral, r#"[TOOL_CALLS]b[ARGS]{"y": [1, 2]}"#);
        both_ways(Format::Pythonic, r#"Let me see. [a(x=1, y=[2, "three"]), b(z={"k": None})]"#);
        both_ways(
            Format::DeepSeek,
            "Hm. <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>a\n```json\n{\"x\": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        );
    }
}
