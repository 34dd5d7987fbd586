//! The priority scheduler (Shepherd Model Gateway 1.13's
//! `--priority-scheduler-*`): admission by class. A request's class comes from
//! its `x-smg-priority` header, clamped to its tenant's highest class (so a
//! client cannot raise itself), `default` without one. Each class reserves
//! slots of `--max-concurrent-requests` that lower classes may not take; a
//! request that finds no slot waits in its class's queue (bounded, with its
//! own timeout); a freed slot goes to the highest class waiting, unless a
//! lower one has waited past its starvation threshold. A class that may
//! preempt, finding its queue full, evicts the youngest waiter of the lowest
//! class below it: that request is answered 503 before any of it was sent
//! (`x-smg-preempted`, `Retry-After`). Everything is bounded: four classes,
//! each queue, and the tenants (those named in the configuration).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// A request's service class, lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    /// Batch jobs: preemptible by every other class.
    Bulk = 0,
    /// Unlabelled traffic.
    Default = 1,
    /// Latency-sensitive traffic.
    Interactive = 2,
    /// Internal traffic.
    System = 3,
}

impl Class {
    /// Every class, lowest first.
    pub const ALL: [Class; 4] = [Class::Bulk, Class::Default, Class::Interactive, Class::System];

    /// A header's class: case and surrounding blanks ignored; anything else is `default`.
    pub fn parse(value: &[u8]) -> Class {
        let v = value.trim_ascii();
        [Class::System, Class::Interactive, Class::Bulk]
            .into_iter()
            .find(|c| v.eq_ignore_ascii_case(c.as_str().as_bytes()))
            .unwrap_or(Class::Default)
    }

    /// A Gateway API Inference Extension `InferenceObjective`'s priority as a class: below 0
    /// (sheddable) `bulk`, 0 (the default) `default`, above 0 `interactive`. `system` stays
    /// the router's own (`x-smg-priority: system`).
    pub fn of_objective_priority(priority: i64) -> Class {
        match priority {
            ..0 => Class::Bulk,
            0 => Class::Default,
            _ => Class::Interactive,
        }
    }

    /// Its name (a metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Bulk => "bulk",
            Class::Default => "default",
            Class::Interactive => "interactive",
            Class::System => "system",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One class's admission (SMG's YAML `classes.<class>` fields).
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassConfig {
    /// Slots reserved for this class and above, at least.
    pub reserved_floor: u32,
    /// ...or this share of `--max-concurrent-requests`, if more.
    #[serde(default)]
    pub reserved_per_slot: f64,
    /// Requests of this class that may wait.
    pub queue_size: u32,
    /// How long one may wait (408 after).
    pub queue_timeout_secs: u64,
    /// A waiter this old is served before higher classes.
    pub starvation_threshold_secs: u64,
    /// Finding its queue full, it evicts the youngest waiter of a lower class.
    pub can_preempt: bool,
}

impl ClassConfig {
    /// SMG 1.13's built-in defaults.
    pub fn default_for(class: Class) -> Self {
        let (reserved_floor, reserved_per_slot, queue_size, queue_timeout_secs, starvation_threshold_secs, can_preempt) =
            match class {
                Class::System => (32, 0.0, 64, 30, 5, true),
                Class::Interactive => (128, 0.25, 256, 30, 5, true),
                Class::Default => (0, 0.10, 512, 60, 30, false),
                Class::Bulk => (0, 0.0, 1024, 300, 120, false),
            };
        Self {
            reserved_floor,
            reserved_per_slot,
            queue_size,
            queue_timeout_secs,
            starvation_threshold_secs,
            can_preempt,
        }
    }
}

/// The scheduler's configuration (`--priority-scheduler-*` and its YAML file).
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    /// Each class's, by [`Class`] order.
    pub classes: [ClassConfig; 4],
    /// The highest class of a tenant not in `tenant_max_class` (and of requests without one).
    pub default_max_class: Class,
    /// Each named tenant's highest class.
    pub tenant_max_class: HashMap<String, Class>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            classes: Class::ALL.map(ClassConfig::default_for),
            default_max_class: Class::Default,
            tenant_max_class: HashMap::new(),
        }
    }
}

/// Who a request's tenant is: the trusted header's value (`--trust-tenant-header`,
/// `--tenant-header-name`), else the tenant whose key the client presented
/// (`--tenant-api-key TENANT:KEY`), else none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tenants {
    /// The header a trusted front sets the tenant in (lowercase), when trusted.
    pub trusted_header: Option<String>,
    /// Each tenant's key, as `Authorization: Bearer KEY` arrives.
    pub by_key: HashMap<Vec<u8>, String>,
}

