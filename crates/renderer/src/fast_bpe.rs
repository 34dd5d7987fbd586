//! A fast, exact encoder for byte-level BPE tokenizers (GPT-2 lineage: Qwen,
//! Llama 3, DeepSeek): the same normalizer, the same split regexes and the
//! same BPE model as HF `tokenizers`, without its per-piece bookkeeping
//! (offset alignments, per-split vectors sized to the input, token strings),
//! plus a bounded word → ids cache in front of the model.
//!
//! Owns: deciding from a tokenizer's own configuration whether the fast path
//! is exact for it ([`FastBpe::new`] returns `None` otherwise), and encoding a
//! piece of text that contains no added token. Splitting on added tokens is
//! `tokenizer.rs`'s job; anything unsupported stays on the `tokenizers` path.

use std::borrow::Cow;
use std::sync::RwLock;

use ahash::AHashMap;
use serde_json::Value as Json;
use tokenizers::Model;
use tokenizers::models::ModelWrapper;
use unicode_normalization_alignments::UnicodeNormalization;

use crate::RenderError;
use crate::gpt_split::{self, GptSplit};

/// Words cached before the cache is cleared and refilled.
const WORD_CACHE_ENTRIES: usize = 1 << 18;
/// Default bytes the cached words may take (text, ids and a map slot each)
/// before the cache is cleared: unique pieces of up to 256 bytes each (a model
/// whose pre-tokenizer splits little, or a client sending them) would
/// otherwise hold hundreds of MiB at the entry bound. Found by the soak run.
pub const DEFAULT_WORD_CACHE_BYTES: usize = 16 << 20;
/// What a cached word costs beyond its text and ids: the map slot and two allocations.
const WORD_ENTRY_OVERHEAD: usize = 64;
/// Longer pieces are not cached (they are rare and would crowd out words).
const WORD_CACHE_MAX_BYTES: usize = 256;
/// No id: the model decides.
const NO_ID: u32 = u32::MAX;

/// Which normalizer runs before splitting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Normalizer {
    /// None, or an empty sequence.
    Identity,
    /// Unicode NFC.
    Nfc,
}

/// One `Split(regex, Isolated)` step.
#[derive(Debug)]
enum SplitRegex {
    /// A pattern without look-around: the `regex` crate's DFA, as fancy-regex would delegate.
    Plain(regex::Regex),
    /// A GPT-style pattern ending in `\s*[\r\n]+|\s+(?!\S)|\s+`, run without the
    /// look-ahead: a whitespace run without a newline that the final `\s+` matched
    /// and a non-space follows gives its last character back, which is exactly
    /// what `\s+(?!\S)` does.
    WhitespaceLookahead(regex::Regex),
    /// Qwen's or Llama 3's pattern: its ASCII segments by the hand-written scanner, the others
    /// by the look-ahead emulation's DFA (`crate::gpt_split`).
    Scanned(GptSplit, regex::Regex),
    /// Anything else: fancy-regex, exactly as tokenizers runs it.
    Fancy(fancy_regex::Regex),
}

/// The GPT-style pattern tail whose look-ahead `SplitRegex::WhitespaceLookahead`
/// emulates, with `\r\n` escaped or as raw characters (DeepSeek's file has both).
const LOOKAHEAD_TAILS: [&str; 2] = [r"|\s*[\r\n]+|\s+(?!\S)|\s+", "|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"];
/// Known patterns whose earlier alternatives never match pure whitespace, so the
/// emulation is exact (Qwen2/2.5/3, Llama 3, DeepSeek V3's last split, GPT-4o).
const LOOKAHEAD_PREFIXES: &[&str] = &[
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*",
];

