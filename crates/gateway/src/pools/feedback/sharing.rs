//! Learning shared with the other replicas (`--shared-state`): every route id given out is
//! written to the backend in the background, so that any replica takes its feedback; a
//! feedback body's route ids are claimed there first (one Lua script: judged once, whichever
//! replica is asked, and only by the caller who got the answer), a claim this replica then
//! refuses is put back; an accepted verdict or preference is applied here at once and added to
//! its arms' shared totals by one task, which also reads every arm's totals each
//! [`REFRESH`] into the bandit's evidence. With the backend out of reach or late, this replica
//! decides alone (counted), as without sharing.
//!
//! ```text
//! issue ──write (≤128 under way)──► route:<id>
//! judge ──claim──► claimed ─► the local checks ─► accepted ─► push ─► task: ADD ─► totals ─► apply_shared
//!                  judged / unknown ─► 422 / 404       └ refused ─► put back
//!                  unavailable ─► the local checks alone
//! task, every REFRESH: read every arm's totals ─► apply_shared
//! ```

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use model_select::Evidence;
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::debug;

use super::{Issued, Learning, lock, parse_id};
use crate::GatewayError;
use crate::pools::callers::Caller;
use crate::shared::Shared;
use crate::shared::feedback::{self as backend, Claim};

/// How often every arm's shared totals are read.
const REFRESH: Duration = Duration::from_secs(1);
/// Accepted feedback waiting to be added to the shared totals at most; past it, it stays
/// this replica's own (counted).
const QUEUE: usize = 1024;
/// Additions sent together at most.
const BATCH: usize = 64;

/// This replica's side of the shared learning.
#[derive(Debug)]
pub(super) struct Sharing {
    shared: Arc<Shared>,
    /// Accepted feedback on its way to the shared totals.
    deltas: mpsc::Sender<Delta>,
}

/// What one accepted verdict or preference added to one arm here.
#[derive(Debug)]
struct Delta {
    decision: String,
    pool: String,
    quality: Option<f64>,
    evidence: Evidence,
}

// === impl Learning ===

impl Learning {
    /// Shares route ids and evidence with the other replicas through `shared` from now on, and
    /// starts the task that adds and reads the shared evidence (on the current tokio runtime;
    /// it ends with this `Learning`). False if it shares already.
    pub fn share(self: &Arc<Self>, shared: Arc<Shared>) -> bool {
        let (tx, rx) = mpsc::channel(QUEUE);
        let weak = Arc::downgrade(&shared);
        if self.sharing.set(Sharing { shared, deltas: tx }).is_err() {
            return false;
        }
        tokio::spawn(run(Arc::downgrade(self), weak, rx));
        true
    }

    /// Applies one feedback body from `caller` (`POST /v1/route/feedback`): sharing state, its
    /// route ids are claimed in the backend first, so a route given out by any replica is
    /// judged here, and once by all; the backend out of reach or late (its command deadline),
    /// this replica decides alone, as [`Learning::feedback_from`].
    pub async fn judge(&self, bytes: &[u8], caller: Option<[u8; 32]>) -> Result<Value, GatewayError> {
        let Some(sharing) = self.sharing.get() else { return self.feedback_from(bytes, caller) };
        let asked = self.read(bytes, caller)?;
        let texts = asked.ids();
        let ids: Option<Vec<u64>> = texts.iter().map(|t| parse_id(t)).collect();
        // Not an id, or one answer twice: nothing to claim, the local checks say why.
        let Some(ids) = ids.filter(|ids| !matches!(ids.as_slice(), [a, b] if a == b)) else {
            return self.apply(&asked, caller, &[]);
        };
        let held: Vec<bool> = ids.iter().map(|&id| self.holds(id, caller)).collect();
        let ttl = self.config.ttl;
        match backend::claim(&sharing.shared, &ids, caller.as_ref(), &held, ttl).await {
            Claim::Claimed(routes) => {
                let out = self.apply(&asked, caller, &routes);
                if out.is_err() {
                    // Refused here (the caller's weight, a pair of one pool): open for a later
                    // try; but one this replica judged while alone stays judged.
                    let (ids, routes): (Vec<u64>, Vec<_>) = {
                        let held = lock(&self.routes);
                        let open = |id: &u64| !held.map.get(id).is_some_and(|i| i.judged);
                        ids.iter().zip(routes).filter(|(id, _)| open(id)).map(|(id, r)| (*id, r)).unzip()
                    };
                    if !ids.is_empty() {
                        backend::put_back(&sharing.shared, &ids, &routes).await;
                    }
                }
                out
            }
            Claim::Judged(i) => {
                if let Some(issued) = lock(&self.routes).map.get_mut(&ids[i]) {
                    issued.judged = true;
                }
                Err(self.judged(asked.kind(), texts[i]))
            }
            Claim::Unknown(i) => Err(self.unknown(asked.kind(), texts[i])),
            Claim::Unavailable => self.apply(&asked, caller, &[]),
        }
    }

