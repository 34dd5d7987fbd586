//! The placements message router replicas publish to each other (`--shared-state`): a
//! binary, length-checked batch of the requests one replica placed (worker, prefill owed,
//! the pages credited as pending) and, now and then, its own load on every worker. Decoding
//! trusts nothing: every count and length is bounded before anything is allocated.

use router_types::{BlockHash, Load};

/// The first bytes of every message (the format's version is its last byte).
const MAGIC: &[u8; 4] = b"SGP2";
/// Pages of one placement shared at most: its prompt's first ones (deeper pages change few
/// decisions, and a message stays small).
pub(crate) const MAX_PAGES: usize = 4096;
/// Placements, or workers' loads, in one message at most.
pub(crate) const MAX_ITEMS: usize = 4096;
/// Longest worker URL.
const MAX_URL: usize = 2048;

/// Requests placed on a worker: one with its pages, or several without (merged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placement {
    pub(crate) url: String,
    /// How many requests (1 for one with pages).
    pub(crate) requests: u32,
    /// The prefill they owe the worker (their prompts' tokens the worker does not hold).
    pub(crate) uncached: u64,
    /// The pages credited to the worker as pending (empty: none).
    pub(crate) pages: Vec<BlockHash>,
}

/// What one replica publishes at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Batch {
    /// The replica that sent it (random at its start).
    pub(crate) replica: u64,
    pub(crate) placements: Vec<Placement>,
    /// Its own load on every worker it routes to, when it is time to say it again.
    pub(crate) loads: Option<Vec<(String, Load)>>,
}

/// Why a message was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Bad {
    #[error("not a placements message (magic)")]
    Magic,
    #[error("message cut short")]
    Short,
    #[error("a count or a length over its bound")]
    TooLarge,
    #[error("a worker URL that is not UTF-8")]
    Utf8,
    #[error("bytes after the message's end")]
    Trailing,
}

impl Batch {
    /// Whether there is nothing to send.
    pub(crate) fn is_empty(&self) -> bool {
        self.placements.is_empty() && self.loads.is_none()
    }

    /// The message's bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let pages: usize = self.placements.iter().map(|p| p.pages.len().min(MAX_PAGES) * 8 + p.url.len() + 18).sum();
        let mut out = Vec::with_capacity(32 + pages);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.replica.to_le_bytes());
        let placements = &self.placements[..self.placements.len().min(MAX_ITEMS)];
        out.extend_from_slice(&(placements.len() as u32).to_le_bytes());
        for p in placements {
            url(&mut out, &p.url);
            out.extend_from_slice(&p.requests.to_le_bytes());
            out.extend_from_slice(&p.uncached.to_le_bytes());
            let pages = &p.pages[..p.pages.len().min(MAX_PAGES)];
            out.extend_from_slice(&(pages.len() as u32).to_le_bytes());
            for h in pages {
                out.extend_from_slice(&h.0.to_le_bytes());
            }
        }
        match &self.loads {
            None => out.push(0),
            Some(loads) => {
                out.push(1);
                let loads = &loads[..loads.len().min(MAX_ITEMS)];
                out.extend_from_slice(&(loads.len() as u32).to_le_bytes());
                for (u, load) in loads {
                    url(&mut out, u);
                    out.extend_from_slice(&load.in_flight.to_le_bytes());
                    out.extend_from_slice(&load.uncached_tokens.to_le_bytes());
                }
            }
        }
        out
    }

    /// The replica that sent `bytes`, read without decoding the rest.
    pub(crate) fn sender(bytes: &[u8]) -> Option<u64> {
        if bytes.get(..4)? != MAGIC {
            return None;
        }
        Some(u64::from_le_bytes(bytes.get(4..12)?.try_into().ok()?))
    }

    /// A message read back, or why it is refused.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Batch, Bad> {
        let mut r = Reader(bytes);
        if r.take(4)? != MAGIC {
            return Err(Bad::Magic);
        }
        let replica = r.u64()?;
        let n = r.count(MAX_ITEMS)?;
        // A placement is at least 18 bytes: no more room than the bytes there can fill.
        let mut placements = Vec::with_capacity(n.min(r.0.len() / 18));
        for _ in 0..n {
            let url = r.url()?;
            let requests = r.u32()?;
            let uncached = r.u64()?;
            let n_pages = r.count(MAX_PAGES)?;
            // Checked against what is there before it is reserved.
            let raw = r.take(n_pages.checked_mul(8).ok_or(Bad::TooLarge)?)?;
            let pages = raw.chunks_exact(8).map(|c| BlockHash(i64::from_le_bytes(c.try_into().unwrap_or_default())));
            placements.push(Placement { url, requests, uncached, pages: pages.collect() });
        }
        let loads = match r.take(1)?[0] {
            0 => None,
            _ => {
                let n = r.count(MAX_ITEMS)?;
                let mut loads = Vec::with_capacity(n.min(r.0.len() / 14));
                for _ in 0..n {
                    let url = r.url()?;
                    let in_flight = r.u32()?;
                    let uncached_tokens = r.u64()?;
                    loads.push((url, Load { in_flight, uncached_tokens }));
                }
                Some(loads)
            }
        };
        if !r.0.is_empty() {
            return Err(Bad::Trailing);
        }
        Ok(Batch { replica, placements, loads })
    }
}