/// The fast encoder of one tokenizer.
#[derive(Debug)]
pub(crate) struct FastBpe {
    normalizer: Normalizer,
    /// `Split(regex, Isolated)` pre-tokenizers, applied in order.
    splits: Vec<SplitRegex>,
    /// GPT-2's byte → character map.
    byte_chars: [char; 256],
    /// Each byte's id, for a model without merges whose vocabulary holds every byte's
    /// character (the built-in tokenizer): a piece's ids are then its bytes' ids, exactly what
    /// the model's BPE makes of it, without building its word and tokens.
    byte_ids: Option<Box<[u32; 256]>>,
    /// Each byte's id as a piece of its own (one character: BPE has nothing to merge), when
    /// the model adds no end-of-word suffix and its vocabulary holds the character; `NO_ID`:
    /// the model is asked. Digits, spaces and punctuation are such pieces in GPT-style splits.
    singles: Box<[u32; 256]>,
    words: RwLock<WordCache>,
    /// Bytes the word cache may hold ([`DEFAULT_WORD_CACHE_BYTES`] unless configured); 0: no cache.
    word_budget: usize,
}

/// Word → ids, and the bytes it holds (within `FastBpe::word_budget`).
#[derive(Debug, Default)]
struct WordCache {
    map: AHashMap<Box<str>, Box<[u32]>>,
    bytes: usize,
}

fn word_bytes(word: &str, ids: &[u32]) -> usize {
    word.len() + 4 * ids.len() + WORD_ENTRY_OVERHEAD
}

// === impl FastBpe ===

impl FastBpe {
    /// `Some` only if this tokenizer's normalizer, pre-tokenizer and model are
    /// all of the supported, position-independent kinds.
    pub(crate) fn new(tokenizer: &tokenizers::Tokenizer, word_budget: usize) -> Option<Self> {
        let bpe = match tokenizer.get_model() {
            ModelWrapper::BPE(bpe) if bpe.dropout.is_none() => bpe,
            _ => return None,
        };
        let byte_chars = byte_chars();
        // Only a vocabulary about the size of the bytes' can be one without merges: a real one's
        // (with its merges) is never serialized here.
        let small = bpe.get_vocab_size() <= 1024;
        let byte_ids =
            small.then(|| serde_json::to_value(bpe).ok()).flatten().and_then(|m| byte_ids(&m, &byte_chars, bpe));
        let normalizer = match tokenizer.get_normalizer() {
            None => Normalizer::Identity,
            Some(n) => parse_normalizer(&serde_json::to_value(n).ok()?)?,
        };
        let pre = serde_json::to_value(tokenizer.get_pre_tokenizer()?).ok()?;
        let splits = parse_pre_tokenizer(&pre)?;
        let mut singles = Box::new([NO_ID; 256]);
        if bpe.end_of_word_suffix.as_deref().is_none_or(str::is_empty) {
            for (b, c) in byte_chars.iter().enumerate() {
                singles[b] = bpe.token_to_id(&c.to_string()).unwrap_or(NO_ID);
            }
        }
        let words = RwLock::new(WordCache::default());
        Some(Self { normalizer, splits, byte_chars, byte_ids, singles, words, word_budget })
    }

    /// Bytes the word cache holds now (within `word_budget`).
    pub(crate) fn cached_bytes(&self) -> usize {
        self.words.read().unwrap_or_else(|p| p.into_inner()).bytes
    }

    /// The normalizer kind (added tokens marked `normalized` can be split on
    /// the raw text only when it is the identity).
    pub(crate) fn normalizer(&self) -> Normalizer {
        self.normalizer
    }

