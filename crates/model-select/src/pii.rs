//! PII detection by pattern and validator: email, phone, credit card (Luhn),
//! IBAN (mod 97), US SSN, IP address (std parse) and API keys. The patterns
//! run on the normalized text ([`crate::normalize`]: references decoded,
//! NFKC, invisible characters removed, digits and dashes to ASCII) and a
//! finding's span is mapped back to the original's bytes. A finding is a
//! type and a byte span; no matched value is copied or kept, so nothing here
//! can leak one into a log. Redaction (a plugin) is not done here.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::ops::Range;

use regex::Regex;

use self::check::{IBAN_LENGTHS, alnum_after, dash_digit_around, iban_mod97, luhn, word_after, word_before};
use crate::normalize::Normalized;

mod check;

/// A kind of personal or secret data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PiiType {
    /// An email address.
    Email,
    /// A phone number: `+` international, US `(555) 123-4567`, or national with trunk `0`.
    Phone,
    /// A payment card number (13–19 digits, Luhn-valid).
    CreditCard,
    /// An IBAN (mod-97 valid, country length when known).
    Iban,
    /// A US social security number `AAA-GG-SSSS`.
    UsSsn,
    /// An IPv4 or IPv6 address.
    IpAddress,
    /// A cloud or SaaS API key with a well-known prefix.
    ApiKey,
}

/// One occurrence of PII in a text: its type and byte span, never its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PiiFinding {
    /// The type.
    pub kind: PiiType,
    /// Byte range in the text examined (as given, before normalization).
    pub span: Range<usize>,
}

/// Which trigger bytes a text holds (one pass over it).
#[derive(Debug, Clone, Copy, Default)]
struct Present {
    digit: bool,
    at: bool,
    colon: bool,
}

impl Present {
    fn of(text: &str) -> Self {
        let mut p = Present::default();
        for &b in text.as_bytes() {
            p.digit |= b.is_ascii_digit();
            p.at |= b == b'@';
            p.colon |= b == b':';
        }
        p
    }
}

/// The compiled detectors (built once, shared by every request).
#[derive(Debug, Clone)]
pub struct PiiDetector {
    email: Regex,
    phone: Regex,
    card: Regex,
    iban: Regex,
    ssn: Regex,
    ipv4: Regex,
    ipv6: Regex,
    api_key: Regex,
}

// === impl PiiType ===

impl PiiType {
    /// Every type, in detection precedence order (an earlier type's finding
    /// hides an overlapping later one: a card number is not also a phone).
    pub const ALL: [PiiType; 7] = [
        PiiType::ApiKey,
        PiiType::Email,
        PiiType::Iban,
        PiiType::CreditCard,
        PiiType::UsSsn,
        PiiType::IpAddress,
        PiiType::Phone,
    ];

    /// The config name.
    pub fn as_str(self) -> &'static str {
        match self {
            PiiType::Email => "email",
            PiiType::Phone => "phone",
            PiiType::CreditCard => "credit_card",
            PiiType::Iban => "iban",
            PiiType::UsSsn => "us_ssn",
            PiiType::IpAddress => "ip_address",
            PiiType::ApiKey => "api_key",
        }
    }

    /// The type named `name` in a config, if any.
    pub fn parse(name: &str) -> Option<PiiType> {
        PiiType::ALL.into_iter().find(|t| t.as_str() == name)
    }
}

impl std::fmt::Display for PiiType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

// === impl PiiDetector ===

impl Default for PiiDetector {
    fn default() -> Self {
        Self::new()
    }
}

impl PiiDetector {
    /// Compiles the detectors (constant patterns).
    pub fn new() -> Self {
        let re = |p: &str| Regex::new(p).expect("constant PII pattern compiles");
        PiiDetector {
            // The local part may hold Latin, Greek and Cyrillic letters (`josé`), not other
            // scripts' (text glued to an address in CJK prose is not part of it).
            email: re(concat!(
                r"[\p{Latin}\p{Greek}\p{Cyrillic}\p{M}0-9._%+-]+",
                r"@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,}",
            )),
            phone: re(concat!(
                r"\+\d{1,3}(?:[ .-]?\(\d{1,4}\)|[ .-]?\d{1,5}){1,6}",
                r"|\(\d{3}\) ?\d{3}[ .-]\d{4}",
                r"|(?-u:\b)\d{3}[ .-]\d{3}[ .-]\d{4}(?-u:\b)",
                r"|(?-u:\b)0\d{1,4}(?:[ /.-]?\d{2,4}){1,4}(?-u:\b)",
            )),
            // 13 digits at least (shorter runs are no card): short numbers make no candidates.
            // Groups split by a space, a dash, a dot or two spaces.
            card: re(r"\d(?:(?: {1,2}|[.-])?\d){12,}"),
            iban: re(r"(?i)(?-u:\b)[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,32}"),
            ssn: re(r"(?-u:\b)(\d{3})-(\d{2})-(\d{4})(?-u:\b)"),
            ipv4: re(r"(?-u:\b)\d{1,3}(?:\.\d{1,3}){3}(?-u:\b)"),
            // Two colons at least, as every IPv6 address has ("10:32" makes no candidate).
            ipv6: re(r"[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*"),
            api_key: re(concat!(
                r"(?-u:\b)(?:sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{22,}",
                r"|(?:AKIA|ASIA)[0-9A-Z]{16}|xox[baprs]-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_-]{35})",
            )),
        }
    }

