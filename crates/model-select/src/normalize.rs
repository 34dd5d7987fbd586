//! The text the detectors read (keywords, regex, PII): the request's text
//! with its encodings undone, so that `jane&#64;example.com`, a fullwidth
//! `＠`, digits of another script or a zero-width space inside a word do not
//! hide what they spell. One pass, in this order:
//!
//! 1. HTML character references decoded ([`entities`]);
//! 2. Unicode NFKC (fullwidth and compatibility forms, ligatures, NBSP...);
//! 3. default-ignorable code points removed (zero-width space, joiners,
//!    soft hyphen, word joiner, BOM, bidi controls, variation selectors...);
//! 4. decimal digits of other scripts to ASCII (`٤` is `4`), dashes (`–`,
//!    `—`, `‐`, `−`) to `-`.
//!
//! Every char of the result remembers the bytes of the original it came from,
//! so a span found in the normalized text maps back to the original
//! ([`Normalized::original_span`]): redaction replaces the original's bytes.
//! ASCII text without `&` (and any text the steps leave alone) is returned
//! borrowed, with no map: the common case costs one scan. Otherwise only
//! the runs a step changes (a fullwidth comma in Chinese text, an entity)
//! go through the steps, and the text between them is copied. Keyword matching
//! also folds look-alike letters ([`fold_confusables`]); the PII detector and
//! regex rules do not. Owns no detector.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::OnceLock;

use unicode_normalization_alignments::char::canonical_combining_class;
use unicode_normalization_alignments::{IsNormalized, UnicodeNormalization, is_nfkc_quick};

mod confusables;
mod entities;

pub(crate) use confusables::fold_confusables;

/// [`inert_bmp`]'s bits.
static INERT_BMP: OnceLock<Box<[u64]>> = OnceLock::new();

/// A text as the detectors read it.
#[derive(Debug, Clone)]
pub(crate) struct Normalized<'a> {
    text: Cow<'a, str>,
    /// The original's length in bytes.
    original_len: usize,
    /// When `text` differs from the original: where its bytes came from, in order.
    pieces: Vec<Piece>,
}

/// Where a piece of a normalized text came from: a run copied as it was, or
/// one char the steps produced.
#[derive(Debug, Clone, Copy)]
struct Piece {
    /// Its byte offset in the normalized text.
    at: usize,
    /// The original's bytes it stands for (for one char: a decoded reference,
    /// a decomposed ligature's first char or a composed pair is more than one char).
    start: usize,
    end: usize,
    /// Copied: the normalized and original bytes correspond one to one.
    copied: bool,
}

/// The zero of each run of ten decimal digits (Unicode `Nd`) that NFKC does
/// not map to ASCII (it maps the fullwidth and mathematical ones), sorted.
const DIGIT_ZEROS: [u32; 58] = [
    0x660, 0x6F0, 0x7C0, 0x966, 0x9E6, 0xA66, 0xAE6, 0xB66, 0xBE6, 0xC66, 0xCE6, 0xD66, 0xDE6, 0xE50, 0xED0, 0xF20,
    0x1040, 0x1090, 0x17E0, 0x1810, 0x1946, 0x19D0, 0x1A80, 0x1A90, 0x1B50, 0x1BB0, 0x1C40, 0x1C50, 0xA620, 0xA8D0,
    0xA900, 0xA9D0, 0xA9F0, 0xAA50, 0xABF0, 0x104A0, 0x10D30, 0x11066, 0x110F0, 0x11136, 0x111D0, 0x112F0, 0x11450,
    0x114D0, 0x11650, 0x116C0, 0x11730, 0x118E0, 0x11950, 0x11C50, 0x11D50, 0x11DA0, 0x16A60, 0x16AC0, 0x16B50,
    0x1E140, 0x1E2F0, 0x1E950,
];

// === impl Normalized ===