    /// Appends the ids of `text`, which must contain no added token.
    pub(crate) fn encode(&self, model: &ModelWrapper, text: &str, out: &mut Vec<u32>) -> Result<(), RenderError> {
        let text: Cow<'_, str> = match self.normalizer {
            Normalizer::Nfc if !surely_nfc(text) => Cow::Owned(text.nfc().map(|(c, _)| c).collect()),
            _ => Cow::Borrowed(text),
        };
        // Without merges the pieces' ids are their bytes' ids, wherever the splits fall.
        if let Some(ids) = &self.byte_ids {
            out.extend(text.bytes().map(|b| ids[b as usize]));
            return Ok(());
        }
        let mut misses: Vec<(Box<str>, Box<[u32]>)> = Vec::new();
        {
            let words = self.words.read().unwrap_or_else(|p| p.into_inner());
            let mut mapped = String::with_capacity(64);
            let mut emit = |piece: &str| -> Result<(), RenderError> {
                if let &[b] = piece.as_bytes()
                    && self.singles[b as usize] != NO_ID
                {
                    out.push(self.singles[b as usize]);
                    return Ok(());
                }
                mapped.clear();
                mapped.extend(piece.bytes().map(|b| self.byte_chars[b as usize]));
                if let Some(ids) = words.map.get(mapped.as_str()) {
                    out.extend_from_slice(ids);
                    return Ok(());
                }
                let tokens = model.tokenize(&mapped).map_err(|e| RenderError::Tokenizer(e.to_string()))?;
                let start = out.len();
                out.extend(tokens.iter().map(|t| t.id));
                if mapped.len() <= WORD_CACHE_MAX_BYTES {
                    misses.push((mapped.as_str().into(), out[start..].into()));
                }
                Ok(())
            };
            split_into(&self.splits, &text, &mut emit)?;
        }
        if !misses.is_empty() && self.word_budget > 0 {
            let mut words = self.words.write().unwrap_or_else(|p| p.into_inner());
            let adding: usize = misses.iter().map(|(w, ids)| word_bytes(w, ids)).sum();
            if words.map.len() + misses.len() > WORD_CACHE_ENTRIES || words.bytes + adding > self.word_budget {
                words.map = AHashMap::new();
                words.bytes = 0;
            }
            for (word, ids) in misses {
                let cost = word_bytes(&word, &ids);
                if words.map.insert(word, ids).is_none() {
                    words.bytes += cost;
                }
            }
        }
        Ok(())
    }
}

/// Each byte's id when `model` (the BPE's JSON) has no merges, no word prefix or suffix, and a
/// vocabulary holding every byte's character: BPE then leaves a word's characters as they are.
fn byte_ids(model: &Json, byte_chars: &[char; 256], bpe: &tokenizers::models::bpe::BPE) -> Option<Box<[u32; 256]>> {
    let no_merges = model.get("merges")?.as_array()?.is_empty();
    let plain = ["continuing_subword_prefix", "end_of_word_suffix"]
        .iter()
        .all(|k| model.get(*k).is_none_or(|v| v.is_null() || v.as_str() == Some("")));
    if !no_merges || !plain {
        return None;
    }
    let mut ids = Box::new([0u32; 256]);
    for (b, c) in byte_chars.iter().enumerate() {
        ids[b] = bpe.token_to_id(&c.to_string())?;
    }
    Some(ids)
}

/// A conservative NFC quick check: true only if every character is one that
/// NFC leaves alone and that never composes with a neighbour (Unicode
/// `NFC_QC = Yes` and canonical combining class 0): everything below U+0300,
/// kana letters, Hangul syllables, CJK ideographs and emoji. A combining mark
/// or conjoining jamo anywhere sends the text through full NFC.
fn surely_nfc(text: &str) -> bool {
    text.chars().all(|c| {
        matches!(c as u32,
            0..=0x2FF
            | 0x3041..=0x3096
            | 0x30A1..=0x30FA
            | 0x4E00..=0x9FFF
            | 0xAC00..=0xD7A3
            | 0x1F300..=0x1FAFF)
    })
}

