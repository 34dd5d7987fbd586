//! The router's tool-call and reasoning parsers against the engines' own: SGLang 0.5.23's
//! detectors (`tests/fixtures/tool_calls`, `tests/fixtures/reasoning`) and vLLM 0.33's parser
//! classes over the same answers (`tests/fixtures/vllm_parsers`, whole and streamed a token at a
//! time). Every answer is read as one of the two engines reads it, and each way the router
//! departs from one of them is named here (and in docs/grpc.md): a new difference fails.

use std::collections::BTreeMap;

use serde_json::Value;

use super::reasoning;
use super::tools::{self, Format, Offered};

/// A fixture file under `tests/fixtures/`.
fn fixture(path: &str) -> Value {
    let path = format!("{}/../../tests/fixtures/{path}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap()
}

/// A reading of an answer: its content and its calls (name, arguments as JSON, or the text
/// when it is not JSON).
type Reading = (String, Vec<(String, Value)>);

fn calls_of(calls: &Value) -> Vec<(String, Value)> {
    let arguments = |a: &str| serde_json::from_str(a).unwrap_or_else(|_| Value::String(format!("not JSON: {a}")));
    calls.as_array().unwrap().iter().map(|c| (s(&c["name"]).to_owned(), arguments(s(&c["arguments"])))).collect()
}

/// The formats both fixtures hold, by the router's parser names.
const FORMATS: [&str; 5] = ["qwen", "llama", "mistral", "deepseek", "pythonic"];

fn offered(format: Format) -> Offered {
    let tools = fixture("tool_calls/formats.json")["tools"].clone();
    Offered { names: tools.as_array().unwrap().iter().map(|t| s(t).to_owned()).collect(), format }
}

fn ours(offered: &Offered, text: &str) -> Reading {
    let (content, calls) = tools::parse(text, offered);
    let calls = calls.into_iter().map(|c| (c.name, serde_json::from_str(&c.arguments).unwrap())).collect();
    (content, calls)
}

/// SGLang's reading of each answer of a format, by the answer, and its calls' arguments as
/// SGLang wrote them (Python's `json.dumps`).
fn sglang_tool_readings(name: &str) -> Vec<(String, Reading, Vec<String>)> {
    let cases = if name == "pythonic" {
        fixture("tool_calls/pythonic.json")["cases"].clone()
    } else {
        fixture("tool_calls/formats.json")["formats"][name].clone()
    };
    let written = |calls: &Value| calls.as_array().unwrap().iter().map(|c| s(&c["arguments"]).to_owned()).collect();
    let read = |c: &Value| {
        (s(&c["text"]).to_owned(), (s(&c["normal_text"]).to_owned(), calls_of(&c["calls"])), written(&c["calls"]))
    };
    cases.as_array().unwrap().iter().map(read).collect()
}

/// How the router's reading departs from vLLM's where it is SGLang's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum FromVllm {
    /// vLLM returns calls to functions the request did not offer; the router drops them.
    Unoffered,
    /// vLLM gives the whole answer back as content, no call, unless it reads all of it as
    /// calls (a Hermes block that is not JSON; pythonic: text around the list, a non-literal
    /// argument); the router takes out the calls it reads and drops the others.
    WholeOrNothing,
    /// Llama: vLLM drops the text before `<|python_tag|>`; the router keeps it as content.
    TextBeforeTagDropped,
    /// vLLM writes an infinite float as `Infinity`, which is not JSON; the router drops the call.
    NotJson,
    /// vLLM leaves the whitespace before the calls in the content; the router trims it.
    Untrimmed,
}

/// The departures that make vLLM's reading the router's; `None` when they do not.
fn from_vllm(format: Format, text: &str, ours: &Reading, vllm: &Reading, offered: &Offered) -> Option<Vec<FromVllm>> {
    if vllm.1.is_empty() && vllm.0 == text && ours != vllm {
        return Some(vec![FromVllm::WholeOrNothing]);
    }
    let (mut content, mut calls, mut named) = (vllm.0.clone(), vllm.1.clone(), Vec::new());
    let before_tag = text.split(super::tool_formats::PYTHON_TAG).next().unwrap_or_default();
    if format == Format::Llama
        && content.is_empty()
        && !before_tag.is_empty()
        && text.contains(super::tool_formats::PYTHON_TAG)
    {
        content = before_tag.to_owned();
        named.push(FromVllm::TextBeforeTagDropped);
    }
    if content.trim() != content && content.trim() == ours.0 {
        content = content.trim().to_owned();
        named.push(FromVllm::Untrimmed);
    }
    if calls.iter().any(|(n, _)| !offered.names.contains(n)) {
        calls.retain(|(n, _)| offered.names.contains(n));
        named.push(FromVllm::Unoffered);
    }
    if calls.iter().any(|(_, a)| a.as_str().is_some_and(|a| a.starts_with("not JSON"))) {
        calls.retain(|(_, a)| !a.as_str().is_some_and(|a| a.starts_with("not JSON")));
        named.push(FromVllm::NotJson);
    }
    (&(content, calls) == ours && !named.is_empty()).then_some(named)
}

