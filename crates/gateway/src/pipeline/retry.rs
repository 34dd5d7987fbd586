//! The dispatch phase's one retry loop (`--retry-*`): every dispatcher (one
//! worker over HTTP, one over gRPC, a prefill/decode pair) makes its attempts
//! through [`run`], which says whether another is due, waits its backoff and
//! moves it on; and where a single worker's retry goes ([`next_worker`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use fleet::Worker;
use router_types::WorkerId;

use crate::{Gateway, RetryConfig};

/// How one mode sends a request: what an attempt goes to, and what it comes to.
pub(crate) trait Dispatch {
    /// Where an attempt goes: a worker, or a prefill/decode pair.
    type Target;
    /// An attempt that ends the request (its answer goes to the client).
    type Answer;
    /// An attempt that may be made again elsewhere.
    type Failure;

    /// One attempt on `to`.
    async fn attempt(&mut self, to: &Self::Target) -> Result<Self::Answer, Self::Failure>;

    /// Whether `failure` may be tried again: nothing of it reached the client, and sending
    /// the request again cannot do it twice.
    fn retryable(&self, failure: &Self::Failure) -> bool;

    /// The worker `failure` failed on (a pair's failing leg): a retry avoids it.
    fn failed_on(&self, on: &Self::Target, failure: &Self::Failure) -> WorkerId;

    /// Where the next attempt goes after `on`, avoiding the workers `tried` when it can;
    /// `None`: nowhere.
    fn next(&mut self, on: &Self::Target, tried: &[WorkerId]) -> Option<Self::Target>;

    /// The request moves from `from`, which failed with `failure` on attempt `attempt`, to
    /// `to`: the load charge, the policy and the decision record follow it.
    fn moving(&mut self, failure: Self::Failure, from: &Self::Target, to: &Self::Target, attempt: u32);
}

/// How a dispatch ended: the last attempt's outcome, its target, and its number (from 1).
pub(crate) struct Ended<D: Dispatch> {
    pub(crate) outcome: Result<D::Answer, D::Failure>,
    pub(crate) target: D::Target,
    pub(crate) attempt: u32,
}

/// The attempts of one request: on `first`, then, while an attempt failed retryably and
/// another is allowed (`config`, not `one_attempt`: the endpoint picker's proxy retries itself)
/// and possible, after `config`'s backoff on the target the dispatcher names. Each retry is
/// counted in `retries` (`router_retries_total`).
pub(crate) async fn run<D: Dispatch>(
    d: &mut D,
    first: D::Target,
    (config, one_attempt): (&RetryConfig, bool),
    retries: &AtomicU64,
) -> Ended<D> {
    let mut target = first;
    // The workers that failed (allocated only on a retry).
    let mut tried: Vec<WorkerId> = Vec::new();
    let mut attempt = 1u32;
    loop {
        let failure = match d.attempt(&target).await {
            Ok(answer) => return Ended { outcome: Ok(answer), target, attempt },
            Err(failure) => failure,
        };
        let may_retry = config.enabled && !one_attempt && attempt < config.max_attempts() && d.retryable(&failure);
        let next = if may_retry {
            let failed = d.failed_on(&target, &failure);
            if !tried.contains(&failed) {
                tried.push(failed);
            }
            d.next(&target, &tried)
        } else {
            None
        };
        let Some(next) = next else { return Ended { outcome: Err(failure), target, attempt } };
        retries.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(config.backoff(attempt)).await;
        d.moving(failure, &target, &next, attempt);
        attempt += 1;
        target = next;
    }
}

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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A dispatcher over numbered workers whose attempts fail as `fails` says (by attempt).
    struct Script {
        /// Attempt n (from 1) fails, retryably or not; past the list it succeeds.
        fails: Vec<bool>,
        made: Vec<u32>,
        moves: Vec<(u32, u32, u32)>,
        /// Workers `next` may choose, in order; a tried one is skipped.
        pool: Vec<u32>,
    }

    impl Dispatch for Script {
        type Target = u32;
        type Answer = u32;
        type Failure = bool;

        async fn attempt(&mut self, to: &u32) -> Result<u32, bool> {
            self.made.push(*to);
            match self.fails.get(self.made.len() - 1) {
                Some(&retryable) => Err(retryable),
                None => Ok(*to),
            }
        }

        fn retryable(&self, failure: &bool) -> bool {
            *failure
        }

        fn failed_on(&self, on: &u32, _: &bool) -> WorkerId {
            WorkerId(*on)
        }

        fn next(&mut self, _: &u32, tried: &[WorkerId]) -> Option<u32> {
            self.pool.iter().copied().find(|w| !tried.contains(&WorkerId(*w)))
        }

        fn moving(&mut self, _: bool, from: &u32, to: &u32, attempt: u32) {
            self.moves.push((*from, *to, attempt));
        }
    }

    fn config(max_retries: u32) -> RetryConfig {
        RetryConfig { max_retries, initial_backoff: Duration::from_millis(1), jitter: 0.0, ..Default::default() }
    }

    fn script(fails: &[bool], pool: &[u32]) -> Script {
        Script { fails: fails.to_vec(), made: Vec::new(), moves: Vec::new(), pool: pool.to_vec() }
    }

    #[tokio::test]
    async fn a_retryable_failure_moves_to_a_worker_not_tried_and_each_retry_is_counted() {
        let retries = AtomicU64::new(0);
        let mut d = script(&[true, true], &[1, 2, 3]);
        let ended = run(&mut d, 1, (&config(5), false), &retries).await;
        assert_eq!((ended.outcome.ok(), ended.target, ended.attempt), (Some(3), 3, 3));
        assert_eq!(d.made, [1, 2, 3]);
        assert_eq!(d.moves, [(1, 2, 1), (2, 3, 2)]);
        assert_eq!(retries.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn a_failure_not_retryable_ends_the_request_on_its_worker() {
        let retries = AtomicU64::new(0);
        let mut d = script(&[false], &[1, 2]);
        let ended = run(&mut d, 1, (&config(5), false), &retries).await;
        assert_eq!((ended.outcome.err(), ended.target, ended.attempt), (Some(false), 1, 1));
        assert_eq!((d.made.len(), retries.load(Ordering::Relaxed)), (1, 0));
    }

    #[tokio::test]
    async fn attempts_stop_at_the_limit_when_off_or_for_one_attempt_and_where_nothing_is_left() {
        let retries = AtomicU64::new(0);
        // Three attempts in all (`--retry-max-retries 3` counts the first).
        let mut d = script(&[true; 9], &[1, 2, 3, 4]);
        let ended = run(&mut d, 1, (&config(3), false), &retries).await;
        assert_eq!((ended.outcome.err(), ended.attempt, d.made.len()), (Some(true), 3, 3));
        let mut off = config(3);
        off.enabled = false;
        let mut d = script(&[true; 9], &[1, 2]);
        assert_eq!(run(&mut d, 1, (&off, false), &retries).await.attempt, 1);
        let mut d = script(&[true; 9], &[1, 2]);
        assert_eq!(run(&mut d, 1, (&config(5), true), &retries).await.attempt, 1, "one attempt");
        // Nowhere else to go: the failure is the answer.
        let mut d = script(&[true; 9], &[1]);
        let ended = run(&mut d, 1, (&config(5), false), &retries).await;
        assert_eq!((ended.attempt, d.made), (1, vec![1]));
        assert_eq!(retries.load(Ordering::Relaxed), 2, "only the first run's retries");
    }
}
