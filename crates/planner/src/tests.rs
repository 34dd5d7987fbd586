//! The plan phase over a real fleet (workers in rotation without probes):
//! renders memoized per renderer, plans within a pool's routable workers, the
//! routing key, pairs by role with failed workers avoided.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet::{Fleet, Source};
use kv_index::{IndexConfig, KvIndex, ManualClock};
use policy::{ApproxTreeConfig, CacheAware, CacheAwareConfig, Reason, RoundRobin};
use renderer::Renderer;
use router_types::{PoolId, Role, WorkerUrl};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::{PdConfig, PdMode, PlanError, Planner, Pool, Renders, Route};

fn url(u: &str) -> WorkerUrl {
    WorkerUrl::parse(u).unwrap()
}

/// A fleet of `regular` default-pool workers and `pd` (URL, role) workers of pool "pd", every one
/// in rotation (nothing is probed: no sockets).
/// What a plan reads, with no subset.
fn planner<'a>(
    (fleet, workers): (&'a Fleet, &'a [Arc<fleet::Worker>]),
    index: Option<&'a KvIndex>,
    credit_pending: bool,
    (credit_lock, counts): (&'a Mutex<()>, &'a crate::PromptCounts),
) -> Planner<'a> {
    Planner { fleet, workers, index, credit_pending, credit_lock, counts, only: None, placements: None, at_ms: 0 }
}

