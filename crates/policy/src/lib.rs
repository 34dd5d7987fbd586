//! Worker selection: given the healthy candidates of one request (their load
//! and, for cache-aware routing, how many of the request's tokens each already
//! holds), pick one and say why. No I/O, no clocks, no index access: the
//! gateway gathers the inputs.
//!
//! Choosing and recording are two steps. [`Policy::select`] only reads, so
//! an explain endpoint (`/debug/route`) can ask as often as it likes;
//! [`Policy::commit`] records that a request really went to the chosen
//! worker (round robin's turn, the random stream, the approximate tree's
//! memory of what each worker was sent). Workers are named by their
//! [`WorkerId`], never by their position in a candidate list, so what a
//! policy learned of a worker stays with that worker while others come and
//! go; [`Policy::remove_worker`] says it left for good.

use router_types::WorkerId;

mod approx_tree;
mod cache_aware;
mod head_hash;
mod load;
mod min_ttft;
mod simple;
mod sticky;

pub use approx_tree::{ApproxTree, ApproxTreeConfig, ApproxTreePolicy, NODE_BYTES};
pub use cache_aware::{CacheAware, CacheAwareConfig};
pub use head_hash::{ENTRY_BYTES as HEAD_ENTRY_BYTES, Head, HeadHashConfig, HeadMap, heads};
pub use load::{ExpectedWait, LeastLoad, LoadMetric, PowerOfTwo};
pub use min_ttft::{MinTtft, MinTtftConfig};
pub use simple::{Draws, Random, RoundRobin, SplitMix};
pub use sticky::{Manual, by_key};

/// Router-side load of one worker (the fleet keeps it; the shared vocabulary holds the type).
pub use router_types::{Load, Warmup};

/// One healthy worker the request may go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// The worker (stable for its life in the fleet, never reused). Candidates
    /// may come in any order and be any subset of the fleet.
    pub worker: WorkerId,
    /// Its load.
    pub load: Load,
    /// Prompt tokens it already holds (cache-aware routing; 0 otherwise).
    pub matched_tokens: u64,
    /// Its KV events are followed, so `matched_tokens` is what it really
    /// holds; otherwise it is 0 and a policy may estimate (`cache_aware`
    /// asks its text tree).
    pub followed: bool,
    /// Where it is in its warm-up (cache_aware's warm-up slice; `Warm` for the others).
    pub warmup: Warmup,
    /// The KV-cache usage its engine last reported, in thousandths (`None`: no report).
    pub kv_usage: Option<u16>,
    /// Its engine's standing load report, with what this router sent it since (`None`: no
    /// report; the load policies' expected wait reads it).
    pub report: Option<Reported>,
}

/// What a worker's engine last reported of its queue and speed (over its data-parallel
/// ranks), with the requests this router sent it since that report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reported {
    /// Prompt tokens waiting in its queue, not cached (`num_waiting_uncached_tokens`).
    pub queued_tokens: u64,
    /// Requests waiting in its queue (`num_waiting_reqs`).
    pub waiting: u32,
    /// Tokens it generates a second (`gen_throughput`, rounded; 0: not reported).
    pub throughput: u32,
    /// Requests this router sent it since the report.
    pub sent: u32,
    /// Their uncached prompt tokens, of those the router counted.
    pub sent_tokens: u64,
    /// Those of them whose prompt the router did not count (no tokenizer).
    pub sent_unknown: u32,
}

/// Why a worker was chosen: a closed set, used as a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Next in turn.
    RoundRobin,
    /// Uniformly at random.
    Random,
    /// The less loaded of two random workers.
    PowerOfTwo,
    /// The least loaded worker.
    LeastLoad,
    /// The worker holding the longest cached prefix.
    CacheHit,
    /// A near-equal cache hit on a materially less loaded worker.
    CacheHitLessLoaded,
    /// cache_aware with a selection temperature: a hit drawn by the softmax of the hits' scores.
    CacheHitSampled,
    /// cache_aware: a worker whose events are not followed, chosen by the text tree's match.
    TextTreeHit,
    /// cache_aware with `--cache-index hash`: a worker whose events are not followed, holding
    /// the placement of the request's deepest head.
    HeadHashHit,
    /// No worker held enough of the prompt: power of two on load.
    NoCacheCandidate,
    /// Approximate tree: the worker whose past requests share the longest text prefix.
    TreeMatch,
    /// Approximate tree: no good match, the least loaded worker.
    TreeMiss,
    /// Approximate tree: the fleet is imbalanced, the least loaded worker.
    Imbalanced,
    /// The client's routing key (`x-smg-routing-key`) named the worker.
    RoutingKey,
    /// cache_aware: a cache miss given to a warming worker (the warm-up slice).
    Warmup,
    /// cache_aware: a cache hit diverted to a thin worker so it refills.
    WarmupDivert,
}

