//! `--shared-state`: router replicas sharing state through a real `redis-server` (Debian's,
//! installed by `.ci/run`): one replica's requests in flight count in the other's view of a
//! worker's load (so they do not pile onto one worker), a response cached through one is
//! answered by the other, a tenant's limit holds across both; and a backend that stops,
//! restarts empty or answers garbage costs sharing, never a request.

use crate::common;
use common::shared::{redis, sharing};

const WHAT: &str = "the shared-state tests";

use std::time::{Duration, Instant};

use common::app::{admin_get, config, engine_config, metric, pools, start};
use gateway::pipeline::tenant_limits::{Limits, TenantLimitsConfig};
use mock_engine::{Faults, MockEngine, MockEngineConfig};
use serde_json::{Value, json};
use sgl_router::app::PolicyConfig;

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
    let Some(redis) = redis(WHAT) else { return };
    let held = MockEngineConfig { record_requests: true, ..engine_config() };
    let (w0, w1) = (MockEngine::spawn(held.clone()).await.unwrap(), MockEngine::spawn(held).await.unwrap());
    for w in [&w0, &w1] {
        w.engine().set_faults(Faults { hold_next: 1, ..Default::default() }).await;
    }
    let base = || config(&[&w0, &w1], PolicyConfig::least_load(), false);
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
    let Some(redis) = redis(WHAT) else { return };
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
    let Some(redis) = redis(WHAT) else { return };
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
    let Some(mut redis) = redis(WHAT) else { return };
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

