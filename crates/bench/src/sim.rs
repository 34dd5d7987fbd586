//! A discrete-time simulation of a fleet: trace requests arrive, K routers
//! (the real `policy` code over the real `kv-index`, matched by the router's
//! own `planner::match_chains`, fed by the engines' cache events after a lag)
//! pick a worker, and each simulated worker runs an
//! FCFS prefill lane over a paged LRU cache (the simulated engine's own
//! cache). Reports the token hit rate, time to first token and prefill balance.
//!
//! Bounds: `oracle_pooled_lru` (one LRU cache of the whole fleet's capacity,
//! the earliest free lane), `oracle_belady` (the same cache evicting with
//! knowledge of the future) and `oracle_infinite` (no eviction at all).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::num::NonZeroUsize;
use std::sync::Arc;

use anyhow::{Result, bail};
use kv_index::{IndexConfig, KvIndex, ManualClock, StoredBlock, StreamId};
use mock_engine::PagedCache;
use policy::{
    ApproxTreeConfig, ApproxTreePolicy, CacheAware, CacheAwareConfig, Candidate, ExpectedWait, LeastLoad, Load,
    LoadMetric, MinTtft, MinTtftConfig, Policy, PowerOfTwo, Random, RequestInfo, RoundRobin,
};
use router_types::{BlockHash, DpRank, Tier, WorkerId, WorkerKey, WorkerUrl};
use serde::Serialize;

use crate::trace::{TRACE_BLOCK, TraceRequest};

/// The fleet and its timing.
#[derive(Debug, Clone)]
pub(crate) struct SimConfig {
    /// Workers.
    pub(crate) workers: usize,
    /// KV capacity per worker, tokens.
    pub(crate) capacity_tokens: u64,
    /// Router replicas splitting the traffic round robin, each with its own view.
    pub(crate) routers: usize,
    /// Delay between a cache change and the routers seeing it, seconds.
    pub(crate) event_lag_s: f64,
    /// Fixed cost of a prefill, seconds.
    pub(crate) prefill_fixed_s: f64,
    /// Prefill speed, uncached tokens per second.
    pub(crate) prefill_tokens_per_s: f64,
    /// Decode time per output token, seconds (only keeps requests in flight).
    pub(crate) decode_s_per_token: f64,
    /// Seed of the random policies.
    pub(crate) seed: u64,
    /// Routers also see each engine's own report of its queued prefill (SGLang `/v1/loads`,
    /// which the router polls every 100 ms; read here without delay).
    pub(crate) engine_load: bool,
}

/// One policy's outcome.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SimResult {
    /// Policy name.
    pub(crate) policy: String,
    /// Requests simulated.
    pub(crate) requests: usize,
    /// Prompt tokens served from cache / prompt tokens (0..1).
    pub(crate) hit_rate: f64,
    /// Time to first token, mean.
    pub(crate) ttft_mean_s: f64,
    /// ... median.
    pub ttft_p50_s: f64,
    /// ... 99th percentile.
    pub ttft_p99_s: f64,
    /// Prefill work of the busiest worker over the mean (1 = perfectly even).
    pub(crate) prefill_work_max_over_mean: f64,
    /// Routing regret by the router's view (its KV index, events lagging): prompt tokens the
    /// best worker held more than the chosen one, over all prompt tokens (0 for the bounds).
    pub(crate) regret: f64,
    /// Regret against the arrival-time oracle: what the best worker's cache really held when
    /// the request arrived less what the chosen one's did, over all prompt tokens.
    pub(crate) oracle_regret: f64,
}

/// A cache change the routers learn of at `at`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Update {
    at_us: u64,
    seq: u64,
    worker: usize,
    parent: Option<u64>,
    stored: Vec<u64>,
    removed: Vec<u64>,
}

struct Router {
    policy: Box<dyn Policy>,
    index: Option<(KvIndex, Vec<StreamId>)>,
    /// Per worker: this router's requests in flight as (finish, prefill end, uncached tokens).
    outstanding: Vec<Vec<(f64, f64, u64)>>,
}

struct Worker {
    cache: PagedCache,
    busy_until: f64,
    prefill_work: f64,
    /// Requests waiting for the prefill lane: (start, uncached tokens).
    queued: Vec<(f64, u64)>,
}

