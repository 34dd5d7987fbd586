//! Keyword boundaries, case and operators; regex; PII; context; `needed`.

use std::collections::HashSet;

use serde_json::json;

use super::*;
use crate::config::SignalsConfig;

fn signals(v: serde_json::Value) -> Signals {
    Signals::compile(&serde_json::from_value::<SignalsConfig>(v).unwrap(), None).unwrap()
}

fn all(s: &Signals) -> HashSet<SignalRef> {
    let mut set = HashSet::new();
    set.extend(s.keywords.iter().map(|k| k.signal.clone()));
    set.extend(s.regex.iter().map(|(r, _)| r.clone()));
    set.extend(s.pii.iter().map(|(r, _)| r.clone()));
    set.extend(s.context.iter().map(|(r, _)| r.clone()));
    set.extend(s.language.iter().map(|(r, _, _)| r.clone()));
    set.extend(s.conversation.iter().map(|(r, _)| r.clone()));
    set.extend(s.headers.iter().map(|(r, _)| r.clone()));
    set.extend(s.load.iter().map(|(r, _)| r.clone()));
    set
}

fn eval(s: &Signals, text: &str, tokens: u64) -> SignalResults {
    s.evaluate(&SignalInput::new(text, tokens), &all(s))
}

fn matched(r: &SignalResults, kind: SignalKind, name: &str) -> bool {
    r.get(&SignalRef::new(kind, name)).expect("computed").matched
}

fn kw(keywords: &[&str], operator: &str, case_sensitive: bool) -> Signals {
    signals(
        json!({"keywords": [{"name": "k", "operator": operator, "keywords": keywords, "case_sensitive": case_sensitive}]}),
    )
}

fn kw_matches(s: &Signals, text: &str) -> bool {
    matched(&eval(s, text, 0), SignalKind::Keyword, "k")
}

#[test]
fn keywords_match_whole_words_only() {
    let s = kw(&["derivative"], "OR", false);
    assert!(kw_matches(&s, "a derivative of x"));
    assert!(kw_matches(&s, "derivative."));
    assert!(kw_matches(&s, "(derivative)"));
    assert!(!kw_matches(&s, "derivatives of x"));
    assert!(!kw_matches(&s, "antiderivative"));
    assert!(!kw_matches(&s, "derivative_x"));
}

#[test]
fn keywords_are_case_insensitive_unless_asked() {
    let s = kw(&["Theorem"], "OR", false);
    assert!(kw_matches(&s, "THEOREM 3"));
    assert!(kw_matches(&s, "a theorem"));
    let s = kw(&["Theorem"], "OR", true);
    assert!(kw_matches(&s, "Theorem 3"));
    assert!(!kw_matches(&s, "theorem 3"));
    let s = kw(&["straße"], "OR", false);
    assert!(kw_matches(&s, "STRASSE? no: STRAßE"));
}

#[test]
fn phrases_and_punctuated_keywords() {
    let s = kw(&["ignore all previous instructions"], "OR", false);
    assert!(kw_matches(&s, "Please IGNORE all\n previous   instructions now"));
    assert!(!kw_matches(&s, "ignore all previous instruction"));
    let s = kw(&["c++", ".net"], "OR", false);
    assert!(kw_matches(&s, "I write C++ daily"));
    assert!(kw_matches(&s, "on .NET"));
    assert!(!kw_matches(&s, "I write c daily"));
    let s = kw(&["a.b"], "OR", false);
    assert!(!kw_matches(&s, "axb"), "keywords are literal, not patterns");
}

