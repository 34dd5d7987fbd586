//! Rule signals: compiled once from the config's `signals` section, then
//! evaluated per request on its text and exact token count. Only the signals
//! asked for are computed. Owns matching (keywords, regex, PII, context);
//! does not decide anything (that is `decision`); languages come from
//! `language`, the embedding signals from `semantic`. Keyword, regex and PII
//! rules read the text normalized ([`crate::normalize`]), keywords with
//! look-alike letters folded too.

use std::borrow::Cow;
use std::collections::HashSet;

use regex::{Regex, RegexSet, RegexSetBuilder};

use crate::config::{
    ContextRule, ConversationRule, HeaderRule, KeywordOperator, KeywordRule, LoadRule, RegexRule, SignalKind,
    SignalRef, SignalsConfig,
};
use crate::error::ConfigError;
use crate::normalize::{Normalized, fold_confusables};
use crate::pii::{PiiDetector, PiiType};
use crate::results::{SignalResult, SignalResults};
use crate::semantic::{Embedder, EmbeddingNeeds, RequestEmbeddings, Semantic};

/// Upper bound on one compiled pattern (the regex crate's own default is 10 MiB).
const PATTERN_SIZE_LIMIT: usize = 10 * (1 << 20);

/// The compiled signal rules.
#[derive(Debug, Clone)]
pub struct Signals {
    keywords: Vec<KeywordSignal>,
    regex: Vec<(SignalRef, Regex)>,
    pii: Vec<(SignalRef, Vec<PiiType>)>,
    context: Vec<(SignalRef, ContextRule)>,
    language: Vec<(SignalRef, Vec<&'static str>, f64)>,
    conversation: Vec<(SignalRef, ConversationRule)>,
    headers: Vec<(SignalRef, HeaderRule)>,
    load: Vec<(SignalRef, LoadRule)>,
    detector: Option<PiiDetector>,
    semantic: Semantic,
}

/// What a request offers the signals.
#[derive(Debug, Clone, Copy, Default)]
pub struct SignalInput<'a> {
    /// The text of the user's turns ([`crate::signal_text`]).
    pub text: &'a str,
    /// Every text the model reads, whatever the role ([`crate::guard_text`]): what PII
    /// signals read (`None`: `text`).
    pub guard_text: Option<&'a str>,
    /// The prompt's exact token count from the pool's tokenizer.
    pub tokens: u64,
    /// The conversation's shape ([`crate::shape`]).
    pub shape: Shape,
    /// The request headers header rules read: (lowercase name, value).
    pub headers: &'a [(String, String)],
    /// Every pool's live state, for load rules.
    pub pools: &'a [PoolState<'a>],
    /// The request's vectors, for embedding signals.
    pub embeddings: Option<&'a RequestEmbeddings>,
}

/// The shape of a chat: turns, tools, an agent loop, images.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Shape {
    /// User messages.
    pub turns: u32,
    /// The request offers tools.
    pub tools: bool,
    /// The last message is a tool's result.
    pub tool_loop: bool,
    /// Some message carries an image.
    pub images: bool,
}

/// One pool now, as load rules see it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoolState<'a> {
    /// The pool's name.
    pub name: &'a str,
    /// Requests in flight on its routable workers.
    pub in_flight: u64,
    /// The estimated time to the first token of this prompt on its least
    /// loaded worker, in ms (infinite without a routable worker).
    pub est_ttft_ms: f64,
}

impl<'a> SignalInput<'a> {
    /// A request's text and token count (no shape, headers or pools).
    pub fn new(text: &'a str, tokens: u64) -> Self {
        SignalInput { text, tokens, ..SignalInput::default() }
    }
}

#[derive(Debug, Clone)]
struct KeywordSignal {
    signal: SignalRef,
    operator: KeywordOperator,
    set: RegexSet,
    /// Matched against the ASCII-lowercased text (a case-insensitive rule of
    /// keywords ASCII once normalized: its literals then prefilter the scan).
    lowered: bool,
}

// === impl Signals ===

