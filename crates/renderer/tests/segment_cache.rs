//! The segment cache is exact: cached and uncached tokenization agree on
//! random texts built to stress the split points (special tokens adjacent,
//! partial special tokens, whitespace, non-ASCII, texts with no special token
//! at all), for real tokenizers and for tokenizers whose added tokens strip
//! whitespace or whose pre-tokenizer depends on position.

use std::path::PathBuf;

use renderer::{Renderer, TextTokenizer, builtin_tokenizer_json};

const PIECES: &[&str] = &[
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "<｜begin▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜end▁of▁sentence｜>",
    "<MASK>",
    "<|im_",
    "|>",
    "<",
    "hello",
    " world",
    "system",
    "user\n",
    "\n",
    "\n\n",
    "  ",
    " ",
    "\t",
    "é",
    "東京",
    "😀",
    "12345",
    "don't",
    "'s",
    "!?",
    "The quick brown fox jumps over the lazy dog.",
    // Regex and normalizer edges for the fast BPE path.
    "'S",
    "'ll",
    "'Re",
    "\r\n",
    "\r",
    "1234567",
    "3.14",
    "ひらがなカタカナ",
    "中文字符",
    "e\u{301}",
    "A\u{30a}",
    "\u{212b}",
    "“quoted”—dash…",
    "¿Qué?",
    "   \n  ",
    "\t\t",
    "x\u{200b}y",
    "#$%&",
    "a-b_c",
    "Ωμέγα",
    "\u{1f468}\u{200d}\u{1f469}",
];

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn random_text(rng: &mut Rng, specials: bool) -> String {
    let n = rng.below(40);
    let mut s = String::new();
    for _ in 0..n {
        let piece = PIECES[rng.below(PIECES.len())];
        if !specials && piece.starts_with('<') && piece.len() > 1 {
            continue;
        }
        s.push_str(piece);
    }
    s
}

/// Cached, fast and reference paths agree on random texts; also with the cache off.
fn check(tok: &TextTokenizer, label: &str, rounds: usize) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let shared_prefix = "<|im_start|>system\nYou are helpful. 東京 😀<|im_end|>\n<｜User｜>Hi there<｜Assistant｜>";
    for round in 0..rounds {
        let text = match round % 3 {
            0 => random_text(&mut rng, true),
            1 => format!("{shared_prefix}{}", random_text(&mut rng, true)),
            _ => random_text(&mut rng, false), // no special token: one segment, no split
        };
        let want = tok.encode_uncached(&text, false).unwrap();
        assert_eq!(tok.encode(&text, false).unwrap(), want, "{label}: first encode of {text:?}");
        // The second encode keeps its segments (the first only notes them), the third hits.
        assert_eq!(tok.encode(&text, false).unwrap(), want, "{label}: second encode of {text:?}");
        assert_eq!(tok.encode(&text, false).unwrap(), want, "{label}: cached encode of {text:?}");
    }
}

fn fixture_tokenizer(name: &str) -> TextTokenizer {
    let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/tokenizers")).join(name);
    TextTokenizer::from_file(&path.join("tokenizer.json")).unwrap()
}

#[test]
fn qwen3_cached_equals_uncached() {
    let tok = fixture_tokenizer("qwen3");
    assert!(tok.segment_cache_enabled());
    assert!(tok.fast_path_enabled(), "NFC + Split + ByteLevel BPE takes the fast path");
    check(&tok, "qwen3", 600);
    let stats = tok.cache_stats();
    assert!(stats.hits > 0, "the shared prefix must hit: {stats:?}");
    // What the caches hold is reported, within their bounds.
    assert!(stats.segment_entries > 0 && stats.segment_bytes > 0 && stats.word_bytes > 0, "{stats:?}");
    assert!(stats.segment_bytes <= renderer::DEFAULT_SEGMENT_CACHE_BYTES && stats.word_bytes <= 16 << 20, "{stats:?}");
}

#[test]
fn deepseek_v3_cached_equals_uncached() {
    let tok = fixture_tokenizer("deepseek-v3");
    assert!(tok.segment_cache_enabled());
    assert!(tok.fast_path_enabled(), "three Splits + ByteLevel BPE, normalized added tokens split in phase 2");
    check(&tok, "deepseek-v3", 600);
    assert!(tok.cache_stats().hits > 0);
}

#[test]
fn builtin_cached_equals_uncached() {
    let r = Renderer::builtin().unwrap();
    assert!(r.tokenizer().fast_path_enabled());
    check(r.tokenizer(), "builtin", 600);
}

