//! Look-alike letters for keyword matching: the common Cyrillic and Greek
//! look-alikes of Latin letters, the Turkish dotted and dotless i, and
//! combining marks that only decorate an ASCII letter. Applied to the
//! normalized text and to the keywords alike; not to what PII patterns or
//! regex rules read.

use std::borrow::Cow;

use unicode_normalization_alignments::char::is_combining_mark;

/// For keyword matching (text and keywords alike): the common Cyrillic and
/// Greek look-alikes of Latin letters to those letters (`о` is `o`), the
/// Turkish `İ` and `ı` to `I` and `i` (so that a case-insensitive `ignore`
/// matches `İGNORE`), and combining marks after an ASCII letter dropped (NFKC
/// left them: no precomposed letter has them, so they only decorate).
/// Borrowed when nothing changes. A word of another script made only of
/// look-alikes reads as Latin (`сор` matches a keyword `cop`); a keyword is
/// folded as the text is, so a Cyrillic keyword still matches Cyrillic text.
pub(crate) fn fold_confusables(text: &str) -> Cow<'_, str> {
    if text.is_ascii() {
        return Cow::Borrowed(text);
    }
    let mut out: Option<String> = None;
    let mut after_letter = false;
    for (i, c) in text.char_indices() {
        let folded = if after_letter && is_combining_mark(c) { None } else { Some(confusable(c).unwrap_or(c)) };
        if folded != Some(c) && out.is_none() {
            out = Some(text[..i].to_owned());
        }
        if let Some(f) = folded {
            after_letter = f.is_ascii_alphabetic();
            if let Some(o) = out.as_mut() {
                o.push(f);
            }
        }
    }
    out.map_or(Cow::Borrowed(text), Cow::Owned)
}

/// The Latin letter `c` looks like, if it is a common look-alike of one.
fn confusable(c: char) -> Option<char> {
    Some(match c {
        // Cyrillic: the look-alikes, and their other case (a case-insensitive
        // match needs both cases folded alike: `т` with `Т`).
        'а' => 'a',
        'в' => 'b',
        'ԁ' => 'd',
        'е' => 'e',
        'һ' | 'н' => 'h',
        'і' => 'i',
        'ј' => 'j',
        'к' => 'k',
        'ӏ' | 'Ӏ' => 'l',
        'м' => 'm',
        'о' => 'o',
        'р' => 'p',
        'ԛ' => 'q',
        'ѕ' => 's',
        'т' => 't',
        'ԝ' => 'w',
        'х' => 'x',
        'у' | 'ү' => 'y',
        'с' => 'c',
        'А' => 'A',
        'В' => 'B',
        'С' => 'C',
        'Ԁ' => 'D',
        'Е' => 'E',
        'Н' | 'Һ' => 'H',
        'І' => 'I',
        'Ј' => 'J',
        'К' => 'K',
        'М' => 'M',
        'О' => 'O',
        'Р' => 'P',
        'Ԛ' => 'Q',
        'Ѕ' => 'S',
        'Т' => 'T',
        'Ԝ' => 'W',
        'Х' => 'X',
        'У' | 'Ү' => 'Y',
        // Greek, both cases alike too.
        'α' => 'a',
        'β' => 'b',
        'ϲ' => 'c',
        'ε' => 'e',
        'η' => 'h',
        'ι' => 'i',
        'ϳ' => 'j',
        'κ' => 'k',
        'μ' => 'm',
        'ν' => 'n',
        'ο' => 'o',
        'ρ' => 'p',
        'τ' => 't',
        'χ' => 'x',
        'υ' => 'y',
        'ζ' => 'z',
        'Α' => 'A',
        'Β' => 'B',
        'Ϲ' => 'C',
        'Ε' => 'E',
        'Η' => 'H',
        'Ι' => 'I',
        'Ϳ' => 'J',
        'Κ' => 'K',
        'Μ' => 'M',
        'Ν' => 'N',
        'Ο' => 'O',
        'Ρ' => 'P',
        'Τ' => 'T',
        'Χ' => 'X',
        'Υ' => 'Y',
        'Ζ' => 'Z',
        // Latin.
        'İ' => 'I',
        'ı' => 'i',
        'ɑ' => 'a',
        'Ɑ' => 'A',
        'ɡ' => 'g',
        'Ɡ' => 'G',
        'ȷ' => 'j',
        'ǀ' => 'l',
        _ => return None,
    })
}
