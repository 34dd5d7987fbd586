//! Checks the block hashes a vLLM stream publishes against vLLM's own hash of the tokens and keys
//! published with them (`renderer::vllm_hash`: vLLM's default `sha256` with its fixed seed), so
//! a vLLM worker whose blocks the router reads otherwise than the engine made them shows in
//! `hash_mismatches`, as an SGLang one does.

use std::sync::OnceLock;

use renderer::vllm_hash::{ExtraKey, VllmHash, block_hash, none_hash, published};
use router_types::opaque::{OpaqueKey, opaque_keys};
use router_types::{EngineBlockHash, StoredBlocks};

/// What one stream (one KV-cache group) has shown of its hashes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum VllmHashes {
    /// No store checked yet.
    #[default]
    Unknown,
    /// Its first checked store hashed as vLLM's default does: every later one is checked.
    Default,
    /// It did not (another `--prefix-caching-hash-algo`, a `PYTHONHASHSEED`, or not vLLM):
    /// not checked.
    Other,
}

/// How many of a store's blocks hash as vLLM's default does, of how many. `None` when the store
/// cannot be checked: its parent published as an integer (the parent's full hash is not in the
/// event; a chain's first store and stores with byte hashes are checked), a LoRA adapter (its
/// path is part of the hash, not of the event), bigram tokens, keys of a shape vLLM does not
/// send.
pub(crate) fn check(s: &StoredBlocks, page: usize) -> Option<(usize, usize)> {
    static NONE_HASH: OnceLock<VllmHash> = OnceLock::new();
    if s.namespace.lora_name.is_some() || s.bigram || page == 0 {
        return None;
    }
    let mut parent: VllmHash = match &s.parent {
        None => *NONE_HASH.get_or_init(none_hash),
        Some(EngineBlockHash::Bytes(b)) => b.as_ref().try_into().ok()?,
        Some(_) => return None,
    };
    // vLLM keys the salt on a request's first block only: a chain's first store's first block.
    let salt = s.parent.is_none().then_some(s.namespace.cache_salt.as_deref()).flatten();
    let mut matched = 0;
    for (i, engine) in s.block_hashes.iter().enumerate() {
        let tokens = s.token_ids.get(i * page..(i + 1) * page)?;
        let mut keys: Vec<ExtraKey<'_>> = Vec::new();
        let mut embeds: Vec<ExtraKey<'_>> = Vec::new();
        if let Some(Some(canonical)) = s.opaque_keys.get(i) {
            for key in opaque_keys(canonical)? {
                match key {
                    OpaqueKey::Bytes(digest) => embeds.push(ExtraKey::PromptEmbeds(digest)),
                    _ => {
                        let (identifier, offset) = key.multimodal()?;
                        keys.push(ExtraKey::Mm { identifier, offset });
                    }
                }
            }
        }
        // vLLM's order: multimodal items, the salt, prompt embeddings.
        if let (0, Some(salt)) = (i, salt) {
            keys.push(ExtraKey::CacheSalt(salt));
        }
        keys.append(&mut embeds);
        let lookahead = s.lookahead.get(i).map_or(&[][..], |l| &l[..]);
        let hash = block_hash(&parent, tokens, &keys, lookahead);
        matched += usize::from(match engine {
            EngineBlockHash::Bytes(b) => b[..] == hash[..],
            int => int.key() == published(&hash),
        });
        parent = hash;
    }
    Some((matched, s.block_hashes.len()))
}

#[cfg(test)]
mod tests {
    use kv_events::{Limits, decode_batch};
    use router_types::KvEvent;
    use serde_json::Value;

    use super::check;

    const WIRE: &str = include_str!("../../../tests/fixtures/kv_events/wire_cases.json");

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// Each vLLM case of the wire fixture (`gen_wire_fixtures.py`: hashes by vLLM's own
    /// `hash_block_tokens`), its stores checked: (case, matched, checked blocks).
    fn checked() -> Vec<(String, usize, usize)> {
        let doc: Value = serde_json::from_str(WIRE).unwrap();
        let mut out = Vec::new();
        for case in doc["cases"].as_array().unwrap().iter().filter(|c| c["engine"] == "vllm") {
            let decoded = decode_batch(&unhex(case["payload_hex"].as_str().unwrap()), &Limits::default()).unwrap();
            let (mut matched, mut blocks) = (0, 0);
            for event in &decoded.batch.events {
                if let KvEvent::Stored(s) = event
                    && let Some((m, n)) = check(s, s.block_size as usize)
                {
                    (matched, blocks) = (matched + m, blocks + n);
                }
            }
            out.push((case["name"].as_str().unwrap().to_owned(), matched, blocks));
        }
        out
    }

    #[test]
    fn vllms_own_hashes_check_out_bit_for_bit() {
        let all = checked();
        let of = |name: &str| all.iter().find(|(n, _, _)| n == name).map(|(_, m, b)| (*m, *b)).unwrap();
        // Plain blocks, byte hashes under a byte parent, the salt, multimodal items, prompt
        // embeddings, lookahead tokens, KV-cache groups: every checkable block is vLLM's hash.
        for name in [
            "vllm_store_no_parent_two_blocks",
            "vllm_bytes_hashes_sha256",
            "vllm_salt_alone_in_extra_keys",
            "vllm_multimodal_embeds_and_salt_keys",
            "vllm_lookahead_token_ids",
            "vllm_group_kinds",
        ] {
            let (matched, blocks) = of(name);
            assert!(blocks >= 2 && matched == blocks, "{name}: {matched} of {blocks}");
        }
        // Another algorithm (xxhash, 16-byte hashes), and lookahead tokens sent without having
        // been hashed (the case of fields the decoder once skipped): nothing checks out.
        assert_eq!(of("vllm_bytes_hashes_xxhash128"), (0, 2));
        assert_eq!(of("vllm_extra_unknown_fields"), (0, 2));
        // A store under an integer parent, or under a LoRA adapter: not checkable.
        assert_eq!(of("vllm_store_chain_with_parent"), (0, 0));
        assert_eq!(of("vllm_lora_name_and_salt_in_extra_keys"), (0, 0));
        let (matched, blocks) = all.iter().fold((0, 0), |(m, b), (_, mm, bb)| (m + mm, b + bb));
        assert_eq!(matched + 4, blocks, "only the two cases above differ");
        assert!(blocks >= 30, "{blocks} blocks checked");
    }
}
