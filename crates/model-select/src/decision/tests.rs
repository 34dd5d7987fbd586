//! Rule semantics (AND mean, OR max, NOT), ranking by tier, priority and
//! confidence, the catch-all, traces, and which signals are needed.

use serde_json::json;

use super::*;
use crate::config::{Config, SignalKind};
use crate::results::SignalResult;

fn sig(kind: SignalKind, name: &str) -> SignalRef {
    SignalRef::new(kind, name)
}

/// Keyword signals `name -> (matched, confidence)`, plus a context signal `ctx` with value 120.
fn results(keywords: &[(&str, bool, f64)]) -> SignalResults {
    let mut r = SignalResults::default();
    for &(name, matched, confidence) in keywords {
        r.insert(sig(SignalKind::Keyword, name), SignalResult { matched, confidence, value: None });
    }
    r.insert(sig(SignalKind::Context, "ctx"), SignalResult { matched: true, confidence: 1.0, value: Some(120.0) });
    r
}

fn node(v: serde_json::Value) -> RuleNode {
    serde_json::from_value(v).unwrap()
}

fn leaf(name: &str) -> serde_json::Value {
    json!({"type": "keyword", "name": name})
}

fn config(v: serde_json::Value) -> Config {
    serde_json::from_value(v).unwrap()
}

#[test]
fn leaf_takes_the_signal_confidence_and_checks_bounds() {
    let r = results(&[("a", true, 0.7), ("b", false, 1.0)]);
    assert_eq!(evaluate_rule(&node(leaf("a")), &r), RuleOutcome { matched: true, confidence: 0.7, failed: None });
    assert_eq!(evaluate_rule(&node(leaf("b")), &r).failed.as_deref(), Some("keyword:b"));
    assert!(evaluate_rule(&node(json!({"type": "context", "name": "ctx", "gte": 100})), &r).matched);
    let out = evaluate_rule(&node(json!({"type": "context", "name": "ctx", "gt": 200})), &r);
    assert_eq!(out.failed.as_deref(), Some("context:ctx (value 120 fails > 200)"));
    let out = evaluate_rule(&node(json!({"type": "keyword", "name": "a", "lt": 3})), &r);
    assert_eq!(out.failed.as_deref(), Some("keyword:a (no value for < 3)"));
    assert_eq!(evaluate_rule(&node(leaf("zz")), &r).failed.as_deref(), Some("keyword:zz (not evaluated)"));
}

#[test]
fn and_is_the_mean_or_is_the_max_of_the_matched() {
    let r = results(&[("a", true, 0.6), ("b", true, 1.0), ("c", false, 0.9)]);
    let and = evaluate_rule(&node(json!({"operator": "AND", "conditions": [leaf("a"), leaf("b")]})), &r);
    assert!(and.matched && (and.confidence - 0.8).abs() < 1e-12);
    let or = evaluate_rule(&node(json!({"operator": "OR", "conditions": [leaf("c"), leaf("a"), leaf("b")]})), &r);
    assert_eq!((or.matched, or.confidence), (true, 1.0));
    let or = evaluate_rule(&node(json!({"operator": "OR", "conditions": [leaf("c"), leaf("a")]})), &r);
    assert_eq!(or.confidence, 0.6, "the unmatched child's 0.9 does not count");
    let and = evaluate_rule(&node(json!({"operator": "AND", "conditions": [leaf("a"), leaf("c")]})), &r);
    assert_eq!(and, RuleOutcome { matched: false, confidence: 0.0, failed: Some("AND[1] keyword:c".into()) });
}

#[test]
fn not_is_confidence_one_when_the_child_fails() {
    let r = results(&[("a", true, 0.6), ("c", false, 0.9)]);
    let not = evaluate_rule(&node(json!({"operator": "NOT", "conditions": [leaf("c")]})), &r);
    assert_eq!((not.matched, not.confidence), (true, 1.0));
    let not = evaluate_rule(&node(json!({"operator": "NOT", "conditions": [leaf("a")]})), &r);
    assert_eq!(not.failed.as_deref(), Some("NOT[0] keyword:a matched"));
    let two = evaluate_rule(&node(json!({"operator": "NOT", "conditions": [leaf("c"), leaf("c")]})), &r);
    assert!(!two.matched, "NOT needs strictly one child");
}

#[test]
fn failure_paths_name_the_first_failing_condition() {
    let r = results(&[("a", true, 1.0), ("b", false, 1.0), ("c", false, 1.0)]);
    let tree = node(json!({"operator": "AND", "conditions": [
        leaf("a"),
        {"operator": "OR", "conditions": [leaf("b"), leaf("c")]}
    ]}));
    assert_eq!(evaluate_rule(&tree, &r).failed.as_deref(), Some("AND[1] OR[0] keyword:b"));
    let mut r = r;
    r.insert(sig(SignalKind::Keyword, "b"), SignalResult { matched: true, confidence: 1.0, value: None });
    assert!(evaluate_rule(&tree, &r).matched);
}

