//! The simulated engine's paged prefix cache: pages keyed by their SGLang
//! block hash (a hash covers the whole prefix, so pages form a tree), a
//! capacity in pages, LRU eviction of unpinned leaves (a chain's tail goes
//! first), and pins that keep a running request's pages resident.
//!
//! The evictable pages (unpinned leaves) are also kept ordered by last use,
//! so evicting a page costs O(log n), not a scan of the cache.

use std::collections::{BTreeSet, HashMap};

use router_types::BlockHash;

/// One cached page.
#[derive(Debug, Clone)]
struct Page {
    parent: Option<BlockHash>,
    children: u32,
    last_used: u64,
    pins: u32,
}

impl Page {
    /// An unpinned leaf: a candidate for eviction.
    fn evictable(&self) -> bool {
        self.children == 0 && self.pins == 0
    }
}

/// What an insert changed: pages stored (in order) and pages evicted to make room.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CacheChange {
    /// Index into the inserted chain of the first page actually stored.
    pub stored_from: usize,
    /// Number of pages stored.
    pub stored: usize,
    /// Pages evicted.
    pub evicted: Vec<BlockHash>,
}

/// The cache.
#[derive(Debug)]
pub struct PagedCache {
    capacity: usize,
    pages: HashMap<BlockHash, Page>,
    /// The evictable pages by (last use, hash): the first goes first.
    lru: BTreeSet<(u64, BlockHash)>,
    clock: u64,
    /// Bumped by `clear`: pins taken before it are gone.
    generation: u64,
}

// === impl PagedCache ===

impl PagedCache {
    /// Pages held by running requests (pinned): SGLang's used tokens, its evictable cache apart.
    pub fn pinned(&self) -> usize {
        self.pages.values().filter(|p| p.pins > 0).count()
    }

    /// Pages it can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// A cache of `capacity` pages.
    pub fn new(capacity: usize) -> Self {
        Self { capacity, pages: HashMap::new(), lru: BTreeSet::new(), clock: 0, generation: 0 }
    }

    /// Pages held.
    pub fn len(&self) -> usize {
        self.pages.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// The pages held, in no order.
    pub fn hashes(&self) -> impl Iterator<Item = BlockHash> + '_ {
        self.pages.keys().copied()
    }

    /// The page a cached page continues (`None` for a first page or one not cached).
    pub fn parent(&self, h: BlockHash) -> Option<BlockHash> {
        self.pages.get(&h).and_then(|p| p.parent)
    }

    /// Forgets everything (a restart), pins included.
    pub fn clear(&mut self) {
        self.pages.clear();
        self.lru.clear();
        self.generation += 1;
    }

    /// How many times the cache was cleared: a holder of pins taken in an
    /// earlier generation holds none.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Changes page `h` with `f`, keeping the eviction order in step; false if absent.
    fn update(&mut self, h: BlockHash, f: impl FnOnce(&mut Page)) -> bool {
        let Some(p) = self.pages.get_mut(&h) else { return false };
        if p.evictable() {
            self.lru.remove(&(p.last_used, h));
        }
        f(p);
        if p.evictable() {
            self.lru.insert((p.last_used, h));
        }
        true
    }

    /// How many leading pages of `chain` are cached; pins them.
    pub fn lookup_and_pin(&mut self, chain: &[BlockHash]) -> usize {
        self.clock += 1;
        let now = self.clock;
        let mut n = 0;
        for h in chain {
            if !self.update(*h, |p| {
                p.last_used = now;
                p.pins += 1;
            }) {
                break;
            }
            n += 1;
        }
        n
    }

    /// How many leading pages of `chain` are cached, touching nothing (no
    /// pin, no use): what a request sent now would find.
    pub fn peek(&self, chain: &[BlockHash]) -> usize {
        chain.iter().take_while(|h| self.pages.contains_key(h)).count()
    }

    /// Stores `chain[from..]` (pinned) under `chain[from - 1]`, evicting unpinned
    /// LRU leaves for room; stops early when everything left is pinned.
    pub fn insert_pinned(&mut self, chain: &[BlockHash], from: usize) -> CacheChange {
        self.clock += 1;
        let now = self.clock;
        let mut change = CacheChange { stored_from: from, ..CacheChange::default() };
        for i in from..chain.len() {
            // Stored meanwhile by another request: just pin it.
            if self.update(chain[i], |p| {
                p.pins += 1;
                p.last_used = now;
            }) {
                if change.stored == 0 {
                    change.stored_from = i + 1;
                    continue;
                }
                break;
            }
            if self.pages.len() >= self.capacity && !self.evict_one(&mut change.evicted) {
                break;
            }
            let parent = i.checked_sub(1).map(|p| chain[p]);
            if !parent.is_some_and(|p| self.update(p, |p| p.children += 1)) && i > 0 {
                break; // the parent was evicted under us: cannot chain
            }
            self.pages.insert(chain[i], Page { parent, children: 0, last_used: now, pins: 1 });
            change.stored += 1;
        }
        change
    }

    /// Unpins the leading `n` pages of `chain`.
    pub fn unpin(&mut self, chain: &[BlockHash], n: usize) {
        for h in chain.iter().take(n) {
            self.update(*h, |p| p.pins = p.pins.saturating_sub(1));
        }
    }

