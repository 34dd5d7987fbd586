//! Herd-free routing across replicas: each replica publishes what it places where (the
//! worker, the prefill owed, the pages credited as pending), batched as it goes, and its own
//! load on every worker every [`LOAD_EVERY`]; each applies the others' to its pending credits
//! and to its view of every worker's load, so N replicas decide as one router would. Owns the
//! other replicas' last reports ([`Remote`]); a replica not heard from for [`STALE`] no
//! longer counts, so with the backend gone every replica is back to its own view.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use fleet::Fleet;
use kv_index::KvIndex;
use router_types::Load;
use tokio::sync::mpsc;
use tracing::warn;

use super::Shared;
use super::wire::{Batch, MAX_ITEMS, Placement};

/// How long a replica gathers placements before it sends them (one message, not one a request).
const LINGER: Duration = Duration::from_millis(2);
/// How often a replica says its load on every worker (when it changed; every
/// [`HEARTBEAT`] in any case, so the others know it is there).
const LOAD_EVERY: Duration = Duration::from_millis(10);
const HEARTBEAT: Duration = Duration::from_millis(500);
/// A replica not heard from for this long no longer counts.
const STALE: Duration = Duration::from_millis(1500);
/// Other replicas remembered at most (past it, new ones are not counted).
const MAX_REPLICAS: usize = 256;
/// Messages received and not yet applied at most (past it the subscription drops them): with
/// messages of at most [`super::MAX_MESSAGE_BYTES`], 64 MiB at worst.
const INBOX: usize = 64;

/// The other replicas' loads, as last heard.
#[derive(Debug, Default)]
pub(super) struct Remote {
    replicas: HashMap<u64, Replica>,
}

#[derive(Debug)]
struct Replica {
    heard: Instant,
    /// Its load per worker URL: its last report, plus what it placed since.
    loads: HashMap<String, Load>,
}

impl Remote {
    /// Replicas heard from within [`STALE`] of `now`.
    pub(super) fn live(&self, now: Instant) -> usize {
        self.replicas.values().filter(|r| now.duration_since(r.heard) < STALE).count()
    }

    /// Takes in `batch` from another replica; false if it is one too many to remember.
    fn apply(&mut self, batch: &Batch, now: Instant) -> bool {
        if !self.replicas.contains_key(&batch.replica) && self.replicas.len() >= MAX_REPLICAS {
            self.forget_stale(now);
            if self.replicas.len() >= MAX_REPLICAS {
                return false;
            }
        }
        let r = self.replicas.entry(batch.replica).or_insert_with(|| Replica { heard: now, loads: HashMap::new() });
        r.heard = now;
        // Its report, as of when it was sent: what it placed before is in it.
        if let Some(loads) = &batch.loads {
            r.loads = loads.iter().cloned().collect();
        }
        for p in &batch.placements {
            let l = r.loads.entry(p.url.clone()).or_default();
            l.in_flight = l.in_flight.saturating_add(p.requests);
            l.uncached_tokens = l.uncached_tokens.saturating_add(p.uncached);
        }
        // One replica's word on a worker never exceeds what every worker could hold at once.
        if r.loads.len() > MAX_ITEMS {
            r.loads.clear();
        }
        true
    }

    fn forget_stale(&mut self, now: Instant) {
        self.replicas.retain(|_, r| now.duration_since(r.heard) < STALE);
    }

    /// Every live replica's load on each worker, summed.
    fn sums(&self, now: Instant) -> HashMap<&str, Load> {
        let mut out: HashMap<&str, Load> = HashMap::new();
        for r in self.replicas.values().filter(|r| now.duration_since(r.heard) < STALE) {
            for (url, l) in &r.loads {
                let sum = out.entry(url.as_str()).or_default();
                sum.in_flight = sum.in_flight.saturating_add(l.in_flight);
                sum.uncached_tokens = sum.uncached_tokens.saturating_add(l.uncached_tokens);
            }
        }
        out
    }
}

