//! vLLM's per-block extra keys, whichever wire they came over: owns the canonical form of the
//! keys the router cannot compute from a request (`StoredBlocks::opaque_keys`: multimodal items,
//! prompt-embedding digests), its writer ([`OpaqueKeys`]) and reader ([`opaque_keys`]), and where
//! the cache salt is among the keys ([`vllm_salt`]).
//!
//! ```text
//! canonical block keys = key*
//! key   = 0x01 u8:n part{n}          a tuple: a multimodal (identifier, offset) pair
//!       | 0x02 u64le:len bytes       bytes: a prompt-embeddings digest
//!       | 0x03 u64le:8 u64le         a bare non-negative integer (no shape vLLM sends today)
//!       | 0x04 u64le:8 i64le         a bare negative integer (idem)
//! part  = type u64le:len bytes       type 's' UTF-8, 'b' bytes, 'u' u64le, 'i' i64le
//! ```

/// One key of a block's canonical form, read back ([`opaque_keys`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpaqueKey<'a> {
    /// A tuple (vLLM: a multimodal item's `(identifier, offset)`).
    Tuple(Vec<Part<'a>>),
    /// Bytes (vLLM: a prompt-embeddings digest).
    Bytes(&'a [u8]),
    /// A bare integer.
    Int(i128),
}

/// One part of an [`OpaqueKey::Tuple`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part<'a> {
    /// A string.
    Str(&'a str),
    /// Bytes.
    Bytes(&'a [u8]),
    /// An integer.
    Int(i128),
}

// === impl OpaqueKey ===

impl<'a> OpaqueKey<'a> {
    /// A multimodal item's `(identifier, offset from the block's start)`, if this is one.
    pub fn multimodal(&self) -> Option<(&'a str, i64)> {
        match self {
            OpaqueKey::Tuple(parts) => match parts[..] {
                [Part::Str(identifier), Part::Int(offset)] => Some((identifier, i64::try_from(offset).ok()?)),
                _ => None,
            },
            _ => None,
        }
    }
}

/// vLLM's cache salt among a chain's first block's text keys (`first_block_texts`, in order):
/// vLLM has no salt field; `generate_block_hash_extra_keys` orders a block's keys LoRA,
/// multimodal, salt, prompt embeddings and keys the salt on a request's first block only, and
/// the events publish the LoRA name and the salt as bare text. So the salt is the first text
/// after the LoRA name (`lora`: the blocks have one).
pub fn vllm_salt(first_block_texts: &[String], lora: bool) -> Option<String> {
    first_block_texts.get(usize::from(lora)).cloned()
}

/// Writes one block's keys in the canonical form.
#[derive(Debug, Default)]
pub struct OpaqueKeys(Vec<u8>);

impl OpaqueKeys {
    /// A tuple of `parts`; at most 255 (vLLM's pairs have two).
    pub fn tuple(&mut self, parts: &[Part<'_>]) {
        self.0.push(0x01);
        self.0.push(parts.len().min(255) as u8);
        for part in parts.iter().take(255) {
            let (kind, bytes): (u8, &[u8]) = match part {
                Part::Str(s) => (b's', s.as_bytes()),
                Part::Bytes(b) => (b'b', b),
                Part::Int(v) => match (u64::try_from(*v), i64::try_from(*v)) {
                    (Ok(u), _) => (b'u', &u.to_le_bytes()),
                    (_, Ok(i)) => (b'i', &i.to_le_bytes()),
                    // Beyond 64 bits: no wire carries it.
                    _ => (b'b', &v.to_le_bytes()),
                },
            };
            self.0.push(kind);
            self.part(bytes);
        }
    }

    /// Bytes (a digest).
    pub fn bytes(&mut self, b: &[u8]) {
        self.0.push(0x02);
        self.part(b);
    }

    /// A bare integer.
    pub fn int(&mut self, v: i64) {
        match u64::try_from(v) {
            Ok(u) => self.uint(u),
            Err(_) => {
                self.0.push(0x04);
                self.part(&v.to_le_bytes());
            }
        }
    }

    /// A bare non-negative integer.
    pub fn uint(&mut self, v: u64) {
        self.0.push(0x03);
        self.part(&v.to_le_bytes());
    }

    /// The block's canonical keys; `None` when it has none.
    pub fn finish(self) -> Option<Box<[u8]>> {
        (!self.0.is_empty()).then(|| self.0.into_boxed_slice())
    }

    /// `u64le(len) ‖ bytes`.
    fn part(&mut self, part: &[u8]) {
        self.0.extend_from_slice(&(part.len() as u64).to_le_bytes());
        self.0.extend_from_slice(part);
    }
}

/// The keys of a block's canonical form, in order; `None` if the bytes are not that form.
pub fn opaque_keys(canonical: &[u8]) -> Option<Vec<OpaqueKey<'_>>> {
    let mut r = canonical;
    let mut keys = Vec::new();
    while let Some((&tag, rest)) = r.split_first() {
        r = rest;
        keys.push(match tag {
            0x01 => {
                let (&n, rest) = r.split_first()?;
                r = rest;
                let parts = (0..n)
                    .map(|_| {
                        let (&kind, rest) = r.split_first()?;
                        let (bytes, rest) = take_part(rest)?;
                        r = rest;
                        Some(match kind {
                            b's' => Part::Str(std::str::from_utf8(bytes).ok()?),
                            b'b' => Part::Bytes(bytes),
                            b'u' | b'i' => Part::Int(int_of(kind == b'u', bytes)?),
                            _ => return None,
                        })
                    })
                    .collect::<Option<Vec<_>>>()?;
                OpaqueKey::Tuple(parts)
            }
            0x02 => {
                let (bytes, rest) = take_part(r)?;
                r = rest;
                OpaqueKey::Bytes(bytes)
            }
            0x03 | 0x04 => {
                let (bytes, rest) = take_part(r)?;
                r = rest;
                OpaqueKey::Int(int_of(tag == 0x03, bytes)?)
            }
            _ => return None,
        });
    }
    Some(keys)
}

/// An 8-byte little-endian integer, unsigned or signed.
fn int_of(unsigned: bool, bytes: &[u8]) -> Option<i128> {
    let raw: [u8; 8] = bytes.try_into().ok()?;
    Some(if unsigned { i128::from(u64::from_le_bytes(raw)) } else { i128::from(i64::from_le_bytes(raw)) })
}

fn take_part(r: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = usize::try_from(u64::from_le_bytes(r.get(..8)?.try_into().ok()?)).ok()?;
    let end = 8usize.checked_add(len)?;
    Some((r.get(8..end)?, r.get(end..)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_read_back_with_their_types() {
        let mut k = OpaqueKeys::default();
        k.tuple(&[Part::Str("mm-abc"), Part::Int(3)]);
        k.bytes(&[9; 32]);
        k.tuple(&[Part::Str("x"), Part::Int(-2), Part::Bytes(&[1])]);
        k.int(-5);
        k.uint(7);
        let canonical = k.finish().unwrap();
        assert_eq!(
            opaque_keys(&canonical).unwrap(),
            [
                OpaqueKey::Tuple(vec![Part::Str("mm-abc"), Part::Int(3)]),
                OpaqueKey::Bytes(&[9; 32]),
                OpaqueKey::Tuple(vec![Part::Str("x"), Part::Int(-2), Part::Bytes(&[1])]),
                OpaqueKey::Int(-5),
                OpaqueKey::Int(7),
            ]
        );
        assert_eq!(OpaqueKeys::default().finish(), None);
        let keys = opaque_keys(&canonical).unwrap();
        assert_eq!(
            keys.iter().map(OpaqueKey::multimodal).collect::<Vec<_>>(),
            [Some(("mm-abc", 3)), None, None, None, None]
        );
        for bad in [&[0x01, 1, b'q', 0, 0, 0, 0, 0, 0, 0, 0][..], &[0x02, 9], &[0x05]] {
            assert_eq!(opaque_keys(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_salt_is_the_first_blocks_text_after_the_lora_name() {
        let texts = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(vllm_salt(&texts(&["tenant"]), false).as_deref(), Some("tenant"));
        assert_eq!(vllm_salt(&texts(&["sql", "tenant"]), true).as_deref(), Some("tenant"));
        assert_eq!(vllm_salt(&texts(&["sql"]), true), None);
        assert_eq!(vllm_salt(&[], false), None);
    }
}