fn url(out: &mut Vec<u8>, url: &str) {
    let url = &url.as_bytes()[..url.len().min(MAX_URL)];
    out.extend_from_slice(&(url.len() as u16).to_le_bytes());
    out.extend_from_slice(url);
}

/// The bytes not read yet.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Bad> {
        if self.0.len() < n {
            return Err(Bad::Short);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u64(&mut self) -> Result<u64, Bad> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().map_err(|_| Bad::Short)?))
    }

    fn u32(&mut self) -> Result<u32, Bad> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().map_err(|_| Bad::Short)?))
    }

    fn count(&mut self, max: usize) -> Result<usize, Bad> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(Bad::TooLarge);
        }
        Ok(n)
    }

    fn url(&mut self) -> Result<String, Bad> {
        let n = u16::from_le_bytes(self.take(2)?.try_into().map_err(|_| Bad::Short)?) as usize;
        if n > MAX_URL {
            return Err(Bad::TooLarge);
        }
        std::str::from_utf8(self.take(n)?).map(str::to_owned).map_err(|_| Bad::Utf8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch() -> Batch {
        Batch {
            replica: 0xfeed,
            placements: vec![
                Placement {
                    url: "http://w0:8000".into(),
                    requests: 1,
                    uncached: 700,
                    pages: vec![BlockHash(-1), BlockHash(42)],
                },
                Placement { url: "http://w1:8000".into(), requests: 3, uncached: 0, pages: vec![] },
            ],
            loads: Some(vec![("http://w0:8000".into(), Load { in_flight: 3, uncached_tokens: 1500 })]),
        }
    }

    #[test]
    fn a_batch_round_trips() {
        let b = batch();
        assert_eq!(Batch::decode(&b.encode()), Ok(b.clone()));
        assert_eq!(Batch::sender(&b.encode()), Some(0xfeed));
        assert_eq!(Batch::sender(b"SGP2abc"), None);
        let no_loads = Batch { loads: None, ..batch() };
        assert_eq!(Batch::decode(&no_loads.encode()), Ok(no_loads));
        assert!(Batch { replica: 1, ..Batch::default() }.is_empty());
    }

    #[test]
    fn a_placement_shares_its_first_pages_only() {
        let pages: Vec<BlockHash> = (0..MAX_PAGES as i64 + 10).map(BlockHash).collect();
        let b = Batch {
            placements: vec![Placement { url: "u".into(), requests: 1, uncached: 1, pages }],
            ..Batch::default()
        };
        let back = Batch::decode(&b.encode()).unwrap();
        assert_eq!(back.placements[0].pages.len(), MAX_PAGES);
        assert_eq!(back.placements[0].pages[MAX_PAGES - 1], BlockHash(MAX_PAGES as i64 - 1));
    }

    #[test]
    fn every_malformed_message_is_refused_without_allocating_what_it_claims() {
        let good = batch().encode();
        assert_eq!(Batch::decode(b"XXXX"), Err(Bad::Magic));
        // Every cut short.
        for n in 0..good.len() {
            let r = Batch::decode(&good[..n]);
            assert!(matches!(r, Err(Bad::Short | Bad::Magic)), "cut at {n}: {r:?}");
        }
        let mut trailing = good.clone();
        trailing.push(0);
        assert_eq!(Batch::decode(&trailing), Err(Bad::Trailing));
        // A count of placements, then of pages, over its bound.
        let mut many = good[..12].to_vec();
        many.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Batch::decode(&many), Err(Bad::TooLarge));
        let mut pages = good[..16].to_vec();
        pages.extend_from_slice(&14u16.to_le_bytes());
        pages.extend_from_slice(b"http://w0:8000");
        pages.extend_from_slice(&1u32.to_le_bytes());
        pages.extend_from_slice(&1u64.to_le_bytes());
        pages.extend_from_slice(&(MAX_PAGES as u32).to_le_bytes());
        assert_eq!(Batch::decode(&pages), Err(Bad::Short), "4,096 pages claimed, none there");
        // A URL that is not UTF-8.
        let mut bad_url = good[..16].to_vec();
        bad_url.extend_from_slice(&2u16.to_le_bytes());
        bad_url.extend_from_slice(&[0xff, 0xfe]);
        assert_eq!(Batch::decode(&bad_url), Err(Bad::Utf8));
    }
}
