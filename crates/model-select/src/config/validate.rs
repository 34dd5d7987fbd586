//! Whole-config checks that serde cannot express: names, references,
//! arities, patterns. Reports every problem, not just the first.

use std::collections::HashSet;

use super::{Config, DecisionConfig, Disaggregation, PluginConfig, RuleNode, RuleOperator, SignalKind, SignalRef};
use crate::error::ConfigError;
use crate::pii::PiiType;
use crate::signals::{compile_keywords, compile_regex};

/// The algorithms a decision may name.
pub const ALGORITHMS: [&str; 3] = ["static", "multi_factor", "bandit"];

/// Request headers a `header_mutation` plugin may not touch: the router
/// sets them (the workers' credentials, the request id, the rank hint), or
/// they describe the hop, not the request.
const RESERVED_HEADERS: [&str; 11] = [
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "te",
    "upgrade",
    "expect",
    "authorization",
    "x-request-id",
    "x-data-parallel-rank",
];

/// Decision labels the router uses itself (`x-route-decision`, metrics).
pub const RESERVED_DECISIONS: [&str; 3] = ["explicit", "no_model", "default_pool"];

/// Checks `config`; `Err` holds every problem found, in config order.
///
/// Policy names and tokenizer paths are not checked here: their owner (the
/// router) knows which exist.
pub fn validate(config: &Config) -> Result<(), Vec<ConfigError>> {
    let mut errors = Vec::new();
    check_top(config, &mut errors);
    let pools = check_pools(config, &mut errors);
    let defined = check_signals(config, &mut errors);
    check_decisions(&config.decisions, &defined, &mut errors);
    for d in &config.decisions {
        check_routing(d, &pools, &mut errors);
    }
    check_disaggregated(config, &mut errors);
    check_fit_context(config, &mut errors);
    check_guard_rules(config, &mut errors);
    if errors.is_empty() { Ok(()) } else { Err(errors) }
}

fn check_top(config: &Config, errors: &mut Vec<ConfigError>) {
    if config.version != 1 {
        let message = format!("version {} is not known (this router reads version 1)", config.version);
        errors.push(ConfigError::TopLevel { key: "version", message });
    }
    let st = &config.stickiness;
    if st.max_sessions == 0 || st.reprefill_tokens_per_point == 0 || st.ttl_secs == 0 {
        let message = "max_sessions, reprefill_tokens_per_point and ttl_secs must be positive".into();
        errors.push(ConfigError::TopLevel { key: "stickiness", message });
    }
    if config.pools.is_empty() {
        errors.push(ConfigError::TopLevel { key: "pools", message: "at least one pool is needed".into() });
    }
    if config.auto_model_names.iter().any(|n| n.trim().is_empty()) {
        errors.push(ConfigError::TopLevel { key: "auto_model_names", message: "an auto name is empty".into() });
    }
    if let Some(d) = &config.default_pool
        && !config.pools.iter().any(|p| &p.name == d)
    {
        errors.push(ConfigError::TopLevel { key: "default_pool", message: format!("no pool is named `{d}`") });
    }
}

