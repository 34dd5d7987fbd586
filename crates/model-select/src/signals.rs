//! Rule signals: compiled once from the config's `signals` section, then
//! evaluated per request on its text and exact token count. Only the signals
//! asked for are computed. Owns matching (keywords, regex, PII, context);
//! does not decide anything (that is `decision`) and detects no language yet.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use regex::{Regex, RegexSet, RegexSetBuilder};

use crate::config::{ContextRule, KeywordOperator, KeywordRule, RegexRule, SignalKind, SignalRef, SignalsConfig};
use crate::error::ConfigError;
use crate::pii::{PiiDetector, PiiFinding, PiiType};

/// Upper bound on one compiled pattern (the regex crate's own default is 10 MiB).
const PATTERN_SIZE_LIMIT: usize = 10 * (1 << 20);

/// The compiled signal rules.
#[derive(Debug, Clone)]
pub struct Signals {
    keywords: Vec<KeywordSignal>,
    regex: Vec<(SignalRef, Regex)>,
    pii: Vec<(SignalRef, Vec<PiiType>)>,
    context: Vec<(SignalRef, ContextRule)>,
    language: Vec<SignalRef>,
    detector: Option<PiiDetector>,
}

/// What a request offers the signals.
#[derive(Debug, Clone, Copy)]
pub struct SignalInput<'a> {
    /// The concatenated user and system message text.
    pub text: &'a str,
    /// The prompt's exact token count from the pool's tokenizer.
    pub tokens: u64,
}

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
    pii_findings: Vec<PiiFinding>,
}

#[derive(Debug, Clone)]
struct KeywordSignal {
    signal: SignalRef,
    operator: KeywordOperator,
    set: RegexSet,
}

// === impl Signals ===

impl Signals {
    /// Compiles every rule; the first problem is the error (run
    /// [`validate`](crate::validate) first to see all of them).
    pub fn compile(config: &SignalsConfig) -> Result<Signals, ConfigError> {
        let keywords = config
            .keywords
            .iter()
            .map(|rule| {
                Ok(KeywordSignal {
                    signal: SignalRef::new(SignalKind::Keyword, &rule.name),
                    operator: rule.operator,
                    set: compile_keywords(rule)?,
                })
            })
            .collect::<Result<_, ConfigError>>()?;
        let regex = config
            .regex
            .iter()
            .map(|rule| Ok((SignalRef::new(SignalKind::Regex, &rule.name), compile_regex(rule)?)))
            .collect::<Result<_, ConfigError>>()?;
        let pii = config
            .pii
            .iter()
            .map(|rule| {
                let types = rule
                    .types
                    .iter()
                    .map(|t| {
                        PiiType::parse(t)
                            .ok_or_else(|| ConfigError::UnknownPiiType { name: rule.name.clone(), ty: t.clone() })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                if types.is_empty() {
                    return Err(ConfigError::EmptyPiiTypes { name: rule.name.clone() });
                }
                Ok((SignalRef::new(SignalKind::Pii, &rule.name), types))
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        let detector = (!pii.is_empty()).then(PiiDetector::new);
        let context =
            config.context.iter().map(|rule| (SignalRef::new(SignalKind::Context, &rule.name), rule.clone())).collect();
        let language = config.language.iter().map(|rule| SignalRef::new(SignalKind::Language, &rule.name)).collect();
        Ok(Signals { keywords, regex, pii, context, language, detector })
    }

    /// Computes the signals in `needed` (others are skipped) for `input`.
    /// Language signals are reported as not computed.
    pub fn evaluate(&self, input: &SignalInput<'_>, needed: &HashSet<SignalRef>) -> SignalResults {
        let mut out = SignalResults::default();
        let rule = |matched: bool, value: Option<f64>| SignalResult { matched, confidence: 1.0, value };
        for k in self.keywords.iter().filter(|k| needed.contains(&k.signal)) {
            let found = k.set.matches(input.text).iter().count();
            let matched = match k.operator {
                KeywordOperator::Or => found > 0,
                KeywordOperator::And => found == k.set.len(),
                KeywordOperator::Nor => found == 0,
            };
            out.results.insert(k.signal.clone(), rule(matched, Some(found as f64)));
        }
        for (signal, re) in self.regex.iter().filter(|(s, _)| needed.contains(s)) {
            out.results.insert(signal.clone(), rule(re.is_match(input.text), None));
        }
        let wanted_pii: Vec<&(SignalRef, Vec<PiiType>)> = self.pii.iter().filter(|(s, _)| needed.contains(s)).collect();
        if let (Some(detector), false) = (&self.detector, wanted_pii.is_empty()) {
            let mut types: Vec<PiiType> = wanted_pii.iter().flat_map(|(_, t)| t.iter().copied()).collect();
            types.sort();
            types.dedup();
            out.pii_findings = detector.detect(input.text, &types);
            for (signal, types) in wanted_pii {
                let hits = out.pii_findings.iter().filter(|f| types.contains(&f.kind)).count();
                out.results.insert(signal.clone(), rule(hits > 0, Some(hits as f64)));
            }
        }
        for (signal, c) in self.context.iter().filter(|(s, _)| needed.contains(s)) {
            let matched = c.min_tokens.is_none_or(|min| input.tokens >= min)
                && c.max_tokens.is_none_or(|max| input.tokens <= max);
            out.results.insert(signal.clone(), rule(matched, Some(input.tokens as f64)));
        }
        for signal in self.language.iter().filter(|s| needed.contains(s)) {
            out.not_computed.insert(signal.clone());
        }
        out
    }
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
}

/// One pattern per keyword: whole words (a `\b` on each side that starts or
/// ends with a word character, as the semantic router does), any run of
/// whitespace inside a phrase matching any run, case-insensitive unless asked.
pub(crate) fn compile_keywords(rule: &KeywordRule) -> Result<RegexSet, ConfigError> {
    if rule.keywords.is_empty() {
        return Err(ConfigError::EmptyKeywords { name: rule.name.clone() });
    }
    let patterns = rule
        .keywords
        .iter()
        .map(|k| {
            let k = k.trim();
            if k.is_empty() {
                return Err(ConfigError::BlankKeyword { name: rule.name.clone() });
            }
            let is_word = |c: char| c.is_alphanumeric() || c == '_';
            let body: Vec<String> = k.split_whitespace().map(regex::escape).collect();
            let lead = if k.starts_with(is_word) { r"\b" } else { "" };
            let trail = if k.ends_with(is_word) { r"\b" } else { "" };
            Ok(format!("{lead}{}{trail}", body.join(r"\s+")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    RegexSetBuilder::new(patterns)
        .case_insensitive(!rule.case_sensitive)
        .size_limit(PATTERN_SIZE_LIMIT)
        .build()
        .map_err(|e| ConfigError::BadRegex {
            kind: SignalKind::Keyword,
            name: rule.name.clone(),
            message: e.to_string(),
        })
}

/// The rule's pattern, compiled.
pub(crate) fn compile_regex(rule: &RegexRule) -> Result<Regex, ConfigError> {
    regex::RegexBuilder::new(&rule.pattern).size_limit(PATTERN_SIZE_LIMIT).build().map_err(|e| ConfigError::BadRegex {
        kind: SignalKind::Regex,
        name: rule.name.clone(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests;
