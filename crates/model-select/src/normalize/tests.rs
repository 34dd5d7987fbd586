//! Each step, the borrowed fast path, and spans mapped back to the original.

use super::*;

/// The normalized text, and what each of `spans` (in it) covers of the original.
fn norm<'a>(original: &'a str, spans: &[(usize, usize)]) -> (String, Vec<&'a str>) {
    let n = Normalized::new(original);
    (n.as_str().to_owned(), spans.iter().map(|&(start, end)| &original[n.original_span(start..end)]).collect())
}

#[test]
fn text_no_step_changes_is_borrowed() {
    for text in ["plain ascii a@b.io", "Tom & Jerry &&", "请帮我写一封邮件", "café déjà", ""] {
        let n = Normalized::new(text);
        assert!(!n.is_changed(), "{text:?}");
        assert_eq!((n.as_str(), n.original_span(1..3)), (text, 1..3));
    }
}

#[test]
fn references_are_decoded_and_map_back_whole() {
    let (text, spans) = norm("mail jane&#64;example.com now", &[(5, 21)]);
    assert_eq!(text, "mail jane@example.com now");
    assert_eq!(spans, ["jane&#64;example.com"]);
    assert_eq!(norm("a&#x40;b&commat;c&amp;#64;d", &[]).0, "a@b@c@d");
    assert_eq!(norm("x &amp; y &unknown; &#0;", &[]).0, "x & y &unknown; &#0;");
}

#[test]
fn nfkc_maps_fullwidth_ligatures_and_spaces() {
    let original = "ｊａｎｅ＠ｅｘａｍｐｌｅ．ｃｏｍ!";
    let (text, spans) = norm(original, &[(0, 16)]);
    assert_eq!(text, "jane@example.com!");
    assert_eq!(spans, [&original[..original.len() - 1]]);
    // The ligature's second letter maps to the ligature.
    assert_eq!(norm("an ﬁle", &[(4, 7)]), ("an file".to_owned(), vec!["ﬁle"]));
    // A composed pair maps to both chars.
    assert_eq!(norm("e\u{301}!", &[(0, 2)]), ("é!".to_owned(), vec!["e\u{301}"]));
    assert_eq!(norm("a\u{A0}b\u{3000}c", &[]).0, "a b c");
}

#[test]
fn invisible_characters_are_removed() {
    let original = "ig\u{AD}no\u{200B}re j\u{200D}a\u{FEFF}ne@x\u{2060}.io\u{FE0F}";
    let (text, spans) = norm(original, &[(0, 6), (7, 17)]);
    assert_eq!(text, "ignore jane@x.io");
    assert_eq!(spans, ["ig\u{AD}no\u{200B}re", "j\u{200D}a\u{FEFF}ne@x\u{2060}.io"]);
    assert_eq!(norm("a&shy;b", &[]).0, "ab");
}

#[test]
fn digits_and_dashes_of_other_scripts_become_ascii() {
    let (text, spans) = norm("tel ٠٦ ١٢ ۳۴ ५६ ७८", &[(4, 18)]);
    assert_eq!(text, "tel 06 12 34 56 78");
    assert_eq!(spans, ["٠٦ ١٢ ۳۴ ५६ ७८"]);
    assert_eq!(norm("123–45—6789 a‐b c−d ＋１", &[]).0, "123-45-6789 a-b c-d +1");
}

#[test]
fn spans_at_the_edges() {
    let n = Normalized::new("ａｂ");
    assert_eq!(n.original_span(0..0), 0..0);
    assert_eq!(n.original_span(2..2), 6..6);
    assert_eq!(n.original_span(0..2), 0..6);
}

#[test]
fn confusables_fold_to_latin_for_keywords() {
    assert_eq!(fold_confusables("ign\u{43E}re"), "ignore");
    assert_eq!(fold_confusables("İGNORE ıgnore"), "IGNORE ignore");
    assert_eq!(fold_confusables("ΙGΝΟRΕ ρay"), "IGNORE pay");
    // Both cases of a letter fold alike (case-insensitive matching compares them).
    for (upper, lower) in [('Т', 'т'), ('Н', 'н'), ('Ν', 'ν'), ('Υ', 'υ'), ('Ӏ', 'ӏ'), ('Β', 'β')] {
        let (u, l) =
            (fold_confusables(&upper.to_string()).into_owned(), fold_confusables(&lower.to_string()).into_owned());
        assert!(u.eq_ignore_ascii_case(&l) && u.is_ascii(), "{upper} {lower}");
    }
    assert_eq!(fold_confusables("i\u{334}g\u{335}nore café"), "ignore café");
    assert!(matches!(fold_confusables("plain"), Cow::Borrowed(_)));
    assert!(matches!(fold_confusables("请帮我 straße"), Cow::Borrowed(_)));
}