/// Applies `splits[0]` to `text` (matches and the gaps between them become
/// pieces, empty pieces dropped, as `Split(.., Isolated)` does), then the rest
/// of the splits to each piece, and hands every final piece to `emit`.
fn split_into(
    splits: &[SplitRegex],
    text: &str,
    emit: &mut dyn FnMut(&str) -> Result<(), RenderError>,
) -> Result<(), RenderError> {
    let Some((regex, rest)) = splits.split_first() else {
        return if text.is_empty() { Ok(()) } else { emit(text) };
    };
    let mut prev = 0;
    let mut piece = |start: usize, end: usize, prev: &mut usize| -> Result<(), RenderError> {
        if *prev != start {
            split_into(rest, &text[*prev..start], emit)?;
        }
        if start != end {
            split_into(rest, &text[start..end], emit)?;
        }
        *prev = end;
        Ok(())
    };
    match regex {
        SplitRegex::Plain(re) => {
            for m in re.find_iter(text) {
                piece(m.start(), m.end(), &mut prev)?;
            }
        }
        SplitRegex::WhitespaceLookahead(re) => lookahead_matches(re, text, |s, e| piece(s, e, &mut prev))?,
        // An ASCII text is one region.
        SplitRegex::Scanned(scanner, re) => {
            for (at, to, ascii) in gpt_split::regions(text) {
                let shifted = |s: usize, e: usize| piece(at + s, at + e, &mut prev);
                if ascii {
                    scanner.split_ascii(&text.as_bytes()[at..to], shifted)?;
                } else {
                    lookahead_matches(re, &text[at..to], shifted)?;
                }
            }
        }
        SplitRegex::Fancy(re) => {
            for m in re.find_iter(text) {
                // tokenizers stops at a regex error (backtrack limit) and keeps the rest as one piece.
                let Ok(m) = m else { break };
                piece(m.start(), m.end(), &mut prev)?;
            }
        }
    }
    if prev != text.len() {
        split_into(rest, &text[prev..], emit)?;
    }
    Ok(())
}

/// The matches of a look-ahead emulation's DFA in `text`, as the pattern with its look-ahead
/// makes them: a whitespace run without a newline that a non-space follows gives its last
/// character back.
fn lookahead_matches<E>(
    re: &regex::Regex,
    text: &str,
    mut piece: impl FnMut(usize, usize) -> Result<(), E>,
) -> Result<(), E> {
    let mut at = 0;
    while let Some(m) = re.find_at(text, at) {
        let mut end = m.end();
        let s = m.as_str();
        if end < text.len()
            && !s.contains(['\r', '\n'])
            && s.chars().all(char::is_whitespace)
            && let Some((last, _)) = s.char_indices().nth(1).and(s.char_indices().last())
        {
            end = m.start() + last; // give the last whitespace char back
        }
        piece(m.start(), end)?;
        at = if end > m.start() { end } else { end + text[end..].chars().next().map_or(1, char::len_utf8) };
        if at > text.len() {
            break;
        }
    }
    Ok(())
}

impl SplitRegex {
    /// The fastest exact splitter of `source`: the hand-written scanner, the DFA with the
    /// look-ahead emulated, the DFA, or fancy-regex.
    fn new(source: &str) -> Option<Self> {
        Some(match Self::compile(source, true)? {
            SplitRegex::WhitespaceLookahead(re) => match Self::scanner(source) {
                Some(scanner) => SplitRegex::Scanned(scanner, re),
                None => SplitRegex::WhitespaceLookahead(re),
            },
            other => other,
        })
    }

    /// The hand-written scanner of `source`, when it is Qwen's or Llama 3's pattern.
    fn scanner(source: &str) -> Option<GptSplit> {
        LOOKAHEAD_TAILS.iter().find_map(|tail| source.strip_suffix(tail)).and_then(GptSplit::of_prefix)
    }

    /// `emulate = false` forces fancy-regex for the look-ahead patterns (tests compare both).
    fn compile(source: &str, emulate: bool) -> Option<Self> {
        if let Some(prefix) = LOOKAHEAD_TAILS.iter().find_map(|tail| source.strip_suffix(tail))
            && LOOKAHEAD_PREFIXES.contains(&prefix)
            && emulate
        {
            let plain = format!(r"{prefix}|\s*[\r\n]+|\s+");
            return regex::Regex::new(&plain).ok().map(SplitRegex::WhitespaceLookahead);
        }
        if !["(?=", "(?!", "(?<=", "(?<!"].iter().any(|l| source.contains(l))
            && let Ok(re) = regex::Regex::new(source)
        {
            return Some(SplitRegex::Plain(re));
        }
        fancy_regex::Regex::new(source).ok().map(SplitRegex::Fancy)
    }
}

