//! Identifier and value newtypes: workers, data-parallel ranks, block hashes,
//! token counts, storage tiers and cache namespaces.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The base URL of one engine replica, normalized without a trailing slash.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WorkerUrl(String);

/// A data-parallel rank inside one engine replica (SGLang `dp_size`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DpRank(pub u32);

/// One event stream: a worker and one of its data-parallel ranks.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WorkerKey {
    /// The replica.
    pub worker: WorkerUrl,
    /// The rank inside it.
    pub rank: DpRank,
}

/// The router's hash of one KV block: the SGLang page-hash chain value
/// (first eight digest bytes, big-endian, signed), namespaced when the
/// block belongs to a LoRA adapter or a salted cache.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BlockHash(pub i64);

/// A full SHA-256 page digest: the state of the page-hash chain after a
/// block, from which the next block's hash continues.
pub type PageDigest = [u8; 32];

/// A number of tokens (prompt length, matched prefix, uncached work).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TokenCount(pub u64);

/// Where an engine holds a block. Ordered from fastest to slowest.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// GPU memory (the engines' `"GPU"` medium, also the default when absent).
    #[default]
    Device,
    /// Host memory (`"CPU"`, `"CPU_PINNED"`).
    Host,
    /// Local disk (`"DISK"`, `"STORAGE"`).
    Disk,
    /// A shared or remote pool (`"EXTERNAL"`).
    External,
}

/// What keeps identical token chains apart in the cache: the LoRA adapter
/// and the request's `cache_salt`. The default (both absent) is the shared
/// base-model namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Namespace {
    /// Public LoRA adapter name, as requests and `BlockStored.lora_name` carry it.
    pub lora_name: Option<String>,
    /// Per-tenant cache salt (`cache_salt` in the request and the event).
    pub cache_salt: Option<String>,
}

// === impl WorkerUrl ===

impl WorkerUrl {
    /// Wraps a URL, dropping trailing slashes so `http://a:1/` and `http://a:1` are one worker.
    pub fn new(url: impl Into<String>) -> Self {
        let mut url = url.into();
        while url.ends_with('/') {
            url.pop();
        }
        Self(url)
    }

    /// The URL as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WorkerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for WorkerUrl {
    fn from(url: &str) -> Self {
        Self::new(url)
    }
}

// === impl DpRank ===

impl fmt::Display for DpRank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

// === impl WorkerKey ===

impl WorkerKey {
    /// The stream of `rank` on `worker`.
    pub fn new(worker: WorkerUrl, rank: DpRank) -> Self {
        Self { worker, rank }
    }
}

impl fmt::Display for WorkerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.worker, self.rank)
    }
}

// === impl BlockHash ===

impl BlockHash {
    /// The value from the first eight bytes of a SHA-256 digest, big-endian, as SGLang publishes it.
    pub fn from_digest(digest: &[u8; 32]) -> Self {
        let mut head = [0u8; 8];
        head.copy_from_slice(&digest[..8]);
        Self(i64::from_be_bytes(head))
    }
}

impl fmt::Display for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

// === impl TokenCount ===

impl fmt::Display for TokenCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

// === impl Tier ===

impl Tier {
    /// All tiers, fastest first.
    pub const ALL: [Tier; 4] = [Tier::Device, Tier::Host, Tier::Disk, Tier::External];

    /// Maps an engine's `medium` string; `None` (absent) is the device.
    /// Unknown media return `None` so the caller can count and skip them.
    pub fn from_medium(medium: Option<&str>) -> Option<Self> {
        match medium {
            None => Some(Tier::Device),
            Some(m) => match m.to_ascii_uppercase().as_str() {
                "GPU" | "DEVICE" | "HBM" => Some(Tier::Device),
                "CPU" | "CPU_PINNED" | "HOST" => Some(Tier::Host),
                "DISK" | "STORAGE" | "SSD" => Some(Tier::Disk),
                "EXTERNAL" | "REMOTE" => Some(Tier::External),
                _ => None,
            },
        }
    }

    /// A stable lower-case label, used in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Device => "device",
            Tier::Host => "host",
            Tier::Disk => "disk",
            Tier::External => "external",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// === impl Namespace ===

impl Namespace {
    /// True for the shared base-model namespace.
    pub fn is_default(&self) -> bool {
        self.lora_name.is_none() && self.cache_salt.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_url_drops_trailing_slashes() {
        assert_eq!(WorkerUrl::new("http://a:1//").as_str(), "http://a:1");
        assert_eq!(WorkerUrl::from("http://a:1"), WorkerUrl::new("http://a:1/"));
    }

    #[test]
    fn block_hash_takes_the_first_eight_bytes_big_endian() {
        let mut digest = [0u8; 32];
        digest[0] = 0xff;
        digest[7] = 0x01;
        digest[8] = 0xaa; // ignored
        assert_eq!(BlockHash::from_digest(&digest).0, i64::from_be_bytes([0xff, 0, 0, 0, 0, 0, 0, 1]));
    }

    #[test]
    fn media_map_to_tiers() {
        assert_eq!(Tier::from_medium(None), Some(Tier::Device));
        assert_eq!(Tier::from_medium(Some("GPU")), Some(Tier::Device));
        assert_eq!(Tier::from_medium(Some("CPU_PINNED")), Some(Tier::Host));
        assert_eq!(Tier::from_medium(Some("cpu")), Some(Tier::Host));
        assert_eq!(Tier::from_medium(Some("STORAGE")), Some(Tier::Disk));
        assert_eq!(Tier::from_medium(Some("EXTERNAL")), Some(Tier::External));
        assert_eq!(Tier::from_medium(Some("TAPE")), None);
    }

    #[test]
    fn newtypes_serialize_transparently() {
        let key = WorkerKey::new(WorkerUrl::new("http://w:1"), DpRank(2));
        let json = serde_json::to_string(&key).unwrap();
        assert_eq!(json, r#"{"worker":"http://w:1","rank":2}"#);
        assert_eq!(key.to_string(), "http://w:1#2");
        assert_eq!(serde_json::to_string(&Tier::Host).unwrap(), r#""host""#);
    }
}
