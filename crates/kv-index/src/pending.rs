//! Pending prefixes: blocks a worker was just sent and will hold soon, credited
//! for a TTL so that a burst of requests sharing a cold prefix lands on one
//! worker before its KV events arrive.
//!
//! Bounded: one queue place per (block, worker) credit, in the order credits
//! were first given; a credit given again keeps its place and its later expiry
//! (checked when its place comes up, then queued again). The oldest are dropped
//! first when the table is full. A warm prefix credited by every request thus
//! costs one lookup per page, not a queue entry per page and request.

use std::collections::{HashMap, VecDeque};

use router_types::BlockHash;

use crate::WorkerId;

/// Pending credits, by block hash.
#[derive(Debug)]
pub(crate) struct Pending {
    ttl_ms: u64,
    max_entries: usize,
    by_hash: HashMap<BlockHash, Vec<(WorkerId, u64)>>,
    /// (expiry when queued, hash, worker): one place per credit in `by_hash`, whose expiry
    /// is the same or later (credited again since).
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
                // Its place in the queue stays: `expire` finds the later expiry there.
                Some(e) => e.1 = expiry,
                None => {
                    entry.push((worker, expiry));
                    self.queue.push_back((expiry, hash, worker));
                }
            }
        }
        while self.queue.len() > self.max_entries {
            if let Some((_, hash, worker)) = self.queue.pop_front() {
                self.drop_entry(hash, worker, u64::MAX);
            }
        }
    }

    /// Removes what expired at or before `now`; a credit given again since it was queued
    /// goes to the back with its new expiry. (Such a credit can sit behind a later one and be
    /// removed up to one TTL late: [`depths`](Self::depths) never counts it once expired.)
    pub(crate) fn expire(&mut self, now: u64) {
        while let Some(&(queued, hash, worker)) = self.queue.front() {
            if queued > now {
                break;
            }
            self.queue.pop_front();
            self.drop_entry(hash, worker, now);
        }
    }

    /// Drops `worker`'s credit on `hash` (its queue place already taken out) unless it expires
    /// after `limit` (credited again since): then it is queued again with that expiry.
    fn drop_entry(&mut self, hash: BlockHash, worker: WorkerId, limit: u64) {
        let Some(list) = self.by_hash.get_mut(&hash) else { return };
        let Some(i) = list.iter().position(|(w, _)| *w == worker) else { return };
        let expiry = list[i].1;
        if expiry > limit {
            self.queue.push_back((expiry, hash, worker));
            return;
        }
        list.remove(i);
        if list.is_empty() {
            self.by_hash.remove(&hash);
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
            // No allocation per page: the holders are read in place for each worker still going.
            let Some(list) = self.by_hash.get(hash) else { break };
            let mut advanced = false;
            for (w, depth) in out.iter_mut() {
                if *depth as usize == i && list.iter().any(|(h, expiry)| h == w && *expiry > now) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn h(i: i64) -> BlockHash {
        BlockHash(i)
    }

    #[test]
    fn a_credit_given_again_keeps_one_place_and_its_later_expiry() {
        let (a, b) = (WorkerId(1), WorkerId(2));
        let chain: Vec<BlockHash> = (0..8).map(h).collect();
        let mut p = Pending::new(100, 1 << 10);
        for t in 0..50 {
            p.credit(a, &chain, t); // every request of a warm prefix credits it again
        }
        assert_eq!(p.len(), 8, "one place per (block, worker), not per credit");
        p.expire(120);
        assert_eq!(p.len(), 8, "credited again since it was queued: queued again, not dropped");
        assert_eq!(p.depths(&chain, 148), vec![(a, 8)], "alive until the last credit's TTL");
        p.credit(b, &chain[..3], 120);
        assert_eq!(p.depths(&chain, 148), vec![(a, 8), (b, 3)]);
        assert_eq!(p.depths(&chain, 149), vec![(b, 3)], "expired at exactly the TTL");
        p.expire(149);
        assert_eq!(p.len(), 3);
        p.expire(220);
        assert_eq!(p.len(), 0);
        assert!(p.by_hash.is_empty());
    }

    #[test]
    fn the_oldest_credits_go_first_when_full() {
        let w = WorkerId(1);
        let mut p = Pending::new(1_000, 4);
        let chain: Vec<BlockHash> = (0..6).map(h).collect();
        p.credit(w, &chain[..4], 0);
        for t in 1..20 {
            p.credit(w, &chain[..4], t); // refreshed: still four places, nothing dropped
        }
        assert_eq!(p.depths(&chain, 20), vec![(w, 4)]);
        p.credit(w, &chain[4..], 21);
        assert_eq!(p.len(), 4);
        assert!(p.depths(&chain, 21).is_empty(), "the first pages were dropped: no prefix left");
        assert_eq!(p.depths(&chain[2..], 21), vec![(w, 4)]);
    }
}
