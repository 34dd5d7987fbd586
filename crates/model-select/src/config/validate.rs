//! Whole-config checks that serde cannot express: names, references,
//! arities, patterns. Reports every problem, not just the first.

use std::collections::HashSet;

use super::{Config, DecisionConfig, RuleNode, RuleOperator, SignalKind, SignalRef};
use crate::error::ConfigError;
use crate::pii::PiiType;
use crate::signals::{compile_keywords, compile_regex};

/// Checks `config`; `Err` holds every problem found, in config order.
///
/// Pool names are not checked here: the pools section has another owner.
pub fn validate(config: &Config) -> Result<(), Vec<ConfigError>> {
    let mut errors = Vec::new();
    let defined = check_signals(config, &mut errors);
    check_decisions(&config.decisions, &defined, &mut errors);
    if errors.is_empty() { Ok(()) } else { Err(errors) }
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