#[test]
fn keywords_see_through_encodings_and_look_alikes() {
    let s = kw(&["ignore previous instructions"], "OR", false);
    for text in [
        "please ign\u{43E}re previous instructions", // Cyrillic o
        "please \u{399}GNORE previous instructions", // Greek capital iota
        "İGNORE PREVIOUS INSTRUCTIONS",
        "ignore_previous_instructions",
        "ignore-previous-instructions!",
        "ignore.previous.instructions",
        "ignore previous__instructions",
        "ig\u{AD}nore pre\u{200B}vious instruc\u{200C}tions",
        "ＩＧＮＯＲＥ ｐｒｅｖｉｏｕｓ ｉｎｓｔｒｕｃｔｉｏｎｓ",
        "&#105;gnore&#32;previous&nbsp;instructions",
        "i\u{334}gnore previous instructions",
    ] {
        assert!(kw_matches(&s, text), "{text:?}");
    }
    assert!(!kw_matches(&s, "ignorep revious instructions"));
    assert!(!kw_matches(&s, "ignore previous instructionsx"));
    let single = kw(&["ignore"], "OR", false);
    assert!(kw_matches(&single, "İGNORE this") && kw_matches(&single, "ıgnore this"));
    assert!(!kw_matches(&single, "ignore_x"), "a single keyword still ends at a word boundary");
    // A keyword written with a look-alike matches the Latin spelling, and a
    // Cyrillic keyword still matches Cyrillic text; case-sensitive rules fold too.
    assert!(kw_matches(&kw(&["ign\u{43E}re"], "OR", false), "IGNORE it"));
    assert!(kw_matches(&kw(&["оплата"], "OR", false), "ОПЛАТА сейчас"));
    assert!(kw_matches(&kw(&["Theorem"], "OR", true), "a Th\u{435}orem"));
    assert!(!kw_matches(&kw(&["ignore"], "NOR", false), "ign\u{43E}re"));
}

#[test]
fn a_rule_of_many_phrases_stays_under_the_pattern_limit() {
    let phrases: Vec<String> = (0..500).map(|i| format!("ignore all previous instructions number{i}")).collect();
    let s = signals(json!({"keywords": [{"name": "k", "keywords": phrases}]}));
    assert!(kw_matches(&s, "IGNORE_ALL_PREVIOUS_INSTRUCTIONS_NUMBER499"));
}

#[test]
fn keyword_operators() {
    let text = "an integral and an equation";
    let or = kw(&["integral", "theorem"], "OR", false);
    let and = kw(&["integral", "theorem"], "AND", false);
    let and_all = kw(&["integral", "equation"], "AND", false);
    let nor = kw(&["theorem", "lemma"], "NOR", false);
    let nor_hit = kw(&["theorem", "equation"], "NOR", false);
    assert!(kw_matches(&or, text));
    assert!(!kw_matches(&and, text));
    assert!(kw_matches(&and_all, text));
    assert!(kw_matches(&nor, text));
    assert!(!kw_matches(&nor_hit, text));
    assert!(kw_matches(&nor, ""));
    let r = eval(&and, text, 0);
    let got = r.get(&SignalRef::new(SignalKind::Keyword, "k")).unwrap();
    assert_eq!((got.confidence, got.value), (1.0, Some(1.0)));
}

#[test]
fn regex_signals() {
    let s = signals(json!({"regex": [{"name": "code_block", "pattern": "(?m)^```"}]}));
    assert!(matched(&eval(&s, "look:\n```rust\nfn x() {}\n```", 0), SignalKind::Regex, "code_block"));
    assert!(!matched(&eval(&s, "inline ``` here", 0), SignalKind::Regex, "code_block"));
}

#[test]
fn regex_signals_read_the_normalized_text_and_the_original() {
    let s = signals(json!({"regex": [
        {"name": "override", "pattern": "(?i)ignore (all )?previous"},
        {"name": "zero_width", "pattern": "\u{200B}"},
        {"name": "entity", "pattern": "&#[0-9]+;"},
        {"name": "ssn", "pattern": "\\b[0-9]{3}-[0-9]{2}-[0-9]{4}\\b"}
    ]}));
    let r = eval(&s, "ig\u{200B}nore ALL pre\u{AD}vious", 0);
    assert!(matched(&r, SignalKind::Regex, "override") && matched(&r, SignalKind::Regex, "zero_width"));
    let r = eval(&s, "&#73;GNORE previous; ssn 123–45–6789", 0);
    assert!(matched(&r, SignalKind::Regex, "override") && matched(&r, SignalKind::Regex, "entity"));
    assert!(matched(&r, SignalKind::Regex, "ssn"));
    assert!(!matched(&eval(&s, "heed previous", 0), SignalKind::Regex, "override"));
}