/// A TCP proxy to `to` whose answers are held `delay` milliseconds each (changed at will).
async fn delay_proxy(to: String, delay: std::sync::Arc<std::sync::atomic::AtomicU64>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(&to).await else { continue };
            let delay = delay.clone();
            let ((mut cr, mut cw), (mut sr, mut sw)) = (client.into_split(), server.into_split());
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut cr, &mut sw).await;
            });
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = sr.read(&mut buf).await {
                    let wait = delay.load(std::sync::atomic::Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                    if n == 0 || cw.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_backend_costs_a_request_one_deadline_at_most_and_sharing_resumes_once_it_is_fast() {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let Some(redis) = redis(WHAT) else { return };
    let delay = std::sync::Arc::new(AtomicU64::new(0));
    let url = delay_proxy(format!("127.0.0.1:{}", redis.port()), delay.clone()).await;
    let w = MockEngine::spawn(engine_config()).await.unwrap();
    let mut c = config(&[&w], PolicyConfig::RoundRobin, false);
    let default = Limits { requests_per_minute: 1000, tokens_per_minute: 1_000_000 };
    c.tenant_limits = Some(TenantLimitsConfig { default, tenants: Default::default() });
    let r = start(sharing(c, &url, "slow")).await;
    common::eventually("the backend reached", async || metric(&r.url, "router_shared_state_up").await == 1.0).await;
    let http = reqwest::Client::new();
    let timed = async || {
        let started = Instant::now();
        let resp = http.post(format!("{}/v1/chat/completions", r.url)).json(&chat("hi")).send().await.unwrap();
        (resp.status().as_u16(), started.elapsed())
    };
    let shared = async || metric(&r.url, "router_shared_tenant_charges_total{decided=\"shared\"}").await;
    assert_eq!(timed().await.0, 200);
    assert_eq!(shared().await, 1.0);

    // Every answer of the backend two seconds late: a request waits one deadline (250 ms) at
    // most, then the replica decides alone.
    delay.store(2000, Relaxed);
    for _ in 0..5 {
        let (status, took) = timed().await;
        assert_eq!(status, 200);
        assert!(took < Duration::from_millis(1500), "held by a slow backend: {took:?}");
    }
    assert_eq!(metric(&r.url, "router_shared_state_up").await, 0.0, "a late backend is dropped");
    assert!(metric(&r.url, "router_shared_state_command_errors_total{error=\"timeout\"}").await >= 1.0);
    assert!(metric(&r.url, "router_shared_tenant_charges_total{decided=\"local\"}").await >= 4.0);

    // Fast again: back to sharing within seconds.
    delay.store(0, Relaxed);
    common::eventually("the backend back", async || metric(&r.url, "router_shared_state_up").await == 1.0).await;
    let before = shared().await;
    assert_eq!(timed().await.0, 200);
    assert_eq!(shared().await, before + 1.0, "charged in the backend again");
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_replica_catches_up_from_one_announced_in_the_backend() {
    let Some(redis) = redis(WHAT) else { return };
    // Publishers that keep 16 batches: the traffic below outruns them.
    let c = MockEngineConfig { replay_buffer_steps: 16, ..engine_config() };
    let ws = [MockEngine::spawn(c.clone()).await.unwrap(), MockEngine::spawn(c).await.unwrap()];
    let refs: Vec<&MockEngine> = ws.iter().collect();
    let a = start(sharing(config(&refs, PolicyConfig::cache_aware(), true), &redis.url(), "members")).await;
    let prompt =
        |i: usize| common::app::chat(&format!("conversation {i:04}: {}", "the quick brown fox ".repeat(40)), "hi");
    for i in 0..64 {
        assert!(common::app::post(&format!("{}/v1/chat/completions", a.url), &prompt(i)).await.status().is_success());
    }
    let known = async |url: &str, body: &Value| {
        let (_, matched) = explain(url, body).await;
        matched.iter().map(|(_, n)| *n).max().unwrap_or(0)
    };
    common::eventually("A indexes the last prompt", async || known(&a.url, &prompt(63)).await > 0).await;
    let first = known(&a.url, &prompt(0)).await;
    assert!(first > 200, "A knows the first prompt: {first}");
    // A announces itself (what --shared-state-advertise-url does once it has caught up).
    let stop = tokio_util::sync::CancellationToken::new();
    let backend = shared_state::Backend::start(shared_state::Target::parse(&redis.url()).unwrap(), Default::default());
    tokio::spawn(sgl_router::members::announce(backend.clone(), "members".into(), a.url.clone(), stop.clone()));
    common::eventually("A announced", async || {
        sgl_router::members::peers(&backend, "members", None, Duration::from_secs(1)).await == vec![a.url.clone()]
    })
    .await;
    // C starts late, with no --index-peers: it finds A through the backend and copies its index.
    let mut cc = sharing(config(&refs, PolicyConfig::cache_aware(), true), &redis.url(), "members");
    let setup = cc.shared_state.clone().unwrap();
    cc.index_peers = Some(sgl_router::peers::PeerSetup {
        urls: Vec::new(),
        selector: None,
        api_key: Some(common::app::ADMIN_KEY.into()),
        timeout: Duration::from_secs(10),
        limits: fleet::SnapshotLimits { max_blocks: 1 << 20, max_bytes: 64 << 20 },
        shared: Some(sgl_router::peers::SharedPeers {
            target: setup.target,
            options: setup.options,
            prefix: setup.prefix,
            me: Some("http://c.invalid:1".into()),
        }),
    });
    let c = start(cc).await;
    common::eventually("C knows the first prompt as A does", async || known(&c.url, &prompt(0)).await == first).await;
    // Taken back when A stops announcing.
    stop.cancel();
    common::eventually("A's announcement taken back", async || {
        sgl_router::members::peers(&backend, "members", None, Duration::from_secs(1)).await.is_empty()
    })
    .await;
    let _ = (a.stop.send(()), c.stop.send(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limit_is_the_deployments_split_among_the_replicas_heard_from() {
    let Some(redis) = redis(WHAT) else { return };
    let w = MockEngine::spawn(engine_config()).await.unwrap();
    let limited = || {
        let mut c = config(&[&w], PolicyConfig::RoundRobin, false);
        // Four a second for the deployment; refused at once rather than queued.
        (c.rate_limit, c.queue_size) = (Some(4), 0);
        sharing(c, &redis.url(), "rate")
    };
    let (a, b) = (start(limited()).await, start(limited()).await);
    for r in [&a, &b] {
        common::eventually("the replicas hear each other", async || {
            metric(&r.url, "router_shared_state_replicas").await == 1.0
        })
        .await;
    }
    let http = reqwest::Client::new();
    let mut statuses = Vec::new();
    for i in 0..3 {
        let r = http.post(format!("{}/v1/chat/completions", a.url)).json(&chat(&format!("q{i}"))).send().await;
        statuses.push(r.unwrap().status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 429], "two of the four a second are A's");
    let _ = (a.stop.send(()), b.stop.send(()));
}
