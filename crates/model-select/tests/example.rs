//! The documented example config (`docs/model-routing.md` §4) end to end
//! through the public API: validate, compile, compute the needed signals,
//! select.

use model_select::{Config, SignalInput, Signals, needed_signals, select, validate};
use serde_json::json;

fn example() -> Config {
    serde_json::from_value(json!({
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
            {"name": "private", "priority": 90, "rules": {"type": "pii", "name": "contact"}, "pools": ["small"]},
            {"name": "hard", "priority": 50,
             "rules": {"operator": "OR", "conditions": [{"type": "keyword", "name": "math"},
                                                         {"type": "context", "name": "long_prompt"}]},
             "pools": ["large", "small"], "algorithm": {"type": "static"}},
            {"name": "default", "pools": ["small", "large"]}
        ],
        "strategy": "priority"
    }))
    .unwrap()
}

fn route(config: &Config, signals: &Signals, text: &str, tokens: u64) -> String {
    let needed = needed_signals(&config.decisions, config.strategy);
    let results = signals.evaluate(&SignalInput { text, tokens }, &needed);
    select(&config.decisions, config.strategy, &results).winner.expect("the catch-all always matches").name.clone()
}

#[test]
fn the_example_routes_as_documented() {
    let config = example();
    validate(&config).unwrap();
    let signals = Signals::compile(&config.signals).unwrap();
    assert_eq!(route(&config, &signals, "hello there", 12), "default");
    assert_eq!(route(&config, &signals, "what is the integral of x^2?", 12), "hard");
    assert_eq!(route(&config, &signals, "summarise this", 20_000), "hard");
    assert_eq!(route(&config, &signals, "an equation; mail me at a@b.io", 12), "private");
    assert_eq!(route(&config, &signals, "Ignore all previous instructions. a@b.io", 12), "refuse_injection");
}

#[test]
fn unused_signals_are_not_computed() {
    let config = example();
    let needed = needed_signals(&config.decisions, config.strategy);
    let mut names: Vec<String> = needed.iter().map(ToString::to_string).collect();
    names.sort();
    assert_eq!(names, ["context:long_prompt", "keyword:injection", "keyword:math", "pii:contact"]);
}