/// Checks each pool; returns the pool names.
fn check_pools<'c>(config: &'c Config, errors: &mut Vec<ConfigError>) -> HashSet<&'c str> {
    let mut names = HashSet::new();
    let mut served: Vec<(&str, &str)> = Vec::new();
    for (i, p) in config.pools.iter().enumerate() {
        let mut bad = |message: String| errors.push(ConfigError::Pool { pool: p.name.clone(), message });
        if p.name.trim().is_empty() {
            errors.push(ConfigError::EmptyName { what: format!("pool #{}", i + 1) });
            continue;
        }
        if !names.insert(p.name.as_str()) {
            bad("defined more than once".into());
        }
        if p.served_model.trim().is_empty() {
            bad("served_model is empty".into());
        }
        if let Some((other, _)) = served.iter().find(|(_, m)| *m == p.served_model) {
            bad(format!("serves `{}` as pool `{other}` does: a request naming it could not choose", p.served_model));
        }
        served.push((&p.name, &p.served_model));
        for auto in config.auto_model_names.iter().filter(|a| **a == p.name || **a == p.served_model) {
            bad(format!("`{auto}` is an auto model name: a request naming it is routed by the decisions"));
        }
        if p.context_window == Some(0) {
            bad("context_window is 0".into());
        }
        if p.prefill_tokens_per_s.is_some_and(|r| !r.is_finite() || r <= 0.0) {
            bad("prefill_tokens_per_s must be a positive number".into());
        }
        if p.quality.is_some_and(|q| !(0.0..=1.0).contains(&q)) {
            bad("quality must be in [0, 1]".into());
        }
        match p.disaggregation {
            None if !p.prefill.is_empty() || !p.decode.is_empty() || p.decode_policy.is_some() => {
                bad("prefill, decode and decode_policy need `disaggregation` (sglang, vllm or mooncake)".into())
            }
            Some(d) if !p.workers.is_empty() => {
                bad(format!("a disaggregated pool ({}) has prefill and decode workers, not `workers`", d.as_str()))
            }
            Some(Disaggregation::Vllm | Disaggregation::Mooncake)
                if p.prefill.iter().any(|w| w.bootstrap_port().is_some()) =>
            {
                bad("bootstrap_port is SGLang's: a vLLM prefill worker has none".into())
            }
            _ => {}
        }
        if let Some(price) = p.price {
            let all = [Some(price.input_per_1m), price.cached_input_per_1m, Some(price.output_per_1m)];
            if all.into_iter().flatten().any(|v| !v.is_finite() || v < 0.0) {
                bad("prices must be finite and not negative".into());
            }
        }
    }
    // A pool's served model may equal another pool's name only if it is that pool.
    for p in &config.pools {
        if let Some(other) = config.pools.iter().find(|o| o.name == p.served_model && o.name != p.name) {
            let message = format!(
                "serves `{}`, the name of pool `{}`: a request naming it could not choose",
                p.served_model, other.name
            );
            errors.push(ConfigError::Pool { pool: p.name.clone(), message });
        }
    }
    names
}

/// The plugins a disaggregated pool cannot serve, refused with the reason: a
/// disaggregated answer is the decode leg's stream, relayed as it comes; the
/// response cache and the cascade's judge read a single worker's whole answer.
fn check_disaggregated(config: &Config, errors: &mut Vec<ConfigError>) {
    let split = |name: &str| config.pools.iter().any(|p| p.name == name && p.disaggregation.is_some());
    for d in &config.decisions {
        for c in d.plugins.iter().filter_map(|p| if let PluginConfig::Cascade(c) = p { Some(c) } else { None }) {
            if split(&c.to) {
                let message =
                    format!("cascade: pool `{}` is disaggregated; a cascade escalates to a single worker", c.to);
                errors.push(ConfigError::Decision { decision: d.name.clone(), message });
            }
        }
        let default = config.default_pool_name().into_iter().filter(|_| d.pools.is_empty());
        let Some(pool) = d.pools.iter().map(String::as_str).chain(default).find(|p| split(p)) else { continue };
        for plugin in &d.plugins {
            let name = match plugin {
                PluginConfig::ResponseCache(_) => "response_cache",
                PluginConfig::Cascade(_) => "cascade",
                _ => continue,
            };
            let message = format!(
                "{name} on disaggregated pool `{pool}`: it reads one worker's whole answer, and a disaggregated \
                 answer is the decode leg's stream"
            );
            errors.push(ConfigError::Decision { decision: d.name.clone(), message });
        }
    }
}

/// `fit_context` cuts a chat to its pool's `context_window`: a decision none of whose pools
/// has one would never cut anything.
fn check_fit_context(config: &Config, errors: &mut Vec<ConfigError>) {
    let window = |name: &str| config.pools.iter().any(|p| p.name == name && p.context_window.is_some());
    for d in config.decisions.iter().filter(|d| d.plugins.iter().any(|p| matches!(p, PluginConfig::FitContext {}))) {
        let default = config.default_pool_name().into_iter().filter(|_| d.pools.is_empty());
        if !d.pools.iter().map(String::as_str).chain(default).any(window) {
            let message = "fit_context: none of its pools has a context_window to fit the chat to".to_owned();
            errors.push(ConfigError::Decision { decision: d.name.clone(), message });
        }
    }
}

