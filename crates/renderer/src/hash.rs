//! The SGLang page-hash chain, bit for bit (SGLang 0.5.23
//! `mem_cache/cpp_utils/hash_binding.cpp` and `disaggregation/kv_events.py`).
//!
//! Owns: splitting tokens into pages, the SHA-256 chain over them (unigram and
//! bigram, partial last page, wide tokens, a prior digest for continuation or a
//! cache salt), and the namespacing of published hashes. Does not own which
//! page size or mode a worker uses (the caller passes a [`PageHasher`]).
//!
//! ```text
//! digest_0 = SHA256(prior? ‖ u32le(page_0 tokens))
//! digest_i = SHA256(digest_{i-1} ‖ u32le(page_i tokens))
//! wide page (a token > u32::MAX): SHA256(prev? ‖ 0xFF ‖ u64le(tokens))
//! block hash = first 8 digest bytes, big-endian, signed
//! ```
//!
//! Hashing allocates nothing per page: token bytes go through a fixed stack
//! buffer into the SHA-256 state.

use std::num::NonZeroUsize;

use router_types::BlockHash;
pub use router_types::PageDigest;
use sha2::{Digest as _, Sha256};

/// Bytes staged at a time on the stack before feeding SHA-256.
const STAGE_BYTES: usize = 512;
/// SGLang's prefix for the cache-salt prior (`compute_node_event_hash_values`).
const SALT_TAG: &[u8] = b"sglang-cache-salt-v1\0";
/// SGLang's tag for namespacing published hashes (`kv_event_namespace_seed`).
const NAMESPACE_TAG: &[u8] = b"sglang-kv-event-namespace-v1";

/// How an engine forms the hash input of one position.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum HashMode {
    /// One token per position (the default).
    #[default]
    Unigram,
    /// Position `j` contributes tokens `j` and `j + 1` (EAGLE / MTP speculative
    /// decoding): `n + 1` raw tokens give `n` positions.
    Bigram,
}

/// A token id as it reaches the hasher: `u32` from tokenizers, `u64` from
/// events or pre-tokenized input (which may exceed `u32::MAX`).
pub trait TokenId: Copy {
    /// The id widened to 64 bits.
    fn to_u64(self) -> u64;
    /// True if no id of this type can exceed `u32::MAX`.
    const ALWAYS_NARROW: bool;
}

/// Computes the page-hash chain for one page size and mode.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PageHasher {
    page_size: NonZeroUsize,
    mode: HashMode,
}

/// Why a token sequence cannot be hashed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HashError {
    /// SGLang rejects ids above `i64::MAX`; so do we.
    #[error("token id {0} at position {1} is above i64::MAX")]
    TokenOutOfRange(u64, usize),
}

// === impl TokenId ===

impl TokenId for u32 {
    #[inline]
    fn to_u64(self) -> u64 {
        u64::from(self)
    }
    const ALWAYS_NARROW: bool = true;
}

impl TokenId for u64 {
    #[inline]
    fn to_u64(self) -> u64 {
        self
    }
    const ALWAYS_NARROW: bool = false;
}

// === impl PageHasher ===

impl PageHasher {
    /// A hasher for `page_size` positions per page.
    pub fn new(page_size: NonZeroUsize, mode: HashMode) -> Self {
        Self { page_size, mode }
    }

    /// The number of positions per page.
    pub fn page_size(&self) -> usize {
        self.page_size.get()
    }

    /// The hash mode.
    pub fn mode(&self) -> HashMode {
        self.mode
    }

    /// Hash positions covered by `raw_len` raw tokens (bigram needs one extra token).
    pub fn positions(&self, raw_len: usize) -> usize {
        match self.mode {
            HashMode::Unigram => raw_len,
            HashMode::Bigram => raw_len.saturating_sub(1),
        }
    }

    /// Number of pages (the last may be partial) for `raw_len` raw tokens.
    pub fn page_count(&self, raw_len: usize) -> usize {
        self.positions(raw_len).div_ceil(self.page_size.get())
    }

    /// Number of full pages for `raw_len` raw tokens.
    pub fn full_page_count(&self, raw_len: usize) -> usize {
        self.positions(raw_len) / self.page_size.get()
    }

