//! vLLM's lookahead hashing (`num_hash_lookahead_tokens`, on with EAGLE or MTP drafting), as
//! the router chains it: owns a block's digest with its lookahead tokens and a request's chain
//! for a worker that hashes that way.
//!
//! With a lookahead of `L` tokens, vLLM 0.33 hashes block `i` with the `L` tokens after it as
//! extra keys (`get_request_block_hasher`: `(E, *tokens[end:end + L])`), so a block exists only
//! once `L` tokens follow it, and the same tokens followed by others are another block. The
//! router's index keys blocks by the router's own digests (vLLM's hashes are checked apart,
//! `vllm_hash`), so it mirrors that chain: each block's digest covers the previous one, the
//! tokens after the block and the block's own tokens, in one SHA-256 of two 64-byte blocks for
//! a 16-token page and a lookahead up to 5 (the plain chain's cost). The pump digests a stored
//! block with its `lookahead_token_ids`; a request's chain, each page with the tokens that
//! follow it in the prompt.
//!
//! ```text
//! digest_i = SHA256(0xFE ‖ digest_{i-1}? ‖ u8(L) ‖ words(tokens[end_i .. end_i + L] ‖ page_i))
//! words: u32le of each token, or 0xFF ‖ u64le of each when one is above u32::MAX (as PageHasher)
//! ```
//!
//! No plain page digest has the same input: a plain page's is a multiple of 4 bytes long (or
//! starts with 0xFF, or with its prior digest, then 4-byte words).

use std::num::NonZeroUsize;

use router_types::BlockHash;
use sha2::{Digest as _, Sha256};

use crate::hash::{HashError, PageDigest, TokenId, feed_u32, feed_u64, is_wide};

/// The first byte of [`lookahead_digest`]'s input.
const LOOKAHEAD_TAG: u8 = 0xFE;

/// The router's digest of a block (`page`, its tokens) whose engine hash also covers the
/// `lookahead` tokens after it, chained from `prior` (the previous block's digest). Errors as
/// [`crate::PageHasher`] does on a token above `i64::MAX`.
pub fn lookahead_digest<T: TokenId>(
    prior: Option<&PageDigest>,
    page: &[T],
    lookahead: &[T],
) -> Result<PageDigest, HashError> {
    let mut sha = Sha256::new();
    sha.update([LOOKAHEAD_TAG]);
    if let Some(p) = prior {
        sha.update(p);
    }
    // At most `MAX_LOOKAHEAD_TOKENS` (64: the decoders refuse more): one byte.
    sha.update([lookahead.len().min(255) as u8]);
    let words = lookahead.iter().chain(page).map(|t| t.to_u64());
    if !T::ALWAYS_NARROW && (is_wide(lookahead, 0)? | is_wide(page, 0)?) {
        sha.update([0xffu8]);
        feed_u64(&mut sha, words);
    } else {
        feed_u32(&mut sha, words.map(|t| t as u32));
    }
    Ok(sha.finalize().into())
}

/// A request's chain as a worker with a lookahead of `lookahead` tokens keys it: the block hash
/// of every full page of `page` tokens that at least `lookahead` more tokens follow (vLLM hashes
/// no other), each page chained from the previous page's digest, the first from `prior`.
pub fn lookahead_block_hashes<T: TokenId>(
    page: NonZeroUsize,
    tokens: &[T],
    lookahead: usize,
    prior: Option<&PageDigest>,
) -> Result<Vec<BlockHash>, HashError> {
    let mut digests = Vec::new();
    lookahead_digests(page, tokens, lookahead, (0, prior), &mut digests)?;
    Ok(digests.iter().map(BlockHash::from_digest).collect())
}

/// The pages of `tokens` that `lookahead` tokens follow (`lookahead_page_count`), from page
/// `from` on, chained from `prior` (page `from - 1`'s digest, or the chain's own prior): their
/// digests appended to `out`.
pub fn lookahead_digests<T: TokenId>(
    page: NonZeroUsize,
    tokens: &[T],
    lookahead: usize,
    (from, prior): (usize, Option<&PageDigest>),
    out: &mut Vec<PageDigest>,
) -> Result<(), HashError> {
    let size = page.get();
    let blocks = lookahead_page_count(page, tokens.len(), lookahead);
    out.reserve(blocks.saturating_sub(from));
    let mut state = prior.copied();
    for i in from..blocks {
        let end = (i + 1) * size;
        let digest = lookahead_digest(state.as_ref(), &tokens[i * size..end], &tokens[end..end + lookahead])?;
        out.push(digest);
        state = Some(digest);
    }
    Ok(())
}

