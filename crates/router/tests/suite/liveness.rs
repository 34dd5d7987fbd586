//! Liveness that health probes miss, end to end on simulated engines (issue
//! 30): a worker that stops streaming mid-answer while requests pile on it
//! leaves routing (wedged) and comes back when it makes progress; a worker
//! reporting a full queue is skipped while another is under the thresholds,
//! or the request shed with `shed`; a worker gone silent is stalled by its
//! next failed poll and back at its first answer; one polled once and silent
//! since goes stale. Each state shows in `/workers` and `/metrics`.

use crate::common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::app::{admin_get, chat, config, engine_config, metric, post, start};
use common::eventually as until;
use fleet::liveness::{LivenessConfig, Overload};
use mock_engine::{Faults, MockEngine, MockEngineConfig};
use serde_json::Value;
use sgl_router::app::PolicyConfig;

/// `/workers`' veto of the worker at `url` (`None`: routed to).
async fn veto(router: &str, url: &str) -> Option<String> {
    let v: Value = admin_get(&format!("{router}/workers")).await.json().await.unwrap();
    let w = v["workers"].as_array().unwrap().iter().find(|w| w["url"] == url).cloned().unwrap();
    w["veto"].as_str().map(str::to_owned)
}

fn served(w: &MockEngine) -> u64 {
    w.engine().requests.load(Ordering::SeqCst)
}

