//! The plan phase, pure and synchronous: which worker (or prefill/decode pair)
//! of a pool serves a request. A request's prompt rendered at most once per
//! renderer ([`Renders`]), its page hashes chained in the request's namespace
//! ([`namespace`]), matched against the KV index, the routable workers made
//! candidates with their load and cached prefix, the pool's policy choosing
//! ([`Plan`]); for a disaggregated pool a prefill worker by prefix and load and
//! a decode worker by load ([`Pair`]). No I/O and no `await`: the data plane,
//! the explain and preview routes and the trace simulator call the same code.
//!
//! What a plan reads besides its pool (the fleet, the index, the credit lock)
//! comes in one borrowed [`Planner`], so nothing here knows the gateway.

pub mod namespace;
mod pair;
mod pd;
mod plan;
mod pool;
mod regret;
mod render;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex};

use fleet::{Fleet, Worker};
use kv_index::KvIndex;

pub use h1_codec::Route;
pub use pair::{Pair, pair, pair_json};
pub use pd::{KvConnector, PdConfig, PdMode, SkipPrefill};
pub use plan::{Plan, Prompted, match_chains};
pub use pool::Pool;
pub use regret::{Cause, Regret};
pub use render::{PromptCounts, Rendered, Renders};

/// Why no plan could be made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// No routable worker (or none of a pair's two roles).
    #[error("no healthy worker")]
    NoWorker,
    /// Every worker it could use is overloaded, and such requests are shed (`--worker-overload-shed`).
    #[error("every worker is overloaded")]
    Overloaded,
    /// Every candidate's reported queue is at `--least-load-max-waiting-requests`: the request
    /// waits for a load report that frees one (SMG's admission queue).
    #[error("every worker's waiting queue is at --least-load-max-waiting-requests")]
    AtWaitingCap,
    /// The prompt could not be rendered (a malformed body, a template's refusal).
    #[error(transparent)]
    Render(#[from] renderer::RenderError),
}

/// What a plan reads beside its pool, borrowed for one request.
#[derive(Clone, Copy)]
pub struct Planner<'a> {
    /// The fleet's hash modes, page sizes and liveness vetoes.
    pub fleet: &'a Fleet,
    /// Every worker as this request sees the fleet: one snapshot per request, taken when its
    /// plan phase begins, read by every plan, pair and retry of it (a worker joining or
    /// leaving meanwhile never shows in half of them). Their state and load are read live.
    pub workers: &'a [Arc<Worker>],
    /// The KV index (`None`: no KV events followed, nothing matched).
    pub index: Option<&'a KvIndex>,
    /// The chosen worker is credited with the prompt's pages before another plan matches
    /// (`--credit-pending`).
    pub credit_pending: bool,
    /// Held by a crediting plan from its match to its credit: a burst sharing a cold prefix
    /// is not matched whole before any of it is credited.
    pub credit_lock: &'a Mutex<()>,
    /// What renders made (`router_prompt_renders_total`, `router_prompt_images_total`).
    pub counts: &'a PromptCounts,
    /// The only workers this request may go to (an endpoint picker's subset hint); `None`: any.
    pub only: Option<&'a Subset>,
    /// Told of every placement a plan makes, to share it with other router replicas
    /// (`--shared-state`); `None`: alone.
    pub placements: Option<&'a dyn Placements>,
    /// When the request is planned, in milliseconds on the router's monotonic clock (the text
    /// tree ages its placements by it); 0: no time, nothing ages (the benchmark simulator
    /// passes its simulated time).
    pub at_ms: u64,
}

/// What a plan tells the router replicas sharing its state: a request is placed on a worker.
pub trait Placements: Send + Sync {
    /// `worker` was chosen for a prompt of `uncached` tokens it does not hold; `pages` are the
    /// prompt's page hashes (the fleet's first hash mode) when the plan credited them to it
    /// as pending (`--credit-pending` with KV events), empty otherwise.
    fn placed(&self, worker: &Worker, pages: &[router_types::BlockHash], uncached: u64);
}

/// The workers a request is confined to, by their address (`host:port`, as a gateway names
/// its endpoints).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subset(pub std::collections::HashSet<String>);

impl Subset {
    /// Whether `worker` is one of them.
    pub fn allows(&self, worker: &Worker) -> bool {
        self.0.contains(authority(worker.url.as_str()))
    }
}

/// `host:port` of a worker's URL (`http://10.0.0.7:8000/` -> `10.0.0.7:8000`).
pub fn authority(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split(['/', '?']).next().unwrap_or(rest)
}

impl std::fmt::Debug for Planner<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Planner")
            .field("index", &self.index.is_some())
            .field("credit_pending", &self.credit_pending)
            .field("only", &self.only)
            .field("placements", &self.placements.is_some())
            .finish()
    }
}