/// How many pages of `page` tokens of a `len`-token prompt are hashed with a lookahead of
/// `lookahead` tokens: those it holds whole with `lookahead` tokens after them.
pub fn lookahead_page_count(page: NonZeroUsize, len: usize, lookahead: usize) -> usize {
    len.saturating_sub(lookahead) / page.get()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::{HashMode, PageHasher};

    const PAGE: NonZeroUsize = NonZeroUsize::new(4).unwrap();

    fn chain(tokens: &[u32], lookahead: usize) -> Vec<BlockHash> {
        lookahead_block_hashes(PAGE, tokens, lookahead, None).unwrap()
    }

    #[test]
    fn a_block_exists_only_once_its_lookahead_follows() {
        let tokens: Vec<u32> = (1..=10).collect();
        assert_eq!(chain(&tokens, 1).len(), 2, "10 tokens: blocks end at 4 and 8, each followed by one");
        assert_eq!(chain(&tokens, 2).len(), 2);
        assert_eq!(chain(&tokens, 3).len(), 1, "the block ending at 8 has only two tokens after it");
        assert_eq!(chain(&tokens[..8], 1).len(), 1, "the last block has nothing after it");
        assert!(chain(&tokens[..4], 1).is_empty());
    }

    #[test]
    fn the_tokens_after_a_block_make_it_another_block() {
        let a = chain(&[1, 2, 3, 4, 5, 6, 7, 8, 9], 1);
        let b = chain(&[1, 2, 3, 4, 5, 6, 7, 8, 10], 1);
        assert_eq!(a[0], b[0], "the first block's lookahead (5) is the same");
        assert_ne!(a[1], b[1], "the second's is 9 against 10");
        let c = chain(&[1, 2, 3, 4, 6, 6, 7, 8, 9], 1);
        assert_ne!(a[0], c[0], "the first block's lookahead differs");
        assert_ne!(a[1], c[1], "and the chain differs from there on");
    }

    #[test]
    fn folded_blocks_are_not_plain_blocks_and_lookaheads_differ() {
        let tokens: Vec<u32> = (1..=9).collect();
        let plain = PageHasher::new(PAGE, HashMode::Unigram).block_hashes(&tokens[..8], None).unwrap();
        let one = chain(&tokens, 1);
        assert!(one.iter().all(|h| !plain.contains(h)));
        let ids: Vec<u64> = tokens.iter().map(|t| u64::from(*t)).collect();
        let wide = lookahead_block_hashes(PAGE, &ids, 1, None).unwrap();
        assert_eq!(one, wide, "token ids from events (u64) and from a tokenizer (u32) chain alike");
        assert_ne!(chain(&tokens, 1)[0], chain(&tokens, 2)[0], "the lookahead's length is part of the key");
    }

    #[test]
    fn the_chain_folds_as_the_pump_folds_one_block_at_a_time() {
        // What the pump does with a stored block and its `lookahead_token_ids`.
        let tokens: Vec<u64> = (100..113).collect();
        let mut state: Option<PageDigest> = None;
        let mut by_block = Vec::new();
        for i in 0..3 {
            let digest =
                lookahead_digest(state.as_ref(), &tokens[i * 4..i * 4 + 4], &tokens[i * 4 + 4..i * 4 + 5]).unwrap();
            by_block.push(BlockHash::from_digest(&digest));
            state = Some(digest);
        }
        let narrow: Vec<u32> = tokens.iter().map(|t| *t as u32).collect();
        assert_eq!(chain(&narrow, 1), by_block, "ids from events (u64) and from a tokenizer (u32) alike");
        let wide = [u64::from(u32::MAX) + 1, 1, 2, 3, 4];
        assert_ne!(
            lookahead_digest(None, &wide[..4], &wide[4..]).unwrap(),
            lookahead_digest(None, &[0u64, 1, 2, 3], &wide[4..]).unwrap(),
            "a wide token is hashed whole"
        );
        assert!(lookahead_digest(None, &[u64::MAX, 1, 2, 3], &[4u64]).is_err());
        assert!(lookahead_digest(None, &[1u64, 2, 3, 4], &[u64::MAX]).is_err());
    }
}
