//! Which workers' engines hash their blocks with a lookahead (vLLM's `lookahead_token_ids`,
//! EAGLE and MTP drafting), learned from their stores: a request is chained for each lookahead
//! some worker uses, and credited to a worker in its own chain.

use std::collections::HashMap;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

use router_types::MAX_LOOKAHEAD_TOKENS as MAX_LOOKAHEAD;

use crate::WorkerId;

/// The lookahead of each worker that has one.
#[derive(Debug, Default)]
pub(crate) struct Lookaheads {
    /// Bit `L - 1`: some worker hashes with a lookahead of `L` tokens (one load when none does).
    any: AtomicU64,
    by_worker: RwLock<HashMap<WorkerId, u8>>,
}

impl Lookaheads {
    /// Records that `worker`'s engine stores blocks with a lookahead of `len` tokens (0: none,
    /// as when it restarted without drafting). Lengths above [`MAX_LOOKAHEAD`] are refused.
    pub(crate) fn note(&self, worker: WorkerId, len: usize) -> bool {
        if len > MAX_LOOKAHEAD {
            return false;
        }
        if len == 0 && self.none() {
            return true;
        }
        let known = self.by_worker.read().unwrap_or_else(|p| p.into_inner()).get(&worker).copied();
        if known.map_or(0, usize::from) == len {
            return true;
        }
        let mut by_worker = self.by_worker.write().unwrap_or_else(|p| p.into_inner());
        if len == 0 {
            by_worker.remove(&worker);
        } else {
            by_worker.insert(worker, len as u8);
        }
        self.any.store(bits(&by_worker), Ordering::Relaxed);
        true
    }

    /// No worker hashes with a lookahead (one atomic load).
    pub(crate) fn none(&self) -> bool {
        self.any.load(Ordering::Relaxed) == 0
    }

    /// Forgets `worker` (it left).
    pub(crate) fn forget(&self, worker: WorkerId) {
        if self.none() {
            return;
        }
        let mut by_worker = self.by_worker.write().unwrap_or_else(|p| p.into_inner());
        if by_worker.remove(&worker).is_some() {
            self.any.store(bits(&by_worker), Ordering::Relaxed);
        }
    }

    /// The lookaheads in use, shortest first (none: one atomic load).
    pub(crate) fn lengths(&self) -> impl Iterator<Item = usize> + use<> {
        let mut bits = self.any.load(Ordering::Relaxed);
        std::iter::from_fn(move || {
            let l = (bits != 0).then(|| bits.trailing_zeros() as usize + 1)?;
            bits &= bits - 1;
            Some(l)
        })
    }

    /// `worker`'s lookahead (0: none).
    pub(crate) fn of(&self, worker: WorkerId) -> usize {
        if self.none() {
            return 0;
        }
        self.by_worker.read().unwrap_or_else(|p| p.into_inner()).get(&worker).map_or(0, |l| usize::from(*l))
    }
}

fn bits(by_worker: &HashMap<WorkerId, u8>) -> u64 {
    by_worker.values().fold(0, |bits, l| bits | 1 << (l - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_follow_the_workers_that_use_them() {
        let l = Lookaheads::default();
        assert_eq!(l.lengths().count(), 0);
        assert!(l.note(WorkerId(0), 1));
        assert!(l.note(WorkerId(1), 3));
        assert!(l.note(WorkerId(2), 3));
        assert_eq!(l.lengths().collect::<Vec<_>>(), [1, 3]);
        assert_eq!((l.of(WorkerId(0)), l.of(WorkerId(1)), l.of(WorkerId(9))), (1, 3, 0));
        l.forget(WorkerId(1));
        assert_eq!(l.lengths().collect::<Vec<_>>(), [1, 3], "worker 2 still uses 3");
        assert!(l.note(WorkerId(2), 0), "restarted without drafting");
        assert_eq!(l.lengths().collect::<Vec<_>>(), [1]);
        assert!(l.note(WorkerId(0), MAX_LOOKAHEAD));
        assert_eq!(l.lengths().collect::<Vec<_>>(), [MAX_LOOKAHEAD]);
        assert!(!l.note(WorkerId(0), MAX_LOOKAHEAD + 1));
        assert_eq!(l.of(WorkerId(0)), MAX_LOOKAHEAD);
    }
}
