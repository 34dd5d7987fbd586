//! Router replicas that catch up: a router started after the engines'
//! replay buffers rolled over learns only what is stored after it starts,
//! unless it starts from a peer's index snapshot (`--index-peers`), in which
//! case it knows what its peer knows and follows on from the snapshot's seqs.
//! A snapshot older than what the publishers still hold resets those streams
//! (counted), never keeps their stale blocks. Real engines' publishers are
//! simulated here; the sockets, replay and HTTP are real.

use crate::common;

use common::app::{ADMIN_KEY, admin_get, chat, config, engine_config, post, start};
use common::eventually;
use mock_engine::{MockEngine, MockEngineConfig};
use serde_json::Value;
use sgl_router::app::App;
use sgl_router::app::PolicyConfig;
use sgl_router::peers::PeerSetup;
use std::time::{Duration, Instant};

/// Batches each publisher keeps: the tests outrun it.
const BUFFER: usize = 16;

async fn engines() -> Vec<MockEngine> {
    let mut out = Vec::new();
    for _ in 0..2 {
        let c = MockEngineConfig { replay_buffer_steps: BUFFER, ..engine_config() };
        out.push(MockEngine::spawn(c).await.unwrap());
    }
    out
}

/// The most prompt tokens a worker holds, as router `url` knows it.
async fn known(url: &str, body: &Value) -> u64 {
    let d: Value = common::app::admin_post(&format!("{url}/debug/route"), body).await.json().await.unwrap();
    d["candidates"].as_array().unwrap().iter().map(|c| c["matched_tokens"].as_u64().unwrap_or(0)).max().unwrap_or(0)
}

fn prompt(i: usize) -> Value {
    // Long enough to span many pages; distinct from the first characters on.
    chat(&format!("conversation {i:04}: {}", "the quick brown fox jumps over the lazy dog ".repeat(20)), "hello")
}

fn peers(urls: Vec<String>) -> PeerSetup {
    PeerSetup {
        urls,
        selector: None,
        api_key: Some(ADMIN_KEY.into()),
        timeout: Duration::from_secs(10),
        limits: fleet::SnapshotLimits { max_blocks: 1 << 20, max_bytes: 64 << 20 },
        shared: None,
    }
}

async fn metrics(url: &str) -> String {
    admin_get(&format!("{url}/metrics")).await.text().await.unwrap()
}