fn digest(id: u64) -> [u8; 32] {
    let mut d = [0u8; 32];
    d[..8].copy_from_slice(&id.to_be_bytes());
    d
}

fn make_policy(name: &str, seed: u64) -> Result<Box<dyn Policy>> {
    Ok(match name {
        "round_robin" => Box::new(RoundRobin::default()),
        "random" => Box::new(Random::new(seed)),
        "power_of_two" => Box::new(PowerOfTwo::new(seed, LoadMetric::default(), ExpectedWait::default())),
        "least_load" => Box::new(LeastLoad::default()),
        "approx_tree" => Box::new(ApproxTreePolicy::new(ApproxTreeConfig::default())),
        "cache_aware" => Box::new(CacheAware::new(CacheAwareConfig::default(), seed)),
        "min_ttft" => Box::new(MinTtft::new(MinTtftConfig::default())),
        other => bail!("unknown policy {other:?}"),
    })
}

/// Simulates `trace` under `policy` (a router policy or an oracle).
pub(crate) fn run(trace: &[TraceRequest], policy: &str, cfg: &SimConfig) -> Result<SimResult> {
    match policy {
        "oracle_pooled_lru" => {
            return Ok(oracle(trace, policy, cfg, (cfg.capacity_tokens * cfg.workers as u64) / TRACE_BLOCK));
        }
        "oracle_infinite" => return Ok(oracle(trace, policy, cfg, u64::MAX / 2)),
        "oracle_belady" => return Ok(oracle_belady(trace, cfg)),
        _ => {}
    }
    let pages = (cfg.capacity_tokens / TRACE_BLOCK).max(1) as usize;
    let mut workers: Vec<Worker> = (0..cfg.workers)
        .map(|_| Worker { cache: PagedCache::new(pages), busy_until: 0.0, prefill_work: 0.0, queued: Vec::new() })
        .collect();
    let mut routers: Vec<Router> = (0..cfg.routers.max(1))
        .map(|r| -> Result<Router> {
            // Every policy's router keeps an index (its regret is read from it); only the
            // cache-aware policies see its matches.
            let index = Some({
                let index = KvIndex::new(IndexConfig::default(), Arc::new(ManualClock::default()));
                let streams = (0..cfg.workers)
                    .map(|w| {
                        index
                            .stream(&WorkerKey::new(WorkerUrl::new(format!("sim://{w}")), DpRank(0)))
                            .unwrap_or_else(|_| unreachable_stream())
                    })
                    .collect();
                (index, streams)
            });
            Ok(Router {
                policy: make_policy(policy, cfg.seed + r as u64)?,
                index,
                outstanding: vec![Vec::new(); cfg.workers],
            })
        })
        .collect::<Result<_>>()?;
    let mut updates: BinaryHeap<Reverse<Update>> = BinaryHeap::new();
    let (mut seq, mut cached_total, mut input_total) = (0u64, 0u64, 0u64);
    let (mut regret, mut oracle_regret) = (0u64, 0u64);
    let sees_index = matches!(policy, "cache_aware" | "min_ttft");
    let mut ttfts = Vec::with_capacity(trace.len());
    for (i, req) in trace.iter().enumerate() {
        let now = req.timestamp as f64 / 1000.0;
        let now_us = req.timestamp * 1000;
        // The routers learn every cache change due by now.
        while updates.peek().is_some_and(|Reverse(u)| u.at_us <= now_us) {
            let Some(Reverse(u)) = updates.pop() else { break };
            for r in &mut routers {
                if let Some((index, streams)) = &r.index {
                    apply(index, streams[u.worker], &u);
                }
            }
        }
        let n_routers = routers.len();
        let router = &mut routers[i % n_routers];
        let chain: Vec<BlockHash> = req.hash_ids.iter().map(|id| BlockHash(*id as i64)).collect();
        let matched: Vec<u64> = match &router.index {
            // The router's own match (the plan phase's), over one hash mode.
            Some((index, _)) => {
                let mut m = vec![0u64; cfg.workers];
                for (worker, (blocks, _)) in planner::match_chains(index, std::slice::from_ref(&chain)) {
                    m[worker.index()] = (u64::from(blocks) * TRACE_BLOCK).min(req.input_length);
                }
                m
            }
            None => vec![0; cfg.workers],
        };
        let candidates: Vec<Candidate> = (0..cfg.workers)
            .map(|w| {
                let own = &mut router.outstanding[w];
                own.retain(|(finish, _, _)| *finish > now);
                let own_uncached: u64 = own.iter().filter(|(_, pe, _)| *pe > now).map(|(_, _, u)| *u).sum();
                // The engine's own report (SGLang `/v1/loads`): uncached tokens queued, every router's.
                let uncached = if cfg.engine_load {
                    let queue = &mut workers[w].queued;
                    queue.retain(|(start, _)| *start > now);
                    own_uncached.max(queue.iter().map(|(_, u)| *u).sum())
                } else {
                    own_uncached
                };
                Candidate {
                    worker: WorkerId(w as u32),
                    load: Load { in_flight: own.len() as u32, uncached_tokens: uncached },
                    matched_tokens: if sees_index { matched[w] } else { 0 },
                    followed: true,
                    warmup: Default::default(),
                    kv_usage: None,
                    report: None,
                }
            })
            .collect();
        let text: Vec<u8> = req.hash_ids.iter().flat_map(|id| (*id as u32).to_le_bytes()).collect();
        // The tree works on text; block ids as bytes keep the prefix structure.
        let text = String::from_utf8_lossy(&text).into_owned();
        let request = RequestInfo { input_tokens: req.input_length, text: Some(&text), at_ms: 0, heads: &[] };
        let decision = router.policy.select(&candidates, &request)?;
        router.policy.commit(&decision, &candidates, &request);
        // Simulated workers are numbered 0..n and never leave: id i is worker i.
        let w = decision.worker.0 as usize;
        regret += matched.iter().max().copied().unwrap_or(0) - matched[w];
        let best_held = workers.iter().map(|wk| wk.cache.peek(&chain)).max().unwrap_or(0);
        let worker = &mut workers[w];
        let start = now.max(worker.busy_until);
        let hit = worker.cache.lookup_and_pin(&chain);
        let cached = (hit as u64 * TRACE_BLOCK).min(req.input_length);
        oracle_regret += (best_held as u64 * TRACE_BLOCK).min(req.input_length) - cached;
        let uncached = req.input_length - cached;
        let prefill = cfg.prefill_fixed_s + uncached as f64 / cfg.prefill_tokens_per_s;
        if start > now {
            worker.queued.push((start, uncached));
        }
        worker.busy_until = start + prefill;
        worker.prefill_work += prefill;
        let change = worker.cache.insert_pinned(&chain, hit);
        worker.cache.unpin(&chain, change.stored_from + change.stored);
        let finish = worker.busy_until + req.output_length as f64 * cfg.decode_s_per_token;
        router.outstanding[w].push((finish, worker.busy_until, uncached));
        ttfts.push(worker.busy_until - now);
        cached_total += cached;
        input_total += req.input_length;
        if change.stored > 0 || !change.evicted.is_empty() {
            seq += 1;
            updates.push(Reverse(Update {
                at_us: ((worker.busy_until + cfg.event_lag_s) * 1e6) as u64,
                seq,
                worker: w,
                parent: change.stored_from.checked_sub(1).map(|p| req.hash_ids[p]),
                stored: req.hash_ids[change.stored_from..change.stored_from + change.stored].to_vec(),
                removed: change.evicted.iter().map(|h| h.0 as u64).collect(),
            }));
        }
    }
    let work: Vec<f64> = workers.iter().map(|w| w.prefill_work).collect();
    let share = |tokens: u64| tokens as f64 / input_total.max(1) as f64;
    let result = summarize(policy, &mut ttfts, cached_total, input_total, &work);
    Ok(SimResult { regret: share(regret), oracle_regret: share(oracle_regret), ..result })
}

