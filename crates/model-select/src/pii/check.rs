//! The validators behind the PII patterns: checksums (Luhn, IBAN mod 97),
//! IBAN lengths by country, and what may stand next to a finding. Pure
//! functions of bytes; no pattern here.

use std::ops::Range;

/// IBAN lengths of common countries; others must be 15..=34 long.
pub(super) const IBAN_LENGTHS: &[(&str, usize)] = &[
    ("AT", 20),
    ("BE", 16),
    ("CH", 21),
    ("CZ", 24),
    ("DE", 22),
    ("DK", 18),
    ("ES", 24),
    ("FI", 18),
    ("FR", 27),
    ("GB", 22),
    ("GR", 27),
    ("HU", 28),
    ("IE", 22),
    ("IT", 27),
    ("LU", 20),
    ("NL", 18),
    ("NO", 15),
    ("PL", 28),
    ("PT", 25),
    ("RO", 24),
    ("SE", 24),
];

/// Whether the char before `at` is a letter, digit or `_`.
pub(super) fn word_before(text: &str, at: usize) -> bool {
    text[..at].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_')
}

/// Whether the char at `at` is a letter, digit or `_`.
pub(super) fn word_after(text: &str, at: usize) -> bool {
    text[at..].chars().next().is_some_and(|c| c.is_alphanumeric() || c == '_')
}

/// Whether the char at `at` is a letter or digit.
pub(super) fn alnum_after(text: &str, at: usize) -> bool {
    text[at..].chars().next().is_some_and(char::is_alphanumeric)
}

/// Whether `range` is glued to more digits by a dash (`1-123-45-6789`).
pub(super) fn dash_digit_around(text: &str, range: &Range<usize>) -> bool {
    let before = text[..range.start].strip_suffix('-').is_some_and(|t| t.ends_with(|c: char| c.is_ascii_digit()));
    let after = text[range.end..].strip_prefix('-').is_some_and(|t| t.starts_with(|c: char| c.is_ascii_digit()));
    before || after
}

/// The Luhn checksum over decimal digits (most significant first).
pub(super) fn luhn(digits: &[u8]) -> bool {
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| {
            let d = u32::from(d);
            if i % 2 == 1 {
                let x = d * 2;
                if x > 9 { x - 9 } else { x }
            } else {
                d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// The IBAN check: move the first four characters to the end, letters (of
/// either case) to 10..=35, the number mod 97 must be 1. Spaces are ignored.
pub(super) fn iban_mod97(iban: &str) -> bool {
    let compact: Vec<u8> = iban.bytes().filter(|&b| b != b' ').map(|b| b.to_ascii_uppercase()).collect();
    if compact.len() < 5 || !compact[2..4].iter().all(u8::is_ascii_digit) {
        return false;
    }
    let mut rem: u32 = 0;
    for &b in compact[4..].iter().chain(&compact[..4]) {
        match b {
            b'0'..=b'9' => rem = (rem * 10 + u32::from(b - b'0')) % 97,
            b'A'..=b'Z' => rem = (rem * 100 + u32::from(b - b'A' + 10)) % 97,
            _ => return false,
        }
    }
    rem == 1
}