/// Longest tenant id taken from a header (longer: no tenant).
pub const MAX_TENANT_BYTES: usize = 128;

impl Tenants {
    /// The tenant of a request with the trusted header's value `header` and `authorization`: the
    /// header's (when trusted), else the one whose key it presented.
    pub fn tenant<'a>(&'a self, header: Option<&'a [u8]>, authorization: Option<&[u8]>) -> Option<Tenant<'a>> {
        let trusted = header.filter(|_| self.trusted_header.is_some()).map(<[u8]>::trim_ascii);
        let trusted = trusted.filter(|t| !t.is_empty() && t.len() <= MAX_TENANT_BYTES);
        match trusted.and_then(|t| std::str::from_utf8(t).ok()) {
            Some(t) => Some(Tenant::Header(t)),
            None => authorization.and_then(|a| self.by_key.get(a.trim_ascii())).map(|t| Tenant::Key(t)),
        }
    }
}

/// A request's tenant, and where its name came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tenant<'a> {
    /// The trusted tenant header.
    Header(&'a str),
    /// A `--tenant-api-key` the client presented.
    Key(&'a str),
}

impl<'a> Tenant<'a> {
    /// Its name (the scheduler's `tenant_policies` key).
    pub fn name(self) -> &'a str {
        match self {
            Tenant::Header(t) | Tenant::Key(t) => t,
        }
    }

    /// The rate limits' key of `tenant` (SMG's canonical forms): `header:ID`, `auth:ID`, `anonymous`.
    pub fn key(tenant: Option<Self>) -> String {
        match tenant {
            Some(Tenant::Header(t)) => format!("header:{t}"),
            Some(Tenant::Key(t)) => format!("auth:{t}"),
            None => "anonymous".to_string(),
        }
    }
}

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Its class's queue is full and it may evict no one.
    QueueFull(Class),
    /// It waited its class's whole timeout.
    Timeout(Class, Duration),
    /// A higher class evicted it from the queue.
    Preempted(Class),
}

/// What a waiter is told.
enum Grant {
    Slot,
    Preempted,
}

struct Waiter {
    id: u64,
    since: Instant,
    tx: oneshot::Sender<Grant>,
}

#[derive(Default)]
struct State {
    in_flight: [usize; 4],
    total: usize,
    queues: [VecDeque<Waiter>; 4],
    next_id: u64,
}

/// Per-class counters.
#[derive(Debug, Default)]
pub struct ClassCounters {
    /// Admitted.
    pub admitted: AtomicU64,
    /// Evicted from the queue by a higher class.
    pub preempted: AtomicU64,
    /// Refused: the queue full.
    pub queue_full: AtomicU64,
    /// Waited their whole timeout.
    pub timeouts: AtomicU64,
}

/// The scheduler.
pub struct Scheduler {
    config: SchedulerConfig,
    capacity: usize,
    /// Slots each class reserves (for itself and above), clamped to the capacity by priority.
    reserved: [usize; 4],
    state: Mutex<State>,
    /// Counters, by [`Class`] order.
    pub counters: [ClassCounters; 4],
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler").field("capacity", &self.capacity).field("reserved", &self.reserved).finish()
    }
}

/// A slot held, given back on drop.
pub struct Slot {
    sched: Arc<Scheduler>,
    class: Class,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").field("class", &self.class).finish()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut st = self.sched.lock();
        st.in_flight[self.class.index()] -= 1;
        st.total -= 1;
        self.sched.dispatch(&mut st);
    }
}