async fn fleet(regular: &[&str], pd: &[(&str, Role)]) -> Arc<Fleet> {
    let config = fleet::FleetConfig::unprobed(&["/v1/chat/completions"]);
    let urls: Vec<WorkerUrl> = regular.iter().map(|u| url(u)).collect();
    let fleet = Fleet::start(config, None, &urls, CancellationToken::new());
    for (u, role) in pd {
        fleet.add_in(url(u), *role, PoolId("pd".into()), Source::Admin);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while fleet.all().len() < regular.len() + pd.len() || !fleet.all().iter().all(|w| w.is_routable()) {
        assert!(tokio::time::Instant::now() < deadline, "the workers entered rotation");
        tokio::task::yield_now().await;
    }
    fleet
}

fn pool(id: PoolId, pd: Option<PdMode>) -> Arc<Pool> {
    let renderer = Arc::new(Renderer::builtin().unwrap());
    let mut p = Pool::new(id, "m".into(), Arc::new(RoundRobin::default()), renderer, None, 64);
    p.pd = pd.map(|m| Arc::new(PdConfig::new(m, Arc::new(RoundRobin::default()))));
    Arc::new(p)
}

fn chat() -> serde_json::Value {
    json!({"model": "m", "messages": [{"role": "user", "content": "hello there"}]})
}

#[tokio::test]
async fn a_prompt_is_rendered_once_per_renderer_until_a_plugin_rewrites_it() {
    let fleet = fleet(&["http://127.0.0.1:1"], &[]).await;
    let (lock, renders) = (Mutex::new(()), crate::PromptCounts::default());
    let workers = fleet.snapshot();
    let p = planner((&fleet, &workers), None, false, (&lock, &renders));
    let (a, b) = (Arc::new(Renderer::builtin().unwrap()), Arc::new(Renderer::builtin().unwrap()));
    let memo = Renders::default();
    let first = memo.tokens(p, &a, Route::Chat, &chat()).unwrap();
    assert!(!first.tokens.is_empty() && first.text.as_deref().is_some_and(|t| t.contains("hello there")));
    assert_eq!(memo.tokens(p, &a, Route::Chat, &chat()).unwrap(), first, "the same render, from the memo");
    assert_eq!(renders.renders.load(Ordering::Relaxed), 1);
    memo.tokens(p, &b, Route::Chat, &chat()).unwrap();
    assert_eq!(renders.renders.load(Ordering::Relaxed), 2, "another renderer renders once more");
    // The request's own plan takes the render out (no copy); then it is gone.
    assert_eq!(memo.get(&a, true), Some(first));
    assert_eq!(memo.get(&a, false), None);
    memo.forget();
    assert_eq!(memo.get(&b, false), None, "a rewritten prompt forgets every render");
}

#[tokio::test]
async fn a_plan_chooses_among_its_pools_routable_workers_and_a_routing_key_names_one() {
    let fleet = fleet(&["http://127.0.0.1:1", "http://127.0.0.1:2"], &[("http://127.0.0.1:3", Role::PREFILL)]).await;
    let (lock, renders) = (Mutex::new(()), crate::PromptCounts::default());
    let workers = fleet.snapshot();
    let p = planner((&fleet, &workers), None, true, (&lock, &renders));
    let default = pool(PoolId::default_pool(), None);
    let memo = Renders::default();
    let plan = p.plan(&default, Route::Chat, Some(&chat()), None, &memo, true).unwrap();
    let urls: Vec<String> = plan.workers.iter().map(|w| w.url.to_string()).collect();
    assert_eq!(urls.len(), 2, "the default pool's two regular workers, not pool pd's: {urls:?}");
    assert!(urls.iter().all(|u| !u.contains(":3")));
    assert_eq!(plan.decision.reason, Reason::RoundRobin);
    assert!(Arc::ptr_eq(&plan.pool, &default));
    // A routing key names the same worker every time, whatever the policy.
    let keyed: Vec<_> =
        (0..4).map(|_| p.plan(&default, Route::Chat, Some(&chat()), Some(b"user-7"), &memo, false).unwrap()).collect();
    assert!(keyed.iter().all(|k| k.decision.reason == Reason::RoutingKey && k.chosen().id == keyed[0].chosen().id));
    // A pool without workers plans nothing.
    let empty = pool(PoolId("none".into()), None);
    assert!(matches!(p.plan(&empty, Route::Chat, Some(&chat()), None, &memo, false), Err(PlanError::NoWorker)));
}

#[tokio::test]
async fn a_request_plans_in_its_own_snapshot_of_the_fleet_whoever_joins_meanwhile() {
    let fleet = fleet(&["http://127.0.0.1:1"], &[]).await;
    let (lock, renders) = (Mutex::new(()), crate::PromptCounts::default());
    let workers = fleet.snapshot();
    let p = planner((&fleet, &workers), None, false, (&lock, &renders));
    // A worker joins (and enters rotation) after the request took its snapshot.
    fleet.add(url("http://127.0.0.1:2"), Source::Admin);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !fleet.snapshot().iter().any(|w| w.url.as_str().contains(":2") && w.is_routable()) {
        assert!(tokio::time::Instant::now() < deadline, "the new worker entered rotation");
        tokio::task::yield_now().await;
    }
    let default = pool(PoolId::default_pool(), None);
    let memo = Renders::default();
    for _ in 0..4 {
        let plan = p.plan(&default, Route::Chat, Some(&chat()), None, &memo, false).unwrap();
        let urls: Vec<String> = plan.workers.iter().map(|w| w.url.to_string()).collect();
        assert_eq!(urls, ["http://127.0.0.1:1"], "only the workers of the request's snapshot");
    }
    // The next request's snapshot has both.
    let later = fleet.snapshot();
    let p = planner((&fleet, &later), None, false, (&lock, &renders));
    let plan = p.plan(&default, Route::Chat, Some(&chat()), None, &memo, false).unwrap();
    assert_eq!(plan.workers.len(), 2);
}

#[tokio::test]
async fn a_pair_takes_each_leg_from_its_role_and_avoids_failed_workers_while_others_remain() {
    let pd = [
        ("http://127.0.0.1:11", Role::PREFILL),
        ("http://127.0.0.1:12", Role::PREFILL),
        ("http://127.0.0.1:21", Role::Decode),
    ];
    let fleet = fleet(&["http://127.0.0.1:1"], &pd).await;
    let (lock, renders) = (Mutex::new(()), crate::PromptCounts::default());
    let workers = fleet.snapshot();
    let p = planner((&fleet, &workers), None, false, (&lock, &renders));
    let pool = pool(PoolId("pd".into()), Some(PdMode::Sglang));
    let setup = pool.pd.clone().unwrap();
    let v = chat();
    let prompt = p.prompt(&pool, Route::Chat, &v).unwrap();
    let pair = crate::pair(p, (&pool, &setup), &v, &prompt, None, &[], true).unwrap();
    assert!(matches!(pair.prefill.chosen().role, Role::Prefill { .. }));
    assert_eq!(pair.prefill.workers.len(), 2, "both prefill workers are candidates");
    assert_eq!(pair.decode.chosen().url.to_string(), "http://127.0.0.1:21");
    assert!(pair.decode.candidates.iter().all(|c| c.matched_tokens == 0 && c.followed), "decode holds no prefix");
    let first = pair.prefill.chosen().id;
    let again = crate::pair(p, (&pool, &setup), &v, &prompt, None, &[first], true).unwrap();
    assert_ne!(again.prefill.chosen().id, first, "the failed prefill worker is avoided");
    let both: Vec<_> = pair.prefill.workers.iter().map(|w| w.id).collect();
    let last = crate::pair(p, (&pool, &setup), &v, &prompt, None, &both, false).unwrap();
    assert_eq!(last.prefill.workers.len(), 2, "every one failed: all are candidates again");
    let shown = crate::pair_json(&setup, &pair);
    assert_eq!((shown["pool"].as_str(), shown["mode"].as_str()), (Some("pd"), Some("sglang")));
    assert_eq!(shown["decode"]["worker"], "http://127.0.0.1:21");
}

#[tokio::test]
async fn without_a_followed_worker_a_text_tree_policy_hashes_no_page() {
    let fleet = fleet(&["http://127.0.0.1:1", "http://127.0.0.1:2"], &[]).await;
    assert!(fleet.all().iter().all(|w| !w.is_followed()), "no KV events here");
    let index = KvIndex::new(IndexConfig::default(), Arc::new(ManualClock::default()));
    let (lock, renders) = (Mutex::new(()), crate::PromptCounts::default());
    let workers = fleet.snapshot();
    let p = planner((&fleet, &workers), Some(&index), true, (&lock, &renders));
    let with = |policy: Arc<dyn policy::Policy>| {
        let renderer = Arc::new(Renderer::builtin().unwrap());
        Arc::new(Pool::new(PoolId::default_pool(), "m".into(), policy, renderer, None, 64))
    };
    let long = json!({"model": "m", "messages": [{"role": "user", "content": "word ".repeat(400)}]});
    // cache_aware with its text tree: the unfollowed workers are judged by the tree alone.
    let tree =
        with(Arc::new(CacheAware::new(CacheAwareConfig::default(), 1).with_text_tree(ApproxTreeConfig::default())));
    let plan = p.plan(&tree, Route::Chat, Some(&long), None, &Renders::default(), true).unwrap();
    assert!(plan.input_tokens > 64, "a prompt of several pages: {}", plan.input_tokens);
    assert_eq!(tree.chain_memo.stats().pages_hashed, 0, "nothing hashed: no exact match could count");
    // A policy that reads exact matches whatever the events: hashed.
    let exact = with(Arc::new(RoundRobin::default()));
    p.plan(&exact, Route::Chat, Some(&long), None, &Renders::default(), true).unwrap();
    assert!(exact.chain_memo.stats().pages_hashed > 0);
}

#[tokio::test]
async fn without_a_tokenizer_input_ids_are_left_for_the_engine_to_judge() {
    let fleet = fleet(&["http://127.0.0.1:1"], &[]).await;
    let (lock, renders) = (Mutex::new(()), crate::PromptCounts::default());
    let workers = fleet.snapshot();
    let p = planner((&fleet, &workers), None, false, (&lock, &renders));
    // The built-in byte-level model knows 259 ids; the engine's model (unknown here) many more.
    let builtin = Renderer::builtin().unwrap();
    let ids = json!({"input_ids": [100000, 151642, 7], "sampling_params": {"max_new_tokens": 8}});
    assert_eq!(p.render(&builtin, Route::Generate, &ids, true).unwrap().tokens, vec![100000, 151642, 7]);
    let completion = json!({"prompt": [[100000, 3]], "max_tokens": 8});
    assert!(p.render(&builtin, Route::Completions, &completion, true).is_ok());
    // What can never be a token id is still refused.
    for bad in [json!({"input_ids": [1, -1]}), json!({"input_ids": [1, 4294967296u64]})] {
        assert!(p.render(&builtin, Route::Generate, &bad, true).is_err(), "{bad}");
    }
}

#[test]
fn a_worker_is_named_by_its_address_as_a_gateway_names_endpoints() {
    assert_eq!(crate::authority("http://10.0.0.7:8000/"), "10.0.0.7:8000");
    assert_eq!(crate::authority("http://[::1]:8000"), "[::1]:8000");
    assert_eq!(crate::authority("https://w0.svc:443/v1?x=1"), "w0.svc:443");
    assert_eq!(crate::authority("10.0.0.7:8000"), "10.0.0.7:8000");
}
