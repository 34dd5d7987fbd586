//! What a vLLM `BlockStored` carries besides tokens, over msgpack: owns the decoding of
//! `extra_keys` (into the canonical per-block form `StoredBlocks::opaque_keys` keeps, and the
//! first block's texts, where vLLM's cache salt is: `router_types::opaque`) and of
//! `lookahead_token_ids`.

use router_types::MAX_LOOKAHEAD_TOKENS;
use router_types::opaque::{OpaqueKeys, Part};

use crate::WireError;
use crate::msgpack::{Item, Reader};

/// Most keys one block's `extra_keys` entry may carry.
const MAX_KEYS_PER_BLOCK: usize = 256;

/// vLLM's `extra_keys`: per block nil or the block's untagged keys (`to_event_extra_keys`):
/// bare strings (the LoRA name and the cache salt: the namespace; the first block's are kept in
/// `first_block_strings`, `router_types::opaque::vllm_salt` reads the salt from them), `(identifier, offset)`
/// pairs of multimodal items and bare prompt-embedding digests; at most `max_blocks` entries.
/// The pairs and the digests (and bare integers) are kept per block in the canonical form
/// (`router_types::opaque`), for the router's chain to fold in; `None` for a block with none.
pub(crate) fn read_extra_keys(
    r: &mut Reader<'_>,
    max_blocks: usize,
    first_block_strings: &mut Vec<String>,
) -> Result<Vec<Option<Box<[u8]>>>, WireError> {
    let malformed = |r: &Reader<'_>, what| WireError::Malformed { at: r.pos(), what };
    let n = per_block(r, max_blocks, "extra_keys", "extra_keys must be an array or nil")?;
    let mut out = Vec::with_capacity(n);
    for block in 0..n {
        let keys = match r.next()? {
            Item::Nil => 0,
            Item::Array(k) if k <= MAX_KEYS_PER_BLOCK => k,
            Item::Array(k) => {
                return Err(WireError::TooLong { what: "extra_keys entry", len: k, limit: MAX_KEYS_PER_BLOCK });
            }
            _ => return Err(malformed(r, "an extra_keys entry must be an array or nil")),
        };
        let mut canonical = OpaqueKeys::default();
        for _ in 0..keys {
            match r.next()? {
                // The LoRA name or the cache salt: the namespace.
                Item::Str(s) => {
                    if block == 0 && first_block_strings.len() < 2 {
                        first_block_strings.push(s.to_owned());
                    }
                }
                Item::Bin(digest) => canonical.bytes(digest),
                // No shape vLLM sends today; kept, so the block is never credited for it.
                Item::Uint(v) => canonical.uint(v),
                Item::Int(v) => canonical.int(v),
                Item::Array(n) if n <= 8 => {
                    let mut parts: Vec<Part<'_>> = Vec::with_capacity(n);
                    for _ in 0..n {
                        parts.push(match r.next()? {
                            Item::Str(v) => Part::Str(v),
                            Item::Bin(v) => Part::Bytes(v),
                            Item::Uint(v) => Part::Int(i128::from(v)),
                            Item::Int(v) => Part::Int(i128::from(v)),
                            _ => {
                                return Err(malformed(
                                    r,
                                    "a multimodal key part must be a string, bytes or an integer",
                                ));
                            }
                        });
                    }
                    canonical.tuple(&parts);
                }
                _ => return Err(malformed(r, "an extra key must be a string, bytes or a pair")),
            }
        }
        out.push(canonical.finish());
    }
    // No block with keys the router cannot compute: nothing to keep.
    if out.iter().all(Option::is_none) {
        out.clear();
    }
    Ok(out)
}

/// The length of a per-block list (nil: 0), at most `max_blocks`.
fn per_block(
    r: &mut Reader<'_>,
    max_blocks: usize,
    what: &'static str,
    not_a_list: &'static str,
) -> Result<usize, WireError> {
    let n = match r.next()? {
        Item::Nil => 0,
        Item::Array(n) => n,
        _ => return Err(WireError::Malformed { at: r.pos(), what: not_a_list }),
    };
    if n > max_blocks {
        return Err(WireError::TooLong { what, len: n, limit: max_blocks });
    }
    Ok(n)
}

/// vLLM's `lookahead_token_ids`: nil, or per block the tokens after it that its hash covers,
/// every list of the same length, 1 to [`MAX_LOOKAHEAD_TOKENS`] (the engine's
/// `num_hash_lookahead_tokens`).
pub(crate) fn read_lookahead(r: &mut Reader<'_>, max_blocks: usize) -> Result<Vec<Box<[u64]>>, WireError> {
    let malformed = |r: &Reader<'_>, what| WireError::Malformed { at: r.pos(), what };
    let n = per_block(r, max_blocks, "lookahead_token_ids", "lookahead_token_ids must be an array or nil")?;
    let mut out: Vec<Box<[u64]>> = Vec::with_capacity(n);
    for _ in 0..n {
        let len = match r.next()? {
            Item::Array(k) if k > MAX_LOOKAHEAD_TOKENS => {
                return Err(WireError::TooLong {
                    what: "lookahead tokens of a block",
                    len: k,
                    limit: MAX_LOOKAHEAD_TOKENS,
                });
            }
            Item::Array(0) => return Err(malformed(r, "a block's lookahead tokens must not be empty")),
            Item::Array(k) => k,
            _ => return Err(malformed(r, "a block's lookahead tokens must be an array")),
        };
        if out.first().is_some_and(|first| first.len() != len) {
            return Err(malformed(r, "every block's lookahead must have the same length"));
        }
        let tokens = (0..len)
            .map(|_| match r.next()? {
                Item::Uint(u) => Ok(u),
                _ => Err(malformed(r, "token ids must be non-negative integers")),
            })
            .collect::<Result<Box<[u64]>, _>>()?;
        out.push(tokens);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msgpack::Writer;
    use router_types::opaque::{OpaqueKey, opaque_keys};

    #[test]
    fn canonical_keys_read_back_with_their_types() {
        // [[["mm-abc", 3], <digest>, ["x", -2, b"\x01"]], nil, [7]]
        let mut w = Writer::default();
        w.array(3);
        w.array(3);
        w.array(2);
        w.str("mm-abc");
        w.uint(3);
        w.bin(&[9; 32]);
        w.array(3);
        w.str("x");
        w.int(-2);
        w.bin(&[1]);
        w.nil();
        w.array(1);
        w.uint(7);
        let mut strings = Vec::new();
        let keys = read_extra_keys(&mut Reader::new(&w.buf), 1_000, &mut strings).unwrap();
        assert_eq!(keys.len(), 3);
        assert_eq!(
            opaque_keys(keys[0].as_deref().unwrap()).unwrap(),
            [
                OpaqueKey::Tuple(vec![Part::Str("mm-abc"), Part::Int(3)]),
                OpaqueKey::Bytes(&[9; 32]),
                OpaqueKey::Tuple(vec![Part::Str("x"), Part::Int(-2), Part::Bytes(&[1])]),
            ]
        );
        assert!(keys[1].is_none());
        assert_eq!(opaque_keys(keys[2].as_deref().unwrap()).unwrap(), [OpaqueKey::Int(7)]);
        assert!(strings.is_empty());
    }
}
