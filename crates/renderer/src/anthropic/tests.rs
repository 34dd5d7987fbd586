//! The conversions against the engines' own (tests/fixtures/anthropic/{sglang,vllm}_chat.json).

use serde_json::{Value as Json, json};

use super::{Backend, chat_of};

const SGLANG: &str = include_str!("../../../../tests/fixtures/anthropic/sglang_chat.json");
const VLLM: &str = include_str!("../../../../tests/fixtures/anthropic/vllm_chat.json");

#[test]
fn every_case_converts_as_sglang_converts_it() {
    let doc: Json = serde_json::from_str(SGLANG).unwrap();
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 25, "the fixture lost cases");
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let inline = case["inline_system"].as_bool().unwrap();
        let ours = chat_of(&case["request"], Backend::Sglang, inline);
        match (case.get("chat"), ours) {
            // Key order too: templates print tool schemas with `tojson`.
            (Some(want), Ok(got)) => {
                assert_eq!(serde_json::to_string(&got).unwrap(), serde_json::to_string(want).unwrap(), "{name}")
            }
            (None, Err(_)) => {}
            (want, got) => panic!("{name}: SGLang {want:?} ({:?}), ours {got:?}", case.get("error")),
        }
    }
}

/// vLLM's dump orders a message's keys by its own types, not as written (no template reads a
/// message's keys in order; the tool schemas `tojson` prints are compared in order).
#[test]
fn every_case_vllm_accepts_converts_as_vllm_converts_it() {
    let doc: Json = serde_json::from_str(VLLM).unwrap();
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 30, "the fixture lost cases");
    let mut compared = 0;
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let inline = case["inline_system"].as_bool().unwrap();
        let Some(want) = case.get("chat") else { continue }; // vLLM refuses it: its answer
        let got = chat_of(&case["request"], Backend::Vllm, inline).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got["messages"], want["messages"], "{name}");
        let tools = |c: &Json| c.get("tools").map(|t| serde_json::to_string(t).unwrap());
        assert_eq!(tools(&got), tools(want), "{name}");
        compared += 1;
    }
    assert!(compared >= 28, "{compared} cases compared");
}

#[test]
fn malformed_requests_are_refused_with_the_reason() {
    let refused = |body: Json| chat_of(&body, Backend::Sglang, true).unwrap_err().to_string();
    assert!(refused(json!([])).contains("JSON object"));
    assert!(refused(json!({"messages": "hi"})).contains("`messages`"));
    assert!(refused(json!({"messages": [{"role": "bot", "content": "x"}]})).contains("role"));
    assert!(refused(json!({"messages": [{"role": "user", "content": 3}]})).contains("content"));
    assert!(refused(json!({"messages": [{"role": "user", "content": [{"text": "x"}]}]})).contains("type"));
    assert!(refused(json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]})).contains("text"));
    assert!(refused(json!({"messages": [{"role": "user", "content": [{"type": "video"}]}]})).contains("video"));
    let tool = |t: Json| refused(json!({"messages": [{"role": "user", "content": "x"}], "tools": [t]}));
    assert!(tool(json!({"input_schema": {}})).contains("name"));
    assert!(tool(json!({"name": "f"})).contains("input_schema"));
}

#[test]
fn the_inline_system_probes_are_the_engines() {
    let probe = |src: &str| crate::ChatTemplate::new(src).unwrap().supports_inline_system();
    assert!(probe("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"));
    assert!(probe(crate::BUILTIN_CHAT_TEMPLATE));
    // A template that raises on a later system message, or drops it, does not place it inline.
    let raises = "{% for m in messages %}{% if m.role == 'system' and not loop.first %}\
                  {{ raise_exception('system only first') }}{% endif %}{{ m.content }}{% endfor %}";
    assert!(!probe(raises));
    let drops =
        "{% for m in messages %}{% if m.role != 'system' or loop.first %}{{ m.content }}{% endif %}{% endfor %}";
    assert!(!probe(drops));
    // vLLM's probe: it merges only when the template raises; one that drops them renders.
    let takes = |src: &str| crate::ChatTemplate::new(src).unwrap().takes_inline_system();
    assert!(!takes(raises));
    assert!(takes(drops));
}
