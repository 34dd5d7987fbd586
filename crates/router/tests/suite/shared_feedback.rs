//! Route feedback shared by router replicas (`--shared-state`, through a real `redis-server`;
//! `tests/routing/feedback.yaml`: one `bandit` decision over two pools): a route id one replica
//! gave out is judged through the other, and once across both; feedback given to one moves the
//! other's bandit; only the caller who got an answer judges it, on any replica; a claim a
//! replica refuses leaves the route for a later try; and with the backend gone a replica
//! judges its own routes alone, at once.

use crate::common;
use common::shared::{redis, sharing};

const WHAT: &str = "the shared-feedback tests";

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::app::{Running, admin_get, config, metric, pools, start};
use mock_engine::MockEngine;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sgl_router::app::{AppConfig, PolicyConfig};
use shared_state::testing::RedisServer;

const CLIENT_KEY: &str = "client-key";
const OTHER_KEY: &str = "other-key";
/// Longest one HTTP call of these tests may take.
const CALL: Duration = Duration::from_secs(10);

/// Two replicas of the feedback config sharing state under `prefix` (with `tune` applied), both
/// connected; and the pools' engines, which must outlive them.
async fn replicas(
    redis: &RedisServer,
    prefix: &str,
    tune: impl Fn(&mut AppConfig),
) -> (Running, Running, Vec<MockEngine>) {
    let (routing, engines) = pools("tests/routing/feedback.yaml").await;
    let replica = || {
        let mut c = config(&[], PolicyConfig::RoundRobin, false);
        c.routing = Some(routing.clone());
        c.client_keys = vec![CLIENT_KEY.into(), OTHER_KEY.into()];
        tune(&mut c);
        sharing(c, &redis.url(), prefix)
    };
    let (a, b) = (start(replica()).await, start(replica()).await);
    for r in [&a, &b] {
        common::eventually("the backend reached", async || metric(&r.url, "router_shared_state_up").await == 1.0).await;
    }
    (a, b, engines)
}

/// One chat through the router at `url` as `key`: the pool that answered and the route id.
async fn chat(http: &reqwest::Client, url: &str, key: &str) -> (String, String) {
    let ask = json!({"model": "auto", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]});
    let r = http.post(format!("{url}/v1/chat/completions")).bearer_auth(key).json(&ask).timeout(CALL);
    let r = r.send().await.unwrap();
    assert_eq!(r.status(), 200);
    let header = |n: &str| r.headers().get(n).unwrap_or_else(|| panic!("no {n}")).to_str().unwrap().to_owned();
    (header("x-route-pool"), header("x-route-id"))
}

async fn feedback(http: &reqwest::Client, url: &str, body: &Value, key: &str) -> (StatusCode, Value) {
    let r = http.post(format!("{url}/v1/route/feedback")).bearer_auth(key).json(body).timeout(CALL);
    let r = r.send().await.unwrap();
    (r.status(), r.json().await.unwrap_or(Value::Null))
}

fn verdict(id: &str, v: &str) -> Value {
    json!({"route_id": id, "verdict": v})
}

/// Waits until the router at `url` has written `n` route ids to the backend (they are written
/// in the background, after the answer).
async fn written(url: &str, n: f64) {
    common::eventually("the route ids written to the backend", async || {
        metric(url, "router_shared_route_ids_total{outcome=\"written\"}").await >= n
    })
    .await;
}

/// The router at `url`'s evidence per pool of the decision `chat`: (alpha, beta, updates).
async fn arms(url: &str) -> BTreeMap<String, (f64, f64, u64)> {
    let outcomes: Value = admin_get(&format!("{url}/v1/route/outcomes")).await.json().await.unwrap();
    let arms = outcomes["outcomes"]["arms"]["chat"].as_object().cloned().unwrap_or_default();
    let arm = |a: &Value| (a["alpha"].as_f64().unwrap(), a["beta"].as_f64().unwrap(), a["updates"].as_u64().unwrap());
    arms.iter().map(|(pool, a)| (pool.clone(), arm(a))).collect()
}

/// Route ids from the router at `url`, one per pool (both pools answer soon: equal priors).
async fn one_per_pool(http: &reqwest::Client, url: &str) -> BTreeMap<String, String> {
    let mut ids = BTreeMap::new();
    for _ in 0..60 {
        let (pool, id) = chat(http, url, CLIENT_KEY).await;
        ids.entry(pool).or_insert(id);
        if ids.len() == 2 {
            return ids;
        }
    }
    panic!("one pool never answered: {ids:?}");
}

