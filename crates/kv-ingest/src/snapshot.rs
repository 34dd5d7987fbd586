//! A consistent snapshot of the index, as one router replica hands it to
//! another: for every stream the pump has applied batches of, the seq it
//! reflects, how its blocks are hashed, and its holdings
//! ([`kv_index::ExportedBlock`]). Taken by the pump between two batches, so
//! each stream's blocks are exactly those of its batches up to that seq.
//! The wire form is a compact little-endian binary, decoded within limits
//! (a peer is not trusted more than a worker).
//!
//! ```text
//! "SGLRIDX1" u32:streams
//!   per stream: u16:url_len url u32:rank u64:seq u32:page_size u8:bigram u32:blocks
//!     per block: u8:flags(1 parent, 2 engine) [u32:parent] [u64:engine] u8:tiers [32]:digest
//! ```

use kv_index::ExportedBlock;
use router_types::{DpRank, WorkerKey, WorkerUrl};

const MAGIC: &[u8; 8] = b"SGLRIDX1";
/// Longest worker URL accepted in a snapshot.
const MAX_URL: usize = 2048;

/// The index as one replica saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IndexSnapshot {
    /// One entry per stream with applied batches.
    pub streams: Vec<StreamSnapshot>,
}

/// One (worker, rank) stream at a seq.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSnapshot {
    /// The stream.
    pub key: WorkerKey,
    /// The last batch applied: a replica resuming from this snapshot replays after it.
    pub seq: u64,
    /// The page size its blocks were hashed with.
    pub page_size: u32,
    /// Bigram (EAGLE) keys.
    pub bigram: bool,
    /// Its holdings.
    pub blocks: Vec<ExportedBlock>,
}

/// Bounds on a snapshot taken or accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotLimits {
    /// Most blocks in all (streams beyond are left out whole).
    pub max_blocks: usize,
    /// Most bytes of the encoded form.
    pub max_bytes: usize,
}

/// Default most blocks in a snapshot (4 M: about 200 MB encoded).
pub const DEFAULT_SNAPSHOT_MAX_BLOCKS: usize = 4 << 20;
/// Default most bytes of a snapshot.
pub const DEFAULT_SNAPSHOT_MAX_BYTES: usize = 256 << 20;
/// Bytes of one encoded block at most.
const MAX_BLOCK_BYTES: usize = 1 + 4 + 8 + 1 + 32;

/// Why a snapshot was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// Not a snapshot (another format or version).
    #[error("not an index snapshot (bad magic)")]
    Magic,
    /// Ends early, or has bytes after its end.
    #[error("snapshot truncated or with trailing bytes at offset {0}")]
    Length(usize),
    /// Over the limits.
    #[error("snapshot over its limits: {0}")]
    TooLarge(String),
    /// A field that cannot be (a bad URL, a bad block).
    #[error("snapshot stream {stream}: {why}")]
    Invalid {
        /// The stream's place in the snapshot.
        stream: usize,
        /// What is wrong.
        why: String,
    },
}

// === impl IndexSnapshot ===

impl IndexSnapshot {
    /// Blocks over all streams.
    pub fn blocks(&self) -> usize {
        self.streams.iter().map(|s| s.blocks.len()).sum()
    }