    /// Every finding of the `wanted` types in `text`, sorted by position,
    /// spans in `text`. All types are scanned so that precedence
    /// ([`PiiType::ALL`]) can hide overlaps; only `wanted` ones are returned.
    pub fn detect(&self, text: &str, wanted: &[PiiType]) -> Vec<PiiFinding> {
        self.detect_in(&Normalized::new(text), wanted)
    }

    /// [`detect`](Self::detect) on a text normalized already: spans in its original.
    pub(crate) fn detect_in(&self, text: &Normalized<'_>, wanted: &[PiiType]) -> Vec<PiiFinding> {
        let mut found = self.scan(text.as_str(), wanted);
        if text.is_changed() {
            for f in &mut found {
                f.span = text.original_span(f.span.clone());
            }
        }
        found
    }

    /// The findings in a normalized `text`, spans in it.
    fn scan(&self, text: &str, wanted: &[PiiType]) -> Vec<PiiFinding> {
        if wanted.is_empty() {
            return Vec::new();
        }
        let mut accepted: Vec<PiiFinding> = Vec::new();
        let has = Present::of(text);
        for kind in PiiType::ALL {
            for span in self.candidates(kind, text, &has) {
                if !accepted.iter().any(|f| f.span.start < span.end && span.start < f.span.end) {
                    accepted.push(PiiFinding { kind, span });
                }
            }
        }
        accepted.retain(|f| wanted.contains(&f.kind));
        accepted.sort_by_key(|f| (f.span.start, f.span.end));
        accepted
    }

    /// Validated spans of one type, overlaps with other types not yet removed.
    fn candidates(&self, kind: PiiType, text: &str, has: &Present) -> Vec<Range<usize>> {
        // Each type needs a byte a text without it cannot hold: prose is not scanned.
        let needs = match kind {
            PiiType::Email => has.at,
            PiiType::IpAddress => has.digit || has.colon,
            // Its pattern's literal prefixes prefilter the scan already.
            PiiType::ApiKey => true,
            _ => has.digit,
        };
        if !needs {
            return Vec::new();
        }
        match kind {
            PiiType::Email => self.emails(text),
            PiiType::Phone => self.phones(text),
            PiiType::CreditCard => self.cards(text),
            PiiType::Iban => self.ibans(text),
            PiiType::UsSsn => self.ssns(text),
            PiiType::IpAddress => self.ips(text),
            PiiType::ApiKey => self.api_keys(text),
        }
    }

    fn emails(&self, text: &str) -> Vec<Range<usize>> {
        self.email
            .find_iter(text)
            .filter(|m| {
                let local = &m.as_str()[..m.as_str().find('@').unwrap_or(0)];
                !local.starts_with('.') && !local.ends_with('.') && !local.contains("..") && !alnum_after(text, m.end())
            })
            .map(|m| m.range())
            .collect()
    }

    fn phones(&self, text: &str) -> Vec<Range<usize>> {
        self.phone
            .find_iter(text)
            .filter(|m| {
                let s = m.as_str();
                let digits = s.bytes().filter(u8::is_ascii_digit).count();
                let range = if s.starts_with('+') {
                    7..=15
                } else if s.starts_with('0') {
                    9..=12
                } else {
                    10..=10
                };
                range.contains(&digits) && !word_before(text, m.start()) && !alnum_after(text, m.end())
            })
            .map(|m| m.range())
            .collect()
    }

