//! vLLM's lookahead hashing (`num_hash_lookahead_tokens`, on with EAGLE or MTP drafting), as
//! the router chains it: owns the fold of a block's lookahead tokens into its digest and a
//! request's chain for a worker that hashes that way.
//!
//! With a lookahead of `L` tokens, vLLM 0.33 hashes block `i` with the `L` tokens after it as
//! extra keys (`get_request_block_hasher`: `(E, *tokens[end:end + L])`), so a block exists only
//! once `L` tokens follow it, and the same tokens followed by others are another block. The
//! router cannot compute vLLM's hashes (its seed is the engine's), so it mirrors the chain with
//! its own: each page's digest (as [`PageHasher`] makes it, chained from the previous folded
//! digest) folded with its lookahead tokens. The pump folds a stored block's
//! `lookahead_token_ids`; a request's chain folds the tokens that follow each of its pages.
//!
//! ```text
//! page_i   = SHA256(folded_{i-1}? ‖ u32le(page_i tokens))   (PageHasher, unigram)
//! folded_i = SHA256(tag ‖ page_i ‖ u64le(L) ‖ u64le(tokens[end_i .. end_i + L]))
//! ```

use std::num::NonZeroUsize;

use router_types::BlockHash;
use sha2::{Digest as _, Sha256};

use crate::hash::{HashError, HashMode, PageDigest, PageHasher, TokenId};

/// Tag of [`lookahead_digest`].
const LOOKAHEAD_TAG: &[u8] = b"sgl-router-block-lookahead-v1\0";

/// The router's digest of a block whose engine hash also covers the `lookahead` tokens after it,
/// from the block's own page digest: `SHA256(tag ‖ digest ‖ u64le(L) ‖ u64le(tokens))`.
pub fn lookahead_digest<T: TokenId>(digest: &PageDigest, lookahead: &[T]) -> PageDigest {
    let mut sha = Sha256::new();
    sha.update(LOOKAHEAD_TAG);
    sha.update(digest);
    sha.update((lookahead.len() as u64).to_le_bytes());
    for t in lookahead {
        sha.update(t.to_u64().to_le_bytes());
    }
    sha.finalize().into()
}

/// A request's chain as a worker with a lookahead of `lookahead` tokens keys it: the block hash
/// of every full page of `page` tokens that at least `lookahead` more tokens follow (vLLM hashes
/// no other), each page chained from the previous folded digest, the first from `prior`.
pub fn lookahead_block_hashes<T: TokenId>(
    page: NonZeroUsize,
    tokens: &[T],
    lookahead: usize,
    prior: Option<&PageDigest>,
) -> Result<Vec<BlockHash>, HashError> {
    let hasher = PageHasher::new(page, HashMode::Unigram);
    let size = page.get();
    let blocks = tokens.len().saturating_sub(lookahead) / size;
    let mut out = Vec::with_capacity(blocks);
    let mut state = prior.copied();
    let mut one = Vec::with_capacity(1);
    for i in 0..blocks {
        let end = (i + 1) * size;
        one.clear();
        hasher.digests(&tokens[i * size..end], state.as_ref(), &mut one)?;
        let folded = lookahead_digest(&one[0], &tokens[end..end + lookahead]);
        out.push(BlockHash::from_digest(&folded));
        state = Some(folded);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let tokens: Vec<u32> = (100..113).collect();
        let hasher = PageHasher::new(PAGE, HashMode::Unigram);
        let mut state: Option<PageDigest> = None;
        let mut by_block = Vec::new();
        for i in 0..3 {
            let mut one = Vec::new();
            hasher.digests(&tokens[i * 4..i * 4 + 4], state.as_ref(), &mut one).unwrap();
            let folded = lookahead_digest(&one[0], &tokens[i * 4 + 4..i * 4 + 5]);
            by_block.push(BlockHash::from_digest(&folded));
            state = Some(folded);
        }
        assert_eq!(chain(&tokens, 1), by_block);
    }
}
