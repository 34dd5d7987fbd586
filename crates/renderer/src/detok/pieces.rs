//! The bytes each id of a byte-level tokenizer (GPT-2's lineage: Qwen, Llama 3, DeepSeek V3)
//! decodes to. Such a tokenizer's `decode` (a `ByteLevel` decoder alone) maps each id to its
//! token (special ones left out when asked), each token to bytes through the byte-level
//! alphabet (a token with a character outside it: its own UTF-8), joins the bytes and reads
//! them as UTF-8, lossily. So a token's bytes do not depend on its neighbours, and a sequence
//! is detokenized a token at a time by appending bytes ([`super::Incremental`]), not by
//! decoding windows of ids again.

use tokenizers::DecoderWrapper;

/// Every id's bytes, and which ids are special.
#[derive(Debug)]
pub(crate) struct BytePieces {
    /// The ids' bytes, one after the other.
    bytes: Vec<u8>,
    /// Where id `i`'s bytes end (they start where `i - 1`'s end).
    ends: Vec<u32>,
    /// Special ids (left out when `skip_special_tokens`), one bit each.
    special: Vec<u64>,
}

impl BytePieces {
    /// The table of `t`, when its decoder is `ByteLevel` alone (else `None`: its `decode`
    /// reads tokens together).
    pub(crate) fn of(t: &tokenizers::Tokenizer) -> Option<Self> {
        if !matches!(t.get_decoder(), Some(DecoderWrapper::ByteLevel(_))) {
            return None;
        }
        // Characters of the byte-level alphabet back to their bytes (all below U+0144).
        let mut to_byte = [None; 0x144];
        for (b, c) in crate::fast_bpe::byte_chars().iter().enumerate() {
            to_byte[*c as usize] = Some(b as u8);
        }
        let ids = t.get_vocab(true).values().max().map_or(0, |m| *m as usize + 1);
        let mut out =
            BytePieces { bytes: Vec::new(), ends: Vec::with_capacity(ids), special: vec![0; ids.div_ceil(64)] };
        let added = t.get_added_vocabulary();
        for id in 0..ids as u32 {
            // As `decode` looks an id up: the added tokens first, then the model's.
            if let Some(token) = t.id_to_token(id) {
                let start = out.bytes.len();
                for c in token.chars() {
                    match to_byte.get(c as usize).copied().flatten() {
                        Some(b) => out.bytes.push(b),
                        None => {
                            // A character outside the alphabet: the token's own bytes.
                            out.bytes.truncate(start);
                            out.bytes.extend_from_slice(token.as_bytes());
                            break;
                        }
                    }
                }
                if added.is_special_token(&token) {
                    out.special[id as usize / 64] |= 1 << (id % 64);
                }
            }
            out.ends.push(u32::try_from(out.bytes.len()).ok()?);
        }
        Some(out)
    }

    /// The bytes `id` adds to a decode: none for an unknown id, or a special one when
    /// `skip_special_tokens`.
    pub(crate) fn get(&self, id: u32, skip_special_tokens: bool) -> &[u8] {
        let i = id as usize;
        let Some(&end) = self.ends.get(i) else { return &[] };
        if skip_special_tokens && self.special[i / 64] & (1 << (i % 64)) != 0 {
            return &[];
        }
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start as usize..end as usize]
    }
}

/// Moves out of `pending` the text its bytes decide: every complete character, and U+FFFD
/// for each invalid sequence, as `String::from_utf8_lossy` reads them; an incomplete character
/// at the end stays (its next bytes may complete it).
pub(crate) fn take_decided(pending: &mut Vec<u8>) -> String {
    let mut out = String::new();
    let mut used = 0;
    for chunk in pending.utf8_chunks() {
        out.push_str(chunk.valid());
        used += chunk.valid().len();
        let invalid = chunk.invalid();
        if invalid.is_empty() {
            continue;
        }
        let at_end = used + invalid.len() == pending.len();
        if at_end && std::str::from_utf8(invalid).is_err_and(|e| e.error_len().is_none()) {
            break;
        }
        out.push('\u{FFFD}');
        used += invalid.len();
    }
    pending.drain(..used);
    out
}
