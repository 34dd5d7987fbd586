//! A memo of recently hashed pages, so a prompt that repeats a known prefix
//! (a shared system prompt, the earlier turns of a conversation) pays SHA-256
//! only for its new pages.
//!
//! Owns: a map from a 128-bit fingerprint of a page boundary (the hasher or
//! the lookahead, the chain prior and every token up to the end of that page
//! and of the tokens its digest also covers) to the page's digest, and its
//! page budget (when full it is cleared and refills with
//! the live traffic). The fingerprint is a keyed rolling hash with per-process
//! random seeds; two prefixes sharing one is a 2^-128 event, and would
//! cost a misrouted request, never an error.
//!
//! ```text
//! tokens ─fingerprint at each page end─► longest remembered boundary (binary search)
//!        ─► digests[..k] from the map, SHA-256 for pages k.. chained from digests[k-1]
//! ```

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use router_types::{BlockHash, PageDigest};

use crate::hash::{HashMode, PageHasher};
use crate::lookahead::{lookahead_digests, lookahead_page_count};

/// Default budget, in pages (about 64 bytes each: some 32 MiB).
pub const DEFAULT_CHAIN_MEMO_PAGES: usize = 1 << 19;

/// The memo; shared by all requests of a gateway.
#[derive(Debug)]
pub struct ChainMemo {
    pages: Mutex<HashMap<u128, PageDigest, BuildHasherDefault<Prehashed>>>,
    max_pages: usize,
    seeds: [u64; 2],
    pages_hashed: AtomicU64,
    pages_reused: AtomicU64,
}

/// Work done and saved, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChainMemoStats {
    /// Pages hashed with SHA-256.
    pub pages_hashed: u64,
    /// Pages whose digest came from the memo.
    pub pages_reused: u64,
}

/// How a chain's pages are digested, for the memo: `page` tokens a page, each digest covering
/// `after` more tokens (bigram: 1; a lookahead: its length), `full` pages complete in the
/// prompt; `kind` tells chains apart in the fingerprints.
#[derive(Debug, Clone, Copy)]
struct Chain {
    page: usize,
    after: usize,
    kind: u64,
    full: usize,
}

/// The keys are already uniformly random: hashing them again is wasted work.
#[derive(Debug, Default)]
struct Prehashed(u64);

// === impl ChainMemo ===

impl ChainMemo {
    /// A memo of up to `max_pages` page digests.
    pub fn new(max_pages: usize) -> Self {
        let random = std::collections::hash_map::RandomState::new();
        Self {
            pages: Mutex::new(HashMap::default()),
            max_pages,
            seeds: [random.hash_one(1u8), random.hash_one(2u8)],
            pages_hashed: AtomicU64::new(0),
            pages_reused: AtomicU64::new(0),
        }
    }

    /// Work done and saved so far.
    pub fn stats(&self) -> ChainMemoStats {
        ChainMemoStats {
            pages_hashed: self.pages_hashed.load(Ordering::Relaxed),
            pages_reused: self.pages_reused.load(Ordering::Relaxed),
        }
    }

    /// The published block hashes of `tokens` (as `hasher.block_hashes` gives them), reusing the
    /// digests of the longest remembered prefix, and remembering this prompt's full pages.
    pub fn block_hashes(&self, hasher: &PageHasher, tokens: &[u32], prior: Option<&PageDigest>) -> Vec<BlockHash> {
        let bigram = hasher.mode() == HashMode::Bigram;
        let chain = Chain {
            page: hasher.page_size(),
            after: usize::from(bigram),
            kind: hasher.page_size() as u64 * 2 + u64::from(bigram),
            full: hasher.full_page_count(tokens.len()),
        };
        self.memoized(chain, tokens, prior, |from, prior, digests| {
            // u32 ids are never out of range: hashing them cannot fail.
            let _ = hasher.digests(&tokens[from * hasher.page_size()..], prior, digests);
        })
    }

    /// The block hashes of `tokens` as a worker hashing with a lookahead of `lookahead` tokens
    /// keys them (as [`crate::lookahead::lookahead_block_hashes`] gives them), memoized alike.
    pub fn lookahead_block_hashes(
        &self,
        page: std::num::NonZeroUsize,
        tokens: &[u32],
        lookahead: usize,
        prior: Option<&PageDigest>,
    ) -> Vec<BlockHash> {
        let size = page.get();
        // A kind no hasher has (theirs are even or odd by mode, below 2^63).
        let kind = 1 << 63 | (size as u64) << 8 | lookahead as u64;
        let full = lookahead_page_count(page, tokens.len(), lookahead);
        let chain = Chain { page: size, after: lookahead, kind, full };
        self.memoized(chain, tokens, prior, |from, prior, digests| {
            // u32 ids are never out of range: hashing them cannot fail.
            let _ = lookahead_digests(page, tokens, lookahead, (from, prior), digests);
        })
    }