impl Scheduler {
    /// A scheduler of `capacity` slots (`--max-concurrent-requests`).
    pub fn new(config: SchedulerConfig, capacity: usize) -> Self {
        // Highest class first, so a small capacity goes to the highest reservations; at least one
        // slot is left that any class may take.
        let mut left = capacity.saturating_sub(1);
        let mut reserved = [0usize; 4];
        for class in Class::ALL.into_iter().rev() {
            let c = &config.classes[class.index()];
            let share = (c.reserved_per_slot.max(0.0) * capacity as f64).ceil() as usize;
            let want = (c.reserved_floor as usize).max(share);
            reserved[class.index()] = want.min(left);
            left -= reserved[class.index()];
        }
        Self { config, capacity, reserved, state: Mutex::new(State::default()), counters: Default::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request's class: its header's (`default` without one), at most its tenant's highest.
    pub fn class_of(&self, header: Option<&[u8]>, tenant: Option<&str>) -> Class {
        let asked = header.map_or(Class::Default, Class::parse);
        let max = tenant.and_then(|t| self.config.tenant_max_class.get(t)).copied();
        asked.min(max.unwrap_or(self.config.default_max_class))
    }

    /// Slots each class reserves, by [`Class`] order.
    pub fn reserved(&self) -> [usize; 4] {
        self.reserved
    }

    /// Requests in flight and waiting, by [`Class`] order.
    pub fn occupancy(&self) -> ([usize; 4], [usize; 4]) {
        let st = self.lock();
        (st.in_flight, st.queues.each_ref().map(VecDeque::len))
    }

    /// Whether a request of `class` may take a slot now: one is free beyond the higher
    /// classes' reservations they do not use.
    fn admissible(&self, st: &State, class: Class) -> bool {
        let held_back: usize = Class::ALL[class.index() + 1..]
            .iter()
            .map(|k| self.reserved[k.index()].saturating_sub(st.in_flight[k.index()]))
            .sum();
        st.total.saturating_add(held_back) < self.capacity
    }

    fn take(&self, st: &mut State, class: Class) {
        st.in_flight[class.index()] += 1;
        st.total += 1;
        self.counters[class.index()].admitted.fetch_add(1, Ordering::Relaxed);
    }

    /// Gives freed slots to waiters: the oldest starving one first, then the highest class.
    fn dispatch(&self, st: &mut State) {
        loop {
            let now = Instant::now();
            let starving = Class::ALL
                .into_iter()
                .filter(|c| {
                    let limit = Duration::from_secs(self.config.classes[c.index()].starvation_threshold_secs);
                    st.queues[c.index()].front().is_some_and(|w| now.duration_since(w.since) >= limit)
                })
                .min_by_key(|c| st.queues[c.index()].front().map(|w| w.since));
            let by_rank = Class::ALL.into_iter().rev().filter(|c| !st.queues[c.index()].is_empty());
            let Some(class) = starving.into_iter().chain(by_rank).find(|c| self.admissible(st, *c)) else { return };
            let Some(w) = st.queues[class.index()].pop_front() else { return };
            self.take(st, class);
            if w.tx.send(Grant::Slot).is_err() {
                // Its request went away meanwhile: the slot is free again.
                st.in_flight[class.index()] -= 1;
                st.total -= 1;
            }
        }
    }

    /// Admits a request of `class`, waiting in its queue when no slot may be taken.
    pub async fn admit(self: &Arc<Self>, class: Class) -> Result<Slot, Refused> {
        let cfg = self.config.classes[class.index()];
        let (id, rx) = {
            let mut st = self.lock();
            let nobody_ahead = Class::ALL[class.index()..].iter().all(|c| st.queues[c.index()].is_empty());
            if nobody_ahead && self.admissible(&st, class) {
                self.take(&mut st, class);
                return Ok(Slot { sched: self.clone(), class });
            }
            if st.queues[class.index()].len() >= cfg.queue_size as usize && !self.preempt_below(&mut st, class) {
                self.counters[class.index()].queue_full.fetch_add(1, Ordering::Relaxed);
                return Err(Refused::QueueFull(class));
            }
            let (tx, rx) = oneshot::channel();
            st.next_id += 1;
            let id = st.next_id;
            st.queues[class.index()].push_back(Waiter { id, since: Instant::now(), tx });
            (id, rx)
        };
        let timeout = Duration::from_secs(cfg.queue_timeout_secs.max(1));
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(Grant::Slot)) => Ok(Slot { sched: self.clone(), class }),
            Ok(Ok(Grant::Preempted)) | Ok(Err(_)) => Err(Refused::Preempted(class)),
            Err(_) => {
                let mut st = self.lock();
                let queue = &mut st.queues[class.index()];
                match queue.iter().position(|w| w.id == id) {
                    Some(at) => {
                        queue.remove(at);
                        self.counters[class.index()].timeouts.fetch_add(1, Ordering::Relaxed);
                        Err(Refused::Timeout(class, timeout))
                    }
                    // Granted as the timeout struck: the slot is ours.
                    None => Ok(Slot { sched: self.clone(), class }),
                }
            }
        }
    }

