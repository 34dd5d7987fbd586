//! What a question says that an embedding barely sees: its negations and the
//! numbers it spells out ([`polarity`]). Two questions a semantic cache may
//! answer alike must agree on both: "is X safe" and "is X not safe", or
//! "three apples" and "four apples", embed almost alike and want opposite or
//! different answers. English cues; digits are the cache's own rule (a
//! question holding one gets exact hits only).

/// Words that negate what follows (and the `n't` of a contraction).
const NEGATIONS: &[&str] =
    &["not", "no", "never", "none", "nothing", "nobody", "nowhere", "neither", "nor", "cannot", "without"];

/// Number words, each standing for itself in the signature.
const NUMBERS: &[&str] = &[
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
    "thirty",
    "forty",
    "fifty",
    "sixty",
    "seventy",
    "eighty",
    "ninety",
    "hundred",
    "thousand",
    "million",
    "billion",
    "half",
    "twice",
    "double",
    "triple",
    "first",
    "second",
    "third",
    "fourth",
    "fifth",
    "once",
];

/// The signature two questions must share to be answered alike: how many negations the text
/// holds, then its number words in order (as indices into the list above). Bytes, for a digest.
pub fn polarity(text: &str) -> Vec<u8> {
    let mut negations = 0u8;
    let mut numbers = Vec::new();
    for word in text.split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '’')).filter(|w| !w.is_empty()) {
        let lower = word.to_lowercase();
        let bare = lower.trim_matches(|c| c == '\'' || c == '’');
        if NEGATIONS.contains(&bare) || bare.ends_with("n't") || bare.ends_with("n’t") {
            negations = negations.saturating_add(1);
        } else if let Some(i) = NUMBERS.iter().position(|n| *n == bare) {
            numbers.push(i as u8);
        }
    }
    let mut out = Vec::with_capacity(1 + numbers.len());
    out.push(negations);
    out.extend(numbers);
    out
}

#[cfg(test)]
mod tests {
    use super::polarity;

    #[test]
    fn a_negation_or_a_number_word_changes_the_signature_a_rewording_does_not() {
        let base = polarity("Is it safe to run this script as root?");
        for other in [
            "Is it not safe to run this script as root?",
            "Isn't it safe to run this script as root?",
            "Is it never safe to run this script as root?",
            "Is it safe to run this script without root?",
        ] {
            assert_ne!(polarity(other), base, "{other}");
        }
        // The same polarity in other words.
        assert_eq!(polarity("Can I safely run the script as the root user?"), base);
        assert_eq!(polarity("Why isn't my build green?"), polarity("Why is my build not green?"));
        assert_eq!(polarity("Why ISN’T my build green?"), polarity("why is my build NOT green"));
        // Numbers spelled out.
        assert_ne!(polarity("Give me three reasons"), polarity("Give me four reasons"));
        assert_eq!(polarity("Give me three reasons"), polarity("List three reasons, please"));
        // Two negations are not none.
        assert_ne!(polarity("It is not that it does not work"), polarity("It is that it works"));
    }
}
