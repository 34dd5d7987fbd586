//! Where a retry goes: the next worker of the pool for a request whose
//! worker could not serve it, by load, over the same transport (HTTP or gRPC).

use std::sync::Arc;

use fleet::Worker;

use crate::Gateway;

/// The worker of `pool` a retry after `current` goes to, among the request's `snapshot` of the fleet: the least loaded
/// routable one tried neither now nor before (one no liveness veto leaves out
/// first), else the least loaded routable one (a retry may go back to a worker).
pub(crate) fn next_worker(
    gw: &Gateway,
    snapshot: &[Arc<Worker>],
    pool: &planner::Pool,
    current: &Worker,
    tried: &[router_types::WorkerId],
) -> Option<Arc<Worker>> {
    // Over the same transport: an HTTP request's body is no gRPC worker's, and back.
    let grpc = current.engine().is_some();
    let routable = || snapshot.iter().filter(|w| w.is_routable() && pool.serves(w) && w.engine().is_some() == grpc);
    let by_load = |w: &&Arc<Worker>| (w.load().in_flight, w.load().uncached_tokens);
    let fresh = || routable().filter(|w| w.id != current.id && !tried.contains(&w.id));
    // A worker the liveness vetoes leave out is tried last.
    let clear = |w: &&Arc<Worker>| w.veto(gw.fleet.liveness()).is_none();
    fresh()
        .filter(clear)
        .min_by_key(by_load)
        .or_else(|| fresh().min_by_key(by_load))
        .or_else(|| routable().min_by_key(by_load))
        .cloned()
}