/// Publishes this replica's placements as they come (what queued meanwhile goes in the same
/// message) and its loads every [`LOAD_EVERY`]; nothing while the backend is down (counted).
pub(super) async fn publish(shared: Weak<Shared>, fleet: Arc<Fleet>, mut rx: mpsc::Receiver<Placement>) {
    let mut tick = tokio::time::interval(LOAD_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut said: Vec<(String, Load)> = Vec::new();
    let mut said_at = Instant::now();
    loop {
        let mut batch = Batch::default();
        tokio::select! {
            p = rx.recv() => {
                let Some(p) = p else { return };
                tokio::time::sleep(LINGER).await;
                // Within one message's bytes (each placement's URL, counts and pages); those
                // without pages merged per worker.
                let mut bytes = 64;
                let mut next = Some(p);
                while let Some(p) = next.take().or_else(|| rx.try_recv().ok()) {
                    match batch.placements.iter_mut().find(|q| q.pages.is_empty() && p.pages.is_empty() && q.url == p.url) {
                        Some(q) => {
                            q.requests = q.requests.saturating_add(p.requests);
                            q.uncached = q.uncached.saturating_add(p.uncached);
                        }
                        None => {
                            bytes += p.url.len() + 18 + 8 * p.pages.len();
                            batch.placements.push(p);
                        }
                    }
                    if batch.placements.len() >= MAX_ITEMS || bytes >= super::MAX_MESSAGE_BYTES / 2 {
                        break;
                    }
                }
            }
            _ = tick.tick() => {
                let loads: Vec<(String, Load)> =
                    fleet.snapshot().iter().take(MAX_ITEMS).map(|w| (w.url.to_string(), w.own_load())).collect();
                if loads != said || said_at.elapsed() >= HEARTBEAT {
                    said_at = Instant::now();
                    said.clone_from(&loads);
                    batch.loads = Some(loads);
                }
            }
        }
        let Some(shared) = shared.upgrade() else { return };
        batch.placements.iter().for_each(|p| shared.dequeued(p));
        if batch.is_empty() {
            continue;
        }
        batch.replica = shared.replica;
        let c = &shared.counters;
        let placed: u64 = batch.placements.iter().map(|p| u64::from(p.requests)).sum();
        if !shared.is_up() {
            c.messages_unsent.fetch_add(1, Ordering::Relaxed);
            c.placements_dropped.fetch_add(placed, Ordering::Relaxed);
            continue;
        }
        let channel = shared.key("placements", "v1");
        match shared.backend.cmd(&[b"PUBLISH", &channel, &batch.encode()]).await {
            Ok(shared_state::Reply::Int(_)) => {
                c.messages_sent.fetch_add(1, Ordering::Relaxed);
                c.placements_sent.fetch_add(placed, Ordering::Relaxed);
            }
            _ => {
                c.messages_unsent.fetch_add(1, Ordering::Relaxed);
                c.placements_dropped.fetch_add(placed, Ordering::Relaxed);
            }
        }
    }
}

/// Follows the other replicas' messages: their placements credited to `index` as pending, and
/// their loads added to `fleet`'s workers' (stale ones dropped every [`LOAD_EVERY`]).
pub(super) async fn follow(
    shared: Weak<Shared>,
    subscriber: shared_state::Backend,
    fleet: Arc<Fleet>,
    index: Option<Arc<KvIndex>>,
) {
    let mut inbox = {
        let Some(s) = shared.upgrade() else { return };
        subscriber.subscribe(vec![s.key("placements", "v1")], INBOX)
    };
    let mut tick = tokio::time::interval(LOAD_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut warned = false;
    loop {
        let message = tokio::select! {
            m = inbox.recv() => match m { Some(m) => Some(m), None => return },
            _ = tick.tick() => None,
        };
        let Some(shared) = shared.upgrade() else { return };
        let now = Instant::now();
        let mut remote = shared.remote.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = message {
            // This replica's own, back from the channel: not even decoded.
            if Batch::sender(&m.payload) == Some(shared.replica) {
                continue;
            }
            shared.counters.messages_received.fetch_add(1, Ordering::Relaxed);
            let batch = match Batch::decode(&m.payload) {
                Ok(b) => b,
                Err(e) => {
                    shared.counters.messages_bad.fetch_add(1, Ordering::Relaxed);
                    if !std::mem::replace(&mut warned, true) {
                        warn!(error = %e, "a malformed placements message from the shared-state backend, skipped (counted in router_shared_state_messages_total)");
                    }
                    continue;
                }
            };
            if batch.replica == shared.replica || !remote.apply(&batch, now) {
                continue;
            }
            if let Some(index) = &index {
                let workers = super::by_url(&fleet);
                for p in batch.placements.iter().filter(|p| !p.pages.is_empty()) {
                    if let Some(id) = workers.get(&p.url).and_then(|w| w.index_id) {
                        index.credit_pending(id, &p.pages);
                    }
                }
            }
            let applied: u64 = batch.placements.iter().map(|p| u64::from(p.requests)).sum();
            shared.counters.placements_applied.fetch_add(applied, Ordering::Relaxed);
        } else {
            remote.forget_stale(now);
        }
        // The backend out of reach: the others' reports go stale, and this replica routes alone.
        let sums = if shared.is_up() { remote.sums(now) } else { HashMap::new() };
        shared.set_live_peers(remote.live(now));
        for w in fleet.snapshot().iter() {
            let load = sums.get(w.url.as_str()).copied().unwrap_or_default();
            if w.remote_load() != load {
                w.set_remote_load(load);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placement(url: &str, uncached: u64) -> Placement {
        Placement { url: url.into(), requests: 1, uncached, pages: Vec::new() }
    }

    #[test]
    fn a_report_replaces_what_was_counted_and_placements_add_to_it() {
        let mut r = Remote::default();
        let t = Instant::now();
        let report = vec![("a".to_string(), Load { in_flight: 2, uncached_tokens: 100 })];
        assert!(r.apply(&Batch { replica: 1, placements: vec![], loads: Some(report) }, t));
        assert!(
            r.apply(&Batch { replica: 1, placements: vec![placement("a", 50), placement("b", 7)], loads: None }, t)
        );
        assert!(r.apply(&Batch { replica: 2, placements: vec![placement("a", 1)], loads: None }, t));
        let sums = r.sums(t);
        assert_eq!(sums["a"], Load { in_flight: 4, uncached_tokens: 151 });
        assert_eq!(sums["b"], Load { in_flight: 1, uncached_tokens: 7 });
        // Replica 1's next report says what is still in flight: its placements are in it.
        let report = vec![("a".to_string(), Load { in_flight: 1, uncached_tokens: 0 })];
        assert!(r.apply(&Batch { replica: 1, placements: vec![], loads: Some(report) }, t));
        assert_eq!(r.sums(t)["a"], Load { in_flight: 2, uncached_tokens: 1 });
        assert!(!r.sums(t).contains_key("b"));
        assert_eq!(r.live(t), 2);
    }

    #[test]
    fn a_silent_replica_stops_counting_and_the_replicas_are_bounded() {
        let mut r = Remote::default();
        let t = Instant::now();
        assert!(r.apply(&Batch { replica: 1, placements: vec![placement("a", 5)], loads: None }, t));
        let later = t + STALE;
        assert!(r.sums(later).is_empty());
        assert_eq!(r.live(later), 0);
        for id in 0..MAX_REPLICAS as u64 {
            assert!(r.apply(&Batch { replica: 100 + id, placements: vec![], loads: None }, later));
        }
        assert!(!r.apply(&Batch { replica: 7, placements: vec![], loads: None }, later), "one too many");
        // Once they are stale, room is made.
        assert!(r.apply(&Batch { replica: 7, placements: vec![], loads: None }, later + STALE));
    }
}