    /// The wire form.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.blocks() * MAX_BLOCK_BYTES);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(self.streams.len() as u32).to_le_bytes());
        for s in &self.streams {
            let url = s.key.worker.as_str().as_bytes();
            out.extend_from_slice(&(url.len() as u16).to_le_bytes());
            out.extend_from_slice(url);
            out.extend_from_slice(&s.key.rank.0.to_le_bytes());
            out.extend_from_slice(&s.seq.to_le_bytes());
            out.extend_from_slice(&s.page_size.to_le_bytes());
            out.push(u8::from(s.bigram));
            out.extend_from_slice(&(s.blocks.len() as u32).to_le_bytes());
            for b in &s.blocks {
                out.push(u8::from(b.parent.is_some()) | (u8::from(b.engine.is_some()) << 1));
                if let Some(p) = b.parent {
                    out.extend_from_slice(&p.to_le_bytes());
                }
                if let Some(e) = b.engine {
                    out.extend_from_slice(&e.to_le_bytes());
                }
                out.push(b.tiers);
                out.extend_from_slice(&b.digest);
            }
        }
        out
    }

    /// Reads the wire form within `limits`; every stream's blocks are checked
    /// ([`kv_index::KvIndex::check_export`]) so that an import cannot fail halfway.
    pub fn decode(bytes: &[u8], limits: &SnapshotLimits) -> Result<Self, SnapshotError> {
        if bytes.len() > limits.max_bytes {
            return Err(SnapshotError::TooLarge(format!("{} bytes, at most {}", bytes.len(), limits.max_bytes)));
        }
        let mut r = Reader { bytes, at: 0 };
        if r.take(8)? != MAGIC {
            return Err(SnapshotError::Magic);
        }
        let n = r.u32()? as usize;
        // Each stream takes at least 23 bytes: a count beyond what the bytes hold is a lie.
        if n > bytes.len() / 23 {
            return Err(SnapshotError::Length(r.at));
        }
        let mut streams = Vec::with_capacity(n);
        let mut total = 0usize;
        for i in 0..n {
            let invalid = |why: String| SnapshotError::Invalid { stream: i, why };
            let len = r.u16()? as usize;
            if len > MAX_URL {
                return Err(invalid(format!("URL of {len} bytes")));
            }
            let url = std::str::from_utf8(r.take(len)?).map_err(|_| invalid("URL is not UTF-8".into()))?;
            let worker = WorkerUrl::parse(url).map_err(|e| invalid(format!("URL {url:?}: {e}")))?;
            let rank = DpRank(r.u32()?);
            let seq = r.u64()?;
            let page_size = r.u32()?;
            if page_size == 0 {
                return Err(invalid("page size 0".into()));
            }
            let bigram = match r.u8()? {
                0 => false,
                1 => true,
                b => return Err(invalid(format!("bigram flag {b}"))),
            };
            let count = r.u32()? as usize;
            total = total.saturating_add(count);
            if total > limits.max_blocks {
                return Err(SnapshotError::TooLarge(format!("over {} blocks", limits.max_blocks)));
            }
            // Each block takes at least 34 bytes.
            if count > (bytes.len() - r.at) / 34 {
                return Err(SnapshotError::Length(r.at));
            }
            let mut blocks = Vec::with_capacity(count);
            for _ in 0..count {
                let flags = r.u8()?;
                if flags & !0b11 != 0 {
                    return Err(invalid(format!("block flags {flags:#x}")));
                }
                let parent = if flags & 1 != 0 { Some(r.u32()?) } else { None };
                let engine = if flags & 2 != 0 { Some(r.u64()?) } else { None };
                let tiers = r.u8()?;
                let digest: [u8; 32] = r.take(32)?.try_into().map_err(|_| SnapshotError::Length(r.at))?;
                blocks.push(ExportedBlock { digest, parent, engine, tiers });
            }
            kv_index::KvIndex::check_export(&blocks).map_err(|e| invalid(e.to_string()))?;
            streams.push(StreamSnapshot { key: WorkerKey::new(worker, rank), seq, page_size, bigram, blocks });
        }
        if r.at != bytes.len() {
            return Err(SnapshotError::Length(r.at));
        }
        Ok(Self { streams })
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.bytes.len()).ok_or(SnapshotError::Length(self.at))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, SnapshotError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, SnapshotError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().map_err(|_| SnapshotError::Length(self.at))?))
    }

    fn u32(&mut self) -> Result<u32, SnapshotError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().map_err(|_| SnapshotError::Length(self.at))?))
    }

    fn u64(&mut self) -> Result<u64, SnapshotError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().map_err(|_| SnapshotError::Length(self.at))?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> IndexSnapshot {
        let d = |b: u8| [b; 32];
        IndexSnapshot {
            streams: vec![
                StreamSnapshot {
                    key: WorkerKey::new(WorkerUrl::parse("http://10.0.0.1:8000").unwrap(), DpRank(0)),
                    seq: 41,
                    page_size: 16,
                    bigram: false,
                    blocks: vec![
                        ExportedBlock { digest: d(1), parent: None, engine: None, tiers: 0 },
                        ExportedBlock { digest: d(2), parent: Some(0), engine: Some(7), tiers: 0b1 },
                        ExportedBlock { digest: d(3), parent: Some(1), engine: Some(u64::MAX), tiers: 0b11 },
                    ],
                },
                StreamSnapshot {
                    key: WorkerKey::new(WorkerUrl::parse("http://10.0.0.2:8000").unwrap(), DpRank(3)),
                    seq: 0,
                    page_size: 64,
                    bigram: true,
                    blocks: vec![],
                },
            ],
        }
    }

    const LIMITS: SnapshotLimits = SnapshotLimits { max_blocks: 100, max_bytes: 1 << 20 };

    #[test]
    fn round_trip() {
        let s = sample();
        assert_eq!(IndexSnapshot::decode(&s.encode(), &LIMITS).unwrap(), s);
    }

    #[test]
    fn every_truncation_and_corruption_is_refused_never_a_panic() {
        let bytes = sample().encode();
        for cut in 0..bytes.len() {
            assert!(IndexSnapshot::decode(&bytes[..cut], &LIMITS).is_err(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(IndexSnapshot::decode(&longer, &LIMITS), Err(SnapshotError::Length(bytes.len())));
        for i in 0..bytes.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[i] ^= flip;
                let _ = IndexSnapshot::decode(&b, &LIMITS); // any answer but a panic
            }
        }
        let mut bad = bytes.clone();
        bad[0] = b'X';
        assert_eq!(IndexSnapshot::decode(&bad, &LIMITS), Err(SnapshotError::Magic));
    }

    #[test]
    fn limits_hold() {
        let bytes = sample().encode();
        let few = SnapshotLimits { max_blocks: 2, ..LIMITS };
        assert!(matches!(IndexSnapshot::decode(&bytes, &few), Err(SnapshotError::TooLarge(_))));
        let small = SnapshotLimits { max_bytes: bytes.len() - 1, ..LIMITS };
        assert!(matches!(IndexSnapshot::decode(&bytes, &small), Err(SnapshotError::TooLarge(_))));
        // A block count the bytes cannot hold is refused before anything is allocated for it.
        let mut lie = bytes.clone();
        let at = 8 + 4 + 2 + "http://10.0.0.1:8000".len() + 4 + 8 + 4 + 1;
        lie[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let huge = SnapshotLimits { max_blocks: usize::MAX, ..LIMITS };
        assert!(matches!(IndexSnapshot::decode(&lie, &huge), Err(SnapshotError::Length(_))));
    }

    #[test]
    fn a_dangling_ancestor_is_refused() {
        let mut s = sample();
        s.streams[0].blocks.truncate(1);
        assert!(matches!(IndexSnapshot::decode(&s.encode(), &LIMITS), Err(SnapshotError::Invalid { stream: 0, .. })));
    }
}
