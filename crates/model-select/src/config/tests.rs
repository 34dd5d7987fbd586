//! Parsing the §4 example and every validation error.

use serde_json::json;

use super::*;
use crate::error::ConfigError;

fn example() -> serde_json::Value {
    json!({
        "version": 1,
        "auto_model_names": ["auto"],
        "default_pool": "small",
        "pools": [{"name": "small", "served_model": "qwen3-8b", "workers": ["http://127.0.0.1:30001"]}],
        "signals": {
            "keywords": [
                {"name": "math", "operator": "OR", "keywords": ["integral", "derivative", "equation", "theorem"]},
                {"name": "injection", "operator": "OR", "keywords": ["ignore all previous instructions"]}
            ],
            "regex": [{"name": "code_block", "pattern": "(?m)^```"}],
            "pii": [{"name": "contact", "types": ["email", "phone"]}],
            "context": [{"name": "long_prompt", "min_tokens": 16000}],
            "language": [{"name": "chinese", "languages": ["zh"]}]
        },
        "decisions": [
            {"name": "refuse_injection", "priority": 100, "rules": {"type": "keyword", "name": "injection"},
             "plugins": [{"type": "block", "status": 403, "message": "refused by policy"}]},
            {"name": "private", "priority": 90, "rules": {"type": "pii", "name": "contact"}, "pools": ["small"],
             "plugins": [{"type": "pii_redact", "types": ["email", "phone"]}]},
            {"name": "hard", "priority": 50,
             "rules": {"operator": "OR", "conditions": [{"type": "keyword", "name": "math"},
                                                         {"type": "context", "name": "long_prompt"}]},
             "pools": ["large", "small"], "algorithm": {"type": "static"}},
            {"name": "default", "pools": ["small", "large"]}
        ],
        "strategy": "priority"
    })
}

fn parse(v: serde_json::Value) -> Config {
    serde_json::from_value(v).expect("parses")
}

fn kinds(config: &Config) -> Vec<&'static str> {
    validate(config).err().unwrap_or_default().iter().map(ConfigError::kind).collect()
}

#[test]
fn the_documented_example_parses_and_validates() {
    let config = parse(example());
    assert_eq!(validate(&config), Ok(()));
    assert_eq!(config.signals.keywords[0].operator, KeywordOperator::Or);
    assert!(!config.signals.keywords[0].case_sensitive);
    assert_eq!(config.signals.context[0].min_tokens, Some(16000));
    assert_eq!(config.decisions[3].priority, 0);
    assert!(config.decisions[3].is_catch_all());
    assert_eq!(config.decisions[2].algorithm.as_ref().map(|a| a.kind.as_str()), Some("static"));
    assert_eq!(config.decisions[0].plugins[0]["status"], 403);
    assert_eq!(config.strategy, Strategy::Priority);
    let refs: Vec<String> = config.decisions[2].signal_refs().iter().map(|r| r.to_string()).collect();
    assert_eq!(refs, ["keyword:math", "context:long_prompt"]);
}

#[test]
fn rule_nodes_parse_leaves_with_bounds_and_nested_composites() {
    let node: RuleNode = serde_json::from_value(json!({"operator": "AND", "conditions": [
        {"type": "pii", "name": "contact", "gte": 2},
        {"operator": "NOT", "conditions": [{"type": "keyword", "name": "math"}]}
    ]}))
    .unwrap();
    let RuleNode::Composite { operator: RuleOperator::And, conditions } = node else { panic!("not an AND") };
    assert_eq!(
        conditions[0],
        RuleNode::Signal(SignalCondition {
            signal: SignalRef::new(SignalKind::Pii, "contact"),
            bounds: Bounds { gte: Some(2.0), ..Bounds::default() }
        })
    );
    assert!(
        matches!(&conditions[1], RuleNode::Composite { operator: RuleOperator::Not, conditions } if conditions.len() == 1)
    );
}