/// Every answer of every format, whole: the router reads it as SGLang or as vLLM does; where it
/// is SGLang's reading and not vLLM's, the departure is one of [`FromVllm`]; where it is vLLM's
/// and not SGLang's, it is a pythonic literal SGLang drops its call for (a signed number, a
/// tuple, a set, JSON's `true`/`false`/`null`).
#[test]
fn every_answer_is_read_as_sglang_or_vllm_reads_it_and_each_departure_is_named() {
    let vllm = fixture("vllm_parsers/vllm_parsers.json");
    let (mut both, mut differ) = (0, Vec::new());
    let mut departures: BTreeMap<FromVllm, usize> = BTreeMap::new();
    let mut from_sglang = Vec::new();
    for name in FORMATS {
        let format = Format::named(name).unwrap();
        let offered = offered(format);
        let theirs = vllm["tool_calls"][name].as_array().unwrap();
        let sglang = sglang_tool_readings(name);
        assert_eq!(theirs.len(), sglang.len(), "{name}: the same answers in both fixtures");
        for (case, (text, sglang, sglang_written)) in theirs.iter().zip(sglang) {
            assert_eq!(s(&case["text"]), text);
            let whole = &case["whole"];
            let vllm = (whole["content"].as_str().unwrap_or_default().to_owned(), calls_of(&whole["calls"]));
            let ours = ours(&offered, &text);
            // Where the router reads SGLang's calls, it writes their arguments as SGLang does.
            let written: Vec<String> = tools::parse(&text, &offered).1.into_iter().map(|c| c.arguments).collect();
            if ours == sglang && written != sglang_written {
                differ.push(format!("{name} {text:?}: arguments written {written:?}, SGLang {sglang_written:?}"));
            }
            match (ours == sglang, ours == vllm) {
                (true, true) => both += 1,
                (true, false) => match from_vllm(format, &text, &ours, &vllm, &offered) {
                    Some(named) => named.into_iter().for_each(|d| *departures.entry(d).or_default() += 1),
                    None => differ.push(format!("{name} {text:?}: ours {ours:?}, vLLM {vllm:?} (no named departure)")),
                },
                (false, true) if format == Format::Pythonic => from_sglang.push(text),
                _ => {
                    differ.push(format!("{name} {text:?}:\n  ours   {ours:?}\n  SGLang {sglang:?}\n  vLLM   {vllm:?}"))
                }
            }
        }
    }
    assert!(differ.is_empty(), "{} answers read otherwise:\n{}", differ.len(), differ.join("\n"));
    assert!(both >= 25, "{both} answers read alike by all three");
    // Each named departure still happens (else it is no longer one, and goes).
    for d in [
        FromVllm::Unoffered,
        FromVllm::WholeOrNothing,
        FromVllm::TextBeforeTagDropped,
        FromVllm::NotJson,
        FromVllm::Untrimmed,
    ] {
        assert!(departures.contains_key(&d), "{d:?} no longer departs: {departures:?}");
    }
    assert_eq!(from_sglang.len(), 3, "signed, tuple and set arguments: {from_sglang:?}");
}

/// Each answer streamed in vLLM's own deltas (one token's text at a time, a character split
/// across tokens held until it is whole): the router's calls and content are its whole reading.
#[test]
fn answers_streamed_in_vllms_token_deltas_read_as_whole_answers() {
    let vllm = fixture("vllm_parsers/vllm_parsers.json");
    let mut differ = Vec::new();
    let mut streams = 0;
    for name in FORMATS {
        let format = Format::named(name).unwrap();
        let offered = offered(format);
        for case in vllm["tool_calls"][name].as_array().unwrap() {
            let Some(deltas) = case.pointer("/streamed/deltas").and_then(Value::as_array) else { continue };
            let text = s(&case["text"]);
            let (whole_content, whole_calls) = tools::parse(text, &offered);
            let mut stream = tools::Stream::new(offered.clone());
            let (mut content, mut calls) = (String::new(), Vec::new());
            for d in deltas {
                let (c, k) = stream.push(s(d));
                content.push_str(&c);
                calls.extend(k);
            }
            let (c, k) = stream.finish();
            content.push_str(&c);
            calls.extend(k);
            streams += 1;
            if calls != whole_calls || content.trim() != whole_content.trim() {
                differ.push(format!(
                    "{name} {text:?}: streamed {content:?} {calls:?}, whole {whole_content:?} {whole_calls:?}"
                ));
            }
        }
    }
    assert!(streams >= 55, "{streams}");
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

/// How the router's reasoning split departs from vLLM's where it is SGLang's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum ReasoningFromVllm {
    /// A `<think>` after the answer's start: vLLM takes it out (`deepseek_r1` drops the text
    /// before it); the router, as SGLang, reads it as text.
    StartMidText,
    /// vLLM's `qwen3` takes a `</think>` out of the content (a second one, or any in an answer
    /// whose prompt closed the thinking); the router keeps it.
    EndTakenOut,
    /// A `<tool_call>` before `</think>`: vLLM's `qwen3` ends the reasoning there; the router,
    /// as SGLang, only when no `</think>` ends it.
    ToolCallBeforeEnd,
}

