//! Page hashes against SGLang 0.5.23's own hashing code
//! (`tests/fixtures/page_hashes.json`, made by `tests/fixtures/gen_fixtures.py`).

use std::num::NonZeroUsize;

use renderer::hash::{chain_prior, namespace_seed, namespaced_block_hash};
use renderer::{HashMode, PageDigest, PageHasher};
use router_types::BlockHash;
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    sglang_version: String,
    cases: Vec<Case>,
    namespace_cases: Vec<NamespaceCase>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    tokens: Vec<u64>,
    page_size: usize,
    bigram: bool,
    cache_salt: Option<String>,
    prior_hex: Option<String>,
    hashes_hex: Vec<String>,
    hashes_i64: Vec<i64>,
}

#[derive(Deserialize)]
struct NamespaceCase {
    extra_key: Option<String>,
    cache_salt: Option<String>,
    seed_hex: Option<String>,
    block_hash: i64,
    namespaced: i64,
}

fn fixture() -> Fixture {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/page_hashes.json");
    serde_json::from_slice(&std::fs::read(path).expect("read page_hashes.json")).expect("parse page_hashes.json")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> PageDigest {
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    out
}

#[test]
fn every_sglang_page_hash_case_matches() {
    let fx = fixture();
    assert_eq!(fx.sglang_version, "0.5.23");
    assert!(fx.cases.len() >= 100, "fixture has only {} cases", fx.cases.len());
    let (mut bigram, mut salted, mut prior, mut wide) = (0, 0, 0, 0);
    for case in &fx.cases {
        let mode = if case.bigram { HashMode::Bigram } else { HashMode::Unigram };
        let hasher = PageHasher::new(NonZeroUsize::new(case.page_size).unwrap(), mode);
        let start: Option<PageDigest> = match (&case.cache_salt, &case.prior_hex) {
            (Some(salt), None) => chain_prior(Some(salt)),
            (None, Some(p)) => Some(unhex(p)),
            (None, None) => None,
            (Some(_), Some(_)) => panic!("{}: both salt and prior", case.name),
        };
        let mut digests = Vec::new();
        hasher.digests(&case.tokens, start.as_ref(), &mut digests).unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let got_hex: Vec<String> = digests.iter().map(|d| hex(d)).collect();
        assert_eq!(got_hex, case.hashes_hex, "case {}", case.name);
        let got: Vec<i64> =
            hasher.block_hashes(&case.tokens, start.as_ref()).unwrap().into_iter().map(|h| h.0).collect();
        assert_eq!(got, case.hashes_i64, "case {}", case.name);
        // The u32 fast path must agree wherever the tokens fit.
        if case.tokens.iter().all(|&t| t <= u64::from(u32::MAX)) {
            let narrow: Vec<u32> = case.tokens.iter().map(|&t| t as u32).collect();
            let got32: Vec<i64> =
                hasher.block_hashes(&narrow, start.as_ref()).unwrap().into_iter().map(|h| h.0).collect();
            assert_eq!(got32, case.hashes_i64, "case {} (u32 input)", case.name);
        } else {
            wide += 1;
        }
        bigram += usize::from(case.bigram);
        salted += usize::from(case.cache_salt.is_some());
        prior += usize::from(case.prior_hex.is_some());
    }
    assert!(bigram > 0 && salted > 0 && prior > 0 && wide > 0, "coverage: {bigram} {salted} {prior} {wide}");
}

#[test]
fn every_sglang_namespace_case_matches() {
    let fx = fixture();
    assert!(!fx.namespace_cases.is_empty());
    for case in &fx.namespace_cases {
        let seed = namespace_seed(case.extra_key.as_deref(), case.cache_salt.as_deref());
        assert_eq!(seed.map(|s| hex(&s)), case.seed_hex, "seed for {:?}/{:?}", case.extra_key, case.cache_salt);
        let got = namespaced_block_hash(BlockHash(case.block_hash), seed.as_ref());
        assert_eq!(
            got.0, case.namespaced,
            "namespaced {} under {:?}/{:?}",
            case.block_hash, case.extra_key, case.cache_salt
        );
    }
}

#[path = "vision/golden.rs"]
mod vision_golden;