fn unreachable_stream() -> StreamId {
    // Registration fails only past 65,535 streams; a simulation has at most a few hundred.
    panic!("too many simulated workers")
}

fn apply(index: &KvIndex, stream: StreamId, u: &Update) {
    if !u.removed.is_empty() {
        let _ = index.remove(stream, &u.removed, Tier::Device);
    }
    if u.stored.is_empty() {
        return;
    }
    let parent = match u.parent {
        Some(p) => match index.parent(stream, p) {
            Some(found) => Some(found),
            None => return, // the parent left the router's view meanwhile: an orphan, as in the pump
        },
        None => None,
    };
    let blocks: Vec<StoredBlock> = u.stored.iter().map(|id| StoredBlock { engine: *id, digest: digest(*id) }).collect();
    let _ = index.store(stream, parent.as_ref(), &blocks, Tier::Device);
}

/// The LRU bounds: one cache for the whole fleet, each request on the earliest free lane.
fn oracle(trace: &[TraceRequest], name: &str, cfg: &SimConfig, pages: u64) -> SimResult {
    let mut cache = PagedCache::new(pages.min(usize::MAX as u64 / 2) as usize);
    pooled(trace, name, cfg, |_, req| {
        let chain: Vec<BlockHash> = req.hash_ids.iter().map(|id| BlockHash(*id as i64)).collect();
        let hit = cache.lookup_and_pin(&chain);
        let change = cache.insert_pinned(&chain, hit);
        cache.unpin(&chain, change.stored_from + change.stored);
        hit
    })
}

