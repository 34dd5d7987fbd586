//! A hand-written scanner for the split patterns of Qwen2/2.5/3 and Llama 3
//! (GPT-4's pattern with one digit per piece, or up to three), exact on ASCII
//! text, and the cut of a text into regions no piece crosses, so that only
//! the few words around other characters go to the regex.
//!
//! The pattern, with the look-ahead of its tail:
//! `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
//! On ASCII, `\p{L}` is `[A-Za-z]`, `\p{N}` is `[0-9]` and `\s` (Unicode's
//! White_Space) is `[\t\n\x0B\x0C\r ]`; the alternatives are tried in order
//! at each position, as the regex's leftmost-first semantics do.

/// A character class on ASCII.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Letter,
    Digit,
    Space,
    Other,
}

const fn classes() -> [Class; 128] {
    let mut t = [Class::Other; 128];
    let mut b = 0;
    while b < 128 {
        t[b] = match b as u8 {
            b'A'..=b'Z' | b'a'..=b'z' => Class::Letter,
            b'0'..=b'9' => Class::Digit,
            b'\t' | b'\n' | 0x0B | 0x0C | b'\r' | b' ' => Class::Space,
            _ => Class::Other,
        };
        b += 1;
    }
    t
}

static CLASSES: [Class; 128] = classes();

fn class(b: u8) -> Class {
    CLASSES[(b & 0x7F) as usize]
}

/// The scanner of one of the two patterns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GptSplit {
    /// Digits one piece takes at most: 1 (Qwen's `\p{N}`) or 3 (Llama 3's `\p{N}{1,3}`).
    max_digits: usize,
}

impl GptSplit {
    /// The scanner of the pattern whose alternatives before the whitespace tail are `prefix`,
    /// if it is one of the two.
    pub(crate) fn of_prefix(prefix: &str) -> Option<Self> {
        const HEAD: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|";
        const TAIL: &str = r"| ?[^\s\p{L}\p{N}]+[\r\n]*";
        match prefix.strip_prefix(HEAD)?.strip_suffix(TAIL)? {
            r"\p{N}" => Some(Self { max_digits: 1 }),
            r"\p{N}{1,3}" => Some(Self { max_digits: 3 }),
            _ => None,
        }
    }

    /// Hands each piece of `text` (ASCII only) to `piece` as its byte range, in order; the
    /// pieces cover the text (every ASCII character starts some alternative).
    pub(crate) fn split_ascii<E>(
        &self,
        text: &[u8],
        mut piece: impl FnMut(usize, usize) -> Result<(), E>,
    ) -> Result<(), E> {
        debug_assert!(text.is_ascii());
        let n = text.len();
        // The class of the character at `i`, none past the end.
        let at = |i: usize| text.get(i).map(|&b| class(b));
        let run = |mut i: usize, c: Class| {
            while i < n && class(text[i]) == c {
                i += 1;
            }
            i
        };
        let mut i = 0;
        while i < n {
            let b = text[i];
            let end = match class(b) {
                _ if b == b'\''
                    && let Some(len) = contraction(&text[i + 1..]) =>
                {
                    i + 1 + len
                }
                Class::Letter => run(i, Class::Letter),
                // `[^\r\n\p{L}\p{N}]?\p{L}+`: one character of any other kind but a newline, then letters.
                Class::Space | Class::Other if b != b'\r' && b != b'\n' && at(i + 1) == Some(Class::Letter) => {
                    run(i + 1, Class::Letter)
                }
                Class::Digit => run(i, Class::Digit).min(i + self.max_digits),
                // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
                Class::Other => newlines(text, run(i, Class::Other)),
                Class::Space if b == b' ' && at(i + 1) == Some(Class::Other) => {
                    newlines(text, run(i + 1, Class::Other))
                }
                Class::Space => {
                    let k = run(i, Class::Space);
                    match text[i..k].iter().rposition(|&c| c == b'\r' || c == b'\n') {
                        // `\s*[\r\n]+`: up to the run's last newline.
                        Some(last) => i + last + 1,
                        // `\s+(?!\S)`: a run before a non-space gives its last character to it.
                        None if k < n && k - i >= 2 => k - 1,
                        // `\s+`
                        None => k,
                    }
                }
            };
            piece(i, end)?;
            i = end;
        }
        Ok(())
    }
}

/// The length of a contraction (`s`, `t`, `re`, `ve`, `m`, `ll`, `d`, any case) at the start of
/// `rest` (what follows an apostrophe).
fn contraction(rest: &[u8]) -> Option<usize> {
    let lower = |i: usize| rest.get(i).map(|b| b.to_ascii_lowercase());
    match (lower(0)?, lower(1)) {
        (b's' | b't' | b'm' | b'd', _) => Some(1),
        (b'r' | b'v', Some(b'e')) | (b'l', Some(b'l')) => Some(2),
        _ => None,
    }
}

/// `[\r\n]*` from `i`.
fn newlines(text: &[u8], mut i: usize) -> usize {
    while i < text.len() && (text[i] == b'\r' || text[i] == b'\n') {
        i += 1;
    }
    i
}

/// Whether no piece of either pattern crosses position `p` of `text`, whatever comes before:
/// after an ASCII letter or digit followed by an ASCII character that is neither (the letter
/// run, contraction or number holding `p - 1` ends there), or after a `\n` followed by an ASCII
/// character that is not a space (the run of spaces or the symbols holding the `\n` end with
/// it). Matching from `p` never looks behind it, so the text on each side splits alone.
fn cut(text: &[u8], p: usize) -> bool {
    let (Some(&before), Some(&at)) = (text.get(p.wrapping_sub(1)), text.get(p)) else { return false };
    if !before.is_ascii() || !at.is_ascii() {
        return false;
    }
    match (class(before), class(at)) {
        (Class::Letter | Class::Digit, Class::Space | Class::Other) => true,
        (Class::Space, Class::Letter | Class::Digit | Class::Other) => before == b'\n',
        _ => false,
    }
}

/// The regions of `text` in order, covering it: `(start, end, ascii)`. The ASCII ones are for
/// the scanner; each other holds non-ASCII characters with some ASCII around them, from the
/// last cut before them to the first cut after (see [`cut`]), for the regex.
pub(crate) fn regions(text: &str) -> impl Iterator<Item = (usize, usize, bool)> + '_ {
    let bytes = text.as_bytes();
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= bytes.len() {
            return None;
        }
        let start = at;
        // `is_ascii` first: it reads words at a time, the search for the byte bytes.
        let first = (!bytes[at..].is_ascii()).then(|| bytes[at..].iter().position(|b| !b.is_ascii())).flatten();
        let Some(q) = first.map(|q| at + q) else {
            at = bytes.len();
            return Some((start, at, true));
        };
        // ASCII up to the last cut before the first non-ASCII byte, if there is one.
        if let Some(c) = (start + 1..q).rev().find(|&p| cut(bytes, p)) {
            at = c;
            return Some((start, c, true));
        }
        at = (q + 1..bytes.len()).find(|&p| cut(bytes, p)).unwrap_or(bytes.len());
        Some((start, at, false))
    })
}
