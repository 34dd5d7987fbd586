//! `--shared-state`: router replicas sharing state through a real `redis-server` (Debian's,
//! installed by `.ci/run`): one replica's requests in flight count in the other's view of a
//! worker's load (so they do not pile onto one worker), a response cached through one is
//! answered by the other, a tenant's limit holds across both; and a backend that stops,
//! restarts empty or answers garbage costs sharing, never a request.

use crate::common;

use std::time::{Duration, Instant};

use common::app::{admin_get, config, engine_config, metric, pools, start};
use gateway::pipeline::tenant_limits::{Limits, TenantLimitsConfig};
use mock_engine::{Faults, MockEngine, MockEngineConfig};
use serde_json::{Value, json};
use sgl_router::app::{AppConfig, PolicyConfig};
use sgl_router::config::SharedStateSetup;
use shared_state::testing::RedisServer;

/// A redis-server, or `None` (with a line saying the tests are skipped) when there is none
/// here; under CI (`CI` set) it must be there.
async fn redis() -> Option<RedisServer> {
    use std::io::Write;
    match RedisServer::start() {
        Ok(r) => Some(r),
        Err(e) if std::env::var_os("CI").is_none() => {
            let _ = writeln!(std::io::stderr(), "SKIPPED: the shared-state tests need redis-server ({e})");
            None
        }
        Err(e) => panic!("redis-server is needed under CI: {e}"),
    }
}

/// `c` sharing state through `url` under `prefix`.
fn sharing(mut c: AppConfig, url: &str, prefix: &str) -> AppConfig {
    let options = shared_state::Options { command_timeout: Duration::from_millis(250), ..Default::default() };
    let target = shared_state::Target::parse(url).unwrap();
    c.shared_state = Some(SharedStateSetup { target, options, prefix: prefix.into() });
    c
}

/// Each worker's load as `router`'s `/workers` says it: (URL, requests in flight).
async fn in_flight(router: &str) -> Vec<(String, u64)> {
    let body: Value = admin_get(&format!("{router}/workers")).await.json().await.unwrap();
    let workers = body["workers"].as_array().cloned().unwrap_or_default();
    workers.iter().map(|w| (w["url"].as_str().unwrap().to_owned(), w["in_flight"].as_u64().unwrap())).collect()
}

