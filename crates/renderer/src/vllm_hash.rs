//! vLLM 0.33's block hash, bit for bit, with its default `--prefix-caching-hash-algo sha256`:
//! owns the pickle of a block's hash input and the hash itself, so the pump can check the hashes
//! a vLLM engine publishes against the tokens and keys it publishes with them.
//!
//! ```text
//! hash_block_tokens = SHA256(pickle.dumps((parent, tuple(tokens), extra_keys), protocol=5))
//! NONE_HASH (the first block's parent) = SHA256(pickle.dumps("vllm-none-hash", protocol=5))
//! published (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the default) = the hash's last 8 bytes, big-endian
//! ```
//!
//! `extra_keys` is `None` or the block's tagged keys in vLLM's order (`("mm", identifier,
//! offset)`…, `("cache_salt", salt)` on a request's first block, `("prompt_embeds", digest)`);
//! with a lookahead of `L` tokens it is `(keys_or_None, *the L tokens after the block)`. The LoRA
//! key (`("lora", name, path)`) is not here: events carry the name, not the path. A seed set
//! with `PYTHONHASHSEED`, or another algorithm (`sha256_cbor`, `xxhash`), gives other hashes.

use sha2::{Digest as _, Sha256};

/// vLLM's `DEFAULT_NONE_HASH_SEED`.
const NONE_HASH_SEED: &str = "vllm-none-hash";