/// Streams a chat through the router and returns once its first chunk arrived.
async fn first_chunk_of_a_stream(router: &str) -> reqwest::Response {
    let mut body = chat("s", "a long answer");
    body["stream"] = true.into();
    body["max_tokens"] = 8.into();
    let mut resp =
        reqwest::Client::new().post(format!("{router}/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "), "{first:?}");
    resp
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_stops_streaming_mid_answer_leaves_routing_and_comes_back_when_it_progresses() {
    let (w1, w2) =
        (MockEngine::spawn(engine_config()).await.unwrap(), MockEngine::spawn(engine_config()).await.unwrap());
    let wedge = Duration::from_millis(400);
    let mut c = config(&[&w1, &w2], PolicyConfig::RoundRobin, false);
    c.liveness = LivenessConfig { wedge, ..LivenessConfig::default() };
    let r = start(c).await;
    let url = format!("{}/v1/chat/completions", r.url);
    // Round robin from the first worker: the stream goes to w1, which stops after its first chunk.
    w1.engine().set_faults(Faults { wedge_mid_stream_next: 1, ..Faults::default() }).await;
    let stream = first_chunk_of_a_stream(&r.url).await;
    let stalled_at = Instant::now();
    assert_eq!(served(&w1), 1, "the stream went to w1");
    // New requests pile on w1 without an answer (held before their first byte).
    w1.engine().set_faults(Faults { hold_next: 100, ..Faults::default() }).await;
    let mut piled = Vec::new();
    let held = || w1.engine().held.load(Ordering::SeqCst) as u64;
    while held() < 2 {
        let (url, body) = (url.clone(), chat("s", &format!("q{}", piled.len())));
        let before = held() + served(&w2);
        piled.push(tokio::spawn(async move { reqwest::Client::new().post(url).json(&body).send().await }));
        until("the request reached a worker", async || held() + served(&w2) > before).await;
    }
    until("w1 is wedged", async || veto(&r.url, &w1.url()).await.as_deref() == Some("wedged")).await;
    assert!(stalled_at.elapsed() >= wedge, "never before --worker-wedge-secs of silence");
    let series = format!("router_worker_vetoed{{worker=\"{}\",veto=\"wedged\"}}", w1.url());
    assert_eq!(metric(&r.url, &series).await, 1.0);
    // While it is wedged, every new request goes to w2.
    let (before1, before2) = (served(&w1), served(&w2));
    for i in 0..6 {
        assert_eq!(post(&url, &chat("s", &format!("after {i}"))).await.status(), 200);
    }
    assert_eq!((served(&w1), served(&w2)), (before1, before2 + 6), "w1 left out while wedged");
    let skipped = format!("router_worker_vetoes_total{{worker=\"{}\",veto=\"wedged\"}}", w1.url());
    assert!(metric(&r.url, &skipped).await >= 6.0);
    // It makes progress: the stream and the piled requests go on; w1 is routed to again.
    w1.engine().set_faults(Faults::default()).await;
    w1.engine().release_held(100);
    let text = stream.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "the wedged stream finished: {text}");
    for p in piled {
        assert_eq!(p.await.unwrap().unwrap().status(), 200);
    }
    until("w1 is clear", async || veto(&r.url, &w1.url()).await.is_none()).await;
    let before1 = served(&w1);
    for i in 0..4 {
        assert_eq!(post(&url, &chat("s", &format!("back {i}"))).await.status(), 200);
    }
    assert_eq!(served(&w1), before1 + 2, "w1 back in round robin");
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_worker_is_skipped_and_when_all_are_the_request_is_shed_only_when_asked() {
    for shed in [false, true] {
        let (w1, w2) =
            (MockEngine::spawn(engine_config()).await.unwrap(), MockEngine::spawn(engine_config()).await.unwrap());
        let mut c = config(&[&w1, &w2], PolicyConfig::RoundRobin, false);
        c.liveness = LivenessConfig {
            overload: Some(Overload { waiting_requests: 8, token_usage: 0.8 }),
            shed,
            ..LivenessConfig::default()
        };
        let r = start(c).await;
        let url = format!("{}/v1/chat/completions", r.url);
        // w1 reports eight queued requests (other routers' load): overloaded at the next poll.
        w1.engine().set_faults(Faults { report_waiting_extra: 8, ..Faults::default() }).await;
        until("w1 is overloaded", async || veto(&r.url, &w1.url()).await.as_deref() == Some("overloaded")).await;
        let reported = format!("router_worker_reported_waiting_requests{{worker=\"{}\"}}", w1.url());
        assert_eq!(metric(&r.url, &reported).await, 8.0);
        let by_rank = format!("router_engine_waiting_requests{{worker=\"{}\",dp_rank=\"0\"}}", w1.url());
        assert_eq!(metric(&r.url, &by_rank).await, 8.0, "the engine's own gauge, per rank");
        for i in 0..4 {
            assert_eq!(post(&url, &chat("s", &format!("q{i}"))).await.status(), 200);
        }
        assert_eq!((served(&w1), served(&w2)), (0, 4), "the overloaded worker is skipped");
        // Both overloaded: the least loaded takes it, or it is shed.
        w2.engine().set_faults(Faults { report_waiting_extra: 9, ..Faults::default() }).await;
        until("w2 is overloaded", async || veto(&r.url, &w2.url()).await.as_deref() == Some("overloaded")).await;
        let resp = post(&url, &chat("s", "all full")).await;
        if shed {
            assert_eq!(resp.status(), 503);
            assert_eq!(resp.headers()["retry-after"], "1");
            let v: Value = resp.json().await.unwrap();
            assert_eq!(v["error"]["type"], "worker_overload_protection_shed", "{v}");
            assert_eq!(served(&w1) + served(&w2), 4, "nothing sent");
        } else {
            assert_eq!(resp.status(), 200);
            assert_eq!(served(&w1), 1, "the least loaded (8 queued against 9) took it");
        }
        // The queues drain: both are routed to again.
        w1.engine().set_faults(Faults::default()).await;
        w2.engine().set_faults(Faults::default()).await;
        until("both clear", async || {
            veto(&r.url, &w1.url()).await.is_none() && veto(&r.url, &w2.url()).await.is_none()
        })
        .await;
        assert_eq!(post(&url, &chat("s", "drained")).await.status(), 200);
        let _ = r.stop.send(());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_worker_is_stalled_by_its_next_failed_poll_or_stale_and_back_when_heard_from() {
    for stall_off in [false, true] {
        let (w1, w2) =
            (MockEngine::spawn(engine_config()).await.unwrap(), MockEngine::spawn(engine_config()).await.unwrap());
        let listen: std::net::SocketAddr = w1.url().trim_start_matches("http://").parse().unwrap();
        let mut c = config(&[&w1, &w2], PolicyConfig::RoundRobin, false);
        let (stall, stale) = (Duration::from_millis(300), Duration::from_millis(600));
        c.liveness = LivenessConfig {
            stall: if stall_off { Duration::ZERO } else { stall },
            stale,
            ..LivenessConfig::default()
        };
        let r = start(c).await;
        until("w1 polled", async || {
            let v: Value = admin_get(&format!("{}/workers", r.url)).await.json().await.unwrap();
            v["workers"][0]["load_reported"] == true
        })
        .await;
        let url = w1.url();
        w1.shutdown();
        drop(w1);
        let expect = if stall_off { "stale" } else { "stalled" };
        until(expect, async || veto(&r.url, &url).await.as_deref() == Some(expect)).await;
        let series = format!("router_worker_vetoed{{worker=\"{url}\",veto=\"{expect}\"}}");
        assert_eq!(metric(&r.url, &series).await, 1.0);
        for i in 0..3 {
            let resp = post(&format!("{}/v1/chat/completions", r.url), &chat("s", &format!("q{i}"))).await;
            assert_eq!(resp.status(), 200);
        }
        assert_eq!(served(&w2), 3);
        // Never tried (a failed try would have quarantined it): the veto kept the requests off it.
        let worker = r.gateway.fleet.all().into_iter().find(|w| w.url.as_str() == url).unwrap();
        assert!(worker.is_routable() && !worker.quarantined(), "still in rotation by its probes, never tried");
        let skipped = format!("router_worker_vetoes_total{{worker=\"{url}\",veto=\"{expect}\"}}");
        assert!(metric(&r.url, &skipped).await >= 3.0);
        // The engine is back on its port: its next poll answers and the veto ends.
        let back = MockEngine::spawn(MockEngineConfig { listen, ..engine_config() }).await.unwrap();
        until("heard from again", async || veto(&r.url, &url).await.is_none()).await;
        drop(back);
        let _ = r.stop.send(());
    }
}

/// `/workers`' warm-up phase of the worker at `url` (`None`: warm).
async fn warmup(router: &str, url: &str) -> Option<String> {
    let v: Value = admin_get(&format!("{router}/workers")).await.json().await.unwrap();
    let w = v["workers"].as_array().unwrap().iter().find(|w| w["url"] == url).cloned().unwrap();
    w["warmup"].as_str().map(str::to_owned)
}

/// cache_aware sends every request sharing a prefix to the worker holding it: a worker that
/// holds nothing (new, or restarted empty) would get none. With the warm-up slice, the thin
/// worker gets one hit in eight until its cache has grown; without it, none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_an_empty_cache_gets_its_warm_up_share_where_cache_affinity_would_starve_it() {
    let system = "A long shared system prompt every request of this test starts with. ".repeat(60);
    for divert_every in [0u64, 8] {
        let (w0, w1) =
            (MockEngine::spawn(engine_config()).await.unwrap(), MockEngine::spawn(engine_config()).await.unwrap());
        let mut c = config(&[&w0, &w1], PolicyConfig::cache_aware(), true);
        if let PolicyConfig::CacheAware(ca, _) = &mut c.policy {
            ca.warmup_divert_every = divert_every;
        }
        let r = start(c).await;
        let url = format!("{}/v1/chat/completions", r.url);
        until("both followed", async || r.gateway.fleet.all().iter().all(|w| w.is_followed() && w.is_routable())).await;
        assert_eq!(post(&url, &chat(&system, "first")).await.status(), 200);
        let (holder, starved) = if served(&w0) == 1 { (&w0, &w1) } else { (&w1, &w0) };
        until("the other worker is thin", async || warmup(&r.url, &starved.url()).await.as_deref() == Some("thin"))
            .await;
        let series = format!("router_worker_warming{{worker=\"{}\"}}", starved.url());
        assert_eq!(metric(&r.url, &series).await, 2.0);
        let before = (served(holder), served(starved));
        for i in 0..8 {
            assert_eq!(post(&url, &chat(&system, &format!("q{i}"))).await.status(), 200);
        }
        let got = (served(holder) - before.0, served(starved) - before.1);
        eprintln!(
            "--worker-warmup-divert-every {divert_every}: 8 hits on the holder's prefix went {got:?} (holder, thin)"
        );
        if divert_every == 0 {
            assert_eq!(got, (8, 0), "cache affinity alone starves the thin worker");
        } else {
            assert_eq!(got, (7, 1), "the eighth hit is diverted to the thin worker");
            let reasons = "router_policy_decisions_total{policy=\"cache_aware\",reason=\"warmup_divert\"}";
            assert_eq!(metric(&r.url, reasons).await, 1.0);
        }
        let _ = r.stop.send(());
    }
}

/// A worker that answers every request 503 (an engine still loading) and records when its
/// `/health` was asked.
async fn loading_worker() -> (String, std::sync::Arc<std::sync::Mutex<Vec<Instant>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let probes = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = probes.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                while let Ok(n) = tcp.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                    if buf[..n].starts_with(b"GET /health ") {
                        seen.lock().unwrap().push(Instant::now());
                    }
                    let answer = "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 7\r\n\r\nloading";
                    if tcp.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, probes)
}

/// SMG's `--worker-startup-*`: a new worker's first probe waits the delay, a worker never
/// healthy is probed at the check interval, and one not healthy within the timeout is removed
/// (its registration failed) while the others serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_never_comes_up_is_probed_at_the_startup_interval_and_removed_after_the_timeout() {
    let w = MockEngine::spawn(engine_config()).await.unwrap();
    let (loading, probes) = loading_worker().await;
    let mut c = config(&[&w], PolicyConfig::RoundRobin, false);
    c.workers.push(router_types::WorkerUrl::parse(&loading).unwrap());
    let (delay, every, timeout) = (Duration::from_millis(700), Duration::from_secs(2), Duration::from_secs(5));
    c.health.startup = fleet::StartupConfig { delay, check_interval: every, timeout };
    let started = Instant::now();
    let r = start(c).await;
    until("two probes of the loading worker", async || probes.lock().unwrap().len() >= 2).await;
    let seen = probes.lock().unwrap().clone();
    assert!(seen[0] - started >= delay, "the first probe waited {delay:?}: {:?}", seen[0] - started);
    assert!(seen[1] - seen[0] >= every / 2 + every / 4, "probed at the check interval: {:?}", seen[1] - seen[0]);
    // Meanwhile the healthy worker serves.
    assert_eq!(post(&format!("{}/v1/chat/completions", r.url), &chat("s", "u")).await.status(), 200);
    for _ in 0..400 {
        if r.gateway.fleet.all().len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(r.gateway.fleet.all().len(), 1, "the loading worker is removed after the startup timeout");
    assert!(started.elapsed() >= timeout);
    assert_eq!(metric(&r.url, "router_workers_removed_total").await, 1.0);
    let _ = r.stop.send(());
}

/// SMG's `--health-check-port`: the probes, and only they, on a listener of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probes_are_served_on_the_health_check_port_and_nothing_else() {
    let w = MockEngine::spawn(engine_config()).await.unwrap();
    let mut c = config(&[&w], PolicyConfig::RoundRobin, false);
    c.probe_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    let r = start(c).await;
    let probes = r.probes.clone().expect("a probe listener");
    assert_ne!(probes, r.url);
    let client = reqwest::Client::new();
    for path in ["/health", "/liveness"] {
        let resp = client.get(format!("{probes}{path}")).send().await.unwrap();
        assert_eq!((resp.status().as_u16(), resp.text().await.unwrap()), (200, "ok".to_string()), "{path}");
    }
    until("ready", async || client.get(format!("{probes}/readiness")).send().await.unwrap().status() == 200).await;
    let ready: Value = client.get(format!("{probes}/readiness")).send().await.unwrap().json().await.unwrap();
    assert_eq!((ready["ready"].as_bool(), ready["healthy_workers"].as_u64()), (Some(true), Some(1)));
    let resp = client.post(format!("{probes}/v1/chat/completions")).json(&chat("s", "u")).send().await.unwrap();
    assert_eq!(resp.status(), 404, "no data plane on the probe port");
    assert_eq!(client.get(format!("{probes}/workers")).send().await.unwrap().status(), 404, "no control plane");
    let _ = r.stop.send(());
}

