//! HTML character references as the normalizer decodes them: numeric ones
//! (`&#64;`, `&#x40;`, the `;` optional as browsers allow) and the named ones
//! that can spell the punctuation, spaces and invisible characters the
//! detectors look at (`&commat;`, `&period;`, `&amp;`, `&shy;`...). Not a full
//! HTML5 table: a name outside it stays as written.

/// How many `&amp;` layers are peeled off one reference (`&amp;amp;#64;` is `@`).
const MAX_LAYERS: usize = 4;

/// Named references decoded (HTML5 names, case-sensitive), sorted by name.
const NAMED: &[(&str, char)] = &[
    ("AMP", '&'),
    ("GT", '>'),
    ("LT", '<'),
    ("NewLine", '\n'),
    ("NoBreak", '\u{2060}'),
    ("QUOT", '"'),
    ("Tab", '\t'),
    ("ZeroWidthSpace", '\u{200B}'),
    ("amp", '&'),
    ("apos", '\''),
    ("ast", '*'),
    ("bsol", '\\'),
    ("colon", ':'),
    ("comma", ','),
    ("commat", '@'),
    ("dash", '\u{2010}'),
    ("dollar", '$'),
    ("emsp", '\u{2003}'),
    ("ensp", '\u{2002}'),
    ("equals", '='),
    ("excl", '!'),
    ("grave", '`'),
    ("gt", '>'),
    ("hyphen", '\u{2010}'),
    ("lbrace", '{'),
    ("lbrack", '['),
    ("lcub", '{'),
    ("lowbar", '_'),
    ("lpar", '('),
    ("lsqb", '['),
    ("lt", '<'),
    ("mdash", '\u{2014}'),
    ("minus", '\u{2212}'),
    ("nbsp", '\u{A0}'),
    ("ndash", '\u{2013}'),
    ("num", '#'),
    ("percnt", '%'),
    ("period", '.'),
    ("plus", '+'),
    ("quest", '?'),
    ("quot", '"'),
    ("rbrace", '}'),
    ("rbrack", ']'),
    ("rcub", '}'),
    ("rpar", ')'),
    ("rsqb", ']'),
    ("semi", ';'),
    ("shy", '\u{AD}'),
    ("sol", '/'),
    ("thinsp", '\u{2009}'),
    ("verbar", '|'),
    ("vert", '|'),
    ("zwj", '\u{200D}'),
    ("zwnj", '\u{200C}'),
];

/// The reference starting at the `&` at byte `at` of `text`: the char it
/// stands for and the byte just past it; `None` when no reference starts there.
pub(super) fn decode(text: &str, at: usize) -> Option<(char, usize)> {
    let mut end = at + 1;
    let mut decoded = None;
    for _ in 0..MAX_LAYERS {
        let Some((c, len)) = body(&text[end..]) else { break };
        end += len;
        decoded = Some((c, end));
        if c != '&' {
            break;
        }
    }
    decoded
}

/// A reference's body after its `&`: the char and the body's length in bytes.
fn body(rest: &str) -> Option<(char, usize)> {
    let bytes = rest.as_bytes();
    if bytes.first() == Some(&b'#') {
        let hex = matches!(bytes.get(1), Some(b'x' | b'X'));
        let (skip, radix, max) = if hex { (2, 16, 6) } else { (1, 10, 7) };
        let digits = bytes[skip..].iter().take(max + 1).take_while(|b| (**b as char).is_digit(radix)).count();
        if digits == 0 || digits > max {
            return None;
        }
        let value = u32::from_str_radix(&rest[skip..skip + digits], radix).ok()?;
        let c = char::from_u32(value).filter(|&c| c != '\0')?;
        let semi = usize::from(bytes.get(skip + digits) == Some(&b';'));
        return Some((c, skip + digits + semi));
    }
    let name = bytes.iter().take(16).take_while(|b| b.is_ascii_alphanumeric()).count();
    if bytes.get(name) != Some(&b';') {
        return None;
    }
    let i = NAMED.binary_search_by(|(n, _)| n.cmp(&&rest[..name])).ok()?;
    Some((NAMED[i].1, name + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at0(s: &str) -> Option<(char, usize)> {
        decode(s, 0)
    }

    #[test]
    fn the_table_is_sorted() {
        assert!(NAMED.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn numeric_named_and_layered_references() {
        assert_eq!(at0("&#64;x"), Some(('@', 5)));
        assert_eq!(at0("&#x40;"), Some(('@', 6)));
        assert_eq!(at0("&#X40 "), Some(('@', 5)), "the ; is optional");
        assert_eq!(at0("&commat;"), Some(('@', 8)));
        assert_eq!(at0("&amp;"), Some(('&', 5)));
        assert_eq!(at0("&amp;#64;"), Some(('@', 9)));
        assert_eq!(at0("&amp;amp;commat;"), Some(('@', 16)));
        assert_eq!(at0("& b"), None);
        assert_eq!(at0("&commat"), None, "a name needs its ;");
        assert_eq!(at0("&unknown;"), None);
        assert_eq!(at0("&#;"), None);
        assert_eq!(at0("&#xD800;"), None, "a surrogate is no char");
        assert_eq!(at0("&#0;"), None);
        assert_eq!(at0("&#99999999;"), None, "too many digits");
    }
}