/// A tagged key of a block's hash (`generate_block_hash_extra_keys`), in vLLM's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtraKey<'a> {
    /// A multimodal item in the block: its identifier and its offset from the block's start.
    Mm { identifier: &'a str, offset: i64 },
    /// The request's cache salt (its first block only).
    CacheSalt(&'a str),
    /// The digest of the block's prompt embeddings.
    PromptEmbeds(&'a [u8]),
}

/// A vLLM block hash (SHA-256).
pub type VllmHash = [u8; 32];

/// `NONE_HASH`: the parent of a chain's first block.
pub fn none_hash() -> VllmHash {
    let mut p = Pickle::new();
    p.str(NONE_HASH_SEED);
    Sha256::digest(p.finish()).into()
}

/// `hash_block_tokens(sha256, parent, tokens, extra_keys)` as vLLM builds `extra_keys` from
/// `keys` (none: `None`) and the block's `lookahead` tokens (none: no lookahead hashing).
pub fn block_hash(parent: &VllmHash, tokens: &[u64], keys: &[ExtraKey<'_>], lookahead: &[u64]) -> VllmHash {
    let mut p = Pickle::new();
    p.bytes(parent);
    p.tuple(tokens.len(), |p| tokens.iter().for_each(|t| p.int(i128::from(*t))));
    let keys_or_none = |p: &mut Pickle| {
        if keys.is_empty() {
            p.none();
        } else {
            p.tuple(keys.len(), |p| keys.iter().for_each(|k| p.key(k)));
        }
    };
    if lookahead.is_empty() {
        keys_or_none(&mut p);
    } else {
        p.tuple(1 + lookahead.len(), |p| {
            keys_or_none(p);
            lookahead.iter().for_each(|t| p.int(i128::from(*t)));
        });
    }
    p.end_tuple(3);
    Sha256::digest(p.finish()).into()
}

/// The hash as vLLM publishes it by default (`maybe_convert_block_hash`): its last eight bytes,
/// big-endian.
pub fn published(hash: &VllmHash) -> u64 {
    u64::from_be_bytes(hash[24..].try_into().unwrap_or([0; 8]))
}

/// CPython's pickler (protocol 5) for the objects of a block's hash input: one frame, every
/// string, bytes object and tuple memoized, the literal tag strings (the same object each time
/// in vLLM) fetched from the memo after their first time.
struct Pickle {
    out: Vec<u8>,
    memo: u32,
    tags: Vec<(&'static str, u32)>,
}

impl Pickle {
    fn new() -> Self {
        // PROTO 5, then FRAME with its length filled in by `finish`.
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(&[0x80, 5, 0x95, 0, 0, 0, 0, 0, 0, 0, 0]);
        Self { out, memo: 0, tags: Vec::new() }
    }

    fn finish(mut self) -> Vec<u8> {
        self.out.push(b'.');
        let frame = (self.out.len() - 11) as u64;
        self.out[3..11].copy_from_slice(&frame.to_le_bytes());
        self.out
    }

    fn memoize(&mut self) -> u32 {
        self.out.push(0x94);
        self.memo += 1;
        self.memo - 1
    }

    fn none(&mut self) {
        self.out.push(b'N');
    }

    fn int(&mut self, v: i128) {
        match v {
            0..=0xff => self.out.extend_from_slice(&[b'K', v as u8]),
            0x100..=0xffff => {
                self.out.push(b'M');
                self.out.extend_from_slice(&(v as u16).to_le_bytes());
            }
            _ if i32::try_from(v).is_ok() => {
                self.out.push(b'J');
                self.out.extend_from_slice(&(v as i32).to_le_bytes());
            }
            _ => {
                // LONG1: the shortest little-endian two's complement.
                let bytes = v.to_le_bytes();
                let mut n = 16;
                while n > 1 {
                    let (top, next) = (bytes[n - 1], bytes[n - 2]);
                    if (top == 0 && next & 0x80 == 0) || (top == 0xff && next & 0x80 != 0) {
                        n -= 1;
                    } else {
                        break;
                    }
                }
                self.out.extend_from_slice(&[0x8a, n as u8]);
                self.out.extend_from_slice(&bytes[..n]);
            }
        }
    }

    fn str(&mut self, s: &str) {
        let len = s.len();
        if len < 256 {
            self.out.extend_from_slice(&[0x8c, len as u8]);
        } else {
            self.out.push(b'X');
            self.out.extend_from_slice(&(len as u32).to_le_bytes());
        }
        self.out.extend_from_slice(s.as_bytes());
        self.memoize();
    }

    /// A literal string of vLLM's code: one object, so pickled once and then fetched.
    fn tag(&mut self, tag: &'static str) {
        match self.tags.iter().find(|(t, _)| *t == tag) {
            Some((_, at)) if *at < 256 => self.out.extend_from_slice(&[b'h', *at as u8]),
            Some((_, at)) => {
                self.out.push(b'j');
                self.out.extend_from_slice(&at.to_le_bytes());
            }
            None => {
                self.str(tag);
                self.tags.push((tag, self.memo - 1));
            }
        }
    }

    fn bytes(&mut self, b: &[u8]) {
        if b.len() < 256 {
            self.out.extend_from_slice(&[b'C', b.len() as u8]);
        } else {
            self.out.push(b'B');
            self.out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        }
        self.out.extend_from_slice(b);
        self.memoize();
    }

    /// A tuple of `len` items written by `items`.
    fn tuple(&mut self, len: usize, items: impl FnOnce(&mut Self)) {
        if len > 3 {
            self.out.push(b'(');
        }
        items(self);
        self.end_tuple(len);
    }

    fn end_tuple(&mut self, len: usize) {
        match len {
            0 => return self.out.push(b')'),
            1 => self.out.push(0x85),
            2 => self.out.push(0x86),
            3 => self.out.push(0x87),
            _ => self.out.push(b't'),
        }
        self.memoize();
    }

    fn key(&mut self, key: &ExtraKey<'_>) {
        match *key {
            ExtraKey::Mm { identifier, offset } => self.tuple(3, |p| {
                p.tag("mm");
                p.str(identifier);
                p.int(i128::from(offset));
            }),
            ExtraKey::CacheSalt(salt) => self.tuple(2, |p| {
                p.tag("cache_salt");
                p.str(salt);
            }),
            ExtraKey::PromptEmbeds(digest) => self.tuple(2, |p| {
                p.tag("prompt_embeds");
                p.bytes(digest);
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// Bytes from CPython 3.11's `pickle.dumps(obj, 5)` (in each comment).
    #[test]
    fn pickles_as_cpython_does() {
        let mut p = Pickle::new();
        p.str("vllm-none-hash");
        assert_eq!(hex(&p.finish()), "80059512000000000000008c0e766c6c6d2d6e6f6e652d68617368942e");

        // (b"\0" * 32, (1, 2, 300, 70000, 2**31, 2**40), None)
        let mut p = Pickle::new();
        p.bytes(&[0; 32]);
        p.tuple(6, |p| [1i128, 2, 300, 70_000, 1 << 31, 1 << 40].into_iter().for_each(|v| p.int(v)));
        p.none();
        p.end_tuple(3);
        assert_eq!(
            hex(&p.finish()),
            "80059545000000000000004320000000000000000000000000000000000000000000000000000000000000000094\
             284b014b024d2c014a701101008a0500000080008a0600000000000174944e87942e"
        );

        // (b"\0" * 32, (1, 2), (("mm", "abc", 0), ("mm", "def", 3), ("cache_salt", "s")))
        let mut p = Pickle::new();
        p.bytes(&[0; 32]);
        p.tuple(2, |p| [1i128, 2].into_iter().for_each(|v| p.int(v)));
        let keys = [
            ExtraKey::Mm { identifier: "abc", offset: 0 },
            ExtraKey::Mm { identifier: "def", offset: 3 },
            ExtraKey::CacheSalt("s"),
        ];
        p.tuple(3, |p| keys.iter().for_each(|k| p.key(k)));
        p.end_tuple(3);
        assert_eq!(
            hex(&p.finish()),
            "8005955c0000000000000043200000000000000000000000000000000000000000000000000000000000000000944b014b02\
             86948c026d6d948c03616263944b00879468028c03646566944b0387948c0a63616368655f73616c74948c017394869487\
             9487942e"
        );
    }

    #[test]
    fn lookahead_keys_wrap_the_blocks_keys() {
        // (b"\0" * 32, (1,), (None, 5)) and (b"\0" * 32, (1,), ((("mm", "a", 0),), 5, 6))
        let parent = [0u8; 32];
        let digest = |hex_pickle: &str| -> VllmHash {
            let bytes: Vec<u8> = (0..hex_pickle.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex_pickle[i..i + 2], 16).unwrap())
                .collect();
            Sha256::digest(bytes).into()
        };
        assert_eq!(
            block_hash(&parent, &[1], &[], &[5]),
            digest(
                "8005952f0000000000000043200000000000000000000000000000000000000000000000000000000000000000944b0185944e4b05869487942e"
            )
        );
        assert_eq!(
            block_hash(&parent, &[1], &[ExtraKey::Mm { identifier: "a", offset: 0 }], &[5, 6]),
            digest(
                "8005953f0000000000000043200000000000000000000000000000000000000000000000000000000000000000944b01\
                 85948c026d6d948c0161944b00879485944b054b06879487942e"
            )
        );
    }

    #[test]
    fn long_integers_are_shortest_twos_complement() {
        let enc = |v: i128| {
            let mut p = Pickle::new();
            p.int(v);
            p.out[11..].to_vec()
        };
        assert_eq!(enc(255), [b'K', 255]);
        assert_eq!(enc(256), [b'M', 0, 1]);
        assert_eq!(enc(-1), [b'J', 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(enc(1 << 31), [0x8a, 5, 0, 0, 0, 0x80, 0]);
        assert_eq!(enc(i128::from(u64::MAX)), [0x8a, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0]);
        assert_eq!(enc(-(1 << 40)), [0x8a, 6, 0, 0, 0, 0, 0, 0xff]);
    }
}
