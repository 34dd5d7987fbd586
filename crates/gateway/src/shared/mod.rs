//! State shared with the other router replicas through a Redis-protocol backend (Valkey or
//! Redis, `--shared-state`): owns the backend's handle, this replica's id, the keys' prefix,
//! and what the replicas tell each other of their placements and loads ([`placements`]),
//! the response cache's shared answers ([`answers`]), the tenants' shared buckets
//! ([`tenants`]) and route feedback: route ids, their claims and every arm's evidence
//! ([`feedback`]). Nothing here ever holds a request beyond the backend's command deadline:
//! with the backend gone every replica routes alone, and says so.

pub(crate) mod answers;
pub(crate) mod feedback;
mod placements;
pub(crate) mod tenants;
mod wire;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use fleet::{Fleet, Worker};
use kv_index::KvIndex;
use router_types::BlockHash;
use shared_state::Backend;
use tokio::sync::mpsc;

use crate::metrics::head;

/// Background writes under way at most (answers, their vectors, route ids); past it a write
/// is skipped (counted by its kind).
const MAX_WRITES: usize = 128;
/// Placements queued for the publisher at most; past it they are dropped (counted).
const QUEUE: usize = 4096;
/// Largest placements message read (or written: a batch stops short of it).
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;
/// Pages queued for the publisher at most (2 MiB of hashes); past it a placement goes without
/// its pages (its load still counts).
const MAX_QUEUED_PAGES: usize = 1 << 18;

/// How the replicas share state.
#[derive(Debug, Clone)]
pub struct SharedConfig {
    /// Where the backend is.
    pub target: shared_state::Target,
    /// Its deadlines and bounds (the placements' subscription reads messages of at most
    /// [`MAX_MESSAGE_BYTES`] whatever they say).
    pub options: shared_state::Options,
    /// Every key and channel starts with it (`--shared-state-prefix`): routers of one
    /// deployment share one, and nothing with another's.
    pub prefix: String,
}

/// This replica's side of the shared state.
pub struct Shared {
    backend: Backend,
    prefix: String,
    /// This replica (random at start): its own messages are recognised and skipped.
    replica: u64,
    /// Placements on their way to the publisher.
    queue: mpsc::Sender<wire::Placement>,
    /// The other replicas, as last heard.
    remote: Mutex<placements::Remote>,
    /// The other replicas heard from lately, as the follower last counted them (read per
    /// request by the rate limit's share).
    live_peers: std::sync::atomic::AtomicU32,
    /// Pages in the placements queued now (at most [`MAX_QUEUED_PAGES`]).
    queued_pages: std::sync::atomic::AtomicUsize,
    pub(crate) counters: Counters,
}

/// What the shared state did, for `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) messages_sent: AtomicU64,
    pub(crate) messages_received: AtomicU64,
    /// Messages that could not be sent (backend down, or an error).
    pub(crate) messages_unsent: AtomicU64,
    /// Received messages refused as malformed.
    pub(crate) messages_bad: AtomicU64,
    pub(crate) placements_sent: AtomicU64,
    pub(crate) placements_dropped: AtomicU64,
    pub(crate) placements_applied: AtomicU64,
    pub(crate) cache_hits: AtomicU64,
    /// Semantic hits: a similar question's answer another replica kept.
    pub(crate) cache_semantic_hits: AtomicU64,
    pub(crate) cache_misses: AtomicU64,
    /// Stored answers that failed their integrity check.
    pub(crate) cache_corrupt: AtomicU64,
    pub(crate) cache_errors: AtomicU64,
    pub(crate) cache_stores: AtomicU64,
    /// Background writes under way now (at most [`MAX_WRITES`]).
    pub(crate) writes: std::sync::atomic::AtomicUsize,
    /// Tenant charges decided by the backend, and by the local buckets instead.
    pub(crate) tenant_shared: AtomicU64,
    pub(crate) tenant_local: AtomicU64,
    pub(crate) routes_written: AtomicU64,
    /// Route ids not written (the backend out of reach or failing, a name too long, or too
    /// many writes under way): their feedback is taken by this replica only.
    pub(crate) routes_unwritten: AtomicU64,
    /// Feedback claims in the backend, by what they found.
    pub(crate) claims_claimed: AtomicU64,
    pub(crate) claims_judged: AtomicU64,
    pub(crate) claims_unknown: AtomicU64,
    pub(crate) claims_local: AtomicU64,
    /// Claims undone because this replica refused the feedback after all, and failed undos.
    pub(crate) claims_returned: AtomicU64,
    pub(crate) claims_unreturned: AtomicU64,
    /// Accepted feedback added to the shared evidence, or kept by this replica only.
    pub(crate) evidence_shared: AtomicU64,
    pub(crate) evidence_local: AtomicU64,
    /// Readings of every arm's shared evidence, and those that failed.
    pub(crate) arm_refreshes: AtomicU64,
    pub(crate) arm_refresh_failures: AtomicU64,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("prefix", &self.prefix).field("replica", &self.replica).finish()
    }
}

