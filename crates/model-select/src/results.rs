//! The signals computed for one request: each one's result, the ones that
//! could not be computed and why, and the PII findings. Filled by `signals`
//! and `semantic`, read by `decision`; computes nothing itself.

use std::collections::{BTreeMap, BTreeSet};

use crate::config::SignalRef;
use crate::pii::PiiFinding;

/// One computed signal.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SignalResult {
    /// Whether the rule matched.
    pub matched: bool,
    /// How sure (1.0 for every rule signal).
    pub confidence: f64,
    /// A number for predicates: keywords found (keyword), token count
    /// (context), findings (pii); none for regex.
    pub value: Option<f64>,
}

/// The signals computed for one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SignalResults {
    results: BTreeMap<SignalRef, SignalResult>,
    not_computed: BTreeSet<SignalRef>,
    errors: BTreeMap<SignalRef, String>,
    pii_findings: Vec<PiiFinding>,
}

// === impl SignalResults ===

impl SignalResults {
    /// The result of `signal`, if it was computed.
    pub fn get(&self, signal: &SignalRef) -> Option<&SignalResult> {
        self.results.get(signal)
    }

    /// Whether `signal` was asked for but cannot be computed yet (language).
    pub fn is_not_computed(&self, signal: &SignalRef) -> bool {
        self.not_computed.contains(signal)
    }

    /// Every computed signal, ordered by type then name.
    pub fn iter(&self) -> impl Iterator<Item = (&SignalRef, &SignalResult)> {
        self.results.iter()
    }

    /// Signals asked for but not computed.
    pub fn not_computed(&self) -> impl Iterator<Item = &SignalRef> {
        self.not_computed.iter()
    }

    /// PII findings (type and span) of every type a computed PII signal asked for.
    pub fn pii_findings(&self) -> &[PiiFinding] {
        &self.pii_findings
    }

    /// Sets a result by hand (tests, and signals computed elsewhere).
    pub fn insert(&mut self, signal: SignalRef, result: SignalResult) {
        self.not_computed.remove(&signal);
        self.results.insert(signal, result);
    }

    /// Sets the PII findings (the PII signals' spans).
    pub(crate) fn set_pii_findings(&mut self, findings: Vec<PiiFinding>) {
        self.pii_findings = findings;
    }

    /// Records that `signal` could not be computed, and why (it does not match).
    pub fn fail(&mut self, signal: SignalRef, why: &str) {
        self.results.insert(signal.clone(), SignalResult { matched: false, confidence: 0.0, value: None });
        self.errors.insert(signal, why.to_owned());
    }

    /// Why `signal` could not be computed, if it could not.
    pub fn error(&self, signal: &SignalRef) -> Option<&str> {
        self.errors.get(signal).map(String::as_str)
    }

    /// Every signal that could not be computed, with why.
    pub fn errors(&self) -> impl Iterator<Item = (&SignalRef, &str)> {
        self.errors.iter().map(|(s, e)| (s, e.as_str()))
    }
}