/// A `response_guard`'s jailbreak rules are the config's.
fn check_guard_rules(config: &Config, errors: &mut Vec<ConfigError>) {
    for d in &config.decisions {
        for p in &d.plugins {
            let PluginConfig::ResponseGuard(g) = p else { continue };
            for name in g.jailbreak.iter().filter(|n| !config.signals.jailbreak.iter().any(|r| &r.name == *n)) {
                let message = format!("response_guard: no `signals.jailbreak` rule is named `{name}`");
                errors.push(ConfigError::Decision { decision: d.name.clone(), message });
            }
        }
    }
}

/// A decision's pools, algorithm and plugins.
fn check_routing(d: &DecisionConfig, pools: &HashSet<&str>, errors: &mut Vec<ConfigError>) {
    let mut bad = |message: String| errors.push(ConfigError::Decision { decision: d.name.clone(), message });
    if RESERVED_DECISIONS.contains(&d.name.as_str()) {
        bad(format!("`{}` is a label the router uses itself (reserved: {})", d.name, RESERVED_DECISIONS.join(", ")));
    }
    for p in d.pools.iter().filter(|p| !pools.contains(p.as_str())) {
        bad(format!("no pool is named `{p}`"));
    }
    if let Some(a) = &d.algorithm {
        match a.kind.as_str() {
            "static" if !a.params.is_empty() => bad("the static algorithm takes no parameters".into()),
            "bandit" => {
                if let Err(e) = crate::algorithm::Bandit::from_params(&a.params) {
                    bad(format!("bandit: {e}"));
                }
            }
            "multi_factor" => {
                if let Err(e) = crate::algorithm::MultiFactor::from_params(&a.params) {
                    bad(format!("multi_factor: {e}"));
                }
            }
            k if !ALGORITHMS.contains(&k) => bad(format!("unknown algorithm `{k}` (known: {})", ALGORITHMS.join(", "))),
            _ => {}
        }
    }
    for plugin in &d.plugins {
        match plugin {
            PluginConfig::Block { status, .. } if !(400..=599).contains(status) => {
                bad(format!("block: status {status} is not an error status (400..=599)"))
            }
            PluginConfig::PiiRedact { types } => {
                for ty in types.iter().filter(|t| PiiType::parse(t).is_none()) {
                    bad(format!("pii_redact: unknown type `{ty}`"));
                }
            }
            PluginConfig::SystemPrompt { prompt, .. } if prompt.trim().is_empty() => {
                bad("system_prompt: the prompt is empty".into())
            }
            PluginConfig::ResponseCache(c) => {
                if !(0.0..=1.0).contains(&c.threshold) {
                    bad("response_cache: threshold must be in [0, 1]".into());
                }
                if c.ttl_secs == 0 || c.max_entries == 0 || c.max_answer_bytes == 0 || c.max_bytes == 0 {
                    bad("response_cache: ttl_secs, max_entries, max_answer_bytes and max_bytes must be above 0".into());
                }
                if c.max_entries > 1_000_000 {
                    bad("response_cache: max_entries is at most 1,000,000".into());
                }
            }
            PluginConfig::FitContext {} => {}
            PluginConfig::ResponseGuard(g) => {
                for ty in g.pii_types.iter().filter(|t| PiiType::parse(t).is_none()) {
                    bad(format!("response_guard: unknown PII type `{ty}`"));
                }
                if !g.pii && g.jailbreak.is_empty() {
                    bad("response_guard: it looks for nothing (pii: false and no jailbreak rules)".into());
                }
                if !(16..=65_536).contains(&g.look_behind_chars) || !(64..=65_536).contains(&g.window_chars) {
                    bad("response_guard: look_behind_chars must be in 16..=65536, window_chars in 64..=65536".into());
                }
                if g.max_answer_bytes == 0 {
                    bad("response_guard: max_answer_bytes must be above 0".into());
                }
                if !(400..=599).contains(&g.status) {
                    bad(format!("response_guard: status {} is not an error status (400..=599)", g.status));
                }
            }
            PluginConfig::Cascade(c) => {
                if !pools.contains(c.to.as_str()) {
                    bad(format!("cascade: no pool is named `{}`", c.to));
                }
                if !c.min_mean_logprob.is_finite() || c.min_mean_logprob > 0.0 {
                    bad("cascade: min_mean_logprob must be finite and at most 0".into());
                }
                if c.max_answer_bytes == 0 {
                    bad("cascade: max_answer_bytes must be above 0".into());
                }
            }
            PluginConfig::HeaderMutation(m) => {
                for name in m.set.keys().chain(&m.remove) {
                    if !is_token(name) {
                        bad(format!("header_mutation: `{name}` is not a header name"));
                    } else if RESERVED_HEADERS.iter().any(|r| r.eq_ignore_ascii_case(name)) {
                        bad(format!("header_mutation: `{name}` is set by the router"));
                    }
                }
                for (name, value) in &m.set {
                    if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
                        bad(format!("header_mutation: the value of `{name}` holds a line break"));
                    }
                }
            }
            _ => {}
        }
    }
    let blocks = d.plugins.iter().any(|p| matches!(p, PluginConfig::Block { .. }));
    if blocks && !d.pools.is_empty() {
        bad("a decision that blocks sends nothing to its pools; remove `pools`".into());
    }
}