impl<'a> Normalized<'a> {
    /// `original` normalized (borrowed when no step changes it). Only the
    /// runs that some step changes go through the steps; the text between
    /// them is copied.
    pub(crate) fn new(original: &'a str) -> Self {
        let borrowed = Normalized { text: Cow::Borrowed(original), original_len: original.len(), pieces: Vec::new() };
        if original.is_ascii() && !original.as_bytes().contains(&b'&') {
            return borrowed;
        }
        let runs = runs_to_normalize(original);
        if runs.is_empty() {
            return borrowed;
        }
        let mut text = String::with_capacity(original.len());
        let mut pieces = Vec::new();
        let copy = |text: &mut String, pieces: &mut Vec<Piece>, from: Range<usize>| {
            if !from.is_empty() {
                pieces.push(Piece { at: text.len(), start: from.start, end: from.end, copied: true });
                text.push_str(&original[from]);
            }
        };
        let (mut done, mut chars) = (0, Vec::new());
        for run in runs {
            copy(&mut text, &mut pieces, done..run.start);
            normalize_run(original, run.clone(), &mut chars, &mut text, &mut pieces);
            done = run.end;
        }
        copy(&mut text, &mut pieces, done..original.len());
        if text == original {
            return borrowed;
        }
        Normalized { text: Cow::Owned(text), original_len: original.len(), pieces }
    }

    /// The normalized text.
    pub(crate) fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether it differs from the original.
    pub(crate) fn is_changed(&self) -> bool {
        matches!(self.text, Cow::Owned(_))
    }

    /// The bytes of the original that `span` (char boundaries of the
    /// normalized text) came from: from its first char's first byte to its
    /// last char's last byte.
    pub(crate) fn original_span(&self, span: Range<usize>) -> Range<usize> {
        if !self.is_changed() {
            return span;
        }
        let piece = |at: usize| self.pieces.partition_point(|p| p.at <= at).checked_sub(1).map(|i| self.pieces[i]);
        let start = match piece(span.start) {
            _ if span.start >= self.text.len() => self.original_len,
            Some(p) if p.copied => p.start + (span.start - p.at),
            Some(p) => p.start,
            None => 0,
        };
        if span.is_empty() {
            return start..start;
        }
        let end = match piece(span.end - 1) {
            Some(p) if p.copied => p.start + (span.end - p.at),
            Some(p) => p.end,
            None => start,
        };
        start..end.max(start)
    }
}

/// The byte ranges of `text` some step changes: each from the char before
/// its first changed char (which may compose with it) up to the next char
/// that is left as it is and that nothing before it combines with (a
/// normalization boundary); a reference whole. Sorted, disjoint.
fn runs_to_normalize(text: &str) -> Vec<Range<usize>> {
    let bmp = INERT_BMP.get_or_init(inert_bmp);
    let bytes = text.as_bytes();
    let mut runs: Vec<Range<usize>> = Vec::new();
    let mut open: Option<Range<usize>> = None;
    let mut previous: Option<usize> = None;
    let mut i = 0;
    while i < bytes.len() {
        // ASCII other than `&` is left as it is: skipped byte by byte.
        let ascii = bytes[i..].iter().take_while(|&&b| b < 0x80 && b != b'&').count();
        if ascii > 0 {
            runs.extend(open.take());
            i += ascii;
            previous = Some(i - 1);
            continue;
        }
        let Some(c) = text[i..].chars().next() else { break };
        let changed_until = match c {
            '&' => entities::decode(text, i).map(|(_, end)| end),
            c if inert(c, bmp) => None,
            c => Some(i + c.len_utf8()),
        };
        match changed_until {
            Some(end) => {
                open = Some(match open {
                    Some(run) => run.start..end,
                    None => previous.unwrap_or(i)..end,
                });
                previous = None;
                i = end;
            }
            None => {
                runs.extend(open.take());
                previous = Some(i);
                i += c.len_utf8();
            }
        }
    }
    runs.extend(open);
    runs
}

/// Whether `c` (not ASCII) is left as it is and is a normalization boundary:
/// NFKC keeps it (quick check yes), it has combining class 0, and no other
/// step changes it. A bit lookup in `bmp` ([`inert_bmp`]) for the BMP.
fn inert(c: char, bmp: &[u64]) -> bool {
    let code = u32::from(c) as usize;
    match bmp.get(code / 64) {
        Some(bits) => bits >> (code % 64) & 1 == 1,
        None => inert_by_tables(c),
    }
}