impl Shared {
    /// Starts sharing: the publisher of this replica's placements and loads, and the
    /// follower of the others' (applied to `fleet`'s loads and `index`'s pending credits).
    /// On the current tokio runtime; the tasks end with the backend's handle dropped.
    pub fn start(config: SharedConfig, fleet: Arc<Fleet>, index: Option<Arc<KvIndex>>) -> Arc<Shared> {
        let (queue, rx) = mpsc::channel(QUEUE);
        let subscriber = shared_state::Options { max_reply_bytes: MAX_MESSAGE_BYTES, ..config.options.clone() };
        let subscriber = Backend::start(config.target.clone(), subscriber);
        let backend = Backend::start(config.target, config.options);
        let replica = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
        let shared = Arc::new(Shared {
            backend,
            prefix: config.prefix,
            replica,
            queue,
            remote: Mutex::new(placements::Remote::default()),
            queued_pages: std::sync::atomic::AtomicUsize::new(0),
            live_peers: std::sync::atomic::AtomicU32::new(0),
            counters: Counters::default(),
        });
        tokio::spawn(placements::publish(Arc::downgrade(&shared), fleet.clone(), rx));
        tokio::spawn(placements::follow(Arc::downgrade(&shared), subscriber, fleet, index));
        shared
    }

    /// Whether the backend is reachable now (otherwise this replica routes alone).
    pub fn is_up(&self) -> bool {
        self.backend.is_up()
    }

