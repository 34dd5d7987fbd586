//! The tool-call formats read whole once the answer ends, as SGLang 0.5.23's
//! detectors read them: `llama` (`Llama32Detector`: JSON objects after
//! `<|python_tag|>`, or an answer that is a JSON object, separated by `;`)
//! and `mistral` (`MistralDetector`: `[TOOL_CALLS] [{...}, ...]`, or the
//! compact `[TOOL_CALLS]name[ARGS]{...}`) and `deepseek` (`DeepSeekV3Detector`:
//! `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME` and a fenced JSON block per call,
//! all or none). Each returns the answer's content and the calls' objects
//! (`{"name", "arguments" | "parameters"}`).

use serde_json::Value;

/// Llama 3's start of calls.
pub(crate) const PYTHON_TAG: &str = "<|python_tag|>";
/// Mistral's start of calls (both forms).
pub(crate) const TOOL_CALLS: &str = "[TOOL_CALLS";

/// DeepSeek V3's start of calls, and each call's bounds.
pub(crate) const DEEPSEEK_CALLS: &str = "<｜tool▁calls▁begin｜>";
const DEEPSEEK_CALL: &str = "<｜tool▁call▁begin｜>";
const DEEPSEEK_CALL_END: &str = "<｜tool▁call▁end｜>";
const DEEPSEEK_SEP: &str = "<｜tool▁sep｜>";

/// The JSON value at the start of `text` and the bytes it took, if one is there.
fn json_at(text: &str) -> Option<(Value, usize)> {
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    let v = values.next()?.ok()?;
    Some((v, values.byte_offset()))
}

/// Llama 3: `(content, call objects)`.
pub(crate) fn llama(text: &str) -> (String, Vec<Value>) {
    if !text.contains(PYTHON_TAG) && !text.starts_with('{') {
        return (text.to_owned(), Vec::new());
    }
    let (normal, action) = match text.split_once(PYTHON_TAG) {
        Some((normal, action)) => (normal, action),
        None => ("", text),
    };
    let (mut at, mut safe, mut calls) = (0usize, 0usize, Vec::new());
    while at < action.len() {
        // SGLang's decoder reads from here exactly (no whitespace skipped before a value).
        let found = action[at..].starts_with('{').then(|| json_at(&action[at..])).flatten();
        match found {
            Some((v, used)) => {
                calls.push(v);
                // Past the value and the one separator after it.
                at = (at + used + 1).min(action.len());
                while !action.is_char_boundary(at) {
                    at += 1;
                }
                safe = at;
            }
            None => match action[at + 1..].find(r#"{"name":"#) {
                Some(next) => at = at + 1 + next,
                None => break,
            },
        }
    }
    let trailing = if safe < action.len() { action[safe..].trim() } else { "" };
    (format!("{normal}{trailing}"), calls)
}

/// Mistral: `(content, call objects)`.
pub(crate) fn mistral(text: &str) -> (String, Vec<Value>) {
    let Some(at) = text.find(TOOL_CALLS) else { return (text.to_owned(), Vec::new()) };
    let normal = text[..at].trim();
    let part = &text[at..];
    let join = |trailing: &str| {
        if trailing.is_empty() { normal.to_owned() } else { format!("{normal} {trailing}").trim().to_owned() }
    };
    if let Some(array_at) = part.find("[TOOL_CALLS] [").map(|i| i + "[TOOL_CALLS] ".len()) {
        return match json_at(&part[array_at..]) {
            Some((Value::Array(calls), used)) => (join(part[array_at + used..].trim()), calls),
            Some((call @ Value::Object(_), used)) => (join(part[array_at + used..].trim()), vec![call]),
            _ => (normal.to_owned(), Vec::new()),
        };
    }
    // Compact: `[TOOL_CALLS]name[ARGS]{...}`, one after another.
    let (mut rest, mut calls) = (part, Vec::new());
    while let Some(after) = rest.strip_prefix("[TOOL_CALLS]") {
        let Some((name, args)) = after.split_once("[ARGS]") else { break };
        let Some((arguments, used)) = json_at(args) else { break };
        calls.push(serde_json::json!({"name": name.trim(), "arguments": arguments}));
        rest = args[used..].trim_start();
    }
    if calls.is_empty() {
        return (normal.to_owned(), Vec::new());
    }
    (join(rest.trim()), calls)
}