/// A choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// The chosen candidate's `worker`.
    pub worker: WorkerId,
    /// Why.
    pub reason: Reason,
}

/// Why no choice could be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// No healthy worker.
    #[error("no healthy worker")]
    NoCandidates,
    /// Every candidate's reported queue, with the requests sent since, is at
    /// `--least-load-max-waiting-requests`.
    #[error("every worker's waiting queue is at --least-load-max-waiting-requests")]
    AllAtWaitingCap,
}

/// What a policy may know of the request.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestInfo<'a> {
    /// Prompt tokens (0 when the router does not tokenize).
    pub input_tokens: u64,
    /// The prompt as text, for the approximate tree.
    pub text: Option<&'a str>,
    /// When it came, in milliseconds on the caller's monotonic clock: the text tree ages its
    /// placements by it (`ApproxTreeConfig::ttl_ms`). 0: no time known, nothing ages.
    pub at_ms: u64,
    /// The prompt's heads, when the policy hashes them ([`Policy::heads`]).
    pub heads: &'a [Head],
}

/// A selection rule, internally synchronized: `select` reads, `commit` and
/// `remove_worker` write.
///
/// Between the `select` and the `commit` of one request another thread may
/// select (at most one per serving thread); it then sees the state before
/// that commit, which costs a little spread, never correctness.
pub trait Policy: Send + Sync + std::fmt::Debug {
    /// The policy's name as given on the command line.
    fn name(&self) -> &'static str;
    /// Whether it needs the prompt's token count (`RequestInfo::input_tokens`),
    /// so the gateway must tokenize even without a KV index.
    fn needs_tokens(&self) -> bool {
        false
    }
    /// Whether it needs the prompt's text (`RequestInfo::text`).
    fn needs_text(&self) -> bool {
        false
    }
    /// The prompt's heads it matches by (`RequestInfo::heads`), hashed from its `tokens` once
    /// per request by the caller; none for the policies that keep no head map.
    fn heads(&self, tokens: &[u32]) -> Vec<Head> {
        let _ = tokens;
        Vec::new()
    }
    /// Picks one of `candidates` for `request`, changing nothing: any number
    /// of calls leave the policy as it was (no turn taken, no random draw
    /// used, nothing learned), so it also serves to explain a choice.
    fn select(&self, candidates: &[Candidate], request: &RequestInfo<'_>) -> Result<Decision, PolicyError>;
    /// Records that `request` really went to `decision.worker`, chosen by
    /// [`select`](Policy::select) among `candidates`: the next `select` sees
    /// the turn taken, the random draws used, the prompt learned. Call it
    /// once per request that is sent, right after `select`.
    fn commit(&self, decision: &Decision, candidates: &[Candidate], request: &RequestInfo<'_>) {
        let _ = (decision, candidates, request);
    }
    /// A notice from the fleet that `worker` left for good (ids are never
    /// reused): forget what was learned of it.
    fn remove_worker(&self, worker: WorkerId) {
        let _ = worker;
    }
    /// Bytes of what it learned that it holds now (a text tree's, within its bound); 0 for
    /// the policies that learn nothing of the prompts.
    fn held_bytes(&self) -> usize {
        0
    }
}

/// A candidate for the tests: `matched` prompt tokens cached and `owed`
/// uncached tokens in flight (one request per 1,000 of them).
#[cfg(test)]
pub(crate) fn test_candidate(worker: u32, matched: u64, owed: u64) -> Candidate {
    Candidate {
        worker: WorkerId(worker),
        load: Load { in_flight: (owed / 1000) as u32, uncached_tokens: owed },
        matched_tokens: matched,
        followed: true,
        warmup: Warmup::Warm,
        kv_usage: None,
        report: None,
    }
}

// === impl Reason ===

impl Reason {
    /// A stable label.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::RoundRobin => "round_robin",
            Reason::Random => "random",
            Reason::PowerOfTwo => "power_of_two",
            Reason::LeastLoad => "least_load",
            Reason::CacheHit => "cache_hit",
            Reason::CacheHitLessLoaded => "cache_hit_less_loaded",
            Reason::CacheHitSampled => "cache_hit_sampled",
            Reason::TextTreeHit => "text_tree_hit",
            Reason::HeadHashHit => "head_hash_hit",
            Reason::NoCacheCandidate => "no_cache_candidate",
            Reason::TreeMatch => "tree_match",
            Reason::TreeMiss => "tree_miss",
            Reason::Imbalanced => "imbalanced",
            Reason::RoutingKey => "routing_key",
            Reason::Warmup => "warmup",
            Reason::WarmupDivert => "warmup_divert",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