/// Added tokens that strip whitespace or must be whole words are never split points.
#[test]
fn stripping_and_single_word_tokens_stay_exact() {
    let mut doc: serde_json::Value = serde_json::from_str(&builtin_tokenizer_json()).unwrap();
    let added = doc["added_tokens"].as_array_mut().unwrap();
    added.push(serde_json::json!({"id": 259, "content": "<MASK>", "single_word": false, "lstrip": true, "rstrip": true, "normalized": false, "special": true}));
    added.push(serde_json::json!({"id": 260, "content": "hello", "single_word": true, "lstrip": false, "rstrip": false, "normalized": false, "special": false}));
    added.push(serde_json::json!({"id": 261, "content": "world", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": false}));
    for (id, t) in [(259, "<MASK>"), (260, "hello"), (261, "world")] {
        doc["model"]["vocab"][t] = serde_json::json!(id);
    }
    let tok = TextTokenizer::from_bytes(doc.to_string().as_bytes()).unwrap();
    assert!(tok.segment_cache_enabled());
    assert!(!tok.fast_path_enabled(), "pieces may hold stripping tokens: tokenizers encodes them");
    // The lstrip/rstrip token swallows the spaces around it.
    let ids = tok.encode("a  <MASK>  b", false).unwrap();
    assert_eq!(ids, vec![97, 259, 98]);
    check(&tok, "stripping", 600);
}

/// Metaspace with `prepend_scheme: first` treats the first piece differently: no split at all.
#[test]
fn position_dependent_pretokenizer_disables_splitting() {
    let mut doc: serde_json::Value = serde_json::from_str(&builtin_tokenizer_json()).unwrap();
    doc["pre_tokenizer"] =
        serde_json::json!({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true});
    doc["decoder"] = serde_json::Value::Null;
    doc["model"]["vocab"]["▁"] = serde_json::json!(259);
    let tok = TextTokenizer::from_bytes(doc.to_string().as_bytes()).unwrap();
    assert!(!tok.segment_cache_enabled());
    check(&tok, "metaspace-first", 200);
}

/// With the segment cache off, the fast path alone still equals the reference.
#[test]
fn fast_path_without_cache_equals_reference() {
    for name in ["qwen3", "deepseek-v3"] {
        let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/tokenizers")).join(name);
        let json = std::fs::read(path.join("tokenizer.json")).unwrap();
        let tok = TextTokenizer::from_bytes_with(
            &json,
            renderer::CacheBounds { segment_entries: 0, segment_bytes: 0, word_bytes: 0 },
        )
        .unwrap();
        assert!(!tok.segment_cache_enabled());
        assert!(tok.fast_path_enabled());
        check(&tok, name, 400);
        assert_eq!(tok.cache_stats().hits, 0);
    }
}

/// A long text without any special token is one piece: the fast path handles it whole.
#[test]
fn long_plain_text_equals_reference() {
    let tok = fixture_tokenizer("qwen3");
    let mut rng = Rng(7);
    let text: String = (0..5000).map(|_| PIECES[14 + rng.below(PIECES.len() - 14)]).collect();
    assert_eq!(tok.encode(&text, false).unwrap(), tok.encode_uncached(&text, false).unwrap());
}

/// Qwen3's split runs on the hand-written scanner for ASCII and on the regex around other
/// characters: random ASCII (every character, numbers among them) and the same with
/// non-ASCII words mixed in encode to the reference's ids.
#[test]
fn ascii_and_mixed_text_through_the_scanner_equal_reference() {
    let tok = fixture_tokenizer("qwen3");
    let mut rng = Rng(29);
    for round in 0..200 {
        let mut text = String::new();
        for _ in 0..rng.below(400) {
            match rng.below(10) {
                0..=5 => text.push(rng.below(128) as u8 as char),
                6 => text.push_str(&format!(" {:06}", rng.below(1_000_000))),
                7 => text.push_str(" word's"),
                _ if round % 2 == 0 => text.push_str(" plain"),
                _ => text.push_str(["é", " café", "中文", "\u{a0}", "°.", "—\n", " ²"][rng.below(7)]),
            }
        }
        assert_eq!(tok.encode(&text, false).unwrap(), tok.encode_uncached(&text, false).unwrap(), "{text:?}");
    }
}

/// The segment cache's byte bound counts what a segment costs: its text, its ids (four bytes
/// each: with the built-in byte-level vocabulary, four times the text) and its entry.
#[test]
fn the_segment_cache_bound_counts_the_ids_too() {
    let bound = 64 * 1024;
    let bounds = renderer::CacheBounds { segment_entries: 10_000, segment_bytes: bound, word_bytes: 0 };
    let tok = TextTokenizer::from_bytes_with(builtin_tokenizer_json().as_bytes(), bounds).unwrap();
    assert!(tok.segment_cache_enabled());
    let mut cost = 0;
    for i in 0..100 {
        let text = format!("{i:04} a segment of its own. ").repeat(80);
        // Kept the second time it is encoded.
        tok.encode(&text, false).unwrap();
        let ids = tok.encode(&text, false).unwrap();
        assert_eq!(ids.len(), text.len(), "one id per byte");
        cost = text.len() + 4 * ids.len() + renderer::SEGMENT_ENTRY_BYTES;
        let stats = tok.cache_stats();
        assert!(stats.segment_bytes <= bound, "{stats:?}");
    }
    let stats = tok.cache_stats();
    assert_eq!(stats.segment_entries, bound / cost, "as many as their whole cost fits: {stats:?}");
    assert_eq!(stats.segment_bytes, stats.segment_entries * cost);
}

/// A segment encoded once is not kept (a prompt's unique part would push out what comes
/// back): unique texts leave the cache empty, and one encoded twice is kept and then hits.
#[test]
fn a_segment_seen_once_is_not_kept() {
    let bounds = renderer::CacheBounds { segment_entries: 64, segment_bytes: 1 << 20, word_bytes: 0 };
    let tok = TextTokenizer::from_bytes_with(builtin_tokenizer_json().as_bytes(), bounds).unwrap();
    for i in 0..1000 {
        tok.encode(&format!("unique text number {i}"), false).unwrap();
    }
    let stats = tok.cache_stats();
    assert_eq!((stats.segment_entries, stats.hits), (0, 0), "{stats:?}");
    let text = "a system prompt that every request carries";
    for _ in 0..3 {
        tok.encode(text, false).unwrap();
    }
    let stats = tok.cache_stats();
    assert_eq!((stats.segment_entries, stats.hits), (1, 1), "kept at the second, hit at the third: {stats:?}");
}