/// DeepSeek V3: `(content, call objects)`; a call it cannot read leaves the whole answer as
/// its content and no calls, as SGLang's detector does.
pub(crate) fn deepseek(text: &str) -> (String, Vec<Value>) {
    let Some(at) = text.find(DEEPSEEK_CALLS) else { return (text.to_owned(), Vec::new()) };
    let one = |call: &str| -> Option<Value> {
        let (_, detail) = call.split_once(DEEPSEEK_SEP)?;
        let (name, rest) = detail.split_once("\n```json\n")?;
        let args = &rest[..rest.rfind("\n```")?];
        let arguments: Value = serde_json::from_str(args).ok()?;
        Some(serde_json::json!({"name": name, "parameters": arguments}))
    };
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(DEEPSEEK_CALL) {
        let after = &rest[start + DEEPSEEK_CALL.len()..];
        let Some(end) = after.find(DEEPSEEK_CALL_END) else { break };
        match one(&after[..end]) {
            Some(call) => calls.push(call),
            None => return (text.to_owned(), Vec::new()),
        }
        rest = &after[end + DEEPSEEK_CALL_END.len()..];
    }
    (text[..at].trim().to_owned(), calls)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn llama_reads_its_python_tag_and_bare_json_answers() {
        let (content, calls) =
            llama(r#"Sure.<|python_tag|>{"name": "a", "parameters": {"x": 1}};{"name": "b", "parameters": {}}"#);
        assert_eq!(content, "Sure.");
        assert_eq!(calls, [json!({"name": "a", "parameters": {"x": 1}}), json!({"name": "b", "parameters": {}})]);
        let (content, calls) = llama(r#"{"name": "a", "parameters": {"x": 1}}"#);
        assert_eq!((content.as_str(), calls.len()), ("", 1));
        assert_eq!(llama("No call."), ("No call.".to_owned(), Vec::new()));
        // A broken object, then a good one: the good one is read, the rest is not content.
        let (_, calls) = llama(r#"<|python_tag|>{"name": oops};{"name": "b", "parameters": {}}"#);
        assert_eq!(calls, [json!({"name": "b", "parameters": {}})]);
    }

    #[test]
    fn mistral_reads_both_its_forms() {
        let (content, calls) = mistral(
            r#"Let me see. [TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}] done"#,
        );
        assert_eq!(content, "Let me see. done");
        assert_eq!(calls.len(), 2);
        let (content, calls) = mistral(r#"[TOOL_CALLS]a[ARGS]{"x": 1}[TOOL_CALLS]b[ARGS]{}"#);
        assert_eq!(content, "");
        assert_eq!(calls, [json!({"name": "a", "arguments": {"x": 1}}), json!({"name": "b", "arguments": {}})]);
        assert_eq!(mistral("[TOOL_CALLS] [not json"), (String::new(), Vec::new()));
    }

    #[test]
    fn deepseek_reads_its_fenced_calls_all_or_none() {
        let call = |name: &str, args: &str| {
            format!("<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>")
        };
        let text = format!(
            "Checking. <｜tool▁calls▁begin｜>{}{}<｜tool▁calls▁end｜>",
            call("a", r#"{"x": 1}"#),
            call("b", "{}")
        );
        let (content, calls) = deepseek(&text);
        assert_eq!(content, "Checking.");
        assert_eq!(calls, [json!({"name": "a", "parameters": {"x": 1}}), json!({"name": "b", "parameters": {}})]);
        let broken = format!("x <｜tool▁calls▁begin｜>{}<｜tool▁calls▁end｜>", call("a", "{oops"));
        assert_eq!(deepseek(&broken), (broken.clone(), Vec::new()));
    }
}
