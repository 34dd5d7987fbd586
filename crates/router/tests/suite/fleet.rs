//! The fleet end to end: discovery after the port is bound, late engines
//! followed, removal that stops exactly a worker's tasks, policies keyed by
//! stable worker ids, explains that change nothing, workers that hang on
//! requests, huge renders off the serving thread, and the memory budget.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::app::{admin_client, admin_get, admin_post, chat, config, engine_config, metric, post, start};
use common::eventually as until;
use fleet::{Events, State};
use mock_engine::{MockEngine, MockEngineConfig};
use router_types::WorkerUrl;
use serde_json::{Value, json};
use sgl_router::app::PolicyConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn explain(url: &str, body: &Value) -> Value {
    admin_post(&format!("{url}/debug/route"), body).await.json().await.unwrap()
}

/// The value of an unlabelled gauge or counter in `/metrics`.
/// A worker that answers `/health` (and `/server_info` with no KV events) at
/// once and never answers a request; counts the requests it swallowed.
async fn hanging_worker() -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let posts = Arc::new(AtomicUsize::new(0));
    let counted = posts.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let posts = counted.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                loop {
                    let Ok(n) = tcp.read(&mut buf).await else { return };
                    if n == 0 {
                        return;
                    }
                    if buf[..n].starts_with(b"POST") {
                        posts.fetch_add(1, Ordering::SeqCst);
                        // Never answers; holds the connection open.
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                    }
                    let body = "{}";
                    let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len());
                    if tcp.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, posts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_port_is_bound_before_discovery_and_a_late_engine_is_followed() {
    let port = crate::common::free_port();
    let listen: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut cfg = config(&[], PolicyConfig::cache_aware(), true);
    cfg.workers = vec![WorkerUrl::parse(&format!("http://{listen}")).unwrap()];
    let t0 = Instant::now();
    let r = start(cfg).await;
    // Discovery of the absent engine did not hold the port back (it used to block up to its deadline).
    assert!(t0.elapsed() < Duration::from_secs(4), "start-up took {:?}", t0.elapsed());
    assert_eq!(reqwest::get(format!("{}/readiness", r.url)).await.unwrap().status(), 503);
    assert_eq!(r.gateway.fleet.all()[0].state(), State::Discovering);
    // The engine comes up: it is found, followed and routed to, with its cache known.
    let w = MockEngine::spawn(MockEngineConfig { listen, ..engine_config() }).await.unwrap();
    until("the late engine is followed", async || {
        matches!(r.gateway.fleet.all()[0].events(), Events::Followed { streams: 1 })
    })
    .await;
    until("and in rotation", async || r.gateway.fleet.all()[0].is_routable()).await;
    let system = "A long system prompt the late engine caches. ".repeat(60);
    let direct = post(&format!("{}/v1/chat/completions", w.url()), &chat(&system, "warm")).await;
    assert_eq!(direct.status(), 200);
    until("its cache is indexed", async || explain(&r.url, &chat(&system, "q")).await["reason"] == "cache_hit").await;
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_worker_stops_its_subscribers_and_adding_it_twice_follows_it_once() {
    let (w0, w1) =
        (MockEngine::spawn(engine_config()).await.unwrap(), MockEngine::spawn(engine_config()).await.unwrap());
    let r = start(config(&[&w0], PolicyConfig::cache_aware(), true)).await;
    let connected = async || {
        let text = admin_get(&format!("{}/metrics", r.url)).await.text().await.unwrap();
        text.lines().filter(|l| l.starts_with("router_kv_events_connected{")).map(str::to_owned).collect::<Vec<_>>()
    };
    // Two concurrent adds of one engine: one worker, one subscription.
    let (workers_url, body) = (format!("{}/workers", r.url), json!({"url": w1.url()}));
    let add = || admin_post(&workers_url, &body);
    let (a, b) = tokio::join!(add(), add());
    let mut statuses = [a.status().as_u16(), b.status().as_u16()];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 201], "one add, one already known");
    assert_eq!(metric(&r.url, "router_kv_events_streams").await, 2.0);
    until("both subscribed", async || connected().await.iter().filter(|l| l.ends_with(" 1")).count() == 2).await;
    // Removed: its subscriber stops, its stream leaves the pump and the gauges.
    let encoded = w1.url().replace(':', "%3A").replace('/', "%2F");
    let del = admin_client().delete(format!("{}/workers/{encoded}", r.url)).send().await.unwrap();
    assert_eq!(del.status(), 200);
    assert_eq!(metric(&r.url, "router_kv_events_streams").await, 1.0);
    assert!(!connected().await.iter().any(|l| l.contains(&w1.url())), "{:?}", connected().await);
    let removed = r.gateway.fleet.all();
    assert_eq!(removed.len(), 1, "retained workers with nothing in flight are gone at once");
    // Its subscriber is gone: what the engine publishes now reaches nobody. (The followed w0's
    // events are the control: once they are indexed, w1's, sent first, would have arrived.)
    let system = "A system prompt both engines see after the removal. ".repeat(40);
    for w in [&w1, &w0] {
        assert_eq!(post(&format!("{}/v1/chat/completions", w.url()), &chat(&system, "x")).await.status(), 200);
    }
    until("w0's events indexed", async || explain(&r.url, &chat(&system, "q")).await["reason"] == "cache_hit").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        metric(&r.url, "router_kv_events_unknown_stream_batches_total").await,
        0.0,
        "a removed worker's subscriber still runs"
    );
    // Added again: followed once more, with a new id.
    let again = add().await;
    assert_eq!(again.status(), 201);
    let again: Value = again.json().await.unwrap();
    assert_ne!(again["id"], json!(1), "ids are never reused: {again}");
    assert_eq!(metric(&r.url, "router_kv_events_streams").await, 2.0);
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approx_tree_learns_workers_not_list_positions() {
    let ws: Vec<MockEngine> = futures_join(3).await;
    let refs: Vec<&MockEngine> = ws.iter().collect();
    let r = start(config(&refs, PolicyConfig::ApproxTree(Default::default()), false)).await;
    let url = format!("{}/v1/chat/completions", r.url);
    // The first worker is busy: a new prompt goes to (and is learned on) the second.
    let busy = r.gateway.fleet.all()[0].charge(0);
    let prompt = chat(&"a prompt the second worker learns ".repeat(40), "q");
    assert_eq!(post(&url, &prompt).await.status(), 200);
    drop(busy);
    let d = explain(&r.url, &prompt).await;
    assert_eq!((&d["worker"], &d["reason"]), (&json!(ws[1].url()), &json!("tree_match")), "{d}");
    let holder = d["worker"].clone();
    // The first worker flaps out of rotation: every later worker moves up one position.
    r.gateway.fleet.all()[0].set_healthy(false);
    let d = explain(&r.url, &prompt).await;
    assert_eq!((&d["worker"], &d["reason"]), (&holder, &json!("tree_match")), "{d}");
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_tree_stays_within_its_bound_between_periodic_trims() {
    let ws: Vec<MockEngine> = futures_join(2).await;
    let refs: Vec<&MockEngine> = ws.iter().collect();
    let max = 32 * 1024;
    let tree = policy::ApproxTreeConfig { max_tree_bytes: max, ..Default::default() };
    // No periodic trim: only the bound held at each insert can keep it.
    let r = start(config(&refs, PolicyConfig::ApproxTree(tree), false)).await;
    let url = format!("{}/v1/chat/completions", r.url);
    let prompt = |i: usize| chat(&format!("{i:06} a prompt of its own, learned by the tree. ").repeat(50), "q");
    // 40 prompts of about 2.5 KB each: three times the bound.
    for i in 0..40 {
        assert_eq!(post(&url, &prompt(i)).await.status(), 200, "request {i}");
    }
    let held = metric(&r.url, "router_policy_tree_bytes{pool=\"default\"}").await;
    assert!(held > 0.0 && held <= max as f64, "the tree holds {held} bytes, bound {max}");
    // The latest prompt is still known; the first was evicted.
    assert_eq!(explain(&r.url, &prompt(39)).await["reason"], "tree_match");
    assert_eq!(explain(&r.url, &prompt(0)).await["reason"], "tree_miss");
    let _ = r.stop.send(());
}

async fn futures_join(n: usize) -> Vec<MockEngine> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(MockEngine::spawn(engine_config()).await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explaining_a_decision_changes_no_policy_state() {
    let ws = futures_join(2).await;
    let r = start(config(&[&ws[0], &ws[1]], PolicyConfig::RoundRobin, false)).await;
    let body = chat("s", "u");
    let first = explain(&r.url, &body).await["worker"].clone();
    for _ in 0..5 {
        assert_eq!(explain(&r.url, &body).await["worker"], first, "an explain advanced round robin");
    }
    // A real request commits: the next explain names the other worker.
    assert_eq!(post(&format!("{}/v1/chat/completions", r.url), &body).await.status(), 200);
    assert_ne!(explain(&r.url, &body).await["worker"], first);
    let _ = r.stop.send(());

    // The approximate tree learns nothing from an explain.
    let r = start(config(&[&ws[0], &ws[1]], PolicyConfig::ApproxTree(Default::default()), false)).await;
    let prompt = chat(&"never sent, only explained ".repeat(40), "q");
    for _ in 0..3 {
        assert_eq!(explain(&r.url, &prompt).await["reason"], "tree_miss");
    }
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_answers_health_but_hangs_on_requests_leaves_rotation() {
    let (hang, posts) = hanging_worker().await;
    let good = MockEngine::spawn(engine_config()).await.unwrap();
    let mut cfg = config(&[&good], PolicyConfig::RoundRobin, false);
    cfg.workers.insert(0, WorkerUrl::parse(&hang).unwrap());
    cfg.request_timeout = Duration::from_millis(500);
    cfg.health.interval = Duration::from_millis(100);
    let r = start(cfg).await;
    let url = format!("{}/v1/chat/completions", r.url);
    // Requests until 700 ms after the first timeout: inside the 1 s quarantine
    // it starts, however slow the machine is to send them.
    let mut statuses = Vec::new();
    let mut failed_at: Option<Instant> = None;
    while failed_at.is_none_or(|at| at.elapsed() < Duration::from_millis(700)) {
        let status = post(&url, &chat("s", "u")).await.status().as_u16();
        statuses.push(status);
        if status == 504 && failed_at.is_none() {
            failed_at = Some(Instant::now());
        }
        assert!(statuses.len() < 64, "the hanging worker was never tried: {statuses:?}");
        // Probes keep answering meanwhile.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    // Only the first request there waited out the timeout; its probes could not bring it back.
    assert_eq!(statuses.iter().filter(|s| **s == 504).count(), 1, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s != 504 && **s != 200).count(), 0, "{statuses:?}");
    assert!(statuses.len() >= 4, "too few requests inside the quarantine: {statuses:?}");
    assert_eq!(posts.load(Ordering::SeqCst), 1);
    let hung = r.gateway.fleet.all().into_iter().find(|w| w.url.as_str() == hang).unwrap();
    assert!(!hung.is_routable() && hung.quarantined());
    let _ = r.stop.send(());
}

/// A router with one serving thread and one render slot, 8 MiB bodies, before a fast engine.
async fn one_serving_thread() -> (MockEngine, common::app::Running) {
    let w = MockEngine::spawn(MockEngineConfig { fast: true, ..engine_config() }).await.unwrap();
    let mut cfg = config(&[&w], PolicyConfig::cache_aware(), true);
    cfg.serve_threads = 1;
    cfg.render_threads = 1;
    cfg.max_body_bytes = 8 << 20;
    (w, start(cfg).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_render_runs_off_the_serving_thread() {
    let (_w, r) = one_serving_thread().await;
    let url = format!("{}/v1/chat/completions", r.url);
    // Under the simulated engine's 2 MiB body limit.
    let huge = chat("s", &"a long prompt of many words ".repeat(60_000));
    let big = tokio::spawn({
        let url = url.clone();
        async move {
            let t = Instant::now();
            let status = reqwest::Client::new().post(url).json(&huge).send().await.unwrap().status();
            (status, t.elapsed())
        }
    });
    until("the huge prompt is rendering", async || r.gateway.render_slots_busy() == 1).await;
    let t = Instant::now();
    for _ in 0..3 {
        assert_eq!(post(&url, &chat("s", "small")).await.status(), 200);
    }
    let small = t.elapsed();
    let busy_after_small = r.gateway.render_slots_busy();
    let (status, big_took) = big.await.unwrap();
    assert_eq!(status, 200);
    // The small chats were served while the huge one was still rendering.
    assert_eq!(busy_after_small, 1, "small {small:?}, big {big_took:?}");
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_tokenize_is_admitted_and_runs_off_the_serving_thread() {
    let (_w, r) = one_serving_thread().await;
    let url = format!("{}/v1/chat/completions", r.url);
    let timed = async || {
        let t = Instant::now();
        assert_eq!(post(&url, &chat("s", "small")).await.status(), 200);
        t.elapsed()
    };
    let mut alone = Vec::new();
    for _ in 0..9 {
        alone.push(timed().await);
    }
    alone.sort();
    let median = alone[alone.len() / 2];
    // 5 MB of text to tokenize, in one request.
    let huge = json!({"prompt": "a long prompt of many words ".repeat(180_000)});
    let big = tokio::spawn({
        let url = format!("{}/v1/tokenize", r.url);
        async move {
            let resp = reqwest::Client::new().post(url).json(&huge).send().await.unwrap();
            let status = resp.status();
            let v: Value = resp.json().await.unwrap();
            (status, v["count"].as_u64().unwrap_or(0))
        }
    });
    until("the tokenize holds its admission and the render slot", async || {
        r.gateway.render_slots_busy() == 1 && r.gateway.in_flight() == 1
    })
    .await;
    let mut beside = Vec::new();
    for _ in 0..9 {
        beside.push(timed().await);
    }
    let busy_after_small = r.gateway.render_slots_busy();
    let (status, count) = big.await.unwrap();
    assert_eq!(status, 200);
    assert!(count >= 180_000, "{count} tokens");
    // The small chats were served while the tokenize was still running.
    assert_eq!(busy_after_small, 1, "alone {alone:?}, beside {beside:?}");
    let worst = beside.iter().max().copied().unwrap();
    // Held behind the tokenize they waited for all of it (seconds on a debug build); the floor
    // is a loaded test machine's scheduling noise, far under that.
    assert!(worst <= (median * 10).max(Duration::from_millis(250)), "worst {worst:?}, median alone {median:?}");
    assert_eq!(r.gateway.in_flight(), 0, "the admission is given back");
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_of_requests_in_progress_is_bounded() {
    let (hang, _) = hanging_worker().await;
    let mut cfg = config(&[], PolicyConfig::RoundRobin, false);
    cfg.workers = vec![WorkerUrl::parse(&hang).unwrap()];
    cfg.max_body_bytes = 1 << 20;
    cfg.max_request_memory = 4 << 20;
    cfg.request_timeout = Duration::from_secs(2);
    let r = start(cfg).await;
    let url = format!("{}/v1/chat/completions", r.url);
    let body = chat("s", &"x".repeat(300_000));
    let first = tokio::spawn({
        let (url, body) = (url.clone(), body.clone());
        async move { reqwest::Client::new().post(url).json(&body).send().await.unwrap().status() }
    });
    until("the first holds its reservation", async || r.gateway.budget.used() > 2 << 20).await;
    let second = post(&url, &body).await;
    assert_eq!(second.status(), 429);
    assert_eq!(second.headers()["retry-after"], "1");
    let e: Value = second.json().await.unwrap();
    assert_eq!(e["error"]["type"], "memory_budget_exceeded", "{e}");
    assert_eq!(first.await.unwrap(), 504);
    assert_eq!(r.gateway.budget.used(), 0, "released with the request");
    assert!(metric(&r.url, "router_http_over_budget_total").await >= 1.0);
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_refusing_a_large_body_early_answers_the_client_and_stays_in_rotation() {
    // The engine's body limit (1 MiB) is below the router's (8 MiB): it answers 413 before it has
    // read the body, and closes. That answer is the client's; the worker did nothing wrong.
    // Both front ends send with the router's own client, which reads that answer (hyper's drops it).
    let w =
        MockEngine::spawn(MockEngineConfig { fast: true, max_body_bytes: 1 << 20, ..engine_config() }).await.unwrap();
    let mut cfg = config(&[&w], PolicyConfig::RoundRobin, false);
    cfg.max_body_bytes = 8 << 20;
    let r = start(cfg).await;
    let url = format!("{}/v1/chat/completions", r.url);
    let big = chat("s", &"many words in a long prompt ".repeat(200_000));
    for _ in 0..5 {
        let resp = post(&url, &big).await;
        assert_eq!(resp.status(), 413, "the engine's own answer, relayed");
    }
    // The same body sent chunked (no length: the router's hyper path).
    let bytes = bytes::Bytes::from(serde_json::to_vec(&big).unwrap());
    for _ in 0..5 {
        let parts: Vec<Result<bytes::Bytes, std::io::Error>> =
            bytes.chunks(64 << 10).map(|c| Ok(bytes::Bytes::copy_from_slice(c))).collect();
        let body = reqwest::Body::wrap_stream(futures_util::stream::iter(parts));
        let resp = reqwest::Client::new()
            .post(&url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let text = resp.text().await.unwrap();
        assert_eq!(status, 413, "the engine's own answer, relayed on the hyper path too: {text}");
    }
    let worker = r.gateway.fleet.all().into_iter().next().unwrap();
    assert!(worker.is_routable() && !worker.quarantined(), "a client's oversized body is not the worker's fault");
    assert_eq!(post(&url, &chat("s", "small")).await.status(), 200);
    let _ = r.stop.send(());
}

/// A TCP front for an engine: it pipes each connection to the engine it points at now, or
/// refuses connections (`None`: the engine is down); switching breaks the connections piped so far.
struct Front {
    addr: SocketAddr,
    to: Arc<std::sync::Mutex<Option<SocketAddr>>>,
    pipes: Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Front {
    async fn start(to: SocketAddr) -> Front {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (to, pipes) = (Arc::new(std::sync::Mutex::new(Some(to))), Arc::new(std::sync::Mutex::new(Vec::new())));
        let (target, piped) = (to.clone(), pipes.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let Some(engine) = *target.lock().unwrap() else { continue };
                let pipe = tokio::spawn(async move {
                    if let Ok(mut upstream) = tokio::net::TcpStream::connect(engine).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                    }
                });
                piped.lock().unwrap().push(pipe.abort_handle());
            }
        });
        Front { addr, to, pipes }
    }

    fn point_at(&self, to: Option<SocketAddr>) {
        *self.to.lock().unwrap() = to;
        for pipe in self.pipes.lock().unwrap().drain(..) {
            pipe.abort();
        }
    }
}

/// A cache_aware router with KV events whose one worker is `front` (probed every 100 ms), once
/// that worker's events are followed.
async fn behind(front: &Front) -> common::app::Running {
    let mut cfg = config(&[], PolicyConfig::cache_aware(), true);
    cfg.workers = vec![WorkerUrl::parse(&format!("http://{}", front.addr)).unwrap()];
    cfg.health.interval = Duration::from_millis(100);
    let r = start(cfg).await;
    let worker = || r.gateway.fleet.all()[0].clone();
    until("the engine is followed", async || matches!(worker().events(), Events::Followed { streams: 1 })).await;
    r
}

/// What `engine` caches reaches the router's index: its events are the ones followed.
async fn indexed_from(r: &common::app::Running, engine: &MockEngine) {
    let system = "A long system prompt the new engine caches. ".repeat(60);
    assert_eq!(post(&format!("{}/v1/chat/completions", engine.url()), &chat(&system, "warm")).await.status(), 200);
    until("its cache is indexed", async || explain(&r.url, &chat(&system, "q")).await["reason"] == "cache_hit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_back_on_new_event_ports_is_followed_again() {
    let a = MockEngine::spawn(engine_config()).await.unwrap();
    let front = Front::start(a.url().trim_start_matches("http://").parse().unwrap()).await;
    let r = behind(&front).await;
    let worker = || r.gateway.fleet.all()[0].clone();
    // The engine goes away; another takes its address, its publishers on other ports.
    front.point_at(None);
    drop(a);
    until("the worker is down", async || !worker().is_routable()).await;
    let b = MockEngine::spawn(engine_config()).await.unwrap();
    front.point_at(Some(b.url().trim_start_matches("http://").parse().unwrap()));
    until("it is followed again", async || {
        metric(&r.url, "router_kv_events_rediscoveries_total").await == 1.0 && worker().is_routable()
    })
    .await;
    // What the new engine caches reaches the index: its events are the ones followed now.
    indexed_from(&r, &b).await;
    let _ = r.stop.send(());
}

/// An engine replaced behind the same address without ever failing a probe (a pod swapped
/// behind a service): its old publishers go quiet, and after `--kv-events-rediscover-secs`
/// (300 ms here) without a connection the router looks them up again and follows the new ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishers_quiet_past_the_bound_are_looked_up_again_while_the_worker_stays_up() {
    let a = MockEngine::spawn(engine_config()).await.unwrap();
    let front = Front::start(a.url().trim_start_matches("http://").parse().unwrap()).await;
    let r = behind(&front).await;
    let worker = || r.gateway.fleet.all()[0].clone();
    // The new engine answers at once: probes keep passing (it takes three failures in a row to
    // go down), and the old one's publisher closes.
    let b = MockEngine::spawn(engine_config()).await.unwrap();
    front.point_at(Some(b.url().trim_start_matches("http://").parse().unwrap()));
    drop(a);
    until("its new publishers are followed", async || {
        metric(&r.url, "router_kv_events_rediscoveries_total").await == 1.0
    })
    .await;
    assert!(worker().is_routable(), "it stayed in rotation");
    indexed_from(&r, &b).await;
    let _ = r.stop.send(());
}

/// A client that leaves while the worker is silent (a long prefill) is noticed at once on the
/// axum front end too (a chunked request): its request is dropped, the worker's load released,
/// and the upstream connection closed, not kept until the idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_during_a_silent_prefill_is_noticed_on_the_hyper_path() {
    let w = MockEngine::spawn(engine_config()).await.unwrap();
    let r = start(config(&[&w], PolicyConfig::RoundRobin, false)).await;
    w.engine().set_faults(mock_engine::Faults { hold_next: 1, ..Default::default() }).await;
    let bytes = bytes::Bytes::from(serde_json::to_vec(&chat("s", "wait for me")).unwrap());
    let url = format!("{}/v1/chat/completions", r.url);
    let client = tokio::spawn(async move {
        let parts: Vec<Result<bytes::Bytes, std::io::Error>> = vec![Ok(bytes)];
        let body = reqwest::Body::wrap_stream(futures_util::stream::iter(parts));
        reqwest::Client::new().post(url).header("content-type", "application/json").body(body).send().await
    });
    until("the worker holds it", async || w.engine().held.load(std::sync::atomic::Ordering::SeqCst) == 1).await;
    let worker = r.gateway.fleet.all().into_iter().next().unwrap();
    assert_eq!(worker.load().in_flight, 1);
    client.abort();
    until("the router let go of it", async || worker.load().in_flight == 0 && r.gateway.in_flight() == 0).await;
    w.engine().release_held(1);
    let _ = r.stop.send(());
}

/// `--remove-unhealthy-workers` (SMG's; also `--worker-auto-recovery`): a worker in rotation that
/// fails its probes leaves the fleet; without it, the worker is kept (down) and probed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_fails_its_probes_is_removed_only_when_asked() {
    for remove in [true, false] {
        let (w, other) =
            (MockEngine::spawn(engine_config()).await.unwrap(), MockEngine::spawn(engine_config()).await.unwrap());
        let mut c = config(&[&w, &other], PolicyConfig::RoundRobin, false);
        c.health.interval = Duration::from_millis(50);
        c.health.remove_unhealthy = remove;
        let r = start(c).await;
        let fleet = r.gateway.fleet.clone();
        until("both workers in rotation", async || fleet.snapshot().iter().all(|x| x.is_routable())).await;
        let url = WorkerUrl::parse(&w.url()).unwrap();
        w.shutdown();
        if remove {
            // Gone whole: nothing in flight keeps it retained.
            until("the failed worker left the fleet", async || fleet.all().iter().all(|x| x.url != url)).await;
            assert_eq!(fleet.snapshot().len(), 1);
            assert!(fleet.snapshot()[0].is_routable(), "the healthy one stays");
        } else {
            until("the failed worker is out of rotation", async || {
                fleet.snapshot().iter().any(|x| x.url == url && !x.is_routable())
            })
            .await;
            assert_eq!(fleet.snapshot().len(), 2, "kept, down, and probed");
        }
        // Requests go to the worker left.
        assert_eq!(post(&format!("{}/v1/chat/completions", r.url), &chat("s", "after")).await.status(), 200);
    }
}
