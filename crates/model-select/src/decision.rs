//! The decision engine: evaluates each decision's rule tree over computed
//! signals with the semantic router's semantics (`docs/model-routing.md` §1),
//! ranks the matched ones and explains the outcome of every decision. Also
//! says which signals are worth computing. Owns no signals and picks no pool
//! within a decision (that is the decision's algorithm).

use std::cmp::Ordering;
use std::collections::HashSet;

use crate::config::{DecisionConfig, RuleNode, RuleOperator, SignalCondition, SignalRef, Strategy};
use crate::results::SignalResults;

/// The outcome of one rule tree.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleOutcome {
    /// Whether it holds.
    pub matched: bool,
    /// Its confidence (0 when it does not hold).
    pub confidence: f64,
    /// When it does not hold: the first failing condition as a path, e.g.
    /// `AND[1] keyword:math`.
    pub failed: Option<String>,
}

/// How one decision fared.
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionTrace {
    /// The decision's name.
    pub name: String,
    /// Whether its rules held (a catch-all always does).
    pub matched: bool,
    /// Its confidence (catch-all and unmatched: 0).
    pub confidence: f64,
    /// For an unmatched decision, the first failing condition.
    pub failed: Option<String>,
}

/// The winner and the trace of every decision, in config order.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection<'c> {
    /// The winning decision; none when nothing matched (then the default
    /// pool serves).
    pub winner: Option<&'c DecisionConfig>,
    /// Its index in the config's decisions.
    pub winner_index: Option<usize>,
    /// One entry per decision.
    pub trace: Vec<DecisionTrace>,
}

/// Evaluates `node` over `signals`.
///
/// A leaf holds when its signal matched and its value satisfies the bounds
/// (if any); confidence is the signal's. AND: all children, mean confidence.
/// OR: any child, the highest matched confidence; a failing OR reports its
/// first child's failure. NOT: exactly one child, which must fail;
/// confidence 1.0.
pub fn evaluate_rule(node: &RuleNode, signals: &SignalResults) -> RuleOutcome {
    match node {
        RuleNode::Signal(c) => evaluate_leaf(c, signals),
        RuleNode::Composite { operator: RuleOperator::And, conditions } => {
            let mut sum = 0.0;
            for (i, child) in conditions.iter().enumerate() {
                let out = evaluate_rule(child, signals);
                if !out.matched {
                    return fail(format!("AND[{i}] {}", out.failed.unwrap_or_default()));
                }
                sum += out.confidence;
            }
            let confidence = if conditions.is_empty() { 1.0 } else { sum / conditions.len() as f64 };
            RuleOutcome { matched: true, confidence, failed: None }
        }
        RuleNode::Composite { operator: RuleOperator::Or, conditions } => {
            let mut best: Option<f64> = None;
            let mut first_failure = None;
            for (i, child) in conditions.iter().enumerate() {
                let out = evaluate_rule(child, signals);
                if out.matched {
                    best = Some(best.map_or(out.confidence, |b: f64| b.max(out.confidence)));
                } else if first_failure.is_none() {
                    first_failure = Some(format!("OR[{i}] {}", out.failed.unwrap_or_default()));
                }
            }
            match best {
                Some(confidence) => RuleOutcome { matched: true, confidence, failed: None },
                None => fail(first_failure.unwrap_or_else(|| "OR (no conditions)".to_owned())),
            }
        }
        RuleNode::Composite { operator: RuleOperator::Not, conditions } => match conditions.as_slice() {
            [child] => {
                let out = evaluate_rule(child, signals);
                if out.matched {
                    fail(format!("NOT[0] {} matched", describe(child)))
                } else {
                    RuleOutcome { matched: true, confidence: 1.0, failed: None }
                }
            }
            _ => fail(format!("NOT (needs exactly one condition, has {})", conditions.len())),
        },
    }
}

