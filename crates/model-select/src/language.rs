//! Language detection for `language` signals: `whatlang` (trigram models,
//! pure Rust, no model download) over the request's text, its ISO 639-3 code
//! mapped to the ISO 639-1 codes configs are written in.

/// whatlang's languages: (ISO 639-1, ISO 639-3).
const CODES: [(&str, &str); 69] = [
    ("eo", "epo"),
    ("en", "eng"),
    ("ru", "rus"),
    ("zh", "cmn"),
    ("es", "spa"),
    ("pt", "por"),
    ("it", "ita"),
    ("bn", "ben"),
    ("fr", "fra"),
    ("de", "deu"),
    ("uk", "ukr"),
    ("ka", "kat"),
    ("ar", "ara"),
    ("hi", "hin"),
    ("ja", "jpn"),
    ("he", "heb"),
    ("yi", "yid"),
    ("pl", "pol"),
    ("am", "amh"),
    ("jv", "jav"),
    ("ko", "kor"),
    ("nb", "nob"),
    ("da", "dan"),
    ("sv", "swe"),
    ("fi", "fin"),
    ("tr", "tur"),
    ("nl", "nld"),
    ("hu", "hun"),
    ("cs", "ces"),
    ("el", "ell"),
    ("bg", "bul"),
    ("be", "bel"),
    ("mr", "mar"),
    ("kn", "kan"),
    ("ro", "ron"),
    ("sl", "slv"),
    ("hr", "hrv"),
    ("sr", "srp"),
    ("mk", "mkd"),
    ("lt", "lit"),
    ("lv", "lav"),
    ("et", "est"),
    ("ta", "tam"),
    ("vi", "vie"),
    ("ur", "urd"),
    ("th", "tha"),
    ("gu", "guj"),
    ("uz", "uzb"),
    ("pa", "pan"),
    ("az", "aze"),
    ("id", "ind"),
    ("te", "tel"),
    ("fa", "pes"),
    ("ml", "mal"),
    ("or", "ori"),
    ("my", "mya"),
    ("ne", "nep"),
    ("si", "sin"),
    ("km", "khm"),
    ("tk", "tuk"),
    ("ak", "aka"),
    ("zu", "zul"),
    ("sn", "sna"),
    ("af", "afr"),
    ("la", "lat"),
    ("sk", "slk"),
    ("ca", "cat"),
    ("tl", "tgl"),
    ("hy", "hye"),
];

/// The detected language of a text.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Detected {
    /// Its ISO 639-1 code.
    pub code: &'static str,
    /// whatlang's confidence in [0, 1].
    pub confidence: f64,
}

/// The ISO 639-1 code a config names (`zh`, or the 639-3 `cmn`; case-insensitive), if whatlang knows it.
pub fn normalize(code: &str) -> Option<&'static str> {
    let code = code.trim().to_ascii_lowercase();
    CODES.iter().find(|(one, three)| *one == code || *three == code).map(|(one, _)| *one)
}

/// The language of `text` (`None`: too short or no script whatlang knows).
pub fn detect(text: &str) -> Option<Detected> {
    let info = whatlang::detect(text)?;
    let code = CODES.iter().find(|(_, three)| *three == info.lang().code()).map(|(one, _)| *one)?;
    Some(Detected { code, confidence: info.confidence() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_normalized_to_iso_639_1() {
        assert_eq!(normalize("zh"), Some("zh"));
        assert_eq!(normalize("CMN"), Some("zh"));
        assert_eq!(normalize(" de "), Some("de"));
        assert_eq!(normalize("klingon"), None);
    }

    #[test]
    fn languages_are_detected_with_a_confidence() {
        let zh = detect("请帮我写一封给客户的邮件，说明我们下周的发货时间会推迟。").unwrap();
        assert_eq!(zh.code, "zh");
        let de = detect("Könnten Sie mir bitte erklären, wie die Abrechnung im nächsten Monat funktioniert?").unwrap();
        assert_eq!(de.code, "de");
        assert!(de.confidence > 0.5, "{de:?}");
        let en = detect("Could you explain how the billing works next month, please?").unwrap();
        assert_eq!(en.code, "en");
        assert!(detect("").is_none());
    }
}