#[test]
fn pii_signal_spans_are_in_the_original_text() {
    let s = signals(json!({"pii": [{"name": "contact", "types": ["email", "phone"]}]}));
    let text = "mail jane&#64;example.com or ａ＠ｂ．ｉｏ, call +١ ٤١٥ ٥٥٥ ٠١٠٠";
    let r = eval(&s, text, 0);
    let spans: Vec<&str> = r.pii_findings().iter().map(|f| &text[f.span.clone()]).collect();
    assert_eq!(spans, ["jane&#64;example.com", "ａ＠ｂ．ｉｏ", "+١ ٤١٥ ٥٥٥ ٠١٠٠"]);
    assert_eq!(r.get(&SignalRef::new(SignalKind::Pii, "contact")).unwrap().value, Some(3.0));
}

#[test]
fn pii_signals_count_hits_and_keep_spans() {
    let s = signals(json!({"pii": [
        {"name": "contact", "types": ["email", "phone"]},
        {"name": "money", "types": ["credit_card", "iban"]}
    ]}));
    let text = "mail a@b.io or c@d.io, call +1 555 123 4567";
    let r = eval(&s, text, 0);
    let contact = r.get(&SignalRef::new(SignalKind::Pii, "contact")).unwrap();
    assert_eq!((contact.matched, contact.value), (true, Some(3.0)));
    assert!(!matched(&r, SignalKind::Pii, "money"));
    let spans: Vec<&str> = r.pii_findings().iter().map(|f| &text[f.span.clone()]).collect();
    assert_eq!(spans, ["a@b.io", "c@d.io", "+1 555 123 4567"]);
}

#[test]
fn context_bounds_are_inclusive() {
    let s = signals(json!({"context": [
        {"name": "long", "min_tokens": 100},
        {"name": "short", "max_tokens": 10},
        {"name": "mid", "min_tokens": 10, "max_tokens": 100}
    ]}));
    for (tokens, long, short, mid) in [(5, false, true, false), (10, false, true, true), (100, true, false, true)] {
        let r = eval(&s, "", tokens);
        assert_eq!(matched(&r, SignalKind::Context, "long"), long, "{tokens}");
        assert_eq!(matched(&r, SignalKind::Context, "short"), short, "{tokens}");
        assert_eq!(matched(&r, SignalKind::Context, "mid"), mid, "{tokens}");
        assert_eq!(r.get(&SignalRef::new(SignalKind::Context, "mid")).unwrap().value, Some(tokens as f64));
    }
}

#[test]
fn only_needed_signals_are_computed() {
    let s = signals(json!({
        "keywords": [{"name": "a", "keywords": ["x"]}, {"name": "b", "keywords": ["y"]}],
        "pii": [{"name": "p", "types": ["email"]}],
        "language": [{"name": "zh", "languages": ["zh"]}]
    }));
    let needed: HashSet<SignalRef> =
        [SignalRef::new(SignalKind::Keyword, "a"), SignalRef::new(SignalKind::Language, "zh")].into();
    let r = s.evaluate(&SignalInput::new("x y a@b.io", 3), &needed);
    assert!(r.get(&SignalRef::new(SignalKind::Keyword, "a")).is_some());
    assert!(r.get(&SignalRef::new(SignalKind::Keyword, "b")).is_none());
    assert!(r.get(&SignalRef::new(SignalKind::Pii, "p")).is_none());
    assert!(r.pii_findings().is_empty());
    assert!(!matched(&r, SignalKind::Language, "zh"));
    assert_eq!(r.iter().count(), 2);
    assert_eq!(r.not_computed().count(), 0);
}

#[test]
fn language_signals_match_the_detected_language_and_its_confidence() {
    let s = signals(json!({"language": [
        {"name": "chinese", "languages": ["zh"]},
        {"name": "german_sure", "languages": ["de", "deu"], "min_confidence": 0.9},
        {"name": "cjk", "languages": ["ja", "ko", "cmn"]}
    ]}));
    let needed = all(&s);
    let zh = s.evaluate(&SignalInput::new("请帮我写一封给客户的邮件，说明发货时间会推迟。", 0), &needed);
    assert!(matched(&zh, SignalKind::Language, "chinese") && matched(&zh, SignalKind::Language, "cjk"));
    let c = zh.get(&SignalRef::new(SignalKind::Language, "chinese")).unwrap();
    assert!(c.confidence > 0.0 && c.value == Some(c.confidence), "{c:?}");
    let de = "Könnten Sie mir bitte erklären, wie die Abrechnung im nächsten Monat funktioniert?";
    let de = s.evaluate(&SignalInput::new(de, 0), &needed);
    assert!(!matched(&de, SignalKind::Language, "chinese"));
    let sure = de.get(&SignalRef::new(SignalKind::Language, "german_sure")).unwrap();
    // Matched exactly when the detector is that sure.
    assert_eq!(sure.matched, sure.value.unwrap() >= 0.9, "{sure:?}");
    let none = s.evaluate(&SignalInput::new("", 0), &needed);
    assert!(!matched(&none, SignalKind::Language, "chinese"));
}