fn chat(text: &str) -> Value {
    json!({"model": "default", "max_tokens": 2, "messages": [{"role": "user", "content": text}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replicas_requests_in_flight_count_in_the_others_view_of_the_workers() {
    let Some(redis) = redis().await else { return };
    let held = MockEngineConfig { record_requests: true, ..engine_config() };
    let (w0, w1) = (MockEngine::spawn(held.clone()).await.unwrap(), MockEngine::spawn(held).await.unwrap());
    for w in [&w0, &w1] {
        w.engine().set_faults(Faults { hold_next: 1, ..Default::default() }).await;
    }
    let base = || config(&[&w0, &w1], PolicyConfig::LeastLoad, false);
    let a = start(sharing(base(), &redis.url(), "herd")).await;
    let b = start(sharing(base(), &redis.url(), "herd")).await;
    common::eventually("each replica hears the other", async || {
        metric(&a.url, "router_shared_state_replicas").await == 1.0
            && metric(&b.url, "router_shared_state_replicas").await == 1.0
    })
    .await;

    // Through A, one request held by the worker it went to.
    let http = reqwest::Client::new();
    let first = tokio::spawn({
        let (http, url) = (http.clone(), format!("{}/v1/chat/completions", a.url));
        async move { http.post(url).json(&chat("first")).send().await.unwrap().status() }
    });
    common::eventually("the first request reaches a worker", async || {
        w0.engine().legs().len() + w1.engine().legs().len() == 1
    })
    .await;
    let (busy, idle) = if w0.engine().legs().len() == 1 { (&w0, &w1) } else { (&w1, &w0) };
    let busy_url = busy.url().trim_end_matches('/').to_owned();
    // B counts it on that worker, though none of its own is there.
    common::eventually("B sees A's request in flight", async || {
        in_flight(&b.url).await.iter().any(|(u, n)| u.trim_end_matches('/') == busy_url && *n == 1)
    })
    .await;
    let body: Value = admin_get(&format!("{}/workers", b.url)).await.json().await.unwrap();
    let busy_b = body["workers"].as_array().unwrap().iter().find(|w| w["in_flight"] == 1).unwrap().clone();
    assert_eq!(
        (busy_b["remote_in_flight"].as_u64(), busy_b["uncached_tokens"].as_u64()),
        (Some(1), Some(0)),
        "A's, none of B's own"
    );
    // So B's least-loaded choice is the other worker, not a pile onto the busy one.
    let second = tokio::spawn({
        let (http, url) = (http.clone(), format!("{}/v1/chat/completions", b.url));
        async move { http.post(url).json(&chat("second")).send().await.unwrap().status() }
    });
    common::eventually("the second request reaches a worker", async || {
        w0.engine().legs().len() + w1.engine().legs().len() == 2
    })
    .await;
    assert_eq!((busy.engine().legs().len(), idle.engine().legs().len()), (1, 1), "B went to the idle worker");
    assert!(metric(&b.url, "router_shared_state_placements_total{outcome=\"applied\"}").await >= 1.0);

    // Answered: A's load report takes the request off B's view.
    for w in [&w0, &w1] {
        w.engine().release_held(1);
    }
    assert_eq!(first.await.unwrap(), 200);
    assert_eq!(second.await.unwrap(), 200);
    common::eventually("B's view back to nothing in flight", async || {
        in_flight(&b.url).await.iter().all(|(_, n)| *n == 0)
    })
    .await;
    let _ = (a.stop.send(()), b.stop.send(()));
}

/// What the router at `url` would do with `body`, and how many prompt tokens it counts on
/// each worker (by URL).
async fn explain(url: &str, body: &Value) -> (Value, Vec<(String, u64)>) {
    let d: Value = common::app::admin_post(&format!("{url}/debug/route"), body).await.json().await.unwrap();
    let candidates = d["candidates"].as_array().cloned().unwrap_or_default();
    let matched = candidates
        .iter()
        .map(|c| (c["worker"].as_str().unwrap_or_default().to_owned(), c["matched_tokens"].as_u64().unwrap_or(0)))
        .collect();
    (d, matched)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_placed_through_one_replica_is_pending_on_that_worker_for_the_other() {
    let Some(redis) = redis().await else { return };
    let held = MockEngineConfig { record_requests: true, ..engine_config() };
    let (w0, w1) = (MockEngine::spawn(held.clone()).await.unwrap(), MockEngine::spawn(held).await.unwrap());
    for w in [&w0, &w1] {
        w.engine().set_faults(Faults { hold_next: 1, ..Default::default() }).await;
    }
    let base = || {
        let mut c = config(&[&w0, &w1], PolicyConfig::cache_aware(), true);
        c.pending_ttl = Duration::from_secs(30);
        c
    };
    let a = start(sharing(base(), &redis.url(), "pending")).await;
    let b = start(sharing(base(), &redis.url(), "pending")).await;
    // A replica of its own: what B would know without sharing.
    let alone = start(base()).await;
    common::eventually("the replicas hear each other", async || {
        metric(&b.url, "router_shared_state_replicas").await == 1.0
    })
    .await;
    let system = "A cold system prompt that no worker holds yet, long enough for many pages. ".repeat(40);
    let ask = |q: &str| {
        json!({"model": "default", "max_tokens": 2, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": q}]})
    };
    let http = reqwest::Client::new();
    let first = tokio::spawn({
        let (http, url, body) = (http.clone(), format!("{}/v1/chat/completions", a.url), ask("first"));
        async move { http.post(url).json(&body).send().await.unwrap().status() }
    });
    common::eventually("the first request reaches a worker", async || {
        w0.engine().legs().len() + w1.engine().legs().len() == 1
    })
    .await;
    let chosen = if w0.engine().legs().len() == 1 { &w0 } else { &w1 };
    let chosen_url = chosen.url().trim_end_matches('/').to_owned();
    common::eventually("B applied A's placement", async || {
        metric(&b.url, "router_shared_state_placements_total{outcome=\"applied\"}").await >= 1.0
    })
    .await;
    // Held by the worker, nothing published yet: B knows the prefix is on its way there.
    let (d, matched) = explain(&b.url, &ask("second")).await;
    let on = |m: &[(String, u64)], url: &str| m.iter().find(|(u, _)| u.trim_end_matches('/') == url).map_or(0, |x| x.1);
    assert!(on(&matched, &chosen_url) >= 16 * 20, "B counts the system prompt's pages pending there: {d}");
    assert_eq!(d["worker"].as_str().map(|u| u.trim_end_matches('/')), Some(chosen_url.as_str()), "{d}");
    let (d, matched) = explain(&alone.url, &ask("second")).await;
    assert!(matched.iter().all(|(_, n)| *n == 0), "a replica alone knows nothing of it: {d}");
    for w in [&w0, &w1] {
        w.engine().release_held(1);
    }
    assert_eq!(first.await.unwrap(), 200);
    let _ = (a.stop.send(()), b.stop.send(()), alone.stop.send(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_cached_through_one_replica_is_answered_by_the_other_and_a_corrupt_one_is_not() {
    let Some(redis) = redis().await else { return };
    let (routing, engines) = pools("tests/routing/cache.yaml").await;
    let replica = || {
        let mut c = config(&[], PolicyConfig::RoundRobin, false);
        c.routing = Some(routing.clone());
        sharing(c, &redis.url(), "cache")
    };
    let (a, b) = (start(replica()).await, start(replica()).await);
    let faq = |q: &str| {
        json!({"model": "auto", "temperature": 0, "max_tokens": 6,
               "messages": [{"role": "user", "content": format!("faq: {q}")}]})
    };
    let http = reqwest::Client::new();
    let ask = async |router: &str, body: &Value| {
        let r = http.post(format!("{router}/v1/chat/completions")).json(body).send().await.unwrap();
        let cache = r.headers().get("x-route-cache").map(|v| v.to_str().unwrap().to_owned());
        (r.status().as_u16(), cache, r.bytes().await.unwrap())
    };
    let seen = || engines[0].engine().legs().len();

    let (s, c, first) = ask(&a.url, &faq("opening hours?")).await;
    assert_eq!((s, c.as_deref(), seen()), (200, Some("miss"), 1));
    common::eventually("A wrote the answer through", async || {
        metric(&a.url, "router_shared_cache_total{outcome=\"stored\"}").await == 1.0
    })
    .await;
    // B never saw the question: the backend answers it, the engine is not asked.
    let (s, c, again) = ask(&b.url, &faq("opening hours?")).await;
    assert_eq!((s, c.as_deref(), seen()), (200, Some("hit-exact"), 1));
    assert_eq!(first, again, "the same answer, byte for byte");
    assert_eq!(metric(&b.url, "router_shared_cache_total{outcome=\"hit\"}").await, 1.0);
    // Kept by B now: asked again, B answers from its own store.
    let (_, c, _) = ask(&b.url, &faq("opening hours?")).await;
    assert_eq!((c.as_deref(), seen()), (Some("hit-exact"), 1));
    assert_eq!(metric(&b.url, "router_shared_cache_total{outcome=\"hit\"}").await, 1.0);
    // A request counted once however it is answered.
    assert_eq!(metric(&b.url, "router_http_requests_total{route=\"chat\",status=\"200\"}").await, 2.0);

    // Another answer, then every stored answer overwritten with garbage: B asks the engine.
    let (_, c, _) = ask(&a.url, &faq("parking?")).await;
    assert_eq!((c.as_deref(), seen()), (Some("miss"), 2));
    common::eventually("A wrote the second answer through", async || {
        metric(&a.url, "router_shared_cache_total{outcome=\"stored\"}").await == 2.0
    })
    .await;
    let admin = shared_state::Backend::start(shared_state::Target::parse(&redis.url()).unwrap(), Default::default());
    assert!(admin.wait_up(Duration::from_secs(5)).await);
    let keys = match admin.cmd(&[b"KEYS", b"cache:answer:*"]).await.unwrap() {
        shared_state::Reply::Array(keys) => keys,
        other => panic!("{other:?}"),
    };
    assert_eq!(keys.len(), 2);
    for k in keys {
        let k = k.as_bytes().unwrap().to_vec();
        admin.cmd(&[b"SET", &k, b"SGA1 not an answer"]).await.unwrap();
    }
    let (s, c, _) = ask(&b.url, &faq("parking?")).await;
    assert_eq!((s, c.as_deref(), seen()), (200, Some("miss"), 3), "a corrupt answer is a miss");
    assert_eq!(metric(&b.url, "router_shared_cache_total{outcome=\"corrupt\"}").await, 1.0);
    let _ = (a.stop.send(()), b.stop.send(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_limit_holds_across_replicas_and_alone_when_the_backend_is_gone() {
    let Some(mut redis) = redis().await else { return };
    let w = MockEngine::spawn(engine_config()).await.unwrap();
    let limited = || {
        let mut c = config(&[&w], PolicyConfig::RoundRobin, false);
        let default = Limits { requests_per_minute: 3, tokens_per_minute: 1_000_000 };
        c.tenant_limits = Some(TenantLimitsConfig { default, tenants: Default::default() });
        sharing(c, &redis.url(), "tenants")
    };
    let (a, b) = (start(limited()).await, start(limited()).await);
    for r in [&a, &b] {
        common::eventually("the backend reached", async || metric(&r.url, "router_shared_state_up").await == 1.0).await;
    }
    let http = reqwest::Client::new();
    let status = async |router: &str| {
        let r = http.post(format!("{router}/v1/chat/completions")).json(&chat("hi")).send().await.unwrap();
        r.status().as_u16()
    };
    // Three a minute for the anonymous tenant, whichever replica takes them.
    assert_eq!([status(&a.url).await, status(&b.url).await, status(&a.url).await], [200, 200, 200]);
    assert_eq!(status(&b.url).await, 429, "the fourth is over the limit on any replica");
    assert_eq!(status(&a.url).await, 429);
    assert_eq!(metric(&a.url, "router_shared_tenant_charges_total{decided=\"shared\"}").await, 3.0);

    // The backend gone: each replica's own buckets decide, no request waits on it or fails.
    redis.stop();
    common::eventually("A notices", async || metric(&a.url, "router_shared_state_up").await == 0.0).await;
    let started = Instant::now();
    assert_eq!(status(&a.url).await, 200, "A's own bucket has room");
    assert!(started.elapsed() < Duration::from_secs(1), "not held by the backend: {:?}", started.elapsed());
    assert!(metric(&a.url, "router_shared_tenant_charges_total{decided=\"local\"}").await >= 1.0);
    let ready: Value = reqwest::get(format!("{}/readiness", a.url)).await.unwrap().json().await.unwrap();
    assert_eq!((ready["ready"].as_bool(), ready["shared_state"]["up"].as_bool()), (Some(true), Some(false)), "{ready}");

    // Back, empty: the replicas share again within seconds.
    redis.restart().unwrap();
    for r in [&a, &b] {
        common::eventually("the backend back", async || metric(&r.url, "router_shared_state_up").await == 1.0).await;
    }
    common::eventually("the replicas hear each other again", async || {
        metric(&a.url, "router_shared_state_replicas").await == 1.0
    })
    .await;
    assert_eq!([status(&b.url).await, status(&a.url).await, status(&b.url).await], [200, 200, 200]);
    assert_eq!(status(&a.url).await, 429, "shared again: three a minute across both");
    let _ = (a.stop.send(()), b.stop.send(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_answering_garbage_or_nothing_costs_no_request() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // One server answering garbage to everything, one that reads and never answers.
    let garbage = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let urls = [garbage.local_addr().unwrap(), silent.local_addr().unwrap()].map(|a| format!("redis://{a}"));
    tokio::spawn(async move {
        while let Ok((mut s, _)) = garbage.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(b"?garbage\r\n$99999999999\r\n").await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let w = MockEngine::spawn(engine_config()).await.unwrap();
    for url in urls {
        let mut c = config(&[&w], PolicyConfig::RoundRobin, false);
        let default = Limits { requests_per_minute: 1000, tokens_per_minute: 1_000_000 };
        c.tenant_limits = Some(TenantLimitsConfig { default, tenants: Default::default() });
        let r = start(sharing(c, &url, "bad")).await;
        let http = reqwest::Client::new();
        for i in 0..5 {
            let started = Instant::now();
            let resp = http.post(format!("{}/v1/chat/completions", r.url)).json(&chat(&format!("q{i}"))).send().await;
            assert_eq!(resp.unwrap().status(), 200, "{url}");
            // At most one command deadline (250 ms) on the request's way.
            assert!(started.elapsed() < Duration::from_secs(2), "{url}: {:?}", started.elapsed());
        }
        assert_eq!(metric(&r.url, "router_shared_state_up").await, 0.0, "{url}");
        let _ = r.stop.send(());
    }
}
