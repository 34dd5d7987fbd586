//! Pending prefixes: blocks a worker was just sent and will hold soon, credited
//! for a TTL so that a burst of requests sharing a cold prefix lands on one
//! worker before its KV events arrive.
//!
//! Bounded: entries expire in insertion order (the TTL is fixed), and the
//! oldest are dropped first when the table is full.

use std::collections::{HashMap, VecDeque};

use router_types::BlockHash;

use crate::WorkerId;

/// Pending credits, by block hash.
#[derive(Debug)]
pub(crate) struct Pending {
    ttl_ms: u64,
    max_entries: usize,
    by_hash: HashMap<BlockHash, Vec<(WorkerId, u64)>>,
    /// (expiry, hash, worker) in insertion order = expiry order.
    queue: VecDeque<(u64, BlockHash, WorkerId)>,
}

// === impl Pending ===

impl Pending {
    pub(crate) fn new(ttl_ms: u64, max_entries: usize) -> Self {
        Self { ttl_ms, max_entries, by_hash: HashMap::new(), queue: VecDeque::new() }
    }

    /// Credits `worker` with `hashes` until `now + ttl`.
    pub(crate) fn credit(&mut self, worker: WorkerId, hashes: &[BlockHash], now: u64) {
        self.expire(now);
        let expiry = now + self.ttl_ms;
        for &hash in hashes {
            let entry = self.by_hash.entry(hash).or_default();
            match entry.iter_mut().find(|(w, _)| *w == worker) {
                Some(e) => e.1 = expiry,
                None => entry.push((worker, expiry)),
            }
            self.queue.push_back((expiry, hash, worker));
        }
        while self.queue.len() > self.max_entries {
            if let Some((_, hash, worker)) = self.queue.pop_front() {
                self.drop_entry(hash, worker, u64::MAX);
            }
        }
    }

    /// Removes everything that expired at or before `now`.
    pub(crate) fn expire(&mut self, now: u64) {
        while let Some(&(expiry, hash, worker)) = self.queue.front() {
            if expiry > now {
                break;
            }
            self.queue.pop_front();
            self.drop_entry(hash, worker, now);
        }
    }

    /// Drops the credit of `worker` on `hash` if it expires at or before `limit`
    /// (a later credit for the same pair keeps it alive).
    fn drop_entry(&mut self, hash: BlockHash, worker: WorkerId, limit: u64) {
        if let Some(list) = self.by_hash.get_mut(&hash) {
            list.retain(|&(w, expiry)| w != worker || expiry > limit);
            if list.is_empty() {
                self.by_hash.remove(&hash);
            }
        }
    }

    /// Per worker, the number of leading `hashes` credited and unexpired at `now`.
    pub(crate) fn depths(&self, hashes: &[BlockHash], now: u64) -> Vec<(WorkerId, u32)> {
        let live = |hash: &BlockHash| {
            self.by_hash.get(hash).into_iter().flatten().filter(move |(_, expiry)| *expiry > now).map(|(w, _)| *w)
        };
        let Some(first) = hashes.first() else {
            return Vec::new();
        };
        let mut out: Vec<(WorkerId, u32)> = live(first).map(|w| (w, 1)).collect();
        for (i, hash) in hashes.iter().enumerate().skip(1) {
            let holders: Vec<WorkerId> = live(hash).collect();
            let mut advanced = false;
            for (w, depth) in out.iter_mut() {
                if *depth as usize == i && holders.contains(w) {
                    *depth += 1;
                    advanced = true;
                }
            }
            if !advanced {
                break;
            }
        }
        out
    }

    /// Forgets every credit of `worker`.
    pub(crate) fn remove_worker(&mut self, worker: WorkerId) {
        self.by_hash.retain(|_, list| {
            list.retain(|(w, _)| *w != worker);
            !list.is_empty()
        });
        self.queue.retain(|(_, _, w)| *w != worker);
    }

    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.queue.capacity() * std::mem::size_of::<(u64, BlockHash, WorkerId)>()
            + self.by_hash.capacity() * (std::mem::size_of::<(BlockHash, Vec<(WorkerId, u64)>)>() + 1)
            + self.by_hash.values().map(|v| v.capacity() * 16).sum::<usize>()
    }
}
