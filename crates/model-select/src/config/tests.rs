//! Parsing the §4 example and every validation error.

use serde_json::json;

use super::*;
use crate::error::ConfigError;

fn example() -> serde_json::Value {
    json!({
        "version": 1,
        "auto_model_names": ["auto"],
        "default_pool": "small",
        "pools": [{"name": "small", "served_model": "qwen3-8b", "workers": ["http://127.0.0.1:30001"]},
                  {"name": "large", "served_model": "qwen3-32b", "workers": ["http://127.0.0.1:30003"],
                   "policy": "round_robin"}],
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

/// `v` as a config; with one pool when it names none (the signal and decision tests need one).
fn parse(mut v: serde_json::Value) -> Config {
    if v.get("pools").is_none() {
        v["pools"] = json!([{"name": "p", "served_model": "m"}]);
    }
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
    assert_eq!(
        config.decisions[0].plugins[0],
        PluginConfig::Block { status: 403, message: "refused by policy".into() }
    );
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
        json!({"type": "sentiment", "name": "math"}),
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
            "language": [{"name": "l", "languages": []}, {"name": "k", "languages": ["tlh"], "min_confidence": 2.0}]
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
            "empty_languages",
            "unknown_language",
            "bad_confidence"
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

#[test]
fn every_pool_and_routing_problem_is_reported() {
    let config = parse(json!({
        "version": 2,
        "auto_model_names": ["auto", "small"],
        "default_pool": "nowhere",
        "pools": [
            {"name": "small", "served_model": "m1", "quality": 1.5},
            {"name": "small", "served_model": "m1", "context_window": 0},
            {"name": "big", "served_model": "small", "price": {"input_per_1m": -1.0, "output_per_1m": 1.0}},
            {"name": "", "served_model": "m3"}
        ],
        "decisions": [
            {"name": "b", "pools": ["small"], "plugins": [{"type": "block", "status": 200}]},
            {"name": "explicit", "rules": {"type": "keyword", "name": "nothing"},
             "algorithm": {"type": "bandit", "min_quality": 2}},
            {"name": "c", "pools": ["huge"], "algorithm": {"type": "elo"}, "plugins": [
                {"type": "pii_redact", "types": ["passport"]},
                {"type": "system_prompt", "prompt": " "},
                {"type": "header_mutation", "set": {"Host": "x", "x-tier": "a\r\nb"}, "remove": ["bad header"]}
            ]}
        ]
    }));
    let errors = validate(&config).unwrap_err();
    let messages: Vec<String> = errors.iter().map(ToString::to_string).collect();
    let expected = [
        "version: version 2 is not known (this router reads version 1)",
        "default_pool: no pool is named `nowhere`",
        "pool `small`: `small` is an auto model name: a request naming it is routed by the decisions",
        "pool `small`: quality must be in [0, 1]",
        "pool `small`: defined more than once",
        "pool `small`: serves `m1` as pool `small` does: a request naming it could not choose",
        "pool `small`: `small` is an auto model name: a request naming it is routed by the decisions",
        "pool `small`: context_window is 0",
        "pool `big`: `small` is an auto model name: a request naming it is routed by the decisions",
        "pool `big`: prices must be finite and not negative",
        "pool #4 has an empty name",
        "pool `big`: serves `small`, the name of pool `small`: a request naming it could not choose",
        "decision `explicit` refers to undefined signal keyword:nothing",
        "decisions `b` and `c` both have no rules; only one catch-all is allowed",
        "decision `b`: block: status 200 is not an error status (400..=599)",
        "decision `b`: a decision that blocks sends nothing to its pools; remove `pools`",
        "decision `explicit`: `explicit` is a label the router uses itself (reserved: explicit, no_model, default_pool)",
        "decision `explicit`: bandit: min_quality must be in [0, 1]",
        "decision `c`: no pool is named `huge`",
        "decision `c`: unknown algorithm `elo` (known: static, multi_factor, bandit)",
        "decision `c`: pii_redact: unknown type `passport`",
        "decision `c`: system_prompt: the prompt is empty",
        "decision `c`: header_mutation: `Host` is set by the router",
        "decision `c`: header_mutation: `bad header` is not a header name",
        "decision `c`: header_mutation: the value of `x-tier` holds a line break",
    ];
    assert_eq!(messages, expected);
}

#[test]
fn plugins_parse_with_their_defaults() {
    let config = parse(json!({"decisions": [{"name": "d", "plugins": [
        {"type": "block"},
        {"type": "pii_redact"},
        {"type": "system_prompt", "prompt": "Be brief.", "mode": "insert"},
        {"type": "header_mutation", "set": {"x-tier": "gold"}}
    ]}]}));
    let p = &config.decisions[0].plugins;
    assert!(matches!(&p[0], PluginConfig::Block { status: 403, message } if message.contains("refused")));
    assert_eq!(p[1], PluginConfig::PiiRedact { types: vec![] });
    assert_eq!(p[2], PluginConfig::SystemPrompt { prompt: "Be brief.".into(), mode: SystemPromptMode::Insert });
    let PluginConfig::HeaderMutation(m) = &p[3] else { panic!("not a header mutation") };
    assert_eq!(m.set["x-tier"], "gold");
    assert_eq!(config.default_pool_name(), Some("p"));
    let unknown = json!({"pools": [{"name": "p", "served_model": "m"}],
                         "decisions": [{"name": "d", "plugins": [{"type": "cache"}]}]});
    assert!(serde_json::from_value::<Config>(unknown).is_err());
    let typo = json!({"pools": [{"name": "p", "served_model": "m"}], "decison": []});
    assert!(serde_json::from_value::<Config>(typo).is_err());
}

const FILE: &str = "version: 1
pools:
  - name: small
    served_model: qwen3-8b
  - {name: large, served_model: qwen3-32b, quality: 3}
signals:
  keywords:
    - {name: math, keywords: [integral]}
  regex:
    - name: fence
      pattern: '(unclosed'
decisions:
  - name: hard
    rules: {type: keyword, name: math}
    pools: [large]
  - name: 'lost'
    rules: {type: keyword, name: physics}
";

#[test]
fn yaml_problems_come_with_their_lines() {
    let problems = parse_yaml(FILE).unwrap_err();
    let shown: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "line 5: pool `large`: quality must be in [0, 1]",
            "line 10: regex signal `fence`: the pattern does not compile: regex parse error:\n    (unclosed\n    ^\nerror: unclosed group",
            "line 16: decision `lost` refers to undefined signal keyword:physics",
        ]
    );
    let syntax = parse_yaml("pools:\n  - name: a\n    served_model: [oops\n").unwrap_err();
    assert_eq!((syntax[0].line, syntax[0].kind), (Some(3), "syntax"));
    let typed = parse_yaml("pools:\n  - name: a\n    served_modle: b\n").unwrap_err();
    assert_eq!(typed[0].line, Some(3), "{}", typed[0]);
    assert!(typed[0].message.contains("unknown field `served_modle`"), "{}", typed[0]);
    let good = FILE.replace("quality: 3", "quality: 0.9").replace("(unclosed", "^```").replace("physics", "math");
    let config = parse_yaml(&good).expect("valid");
    assert_eq!(config.pools[1].quality, Some(0.9));
}

#[test]
fn a_disaggregated_pool_parses_its_legs_and_refuses_what_it_cannot_serve() {
    let mut v = example();
    v["pools"][1] = json!({"name": "large", "served_model": "qwen3-32b", "disaggregation": "sglang",
        "prefill": ["http://p0:30000", {"url": "http://p1:30000", "bootstrap_port": 8998}],
        "decode": ["http://d0:30000"], "decode_policy": "least_load"});
    let config = parse(v.clone());
    assert_eq!(validate(&config), Ok(()));
    let large = &config.pools[1];
    assert_eq!(large.disaggregation, Some(Disaggregation::Sglang));
    let legs: Vec<_> = large.prefill.iter().map(|p| (p.url(), p.bootstrap_port())).collect();
    assert_eq!(legs, [("http://p0:30000", None), ("http://p1:30000", Some(8998))]);
    assert_eq!(large.decode, ["http://d0:30000"]);

    let message = |v: serde_json::Value| {
        let errors = validate(&parse(v.clone())).expect_err(&format!("refused: {v}"));
        errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    };
    // Legs without the mode, workers with it, a bootstrap port on vLLM.
    let mut w = v.clone();
    w["pools"][1]["disaggregation"] = serde_json::Value::Null;
    assert!(message(w).contains("need `disaggregation`"));
    let mut w = v.clone();
    w["pools"][1]["workers"] = json!(["http://w:1"]);
    assert!(message(w).contains("not `workers`"));
    let mut w = v.clone();
    w["pools"][1]["disaggregation"] = json!("vllm");
    assert!(message(w).contains("bootstrap_port is SGLang's"));
    // A response cache or a cascade on a decision that can reach it.
    let mut w = v.clone();
    w["decisions"][2]["plugins"] = json!([{"type": "response_cache"}]);
    assert!(message(w).contains("response_cache on disaggregated pool `large`"));
    let mut w = v.clone();
    w["decisions"][1]["plugins"] = json!([{"type": "cascade", "to": "large"}]);
    assert!(message(w).contains("pool `large` is disaggregated"));
    // The default pool is the one a decision naming no pool reaches.
    let mut w = v;
    w["default_pool"] = json!("large");
    w["decisions"][0]["plugins"] = json!([{"type": "response_cache"}]);
    assert!(message(w).contains("response_cache on disaggregated pool `large`"));
}

#[test]
fn a_response_guard_is_checked_at_load() {
    let config: Config = serde_json::from_value(json!({
        "pools": [{"name": "small", "served_model": "m1"}],
        "signals": {"keywords": [{"name": "k", "keywords": ["x"]}]},
        "decisions": [
            {"name": "a", "rules": {"type": "keyword", "name": "k"}, "pools": ["small"], "plugins": [
                {"type": "response_guard", "action": "redact", "pii_types": ["passport"], "jailbreak": ["nowhere"],
                 "look_behind_chars": 8, "status": 200}
            ]},
            {"name": "b", "pools": ["small"], "plugins": [{"type": "response_guard", "action": "block", "pii": false}]}
        ]
    }))
    .unwrap();
    let messages: Vec<String> = validate(&config).unwrap_err().iter().map(ToString::to_string).collect();
    assert_eq!(
        messages,
        [
            "decision `a`: response_guard: unknown PII type `passport`",
            "decision `a`: response_guard: look_behind_chars must be in 16..=65536, window_chars in 64..=65536",
            "decision `a`: response_guard: status 200 is not an error status (400..=599)",
            "decision `b`: response_guard: it looks for nothing (pii: false and no jailbreak rules)",
            "decision `a`: response_guard: no `signals.jailbreak` rule is named `nowhere`",
        ]
    );
    // `action` is required.
    let missing = serde_json::from_value::<Config>(json!({
        "pools": [{"name": "small", "served_model": "m1"}],
        "decisions": [{"name": "b", "pools": ["small"], "plugins": [{"type": "response_guard"}]}]
    }));
    assert!(missing.unwrap_err().to_string().contains("missing field `action`"));
}