impl Signals {
    /// Compiles every rule; the first problem is the error (run
    /// [`validate`](crate::validate) first to see all of them). Embedding
    /// signals need `embedder` (their examples are embedded here).
    pub fn compile(config: &SignalsConfig, embedder: Option<&dyn Embedder>) -> Result<Signals, ConfigError> {
        let keywords = config
            .keywords
            .iter()
            .map(|rule| {
                Ok(KeywordSignal {
                    signal: SignalRef::new(SignalKind::Keyword, &rule.name),
                    operator: rule.operator,
                    set: compile_keywords(rule)?,
                    lowered: lowers(rule),
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
        let language = config
            .language
            .iter()
            .map(|rule| {
                let codes = rule.languages.iter().filter_map(|c| crate::language::normalize(c)).collect();
                (SignalRef::new(SignalKind::Language, &rule.name), codes, rule.min_confidence.unwrap_or(0.0))
            })
            .collect();
        let named = |kind: SignalKind, name: &str| SignalRef::new(kind, name);
        let conversation =
            config.conversation.iter().map(|r| (named(SignalKind::Conversation, &r.name), r.clone())).collect();
        let headers = config
            .headers
            .iter()
            .map(|r| {
                let rule = HeaderRule { header: r.header.to_ascii_lowercase(), ..r.clone() };
                (named(SignalKind::Header, &r.name), rule)
            })
            .collect();
        let load = config.load.iter().map(|r| (named(SignalKind::Load, &r.name), r.clone())).collect();
        let semantic = Semantic::compile(config, embedder)?;
        Ok(Signals { keywords, regex, pii, context, language, conversation, headers, load, detector, semantic })
    }

    /// Computes the signals in `needed` (others are skipped) for `input`.
    /// A language signal matches when the text's detected language is one of
    /// its languages with at least its `min_confidence`; its confidence is the
    /// detector's (text with no detectable language matches none).
    pub fn evaluate(&self, input: &SignalInput<'_>, needed: &HashSet<SignalRef>) -> SignalResults {
        let mut out = SignalResults::default();
        let rule = |matched: bool, value: Option<f64>| SignalResult { matched, confidence: 1.0, value };
        let keywords: Vec<&KeywordSignal> = self.keywords.iter().filter(|k| needed.contains(&k.signal)).collect();
        let regex: Vec<&(SignalRef, Regex)> = self.regex.iter().filter(|(s, _)| needed.contains(s)).collect();
        let wanted_pii: Vec<&(SignalRef, Vec<PiiType>)> = self.pii.iter().filter(|(s, _)| needed.contains(s)).collect();
        let reads_text =
            !keywords.is_empty() || !regex.is_empty() || (!wanted_pii.is_empty() && input.guard_text.is_none());
        let normalized = Normalized::new(if reads_text { input.text } else { "" });
        let folded = if keywords.is_empty() { Cow::Borrowed("") } else { fold_confusables(normalized.as_str()) };
        let mut lowered: Option<String> = None;
        for k in keywords {
            let text: &str =
                if k.lowered { lowered.get_or_insert_with(|| folded.to_ascii_lowercase()) } else { &folded };
            let found = k.set.matches(text).iter().count();
            let matched = match k.operator {
                KeywordOperator::Or => found > 0,
                KeywordOperator::And => found == k.set.len(),
                KeywordOperator::Nor => found == 0,
            };
            out.insert(k.signal.clone(), rule(matched, Some(found as f64)));
        }
        // A pattern may look for an encoding itself (`&#`, a zero-width space): the original counts too.
        for (signal, re) in regex {
            let matched = re.is_match(normalized.as_str()) || (normalized.is_changed() && re.is_match(input.text));
            out.insert(signal.clone(), rule(matched, None));
        }
        if let (Some(detector), false) = (&self.detector, wanted_pii.is_empty()) {
            let mut types: Vec<PiiType> = wanted_pii.iter().flat_map(|(_, t)| t.iter().copied()).collect();
            types.sort();
            types.dedup();
            let guarded = input.guard_text.map(Normalized::new);
            let findings = detector.detect_in(guarded.as_ref().unwrap_or(&normalized), &types);
            for (signal, types) in wanted_pii {
                let hits = findings.iter().filter(|f| types.contains(&f.kind)).count();
                out.insert(signal.clone(), rule(hits > 0, Some(hits as f64)));
            }
            out.set_pii_findings(findings);
        }
        for (signal, c) in self.context.iter().filter(|(s, _)| needed.contains(s)) {
            let matched = c.min_tokens.is_none_or(|min| input.tokens >= min)
                && c.max_tokens.is_none_or(|max| input.tokens <= max);
            out.insert(signal.clone(), rule(matched, Some(input.tokens as f64)));
        }
        self.evaluate_request(input, needed, &mut out);
        self.semantic.evaluate(input.embeddings, needed, &mut out);
        let wanted_language: Vec<_> = self.language.iter().filter(|(s, _, _)| needed.contains(s)).collect();
        if !wanted_language.is_empty() {
            let detected = crate::language::detect(input.text);
            for (signal, codes, min) in wanted_language {
                let result = match detected {
                    Some(d) if codes.contains(&d.code) && d.confidence >= *min => {
                        SignalResult { matched: true, confidence: d.confidence, value: Some(d.confidence) }
                    }
                    _ => SignalResult { matched: false, confidence: 0.0, value: detected.map(|d| d.confidence) },
                };
                out.insert(signal.clone(), result);
            }
        }
        for failed in needed.iter().filter(|s| s.kind == SignalKind::Failed) {
            let matched = failed.watched().is_some_and(|w| out.error(&w).is_some());
            out.insert(failed.clone(), SignalResult { matched, confidence: 1.0, value: None });
        }
        out
    }

    /// Which vectors the `needed` embedding signals read.
    pub fn embedding_needs(&self, needed: &HashSet<SignalRef>) -> EmbeddingNeeds {
        self.semantic.needs(needed)
    }

    /// Whether the `jailbreak` rule `name` matches the text of vector `v` (`None`: no such rule).
    pub(crate) fn jailbreak(&self, name: &str, v: &[f32]) -> Option<bool> {
        self.semantic.jailbreak(name, v)
    }

    /// The conversation, header and load rules.
    fn evaluate_request(&self, input: &SignalInput<'_>, needed: &HashSet<SignalRef>, out: &mut SignalResults) {
        let rule = |matched: bool, value: Option<f64>| SignalResult { matched, confidence: 1.0, value };
        let shape = &input.shape;
        for (signal, c) in self.conversation.iter().filter(|(s, _)| needed.contains(s)) {
            let matched = c.min_turns.is_none_or(|m| shape.turns >= m)
                && c.max_turns.is_none_or(|m| shape.turns <= m)
                && c.has_tools.is_none_or(|t| shape.tools == t)
                && c.tool_loop.is_none_or(|t| shape.tool_loop == t)
                && c.has_images.is_none_or(|i| shape.images == i);
            out.insert(signal.clone(), rule(matched, Some(f64::from(shape.turns))));
        }
        for (signal, h) in self.headers.iter().filter(|(s, _)| needed.contains(s)) {
            let value = input.headers.iter().find(|(n, _)| *n == h.header).map(|(_, v)| v.as_str());
            let matched = value.is_some_and(|v| h.values.is_empty() || h.values.iter().any(|x| x == v));
            out.insert(signal.clone(), rule(matched, None));
        }
        for (signal, l) in self.load.iter().filter(|(s, _)| needed.contains(s)) {
            let Some(pool) = input.pools.iter().find(|p| p.name == l.pool) else {
                out.insert(signal.clone(), rule(false, None));
                continue;
            };
            let matched = l.min_in_flight.is_none_or(|m| pool.in_flight >= m)
                && l.max_in_flight.is_none_or(|m| pool.in_flight <= m)
                && l.min_ttft_ms.is_none_or(|m| pool.est_ttft_ms >= m)
                && l.max_ttft_ms.is_none_or(|m| pool.est_ttft_ms <= m);
            let ttft = l.min_ttft_ms.is_some() || l.max_ttft_ms.is_some();
            let value = if ttft { pool.est_ttft_ms } else { pool.in_flight as f64 };
            out.insert(signal.clone(), rule(matched, Some(value)));
        }
    }
}

/// Whether a keyword rule is matched case-sensitively against the lowercased
/// text: case-insensitive, every keyword ASCII once normalized.
fn lowers(rule: &KeywordRule) -> bool {
    !rule.case_sensitive && rule.keywords.iter().all(|k| keyword_form(k).is_ascii())
}

/// A keyword as it is matched: normalized and folded as the text is, trimmed.
fn keyword_form(keyword: &str) -> String {
    fold_confusables(Normalized::new(keyword).as_str()).trim().to_owned()
}

/// One pattern per keyword: whole words (a `\b` on each side that starts or
/// ends with a word character, as the semantic router does), any run of
/// whitespace or ASCII punctuation (`·` and `•` too) between a phrase's
/// words matching any such run (`ignore_previous_instructions` is the phrase "ignore previous
/// instructions"), case-insensitive unless asked.
pub(crate) fn compile_keywords(rule: &KeywordRule) -> Result<RegexSet, ConfigError> {
    if rule.keywords.is_empty() {
        return Err(ConfigError::EmptyKeywords { name: rule.name.clone() });
    }
    let patterns = rule
        .keywords
        .iter()
        .map(|k| {
            let k = keyword_form(k);
            if k.is_empty() {
                return Err(ConfigError::BlankKeyword { name: rule.name.clone() });
            }
            let is_word = |c: char| c.is_alphanumeric() || c == '_';
            let k = if lowers(rule) { k.to_ascii_lowercase() } else { k.to_owned() };
            let body: Vec<String> = k.split_whitespace().map(regex::escape).collect();
            // An ASCII end takes an ASCII word boundary (as the semantic router's Go regexps
            // have): the lazy DFA then scans any text; a Unicode boundary makes it fall back.
            let boundary = |c: Option<char>| match c {
                Some(c) if c.is_ascii() && is_word(c) => r"(?-u:\b)",
                Some(c) if is_word(c) => r"\b",
                _ => "",
            };
            let lead = boundary(k.chars().next());
            let trail = boundary(k.chars().next_back());
            // ASCII punctuation (the text is normalized: fullwidth forms and dashes are ASCII
            // there) and two bullets: Unicode's \p{P} and \p{S} made a rule of 500 phrases
            // pass the 10 MiB pattern limit.
            Ok(format!("{lead}{}{trail}", body.join(r"[\s[:punct:]·•]+")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    RegexSetBuilder::new(patterns)
        .case_insensitive(!rule.case_sensitive && !lowers(rule))
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