#[test]
fn language_leaves_carry_the_detectors_confidence_and_unasked_signals_fail() {
    let s = crate::signals::Signals::compile(
        &serde_json::from_value(
            json!({"language": [{"name": "zh", "languages": ["zh"]}, {"name": "de", "languages": ["de"]}]}),
        )
        .unwrap(),
        None,
    )
    .unwrap();
    let needed: HashSet<SignalRef> = [sig(SignalKind::Language, "zh")].into();
    let r = s.evaluate(&crate::signals::SignalInput::new("请帮我写一封给客户的邮件。", 2), &needed);
    let out = evaluate_rule(&node(json!({"type": "language", "name": "zh"})), &r);
    let detected = r.get(&sig(SignalKind::Language, "zh")).unwrap().confidence;
    assert!(out.matched && out.confidence == detected && detected > 0.0, "{out:?}");
    let out = evaluate_rule(&node(json!({"type": "language", "name": "de"})), &r);
    assert_eq!(out.failed.as_deref(), Some("language:de (not evaluated)"));
}

fn winner(c: &Config, r: &SignalResults) -> Option<String> {
    select(&c.decisions, c.strategy, r).winner.map(|d| d.name.clone())
}

#[test]
fn priority_then_confidence_then_config_order() {
    let r = results(&[("a", true, 0.5), ("b", true, 0.9), ("c", true, 0.9)]);
    let mut c = config(json!({"decisions": [
        {"name": "low_sure", "priority": 1, "rules": leaf("b")},
        {"name": "high_unsure", "priority": 5, "rules": leaf("a")},
        {"name": "default"}
    ]}));
    assert_eq!(winner(&c, &r).as_deref(), Some("high_unsure"));
    c.strategy = Strategy::Confidence;
    assert_eq!(winner(&c, &r).as_deref(), Some("low_sure"));
    let c = config(json!({"decisions": [
        {"name": "first", "priority": 3, "rules": leaf("b")},
        {"name": "second", "priority": 3, "rules": leaf("c")},
        {"name": "unsure", "priority": 3, "rules": leaf("a")}
    ]}));
    assert_eq!(winner(&c, &r).as_deref(), Some("first"));
    let c = config(json!({"strategy": "confidence", "decisions": [
        {"name": "p1", "priority": 1, "rules": leaf("b")},
        {"name": "p2", "priority": 2, "rules": leaf("c")}
    ]}));
    assert_eq!(winner(&c, &r).as_deref(), Some("p2"), "equal confidence falls back to priority");
}

#[test]
fn tier_comes_first_and_untiered_decisions_rank_last() {
    let r = results(&[("a", true, 1.0), ("b", true, 1.0)]);
    let c = config(json!({"decisions": [
        {"name": "top_priority", "priority": 100, "rules": leaf("a")},
        {"name": "tier2", "tier": 2, "rules": leaf("a")},
        {"name": "tier1", "tier": 1, "priority": -5, "rules": leaf("b")}
    ]}));
    assert_eq!(winner(&c, &r).as_deref(), Some("tier1"));
    let r = results(&[("a", true, 1.0), ("b", false, 1.0)]);
    assert_eq!(winner(&c, &r).as_deref(), Some("tier2"));
    let c = config(json!({"decisions": [
        {"name": "t1_low", "tier": 1, "priority": 1, "rules": leaf("a")},
        {"name": "t1_high", "tier": 1, "priority": 9, "rules": leaf("a")}
    ]}));
    assert_eq!(winner(&c, &r).as_deref(), Some("t1_high"), "within a tier the strategy decides");
}

#[test]
fn the_catch_all_wins_only_when_nothing_else_matches() {
    let c = config(json!({"decisions": [
        {"name": "default"},
        {"name": "math", "rules": leaf("a")}
    ]}));
    let s = select(&c.decisions, c.strategy, &results(&[("a", true, 1.0)]));
    assert_eq!((s.winner.map(|d| d.name.as_str()), s.winner_index), (Some("math"), Some(1)));
    let s = select(&c.decisions, c.strategy, &results(&[("a", false, 1.0)]));
    assert_eq!(s.winner_index, Some(0));
    assert_eq!(
        s.trace,
        [
            DecisionTrace { name: "default".into(), matched: true, confidence: 0.0, failed: None },
            DecisionTrace { name: "math".into(), matched: false, confidence: 0.0, failed: Some("keyword:a".into()) },
        ]
    );
    let c = config(json!({"decisions": [{"name": "math", "rules": leaf("a")}]}));
    let s = select(&c.decisions, c.strategy, &results(&[("a", false, 1.0)]));
    assert_eq!((s.winner, s.winner_index, s.trace.len()), (None, None, 1));
}

#[test]
fn needed_signals_skip_decisions_a_catch_all_always_beats() {
    let c = config(json!({"decisions": [
        {"name": "above", "priority": 10, "rules": leaf("a")},
        {"name": "equal", "priority": 5, "rules": {"operator": "NOT", "conditions": [leaf("b")]}},
        {"name": "default", "priority": 5},
        {"name": "below", "priority": 1, "rules": leaf("c")},
        {"name": "tiered", "tier": 3, "rules": leaf("d")}
    ]}));
    let names = |set: HashSet<SignalRef>| {
        let mut v: Vec<String> = set.into_iter().map(|s| s.name).collect();
        v.sort();
        v
    };
    assert_eq!(names(needed_signals(&c.decisions, Strategy::Priority)), ["a", "b", "d"]);
    assert_eq!(names(needed_signals(&c.decisions, Strategy::Confidence)), ["a", "b", "c", "d"]);
    let c = config(json!({"decisions": [
        {"name": "default", "tier": 1},
        {"name": "later", "tier": 2, "rules": leaf("a")},
        {"name": "untiered", "priority": 99, "rules": leaf("b")},
        {"name": "same", "tier": 1, "rules": leaf("c")}
    ]}));
    assert_eq!(names(needed_signals(&c.decisions, Strategy::Confidence)), ["c"]);
}