/// SMG's `--upstream-pool-idle-timeout-secs`: a pooled worker connection idle that long is not
/// reused (it would race the engine's own keep-alive timeout); one used sooner is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_worker_connection_idle_past_the_pool_timeout_is_not_reused() {
    use std::sync::atomic::AtomicUsize;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    // Connections that carried a chat (the probes come on connections of their own).
    let chat_connections = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = chat_connections.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let counted = counted.clone();
            tokio::spawn(async move {
                let (mut buf, mut posted) = (vec![0u8; 65536], false);
                while let Ok(n) = tcp.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                    if buf[..n].starts_with(b"POST") && !std::mem::replace(&mut posted, true) {
                        counted.fetch_add(1, Ordering::SeqCst);
                    }
                    let body = r#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}"#;
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if tcp.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let mut c = config(&[], PolicyConfig::RoundRobin, false);
    c.workers = vec![router_types::WorkerUrl::parse(&url).unwrap()];
    c.serve_threads = 1;
    c.upstream_pool_idle = Duration::from_millis(300);
    let r = start(c).await;
    let chat_url = format!("{}/v1/chat/completions", r.url);
    let http = reqwest::Client::new();
    for _ in 0..3 {
        assert_eq!(http.post(&chat_url).json(&chat("s", "u")).send().await.unwrap().status(), 200);
    }
    assert_eq!(chat_connections.load(Ordering::SeqCst), 1, "reused while fresh");
    // Idle past the pool's timeout: the next request opens a new connection.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(http.post(&chat_url).json(&chat("s", "u")).send().await.unwrap().status(), 200);
    assert_eq!(chat_connections.load(Ordering::SeqCst), 2, "not reused once idle past the timeout");
    let _ = r.stop.send(());
}
