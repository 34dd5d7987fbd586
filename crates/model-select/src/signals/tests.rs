//! Keyword boundaries, case and operators; regex; PII; context; `needed`.

use std::collections::HashSet;

use serde_json::json;

use super::*;
use crate::config::SignalsConfig;

fn signals(v: serde_json::Value) -> Signals {
    Signals::compile(&serde_json::from_value::<SignalsConfig>(v).unwrap()).unwrap()
}

fn all(s: &Signals) -> HashSet<SignalRef> {
    let mut set = HashSet::new();
    set.extend(s.keywords.iter().map(|k| k.signal.clone()));
    set.extend(s.regex.iter().map(|(r, _)| r.clone()));
    set.extend(s.pii.iter().map(|(r, _)| r.clone()));
    set.extend(s.context.iter().map(|(r, _)| r.clone()));
    set.extend(s.language.iter().cloned());
    set
}

fn eval(s: &Signals, text: &str, tokens: u64) -> SignalResults {
    s.evaluate(&SignalInput { text, tokens }, &all(s))
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
fn only_needed_signals_are_computed_and_language_is_not_computed() {
    let s = signals(json!({
        "keywords": [{"name": "a", "keywords": ["x"]}, {"name": "b", "keywords": ["y"]}],
        "pii": [{"name": "p", "types": ["email"]}],
        "language": [{"name": "zh", "languages": ["zh"]}]
    }));
    let needed: HashSet<SignalRef> =
        [SignalRef::new(SignalKind::Keyword, "a"), SignalRef::new(SignalKind::Language, "zh")].into();
    let r = s.evaluate(&SignalInput { text: "x y a@b.io", tokens: 3 }, &needed);
    assert!(r.get(&SignalRef::new(SignalKind::Keyword, "a")).is_some());
    assert!(r.get(&SignalRef::new(SignalKind::Keyword, "b")).is_none());
    assert!(r.get(&SignalRef::new(SignalKind::Pii, "p")).is_none());
    assert!(r.pii_findings().is_empty());
    assert!(r.is_not_computed(&SignalRef::new(SignalKind::Language, "zh")));
    assert_eq!(r.iter().count(), 1);
    assert_eq!(r.not_computed().count(), 1);
}

#[test]
fn compile_reports_the_first_problem() {
    let bad = |v: serde_json::Value| Signals::compile(&serde_json::from_value(v).unwrap()).unwrap_err().kind();
    assert_eq!(bad(json!({"regex": [{"name": "r", "pattern": "("}]})), "bad_regex");
    assert_eq!(bad(json!({"keywords": [{"name": "k", "keywords": []}]})), "empty_keywords");
    assert_eq!(bad(json!({"keywords": [{"name": "k", "keywords": [""]}]})), "blank_keyword");
    assert_eq!(bad(json!({"pii": [{"name": "p", "types": ["ssn"]}]})), "unknown_pii_type");
    assert_eq!(bad(json!({"pii": [{"name": "p", "types": []}]})), "empty_pii_types");
}
