//! Reading a routing config from YAML (JSON is YAML too): syntax and type
//! errors come with the parser's line, validation errors with the line of
//! the entry they are about.

use std::fmt;

use super::{Config, validate};

/// A problem in a routing config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The 1-based line it is on, when known.
    pub line: Option<usize>,
    /// A stable label ([`crate::ConfigError::kind`], or `syntax`).
    pub kind: &'static str,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// Parses and validates a routing config; `Err` holds every problem found
/// (a syntax or type error stops the parse, so it comes alone).
pub fn parse_yaml(text: &str) -> Result<Config, Vec<Problem>> {
    let config: Config = serde_norway::from_str(text).map_err(|e| {
        let line = e.location().map(|l| l.line());
        // The parser's message ends with its own "at line L column C"; the line is ours to print.
        let message = e.to_string();
        let message = match message.rfind(" at line ") {
            Some(i) if line.is_some() => message[..i].to_owned(),
            _ => message,
        };
        vec![Problem { line, kind: "syntax", message }]
    })?;
    validate(&config).map_err(|errors| {
        errors
            .iter()
            .map(|e| Problem { line: locate(text, e.subject()), kind: e.kind(), message: e.to_string() })
            .collect::<Vec<_>>()
    })?;
    Ok(config)
}

/// The line of entry `name` in section `section` (the first `name: <name>`
/// after the section's key), or of the section's key alone.
fn locate(text: &str, (section, name): (&'static str, Option<&str>)) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let key = format!("{section}:");
    let start = lines.iter().position(|l| {
        let t = l.trim_start().trim_start_matches("- ").trim_start_matches('{').trim_start();
        t.starts_with(&key)
    })?;
    let Some(name) = name else { return Some(start + 1) };
    let found = lines[start..].iter().position(|l| names(l, name));
    Some(found.map_or(start, |i| start + i) + 1)
}

/// Whether `line` holds `name: <name>` (bare or quoted).
fn names(line: &str, name: &str) -> bool {
    let mut rest = line;
    while let Some(i) = rest.find("name:") {
        let before = rest[..i].chars().next_back();
        let value = rest[i + 5..].trim_start();
        let value = value.trim_start_matches(['"', '\'']);
        if before.is_none_or(|c| !c.is_alphanumeric() && c != '_')
            && let Some(after) = value.strip_prefix(name)
            && after.chars().next().is_none_or(|c| matches!(c, '"' | '\'' | ',' | '}' | ' ' | '#'))
        {
            return true;
        }
        rest = &rest[i + 5..];
    }
    false
}