    /// A chain's block hashes: the digests of the longest remembered prefix of its boundaries,
    /// then `hash_rest(first page not remembered, its prior, digests)`; its full pages remembered.
    fn memoized(
        &self,
        chain: Chain,
        tokens: &[u32],
        prior: Option<&PageDigest>,
        hash_rest: impl FnOnce(usize, Option<&PageDigest>, &mut Vec<PageDigest>),
    ) -> Vec<BlockHash> {
        let full = chain.full;
        let keys = self.fingerprints(chain, prior, tokens);
        let mut digests: Vec<PageDigest> = Vec::with_capacity(tokens.len() / chain.page.max(1) + 1);
        {
            let pages = self.pages.lock().unwrap_or_else(|p| p.into_inner());
            // Every full page of every prompt is remembered together with all of its
            // prefix's pages, and only a clear forgets: presence is monotone along a prompt.
            if keys.first().is_some_and(|k| pages.contains_key(k)) {
                let (mut lo, mut hi) = (0usize, keys.len());
                while hi - lo > 1 {
                    let mid = lo + (hi - lo) / 2;
                    if pages.contains_key(&keys[mid]) { lo = mid } else { hi = mid }
                }
                digests.extend(keys[..=lo].iter().map_while(|k| pages.get(k).copied()));
            }
        }
        let reused = digests.len();
        let from = digests.last().copied().or(prior.copied());
        hash_rest(reused, from.as_ref(), &mut digests);
        self.pages_reused.fetch_add(reused as u64, Ordering::Relaxed);
        self.pages_hashed.fetch_add((digests.len() - reused) as u64, Ordering::Relaxed);
        if reused < full && digests.len() >= full {
            let mut pages = self.pages.lock().unwrap_or_else(|p| p.into_inner());
            if pages.len() + (full - reused) > self.max_pages {
                pages.clear();
            }
            if full - reused <= self.max_pages {
                for (k, d) in keys[reused..].iter().zip(&digests[reused..full]) {
                    pages.insert(*k, *d);
                }
            }
        }
        digests.iter().map(BlockHash::from_digest).collect()
    }

    /// Pages remembered now.
    pub fn len(&self) -> usize {
        self.pages.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The fingerprint of each of the chain's full page boundaries in `tokens`: two rolling
    /// 64-bit lanes with random seeds, over the chain's kind, the prior and the tokens so far
    /// (up to the page's end and the tokens its digest also covers).
    fn fingerprints(&self, chain: Chain, prior: Option<&PageDigest>, tokens: &[u32]) -> Vec<u128> {
        const K: [u64; 2] = [0x9E37_79B9_7F4A_7C15, 0xC2B2_AE3D_27D4_EB4F];
        let mix = |h: [u64; 2], v: u64| {
            [(h[0].rotate_left(23) ^ v).wrapping_mul(K[0]), (h[1].rotate_left(31) ^ v).wrapping_mul(K[1])]
        };
        let mut h = mix(self.seeds, chain.kind);
        h = mix(h, u64::from(prior.is_some()));
        for chunk in prior.map_or(&[][..], |p| &p[..]).chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            h = mix(h, u64::from_le_bytes(word));
        }
        let (size, extra, full) = (chain.page, chain.after, chain.full);
        let mut out = Vec::with_capacity(full);
        let mut at = 0;
        for page in 0..full {
            let end = (page + 1) * size + extra;
            for t in &tokens[at..end] {
                h = mix(h, u64::from(*t));
            }
            at = end;
            let fold = |x: u64| x ^ (x >> 29);
            out.push(u128::from(fold(h[0])) << 64 | u128::from(fold(h[1])));
        }
        out
    }
}

