//! Label selectors as `labels.Parse` in apimachinery reads them: equality
//! (`k=v`, `k==v`, `k!=v`), existence (`k`, `!k`), sets (`k in (a,b)`,
//! `k notin (a,b)`), integer comparison (`k>1`, `k<1`), requirements joined
//! by `,` (AND), whitespace between tokens. Keys are qualified names and
//! values label values, checked as the real server checks them. Owns parsing
//! and matching only; field selectors are not here (the server ignores them).

use std::collections::{BTreeMap, BTreeSet};

/// A parsed label selector: every requirement must hold. The empty selector
/// matches every object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Selector {
    requirements: Vec<Requirement>,
}

/// Why a selector did not parse (the server answers 400 `BadRequest`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unable to parse requirement: {0}")]
pub(crate) struct SelectorError(String);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Exists,
    NotExists,
    Equals(String),
    NotEquals(String),
    In(BTreeSet<String>),
    NotIn(BTreeSet<String>),
    GreaterThan(i64),
    LessThan(i64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    Not,
    NotEquals,
    Equals,
    DoubleEquals,
    Open,
    Close,
    Comma,
    In,
    NotIn,
    Greater,
    Less,
}

// === impl Selector ===

impl Selector {
    /// Parses `text` (already percent-decoded).
    pub(crate) fn parse(text: &str) -> Result<Self, SelectorError> {
        let tokens = lex(text);
        let mut at = 0;
        let mut requirements = Vec::new();
        if tokens.is_empty() {
            return Ok(Self { requirements });
        }
        loop {
            requirements.push(requirement(&tokens, &mut at)?);
            match tokens.get(at) {
                None => break,
                Some(Token::Comma) => at += 1,
                Some(t) => return Err(SelectorError(format!("found '{}', expected: ',' or 'end of string'", show(t)))),
            }
        }
        Ok(Self { requirements })
    }

    /// Whether an object with `labels` is selected.
    pub(crate) fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether it selects everything (the server then counts `remainingItemCount`).
    pub(crate) fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

// === impl Requirement ===

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match &self.op {
            Op::Exists => value.is_some(),
            Op::NotExists => value.is_none(),
            Op::Equals(v) => value == Some(v),
            Op::NotEquals(v) => value != Some(v),
            Op::In(set) => value.is_some_and(|v| set.contains(v)),
            Op::NotIn(set) => value.is_none_or(|v| !set.contains(v)),
            Op::GreaterThan(n) => value.and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v > *n),
            Op::LessThan(n) => value.and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v < *n),
        }
    }
}

fn requirement(tokens: &[Token], at: &mut usize) -> Result<Requirement, SelectorError> {
    let negated = tokens.get(*at) == Some(&Token::Not);
    if negated {
        *at += 1;
    }
    let key = match tokens.get(*at) {
        Some(Token::Ident(key)) => key.clone(),
        other => return Err(SelectorError(format!("found '{}', expected: identifier", shown(other)))),
    };
    *at += 1;
    validate_key(&key)?;
    if negated {
        return Ok(Requirement { key, op: Op::NotExists });
    }
    let op = match tokens.get(*at) {
        None | Some(Token::Comma) => return Ok(Requirement { key, op: Op::Exists }),
        Some(t) => t.clone(),
    };
    *at += 1;
    let op = match op {
        Token::Equals | Token::DoubleEquals => Op::Equals(single_value(tokens, at)?),
        Token::NotEquals => Op::NotEquals(single_value(tokens, at)?),
        Token::In => Op::In(value_set(tokens, at)?),
        Token::NotIn => Op::NotIn(value_set(tokens, at)?),
        Token::Greater => Op::GreaterThan(integer(&single_value(tokens, at)?)?),
        Token::Less => Op::LessThan(integer(&single_value(tokens, at)?)?),
        t => {
            let expected = "'=', '!=', '==', 'in', 'notin', '>' or '<'";
            return Err(SelectorError(format!("found '{}', expected: {expected}", show(&t))));
        }
    };
    Ok(Requirement { key, op })
}

/// The value after `=`, `==`, `!=`, `>`, `<`: an identifier, or empty when
/// the requirement ends there (`k=` selects an empty value).
fn single_value(tokens: &[Token], at: &mut usize) -> Result<String, SelectorError> {
    match tokens.get(*at) {
        Some(Token::Ident(v)) => {
            *at += 1;
            validate_value(v)?;
            Ok(v.clone())
        }
        None | Some(Token::Comma) => Ok(String::new()),
        Some(t) => Err(SelectorError(format!("found '{}', expected: identifier", show(t)))),
    }
}

/// `( v1, v2, ... )`, at least one value (an empty one is allowed, as `(a,)`).
fn value_set(tokens: &[Token], at: &mut usize) -> Result<BTreeSet<String>, SelectorError> {
    if tokens.get(*at) != Some(&Token::Open) {
        return Err(SelectorError(format!("found '{}', expected: '('", shown(tokens.get(*at)))));
    }
    *at += 1;
    let mut values = BTreeSet::new();
    if tokens.get(*at) == Some(&Token::Close) {
        return Err(SelectorError("for 'in', 'notin' operators, values set can't be empty".into()));
    }
    loop {
        match tokens.get(*at) {
            Some(Token::Ident(v)) => {
                validate_value(v)?;
                values.insert(v.clone());
                *at += 1;
            }
            Some(Token::Comma | Token::Close) => {
                values.insert(String::new());
            }
            other => return Err(SelectorError(format!("found '{}', expected: identifier", shown(other)))),
        }
        match tokens.get(*at) {
            Some(Token::Comma) => *at += 1,
            Some(Token::Close) => {
                *at += 1;
                return Ok(values);
            }
            other => return Err(SelectorError(format!("found '{}', expected: ',' or ')'", shown(other)))),
        }
    }
}