/// The eviction bound: one cache of the whole fleet's capacity that knows
/// the future (Belady's rule: it keeps the blocks used again soonest, and
/// does not keep a block never used again). No router placement over LRU
/// engines can beat it; the gap between it and `oracle_pooled_lru` is what
/// LRU eviction itself loses.
fn oracle_belady(trace: &[TraceRequest], cfg: &SimConfig) -> SimResult {
    const NEVER: usize = usize::MAX;
    // For each request, when each of its blocks is used next (a request index).
    let mut next_use: Vec<Vec<usize>> = vec![Vec::new(); trace.len()];
    let mut seen: HashMap<u64, usize> = HashMap::new();
    for (i, req) in trace.iter().enumerate().rev() {
        next_use[i] = req.hash_ids.iter().map(|id| seen.get(id).copied().unwrap_or(NEVER)).collect();
        for id in &req.hash_ids {
            seen.insert(*id, i);
        }
    }
    let capacity = ((cfg.capacity_tokens * cfg.workers as u64) / TRACE_BLOCK) as usize;
    // Cached block -> its next use; a max-heap of (next use, depth, block) with stale entries
    // skipped. On equal next use the deeper block goes first: a chain is kept from its start,
    // so what is kept can be hit (a hit is an unbroken run from the first block).
    let mut cached: HashMap<u64, usize> = HashMap::new();
    let mut farthest: BinaryHeap<(usize, usize, u64)> = BinaryHeap::new();
    pooled(trace, "oracle_belady", cfg, |i, req| {
        let hit = req.hash_ids.iter().take_while(|id| cached.contains_key(id)).count();
        for (depth, (id, next)) in req.hash_ids.iter().zip(&next_use[i]).enumerate() {
            if *next == NEVER {
                cached.remove(id);
            } else {
                cached.insert(*id, *next);
                farthest.push((*next, depth, *id));
            }
        }
        while cached.len() > capacity {
            let Some((next, _, id)) = farthest.pop() else { break };
            if cached.get(&id) == Some(&next) {
                cached.remove(&id);
            }
        }
        hit
    })
}

/// Runs `trace` over one pooled cache (`hit_blocks(i, request)` looks the
/// request up and stores it, returning the blocks it found), each request on
/// the earliest free prefill lane.
fn pooled(
    trace: &[TraceRequest],
    name: &str,
    cfg: &SimConfig,
    mut hit_blocks: impl FnMut(usize, &TraceRequest) -> usize,
) -> SimResult {
    let mut lanes = vec![0.0f64; cfg.workers];
    let mut work = vec![0.0f64; cfg.workers];
    let (mut cached_total, mut input_total) = (0u64, 0u64);
    let mut ttfts = Vec::with_capacity(trace.len());
    for (i, req) in trace.iter().enumerate() {
        let now = req.timestamp as f64 / 1000.0;
        let cached = (hit_blocks(i, req) as u64 * TRACE_BLOCK).min(req.input_length);
        let lane = (0..lanes.len()).min_by(|a, b| lanes[*a].total_cmp(&lanes[*b])).unwrap_or(0);
        let prefill = cfg.prefill_fixed_s + (req.input_length - cached) as f64 / cfg.prefill_tokens_per_s;
        lanes[lane] = now.max(lanes[lane]) + prefill;
        work[lane] += prefill;
        ttfts.push(lanes[lane] - now);
        cached_total += cached;
        input_total += req.input_length;
    }
    summarize(name, &mut ttfts, cached_total, input_total, &work)
}

