//! The simulated engine's paged prefix cache: pages keyed by their SGLang
//! block hash (a hash covers the whole prefix, so pages form a tree), a
//! capacity in pages, LRU eviction of unpinned leaves (a chain's tail goes
//! first), and pins that keep a running request's pages resident.

use std::collections::HashMap;

use router_types::BlockHash;

/// One cached page.
#[derive(Debug, Clone)]
struct Page {
    parent: Option<BlockHash>,
    children: u32,
    last_used: u64,
    pins: u32,
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
    clock: u64,
}

// === impl PagedCache ===

impl PagedCache {
    /// A cache of `capacity` pages.
    pub fn new(capacity: usize) -> Self {
        Self { capacity, pages: HashMap::new(), clock: 0 }
    }

    /// Pages held.
    pub fn len(&self) -> usize {
        self.pages.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Forgets everything (a restart).
    pub fn clear(&mut self) {
        self.pages.clear();
    }

    /// How many leading pages of `chain` are cached; pins them.
    pub fn lookup_and_pin(&mut self, chain: &[BlockHash]) -> usize {
        self.clock += 1;
        let mut n = 0;
        for h in chain {
            match self.pages.get_mut(h) {
                Some(p) => {
                    p.last_used = self.clock;
                    p.pins += 1;
                    n += 1;
                }
                None => break,
            }
        }
        n
    }

    /// Stores `chain[from..]` (pinned) under `chain[from - 1]`, evicting unpinned
    /// LRU leaves for room; stops early when everything left is pinned.
    pub fn insert_pinned(&mut self, chain: &[BlockHash], from: usize) -> CacheChange {
        self.clock += 1;
        let mut change = CacheChange { stored_from: from, ..CacheChange::default() };
        for i in from..chain.len() {
            if self.pages.contains_key(&chain[i]) {
                // Stored meanwhile by another request: just pin it.
                if let Some(p) = self.pages.get_mut(&chain[i]) {
                    p.pins += 1;
                    p.last_used = self.clock;
                }
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
            if let Some(p) = parent.and_then(|p| self.pages.get_mut(&p)) {
                p.children += 1;
            } else if i > 0 {
                break; // the parent was evicted under us: cannot chain
            }
            self.pages.insert(chain[i], Page { parent, children: 0, last_used: self.clock, pins: 1 });
            change.stored += 1;
        }
        change
    }

    /// Unpins the leading `n` pages of `chain`.
    pub fn unpin(&mut self, chain: &[BlockHash], n: usize) {
        for h in chain.iter().take(n) {
            if let Some(p) = self.pages.get_mut(h) {
                p.pins = p.pins.saturating_sub(1);
            }
        }
    }

    fn evict_one(&mut self, out: &mut Vec<BlockHash>) -> bool {
        let victim = self
            .pages
            .iter()
            .filter(|(_, p)| p.children == 0 && p.pins == 0)
            .min_by_key(|(_, p)| p.last_used)
            .map(|(h, _)| *h);
        let Some(h) = victim else { return false };
        if let Some(page) = self.pages.remove(&h)
            && let Some(parent) = page.parent.and_then(|p| self.pages.get_mut(&p))
        {
            parent.children -= 1;
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
    }
}
