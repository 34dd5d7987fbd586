//! Chat renderings and token ids against HF transformers' `apply_chat_template`
//! for real tokenizers (`tests/fixtures/chat/*.json`, made by
//! `tests/fixtures/gen_fixtures.py`), plus plain-text encoding.

use std::path::PathBuf;

use renderer::{ChatRequest, Renderer};
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize)]
struct ChatFixture {
    tokenizer: String,
    cases: Vec<ChatCase>,
}

#[derive(Deserialize)]
struct ChatCase {
    name: String,
    request: Value,
    text: Option<String>,
    token_ids: Option<Vec<u32>>,
    error: Option<String>,
}

#[derive(Deserialize)]
struct PlainFixture {
    cases: Vec<PlainCase>,
}

#[derive(Deserialize)]
struct PlainCase {
    text: String,
    add_special_tokens: bool,
    token_ids: Vec<u32>,
}

fn fixtures_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures"))
}

fn load<T: for<'de> Deserialize<'de>>(path: PathBuf) -> T {
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

fn check_model(name: &str) {
    let dir = fixtures_dir();
    let renderer = Renderer::from_dir(&dir.join("tokenizers").join(name), None).expect("load tokenizer dir");
    let fx: ChatFixture = load(dir.join("chat").join(format!("{name}.json")));
    assert_eq!(fx.tokenizer, name);
    assert!(fx.cases.len() >= 12, "{name}: only {} cases", fx.cases.len());
    let mut failures = Vec::new();
    for case in &fx.cases {
        let result = ChatRequest::from_value(&case.request).and_then(|req| renderer.render_chat(&req));
        match (&case.error, result) {
            (Some(_), Err(_)) => {}
            (Some(expected), Ok(r)) => {
                failures.push(format!("{}: expected error {expected:?}, rendered {:?}", case.name, r.text))
            }
            (None, Err(e)) => failures.push(format!("{}: {e}", case.name)),
            (None, Ok(r)) => {
                let text = case.text.as_deref().expect("text");
                if r.text != text {
                    failures.push(format!("{}: text differs\n  want {text:?}\n  got  {:?}", case.name, r.text));
                } else if Some(&r.token_ids) != case.token_ids.as_ref() {
                    failures.push(format!("{}: token ids differ", case.name));
                }
                // The uncached path must agree with the segment-cached one.
                let uncached = renderer.tokenizer().encode_uncached(&r.text, false).unwrap();
                if uncached != r.token_ids {
                    failures.push(format!("{}: cached and uncached tokenization differ", case.name));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} cases fail:\n{}",
        failures.len(),
        fx.cases.len(),
        failures.join("\n")
    );
}

fn check_plain(name: &str) {
    let dir = fixtures_dir();
    let renderer = Renderer::from_dir(&dir.join("tokenizers").join(name), None).expect("load tokenizer dir");
    let fx: PlainFixture = load(dir.join("chat").join(format!("{name}.plain.json")));
    assert!(!fx.cases.is_empty());
    for (i, case) in fx.cases.iter().enumerate() {
        let got = renderer.tokenizer().encode(&case.text, case.add_special_tokens).unwrap();
        assert_eq!(got, case.token_ids, "{name} plain case {i} (add_special_tokens={})", case.add_special_tokens);
        // Twice: the second time from the segment cache.
        let again = renderer.tokenizer().encode(&case.text, case.add_special_tokens).unwrap();
        assert_eq!(again, case.token_ids, "{name} plain case {i}, cached");
    }
}

#[test]
fn deepseek_v3_chats_match_transformers() {
    check_model("deepseek-v3");
}

#[test]
fn qwen3_chats_match_transformers() {
    check_model("qwen3");
}

#[test]
fn deepseek_v3_plain_text_matches_transformers() {
    check_plain("deepseek-v3");
}

#[test]
fn qwen3_plain_text_matches_transformers() {
    check_plain("qwen3");
}
