//! Following one worker's KV events: find its publishers (explicit flags
//! first, then SGLang's `/server_info`), in the background and with backoff
//! for as long as the worker is in the fleet; check its page size against
//! the fleet's; register its streams with the pump; and run one subscriber
//! per dp rank under the worker's own tracker and cancellation token, so
//! that removing the worker stops exactly its tasks.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kv_events::{DiscoveryError, StreamEndpoints, explicit_streams, parse_server_info, spawn_subscriber_after};
use kv_ingest::{PumpControl, StreamHashing};
use renderer::HashMode;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::{Events, EventsSide, Fleet, Worker};

/// First wait between two discovery attempts of an unreachable worker.
const BACKOFF_INITIAL: Duration = Duration::from_millis(50);
/// Longest wait between two discovery attempts: a worker that comes up late
/// is followed within this long of answering.
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Longest one `/server_info` request may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// What one discovery attempt found.
struct Found {
    streams: Vec<StreamEndpoints>,
    block_size: Option<usize>,
    bigram: bool,
    sglang: bool,
}

/// Finds the worker's publishers and follows them; returns when they are
/// followed, when there is nothing to follow, or when the worker leaves.
pub(crate) async fn follow(fleet: Arc<Fleet>, worker: Arc<Worker>) {
    let Some(ev) = &fleet.events else { return };
    if worker.engine().is_some() {
        // Its events come on its gRPC service (`SubscribeKvEvents`), not over ZMQ.
        crate::follow_grpc::follow(&fleet, ev, &worker).await;
        return;
    }
    let started = Instant::now();
    let mut backoff = BACKOFF_INITIAL;
    loop {
        let attempt = tokio::select! {
            biased;
            () = worker.cancel.cancelled() => return,
            r = find(&fleet, ev, &worker) => r,
        };
        match attempt {
            Ok(Some(found)) => {
                subscribe(&fleet, ev, &worker, found).await;
                return;
            }
            Ok(None) => {
                let reason = DiscoveryError::NotPublishing(worker.url.clone()).to_string();
                fleet.unfollowed(&worker, Events::NotFollowed(reason));
                return;
            }
            Err(e @ (DiscoveryError::Unreachable { .. } | DiscoveryError::Invalid { .. })) => {
                fleet.metrics.discovery_failures.fetch_add(1, Ordering::Relaxed);
                // A worker that answers its probes but not `/server_info` is served
                // unfollowed after the deadline; discovery goes on meanwhile.
                if worker.events() == Events::Discovering && started.elapsed() >= ev.config.discovery_deadline {
                    warn!(worker = %worker.url, error = %e, "kv events: still not found, routing without them meanwhile");
                    worker.set_events(Events::NotFollowed(format!("{e} (still trying)")));
                    worker.discovered();
                }
                debug!(worker = %worker.url, error = %e, ?backoff, "kv events: discovery failed, retrying");
            }
            Err(e) => {
                fleet.unfollowed(&worker, Events::NotFollowed(e.to_string()));
                return;
            }
        }
        tokio::select! {
            biased;
            () = worker.cancel.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// A followed worker back after being down, or whose subscription has had no connection for
/// `--kv-events-rediscover-secs` while it answers its probes: its publishers are looked up again and, where
/// they moved (an engine restarted on new KV-event ports, a pod replaced), followed anew: the
/// old subscribers stop, the streams are registered again. Publishers at the same place are
/// left to their subscribers, which reconnect by themselves.
pub(crate) async fn refollow(fleet: Arc<Fleet>, worker: Arc<Worker>) {
    let Some(ev) = &fleet.events else { return };
    // A gRPC worker's events come on its service's stream, which subscribes again by itself.
    if worker.engine().is_some() {
        return;
    }
    if !matches!(worker.events(), Events::Followed { .. }) || worker.refollowing.swap(true, Ordering::AcqRel) {
        return;
    }
    // One look at a time; the next may start when this one ends, however it ends.
    struct Looking<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for Looking<'_> {
        fn drop(&mut self) {
            self.0.store(false, Ordering::Release);
        }
    }
    let _looking = Looking(&worker.refollowing);
    *worker.looked_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::time::Instant::now());
    let found = tokio::select! {
        biased;
        () = worker.cancel.cancelled() => return,
        r = find(&fleet, ev, &worker) => r,
    };
    let moved = match found {
        Ok(Some(found)) if endpoints(&found) != *worker.publishers.lock().unwrap_or_else(|p| p.into_inner()) => found,
        _ => return,
    };
    info!(worker = %worker.url, "kv events: the worker's publishers moved, following them anew");
    fleet.metrics.rediscoveries.fetch_add(1, Ordering::Relaxed);
    worker.subscriptions.lock().unwrap_or_else(|p| p.into_inner()).cancel();
    let keys = std::mem::take(&mut *worker.streams.lock().unwrap_or_else(|p| p.into_inner()));
    for key in keys {
        ev.events.forget(&key);
        let _ = ev.control.send(PumpControl::RemoveStream(key)).await;
    }
    subscribe(&fleet, ev, &worker, moved).await;
}

/// Whether a healthy worker's publishers are worth looking up again: it is followed, one of its
/// streams has had no connection for `rediscover_after`, and no look started within that long.
pub(crate) fn stale(fleet: &Fleet, worker: &Worker) -> bool {
    let Some(ev) = &fleet.events else { return false };
    let after = ev.config.rediscover_after;
    if !matches!(worker.events(), Events::Followed { .. }) {
        return false;
    }
    let looked = *worker.looked_at.lock().unwrap_or_else(|p| p.into_inner());
    if looked.is_some_and(|at| at.elapsed() < after) {
        return false;
    }
    let streams = worker.streams.lock().unwrap_or_else(|p| p.into_inner());
    streams.iter().any(|key| ev.events.down_for(key).is_some_and(|d| d >= after))
}

/// Each stream's endpoint and replay endpoint, as followed.
fn endpoints(found: &Found) -> Vec<(String, Option<String>)> {
    found.streams.iter().map(|s| (s.endpoint.clone(), s.replay_endpoint.clone())).collect()
}

/// One attempt: explicit endpoints, or one `/server_info`.
async fn find(fleet: &Fleet, ev: &EventsSide, worker: &Worker) -> Result<Option<Found>, DiscoveryError> {
    if let Some(streams) = explicit_streams(&worker.url, &ev.config.explicit, &ev.config.topic)? {
        // An engine that advertises nothing (vLLM): page size from the flag.
        return Ok(Some(Found { streams, block_size: None, bigram: false, sglang: false }));
    }
    let unreachable = |message: String| DiscoveryError::Unreachable { worker: worker.url.clone(), message };
    let response = fleet
        .client
        .get(worker.endpoint_url("/server_info"))
        .timeout(ATTEMPT_TIMEOUT)
        .send()
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    // No such route (vLLM, an OpenAI-compatible server): it advertises nothing, at once. Other
    // errors (an engine still starting) are tried again.
    if matches!(response.status().as_u16(), 404 | 405 | 501) {
        return Ok(None);
    }
    if !response.status().is_success() {
        return Err(unreachable(format!("HTTP {}", response.status())));
    }
    // Read with a cap: a worker cannot make the router buffer an endless answer.
    let body = kv_events::read_server_info(&worker.url, response).await?;
    Ok(parse_server_info(&worker.url, &body)?.map(|found| Found {
        streams: found.streams,
        block_size: Some(found.block_size),
        bigram: found.bigram,
        sglang: true,
    }))
}

/// Checks the page size, registers the streams and starts their subscribers.
async fn subscribe(fleet: &Fleet, ev: &EventsSide, worker: &Worker, found: Found) {
    let Some(block_size) = fleet.pool_block_size(ev, worker, found.block_size) else { return };
    let hashing = StreamHashing {
        page_size: NonZeroUsize::new(block_size).unwrap_or(NonZeroUsize::MIN),
        mode: if found.bigram { HashMode::Bigram } else { HashMode::Unigram },
        engine_hash_is_router_hash: found.sglang,
    };
    // A generation of subscribers, stopped on its own when the publishers move.
    let generation = worker.cancel.child_token();
    *worker.subscriptions.lock().unwrap_or_else(|p| p.into_inner()) = generation.clone();
    *worker.publishers.lock().unwrap_or_else(|p| p.into_inner()) = endpoints(&found);
    let mut subscribed = 0;
    for stream in found.streams {
        let (done, registered) = tokio::sync::oneshot::channel();
        let seed = ev.seeds.lock().unwrap_or_else(|p| p.into_inner()).remove(&stream.key);
        if ev.control.send(PumpControl::AddStream(stream.key.clone(), hashing, seed, done)).await.is_err() {
            return;
        }
        let resume = match registered.await {
            Ok(Ok(resume)) => resume,
            Ok(Err(e)) => {
                warn!(stream = %stream.key, error = %e, "kv events: stream not registered");
                continue;
            }
            Err(_) => return,
        };
        // Registered under the worker: a removal that raced this sees the key and unregisters it.
        worker.streams.lock().unwrap_or_else(|p| p.into_inner()).push(stream.key.clone());
        if worker.cancel.is_cancelled() {
            // Removed meanwhile: this stream may have been registered after the removal looked.
            let _ = ev.control.send(PumpControl::RemoveStream(stream.key.clone())).await;
            return;
        }
        let handle = spawn_subscriber_after(
            stream,
            ev.config.subscriber,
            ev.tx.clone(),
            ev.events.clone(),
            generation.clone(),
            resume,
        );
        worker.tasks.spawn(async move {
            let _ = handle.await;
        });
        subscribed += 1;
    }
    ev.hash_modes.add(hashing.mode);
    info!(worker = %worker.url, streams = subscribed, block_size, bigram = found.bigram, "kv events: following worker");
    worker.set_events(Events::Followed { streams: subscribed });
    worker.discovered();
}