    /// Evicts the youngest waiter of the lowest class below `class`, if `class` may preempt.
    fn preempt_below(&self, st: &mut State, class: Class) -> bool {
        if !self.config.classes[class.index()].can_preempt {
            return false;
        }
        let Some(lower) = Class::ALL[..class.index()].iter().find(|c| !st.queues[c.index()].is_empty()) else {
            return false;
        };
        let Some(w) = st.queues[lower.index()].pop_back() else { return false };
        self.counters[lower.index()].preempted.fetch_add(1, Ordering::Relaxed);
        let _ = w.tx.send(Grant::Preempted);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(queue: u32) -> SchedulerConfig {
        let mut c = SchedulerConfig::default();
        for class in Class::ALL {
            c.classes[class.index()] = ClassConfig {
                reserved_floor: 0,
                reserved_per_slot: 0.0,
                queue_size: queue,
                queue_timeout_secs: 5,
                starvation_threshold_secs: 60,
                can_preempt: class >= Class::Interactive,
            };
        }
        c.default_max_class = Class::System;
        c
    }

    #[test]
    fn classes_come_from_the_header_clamped_to_the_tenants_highest() {
        let mut c = config(1);
        c.default_max_class = Class::Default;
        c.tenant_max_class.insert("ops".into(), Class::System);
        let s = Scheduler::new(c, 4);
        assert_eq!(s.class_of(Some(b" Interactive "), None), Class::Default, "clamped to the default max");
        assert_eq!(s.class_of(Some(b"bulk"), None), Class::Bulk);
        assert_eq!(s.class_of(Some(b"system"), Some("ops")), Class::System);
        assert_eq!(s.class_of(Some(b"urgent"), Some("ops")), Class::Default, "unknown: default");
        assert_eq!(s.class_of(None, Some("nobody")), Class::Default);
    }

    #[test]
    fn reservations_are_clamped_by_priority_and_leave_one_slot_to_all() {
        let s = Scheduler::new(SchedulerConfig::default(), 4096);
        assert_eq!(s.reserved(), [0, 410, 1024, 32]);
        let s = Scheduler::new(SchedulerConfig::default(), 4);
        assert_eq!(s.reserved(), [0, 0, 0, 3], "system first; one slot any class may take");
    }

    #[tokio::test]
    async fn a_freed_slot_goes_to_the_highest_class_waiting_and_a_full_queue_preempts_the_lowest() {
        let s = Arc::new(Scheduler::new(config(1), 1));
        let admit = |class| {
            let s = s.clone();
            tokio::spawn(async move { s.admit(class).await.map(|slot| slot.class) })
        };
        let held = s.admit(Class::Bulk).await.unwrap();
        let waits_for = |want: [usize; 4]| {
            let s = s.clone();
            async move {
                while s.occupancy().1 != want {
                    tokio::task::yield_now().await;
                }
            }
        };
        let bulk = admit(Class::Bulk);
        waits_for([1, 0, 0, 0]).await;
        let default = admit(Class::Default);
        waits_for([1, 1, 0, 0]).await;
        let first = admit(Class::Interactive);
        waits_for([1, 1, 1, 0]).await;
        // The interactive queue is full: the next one evicts the youngest waiter of the lowest class.
        let second = admit(Class::Interactive);
        assert_eq!(bulk.await.unwrap(), Err(Refused::Preempted(Class::Bulk)));
        waits_for([0, 1, 2, 0]).await;
        // A default request finds its queue full and may not preempt.
        assert_eq!(s.admit(Class::Default).await.err(), Some(Refused::QueueFull(Class::Default)));
        // Freed slots go to the interactive ones first, in order, then to the default one.
        drop(held);
        assert_eq!(first.await.unwrap(), Ok(Class::Interactive));
        assert_eq!(second.await.unwrap(), Ok(Class::Interactive));
        assert_eq!(default.await.unwrap(), Ok(Class::Default));
        assert_eq!(s.occupancy(), ([0; 4], [0; 4]));
        let preempted = s.counters[Class::Bulk.index()].preempted.load(Ordering::Relaxed);
        assert_eq!(preempted, 1);
    }

    #[tokio::test]
    async fn a_lower_class_may_not_take_a_slot_a_higher_one_reserves() {
        let mut c = config(4);
        c.classes[Class::Interactive.index()].reserved_floor = 1;
        let s = Arc::new(Scheduler::new(c, 2));
        let bulk = s.admit(Class::Bulk).await.unwrap();
        // One slot left, reserved for interactive: a bulk request waits, an interactive one does not.
        let s2 = s.clone();
        let waiting = tokio::spawn(async move { s2.admit(Class::Bulk).await.map(|slot| slot.class) });
        while s.occupancy().1 != [1, 0, 0, 0] {
            tokio::task::yield_now().await;
        }
        let interactive = s.admit(Class::Interactive).await.unwrap();
        assert_eq!(s.occupancy().0, [1, 0, 1, 0]);
        drop(interactive);
        // The reservation is free again, but still the interactive class's: the bulk waiter gets the
        // slot the first bulk request frees.
        assert_eq!(s.occupancy().1, [1, 0, 0, 0]);
        drop(bulk);
        assert_eq!(waiting.await.unwrap(), Ok(Class::Bulk));
    }
}
