//! A consistent snapshot of the index, as one router replica hands it to
//! another: for every stream the pump has applied batches of, the seq it
//! reflects, how its blocks are hashed, and its holdings
//! ([`kv_index::ExportedBlock`]), with a hybrid model's other KV-cache groups
//! (each its own holdings and kind). Taken by the pump between two batches, so
//! each stream's blocks are exactly those of its batches up to that seq.
//! The wire form is a compact little-endian binary, decoded within limits
//! (a peer is not trusted more than a worker); the earlier versions (no groups,
//! `SGLRIDX1`; no lookahead, `SGLRIDX2`) are still read.
//!
//! ```text
//! "SGLRIDX3" u32:streams
//!   per stream: u16:url_len url u32:rank u64:seq u32:page_size u8:bigram u8:lookahead kind list
//!               u8:groups, per group: u32:group_idx kind list
//!   kind: u8 (0 unknown, 1 full, 2 sliding window, 3 state) u32:window_blocks
//!   list: u32:blocks, per block: u8:flags(1 parent, 2 engine) [u32:parent] [u64:engine] u8:tiers [32]:digest
//! ```

use kv_index::{ExportedBlock, GroupBlocks, MAX_GROUPS};
use router_types::{DpRank, WorkerKey, WorkerUrl};

const MAGIC: &[u8; 8] = b"SGLRIDX3";
/// The second version: no lookahead.
const MAGIC_V2: &[u8; 8] = b"SGLRIDX2";
/// The first version: no kinds, no groups.
const MAGIC_V1: &[u8; 8] = b"SGLRIDX1";
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
    /// The lookahead its engine hashes blocks with (vLLM's `lookahead_token_ids`; 0: none).
    pub lookahead: u8,
    /// The kind of its KV-cache group 0, when its engine said (`None`: full attention).
    pub kind: Option<GroupBlocks>,
    /// Its holdings (group 0's).
    pub blocks: Vec<ExportedBlock>,
    /// A hybrid model's other KV-cache groups.
    pub groups: Vec<GroupSnapshot>,
}

/// One KV-cache group of a stream beside group 0: its own holdings and kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSnapshot {
    /// The engine's group index (never 0).
    pub idx: u32,
    /// Its kind, when its engine said.
    pub kind: Option<GroupBlocks>,
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
    /// Blocks over all streams and their groups.
    pub fn blocks(&self) -> usize {
        self.streams.iter().map(|s| s.blocks.len() + s.groups.iter().map(|g| g.blocks.len()).sum::<usize>()).sum()
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
            out.push(s.lookahead);
            put_kind(&mut out, s.kind);
            put_blocks(&mut out, &s.blocks);
            out.push(s.groups.len() as u8);
            for g in &s.groups {
                out.extend_from_slice(&g.idx.to_le_bytes());
                put_kind(&mut out, g.kind);
                put_blocks(&mut out, &g.blocks);
            }
        }
        out
    }

    /// Reads the wire form within `limits`; every list of blocks is checked
    /// ([`kv_index::KvIndex::check_export`]) so that an import cannot fail halfway.
    pub fn decode(bytes: &[u8], limits: &SnapshotLimits) -> Result<Self, SnapshotError> {
        if bytes.len() > limits.max_bytes {
            return Err(SnapshotError::TooLarge(format!("{} bytes, at most {}", bytes.len(), limits.max_bytes)));
        }
        let mut r = Reader { bytes, at: 0 };
        let version = match r.take(8)? {
            m if m == MAGIC => 3,
            m if m == MAGIC_V2 => 2,
            m if m == MAGIC_V1 => 1,
            _ => return Err(SnapshotError::Magic),
        };
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
            let lookahead = if version >= 3 { r.u8()? } else { 0 };
            if usize::from(lookahead) > router_types::MAX_LOOKAHEAD_TOKENS {
                return Err(invalid(format!("lookahead of {lookahead} tokens")));
            }
            let kind = if version >= 2 { r.kind().map_err(|e| e.of(i))? } else { None };
            let blocks = r.blocks(&mut total, limits).map_err(|e| e.of(i))?;
            let mut groups: Vec<GroupSnapshot> = Vec::new();
            if version >= 2 {
                let count = r.u8()? as usize;
                if count >= MAX_GROUPS {
                    return Err(invalid(format!(
                        "{count} KV-cache groups besides group 0, at most {}",
                        MAX_GROUPS - 1
                    )));
                }
                for _ in 0..count {
                    let idx = r.u32()?;
                    if idx == 0 || groups.iter().any(|g| g.idx == idx) {
                        return Err(invalid(format!("KV-cache group {idx} given twice (group 0 is the stream's own)")));
                    }
                    let kind = r.kind().map_err(|e| e.of(i))?;
                    let blocks = r.blocks(&mut total, limits).map_err(|e| e.of(i))?;
                    groups.push(GroupSnapshot { idx, kind, blocks });
                }
            }
            let key = WorkerKey::new(worker, rank);
            streams.push(StreamSnapshot { key, seq, page_size, bigram, lookahead, kind, blocks, groups });
        }
        if r.at != bytes.len() {
            return Err(SnapshotError::Length(r.at));
        }
        Ok(Self { streams })
    }
}