// === impl Prehashed ===

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u128(&mut self, i: u128) {
        self.0 = i as u64;
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroUsize;

    use super::*;

    fn hasher(page: usize, mode: HashMode) -> PageHasher {
        PageHasher::new(NonZeroUsize::new(page).unwrap(), mode)
    }

    /// A cheap deterministic generator.
    fn tokens(seed: u64, n: usize) -> Vec<u32> {
        let mut x = seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 50_000) as u32
            })
            .collect()
    }

    #[test]
    fn equals_the_plain_chain_whatever_is_remembered() {
        for (page, mode) in
            [(1, HashMode::Unigram), (4, HashMode::Unigram), (16, HashMode::Unigram), (4, HashMode::Bigram)]
        {
            let h = hasher(page, mode);
            let memo = ChainMemo::new(2_000);
            let salt = crate::hash::salt_prior("tenant");
            let system = tokens(1, 300);
            for i in 0..200u64 {
                // Conversations sharing a system prompt, each growing turn by turn, some salted,
                // some cut mid-page, some diverging inside a page.
                let conv = i % 7;
                let mut t = system.clone();
                t.extend(tokens(100 + conv, 40 * (i as usize / 7 % 5 + 1)));
                t.truncate(t.len() - (i as usize % 5));
                if i % 11 == 0 {
                    let at = t.len() / 2;
                    t[at] ^= 1;
                }
                let prior = (i % 3 == 0).then_some(&salt);
                assert_eq!(
                    memo.block_hashes(&h, &t, prior),
                    h.block_hashes(&t, prior).unwrap(),
                    "page {page} {mode:?} i {i}"
                );
                assert!(memo.len() <= 2_000);
            }
            let s = memo.stats();
            assert!(s.pages_reused > s.pages_hashed, "page {page} {mode:?}: reuse should dominate: {s:?}");
        }
    }

    #[test]
    fn a_growing_conversation_hashes_only_its_new_pages() {
        let h = hasher(16, HashMode::Unigram);
        let memo = ChainMemo::new(1 << 20);
        let mut t = tokens(7, 1600);
        memo.block_hashes(&h, &t, None);
        assert_eq!(memo.stats(), ChainMemoStats { pages_hashed: 100, pages_reused: 0 });
        t.extend(tokens(8, 170)); // 1770 tokens: 110 full pages and a partial one
        assert_eq!(memo.block_hashes(&h, &t, None), h.block_hashes(&t, None).unwrap());
        assert_eq!(memo.stats(), ChainMemoStats { pages_hashed: 111, pages_reused: 100 });
        assert_eq!(memo.len(), 110);
        // A different salt, page size or mode shares nothing.
        let other = crate::hash::salt_prior("b");
        assert_eq!(memo.block_hashes(&h, &t, Some(&other)), h.block_hashes(&t, Some(&other)).unwrap());
        let h32 = hasher(32, HashMode::Unigram);
        assert_eq!(memo.block_hashes(&h32, &t, None), h32.block_hashes(&t, None).unwrap());
        let bi = hasher(16, HashMode::Bigram);
        assert_eq!(memo.block_hashes(&bi, &t, None), bi.block_hashes(&t, None).unwrap());
        assert_eq!(memo.stats().pages_reused, 100);
    }

    #[test]
    fn lookahead_chains_are_memoized_apart_and_equal_the_unmemoized_chain() {
        let page = NonZeroUsize::new(16).unwrap();
        let memo = ChainMemo::new(1 << 20);
        let system = tokens(1, 800);
        for i in 0..60u64 {
            let mut t = system.clone();
            t.extend(tokens(100 + i % 5, 20 * (i as usize % 7 + 1)));
            t.truncate(t.len() - (i as usize % 3));
            for lookahead in [1, 3] {
                assert_eq!(
                    memo.lookahead_block_hashes(page, &t, lookahead, None),
                    crate::lookahead::lookahead_block_hashes(page, &t, lookahead, None).unwrap(),
                    "i {i} lookahead {lookahead}"
                );
            }
        }
        let s = memo.stats();
        assert!(s.pages_reused > 4 * s.pages_hashed, "the shared 800 tokens hashed once per lookahead: {s:?}");
        // The plain chain of the same tokens shares nothing with them.
        let before = memo.stats().pages_reused;
        let h = hasher(16, HashMode::Unigram);
        assert_eq!(memo.block_hashes(&h, &system, None), h.block_hashes(&system, None).unwrap());
        assert_eq!(memo.stats().pages_reused, before);
        // A block whose lookahead differs is not reused: the same 32 tokens, then 7 or 8.
        let fresh = ChainMemo::new(1 << 20);
        let mut a = tokens(9, 32);
        a.push(7);
        fresh.lookahead_block_hashes(page, &a, 1, None);
        a[32] = 8;
        assert_eq!(
            fresh.lookahead_block_hashes(page, &a, 1, None),
            crate::lookahead::lookahead_block_hashes(page, &a, 1, None).unwrap()
        );
        assert_eq!(fresh.stats(), ChainMemoStats { pages_hashed: 3, pages_reused: 1 });
    }

    #[test]
    fn a_full_memo_starts_over_and_stays_within_budget() {
        let h = hasher(16, HashMode::Unigram);
        let memo = ChainMemo::new(64);
        let (a, b) = (tokens(1, 480), tokens(2, 480)); // 30 pages each
        memo.block_hashes(&h, &a, None);
        memo.block_hashes(&h, &b, None);
        assert_eq!(memo.len(), 60);
        memo.block_hashes(&h, &a, None);
        assert_eq!(memo.stats().pages_reused, 30, "a remembered");
        memo.block_hashes(&h, &tokens(3, 480), None); // 90 > 64: cleared, then c's 30 pages
        assert_eq!(memo.len(), 30);
        memo.block_hashes(&h, &a, None);
        assert_eq!(memo.stats().pages_reused, 30, "a forgotten with the clear");
        // A prompt longer than the whole budget is hashed, not remembered.
        assert_eq!(memo.block_hashes(&h, &tokens(4, 2000), None), h.block_hashes(&tokens(4, 2000), None).unwrap());
        assert!(memo.len() <= 64);
    }
}