/// [`inert`] for every BMP char, one bit each: 8 KiB worked out once per
/// process (a few ms), where the NFKC tables cost some 40 ns a char.
fn inert_bmp() -> Box<[u64]> {
    let mut bits = vec![0u64; 0x10000 / 64];
    for (code, c) in (0..0x10000u32).filter_map(|code| Some((code as usize, char::from_u32(code)?))) {
        if inert_by_tables(c) {
            bits[code / 64] |= 1 << (code % 64);
        }
    }
    bits.into_boxed_slice()
}

/// [`inert`], from the tables.
fn inert_by_tables(c: char) -> bool {
    !ignorable(c)
        && fold(c) == Some(c)
        && canonical_combining_class(c) == 0
        && is_nfkc_quick(std::iter::once(c)) == IsNormalized::Yes
}

/// Steps 1 to 4 on `original[run]`, appended to `text` one piece per char
/// (`chars` is scratch space, reused from run to run).
fn normalize_run(
    original: &str,
    run: Range<usize>,
    chars: &mut Vec<(char, Range<usize>)>,
    text: &mut String,
    pieces: &mut Vec<Piece>,
) {
    // Step 1: references decoded, ignorables dropped (so that NFKC composes across them).
    chars.clear();
    let mut i = run.start;
    while i < run.end {
        let Some(c) = original[i..].chars().next() else { break };
        let (c, end) = match c {
            '&' => entities::decode(original, i).unwrap_or(('&', i + 1)),
            c => (c, i + c.len_utf8()),
        };
        if !ignorable(c) {
            chars.push((c, i..end));
        }
        i = end;
    }
    // Steps 2 to 4. Each output char of NFKC says how many input chars it
    // consumed (`1 - change`: 0 for the second char of a decomposition, 2
    // for a composed pair); one that consumed none maps to its predecessor's bytes.
    let (mut next, mut last) = (0, run.start..run.start);
    for (c, change) in chars.iter().map(|(c, _)| *c).nfkc() {
        let consumed = usize::try_from(1 - change).unwrap_or(0);
        if consumed > 0 && next < chars.len() {
            let stop = (next + consumed).min(chars.len());
            last = chars[next].1.start..chars[stop - 1].1.end;
            next = stop;
        }
        if let Some(c) = fold(c) {
            pieces.push(Piece { at: text.len(), start: last.start, end: last.end, copied: false });
            text.push(c);
        }
    }
}

/// Step 4 for one char of NFKC's output: `None` drops it (default-ignorable).
fn fold(c: char) -> Option<char> {
    if c.is_ascii() {
        return Some(c);
    }
    if ignorable(c) {
        return None;
    }
    if matches!(
        c,
        '\u{2010}'..='\u{2015}' | '\u{2212}' | '\u{2E3A}' | '\u{2E3B}' | '\u{FE58}' | '\u{FE63}' | '\u{FF0D}'
    ) {
        return Some('-');
    }
    let code = u32::from(c);
    if code < DIGIT_ZEROS[0] {
        return Some(c);
    }
    let run = DIGIT_ZEROS.partition_point(|&zero| zero <= code);
    match run.checked_sub(1).map(|r| code - DIGIT_ZEROS[r]) {
        Some(digit @ 0..=9) => char::from_digit(digit, 10),
        _ => Some(c),
    }
}

/// Unicode's `Default_Ignorable_Code_Point`: invisible, so removed.
fn ignorable(c: char) -> bool {
    matches!(
        u32::from(c),
        0xAD | 0x34F
            | 0x61C
            | 0x115F..=0x1160
            | 0x17B4..=0x17B5
            | 0x180B..=0x180F
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x206F
            | 0x3164
            | 0xFE00..=0xFE0F
            | 0xFEFF
            | 0xFFA0
            | 0xFFF0..=0xFFF8
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0000..=0xE0FFF
    )
}

#[cfg(test)]
mod tests;