    /// Calls `each(page_index, digest)` for every page of `tokens`, chaining from
    /// `prior` (a parent's last digest or a salt prior). The last page may be partial.
    pub fn for_each_digest<T: TokenId>(
        &self,
        tokens: &[T],
        prior: Option<&PageDigest>,
        mut each: impl FnMut(usize, &PageDigest),
    ) -> Result<(), HashError> {
        let positions = self.positions(tokens.len());
        let mut state: Option<PageDigest> = prior.copied();
        let mut page = 0;
        while page * self.page_size.get() < positions {
            let digest = self.page_digest(tokens, page, state.as_ref())?;
            each(page, &digest);
            state = Some(digest);
            page += 1;
        }
        Ok(())
    }

    /// The digest of page `page` of `tokens` (the last may be partial; bigram reads one raw
    /// token past it), chained from `prior` (the previous page's digest). `page` must start
    /// within `tokens`' positions.
    pub fn page_digest<T: TokenId>(
        &self,
        tokens: &[T],
        page: usize,
        prior: Option<&PageDigest>,
    ) -> Result<PageDigest, HashError> {
        let start = page * self.page_size.get();
        let units = self.page_size.get().min(self.positions(tokens.len()).saturating_sub(start));
        match self.mode {
            HashMode::Unigram => hash_unigram_page(&tokens[start..start + units], prior, start),
            HashMode::Bigram => hash_bigram_page(&tokens[start..start + units + 1], prior, start),
        }
    }

    /// Appends the digest of every page of `tokens` to `out`.
    pub fn digests<T: TokenId>(
        &self,
        tokens: &[T],
        prior: Option<&PageDigest>,
        out: &mut Vec<PageDigest>,
    ) -> Result<(), HashError> {
        out.reserve(self.page_count(tokens.len()));
        self.for_each_digest(tokens, prior, |_, d| out.push(*d))
    }

    /// Appends the published block hash of every page of `tokens` to `out`.
    pub fn block_hashes_into<T: TokenId>(
        &self,
        tokens: &[T],
        prior: Option<&PageDigest>,
        out: &mut Vec<BlockHash>,
    ) -> Result<(), HashError> {
        out.reserve(self.page_count(tokens.len()));
        self.for_each_digest(tokens, prior, |_, d| out.push(BlockHash::from_digest(d)))
    }

    /// The published block hash of every page of `tokens`.
    pub fn block_hashes<T: TokenId>(
        &self,
        tokens: &[T],
        prior: Option<&PageDigest>,
    ) -> Result<Vec<BlockHash>, HashError> {
        let mut out = Vec::new();
        self.block_hashes_into(tokens, prior, &mut out)?;
        Ok(out)
    }
}

/// Hashes one unigram page; `offset` is only for error positions.
fn hash_unigram_page<T: TokenId>(
    page: &[T],
    prior: Option<&PageDigest>,
    offset: usize,
) -> Result<PageDigest, HashError> {
    let mut sha = Sha256::new();
    if let Some(p) = prior {
        sha.update(p);
    }
    if !T::ALWAYS_NARROW && is_wide(page, offset)? {
        sha.update([0xffu8]);
        feed_u64(&mut sha, page.iter().map(|t| t.to_u64()));
    } else {
        feed_u32(&mut sha, page.iter().map(|t| t.to_u64() as u32));
    }
    Ok(sha.finalize().into())
}

/// Hashes one bigram page from its `units + 1` raw tokens.
fn hash_bigram_page<T: TokenId>(raw: &[T], prior: Option<&PageDigest>, offset: usize) -> Result<PageDigest, HashError> {
    let mut sha = Sha256::new();
    if let Some(p) = prior {
        sha.update(p);
    }
    let pairs = raw.windows(2).flat_map(|w| [w[0].to_u64(), w[1].to_u64()]);
    if !T::ALWAYS_NARROW && is_wide(raw, offset)? {
        sha.update([0xffu8]);
        feed_u64(&mut sha, pairs);
    } else {
        feed_u32(&mut sha, pairs.map(|t| t as u32));
    }
    Ok(sha.finalize().into())
}

