//! The pieces of a sequence, however its ids are split into pushes, concatenate to the
//! tokenizer's `decode` of the whole (the Rust `tokenizers` the Python package wraps: the
//! engines' own `decode`), on the DeepSeek-V3 and Qwen3 tokenizers: CJK, emoji and accents
//! split across byte-level tokens, code, special tokens kept and skipped, and random ids.

use std::path::PathBuf;

use router_types::SplitMix;

use super::Incremental;
use crate::TextTokenizer;

fn tokenizer(name: &str) -> TextTokenizer {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/tokenizers")).join(name);
    TextTokenizer::from_file(&dir.join("tokenizer.json")).unwrap()
}

const TEXTS: &[&str] = &[
    "Hello, world! The cache is warm.",
    "路由器把请求发送到缓存最热的副本。日本語のテキストも。",
    "Emoji 🚀🧪👩‍👩‍👧‍👦 and flags 🇫🇷🇯🇵 split over bytes.",
    "Ünïcödé àccents, ß, ø, Ω ≈ ∑ and a tab\there.",
    "fn main() {\n    let x = vec![1, 2, 3];\n    println!(\"{x:?}\");\n}\n",
    "  leading spaces, trailing   ",
];

/// Pushes `ids` in chunks of the sizes `sizes` yields, returns the pieces joined with the finish.
fn pieces(tok: &TextTokenizer, ids: &[u32], skip: bool, mut sizes: impl FnMut() -> usize) -> String {
    let mut d = Incremental::new(skip);
    let mut out = String::new();
    let mut at = 0;
    while at < ids.len() {
        let n = sizes().clamp(1, ids.len() - at);
        let piece = d.push(tok, &ids[at..at + n]).unwrap();
        assert!(!piece.contains('\u{FFFD}') || tok.decode(ids, skip).unwrap().contains('\u{FFFD}'));
        out.push_str(&piece);
        at += n;
    }
    out.push_str(&d.finish(tok).unwrap().expect("what was given out is a prefix of the whole"));
    assert_eq!(out, d.text());
    out
}

#[test]
fn texts_split_one_token_at_a_time_and_in_chunks_come_back_whole() {
    for name in ["qwen3", "deepseek-v3"] {
        let tok = tokenizer(name);
        for text in TEXTS {
            let ids = tok.encode(text, false).unwrap();
            for skip in [true, false] {
                let whole = tok.decode(&ids, skip).unwrap();
                assert_eq!(pieces(&tok, &ids, skip, || 1), whole, "{name}: {text:?} one by one");
                let mut n = 0;
                assert_eq!(
                    pieces(&tok, &ids, skip, || {
                        n = n % 3 + 1;
                        n
                    }),
                    whole,
                    "{name}: {text:?} in chunks"
                );
            }
        }
    }
}

#[test]
fn special_tokens_are_skipped_or_kept_as_asked() {
    let tok = tokenizer("qwen3");
    let end = tok.token_to_id("<|im_end|>").unwrap();
    let mut ids = tok.encode("Done.", false).unwrap();
    ids.push(end);
    assert_eq!(pieces(&tok, &ids, true, || 1), "Done.");
    assert_eq!(pieces(&tok, &ids, false, || 1), "Done.<|im_end|>");
}

#[test]
fn random_ids_in_random_chunks_come_back_as_the_whole_decode() {
    for name in ["qwen3", "deepseek-v3"] {
        let tok = tokenizer(name);
        let vocab = tok.vocab_size() as u64;
        let mut rng = SplitMix::new(0x5eed_0031);
        for _ in 0..200 {
            let len = 1 + (rng.next_u64() % 40) as usize;
            // Mostly low ids (bytes and common pieces, where multi-byte splits happen), some anywhere.
            let ids: Vec<u32> = (0..len)
                .map(|_| if rng.next_u64().is_multiple_of(4) { rng.next_u64() % vocab } else { rng.next_u64() % 1024 } as u32)
                .collect();
            let skip = rng.next_u64().is_multiple_of(2);
            let whole = tok.decode(&ids, skip).unwrap();
            let mut r2 = SplitMix::new(rng.next_u64());
            assert_eq!(pieces(&tok, &ids, skip, || 1 + (r2.next_u64() % 4) as usize), whole, "{name}: {ids:?}");
        }
    }
}
