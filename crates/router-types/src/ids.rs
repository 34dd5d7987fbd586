//! Identifier and value newtypes: workers, data-parallel ranks, block hashes,
//! token counts, storage tiers and cache namespaces.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The base URL of one engine replica, normalized without a trailing slash.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WorkerUrl(String);

/// A worker's identity for its whole life in the fleet: assigned once when it
/// is added, never reused (a worker removed and added again gets a new one),
/// so a policy's memory of a worker can never be handed to another.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WorkerId(pub u32);

/// What a worker does in the fleet.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "role")]
pub enum Role {
    /// Prefill and decode on one engine.
    #[default]
    Regular,
    /// Prefill only (disaggregated), with the port its KV transfer bootstraps from.
    Prefill {
        /// Where decode workers meet it (SGLang `disaggregation_bootstrap_port`).
        bootstrap: Bootstrap,
    },
    /// Decode only (disaggregated).
    Decode,
}

/// The bootstrap port of a prefill worker, as configured
/// (`--prefill URL [BOOTSTRAP_PORT|none]`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bootstrap {
    /// Not given: the port the worker advertises in `/server_info`
    /// (`disaggregation_bootstrap_port`), else none.
    #[default]
    Discover,
    /// `none`: no port is sent (JSON null); each engine uses its own configured one.
    Null,
    /// This port.
    Port(u16),
}

/// The model pool a worker belongs to: the model name it serves to clients.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PoolId(pub String);

/// Where a worker is in its warm-up: cache-aware routing would starve a new
/// or emptied worker (every hit is elsewhere), so `cache_aware` gives it a
/// slice of the misses (young or thin) and diverts a share of the hits to it
/// (thin). The fleet decides the phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Warmup {
    /// Routed by its cache and load alone.
    #[default]
    Warm,
    /// Routable for less than the warm-up period and not yet grown by its blocks.
    Young,
    /// Its KV cache holds much less than the fleet's median (or nothing).
    Thin,
}

impl Warmup {
    /// Its label in `/workers` (`None` when warm).
    pub fn as_str(self) -> Option<&'static str> {
        match self {
            Warmup::Warm => None,
            Warmup::Young => Some("young"),
            Warmup::Thin => Some("thin"),
        }
    }
}

/// Router-side load of one worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Load {
    /// Requests this router sent that have not finished.
    pub in_flight: u32,
    /// Prompt tokens of those requests the worker did not have cached (prefill still owed).
    pub uncached_tokens: u64,
}

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

    /// Validates and normalizes a worker's base URL given by an operator or a
    /// client of the admin API: `http[s]://HOST[:PORT][/PATH]` with a DNS name,
    /// an IPv4 address or a bracketed IPv6 address, a port in 1..=65535, and
    /// nothing else: no credentials (they would be shown in `/workers` and
    /// `/metrics`), query, fragment, dot segments or percent-escapes in the path.
    /// The result is one spelling per engine: scheme and host in lower case,
    /// addresses in their canonical form, the default port 80 and trailing
    /// slashes dropped (443 for `https`), so aliases of one engine are one worker.
    pub fn parse(url: &str) -> Result<Self, UrlError> {
        let err = |why: &'static str| Err(UrlError { url: url.chars().take(200).collect(), why });
        if url.len() > 2048 {
            return err("longer than 2048 bytes");
        }
        let Some((scheme, rest)) = url.split_once("://") else { return err("not an http://, https:// or grpc:// URL") };
        let https = scheme.eq_ignore_ascii_case("https");
        // A gRPC worker (SGLang's scheduler service, `--smg-grpc-mode`): host and port only.
        let grpc = scheme.eq_ignore_ascii_case("grpc");
        if !https && !grpc && !scheme.eq_ignore_ascii_case("http") {
            return err("not an http://, https:// or grpc:// URL");
        }
        if rest.contains(['#', '?']) {
            return err("a worker URL has no query or fragment");
        }
        let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
        if authority.contains('@') {
            return err("credentials in a worker URL would be shown in /workers and /metrics: use --api-key");
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let Some((addr, after)) = v6.split_once(']') else { return err("unclosed [ in the host") };
            let Ok(ip) = addr.parse::<std::net::Ipv6Addr>() else { return err("invalid IPv6 address") };
            (format!("[{ip}]"), after)
        } else {
            let (host, after) = authority.find(':').map_or((authority, ""), |i| authority.split_at(i));
            let host = host.to_ascii_lowercase();
            if host.is_empty() {
                return err("no host");
            }
            let numeric = host.bytes().all(|b| b.is_ascii_digit() || b == b'.');
            if numeric {
                let Ok(ip) = host.parse::<std::net::Ipv4Addr>() else { return err("invalid IPv4 address") };
                (ip.to_string(), after)
            } else {
                let label_ok = |l: &str| {
                    !l.is_empty()
                        && l.len() <= 63
                        && !l.starts_with('-')
                        && !l.ends_with('-')
                        && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                };
                let trimmed = host.strip_suffix('.').unwrap_or(&host);
                if host.len() > 253 || !trimmed.split('.').all(label_ok) {
                    return err("invalid host name");
                }
                (trimmed.to_owned(), after)
            }
        };
        let port = match port {
            "" => None,
            p => {
                let digits = &p[1..];
                if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return err("invalid port");
                }
                match digits.parse::<u32>() {
                    Ok(n) if (1..=65535).contains(&n) => Some(n),
                    _ => return err("port outside 1..=65535"),
                }
            }
        };
        let path = path.trim_end_matches('/');
        if grpc {
            return match (port, path.is_empty()) {
                (Some(p), true) => Ok(Self(format!("grpc://{host}:{p}"))),
                (None, _) => err("a grpc:// worker URL needs its port"),
                (_, false) => err("a grpc:// worker URL has no path"),
            };
        }
        for segment in path.split('/').skip(1) {
            if segment.is_empty() || segment == "." || segment == ".." {
                return err("empty or dot segments in the path");
            }
            if !segment.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b)) {
                return err("the path may hold letters, digits and -._~ only");
            }
        }
        let (scheme, default_port) = if https { ("https", 443) } else { ("http", 80) };
        let port = match port {
            None => String::new(),
            Some(p) if p == default_port => String::new(),
            Some(p) => format!(":{p}"),
        };
        Ok(Self(format!("{scheme}://{host}{port}{path}")))
    }
}