fn integer(v: &str) -> Result<i64, SelectorError> {
    v.parse().map_err(|_| SelectorError(format!("for 'Gt', 'Lt' operators, the value must be an integer: {v:?}")))
}

/// A qualified name: an optional DNS subdomain prefix and `/`, then a name
/// of at most 63 characters.
fn validate_key(key: &str) -> Result<(), SelectorError> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        let label = |l: &str| {
            !l.is_empty()
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        !p.is_empty() && p.len() <= 253 && p.split('.').all(label)
    });
    if prefix_ok && !name.is_empty() && is_name(name) {
        Ok(())
    } else {
        Err(SelectorError(format!("invalid label key {key:?}: a qualified name must be [prefix/]name")))
    }
}

/// A label value: empty, or a name of at most 63 characters.
fn validate_value(value: &str) -> Result<(), SelectorError> {
    if value.is_empty() || is_name(value) {
        Ok(())
    } else {
        Err(SelectorError(format!("invalid label value: {value:?}: at most 63 characters, alphanumeric at both ends")))
    }
}

fn is_name(s: &str) -> bool {
    let b = s.as_bytes();
    let inner = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.');
    s.len() <= 63
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter().all(inner)
}

fn lex(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let special = |c: char| c.is_whitespace() || matches!(c, ',' | '=' | '!' | '(' | ')' | '<' | '>');
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next_is_eq = chars.get(i + 1) == Some(&'=');
        let (token, width) = match c {
            c if c.is_whitespace() => {
                i += 1;
                continue;
            }
            '!' if next_is_eq => (Token::NotEquals, 2),
            '!' => (Token::Not, 1),
            '=' if next_is_eq => (Token::DoubleEquals, 2),
            '=' => (Token::Equals, 1),
            '(' => (Token::Open, 1),
            ')' => (Token::Close, 1),
            ',' => (Token::Comma, 1),
            '>' => (Token::Greater, 1),
            '<' => (Token::Less, 1),
            _ => {
                let end = (i..chars.len()).find(|&j| special(chars[j])).unwrap_or(chars.len());
                let word: String = chars[i..end].iter().collect();
                let token = match word.as_str() {
                    "in" => Token::In,
                    "notin" => Token::NotIn,
                    _ => Token::Ident(word),
                };
                (token, end - i)
            }
        };
        tokens.push(token);
        i += width;
    }
    tokens
}

fn show(t: &Token) -> String {
    match t {
        Token::Ident(s) => s.clone(),
        Token::Not => "!".into(),
        Token::NotEquals => "!=".into(),
        Token::Equals => "=".into(),
        Token::DoubleEquals => "==".into(),
        Token::Open => "(".into(),
        Token::Close => ")".into(),
        Token::Comma => ",".into(),
        Token::In => "in".into(),
        Token::NotIn => "notin".into(),
        Token::Greater => ">".into(),
        Token::Less => "<".into(),
    }
}

fn shown(t: Option<&Token>) -> String {
    t.map(show).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn selects(selector: &str, pairs: &[(&str, &str)]) -> bool {
        Selector::parse(selector).unwrap().matches(&labels(pairs))
    }

    #[test]
    fn every_operator() {
        let pod = [("app", "sglang"), ("role", "prefill"), ("gen", "3")];
        assert!(selects("", &pod));
        assert!(selects("app=sglang", &pod) && selects("app==sglang", &pod) && selects(" app = sglang ", &pod));
        assert!(!selects("app=vllm", &pod) && !selects("zone=a", &pod));
        assert!(selects("app!=vllm", &pod) && selects("zone!=a", &pod) && !selects("app!=sglang", &pod));
        assert!(selects("role", &pod) && !selects("zone", &pod));
        assert!(selects("!zone", &pod) && !selects("!role", &pod));
        assert!(selects("role in (prefill, decode)", &pod) && !selects("role in (decode)", &pod));
        assert!(!selects("zone in (a)", &pod));
        assert!(selects("role notin (decode)", &pod) && selects("zone notin (a)", &pod));
        assert!(!selects("role notin (prefill,decode)", &pod));
        assert!(selects("gen>2", &pod) && !selects("gen>3", &pod) && selects("gen<4", &pod) && !selects("app<4", &pod));
        assert!(selects("app=sglang,role in (prefill),!zone", &pod));
        assert!(!selects("app=sglang,role=decode", &pod));
        assert!(selects("zone=", &[("zone", "")]) && !selects("zone=", &pod));
        assert!(selects("example.com/tier=gpu", &[("example.com/tier", "gpu")]));
    }

    #[test]
    fn malformed_selectors_are_refused() {
        for bad in [
            "app=sglang,",
            ",app",
            "app in ()",
            "app in (a",
            "app in a",
            "app=(a)",
            "app=a=b",
            "!app=a",
            "app notin",
            "=a",
            "app!",
            "app gt 3",
            "app>x",
            "-app=a",
            "Example.com/app=a",
            "app=-a",
            "app=a b",
            &format!("app={}", "v".repeat(64)),
        ] {
            assert!(Selector::parse(bad).is_err(), "{bad:?} parsed");
        }
    }
}