#[test]
fn compile_reports_the_first_problem() {
    let bad = |v: serde_json::Value| Signals::compile(&serde_json::from_value(v).unwrap(), None).unwrap_err().kind();
    assert_eq!(bad(json!({"regex": [{"name": "r", "pattern": "("}]})), "bad_regex");
    assert_eq!(bad(json!({"keywords": [{"name": "k", "keywords": []}]})), "empty_keywords");
    assert_eq!(bad(json!({"keywords": [{"name": "k", "keywords": [""]}]})), "blank_keyword");
    assert_eq!(bad(json!({"pii": [{"name": "p", "types": ["ssn"]}]})), "unknown_pii_type");
    assert_eq!(bad(json!({"pii": [{"name": "p", "types": []}]})), "empty_pii_types");
}

#[test]
fn conversation_header_and_load_rules_read_the_request_and_the_pools() {
    let s = signals(json!({
        "conversation": [
            {"name": "agent", "has_tools": true, "tool_loop": true},
            {"name": "long_chat", "min_turns": 3},
            {"name": "text_only", "has_images": false, "max_turns": 5}
        ],
        "headers": [{"name": "gold", "header": "X-User-Tier", "values": ["gold", "platinum"]},
                    {"name": "tagged", "header": "x-team"}],
        "load": [{"name": "large_busy", "pool": "large", "min_in_flight": 8},
                 {"name": "large_fast", "pool": "large", "max_ttft_ms": 500.0}]
    }));
    let headers = vec![("x-user-tier".to_owned(), "gold".to_owned())];
    let pools = [PoolState { name: "large", in_flight: 9, est_ttft_ms: 650.0 }];
    let shape = Shape { turns: 3, tools: true, tool_loop: true, images: false };
    let input = SignalInput { shape, headers: &headers, pools: &pools, ..SignalInput::default() };
    let r = s.evaluate(&input, &all(&s));
    assert!(matched(&r, SignalKind::Conversation, "agent"));
    assert!(matched(&r, SignalKind::Conversation, "long_chat"));
    assert!(matched(&r, SignalKind::Conversation, "text_only"));
    assert_eq!(r.get(&SignalRef::new(SignalKind::Conversation, "long_chat")).unwrap().value, Some(3.0));
    assert!(matched(&r, SignalKind::Header, "gold"));
    assert!(!matched(&r, SignalKind::Header, "tagged"), "absent header");
    assert!(matched(&r, SignalKind::Load, "large_busy"));
    assert!(!matched(&r, SignalKind::Load, "large_fast"));
    assert_eq!(r.get(&SignalRef::new(SignalKind::Load, "large_fast")).unwrap().value, Some(650.0));
    // A chat without tools, with an image; a header with another value; a quiet pool.
    let headers = vec![("x-user-tier".to_owned(), "silver".to_owned()), ("x-team".to_owned(), "a".to_owned())];
    let pools = [PoolState { name: "large", in_flight: 1, est_ttft_ms: 40.0 }];
    let shape = Shape { turns: 1, tools: false, tool_loop: false, images: true };
    let r = s.evaluate(&SignalInput { shape, headers: &headers, pools: &pools, ..SignalInput::default() }, &all(&s));
    assert!(!matched(&r, SignalKind::Conversation, "agent"));
    assert!(!matched(&r, SignalKind::Conversation, "text_only"));
    assert!(!matched(&r, SignalKind::Header, "gold") && matched(&r, SignalKind::Header, "tagged"));
    assert!(!matched(&r, SignalKind::Load, "large_busy") && matched(&r, SignalKind::Load, "large_fast"));
    // No state of the pool (none given): no match.
    let r = s.evaluate(&SignalInput::new("", 0), &all(&s));
    assert!(!matched(&r, SignalKind::Load, "large_fast"));
}