    fn cards(&self, text: &str) -> Vec<Range<usize>> {
        let mut out = Vec::new();
        for m in self.card.find_iter(text) {
            if word_before(text, m.start()) || alnum_after(text, m.end()) {
                continue;
            }
            // Groups of digits split by separators; a card is a run of whole
            // groups (a phone number may sit just before it).
            let mut groups: Vec<Range<usize>> = Vec::new();
            let mut start = None;
            for (i, b) in m.as_str().bytes().enumerate().chain([(m.len(), b' ')]) {
                match (b.is_ascii_digit(), start) {
                    (true, None) => start = Some(m.start() + i),
                    (false, Some(s)) => {
                        groups.push(s..m.start() + i);
                        start = None;
                    }
                    _ => {}
                }
            }
            let mut i = 0;
            while i < groups.len() {
                let found = (i..groups.len()).rev().find(|&j| {
                    let run = &text[groups[i].start..groups[j].end];
                    // Dots or double spaces: only card-like groups (a decimal number is no card).
                    let loose = run.contains('.') || run.contains("  ");
                    if loose && !groups[i..=j].iter().all(|g| (3..=6).contains(&g.len())) {
                        return false;
                    }
                    let digits: Vec<u8> = run.bytes().filter(u8::is_ascii_digit).map(|b| b - b'0').collect();
                    (13..=19).contains(&digits.len()) && digits.iter().any(|&d| d != 0) && luhn(&digits)
                });
                match found {
                    Some(j) => {
                        out.push(groups[i].start..groups[j].end);
                        i = j + 1;
                    }
                    None => i += 1,
                }
            }
        }
        out
    }

    fn ibans(&self, text: &str) -> Vec<Range<usize>> {
        let mut out = Vec::new();
        for m in self.iban.find_iter(text) {
            // Byte end of each compact (space-free) prefix length.
            let ends: Vec<usize> = m
                .as_str()
                .char_indices()
                .filter(|(_, c)| *c != ' ')
                .map(|(i, c)| m.start() + i + c.len_utf8())
                .collect();
            let country = m.as_str()[..2].to_ascii_uppercase();
            let known = IBAN_LENGTHS.iter().find(|(c, _)| *c == country).map(|&(_, len)| len);
            let lengths: Vec<usize> = known.map_or_else(|| (15..=34).rev().collect(), |len| vec![len]);
            let hit = lengths.into_iter().filter(|&len| len <= ends.len()).find(|&len| {
                let candidate = &text[m.start()..ends[len - 1]];
                // Lower case needs a known country: its one length leaves 1 chance in 97
                // to a random string, where the 20 lengths of an unknown one leave 1 in 5.
                let cased = known.is_some() || !candidate.bytes().any(|b| b.is_ascii_lowercase());
                cased && !alnum_after(text, ends[len - 1]) && iban_mod97(candidate)
            });
            if let Some(len) = hit {
                out.push(m.start()..ends[len - 1]);
            }
        }
        out
    }

    fn ssns(&self, text: &str) -> Vec<Range<usize>> {
        self.ssn
            .captures_iter(text)
            .filter(|c| {
                let (area, group, serial) = (&c[1], &c[2], &c[3]);
                area != "000" && area != "666" && !area.starts_with('9') && group != "00" && serial != "0000"
            })
            .filter_map(|c| c.get(0).map(|m| m.range()))
            .filter(|r| !dash_digit_around(text, r))
            .collect()
    }

    fn ips(&self, text: &str) -> Vec<Range<usize>> {
        let mut out: Vec<Range<usize>> = self
            .ipv6
            .find_iter(text)
            .filter_map(|m| {
                let s = m.as_str().trim_end_matches('.');
                let range = m.start()..m.start() + s.len();
                let ok = s.bytes().filter(|&b| b == b':').count() >= 2
                    && s.bytes().any(|b| b.is_ascii_hexdigit())
                    && !word_before(text, range.start)
                    && !word_after(text, range.end)
                    && s.parse::<Ipv6Addr>().is_ok();
                ok.then_some(range)
            })
            .collect();
        out.extend(
            self.ipv4
                .find_iter(text)
                .filter(|m| {
                    let dotted_before = text[..m.start()].ends_with('.');
                    let dotted_after = text[m.end()..].starts_with('.')
                        && text[m.end() + 1..].bytes().next().is_some_and(|b| b.is_ascii_digit());
                    !dotted_before && !dotted_after && m.as_str().parse::<Ipv4Addr>().is_ok()
                })
                .map(|m| m.range()),
        );
        out
    }

    fn api_keys(&self, text: &str) -> Vec<Range<usize>> {
        self.api_key
            .find_iter(text)
            .filter(|m| {
                !text[m.end()..].chars().next().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            })
            .map(|m| m.range())
            .collect()
    }
}

#[cfg(test)]
mod tests;