/// True if any token needs the wide (u64) page form; errors above `i64::MAX`.
pub(crate) fn is_wide<T: TokenId>(tokens: &[T], offset: usize) -> Result<bool, HashError> {
    let mut wide = false;
    for (i, t) in tokens.iter().enumerate() {
        let v = t.to_u64();
        if v > i64::MAX as u64 {
            return Err(HashError::TokenOutOfRange(v, offset + i));
        }
        wide |= v > u64::from(u32::MAX);
    }
    Ok(wide)
}

pub(crate) fn feed_u32(sha: &mut Sha256, words: impl Iterator<Item = u32>) {
    let mut stage = [0u8; STAGE_BYTES];
    let mut n = 0;
    for w in words {
        stage[n..n + 4].copy_from_slice(&w.to_le_bytes());
        n += 4;
        if n == STAGE_BYTES {
            sha.update(&stage[..]);
            n = 0;
        }
    }
    sha.update(&stage[..n]);
}

pub(crate) fn feed_u64(sha: &mut Sha256, words: impl Iterator<Item = u64>) {
    let mut stage = [0u8; STAGE_BYTES];
    let mut n = 0;
    for w in words {
        stage[n..n + 8].copy_from_slice(&w.to_le_bytes());
        n += 8;
        if n == STAGE_BYTES {
            sha.update(&stage[..]);
            n = 0;
        }
    }
    sha.update(&stage[..n]);
}

/// Tag of [`keyed_digest`].
const KEYS_TAG: &[u8] = b"sgl-router-block-keys-v1\0";

/// The router's digest of a block whose engine hash also covers `keys` (multimodal items,
/// prompt embeddings: what the router cannot compute from a request), as the chain continues
/// from it: `SHA256(tag ‖ digest ‖ u64le(len) ‖ keys)`. No request's chain has it, so no
/// request is credited with such a block, nor with any block after it.
pub fn keyed_digest(digest: &PageDigest, keys: &[u8]) -> PageDigest {
    let mut sha = Sha256::new();
    sha.update(KEYS_TAG);
    sha.update(digest);
    sha.update((keys.len() as u64).to_le_bytes());
    sha.update(keys);
    sha.finalize().into()
}

/// The prior a request's chain starts from: the salt prior for a non-empty
/// `cache_salt`, nothing otherwise (SGLang's `RadixKey` folds `""` into `None`).
pub fn chain_prior(cache_salt: Option<&str>) -> Option<PageDigest> {
    cache_salt.filter(|s| !s.is_empty()).map(salt_prior)
}

/// The prior of the router's chain for a namespace. Without a LoRA adapter it
/// is SGLang's own (`chain_prior`), so router and engine hashes agree. With
/// one, SGLang namespaces published hashes by an internal id the router cannot
/// know, so the router defines its own chain: it starts from SGLang's
/// namespace seed of the adapter's public name and the salt. Either way the
/// block hash stays the first eight bytes of the page digest.
pub fn namespace_prior(lora_name: Option<&str>, cache_salt: Option<&str>) -> Option<PageDigest> {
    match lora_name {
        None => chain_prior(cache_salt),
        Some(lora) => namespace_seed(Some(lora), cache_salt.filter(|s| !s.is_empty())),
    }
}

/// The prior digest a salted request's chain starts from:
/// `SHA256("sglang-cache-salt-v1\0" ‖ salt)`.
pub fn salt_prior(cache_salt: &str) -> PageDigest {
    let mut sha = Sha256::new();
    sha.update(SALT_TAG);
    sha.update(cache_salt.as_bytes());
    sha.finalize().into()
}

/// SGLang's `kv_event_namespace_seed`: `None` when both parts are absent,
/// else `SHA256(tag ‖ part₁ ‖ part₂)` where an absent part is `0x00` and a
/// present one `0x01 ‖ u64le(len) ‖ utf8`.
pub fn namespace_seed(extra_key: Option<&str>, cache_salt: Option<&str>) -> Option<PageDigest> {
    if extra_key.is_none() && cache_salt.is_none() {
        return None;
    }
    let mut sha = Sha256::new();
    sha.update(NAMESPACE_TAG);
    for part in [extra_key, cache_salt] {
        match part {
            None => sha.update([0u8]),
            Some(p) => {
                sha.update([1u8]);
                sha.update((p.len() as u64).to_le_bytes());
                sha.update(p.as_bytes());
            }
        }
    }
    Some(sha.finalize().into())
}