    fn evict_one(&mut self, out: &mut Vec<BlockHash>) -> bool {
        let Some((_, h)) = self.lru.pop_first() else { return false };
        if let Some(parent) = self.pages.remove(&h).and_then(|page| page.parent) {
            self.update(parent, |p| p.children -= 1);
        }
        out.push(h);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(base: i64, n: usize) -> Vec<BlockHash> {
        (0..n as i64).map(|i| BlockHash(base * 1000 + i)).collect()
    }

    #[test]
    fn lru_tails_go_first_and_pins_hold() {
        let mut c = PagedCache::new(4);
        let a = chain(1, 3);
        assert_eq!(c.lookup_and_pin(&a), 0);
        let ch = c.insert_pinned(&a, 0);
        assert_eq!((ch.stored_from, ch.stored, ch.evicted.len()), (0, 3, 0));
        c.unpin(&a, 3);
        let b = chain(2, 2);
        c.lookup_and_pin(&b);
        let ch = c.insert_pinned(&b, 0);
        assert_eq!(ch.stored, 2);
        assert_eq!(ch.evicted, vec![a[2]], "a's tail went first");
        // Everything pinned: the insert stops instead of evicting.
        let d = chain(3, 3);
        let ch = c.insert_pinned(&d, 0);
        assert_eq!(ch.evicted, vec![a[1], a[0]]);
        assert_eq!(ch.stored, 2, "the third page finds only pinned pages");
        assert_eq!(c.lookup_and_pin(&a), 0);
        assert_eq!(c.peek(&d[..1]), 1);
        assert_eq!(c.peek(&[BlockHash(7), d[0]]), 0, "a prefix, not any page");
    }

    /// The cache as it was specified: evict by scanning every page for the
    /// least recently used unpinned leaf (ties to the smaller hash).
    #[derive(Default)]
    struct Naive {
        capacity: usize,
        pages: HashMap<BlockHash, Page>,
        clock: u64,
    }

    impl Naive {
        fn lookup_and_pin(&mut self, chain: &[BlockHash]) -> usize {
            self.clock += 1;
            chain
                .iter()
                .take_while(|h| {
                    self.pages
                        .get_mut(h)
                        .map(|p| {
                            p.last_used = self.clock;
                            p.pins += 1;
                        })
                        .is_some()
                })
                .count()
        }

        fn insert_pinned(&mut self, chain: &[BlockHash], from: usize) -> CacheChange {
            self.clock += 1;
            let mut change = CacheChange { stored_from: from, ..CacheChange::default() };
            for i in from..chain.len() {
                if let Some(p) = self.pages.get_mut(&chain[i]) {
                    p.pins += 1;
                    p.last_used = self.clock;
                    if change.stored == 0 {
                        change.stored_from = i + 1;
                        continue;
                    }
                    break;
                }
                if self.pages.len() >= self.capacity {
                    let victim = self
                        .pages
                        .iter()
                        .filter(|(_, p)| p.evictable())
                        .min_by_key(|(h, p)| (p.last_used, **h))
                        .map(|(h, _)| *h);
                    let Some(h) = victim else { break };
                    let page = self.pages.remove(&h).unwrap();
                    if let Some(parent) = page.parent.and_then(|p| self.pages.get_mut(&p)) {
                        parent.children -= 1;
                    }
                    change.evicted.push(h);
                }
                let parent = i.checked_sub(1).map(|p| chain[p]);
                match parent.and_then(|p| self.pages.get_mut(&p)) {
                    Some(p) => p.children += 1,
                    None if i > 0 => break,
                    None => {}
                }
                self.pages.insert(chain[i], Page { parent, children: 0, last_used: self.clock, pins: 1 });
                change.stored += 1;
            }
            change
        }

        fn unpin(&mut self, chain: &[BlockHash], n: usize) {
            for h in chain.iter().take(n) {
                if let Some(p) = self.pages.get_mut(h) {
                    p.pins = p.pins.saturating_sub(1);
                }
            }
        }
    }

    #[test]
    fn evicts_exactly_as_a_full_scan_would() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move |n: u64| -> i64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n) as i64
        };
        let (mut fast, mut naive) = (PagedCache::new(64), Naive { capacity: 64, ..Naive::default() });
        // Requests still running: their chain and how many of its pages they pinned.
        let mut running: Vec<(Vec<BlockHash>, usize)> = Vec::new();
        for _ in 0..20_000 {
            if !running.is_empty() && next(3) == 0 {
                let (chain, n) = running.swap_remove(next(running.len() as u64) as usize);
                fast.unpin(&chain, n);
                naive.unpin(&chain, n);
                continue;
            }
            // A prompt: one of 6 shared prefixes (1 to 4 pages), then some of one of 40
            // conversations' pages, then new pages. A hash always has the same parent.
            let (prefix, shared) = (next(6), 1 + next(4));
            let mut chain: Vec<BlockHash> = (0..shared).map(|i| BlockHash(prefix * 100 + i)).collect();
            let conv = ((prefix * 5 + shared) * 40 + next(40)) * 100;
            chain.extend((0..next(12)).map(|i| BlockHash(10_000 + conv + i)));
            chain.extend((0..next(4)).map(|_| BlockHash(1 << 50 | next(1 << 40))));
            let hit = fast.lookup_and_pin(&chain);
            assert_eq!(hit, naive.lookup_and_pin(&chain));
            let change = fast.insert_pinned(&chain, hit);
            assert_eq!(change, naive.insert_pinned(&chain, hit));
            assert_eq!(fast.len(), naive.pages.len());
            running.push((chain, change.stored_from + change.stored));
        }
    }
}