/// Evaluates every decision and picks the winner among the matched ones:
/// lower `tier` first (a decision without a tier after every decision with
/// one), then by `strategy` (priority then confidence, or confidence then
/// priority), then config order.
pub fn select<'c>(decisions: &'c [DecisionConfig], strategy: Strategy, signals: &SignalResults) -> Selection<'c> {
    let trace: Vec<DecisionTrace> = decisions
        .iter()
        .map(|d| {
            let out = match &d.rules {
                None => RuleOutcome { matched: true, confidence: 0.0, failed: None },
                Some(rules) => evaluate_rule(rules, signals),
            };
            DecisionTrace { name: d.name.clone(), matched: out.matched, confidence: out.confidence, failed: out.failed }
        })
        .collect();
    let winner_index = (0..decisions.len()).filter(|&i| trace[i].matched).min_by(|&a, &b| {
        rank(&decisions[a], trace[a].confidence, &decisions[b], trace[b].confidence, strategy).then(a.cmp(&b))
    });
    Selection { winner: winner_index.map(|i| &decisions[i]), winner_index, trace }
}

/// The signals worth computing: those used by a decision that can win. A
/// decision cannot win when a catch-all (always matched, confidence 0)
/// ranks above it whatever its confidence: a lower tier, or under
/// `strategy: priority` the same tier and a higher priority.
pub fn needed_signals(decisions: &[DecisionConfig], strategy: Strategy) -> HashSet<SignalRef> {
    let catch_alls: Vec<&DecisionConfig> = decisions.iter().filter(|d| d.is_catch_all()).collect();
    decisions
        .iter()
        .filter(|d| {
            !catch_alls.iter().any(|c| match tier_key(c).cmp(&tier_key(d)) {
                Ordering::Less => true,
                Ordering::Greater => false,
                Ordering::Equal => strategy == Strategy::Priority && c.priority > d.priority,
            })
        })
        .flat_map(|d| d.signal_refs().into_iter().flat_map(|s| [Some(s.clone()), s.watched()]).flatten())
        .collect()
}

/// `Less` when `a` (with confidence `ca`) ranks before `b`.
fn rank(a: &DecisionConfig, ca: f64, b: &DecisionConfig, cb: f64, strategy: Strategy) -> Ordering {
    let by_priority = b.priority.cmp(&a.priority);
    let by_confidence = cb.total_cmp(&ca);
    tier_key(a).cmp(&tier_key(b)).then(match strategy {
        Strategy::Priority => by_priority.then(by_confidence),
        Strategy::Confidence => by_confidence.then(by_priority),
    })
}

/// Lower first; no tier after every tier.
fn tier_key(d: &DecisionConfig) -> u64 {
    d.tier.map_or(u64::MAX, u64::from)
}

fn evaluate_leaf(c: &SignalCondition, signals: &SignalResults) -> RuleOutcome {
    let Some(result) = signals.get(&c.signal) else {
        let why = if signals.is_not_computed(&c.signal) { "not computed" } else { "not evaluated" };
        return fail(format!("{} ({why})", c.signal));
    };
    if let Some(error) = signals.error(&c.signal) {
        return fail(format!("{} (error: {error})", c.signal));
    }
    if !result.matched {
        return fail(c.signal.to_string());
    }
    if !c.bounds.is_empty() {
        match result.value {
            None => return fail(format!("{} (no value for {})", c.signal, c.bounds)),
            Some(v) if !c.bounds.holds(v) => return fail(format!("{} (value {v} fails {})", c.signal, c.bounds)),
            Some(_) => {}
        }
    }
    RuleOutcome { matched: true, confidence: result.confidence, failed: None }
}

fn fail(path: String) -> RuleOutcome {
    RuleOutcome { matched: false, confidence: 0.0, failed: Some(path) }
}

/// A short name for a node: its signal, or its operator.
fn describe(node: &RuleNode) -> String {
    match node {
        RuleNode::Signal(c) => c.signal.to_string(),
        RuleNode::Composite { operator, .. } => operator.to_string(),
    }
}

#[cfg(test)]
mod tests;