/// SGLang's `namespaced_block_hash`: the hash itself without a seed, else the
/// first eight bytes of `SHA256(seed ‖ i64be(hash))`, signed.
pub fn namespaced_block_hash(hash: BlockHash, seed: Option<&PageDigest>) -> BlockHash {
    match seed {
        None => hash,
        Some(seed) => {
            let mut sha = Sha256::new();
            sha.update(seed);
            sha.update(hash.0.to_be_bytes());
            BlockHash::from_digest(&sha.finalize().into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hasher(size: usize, mode: HashMode) -> PageHasher {
        PageHasher::new(NonZeroUsize::new(size).unwrap(), mode)
    }

    fn ids(hashes: Vec<BlockHash>) -> Vec<i64> {
        hashes.into_iter().map(|h| h.0).collect()
    }

    #[test]
    fn reference_check_values() {
        let h = hasher(4, HashMode::Unigram);
        let tokens: Vec<u32> = (1..=8).collect();
        assert_eq!(ids(h.block_hashes(&tokens, None).unwrap()), [-3488128144981237669, 5674439469042975057]);
        let h = hasher(2, HashMode::Unigram);
        assert_eq!(
            ids(h.block_hashes(&[0u32, 1, 2, 3, 4], None).unwrap()),
            [120731552294108698, -5785398976907936554, -1760925733444217280]
        );
    }

    #[test]
    fn u32_and_u64_inputs_agree_below_u32_max() {
        let h = hasher(16, HashMode::Unigram);
        let a: Vec<u32> = (0..100).map(|i| i * 1000 + 7).collect();
        let b: Vec<u64> = a.iter().map(|&t| u64::from(t)).collect();
        assert_eq!(h.block_hashes(&a, None).unwrap(), h.block_hashes(&b, None).unwrap());
    }

    #[test]
    fn continuation_from_a_prior_equals_the_whole_chain() {
        let h = hasher(4, HashMode::Unigram);
        let tokens: Vec<u32> = (0..40).collect();
        let mut all = Vec::new();
        h.digests(&tokens, None, &mut all).unwrap();
        let mut tail = Vec::new();
        h.digests(&tokens[16..], Some(&all[3]), &mut tail).unwrap();
        assert_eq!(&all[4..], &tail[..]);
    }

    #[test]
    fn bigram_needs_two_tokens_per_position() {
        let h = hasher(2, HashMode::Bigram);
        assert!(h.block_hashes(&[5u32], None).unwrap().is_empty());
        assert_eq!(h.block_hashes(&[5u32, 6], None).unwrap().len(), 1);
        assert_eq!(h.page_count(6), 3);
    }

    #[test]
    fn tokens_above_i64_max_are_an_error_not_a_panic() {
        let h = hasher(2, HashMode::Unigram);
        let err = h.block_hashes(&[1u64, 2, u64::MAX], None).unwrap_err();
        assert_eq!(err, HashError::TokenOutOfRange(u64::MAX, 2));
    }

    #[test]
    fn namespace_priors_keep_chains_apart() {
        assert_eq!(namespace_prior(None, None), None);
        assert_eq!(namespace_prior(None, Some("t")), Some(salt_prior("t")));
        let lora = namespace_prior(Some("a"), None);
        assert!(lora.is_some());
        assert_ne!(lora, namespace_prior(Some("a"), Some("t")));
        assert_ne!(lora, namespace_prior(Some("b"), None));
        assert_eq!(namespace_prior(Some("a"), Some("")), lora, "an empty salt is no salt");
    }

    #[test]
    fn empty_salt_is_no_salt() {
        assert_eq!(chain_prior(Some("")), None);
        assert_eq!(chain_prior(None), None);
        assert_eq!(chain_prior(Some("t")), Some(salt_prior("t")));
    }

    #[test]
    fn namespace_seed_separates_joined_parts() {
        assert_eq!(namespace_seed(None, None), None);
        assert_ne!(namespace_seed(Some("a"), Some("bc")), namespace_seed(Some("ab"), Some("c")));
        assert_ne!(namespace_seed(Some(""), None), namespace_seed(None, Some("")));
        let h = BlockHash(42);
        assert_eq!(namespaced_block_hash(h, None), h);
    }
}