    /// Whether this replica holds route `id` for `caller`, in time for feedback (judged or not).
    fn holds(&self, id: u64, caller: Caller) -> bool {
        let now = Instant::now();
        lock(&self.routes)
            .map
            .get(&id)
            .is_some_and(|i| i.caller == caller && now.duration_since(i.at) <= self.config.ttl)
    }

    /// Writes route `id` to the backend (in the background), when sharing.
    pub(super) fn publish(&self, id: u64, route: &backend::Route) {
        if let Some(sharing) = self.sharing.get() {
            backend::write(&sharing.shared, id, route, self.config.ttl);
        }
    }

    /// Hands what accepted feedback added to each arm to the task that adds it to the shared
    /// totals, when sharing; past [`QUEUE`] waiting, it stays this replica's own (counted).
    pub(super) fn push(&self, moved: &[(&Issued, Evidence)]) {
        let Some(sharing) = self.sharing.get() else { return };
        for (issued, evidence) in moved {
            let delta = Delta {
                decision: issued.decision.clone(),
                pool: issued.pool.clone(),
                quality: issued.quality,
                evidence: *evidence,
            };
            if sharing.deltas.try_send(delta).is_err() {
                sharing.shared.counters.evidence_local.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Adds accepted feedback to the shared totals as it comes, and reads every arm's totals each
/// [`REFRESH`]; one task, so a reading never overtakes an addition of this replica's. Ends with
/// the `Learning` (or the shared state) dropped.
async fn run(learning: Weak<Learning>, shared: Weak<Shared>, mut deltas: mpsc::Receiver<Delta>) {
    let mut tick = tokio::time::interval(REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let why = loop {
        tokio::select! {
            d = deltas.recv() => {
                let Some(d) = d else { break "the learning was dropped" };
                let mut batch = vec![d];
                while batch.len() < BATCH && let Ok(d) = deltas.try_recv() {
                    batch.push(d);
                }
                let (Some(l), Some(s)) = (learning.upgrade(), shared.upgrade()) else { break "dropped" };
                add(&l, &s, batch).await;
            }
            _ = tick.tick() => {
                let (Some(l), Some(s)) = (learning.upgrade(), shared.upgrade()) else { break "dropped" };
                refresh(&l, &s).await;
            }
        }
    };
    debug!(why, "route feedback sharing ended");
}

/// Adds `batch` to the shared totals; each addition's totals replace the arm's shared part
/// (the addition itself was applied here already). One the backend did not take stays this
/// replica's own.
async fn add(learning: &Learning, shared: &Shared, batch: Vec<Delta>) {
    let max_arms = learning.config.max_arms;
    for d in batch {
        let arm = (d.decision.as_str(), d.pool.as_str(), d.quality);
        if let Some(totals) = backend::add(shared, arm, &d.evidence, max_arms).await {
            lock(&learning.outcomes).apply_shared(&d.decision, &d.pool, d.quality, d.evidence, Some(totals));
            learning.dirty.store(true, Ordering::Relaxed);
        }
    }
}

/// Reads every arm's shared totals into the evidence here; an arm with a shared part the
/// backend no longer has keeps it as this replica's own.
async fn refresh(learning: &Learning, shared: &Shared) {
    if !shared.is_up() {
        return;
    }
    let Some(all) = backend::read(shared, learning.config.max_arms).await else { return };
    let mut outcomes = lock(&learning.outcomes);
    let mut changed = false;
    let mut seen = HashSet::with_capacity(all.len());
    for t in &all {
        changed |= outcomes.apply_shared(&t.decision, &t.pool, t.quality, Evidence::default(), Some(t.evidence));
        seen.insert((t.decision.as_str(), t.pool.as_str()));
    }
    for (d, p) in outcomes.shared_arms() {
        if !seen.contains(&(d.as_str(), p.as_str())) {
            changed |= outcomes.apply_shared(&d, &p, None, Evidence::default(), None);
        }
    }
    drop(outcomes);
    if changed {
        learning.dirty.store(true, Ordering::Relaxed);
    }
}