fn claims(outcome: &str) -> String {
    format!("router_shared_route_claims_total{{outcome=\"{outcome}\"}}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_given_out_by_one_replica_is_judged_through_the_other_once() {
    let Some(redis) = redis(WHAT) else { return };
    let (a, b, _engines) = replicas(&redis, "once", |_| {}).await;
    let http = reqwest::Client::new();

    let (pool, id) = chat(&http, &a.url, CLIENT_KEY).await;
    written(&a.url, 1.0).await;
    let (status, out) = feedback(&http, &b.url, &verdict(&id, "good"), CLIENT_KEY).await;
    assert_eq!(status, 200, "B takes A's route id: {out}");
    assert_eq!((out["decision"].as_str(), out["pool"].as_str()), (Some("chat"), Some(pool.as_str())));
    for (router, name) in [(&a.url, "A"), (&b.url, "B")] {
        let (status, out) = feedback(&http, router, &verdict(&id, "bad"), CLIENT_KEY).await;
        assert_eq!(status, 422, "judged once, also through {name}: {out}");
    }
    assert_eq!(metric(&b.url, &claims("claimed")).await, 1.0);
    assert_eq!(metric(&a.url, &claims("judged_elsewhere")).await, 1.0, "A holds it, the backend says judged");
    assert_eq!(metric(&b.url, &claims("judged_elsewhere")).await, 1.0);
    let unknown = verdict("00000000000000aa", "good");
    assert_eq!(feedback(&http, &b.url, &unknown, CLIENT_KEY).await.0, 404);
    assert_eq!(metric(&b.url, &claims("unknown")).await, 1.0);

    // A preference between two of B's answers, given through A: once, for both routes.
    let ids = one_per_pool(&http, &b.url).await;
    written(&b.url, ids.len() as f64).await;
    let pair = json!({"winner": ids["large"], "loser": ids["small"]});
    let (status, out) = feedback(&http, &a.url, &pair, CLIENT_KEY).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!((out["winner"]["pool"].as_str(), out["loser"]["pool"].as_str()), (Some("large"), Some("small")));
    assert_eq!(feedback(&http, &b.url, &pair, CLIENT_KEY).await.0, 422);
    assert_eq!(feedback(&http, &b.url, &verdict(&ids["small"], "good"), CLIENT_KEY).await.0, 422, "the loser too");
    let _ = (a.stop.send(()), b.stop.send(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feedback_given_to_one_replica_moves_the_others_bandit() {
    let Some(redis) = redis(WHAT) else { return };
    let (a, b, _engines) = replicas(&redis, "evidence", |_| {}).await;
    let http = reqwest::Client::new();

    // B's answers judged through B: A never saw them, nor their feedback.
    let mut judged: BTreeMap<String, (f64, f64, u64)> = BTreeMap::new();
    for _ in 0..40 {
        let (pool, id) = chat(&http, &b.url, CLIENT_KEY).await;
        let good = pool == "large";
        let (status, out) = feedback(&http, &b.url, &verdict(&id, if good { "good" } else { "bad" }), CLIENT_KEY).await;
        assert_eq!(status, 200, "{out}");
        let e = judged.entry(pool).or_default();
        *e = (e.0 + f64::from(u8::from(good)), e.1 + f64::from(u8::from(!good)), e.2 + 1);
    }
    // The prior of quality 0.5 at strength 10: alpha 6, beta 6; then the verdicts.
    let expected: BTreeMap<String, (f64, f64, u64)> =
        judged.iter().map(|(p, (g, b, n))| (p.clone(), (6.0 + g, 6.0 + b, *n))).collect();
    assert_eq!(arms(&b.url).await, expected, "B's own");
    common::eventually("A's arms are B's", async || arms(&a.url).await == expected).await;
    // Read again and again, counted once.
    let ok = "router_shared_arm_refreshes_total{outcome=\"ok\"}";
    let refreshed = metric(&a.url, ok).await;
    common::eventually("two more readings", async || metric(&a.url, ok).await >= refreshed + 2.0).await;
    assert_eq!(arms(&a.url).await, expected, "A, read again");
    assert_eq!(arms(&b.url).await, expected, "B, its own feedback in the totals it read back");
    assert_eq!(
        metric(&b.url, "router_shared_feedback_evidence_total{outcome=\"shared\"}").await,
        40.0,
        "every verdict added to the shared totals"
    );

    // A's bandit draws from them: the pool B's feedback favours.
    let mut large = 0;
    for _ in 0..40 {
        large += usize::from(chat(&http, &a.url, CLIENT_KEY).await.0 == "large");
    }
    assert!(large >= 34, "{large} of 40 of A's answers from the pool B's feedback favours");
    let _ = (a.stop.send(()), b.stop.send(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_caller_who_got_an_answer_judges_it_on_any_replica() {
    let Some(redis) = redis(WHAT) else { return };
    let (a, b, _engines) = replicas(&redis, "callers", |_| {}).await;
    let http = reqwest::Client::new();

    let (_, id) = chat(&http, &a.url, CLIENT_KEY).await;
    written(&a.url, 1.0).await;
    for (router, name) in [(&b.url, "B"), (&a.url, "A")] {
        let (status, out) = feedback(&http, router, &verdict(&id, "bad"), OTHER_KEY).await;
        assert_eq!(status, 404, "another caller, through {name}: {out}");
    }
    assert_eq!(metric(&b.url, &claims("unknown")).await, 1.0);
    let (status, out) = feedback(&http, &b.url, &verdict(&id, "good"), CLIENT_KEY).await;
    assert_eq!(status, 200, "its own caller, the refusals took nothing: {out}");
    let _ = (a.stop.send(()), b.stop.send(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_a_replica_refuses_leaves_the_route_for_a_later_try() {
    let Some(redis) = redis(WHAT) else { return };
    // One verdict a caller an arm, on each replica (each weighs its own callers).
    let (a, b, _engines) = replicas(&redis, "refused", |c| c.feedback.caller_weight = 1).await;
    let http = reqwest::Client::new();

    // Two of A's answers from one pool.
    let mut by_pool: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let (first, second) = loop {
        let (pool, id) = chat(&http, &a.url, CLIENT_KEY).await;
        let ids = by_pool.entry(pool).or_default();
        ids.push(id);
        if let [first, second] = ids.as_slice() {
            break (first.clone(), second.clone());
        }
    };
    written(&a.url, by_pool.values().map(Vec::len).sum::<usize>() as f64).await;
    assert_eq!(feedback(&http, &b.url, &verdict(&first, "good"), CLIENT_KEY).await.0, 200);
    // B claims the second, then refuses it (the caller's weight there): it puts it back.
    let (status, out) = feedback(&http, &b.url, &verdict(&second, "good"), CLIENT_KEY).await;
    assert_eq!((status, out["error"]["type"].as_str()), (StatusCode::TOO_MANY_REQUESTS, Some("feedback_limited")));
    assert_eq!(metric(&b.url, &claims("returned")).await, 1.0);
    let (status, out) = feedback(&http, &a.url, &verdict(&second, "good"), CLIENT_KEY).await;
    assert_eq!(status, 200, "open for a later try, on A: {out}");
    assert_eq!(feedback(&http, &b.url, &verdict(&second, "good"), CLIENT_KEY).await.0, 422);
    let _ = (a.stop.send(()), b.stop.send(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_backend_gone_a_replica_judges_its_own_routes_alone() {
    let Some(mut redis) = redis(WHAT) else { return };
    let (a, b, _engines) = replicas(&redis, "alone", |_| {}).await;
    let http = reqwest::Client::new();

    let (_, shared_id) = chat(&http, &a.url, CLIENT_KEY).await;
    written(&a.url, 1.0).await;
    redis.stop();
    for r in [&a, &b] {
        common::eventually("the backend gone", async || metric(&r.url, "router_shared_state_up").await == 0.0).await;
    }
    let (_, own_id) = chat(&http, &a.url, CLIENT_KEY).await;
    for id in [&shared_id, &own_id] {
        let started = Instant::now();
        let (status, out) = feedback(&http, &a.url, &verdict(id, "good"), CLIENT_KEY).await;
        assert_eq!(status, 200, "A judges its own route alone: {out}");
        assert!(started.elapsed() < Duration::from_secs(1), "not held by the backend: {:?}", started.elapsed());
        assert_eq!(feedback(&http, &a.url, &verdict(id, "bad"), CLIENT_KEY).await.0, 422, "once, still");
    }
    assert!(metric(&a.url, &claims("local_fallback")).await >= 4.0);
    assert!(metric(&a.url, "router_shared_route_ids_total{outcome=\"unwritten\"}").await >= 1.0);
    // B never held them and cannot ask: unknown there.
    let (_, a_id) = chat(&http, &a.url, CLIENT_KEY).await;
    assert_eq!(feedback(&http, &b.url, &verdict(&a_id, "good"), CLIENT_KEY).await.0, 404);
    let _ = (a.stop.send(()), b.stop.send(()));
}