fn parse_normalizer(n: &Json) -> Option<Normalizer> {
    match n.get("type")?.as_str()? {
        "NFC" => Some(Normalizer::Nfc),
        "Sequence" => {
            let list = n.get("normalizers")?.as_array()?;
            match list.as_slice() {
                [] => Some(Normalizer::Identity),
                [one] => parse_normalizer(one),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Accepts `Sequence[Split(Regex, Isolated)*, ByteLevel(no prefix space, no regex)]`
/// or a bare `ByteLevel` of that kind; returns the compiled split regexes.
fn parse_pre_tokenizer(pre: &Json) -> Option<Vec<SplitRegex>> {
    let steps: Vec<&Json> = match pre.get("type")?.as_str()? {
        "Sequence" => pre.get("pretokenizers")?.as_array()?.iter().collect(),
        _ => vec![pre],
    };
    let (last, splits) = steps.split_last()?;
    let byte_level_ok = last.get("type")?.as_str()? == "ByteLevel"
        && !last.get("add_prefix_space")?.as_bool()?
        && !last.get("use_regex")?.as_bool()?;
    if !byte_level_ok {
        return None;
    }
    splits
        .iter()
        .map(|s| {
            let ok = s.get("type")?.as_str()? == "Split"
                && s.get("behavior")?.as_str()? == "Isolated"
                && !s.get("invert")?.as_bool()?;
            if !ok {
                return None;
            }
            let pattern = s.get("pattern")?;
            let source = match (pattern.get("Regex"), pattern.get("String")) {
                (Some(Json::String(r)), _) => r.clone(),
                (_, Some(Json::String(lit))) => fancy_regex::escape(lit).into_owned(),
                _ => return None,
            };
            SplitRegex::new(&source)
        })
        .collect()
}

/// GPT-2's byte → printable character map, in byte order.
pub(crate) fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut shifted = 0u32;
    for (b, slot) in out.iter_mut().enumerate() {
        let b = b as u32;
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        *slot = if printable {
            char::from_u32(b).unwrap_or('?')
        } else {
            shifted += 1;
            char::from_u32(255 + shifted).unwrap_or('?')
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(re: &SplitRegex, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        split_into(std::slice::from_ref(re), text, &mut |p| {
            out.push(p.to_string());
            Ok(())
        })
        .unwrap();
        out
    }

    /// The quick check never skips a text that NFC would change.
    #[test]
    fn nfc_quick_check_is_conservative() {
        for c in (0u32..0x20000).filter_map(char::from_u32) {
            let s = c.to_string();
            if surely_nfc(&s) {
                let normalized: String = s.nfc().map(|(c, _)| c).collect();
                assert_eq!(normalized, s, "U+{:04X}", c as u32);
                // Nor does it compose with a following allowed character.
                for next in ['a', 'é', '中', 'が', '한', '😀'] {
                    let pair = format!("{c}{next}");
                    let normalized: String = pair.nfc().map(|(c, _)| c).collect();
                    assert_eq!(normalized, pair, "U+{:04X} + {next}", c as u32);
                }
            }
        }
    }

    /// The look-ahead emulation splits exactly like fancy-regex on whitespace-heavy text.
    #[test]
    fn lookahead_emulation_matches_fancy_regex() {
        let deepseek_prefix = LOOKAHEAD_PREFIXES[2];
        let sources = [
            format!("{}{}", LOOKAHEAD_PREFIXES[0], LOOKAHEAD_TAILS[0]),
            format!("{}{}", LOOKAHEAD_PREFIXES[1], LOOKAHEAD_TAILS[0]),
            format!("{deepseek_prefix}{}", LOOKAHEAD_TAILS[1]),
        ];
        let alphabet = [
            " ", "  ", "\t", "\n", "\r\n", "a", "Bc", "1", "22", "!", "'s", "'LL", "é", "中", "\u{3000}", "\u{85}",
            "\u{2028}", "x ",
        ];
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        for source in &sources {
            let fast = SplitRegex::compile(source, true).unwrap();
            let slow = SplitRegex::compile(source, false).unwrap();
            assert!(matches!(fast, SplitRegex::WhitespaceLookahead(_)), "{source:?}");
            assert!(matches!(slow, SplitRegex::Fancy(_)));
            for _ in 0..3000 {
                let mut text = String::new();
                for _ in 0..(state % 12) {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    text.push_str(alphabet[(state % alphabet.len() as u64) as usize]);
                }
                assert_eq!(pieces(&fast, &text), pieces(&slow, &text), "{text:?} under {source:?}");
            }
        }
    }

    /// Qwen's and Llama 3's patterns split by the hand-written scanner exactly as fancy-regex
    /// splits them with the look-ahead: random texts of ASCII (every character) and of
    /// characters the scanner must leave to the regex (letters and digits of other scripts,
    /// other spaces, case folds of `s` and `k`, a combining mark, symbols whose last UTF-8 byte
    /// masked to ASCII would read as a digit), across the regions' cuts.
    #[test]
    fn the_scanner_splits_exactly_like_fancy_regex() {
        let mut alphabet: Vec<String> = (0u8..128).map(|b| (b as char).to_string()).collect();
        for s in [
            " ", "  ", "\n", "\r\n", "\n\n", " \n", "'s", "'S", "'re", "'Ve", "'ll", "'LL", "'d", "'x", " hello",
            "World", "123", "4567", " ...", "!!\n", "é", "中文", "\u{3000}", "\u{85}", "\u{a0}", "\u{2028}", "ſ",
            "\u{212A}", "Ⅻ", "١٢", "\u{301}", "😀", "°", "²", "±", "—",
        ] {
            alphabet.push(s.to_string());
        }
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for prefix in &LOOKAHEAD_PREFIXES[..2] {
            let source = format!("{prefix}{}", LOOKAHEAD_TAILS[0]);
            let fast = SplitRegex::new(&source).unwrap();
            let slow = SplitRegex::compile(&source, false).unwrap();
            assert!(matches!(fast, SplitRegex::Scanned(..)), "{source:?}");
            assert!(matches!(slow, SplitRegex::Fancy(_)));
            for round in 0..20_000 {
                let mut text = String::new();
                // Half the texts ASCII only (the scanner whole), half mixed (cut into segments).
                let ascii = round % 2 == 0;
                for _ in 0..(next() % 24) {
                    let pick = if ascii { next() % 128 } else { next() % alphabet.len() as u64 };
                    text.push_str(&alphabet[pick as usize]);
                }
                assert_eq!(pieces(&fast, &text), pieces(&slow, &text), "{text:?} under {source:?}");
            }
        }
    }

    /// The regions cover the text in order; every non-ASCII character is in a region for the
    /// regex, which reaches from the last cut before it to the first after.
    #[test]
    fn regions_cover_the_text_and_leave_only_words_around_other_characters_to_the_regex() {
        let text = "plain text, then café au lait.\n  and naïve ones; end";
        let regions: Vec<(&str, bool)> =
            crate::gpt_split::regions(text).map(|(s, e, ascii)| (&text[s..e], ascii)).collect();
        assert_eq!(
            regions,
            [
                ("plain text, then", true),
                (" café au", false),
                (" lait.\n  and", true),
                (" naïve", false),
                (" ones; end", true)
            ]
        );
        assert_eq!(crate::gpt_split::regions("").count(), 0);
        assert_eq!(crate::gpt_split::regions("é").collect::<Vec<_>>(), [(0, 2, false)]);
    }
}

#[cfg(test)]
mod fixture_tests {
    use super::*;

    /// The real tokenizers' look-ahead splits run on the DFA, not on fancy-regex.
    #[test]
    fn fixture_tokenizers_avoid_fancy_regex() {
        for name in ["qwen3", "deepseek-v3"] {
            let path = format!("{}/../../tests/fixtures/tokenizers/{name}/tokenizer.json", env!("CARGO_MANIFEST_DIR"));
            let tok = tokenizers::Tokenizer::from_file(&path).unwrap();
            let fast = FastBpe::new(&tok, DEFAULT_WORD_CACHE_BYTES).expect("fast path supported");
            assert!(!fast.splits.is_empty());
            for split in &fast.splits {
                assert!(!matches!(split, SplitRegex::Fancy(_)), "{name}: {split:?}");
            }
            let scanned = |s: &SplitRegex| matches!(s, SplitRegex::Scanned(..));
            let emulated = |s: &SplitRegex| matches!(s, SplitRegex::WhitespaceLookahead(_));
            assert!(fast.splits.iter().any(|s| scanned(s) || emulated(s)), "{name}");
            // Qwen3's pattern is the scanner's.
            assert_eq!(fast.splits.iter().any(scanned), name == "qwen3", "{name}");
        }
    }

    /// A vocabulary without merges (the built-in one) maps each byte to its id, exactly as its
    /// BPE does, over every byte value; a real vocabulary keeps the BPE.
    #[test]
    fn a_vocabulary_without_merges_maps_bytes_straight_to_ids() {
        let tok = tokenizers::Tokenizer::from_bytes(crate::builtin_tokenizer_json().as_bytes()).unwrap();
        let fast = FastBpe::new(&tok, 0).expect("fast path supported");
        assert!(fast.byte_ids.is_some(), "the built-in vocabulary has no merges");
        let bytes: Vec<u8> = (0u8..=255).collect();
        let text = String::from_utf8_lossy(&bytes).repeat(3) + "héllo, 世界 🚀";
        let mut ours = Vec::new();
        fast.encode(tok.get_model(), &text, &mut ours).unwrap();
        let theirs = tok.encode_fast(text.as_str(), false).unwrap().get_ids().to_vec();
        assert_eq!(ours, theirs);
        let path = format!("{}/../../tests/fixtures/tokenizers/qwen3/tokenizer.json", env!("CARGO_MANIFEST_DIR"));
        let qwen = tokenizers::Tokenizer::from_file(&path).unwrap();
        assert!(FastBpe::new(&qwen, 0).unwrap().byte_ids.is_none(), "merges: the BPE runs");
    }

    /// Unique long pieces (a letter run the split regex keeps whole, 200 bytes each) fill the
    /// word cache to its byte budget (1 MiB here; 4,000 of them hold about 2 MiB), not to its
    /// entry bound (262,144 of them: some 130 MiB).
    #[test]
    fn the_word_cache_stays_within_its_byte_budget() {
        let path = format!("{}/../../tests/fixtures/tokenizers/qwen3/tokenizer.json", env!("CARGO_MANIFEST_DIR"));
        let tok = tokenizers::Tokenizer::from_file(&path).unwrap();
        let fast = FastBpe::new(&tok, 1 << 20).unwrap();
        let mut peak = 0;
        let mut out = Vec::new();
        for i in 0..4_000u32 {
            let word: String =
                format!("{i:08}").bytes().map(|b| (b'a' + (b - b'0')) as char).cycle().take(200).collect();
            out.clear();
            fast.encode(tok.get_model(), &word, &mut out).unwrap();
            assert!(!out.is_empty());
            peak = peak.max(fast.cached_bytes());
        }
        assert!(peak <= 1 << 20, "{peak}");
        assert!(peak > 1 << 19, "the budget is what bounds it here: {peak}");
    }
}