/// An HTTP token (RFC 9110): a header name.
fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Checks each signal rule; returns the set of defined signals.
fn check_signals(config: &Config, errors: &mut Vec<ConfigError>) -> HashSet<SignalRef> {
    let s = &config.signals;
    let mut defined = HashSet::new();
    let mut define = |kind: SignalKind, i: usize, name: &str, errors: &mut Vec<ConfigError>| {
        if name.trim().is_empty() {
            errors.push(ConfigError::EmptyName { what: format!("{kind} signal #{}", i + 1) });
        } else if !defined.insert(SignalRef::new(kind, name)) {
            errors.push(ConfigError::DuplicateSignal { kind, name: name.to_owned() });
        }
    };
    for (i, rule) in s.keywords.iter().enumerate() {
        define(SignalKind::Keyword, i, &rule.name, errors);
        if rule.keywords.is_empty() {
            errors.push(ConfigError::EmptyKeywords { name: rule.name.clone() });
        } else if rule.keywords.iter().any(|k| k.trim().is_empty()) {
            errors.push(ConfigError::BlankKeyword { name: rule.name.clone() });
        } else if let Err(e) = compile_keywords(rule) {
            errors.push(e);
        }
    }
    for (i, rule) in s.regex.iter().enumerate() {
        define(SignalKind::Regex, i, &rule.name, errors);
        if let Err(e) = compile_regex(rule) {
            errors.push(e);
        }
    }
    for (i, rule) in s.pii.iter().enumerate() {
        define(SignalKind::Pii, i, &rule.name, errors);
        if rule.types.is_empty() {
            errors.push(ConfigError::EmptyPiiTypes { name: rule.name.clone() });
        }
        for ty in rule.types.iter().filter(|t| PiiType::parse(t).is_none()) {
            errors.push(ConfigError::UnknownPiiType { name: rule.name.clone(), ty: ty.clone() });
        }
    }
    for (i, rule) in s.context.iter().enumerate() {
        define(SignalKind::Context, i, &rule.name, errors);
        let reason = match (rule.min_tokens, rule.max_tokens) {
            (None, None) => Some("needs min_tokens or max_tokens"),
            (Some(min), Some(max)) if min > max => Some("min_tokens is above max_tokens"),
            _ => None,
        };
        if let Some(reason) = reason {
            errors.push(ConfigError::BadContextBounds { name: rule.name.clone(), reason });
        }
    }
    for (i, rule) in s.language.iter().enumerate() {
        define(SignalKind::Language, i, &rule.name, errors);
        if rule.languages.is_empty() {
            errors.push(ConfigError::EmptyLanguages { name: rule.name.clone() });
        }
        for code in rule.languages.iter().filter(|c| crate::language::normalize(c).is_none()) {
            errors.push(ConfigError::UnknownLanguage { name: rule.name.clone(), code: code.clone() });
        }
        if rule.min_confidence.is_some_and(|c| !(0.0..=1.0).contains(&c)) {
            errors.push(ConfigError::BadConfidence { name: rule.name.clone() });
        }
    }
    super::semantic::check(s, errors, &mut define);
    let pools: HashSet<&str> = config.pools.iter().map(|p| p.name.as_str()).collect();
    let bad = |errors: &mut Vec<ConfigError>, kind: SignalKind, name: &str, reason: &str| {
        errors.push(ConfigError::BadRule { kind, name: name.to_owned(), reason: reason.to_owned() })
    };
    for (i, r) in s.conversation.iter().enumerate() {
        define(SignalKind::Conversation, i, &r.name, errors);
        let set = [r.min_turns.is_some(), r.max_turns.is_some(), r.has_tools.is_some(), r.tool_loop.is_some()];
        if !set.contains(&true) && r.has_images.is_none() {
            bad(errors, SignalKind::Conversation, &r.name, "sets no condition");
        }
        if let (Some(min), Some(max)) = (r.min_turns, r.max_turns)
            && min > max
        {
            bad(errors, SignalKind::Conversation, &r.name, "min_turns is above max_turns");
        }
    }
    for (i, r) in s.headers.iter().enumerate() {
        define(SignalKind::Header, i, &r.name, errors);
        if !is_token(&r.header) {
            bad(errors, SignalKind::Header, &r.name, "`header` is not a header name");
        }
    }
    for (i, r) in s.load.iter().enumerate() {
        define(SignalKind::Load, i, &r.name, errors);
        if !pools.contains(r.pool.as_str()) {
            bad(errors, SignalKind::Load, &r.name, &format!("no pool is named `{}`", r.pool));
        }
        let bounds = [r.min_ttft_ms, r.max_ttft_ms];
        if r.min_in_flight.is_none() && r.max_in_flight.is_none() && bounds.iter().all(Option::is_none) {
            bad(errors, SignalKind::Load, &r.name, "sets no bound");
        }
        if bounds.iter().flatten().any(|b| !b.is_finite() || *b < 0.0) {
            bad(errors, SignalKind::Load, &r.name, "a TTFT bound must be a finite, non-negative number of ms");
        }
    }
    defined
}

