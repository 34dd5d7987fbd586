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

#[test]
fn hangul_jamo_and_kana_compose_across_the_runs() {
    assert_eq!(norm("가\u{11A8} \u{1100}\u{1161}", &[]).0, "각 가");
    assert_eq!(norm("カ\u{FF9E} ﾀﾞ", &[]).0, "ガ ダ");
    assert_eq!(norm("e&#x301;", &[(0, 2)]), ("é".to_owned(), vec!["e&#x301;"]));
}

/// Seeded random strings of pieces that compose, decompose, decode or
/// vanish: normalizing only the runs that change gives what the steps give
/// on the whole text, and every char maps to original bytes in order.
#[test]
fn runs_normalize_as_the_whole_text_would() {
    const PIECES: &[&str] = &[
        "a", "e", "I", " ", "&", "&#64;", "&amp;", "#", "4;", "\u{301}", "\u{308}", "\u{323}", "ｅ", "＠", "ﬁ", "가",
        "\u{1100}", "\u{1161}", "\u{11A8}", "\u{200B}", "\u{AD}", "\u{FE0F}", "中", "，", "ж", "٤", "–", "\u{212B}",
        "ﾀ", "\u{FF9E}", "カ", "\u{3099}", "é", "\u{A0}", "\u{316}", "\u{360}", "\u{334}",
    ];
    let mut rng = crate::Rng::new(7);
    for _ in 0..3000 {
        let len = 1 + (rng.uniform() * 12.0) as usize;
        let s: String = (0..len).map(|_| PIECES[(rng.uniform() * PIECES.len() as f64) as usize]).collect();
        let n = Normalized::new(&s);
        let (mut whole, mut pieces, mut chars) = (String::new(), Vec::new(), Vec::new());
        normalize_run(&s, 0..s.len(), &mut chars, &mut whole, &mut pieces);
        assert_eq!(n.as_str(), whole, "{s:?}");
        assert_eq!(n.is_changed(), whole != s, "{s:?}");
        let mut start = 0;
        for (i, c) in n.as_str().char_indices() {
            let o = n.original_span(i..i + c.len_utf8());
            assert!(s.is_char_boundary(o.start) && s.is_char_boundary(o.end), "{s:?} {o:?}");
            assert!(start <= o.start && o.start <= o.end && o.end <= s.len(), "{s:?} {o:?}");
            start = o.start;
        }
    }
}