#[test]
fn malformed_nodes_and_unknown_keys_are_parse_errors() {
    for bad in [
        json!({"type": "keyword", "name": "x", "operator": "AND"}),
        json!({"type": "keyword"}),
        json!({"operator": "AND", "conditions": [], "gt": 1}),
        json!({"type": "domain", "name": "math"}),
        json!({"type": "keyword", "name": "x", "typo": 1}),
    ] {
        assert!(serde_json::from_value::<RuleNode>(bad.clone()).is_err(), "{bad}");
    }
    let mut v = example();
    v["signals"]["keywords"][0]["case_sensitve"] = json!(true);
    assert!(serde_json::from_value::<Config>(v).is_err());
    let mut v = example();
    v["strategy"] = json!("random");
    assert!(serde_json::from_value::<Config>(v).is_err());
}

#[test]
fn bounds_hold_and_display() {
    let b = Bounds { gt: Some(1.0), lte: Some(3.0), ..Bounds::default() };
    assert!(!b.holds(1.0) && b.holds(2.0) && b.holds(3.0) && !b.holds(3.5));
    assert_eq!(b.to_string(), "> 1 and <= 3");
    assert!(Bounds::default().is_empty() && Bounds::default().holds(-1.0));
}

#[test]
fn every_signal_problem_is_reported() {
    let config = parse(json!({
        "signals": {
            "keywords": [
                {"name": "a", "keywords": []},
                {"name": "b", "keywords": ["ok", "  "]},
                {"name": "b", "keywords": ["dup"]},
                {"name": "", "keywords": ["x"]}
            ],
            "regex": [{"name": "r", "pattern": "(unclosed"}],
            "pii": [{"name": "p", "types": ["email", "passport"]}, {"name": "q", "types": []}],
            "context": [{"name": "c1"}, {"name": "c2", "min_tokens": 10, "max_tokens": 5}],
            "language": [{"name": "l", "languages": []}]
        }
    }));
    assert_eq!(
        kinds(&config),
        [
            "empty_keywords",
            "blank_keyword",
            "duplicate_signal",
            "empty_name",
            "bad_regex",
            "unknown_pii_type",
            "empty_pii_types",
            "bad_context_bounds",
            "bad_context_bounds",
            "empty_languages"
        ]
    );
    let errors = validate(&config).unwrap_err();
    assert_eq!(errors[5], ConfigError::UnknownPiiType { name: "p".into(), ty: "passport".into() });
    assert!(errors[4].to_string().contains("regex signal `r`"), "{}", errors[4]);
}

#[test]
fn the_same_name_under_two_types_is_fine() {
    let config = parse(json!({"signals": {
        "keywords": [{"name": "x", "keywords": ["a"]}],
        "regex": [{"name": "x", "pattern": "a"}]
    }}));
    assert_eq!(validate(&config), Ok(()));
}

#[test]
fn every_decision_problem_is_reported() {
    let config = parse(json!({
        "signals": {"keywords": [{"name": "math", "keywords": ["integral"]}]},
        "decisions": [
            {"name": "d1", "rules": {"type": "keyword", "name": "physics"}},
            {"name": "d1", "rules": {"type": "regex", "name": "math"}},
            {"name": "d2", "rules": {"operator": "AND", "conditions": [
                {"type": "keyword", "name": "math"},
                {"operator": "NOT", "conditions": [{"type": "keyword", "name": "math"}, {"type": "keyword", "name": "math"}]}
            ]}},
            {"name": "d3", "rules": {"operator": "OR", "conditions": []}},
            {"name": "d4", "rules": {"operator": "NOT"}},
            {"name": "all1"},
            {"name": "all2"},
            {"name": ""}
        ]
    }));
    let errors = validate(&config).unwrap_err();
    let kinds: Vec<_> = errors.iter().map(ConfigError::kind).collect();
    assert_eq!(
        kinds,
        [
            "unknown_signal",
            "duplicate_decision",
            "unknown_signal",
            "not_arity",
            "empty_conditions",
            "not_arity",
            "multiple_catch_all",
            "empty_name",
            "multiple_catch_all"
        ]
    );
    assert_eq!(errors[0].to_string(), "decision `d1` refers to undefined signal keyword:physics");
    assert_eq!(errors[3], ConfigError::NotArity { decision: "d2".into(), path: "AND[1]".into(), children: 2 });
    assert_eq!(errors[5], ConfigError::NotArity { decision: "d4".into(), path: "root".into(), children: 0 });
    assert_eq!(errors[6], ConfigError::MultipleCatchAll { first: "all1".into(), second: "all2".into() });
}