/// A worker URL that [`WorkerUrl::parse`] refused, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UrlError {
    /// The refused URL (at most 200 characters of it).
    pub url: String,
    /// Why, in a few words.
    pub why: &'static str,
}

impl fmt::Display for UrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.url, self.why)
    }
}

impl std::error::Error for UrlError {}

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

// === impl WorkerId ===

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "w{}", self.0)
    }
}

// === impl Role ===

impl Role {
    /// A prefill worker whose bootstrap port is read from its `/server_info`.
    pub const PREFILL: Role = Role::Prefill { bootstrap: Bootstrap::Discover };

    /// Whether it serves one leg of a disaggregated request.
    pub fn is_pd(self) -> bool {
        !matches!(self, Role::Regular)
    }

    /// A stable label (metrics, `/workers`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Regular => "regular",
            Role::Prefill { .. } => "prefill",
            Role::Decode => "decode",
        }
    }
}

// === impl PoolId ===

impl PoolId {
    /// The pool of a router serving one model (no routing configuration).
    pub fn default_pool() -> Self {
        Self("default".into())
    }
}

impl fmt::Display for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
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
    fn worker_urls_are_validated_and_spelled_once() {
        let ok = |u: &str| WorkerUrl::parse(u).unwrap_or_else(|e| panic!("{e}")).0;
        assert_eq!(ok("http://w0:30000"), "http://w0:30000");
        assert_eq!(ok("HTTP://W0.Example.COM:30000/"), "http://w0.example.com:30000");
        assert_eq!(ok("http://10.0.0.1:80//"), "http://10.0.0.1");
        assert_eq!(ok("http://[0:0::1]:8000"), "http://[::1]:8000");
        assert_eq!(ok("http://gw:1/sglang-0/"), "http://gw:1/sglang-0");
        // One engine, one worker: these spell the same one.
        assert_eq!(ok("http://Host:80/"), ok("http://host"));
        for bad in [
            "http://:80",
            "http://h:99999",
            "http://h:0",
            "http://h:+80",
            "http://h:",
            "http://h:8000#frag",
            "http://h:8000?x=1",
            "http://user:pass@h:8000",
            "http://h:8000/../..",
            "http://h:8000/a/./b",
            "http://h:8000/%2e%2e",
            "http://h_/:1",
            "http://-h:1",
            "http://1.2.3:1",
            "http://[::1:1",
            "ftp://h",
            "h:8000",
            "",
        ] {
            assert!(WorkerUrl::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(WorkerUrl::parse("http://u@h").unwrap_err().to_string().contains("credentials"));
        assert_eq!(WorkerUrl::parse("HTTPS://H:443/").unwrap().as_str(), "https://h");
        assert_eq!(WorkerUrl::parse("https://h:80").unwrap().as_str(), "https://h:80");
        assert_ne!(WorkerUrl::parse("https://h:8000").unwrap(), WorkerUrl::parse("http://h:8000").unwrap());
        // A gRPC worker: host and port, nothing else.
        assert_eq!(ok("GRPC://Engine-0:30001/"), "grpc://engine-0:30001");
        for bad in ["grpc://h", "grpc://h:1/path", "grpc://u@h:1", "grpc://h:0"] {
            assert!(WorkerUrl::parse(bad).is_err(), "{bad:?} accepted");
        }
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