    /// Sends `args` in the background, never awaited by the caller: false (nothing sent) with
    /// the backend out of reach or [`MAX_WRITES`] already under way. `done` is told, once the
    /// backend answered (or not), whether the reply was one `ok` takes.
    pub(crate) fn write_behind(
        self: &Arc<Self>,
        args: Vec<Vec<u8>>,
        ok: fn(&shared_state::Reply) -> bool,
        done: fn(&Counters, bool),
    ) -> bool {
        let writes = &self.counters.writes;
        if !self.is_up() {
            return false;
        }
        if writes.fetch_add(1, Ordering::Relaxed) >= MAX_WRITES {
            writes.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        let shared = self.clone();
        tokio::spawn(async move {
            let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            let r = shared.backend.cmd(&args).await;
            shared.counters.writes.fetch_sub(1, Ordering::Relaxed);
            done(&shared.counters, r.as_ref().is_ok_and(ok));
        });
        true
    }

    /// A placement taken off the queue: its pages no longer count against the bound.
    fn dequeued(&self, placement: &wire::Placement) {
        self.queued_pages.fetch_sub(placement.pages.len(), Ordering::Relaxed);
    }

    /// Records how many other replicas were heard from lately.
    fn set_live_peers(&self, n: usize) {
        self.live_peers.store(n.min(u32::MAX as usize) as u32, Ordering::Relaxed);
    }

    /// `PREFIX:KIND:ID`.
    pub(crate) fn key(&self, kind: &str, id: &str) -> Vec<u8> {
        format!("{}:{kind}:{id}", self.prefix).into_bytes()
    }

    /// The other replicas heard from lately (the backend out of reach: none), without a lock.
    pub fn live_peers(&self) -> u32 {
        if self.is_up() { self.live_peers.load(Ordering::Relaxed) } else { 0 }
    }

    /// Its part of `/readiness`'s details (never a reason to be unready).
    pub(crate) fn readiness(&self) -> serde_json::Value {
        serde_json::json!({"up": self.is_up(), "replicas": self.live_peers()})
    }

    /// Its series, for `/metrics`.
    pub(crate) fn render_metrics(&self, out: &mut String) {
        let c = &self.counters;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        head(out, "router_shared_state_up", "gauge", "Whether the shared-state backend is reachable (--shared-state).");
        let _ = writeln!(out, "router_shared_state_up {}", u8::from(self.is_up()));
        head(out, "router_shared_state_replicas", "gauge", "Other router replicas heard from in the last seconds.");
        let _ = writeln!(out, "router_shared_state_replicas {}", self.live_peers());
        let stats = self.backend.stats();
        head(out, "router_shared_state_commands_total", "counter", "Commands sent to the backend.");
        let _ = writeln!(out, "router_shared_state_commands_total {}", stats.commands);
        labeled(
            out,
            ("router_shared_state_command_errors_total", "Commands to the backend that failed, by why."),
            "error",
            &[
                ("down", stats.errors_down),
                ("timeout", stats.errors_timeout),
                ("busy", stats.errors_busy),
                ("protocol", stats.errors_protocol),
                ("io", stats.errors_io),
            ],
        );
        head(out, "router_shared_state_connects_total", "counter", "Connections made to the backend.");
        let _ = writeln!(out, "router_shared_state_connects_total {}", stats.connects);
        by_outcome(
            out,
            ("router_shared_state_messages_total", "Placement messages between replicas, by outcome."),
            &[
                ("sent", n(&c.messages_sent)),
                ("received", n(&c.messages_received)),
                ("unsent", n(&c.messages_unsent)),
                ("malformed", n(&c.messages_bad)),
                ("dropped", stats.pubsub_dropped),
            ],
        );
        by_outcome(
            out,
            (
                "router_shared_state_placements_total",
                "Placements shared with the other replicas (sent, dropped unsent) and theirs applied here.",
            ),
            &[
                ("sent", n(&c.placements_sent)),
                ("dropped", n(&c.placements_dropped)),
                ("applied", n(&c.placements_applied)),
            ],
        );
        by_outcome(
            out,
            (
                "router_shared_cache_total",
                "The response cache's shared answers: lookups after a local miss by outcome, and stores.",
            ),
            &[
                ("hit", n(&c.cache_hits)),
                ("hit_semantic", n(&c.cache_semantic_hits)),
                ("miss", n(&c.cache_misses)),
                ("corrupt", n(&c.cache_corrupt)),
                ("error", n(&c.cache_errors)),
                ("stored", n(&c.cache_stores)),
            ],
        );
        labeled(
            out,
            (
                "router_shared_tenant_charges_total",
                "Tenant rate-limit charges, by where they were decided (shared: the backend; local: this replica, the backend out of reach).",
            ),
            "decided",
            &[("shared", n(&c.tenant_shared)), ("local", n(&c.tenant_local))],
        );
        self.render_feedback(out);
    }

    /// Route feedback's series.
    fn render_feedback(&self, out: &mut String) {
        let c = &self.counters;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        by_outcome(
            out,
            (
                "router_shared_route_ids_total",
                "Route ids (x-route-id) written to the backend, so that any replica takes their feedback, or not (kept by this replica only).",
            ),
            &[("written", n(&c.routes_written)), ("unwritten", n(&c.routes_unwritten))],
        );
        by_outcome(
            out,
            (
                "router_shared_route_claims_total",
                "Feedback's route ids claimed in the backend, by what the claim found (local_fallback: the backend out of reach or late, this replica decided alone; returned: undone after this replica refused the feedback).",
            ),
            &[
                ("claimed", n(&c.claims_claimed)),
                ("judged_elsewhere", n(&c.claims_judged)),
                ("unknown", n(&c.claims_unknown)),
                ("local_fallback", n(&c.claims_local)),
                ("returned", n(&c.claims_returned)),
                ("unreturned", n(&c.claims_unreturned)),
            ],
        );
        by_outcome(
            out,
            (
                "router_shared_feedback_evidence_total",
                "Accepted feedback added to its arm's shared evidence, or kept by this replica only (the backend out of reach or failing, or the queue full).",
            ),
            &[("shared", n(&c.evidence_shared)), ("local", n(&c.evidence_local))],
        );
        by_outcome(
            out,
            (
                "router_shared_arm_refreshes_total",
                "Readings of every arm's shared evidence into this replica's bandit (every second), and those that failed.",
            ),
            &[("ok", n(&c.arm_refreshes)), ("failed", n(&c.arm_refresh_failures))],
        );
    }
}

/// One counter `name` by `outcome`.
fn by_outcome(out: &mut String, series: (&str, &str), values: &[(&str, u64)]) {
    labeled(out, series, "outcome", values);
}

/// One counter `name` by its one `label`.
fn labeled(out: &mut String, (name, help): (&str, &str), label: &str, values: &[(&str, u64)]) {
    head(out, name, "counter", help);
    for (value, v) in values {
        let _ = writeln!(out, "{name}{{{label}=\"{value}\"}} {v}");
    }
}

impl planner::Placements for Shared {
    fn placed(&self, worker: &Worker, pages: &[BlockHash], uncached: u64) {
        if !self.is_up() {
            return;
        }
        let mut n = pages.len().min(wire::MAX_PAGES);
        if self.queued_pages.fetch_add(n, Ordering::Relaxed) + n > MAX_QUEUED_PAGES {
            self.queued_pages.fetch_sub(n, Ordering::Relaxed);
            n = 0;
        }
        let placement =
            wire::Placement { url: worker.url.to_string(), requests: 1, uncached, pages: pages[..n].to_vec() };
        if let Err(e) = self.queue.try_send(placement) {
            self.queued_pages.fetch_sub(e.into_inner().pages.len(), Ordering::Relaxed);
            self.counters.placements_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A TTL as the backend's `PX` takes it: milliseconds, at least 1.
pub(crate) fn ttl_ms(ttl: std::time::Duration) -> Vec<u8> {
    ttl.as_millis().max(1).to_string().into_bytes()
}

/// Workers by URL, as the messages name them.
fn by_url(fleet: &Fleet) -> HashMap<String, Arc<Worker>> {
    fleet.snapshot().iter().map(|w| (w.url.to_string(), w.clone())).collect()
}