fn summarize(policy: &str, ttfts: &mut [f64], cached: u64, input: u64, work: &[f64]) -> SimResult {
    ttfts.sort_by(f64::total_cmp);
    let pct = |p: f64| ttfts.get(((ttfts.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0.0);
    let mean_work = work.iter().sum::<f64>() / work.len().max(1) as f64;
    let max_work = work.iter().copied().fold(0.0, f64::max);
    SimResult {
        policy: policy.to_string(),
        requests: ttfts.len(),
        hit_rate: if input == 0 { 0.0 } else { cached as f64 / input as f64 },
        ttft_mean_s: ttfts.iter().sum::<f64>() / ttfts.len().max(1) as f64,
        ttft_p50_s: pct(0.5),
        ttft_p99_s: pct(0.99),
        prefill_work_max_over_mean: if mean_work > 0.0 { max_work / mean_work } else { 1.0 },
        regret: 0.0,
        oracle_regret: 0.0,
    }
}

/// Page size of the simulated index: one trace block.
pub(crate) fn page_size() -> NonZeroUsize {
    NonZeroUsize::new(TRACE_BLOCK as usize).unwrap_or(NonZeroUsize::MIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 41 conversations (not a multiple of the workers: round robin must not be sticky) of 6 turns each, every turn extending its conversation's prefix.
    fn trace() -> Vec<TraceRequest> {
        let mut out = Vec::new();
        for turn in 0..6u64 {
            for conv in 0..41u64 {
                let blocks = 4 + turn * 2;
                let hash_ids = (0..blocks).map(|b| conv * 1000 + b).collect();
                out.push(TraceRequest {
                    timestamp: (turn * 41 + conv) * 200,
                    input_length: blocks * TRACE_BLOCK,
                    output_length: 50,
                    hash_ids,
                });
            }
        }
        out
    }

    fn cfg() -> SimConfig {
        SimConfig {
            workers: 4,
            capacity_tokens: 200 * TRACE_BLOCK,
            routers: 1,
            event_lag_s: 0.0,
            prefill_fixed_s: 0.01,
            prefill_tokens_per_s: 50_000.0,
            decode_s_per_token: 0.001,
            seed: 3,
            engine_load: true,
        }
    }

    #[test]
    fn cache_aware_beats_round_robin_and_the_bounds_hold() {
        let t = trace();
        let rr = run(&t, "round_robin", &cfg()).unwrap();
        let ca = run(&t, "cache_aware", &cfg()).unwrap();
        let pooled = run(&t, "oracle_pooled_lru", &cfg()).unwrap();
        let infinite = run(&t, "oracle_infinite", &cfg()).unwrap();
        let belady = run(&t, "oracle_belady", &cfg()).unwrap();
        assert_eq!(ca.requests, t.len());
        assert!(ca.hit_rate > 2.0 * rr.hit_rate, "cache_aware {} vs round_robin {}", ca.hit_rate, rr.hit_rate);
        assert!(infinite.hit_rate >= belady.hit_rate && belady.hit_rate >= pooled.hit_rate);
        assert!(infinite.hit_rate >= ca.hit_rate);
        assert!(ca.ttft_mean_s < rr.ttft_mean_s);
        // Two routers with lagging events still find most of it.
        let lagged = run(&t, "cache_aware", &SimConfig { routers: 2, event_lag_s: 0.5, ..cfg() }).unwrap();
        assert!(lagged.hit_rate > rr.hit_rate);
        assert!(run(&t, "nope", &cfg()).is_err());
        // Round robin leaves most of the reachable prefix behind, cache_aware almost none (events
        // without lag: its view is the oracle's); hit rate plus oracle regret is what was reachable.
        assert!(rr.regret > 0.3 && rr.oracle_regret > 0.3, "round robin: {rr:?}");
        assert!(ca.regret < 0.05 && ca.oracle_regret < 0.05, "cache_aware: {ca:?}");
        assert_eq!((pooled.regret, pooled.oracle_regret), (0.0, 0.0), "a bound has none");
    }
}