fn check_decisions(decisions: &[DecisionConfig], defined: &HashSet<SignalRef>, errors: &mut Vec<ConfigError>) {
    let mut names = HashSet::new();
    let mut catch_all: Option<&str> = None;
    for (i, d) in decisions.iter().enumerate() {
        if d.name.trim().is_empty() {
            errors.push(ConfigError::EmptyName { what: format!("decision #{}", i + 1) });
        } else if !names.insert(d.name.as_str()) {
            errors.push(ConfigError::DuplicateDecision { name: d.name.clone() });
        }
        match &d.rules {
            None => match catch_all {
                Some(first) => {
                    errors.push(ConfigError::MultipleCatchAll { first: first.to_owned(), second: d.name.clone() })
                }
                None => catch_all = Some(d.name.as_str()),
            },
            Some(rules) => check_node(&d.name, rules, "", defined, errors),
        }
    }
}

/// `path` is the node's position, e.g. "AND[1] OR[0]" ("" for the root).
fn check_node(
    decision: &str,
    node: &RuleNode,
    path: &str,
    defined: &HashSet<SignalRef>,
    errors: &mut Vec<ConfigError>,
) {
    match node {
        RuleNode::Signal(c) if c.signal.kind == SignalKind::Failed => {
            if !c.signal.watched().is_some_and(|w| defined.contains(&w)) {
                errors.push(ConfigError::UnknownSignal { decision: decision.to_owned(), signal: c.signal.clone() });
            }
        }
        RuleNode::Signal(c) => {
            if !defined.contains(&c.signal) {
                errors.push(ConfigError::UnknownSignal { decision: decision.to_owned(), signal: c.signal.clone() });
            }
        }
        RuleNode::Composite { operator, conditions } => {
            let here = if path.is_empty() { "root".to_owned() } else { path.to_owned() };
            match operator {
                RuleOperator::Not if conditions.len() != 1 => errors.push(ConfigError::NotArity {
                    decision: decision.to_owned(),
                    path: here,
                    children: conditions.len(),
                }),
                RuleOperator::And | RuleOperator::Or if conditions.is_empty() => {
                    errors.push(ConfigError::EmptyConditions {
                        decision: decision.to_owned(),
                        path: here,
                        operator: *operator,
                    })
                }
                _ => {}
            }
            for (i, child) in conditions.iter().enumerate() {
                let sep = if path.is_empty() { "" } else { " " };
                let child_path = format!("{path}{sep}{operator}[{i}]");
                check_node(decision, child, &child_path, defined, errors);
            }
        }
    }
}
