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

/// The byte-level path (each id's bytes appended) against the windowed decode it replaced and
/// the whole `decode`, piece by piece: both tokenizers are byte-level, so `pieces` above ran it;
/// here the two paths are put side by side on random ids, special ones and ids past the
/// vocabulary included, and with the text split mid-character.
#[test]
fn the_byte_level_path_gives_the_windowed_decodes_pieces() {
    for name in ["qwen3", "deepseek-v3"] {
        let tok = tokenizer(name);
        assert!(tok.byte_pieces().is_some(), "{name} decodes byte-level");
        let vocab = tok.vocab_size() as u64;
        let mut rng = SplitMix::new(0xb17e_0042);
        for _ in 0..400 {
            let len = 1 + (rng.next_u64() % 48) as usize;
            let ids: Vec<u32> = (0..len)
                .map(|_| match rng.next_u64() % 8 {
                    0 => rng.next_u64() % (vocab + 64),
                    1 => vocab - 1 - rng.next_u64() % 300, // added and special tokens
                    _ => rng.next_u64() % 1024,
                } as u32)
                .collect();
            let skip = rng.next_u64().is_multiple_of(2);
            let (mut fast, mut slow) = (Incremental::new(skip), Incremental::windowed(skip));
            let (mut a, mut b) = (String::new(), String::new());
            for id in &ids {
                a.push_str(&fast.push(&tok, std::slice::from_ref(id)).unwrap());
                b.push_str(&slow.push(&tok, std::slice::from_ref(id)).unwrap());
                // Each path gives out only decided text: one's is a prefix of the other's.
                assert!(a.starts_with(&b) || b.starts_with(&a), "{name}: {ids:?}: {a:?} / {b:?}");
            }
            a.push_str(&fast.finish(&tok).unwrap().unwrap());
            b.push_str(&slow.finish(&tok).unwrap().unwrap());
            let whole = tok.decode(&ids, skip).unwrap();
            assert_eq!((a.as_str(), b.as_str()), (whole.as_str(), whole.as_str()), "{name}: {ids:?} skip={skip}");
        }
    }
}