async fn workers(url: &str) -> Value {
    admin_get(&format!("{url}/workers")).await.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_replica_knows_what_its_peer_knows_only_with_a_snapshot() {
    let ws = engines().await;
    let refs: Vec<&MockEngine> = ws.iter().collect();
    let a = start(config(&refs, PolicyConfig::cache_aware(), true)).await;
    // Far more requests than the publishers keep: their buffers roll over.
    let n = 4 * BUFFER;
    for i in 0..n {
        assert!(post(&format!("{}/v1/chat/completions", a.url), &prompt(i)).await.status().is_success());
    }
    eventually("A indexes the last prompt", async || known(&a.url, &prompt(n - 1)).await > 0).await;
    let mut held_by_a = Vec::with_capacity(n);
    for i in 0..n {
        held_by_a.push(known(&a.url, &prompt(i)).await);
    }
    assert!(held_by_a.iter().all(|t| *t > 200), "A knows every prompt: {held_by_a:?}");

    // B starts late, alone: it learns only what the publishers still hold.
    let b = start(config(&refs, PolicyConfig::cache_aware(), true)).await;
    // C starts late from A's snapshot.
    let mut cc = config(&refs, PolicyConfig::cache_aware(), true);
    cc.index_peers = Some(peers(vec!["http://127.0.0.1:9".into(), a.url.clone()]));
    let c = start(cc).await;
    eventually("B and C follow both engines", async || {
        let streams =
            |v: &Value| v["workers"].as_array().unwrap().iter().filter(|w| w["kv_events"] == "followed").count();
        streams(&workers(&b.url).await) == 2 && streams(&workers(&c.url).await) == 2
    })
    .await;
    // A new conversation continues the shared template prefix the engines cached long ago: C,
    // holding that prefix from the snapshot, indexes it; B never saw the prefix stored, so the
    // engine's store (under a parent B does not know) is an orphan to it.
    let orphans = |m: &str| -> u64 {
        let l = m.lines().find(|l| l.starts_with("router_kv_events_skipped_stores_total{reason=\"orphan\"}")).unwrap();
        l.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let b_orphans = orphans(&metrics(&b.url).await);
    assert!(post(&format!("{}/v1/chat/completions", a.url), &prompt(n)).await.status().is_success());
    eventually("C sees the new prompt", async || known(&c.url, &prompt(n)).await > 0).await;
    eventually("B drops its store as an orphan", async || orphans(&metrics(&b.url).await) > b_orphans).await;
    assert_eq!(known(&b.url, &prompt(n)).await, 0);
    assert_eq!(orphans(&metrics(&c.url).await), 0, "C knows every parent");
    let (mut b_sum, mut c_sum, a_sum): (u64, u64, u64) = (0, 0, held_by_a.iter().sum());
    for (i, want) in held_by_a.iter().enumerate() {
        let (bt, ct) = (known(&b.url, &prompt(i)).await, known(&c.url, &prompt(i)).await);
        assert_eq!(ct, *want, "C knows prompt {i} as A does");
        b_sum += bt;
        c_sum += ct;
    }
    assert_eq!(c_sum, a_sum);
    assert!(b_sum * 2 < a_sum, "B missed the early history: {b_sum} of {a_sum} tokens");

    // What each reports of its streams' history.
    let bw = workers(&b.url).await;
    let missed: u64 = bw["workers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|w| w["kv_history"].as_array().cloned().unwrap_or_default())
        .map(|h| h["missed_batches"].as_u64().unwrap())
        .sum();
    assert!(missed > 0, "B reports the batches it never saw: {bw}");
    assert!(metrics(&b.url).await.contains(&format!("router_kv_events_history_missed_batches_total {missed}")));
    let cw = workers(&c.url).await;
    for w in cw["workers"].as_array().unwrap() {
        let h = &w["kv_history"][0];
        assert!(h["resumed_after_seq"].as_u64().is_some(), "C resumed each stream from the snapshot: {cw}");
    }
    // A stream counts as resumed once a batch follows on from the snapshot: one to each engine.
    for w in &ws {
        assert!(post(&format!("{}/v1/chat/completions", w.url()), &prompt(n + 1)).await.status().is_success());
    }
    eventually("C resumed both streams", async || {
        metrics(&c.url).await.contains("router_kv_snapshot_streams_total{outcome=\"resumed\"} 2")
    })
    .await;
    let cm = metrics(&c.url).await;
    assert!(cm.contains("router_kv_snapshot_streams_total{outcome=\"reset\"} 0"), "{cm}");
    assert!(metrics(&a.url).await.contains("router_kv_snapshots_served_total{outcome=\"ok\"} 1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_older_than_the_publishers_hold_resets_its_streams() {
    let ws = engines().await;
    let refs: Vec<&MockEngine> = ws.iter().collect();
    let a = start(config(&refs, PolicyConfig::cache_aware(), true)).await;
    for i in 0..BUFFER / 2 {
        assert!(post(&format!("{}/v1/chat/completions", a.url), &prompt(i)).await.status().is_success());
    }
    // One prompt straight to each engine, so both publishers have published (the policy's
    // spread of a few requests may leave one engine without any: about 1 run in 128).
    for (k, w) in ws.iter().enumerate() {
        assert!(post(&format!("{}/v1/chat/completions", w.url()), &prompt(1000 + k)).await.status().is_success());
    }
    eventually("A indexes", async || known(&a.url, &prompt(BUFFER / 2 - 1)).await > 0).await;
    // A snapshot now, served later by a stand-in peer, after the publishers moved on past it
    // (once A follows both: under load the second publisher's first batch may come later).
    let snapshot = format!("{}/index/snapshot", a.url);
    eventually("A follows both publishers", async || {
        admin_get(&snapshot).await.headers().get("x-index-streams").is_some_and(|n| n == "2")
    })
    .await;
    let old = admin_get(&snapshot).await;
    assert_eq!(old.status(), 200);
    assert_eq!(old.headers()["x-index-streams"], "2");
    let old = old.bytes().await.unwrap();
    // Every publisher moves on past its buffer (straight to each engine: through A, the
    // policy may send most of them to one).
    for (k, w) in ws.iter().enumerate() {
        for i in BUFFER..3 * BUFFER {
            let p = prompt(i + k * 4 * BUFFER);
            assert!(post(&format!("{}/v1/chat/completions", w.url()), &p).await.status().is_success());
        }
    }
    let peer = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let peer_url = format!("http://{}", peer.local_addr().unwrap());
    let app = axum::Router::new().route(
        "/index/snapshot",
        axum::routing::get(move || {
            let body = old.clone();
            async move { body }
        }),
    );
    tokio::spawn(async move { axum::serve(peer, app).await });
    let mut cc = config(&refs, PolicyConfig::cache_aware(), true);
    cc.index_peers = Some(peers(vec![peer_url]));
    let c = start(cc).await;
    eventually("C resets both stale streams", async || {
        metrics(&c.url).await.contains("router_kv_snapshot_streams_total{outcome=\"reset\"} 2")
    })
    .await;
    // Nothing of the stale snapshot survives where the publishers could not vouch for it: the
    // engines still hold the early prompts (A knows them), but what followed the snapshot is gone
    // from the buffers, so C cannot know whether they were evicted since, and drops them.
    for i in 0..BUFFER / 2 {
        assert!(known(&a.url, &prompt(i)).await > 0);
        assert_eq!(known(&c.url, &prompt(i)).await, 0, "a stale block of prompt {i} was kept");
    }
    let cw = workers(&c.url).await;
    assert!(cw["workers"].as_array().unwrap().iter().all(|w| w["kv_history"][0]["snapshot_reset"] == true), "{cw}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_control_plane_and_need_events() {
    let ws = engines().await;
    let refs: Vec<&MockEngine> = ws.iter().collect();
    let a = start(config(&refs, PolicyConfig::RoundRobin, false)).await;
    let anonymous = reqwest::get(format!("{}/index/snapshot", a.url)).await.unwrap();
    assert_eq!(anonymous.status(), 401);
    let no_events = admin_get(&format!("{}/index/snapshot", a.url)).await;
    assert_eq!(no_events.status(), 503);
    let body: Value = no_events.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("no index snapshot"), "{body}");
}

/// `--index-peer-selector`: the peers are the router pods of a label selector, found through
/// the Kubernetes API (the `mock-k8s` stand-in); only ready pods with an IP and no deletion
/// timestamp are asked, on `--index-peer-port`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_found_by_a_selector_are_the_ready_router_pods() {
    use mock_k8s::{MockApiConfig, MockApiServer, Pod};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    const NS: &str = "routing";
    let ws = engines().await;
    let refs: Vec<&MockEngine> = ws.iter().collect();
    let a = start(config(&refs, PolicyConfig::cache_aware(), true)).await;
    let n = 2 * BUFFER;
    for i in 0..n {
        assert!(post(&format!("{}/v1/chat/completions", a.url), &prompt(i)).await.status().is_success());
    }
    eventually("A indexes the last prompt", async || known(&a.url, &prompt(n - 1)).await > 0).await;
    let port: u16 = a.url.rsplit(':').next().unwrap().parse().unwrap();

    // Pods that must not be asked answer on 127.0.0.3, same port, and count the asks.
    let asked = Arc::new(AtomicUsize::new(0));
    let poison = tokio::net::TcpListener::bind(("127.0.0.3", port)).await.unwrap();
    let counter = asked.clone();
    let app = axum::Router::new().route(
        "/index/snapshot",
        axum::routing::get(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            async { (axum::http::StatusCode::SERVICE_UNAVAILABLE, "not me") }
        }),
    );
    tokio::spawn(async move { axum::serve(poison, app).await });

    let k8s =
        MockApiServer::spawn(MockApiConfig { token: Some("sa".into()), ..MockApiConfig::default() }).await.unwrap();
    let router_pod = |name: &str, ip: &str| Pod::running(NS, name, ip).label("app", "sgl-router");
    // Listed before the good pod (names in order): a starting pod, a terminating one, a
    // pod of another app, and a ready router pod in another namespace.
    k8s.upsert_pod(router_pod("a-starting", "127.0.0.3").ready(false));
    k8s.upsert_pod(router_pod("b-terminating", "127.0.0.3").ready(true));
    k8s.start_deleting(NS, "b-terminating");
    k8s.upsert_pod(Pod::running(NS, "c-engine", "127.0.0.3").label("app", "sglang").ready(true));
    k8s.upsert_pod(Pod::running("elsewhere", "d-router", "127.0.0.3").label("app", "sgl-router").ready(true));
    k8s.upsert_pod(router_pod("router-a", "127.0.0.1").ready(true));

    let mut cc = config(&refs, PolicyConfig::cache_aware(), true);
    let mut setup = peers(Vec::new());
    setup.selector = Some(sgl_router::peers::PeerSelector {
        api: fleet::k8s::api::ApiServer::with_token(&k8s.url(), Some("sa")).unwrap(),
        namespace: Some(NS.into()),
        selector: "app=sgl-router".into(),
        port,
    });
    cc.index_peers = Some(setup);
    let c = start(cc).await;
    eventually("C follows both engines", async || {
        workers(&c.url).await["workers"].as_array().unwrap().iter().filter(|w| w["kv_events"] == "followed").count()
            == 2
    })
    .await;
    let cw = workers(&c.url).await;
    for w in cw["workers"].as_array().unwrap() {
        assert!(w["kv_history"][0]["resumed_after_seq"].as_u64().is_some(), "C resumed from A's snapshot: {cw}");
    }
    for i in 0..n {
        assert_eq!(known(&c.url, &prompt(i)).await, known(&a.url, &prompt(i)).await, "prompt {i}");
    }
    assert_eq!(asked.load(Ordering::SeqCst), 0, "only the ready router pod of the namespace is asked");
    assert!(k8s.requests().iter().any(|r| r.contains("labelSelector=app%3Dsgl-router")), "{:?}", k8s.requests());
}

/// Two peers that accept the connection and never answer (issue #9): the router answers at once,
/// asks both at the same time, and gives up on both at the one deadline
/// (`--index-peer-timeout-secs` in all, not per peer); then its workers join.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_peers_delay_neither_the_port_nor_each_other() {
    const DEADLINE: Duration = Duration::from_secs(4);
    let ws = engines().await;
    let refs: Vec<&MockEngine> = ws.iter().collect();
    // Each peer reports every connection it accepts and holds it open without a word.
    let (asked_tx, mut asked) = tokio::sync::mpsc::channel::<usize>(8);
    let mut urls = Vec::new();
    for p in 0..2 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        urls.push(format!("http://{}", listener.local_addr().unwrap()));
        let tx = asked_tx.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
                let _ = tx.send(p).await;
            }
        });
    }
    let mut cc = config(&refs, PolicyConfig::cache_aware(), true);
    let mut setup = peers(urls);
    setup.timeout = DEADLINE;
    cc.index_peers = Some(setup);

    let started = Instant::now();
    let app = App::build(cc).await.unwrap();
    let url = format!("http://{}", app.local_addr());
    let caught_up = app.caught_up();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(app.run(async move {
        let _ = rx.await;
    }));
    // Both peers are asked at once: the second ask does not wait out the first.
    let mut seen = std::collections::HashSet::new();
    while seen.len() < 2 {
        let p = tokio::time::timeout_at((started + DEADLINE / 2).into(), asked.recv())
            .await
            .unwrap_or_else(|_| panic!("both peers asked within {:?}; asked: {seen:?}", DEADLINE / 2))
            .unwrap();
        seen.insert(p);
    }
    // The port answers meanwhile; not ready, as no worker has joined yet.
    let client = reqwest::Client::new();
    let health = client.get(format!("{url}/health")).timeout(DEADLINE / 2).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let answered = started.elapsed();
    assert!(answered < DEADLINE / 2, "/health answered after {answered:?}, the deadline is {DEADLINE:?}");
    let ready = client.get(format!("{url}/readiness")).timeout(DEADLINE / 2).send().await.unwrap();
    assert_eq!(ready.status(), 503, "ready before its workers joined");
    // The catch-up gives up at the one deadline (one per peer would be twice as long).
    tokio::time::timeout_at((started + DEADLINE * 3 / 2).into(), caught_up)
        .await
        .unwrap_or_else(|_| panic!("catch-up not over {:?} after the start", DEADLINE * 3 / 2));
    let over = started.elapsed();
    assert!(over >= DEADLINE, "gave up after {over:?}, before the deadline {DEADLINE:?}");
    // Then the workers join, followed from scratch.
    eventually("the router follows both engines", async || {
        workers(&url).await["workers"].as_array().unwrap().iter().filter(|w| w["kv_events"] == "followed").count() == 2
    })
    .await;
    let ready = client.get(format!("{url}/readiness")).timeout(DEADLINE).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    let _ = stop.send(());
}