/// A group's kind on the wire.
fn put_kind(out: &mut Vec<u8>, kind: Option<GroupBlocks>) {
    let (tag, blocks) = match kind {
        None => (0u8, 0u32),
        Some(GroupBlocks::Full) => (1, 0),
        Some(GroupBlocks::Window { blocks }) => (2, blocks),
        Some(GroupBlocks::State) => (3, 0),
    };
    out.push(tag);
    out.extend_from_slice(&blocks.to_le_bytes());
}

/// A list of blocks on the wire.
fn put_blocks(out: &mut Vec<u8>, blocks: &[ExportedBlock]) {
    out.extend_from_slice(&(blocks.len() as u32).to_le_bytes());
    for b in blocks {
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

/// What is wrong with a stream's part of the bytes, before its place is known.
enum Bad {
    Snapshot(SnapshotError),
    Invalid(String),
}

impl From<SnapshotError> for Bad {
    fn from(e: SnapshotError) -> Self {
        Bad::Snapshot(e)
    }
}

impl Bad {
    /// As the error of stream `i`.
    fn of(self, i: usize) -> SnapshotError {
        match self {
            Bad::Snapshot(e) => e,
            Bad::Invalid(why) => SnapshotError::Invalid { stream: i, why },
        }
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

    fn kind(&mut self) -> Result<Option<GroupBlocks>, Bad> {
        let (tag, blocks) = (self.u8()?, self.u32()?);
        match tag {
            0 => Ok(None),
            1 => Ok(Some(GroupBlocks::Full)),
            2 if blocks > 0 => Ok(Some(GroupBlocks::Window { blocks })),
            3 => Ok(Some(GroupBlocks::State)),
            _ => Err(Bad::Invalid(format!("KV-cache group kind {tag} ({blocks} blocks)"))),
        }
    }

    /// A list of blocks, `total` (over the snapshot) kept within `limits`, checked whole.
    fn blocks(&mut self, total: &mut usize, limits: &SnapshotLimits) -> Result<Vec<ExportedBlock>, Bad> {
        let count = self.u32()? as usize;
        *total = total.saturating_add(count);
        if *total > limits.max_blocks {
            return Err(SnapshotError::TooLarge(format!("over {} blocks", limits.max_blocks)).into());
        }
        // Each block takes at least 34 bytes.
        if count > (self.bytes.len() - self.at) / 34 {
            return Err(SnapshotError::Length(self.at).into());
        }
        let mut blocks = Vec::with_capacity(count);
        for _ in 0..count {
            let flags = self.u8()?;
            if flags & !0b11 != 0 {
                return Err(Bad::Invalid(format!("block flags {flags:#x}")));
            }
            let parent = if flags & 1 != 0 { Some(self.u32()?) } else { None };
            let engine = if flags & 2 != 0 { Some(self.u64()?) } else { None };
            let tiers = self.u8()?;
            let digest: [u8; 32] = self.take(32)?.try_into().map_err(|_| SnapshotError::Length(self.at))?;
            blocks.push(ExportedBlock { digest, parent, engine, tiers });
        }
        kv_index::KvIndex::check_export(&blocks).map_err(|e| Bad::Invalid(e.to_string()))?;
        Ok(blocks)
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
                    lookahead: 3,
                    kind: None,
                    blocks: vec![
                        ExportedBlock { digest: d(1), parent: None, engine: None, tiers: 0 },
                        ExportedBlock { digest: d(2), parent: Some(0), engine: Some(7), tiers: 0b1 },
                        ExportedBlock { digest: d(3), parent: Some(1), engine: Some(u64::MAX), tiers: 0b11 },
                    ],
                    groups: vec![],
                },
                StreamSnapshot {
                    key: WorkerKey::new(WorkerUrl::parse("http://10.0.0.2:8000").unwrap(), DpRank(3)),
                    seq: 0,
                    page_size: 64,
                    bigram: true,
                    lookahead: 0,
                    kind: Some(GroupBlocks::Full),
                    blocks: vec![],
                    // A hybrid model: a sliding window of 8 blocks and a state group beside group 0.
                    groups: vec![
                        GroupSnapshot {
                            idx: 1,
                            kind: Some(GroupBlocks::Window { blocks: 8 }),
                            blocks: vec![ExportedBlock { digest: d(4), parent: None, engine: Some(9), tiers: 0b1 }],
                        },
                        GroupSnapshot { idx: 2, kind: Some(GroupBlocks::State), blocks: vec![] },
                    ],
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
        let at = 8 + 4 + 2 + "http://10.0.0.1:8000".len() + 4 + 8 + 4 + 1 + 1 + 5;
        lie[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let huge = SnapshotLimits { max_blocks: usize::MAX, ..LIMITS };
        assert!(matches!(IndexSnapshot::decode(&lie, &huge), Err(SnapshotError::Length(_))));
    }

    /// `s` in an earlier version's form: the first (no kinds, no groups) or the second (no
    /// lookahead).
    fn older(s: &IndexSnapshot, version: u8) -> Vec<u8> {
        let mut out = if version == 1 { b"SGLRIDX1".to_vec() } else { b"SGLRIDX2".to_vec() };
        out.extend_from_slice(&(s.streams.len() as u32).to_le_bytes());
        for st in &s.streams {
            let url = st.key.worker.as_str().as_bytes();
            out.extend_from_slice(&(url.len() as u16).to_le_bytes());
            out.extend_from_slice(url);
            out.extend_from_slice(&st.key.rank.0.to_le_bytes());
            out.extend_from_slice(&st.seq.to_le_bytes());
            out.extend_from_slice(&st.page_size.to_le_bytes());
            out.push(u8::from(st.bigram));
            if version >= 2 {
                put_kind(&mut out, st.kind);
            }
            put_blocks(&mut out, &st.blocks);
            if version >= 2 {
                out.push(st.groups.len() as u8);
                for g in &st.groups {
                    out.extend_from_slice(&g.idx.to_le_bytes());
                    put_kind(&mut out, g.kind);
                    put_blocks(&mut out, &g.blocks);
                }
            }
        }
        out
    }

    /// A replica of the version before KV-cache groups: its snapshot is still read.
    #[test]
    fn the_first_version_is_read() {
        let mut s = sample();
        s.streams[1].groups.clear();
        s.streams[1].kind = None;
        s.streams[0].lookahead = 0;
        assert_eq!(IndexSnapshot::decode(&older(&s, 1), &LIMITS).unwrap(), s);
    }

    /// A replica of the version before lookahead hashing: its snapshot is still read (no
    /// lookahead), and a lookahead no engine could have is refused.
    #[test]
    fn the_second_version_is_read_and_the_lookahead_bounded() {
        let mut s = sample();
        s.streams[0].lookahead = 0;
        assert_eq!(IndexSnapshot::decode(&older(&s, 2), &LIMITS).unwrap(), s);
        let mut long = sample();
        long.streams[1].lookahead = router_types::MAX_LOOKAHEAD_TOKENS as u8 + 1;
        assert!(matches!(
            IndexSnapshot::decode(&long.encode(), &LIMITS),
            Err(SnapshotError::Invalid { stream: 1, .. })
        ));
    }

    #[test]
    fn groups_are_bounded_and_named_once() {
        let mut s = sample();
        s.streams[1].groups[1].idx = 1;
        assert!(matches!(IndexSnapshot::decode(&s.encode(), &LIMITS), Err(SnapshotError::Invalid { stream: 1, .. })));
        s.streams[1].groups[1].idx = 0;
        assert!(matches!(IndexSnapshot::decode(&s.encode(), &LIMITS), Err(SnapshotError::Invalid { stream: 1, .. })));
        let mut many = sample();
        many.streams[1].groups =
            (1..=MAX_GROUPS as u32).map(|idx| GroupSnapshot { idx, kind: None, blocks: vec![] }).collect();
        assert!(matches!(
            IndexSnapshot::decode(&many.encode(), &LIMITS),
            Err(SnapshotError::Invalid { stream: 1, .. })
        ));
        // The groups' blocks count against the bound too.
        let few = SnapshotLimits { max_blocks: 3, ..LIMITS };
        assert!(matches!(IndexSnapshot::decode(&sample().encode(), &few), Err(SnapshotError::TooLarge(_))));
    }

    #[test]
    fn a_dangling_ancestor_is_refused() {
        let mut s = sample();
        s.streams[0].blocks.truncate(1);
        assert!(matches!(IndexSnapshot::decode(&s.encode(), &LIMITS), Err(SnapshotError::Invalid { stream: 0, .. })));
    }
}