fn reasoning_from_vllm(text: &str) -> Vec<ReasoningFromVllm> {
    let mut named = Vec::new();
    if text.find("<think>").is_some_and(|at| at > 0) {
        named.push(ReasoningFromVllm::StartMidText);
    }
    if text.matches("</think>").count() > 1 {
        named.push(ReasoningFromVllm::EndTakenOut);
    }
    if text.find("<tool_call>").is_some_and(|t| text.find("</think>").is_some_and(|e| t < e)) {
        named.push(ReasoningFromVllm::ToolCallBeforeEnd);
    }
    named
}

/// Reasoning: vLLM's `deepseek_r1` against the router's, and vLLM's `qwen3` (thinking on, its
/// default: an answer is reasoning from its start) against the router's `qwen3_thinking`. Each
/// answer whole is split as SGLang or vLLM splits it (departures from vLLM named), and streamed
/// in vLLM's token deltas as the router splits it whole.
#[test]
fn reasoning_is_split_as_sglang_or_vllm_splits_it_whole_and_in_token_deltas() {
    let vllm = fixture("vllm_parsers/vllm_parsers.json");
    let sglang = fixture("reasoning/reasoning.json");
    let (mut both, mut differ) = (0, Vec::new());
    let mut departures: BTreeMap<ReasoningFromVllm, usize> = BTreeMap::new();
    for case in vllm["reasoning"].as_array().unwrap() {
        let (parser, text) = (s(&case["parser"]), s(&case["text"]));
        let parser = if parser == "qwen3" { "qwen3_thinking" } else { parser };
        let format = reasoning::Format::named(parser).unwrap();
        let (r, c) = format.split(text);
        let ours = (r.unwrap_or_default(), c);
        let theirs = (case["reasoning"].as_str().unwrap_or_default(), case["content"].as_str().unwrap_or_default());
        let sglang =
            sglang["cases"].as_array().unwrap().iter().find(|c| s(&c["parser"]) == parser && s(&c["text"]) == text);
        let sglang = sglang.map(|c| (s(&c["reasoning"]), s(&c["normal"])));
        let ours_ref = (ours.0.as_str(), ours.1.as_str());
        if ours_ref == theirs {
            both += 1;
        } else if Some(ours_ref) == sglang && !reasoning_from_vllm(text).is_empty() {
            for d in reasoning_from_vllm(text) {
                *departures.entry(d).or_default() += 1;
            }
        } else {
            differ.push(format!("{parser} {text:?}: ours {ours_ref:?}, vLLM {theirs:?}, SGLang {sglang:?}"));
        }
        let mut stream = reasoning::Stream::new(format);
        let (mut sr, mut sc) = (String::new(), String::new());
        for d in case["streamed"]["deltas"].as_array().unwrap() {
            let (r, c) = stream.push(s(d));
            sr.push_str(&r);
            sc.push_str(&c);
        }
        let (r, c) = stream.finish();
        if (sr + &r, sc + &c) != ours {
            differ.push(format!("{parser} {text:?} streamed in token deltas: not its whole split {ours:?}"));
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n"));
    assert!(both >= 20, "{both} answers split alike");
    assert_eq!(departures.len(), 3, "each named departure still happens: {departures:?}");
}

/// After a chat prompt: vLLM's `qwen3` (thinking on) reads the prompt's ids first
/// (`set_prompt_token_ids`); the router's `qwen3_thinking`, adjusted by the prompt's end
/// ([`reasoning::Format::for_prompt`]), splits the answers alike: reasoning from the first token
/// after a prompt that opened the thinking or left it to the model, none after one that closed
/// it (an earlier turn's closing does not count), but where vLLM takes a `</think>` out of an
/// answer whose prompt closed the thinking.
#[test]
fn after_a_prompt_that_opened_or_closed_the_thinking_answers_split_as_vllm_splits_them() {
    let vllm = fixture("vllm_parsers/vllm_parsers.json");
    let thinking = reasoning::Format::named("qwen3_thinking").unwrap();
    let (mut alike, mut taken_out, mut differ) = (0, 0, Vec::new());
    for case in vllm["prompted"].as_array().unwrap() {
        let (prompt, text) = (s(&case["prompt_text"]), s(&case["text"]));
        let ours = match thinking.for_prompt(prompt) {
            Some(format) => {
                let (r, c) = format.split(text);
                (r.unwrap_or_default(), c)
            }
            None => (String::new(), text.to_owned()),
        };
        let theirs = (case["reasoning"].as_str().unwrap_or_default(), case["content"].as_str().unwrap_or_default());
        if (ours.0.as_str(), ours.1.as_str()) == theirs {
            alike += 1;
        } else if ours.0.is_empty() && theirs.0.is_empty() && ours.1.replace("</think>", "") == theirs.1 {
            taken_out += 1;
        } else {
            differ.push(format!("{} {text:?}: ours {ours:?}, vLLM {theirs:?}", s(&case["prompt"])));
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n"));
    assert_eq!((alike, taken_out), (14, 2), "the closed prompt's two answers with a `</think>`");
}
