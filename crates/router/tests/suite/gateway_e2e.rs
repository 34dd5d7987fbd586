//! The router end to end: the real `App` on 127.0.0.1 in front of simulated
//! engines (real HTTP and real ZMQ KV events). Cache-aware and min-TTFT routing
//! follow the events and move away from an overloaded holder; streams pass through; a
//! worker dying mid-stream gives the client a clean error and leaves rotation;
//! bad requests get precise statuses; `/debug/route` changes nothing;
//! `/metrics` is valid Prometheus text.

use crate::common;

use common::app::{Running, admin_get, admin_post, chat, config, engine_config, metric, post, start};
use common::eventually as until;

use std::net::SocketAddr;
use std::time::Duration;

use mock_engine::{Faults, MockEngine, MockEngineConfig};
use router_types::WorkerUrl;
use serde_json::{Value, json};
use sgl_router::app::PolicyConfig;

async fn debug(r: &Running, body: &Value) -> Value {
    admin_post(&format!("{}/debug/route", r.url), body).await.json().await.unwrap()
}

/// The router sends `body` to `worker` because of a cache hit (a tie-break landing there does not count).
async fn hit_on(r: &Running, body: &Value, worker: &str) -> bool {
    let d = debug(r, body).await;
    d["worker"] == worker && d["reason"] == "cache_hit"
}

/// Sends a request straight to an engine (not through the router), so its cache warms.
async fn warm(m: &MockEngine, body: &Value) {
    let r = post(&format!("{}/v1/chat/completions", m.url()), body).await;
    assert_eq!(r.status(), 200);
}

/// Two workers behind a router with `policy` and KV events; w1 alone holds a
/// ~2.2 k-token system prompt, and the router knows it. Returns the workers,
/// the router, the prompt and a question under it.
async fn w1_holds_a_system_prompt(policy: PolicyConfig) -> (MockEngine, MockEngine, Running, String, Value) {
    let (w0, w1) =
        (MockEngine::spawn(engine_config()).await.unwrap(), MockEngine::spawn(engine_config()).await.unwrap());
    let r = start(config(&[&w0, &w1], policy, true)).await;
    let system = "Shared system prompt about KV caches. ".repeat(60);
    warm(&w1, &chat(&system, "warm up")).await;
    let q = chat(&system, "a question");
    until("the index learned w1's cache", async || hit_on(&r, &q, &w1.url()).await).await;
    (w0, w1, r, system, q)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_aware_follows_events_and_the_pressure_guard() {
    let (w0, w1, r, system, q) = w1_holds_a_system_prompt(PolicyConfig::cache_aware()).await;
    let d = debug(&r, &q).await;
    assert_eq!(d["reason"], "cache_hit");
    assert_eq!(d["policy"], "cache_aware");
    // A salted request has its own chain: w1's unsalted cache is no match for it.
    let mut salted = q.clone();
    salted["cache_salt"] = json!("tenant-b");
    let ds = debug(&r, &salted).await;
    assert!(ds["candidates"].as_array().unwrap().iter().all(|c| c["matched_tokens"] == 0), "{ds}");
    assert_eq!(d["candidates"].as_array().unwrap().len(), 2, "every healthy worker listed");
    let w1_matched =
        d["candidates"].as_array().unwrap().iter().find(|c| c["worker"] == w1.url()).unwrap()["matched_tokens"]
            .as_u64()
            .unwrap();
    assert!(w1_matched >= 2048 && w1_matched % 16 == 0, "{d}");
    let resp: Value = post(&format!("{}/v1/chat/completions", r.url), &q).await.json().await.unwrap();
    assert!(resp["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() >= 2048, "{resp}");

    // w0 holds the system prompt too, w1 a bit more of the conversation: w1 is the best hit...
    let longer = format!("{system}Shared follow-up context. {}", "x".repeat(200));
    warm(&w0, &chat(&system, "warm up")).await;
    warm(&w1, &chat(&longer, "warm up")).await;
    let probe = chat(&longer, "next");
    until("both hold the prefix, w1 more of it", async || {
        let d = debug(&r, &probe).await;
        let m = |url: String| {
            d["candidates"].as_array().unwrap().iter().find(|c| c["worker"] == url).unwrap()["matched_tokens"]
                .as_u64()
                .unwrap()
        };
        m(w0.url()) >= 2048 && m(w1.url()) > m(w0.url())
    })
    .await;
    assert_eq!(debug(&r, &probe).await["worker"], w1.url());
    // ...until it owes much more prefill than w0: a request with a long new tail hangs on w1.
    w1.engine().set_faults(Faults { hang_next: 1, ..Faults::default() }).await;
    let heavy = chat(&longer, &"new material ".repeat(400));
    let hung = {
        let url = format!("{}/v1/chat/completions", r.url);
        tokio::spawn(async move { reqwest::Client::new().post(url).json(&heavy).send().await })
    };
    until("the heavy request is in flight on w1", async || {
        r.gateway.fleet.all().iter().any(|w| w.load().uncached_tokens > 4000)
    })
    .await;
    let d = debug(&r, &probe).await;
    assert_eq!(
        (d["worker"].as_str().unwrap(), d["reason"].as_str().unwrap()),
        (w0.url().as_str(), "cache_hit_less_loaded"),
        "{d}"
    );
    hung.abort();
    until("load released once", async || r.gateway.fleet.all().iter().all(|w| w.load().in_flight == 0)).await;
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_ttft_follows_the_hit_until_the_holder_owes_more_prefill() {
    let (w0, w1, r, system, q) = w1_holds_a_system_prompt(PolicyConfig::MinTtft(Default::default())).await;
    let d = debug(&r, &q).await;
    assert_eq!((d["policy"].as_str(), d["reason"].as_str()), (Some("min_ttft"), Some("cache_hit")), "{d}");
    // A long request sharing the prefix also goes to w1, and hangs there before its first byte:
    // w1 now owes its ~26 k uncached tokens of prefill.
    w1.engine().set_faults(Faults { hang_next: 1, ..Faults::default() }).await;
    let heavy = chat(&system, &"new material ".repeat(2000));
    assert_eq!(debug(&r, &heavy).await["worker"], w1.url());
    let hung = {
        let url = format!("{}/v1/chat/completions", r.url);
        tokio::spawn(async move { reqwest::Client::new().post(url).json(&heavy).send().await })
    };
    let owed = |url: String| {
        r.gateway.fleet.all().iter().find(|w| w.url.as_str() == url).map_or(0, |w| w.load().uncached_tokens)
    };
    until("the heavy request is in flight on w1", async || owed(w1.url()) > 20_000).await;
    // The hit on w1 waits behind 26 k tokens, more than its ~2.2 k cached tokens' credit (x4):
    // all of the prompt on idle w0 is faster.
    let d = debug(&r, &q).await;
    assert_eq!((d["worker"].as_str(), d["reason"].as_str()), (Some(w0.url().as_str()), Some("least_load")), "{d}");
    // A completed request leaves no prefill owed behind.
    let done = post(&format!("{}/v1/chat/completions", r.url), &q).await;
    assert_eq!(done.status(), 200);
    let _ = done.bytes().await;
    until("the answered request released its load", async || owed(w0.url()) == 0).await;
    hung.abort();
    until("load released once", async || r.gateway.fleet.all().iter().all(|w| w.load().in_flight == 0)).await;
    assert_eq!(owed(w1.url()), 0);
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_answer_passes_through_with_its_headers_and_length_unfollowed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // A worker that is healthy but redirects every request elsewhere.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let worker = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let n = socket.read(&mut buf).await.unwrap_or(0);
                let head = if buf[..n].starts_with(b"GET /health") {
                    "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n"
                } else {
                    "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://127.0.0.1:9/elsewhere\r\nx-worker-id: w7\r\ncontent-type: application/json\r\ncontent-length: 2\r\n"
                };
                let _ = socket.write_all(format!("{head}connection: close\r\n\r\n{{}}").as_bytes()).await;
            });
        }
    });
    let mut cfg = config(&[], PolicyConfig::RoundRobin, false);
    cfg.workers.push(WorkerUrl::new(worker.as_str()));
    let r = start(cfg).await;
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let resp = client.post(format!("{}/v1/chat/completions", r.url)).json(&chat("s", "q")).send().await.unwrap();
    assert_eq!(resp.status(), 307, "the redirect is the client's to follow");
    let header = |name: &str| resp.headers().get(name).map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(header("location").as_deref(), Some("http://127.0.0.1:9/elsewhere"));
    assert_eq!(header("x-worker-id").as_deref(), Some("w7"));
    assert_eq!(header("content-length").as_deref(), Some("2"), "a sized answer stays sized");
    assert_eq!(header("transfer-encoding"), None);
    assert_eq!(resp.text().await.unwrap(), "{}");
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_starts_after_the_router_joins_within_seconds() {
    // A free port with nothing on it yet: the router's first probe is refused.
    let port = crate::common::free_port();
    let listen: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut cfg = config(&[], PolicyConfig::RoundRobin, false);
    cfg.workers.push(WorkerUrl::new(format!("http://{listen}")));
    let r = start(cfg).await; // the health interval is an hour: only the down-worker probe can bring it back
    let url = format!("{}/v1/chat/completions", r.url);
    until("the worker is out of rotation", async || !r.gateway.fleet.all()[0].is_healthy()).await;
    assert_eq!(post(&url, &chat("s", "q")).await.status(), 503);
    let _w = MockEngine::spawn(MockEngineConfig { listen, ..engine_config() }).await.unwrap();
    until("the late worker is back in rotation", async || r.gateway.fleet.all()[0].is_healthy()).await;
    assert_eq!(post(&url, &chat("s", "q")).await.status(), 200);
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_that_other_routers_put_on_a_worker_is_seen_in_its_load_report() {
    // Slow engines (1,000 prefill tokens a second) so that a long prompt queues.
    let slow = MockEngineConfig {
        fast: false,
        speedup: 1.0,
        prefill_tokens_per_s: 1000.0,
        prefill_fixed: Duration::ZERO,
        ..engine_config()
    };
    let (w0, w1) = (MockEngine::spawn(slow.clone()).await.unwrap(), MockEngine::spawn(slow).await.unwrap());
    let r = start(config(&[&w0, &w1], PolicyConfig::MinTtft(Default::default()), false)).await;
    // Another router's traffic, straight to w0: a long prompt prefilling and one queued behind it.
    let heavy = chat("s", &"x".repeat(5000));
    let others: Vec<_> = (0..2)
        .map(|_| {
            let (url, body) = (format!("{}/v1/chat/completions", w0.url()), heavy.clone());
            tokio::spawn(async move { reqwest::Client::new().post(url).json(&body).send().await })
        })
        .collect();
    let reported = |url: String| {
        r.gateway.fleet.all().iter().find(|w| w.url.as_str() == url).map_or(0, |w| w.reported_uncached_tokens())
    };
    until("w0 reports the queued prompt", async || reported(w0.url()) > 4000).await;
    let loads: Value = reqwest::get(format!("{}/v1/loads", w0.url())).await.unwrap().json().await.unwrap();
    assert_eq!(loads["loads"][0]["num_waiting_reqs"], 1, "{loads}");
    assert_eq!(loads["loads"][0]["num_running_reqs"], 1, "{loads}");
    // This router sent w0 nothing, yet it keeps away from it (idle workers would otherwise take turns).
    for _ in 0..4 {
        let d = debug(&r, &chat("s", "q")).await;
        assert_eq!(d["worker"], w1.url(), "{d}");
    }
    let listed: Value = admin_get(&format!("{}/workers", r.url)).await.json().await.unwrap();
    assert!(listed["workers"][0]["reported_uncached_tokens"].as_u64().unwrap() > 4000, "{listed}");
    for t in others {
        t.abort();
    }
    until("the report clears once the other router's requests are gone", async || reported(w0.url()) == 0).await;
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_pass_through_and_a_dying_worker_leaves_rotation() {
    let w = MockEngine::spawn(engine_config()).await.unwrap();
    let r = start(config(&[&w], PolicyConfig::RoundRobin, false)).await;
    let mut body = chat("sys", "stream this");
    body["stream"] = json!(true);
    let direct = post(&format!("{}/v1/chat/completions", w.url()), &body).await.text().await.unwrap();
    let routed = post(&format!("{}/v1/chat/completions", r.url), &body).await;
    assert_eq!(routed.headers()["content-type"], "text/event-stream");
    let routed = routed.text().await.unwrap();
    let contents = |s: &str| -> Vec<Value> {
        s.split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .map(|d| {
                serde_json::from_str::<Value>(d)
                    .map(|mut v| {
                        // Times, ids and the cache state differ between the two calls; the rest must not.
                        if let Some(o) = v.as_object_mut() {
                            o.remove("created");
                            o.remove("id");
                        }
                        if let Some(u) = v.get_mut("usage").and_then(Value::as_object_mut) {
                            u.remove("prompt_tokens_details");
                        }
                        v
                    })
                    .unwrap_or(json!(d))
            })
            .collect()
    };
    assert_eq!(contents(&routed), contents(&direct), "chunks pass through unchanged");

    // The worker dies after its first chunk: the client gets a clean error event.
    w.engine().set_faults(Faults { die_mid_stream_next: 1, ..Faults::default() }).await;
    let ok = "router_http_requests_total{route=\"chat\",status=\"200\"}";
    let before = metric(&r.url, ok).await;
    let text = post(&format!("{}/v1/chat/completions", r.url), &body).await.text().await.unwrap();
    assert!(text.contains("\"type\":\"upstream_unreachable\"") && text.ends_with("data: [DONE]\n\n"), "{text}");
    // Counted by the status the client got (its head said 200), and as an answer cut.
    assert_eq!(metric(&r.url, ok).await, before + 1.0);
    assert_eq!(metric(&r.url, "router_http_answers_cut_total{route=\"chat\"}").await, 1.0);
    let page = admin_get(&format!("{}/metrics", r.url)).await.text().await.unwrap();
    assert!(!page.contains("router_http_requests_total{route=\"chat\",status=\"502\"}"), "{page}");
    let workers: Value = admin_get(&format!("{}/workers", r.url)).await.json().await.unwrap();
    assert_eq!(workers["workers"][0]["healthy"], false, "the failed worker left rotation");
    assert_eq!(workers["workers"][0]["in_flight"], 0, "its load was released");
    let after = post(&format!("{}/v1/chat/completions", r.url), &chat("s", "u")).await;
    assert_eq!(after.status(), 503);
    let ready = reqwest::get(format!("{}/readiness", r.url)).await.unwrap();
    assert_eq!(ready.status(), 503);
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_have_precise_statuses_and_debug_route_changes_nothing() {
    let w = MockEngine::spawn(engine_config()).await.unwrap();
    // A second worker that is not there: its requests fail to connect and are retried on w.
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let mut cfg = config(&[&w], PolicyConfig::RoundRobin, false);
    cfg.workers.push(WorkerUrl::new(gone.as_str()));
    // Retries are what this checks: no liveness veto keeps the dead worker from being tried.
    cfg.liveness = fleet::liveness::LivenessConfig::off();
    let r = start(cfg).await;
    let url = format!("{}/v1/chat/completions", r.url);
    let client = reqwest::Client::new();

    let bad = client.post(&url).body("{oops").send().await.unwrap();
    assert_eq!(bad.status(), 400);
    let e: Value = bad.json().await.unwrap();
    assert_eq!(e["error"]["type"], "invalid_request_error");
    assert_eq!(e["error"]["code"], 400);
    assert_eq!(client.post(&url).json(&json!({"messages": "no"})).send().await.unwrap().status(), 400);
    let big = json!({"messages": [{"role": "user", "content": "x".repeat(100_000)}]});
    assert_eq!(client.post(&url).json(&big).send().await.unwrap().status(), 413);
    let nf = client.get(format!("{}/v2/nothing", r.url)).send().await.unwrap();
    assert_eq!(nf.status(), 404);
    let e: Value = nf.json().await.unwrap();
    assert_eq!(e["error"]["type"], "not_found");

    // The first health check took the dead worker out; put it back so round robin reaches it:
    // the request is retried once on w, and the dead one leaves rotation again.
    until("the first health check ran", async || r.gateway.fleet.all().iter().any(|x| !x.is_healthy())).await;
    for x in r.gateway.fleet.all() {
        x.set_healthy(true);
    }
    for _ in 0..3 {
        assert_eq!(post(&url, &chat("s", "u")).await.status(), 200);
    }
    let workers: Value = admin_get(&format!("{}/workers", r.url)).await.json().await.unwrap();
    let dead = workers["workers"].as_array().unwrap().iter().find(|x| x["url"] == gone).unwrap().clone();
    assert_eq!(dead["healthy"], false);

    // /debug/route: an answer, and nothing charged or counted.
    let before = admin_get(&format!("{}/metrics", r.url)).await.text().await.unwrap();
    let d = debug(&r, &chat("s", "u")).await;
    assert_eq!(d["worker"], w.url());
    assert_eq!(d["policy"], "round_robin");
    let d = admin_post(&format!("{}/debug/route?route=generate", r.url), &json!({"text": "hello"})).await;
    assert_eq!(d.status(), 200);
    let after = admin_get(&format!("{}/metrics", r.url)).await.text().await.unwrap();
    let requests = |m: &str| {
        m.lines().filter(|l| l.starts_with("router_http_requests_total")).map(str::to_string).collect::<Vec<_>>()
    };
    assert_eq!(requests(&before), requests(&after), "debug/route is not a request");
    assert!(r.gateway.fleet.all().iter().all(|w| w.load().in_flight == 0));

    // /metrics is Prometheus text: comments, or `name{labels} number`.
    for line in after.lines().filter(|l| !l.is_empty()) {
        if line.starts_with('#') {
            assert!(line.starts_with("# HELP ") || line.starts_with("# TYPE "), "{line}");
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value: {line}"));
        assert!(value.parse::<f64>().is_ok() || value == "+Inf", "value of {line}");
        let name = series.split('{').next().unwrap();
        assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "name of {line}");
        assert!(!series.contains('{') || series.ends_with('}'), "labels of {line}");
    }
    assert!(after.contains("router_http_requests_total{route=\"chat\",status=\"400\"} 2"), "{after}");
    assert!(after.contains("router_http_requests_total{route=\"chat\",status=\"413\"} 1"));
    assert!(
        after.contains("router_http_retries_total 1"),
        "{}",
        after.lines().filter(|l| l.contains("retr") || l.contains("requests_total")).collect::<Vec<_>>().join("\n")
    );
    // The retried request is one request: one latency observation, like the other two.
    assert!(after.contains("router_http_request_duration_seconds_count 3\n"), "{after}");

    // Every worker gone: 503.
    w.shutdown();
    for x in r.gateway.fleet.all() {
        x.set_healthy(false);
    }
    assert_eq!(post(&url, &chat("s", "u")).await.status(), 503);
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_added_at_run_time_are_followed_by_their_events() {
    let w0 = MockEngine::spawn(engine_config()).await.unwrap();
    let r = start(config(&[&w0], PolicyConfig::cache_aware(), true)).await;
    let w1 = MockEngine::spawn(engine_config()).await.unwrap();
    let added = admin_post(&format!("{}/workers", r.url), &json!({"url": w1.url()})).await;
    assert_eq!(added.status(), 201);
    // Its events are followed: warm it directly, and the router sends the prefix there.
    let system = "Another long shared system prompt. ".repeat(70);
    warm(&w1, &chat(&system, "warm")).await;
    let q = chat(&system, "question");
    until("the added worker's cache is indexed", async || hit_on(&r, &q, &w1.url()).await).await;
    assert_eq!(debug(&r, &q).await["reason"], "cache_hit");

    // A worker hashing with another page size is refused, with the reason.
    let odd = MockEngine::spawn(MockEngineConfig { page_size: 32, ..engine_config() }).await.unwrap();
    let refused = admin_post(&format!("{}/workers", r.url), &json!({"url": odd.url()})).await;
    assert_eq!(refused.status(), 422);
    let e: Value = refused.json().await.unwrap();
    assert!(e["error"]["message"].as_str().unwrap().contains("page size 32"), "{e}");
    assert_eq!(admin_post(&format!("{}/workers", r.url), &json!({"url": "ftp://x"})).await.status(), 400);
    let listed: Value = admin_get(&format!("{}/workers", r.url)).await.json().await.unwrap();
    assert_eq!(listed["workers"].as_array().unwrap().len(), 2);

    // Removal takes it out of rotation and out of the index.
    let encoded = w1.url().replace(':', "%3A").replace('/', "%2F");
    let del = common::app::admin_client().delete(format!("{}/workers/{encoded}", r.url)).send().await.unwrap();
    assert_eq!(del.status(), 200, "{}", del.text().await.unwrap());
    assert_eq!(debug(&r, &q).await["worker"], w0.url());
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_and_timeouts_get_429_and_504() {
    let w = MockEngine::spawn(engine_config()).await.unwrap();
    let mut cfg = config(&[&w], PolicyConfig::least_load(), false);
    cfg.max_concurrent = 1;
    cfg.request_timeout = Duration::from_millis(500);
    let r = start(cfg).await;
    let url = format!("{}/v1/chat/completions", r.url);
    // One request hangs on the worker: it holds the only slot, then times out.
    w.engine().set_faults(Faults { hang_next: 1, ..Faults::default() }).await;
    let first = tokio::spawn({
        let url = url.clone();
        async move { reqwest::Client::new().post(url).json(&chat("s", "hang")).send().await.unwrap().status() }
    });
    until("the hanging request holds the slot", async || r.gateway.in_flight() == 1).await;
    let second = post(&url, &chat("s", "u")).await;
    assert_eq!(second.status(), 429);
    let e: Value = second.json().await.unwrap();
    assert_eq!(e["error"]["type"], "overloaded");
    assert_eq!(first.await.unwrap(), 504);
    assert_eq!(r.gateway.in_flight(), 0);
    assert!(r.gateway.fleet.all().iter().all(|w| w.load().in_flight == 0), "load released after the timeout");
    // A worker that timed out is quarantined for a second, then its probe brings it back.
    assert!(!r.gateway.fleet.all()[0].is_routable());
    until("the worker is back after its quarantine", async || r.gateway.fleet.all()[0].is_routable()).await;
    assert_eq!(post(&url, &chat("s", "u")).await.status(), 200);
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_releases_its_load_and_the_upstream() {
    // A slow engine: 20 ms per token, so a 500-token stream takes 10 s.
    let w = MockEngine::spawn(MockEngineConfig {
        fast: false,
        speedup: 1.0,
        decode_per_token: Duration::from_millis(20),
        ..engine_config()
    })
    .await
    .unwrap();
    let r = start(config(&[&w], PolicyConfig::least_load(), false)).await;
    let mut body = chat("s", "long stream");
    body["stream"] = json!(true);
    body["max_tokens"] = json!(500);
    let mut resp = post(&format!("{}/v1/chat/completions", r.url), &body).await;
    let first = resp.chunk().await.unwrap();
    assert!(first.is_some(), "the stream started");
    assert_eq!(r.gateway.in_flight(), 1);
    drop(resp); // the client hangs up
    until("the router released the request", async || r.gateway.in_flight() == 0).await;
    assert!(r.gateway.fleet.all().iter().all(|x| x.load().in_flight == 0 && x.load().uncached_tokens == 0));
    // And serves the next request at once.
    let t0 = std::time::Instant::now();
    let quick = post(
        &format!("{}/v1/chat/completions", r.url),
        &json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}),
    )
    .await;
    assert_eq!(quick.status(), 200);
    assert!(t0.elapsed() < Duration::from_secs(5));
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_are_introspected_and_a_dead_worker_index_is_dropped_after_retention() {
    let w0 = MockEngine::spawn(MockEngineConfig { model_id: "model-a".into(), dp_size: 2, ..engine_config() })
        .await
        .unwrap();
    let w1 = MockEngine::spawn(MockEngineConfig { model_id: "model-a".into(), ..engine_config() }).await.unwrap();
    let mut cfg = config(&[&w0, &w1], PolicyConfig::cache_aware(), true);
    cfg.health.interval = Duration::from_millis(100);
    cfg.index_retention = Duration::from_secs(2);
    let r = start(cfg).await;

    // Start-up introspection: what each worker serves, from its /server_info.
    let workers = async || -> Value { admin_get(&format!("{}/workers", r.url)).await.json().await.unwrap() };
    until("both workers introspected", async || {
        workers().await["workers"].as_array().unwrap().iter().all(|w| w["model_id"] == "model-a")
    })
    .await;
    let list = workers().await;
    let by_url = |url: String| list["workers"].as_array().unwrap().iter().find(|w| w["url"] == url).unwrap().clone();
    assert_eq!((by_url(w0.url())["dp_size"].clone(), by_url(w0.url())["page_size"].clone()), (json!(2), json!(16)));
    assert_eq!(by_url(w1.url())["dp_size"], 1);
    assert_eq!(by_url(w1.url())["down_for_s"], Value::Null);

    // w1 caches a prefix, then dies: it leaves rotation but its index state is
    // kept (it may come back with its cache) until the retention period ends.
    let system = "Retention test system prompt. ".repeat(40);
    warm(&w1, &chat(&system, "warm up")).await;
    let index = r.gateway.index.clone().unwrap();
    until("the index learned w1's cache", async || hit_on(&r, &chat(&system, "q"), &w1.url()).await).await;
    let mut held = index.stats().holdings;
    until("every batch of the warm-up is indexed", async || {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        std::mem::replace(&mut held, index.stats().holdings) == held
    })
    .await;
    w1.shutdown();
    until("w1 out of rotation", async || {
        !r.gateway.fleet.all().iter().find(|w| w.url.as_str() == w1.url()).unwrap().is_healthy()
    })
    .await;
    assert_eq!(index.stats().holdings, held, "kept while w1 may come back");
    let d = debug(&r, &chat(&system, "q")).await;
    assert_eq!(d["worker"], w0.url(), "only healthy workers are routed to: {d}");
    for _ in 0..100 {
        if index.stats().holdings == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(index.stats().holdings, 0, "dropped after the retention period");
    assert!(by_url(w0.url())["healthy"].as_bool().unwrap());
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_of_one_rank_is_not_told_a_rank() {
    // Dynamo's frontend answers 400 to any request carrying the rank header; its events say rank 0.
    let w = MockEngine::spawn(MockEngineConfig { refuse_rank_header: true, ..engine_config() }).await.unwrap();
    let system = "An engine of one rank refuses rank hints. ".repeat(40);
    // Its cache holds the prefix (warmed directly, without the header).
    assert_eq!(post(&format!("{}/v1/chat/completions", w.url()), &chat(&system, "warm up")).await.status(), 200);
    for (header, expected) in [(fleet::RankHeader::Auto, 200), (fleet::RankHeader::Always, 400)] {
        let mut c = config(&[&w], PolicyConfig::cache_aware(), true);
        c.rank_header = header;
        let r = start(c).await;
        until("the index learned rank 0 holds the prefix", async || {
            debug(&r, &chat(&system, "q")).await["dp_rank"] == 0
        })
        .await;
        for (path, body) in [
            ("/v1/chat/completions", chat(&system, "a question")),
            ("/generate", json!({"text": format!("{system}more"), "sampling_params": {"max_new_tokens": 2}})),
        ] {
            let status = post(&format!("{}{path}", r.url), &body).await.status();
            assert_eq!(status, expected, "{header:?}: {path} on a prefix rank 0 holds");
        }
        let _ = r.stop.send(());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rank_holding_the_prefix_is_passed_to_a_data_parallel_engine() {
    let w = MockEngine::spawn(MockEngineConfig { dp_size: 2, ..engine_config() }).await.unwrap();
    let r = start(config(&[&w], PolicyConfig::cache_aware(), true)).await;
    let system = "Data-parallel rank hint test prompt. ".repeat(40);
    // Rank 1 alone holds the prefix (warmed directly, with the engines' rank header).
    for (path, body) in [
        ("/v1/chat/completions", chat(&system, "warm up")),
        ("/generate", json!({"text": system, "sampling_params": {"max_new_tokens": 1}})),
    ] {
        let warmed = reqwest::Client::new()
            .post(format!("{}{path}", w.url()))
            .header("x-data-parallel-rank", "1")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(warmed.status().is_success());
    }
    until("the index learned rank 1's cache", async || debug(&r, &chat(&system, "q")).await["dp_rank"] == 1).await;
    // Without the hint the engine alternates ranks; with it every request lands on rank 1.
    for i in 0..4 {
        let (path, body) = if i % 2 == 0 {
            ("/v1/chat/completions", chat(&system, &format!("question {i}")))
        } else {
            ("/generate", json!({"text": format!("{system}more {i}"), "sampling_params": {"max_new_tokens": 2}}))
        };
        let resp: Value = post(&format!("{}{path}", r.url), &body).await.json().await.unwrap();
        let cached = resp
            .pointer("/usage/prompt_tokens_details/cached_tokens")
            .or_else(|| resp.pointer("/meta_info/cached_tokens"))
            .and_then(Value::as_u64)
            .unwrap_or(0);
        assert!(cached >= 1024, "request {i} to {path} reached the rank holding its prefix: {resp}");
    }
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lora_requests_match_the_adapter_chains_the_events_carry() {
    use kv_events::{Publisher, PublisherConfig};
    use router_types::{EngineBlockHash, EventBatch, KvEvent, Namespace, StoredBlocks};

    let w = MockEngine::spawn(MockEngineConfig { model_id: "base".into(), kv_events: false, ..engine_config() })
        .await
        .unwrap();
    let publisher = Publisher::bind(PublisherConfig::loopback()).await.unwrap();
    let mut cfg = config(&[&w], PolicyConfig::cache_aware(), true);
    let kv = cfg.kv_events.as_mut().unwrap();
    kv.explicit.endpoints.insert(WorkerUrl::new(w.url()), publisher.endpoint().to_owned());
    cfg.model_id = "base".into();
    let r = start(cfg).await;

    // The engine cached this prompt under adapter "sql" (vLLM-style event: opaque hashes, lora_name).
    let body = chat(&"LoRA namespace test. ".repeat(30), "q");
    let tokens = renderer::Renderer::builtin()
        .unwrap()
        .render_chat(&renderer::ChatRequest::from_value(&body).unwrap())
        .unwrap()
        .token_ids;
    let blocks = tokens.len() / 16;
    let event = EventBatch {
        ts: 0.0,
        dp_rank: None,
        events: vec![KvEvent::Stored(StoredBlocks {
            namespace: Namespace { lora_name: Some("sql".into()), cache_salt: None },
            ..StoredBlocks::plain(
                (0..blocks).map(|i| EngineBlockHash::U64(1_000 + i as u64)).collect(),
                None,
                tokens[..blocks * 16].iter().map(|t| u64::from(*t)).collect(),
                16,
            )
        })],
    };
    let matched = |d: &Value| d["candidates"][0]["matched_tokens"].as_u64().unwrap();
    let with_model = |m: &str| {
        let mut b = body.clone();
        b["model"] = json!(m);
        b
    };
    until("the adapter's chain is indexed", async || {
        publisher.publish(&event).await.unwrap();
        matched(&debug(&r, &with_model("base:sql")).await) == (blocks * 16) as u64
    })
    .await;
    // SGLang's ways of naming the adapter, and vLLM's (the adapter as the model, once events named it).
    let mut by_path = with_model("base");
    by_path["lora_path"] = json!("sql");
    assert_eq!(matched(&debug(&r, &by_path).await), (blocks * 16) as u64);
    assert_eq!(matched(&debug(&r, &with_model("sql")).await), (blocks * 16) as u64);
    // The base model and other adapters are other namespaces.
    assert_eq!(matched(&debug(&r, &with_model("base")).await), 0);
    assert_eq!(matched(&debug(&r, &with_model("base:chat")).await), 0);
    assert_eq!(matched(&debug(&r, &with_model("some-client-name")).await), 0);
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_fleet_matches_bigram_and_unigram_workers_in_their_own_modes() {
    use kv_events::{Publisher, PublisherConfig};
    use renderer::{HashMode, PageHasher};
    use router_types::{EngineBlockHash, EventBatch, KvEvent, StoredBlocks};

    // w0: a plain engine (unigram). eagle: an EAGLE3 engine, which keys blocks by bigrams.
    let w0 = MockEngine::spawn(engine_config()).await.unwrap();
    let publisher = Publisher::bind(PublisherConfig::loopback()).await.unwrap();
    let port = |e: &str| e.rsplit(':').next().unwrap().to_owned();
    let eagle = common::http_answering(format!(
        r#"{{"served_model_name": "default", "page_size": 16, "dp_size": 1, "speculative_algorithm": "EAGLE3",
            "kv_events": {{"publisher": "zmq", "endpoint_host": "127.0.0.1", "endpoint_port_base": {},
            "topic": "", "block_size": 16, "dp_size": 1}}}}"#,
        port(publisher.endpoint())
    ))
    .await;
    let mut cfg = config(&[&w0], PolicyConfig::cache_aware(), true);
    cfg.workers.push(WorkerUrl::new(eagle.as_str()));
    let r = start(cfg).await;

    let body = chat(&"Mixed fleet test prompt. ".repeat(30), "q");
    let tokens = renderer::Renderer::builtin()
        .unwrap()
        .render_chat(&renderer::ChatRequest::from_value(&body).unwrap())
        .unwrap()
        .token_ids;
    // The EAGLE engine caches the prompt's bigram pages (SGLang hashes: engine hash = router hash).
    let pages = (tokens.len() - 1) / 16;
    let raw = &tokens[..pages * 16 + 1];
    let hashes =
        PageHasher::new(std::num::NonZeroUsize::new(16).unwrap(), HashMode::Bigram).block_hashes(raw, None).unwrap();
    let event = EventBatch {
        ts: 0.0,
        dp_rank: None,
        events: vec![KvEvent::Stored(StoredBlocks {
            bigram: true,
            ..StoredBlocks::plain(
                hashes.iter().map(|h| EngineBlockHash::I64(h.0)).collect(),
                None,
                raw.iter().map(|t| u64::from(*t)).collect(),
                16,
            )
        })],
    };
    let matched = |d: &Value, url: &str| {
        d["candidates"].as_array().unwrap().iter().find(|c| c["worker"] == url).unwrap()["matched_tokens"]
            .as_u64()
            .unwrap()
    };
    until("the EAGLE worker's bigram pages are indexed", async || {
        publisher.publish(&event).await.unwrap();
        matched(&debug(&r, &body).await, &eagle) == (pages * 16) as u64
    })
    .await;
    // And the plain worker's unigram pages, from its own events, in the same request.
    warm(&w0, &body).await;
    until("w0's unigram pages are indexed too", async || matched(&debug(&r, &body).await, &w0.url()) >= 512).await;
    assert_eq!(matched(&debug(&r, &body).await, &eagle), (pages * 16) as u64, "{}", debug(&r, &body).await);
    let _ = r.stop.send(());
}

/// vLLM with EAGLE or MTP drafting hashes each block with the tokens after it
/// (`lookahead_token_ids`): the router chains a request the same way for that worker, so a
/// prompt that goes on otherwise right after a cached block is not credited with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookahead_worker_is_credited_only_what_its_engine_would_reuse() {
    use kv_events::{Publisher, PublisherConfig};
    use router_types::{EngineBlockHash, EventBatch, KvEvent, StoredBlocks};

    let w = MockEngine::spawn(MockEngineConfig { kv_events: false, ..engine_config() }).await.unwrap();
    let publisher = Publisher::bind(PublisherConfig::loopback()).await.unwrap();
    let mut cfg = config(&[&w], PolicyConfig::cache_aware(), true);
    let kv = cfg.kv_events.as_mut().unwrap();
    kv.explicit.endpoints.insert(WorkerUrl::new(w.url()), publisher.endpoint().to_owned());
    cfg.pending_ttl = Duration::from_secs(3_600);
    let r = start(cfg).await;

    // The engine (lookahead 1) cached four blocks of a 65-token prompt, each hashed with the token after it.
    let ids: Vec<u64> = (1_000..1_065).collect();
    let event = EventBatch {
        ts: 0.0,
        dp_rank: None,
        events: vec![KvEvent::Stored(StoredBlocks {
            lookahead: (1..=4).map(|i| vec![ids[i * 16]].into_boxed_slice()).collect(),
            ..StoredBlocks::plain(
                (0..4).map(|i| EngineBlockHash::U64(5_000 + i)).collect(),
                None,
                ids[..64].to_vec(),
                16,
            )
        })],
    };
    let matched = async |ids: &[u64]| {
        let body = json!({"input_ids": ids, "sampling_params": {"max_new_tokens": 1}});
        let d: Value = admin_post(&format!("{}/debug/route?route=generate", r.url), &body).await.json().await.unwrap();
        d["candidates"][0]["matched_tokens"].as_u64().unwrap()
    };
    until("the lookahead chain is indexed", async || {
        publisher.publish(&event).await.unwrap();
        matched(&ids).await == 64
    })
    .await;
    let with = |at: usize, token: u64, len: usize| {
        let mut v = ids.clone();
        v.resize(len, 1);
        v[at] = token;
        v
    };
    assert_eq!(matched(&with(64, 7, 65)).await, 48, "the fourth block was hashed with 1064 after it, not 7");
    assert_eq!(matched(&ids[..64]).await, 48, "nothing follows the fourth block: vLLM hashes it not");
    assert_eq!(matched(&with(32, 7, 65)).await, 16, "the second block's lookahead is the third's first token");
    assert_eq!(matched(&with(64, 1_064, 70)).await, 64, "a longer prompt going on the same way");
    assert_eq!(matched(&with(31, 7, 65)).await, 16, "a token inside the second block");
    // A request sent there is credited (pending its events) in the worker's own chain.
    let fresh: Vec<u64> = (100..140).collect(); // within the simulated engine's vocabulary
    let sent =
        post(&format!("{}/generate", r.url), &json!({"input_ids": fresh, "sampling_params": {"max_new_tokens": 1}}))
            .await;
    assert_eq!(sent.status(), 200, "{}", sent.text().await.unwrap());
    assert_eq!(matched(&fresh).await, 32, "blocks ending at 16 and 32, each followed by a token");
    let _ = r.stop.send(());
}

/// A vision model's chat with images (data URLs): the router expands each image's placeholder and
/// keys its blocks by the image's identifier, as a vLLM engine serving Qwen2.5-VL does (the
/// engine's own events, from `tests/fixtures/kv_multimodal`, published over ZMQ; the model id the
/// identifiers depend on read from the worker). The same chat is credited every block the engine
/// holds; the same text with another image of the same size (the same token ids) only the blocks
/// before the image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_with_an_image_is_credited_only_for_the_image_the_engine_holds() {
    use kv_events::{Publisher, PublisherConfig};

    let repo = common::app::repo;
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(repo("tests/fixtures/kv_multimodal/mm_golden.json")).unwrap())
            .unwrap();
    let model = doc["model_id"].as_str().unwrap();
    let w = MockEngine::spawn(MockEngineConfig { kv_events: false, model_id: model.into(), ..engine_config() })
        .await
        .unwrap();
    let publisher = Publisher::bind(PublisherConfig::loopback()).await.unwrap();
    // The model's directory: its tokenizer (the qwen3 fixture has Qwen-VL's vision tokens) and
    // image settings; the Qwen2-VL template given with --chat-template.
    let dir = tempfile::tempdir().unwrap();
    for f in [
        "tokenizers/qwen3/tokenizer.json",
        "tokenizers/qwen3/tokenizer_config.json",
        "kv_multimodal/preprocessor_config.json",
    ] {
        let from = repo(&format!("tests/fixtures/{f}"));
        std::fs::copy(&from, dir.path().join(from.file_name().unwrap())).unwrap();
    }
    let mut cfg = config(&[&w], PolicyConfig::cache_aware(), true);
    cfg.tokenizer_path = Some(dir.path().to_owned());
    cfg.chat_template = Some(repo("tests/fixtures/kv_multimodal/qwen2_vl_template.jinja"));
    let kv = cfg.kv_events.as_mut().unwrap();
    kv.explicit.endpoints.insert(WorkerUrl::new(w.url()), publisher.endpoint().to_owned());
    let r = start(cfg).await;

    let probe = |name: &str| {
        let p = doc["probes"].as_array().unwrap().iter().find(|p| p["name"] == name).unwrap();
        let mut text = json!({"model": model, "messages": p["messages"], "max_tokens": 1}).to_string();
        for image in doc["images"].as_array().unwrap() {
            let url = format!("\"data:image/png;base64,{}\"", image["b64"].as_str().unwrap());
            text = text.replace(&format!("\"@{}\"", image["name"].as_str().unwrap()), &url);
        }
        (serde_json::from_str::<Value>(&text).unwrap(), p["hit_blocks"].as_u64().unwrap() * 16)
    };
    let matched = async |body: &Value| {
        let d: Value = admin_post(&format!("{}/debug/route", r.url), body).await.json().await.unwrap();
        d["candidates"][0]["matched_tokens"].as_u64().unwrap_or_else(|| panic!("{d}"))
    };
    // The engine's batch for the one-image chat (the golden's first), as vLLM published it.
    let payload: Vec<u8> = {
        let hex = doc["payloads_hex"][0].as_str().unwrap();
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect()
    };
    let (same, all) = probe("same");
    assert!(all >= 400, "the image's blocks and the text after it");
    until("the engine's blocks with the image are indexed", async || {
        publisher.publish_raw(payload.clone().into()).await.unwrap();
        matched(&same).await == all
    })
    .await;
    // The explain names the image as the engine keys it.
    let d: Value = admin_post(&format!("{}/debug/route", r.url), &same).await.json().await.unwrap();
    let png = doc["images"].as_array().unwrap().iter().find(|i| i["name"] == "png-rgb").unwrap();
    assert_eq!(d["images"][0]["identifier"], png["identifier"], "{d}");
    assert_eq!(d["images"][0]["placeholders"], png["placeholders"]);
    let (other, before_image) = probe("other image, same size");
    assert_eq!(matched(&other).await, before_image, "another image: only the blocks before it");
    assert!(before_image < all / 10);
    let (question, upto) = probe("other question");
    assert_eq!(matched(&question).await, upto, "the same image, another question after it");
    // An image by URL (the router does not fetch it): credited up to the image, and counted.
    let by_url = same.to_string().replace(
        &same["messages"][1]["content"][1]["image_url"]["url"].as_str().unwrap().to_string(),
        "https://example.com/cat.png",
    );
    assert_eq!(matched(&serde_json::from_str(&by_url).unwrap()).await, before_image);
    assert!(metric(&r.url, "router_prompt_images_total{identity=\"computed\"}").await >= 3.0);
    assert!(metric(&r.url, "router_prompt_images_total{identity=\"unknown\"}").await >= 1.0);
    assert_eq!(metric(&r.url, "router_kv_events_hash_mismatches_total").await, 0.0);
    let _ = r.stop.send(());
}

/// `--tokenizer-cache-*`: the bounds reach the router's tokenizer; its caches fill to them and no
/// further, in entries and in bytes, and /metrics says so. A real vocabulary (the built-in one has
/// no merges: it maps bytes to ids and never fills the word cache).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tokenizer_caches_stay_within_their_configured_bounds() {
    let w = MockEngine::spawn(engine_config()).await.unwrap();
    let mut c = config(&[&w], PolicyConfig::cache_aware(), true);
    c.tokenizer_path = Some(common::app::repo("tests/fixtures/tokenizers/qwen3"));
    c.tokenizer_caches = renderer::CacheBounds { segment_entries: 5, segment_bytes: 1 << 20, word_bytes: 2_000 };
    let r = start(c).await;
    for i in 0..40 {
        let q = chat(&format!("System prompt number {i} with words like w{i}a w{i}b w{i}c."), &format!("question {i}"));
        assert_eq!(post(&format!("{}/v1/chat/completions", r.url), &q).await.status(), 200);
    }
    let segments = common::app::metric(&r.url, "router_tokenizer_cache_segments").await;
    let words = common::app::metric(&r.url, "router_tokenizer_cache_bytes{cache=\"word\"}").await;
    assert!(segments > 0.0 && segments <= 5.0, "{segments} segments (bound 5)");
    assert!(words > 0.0 && words <= 2_000.0, "{words} word-cache bytes (bound 2000)");
    // A byte bound of 4: no segment of more than a byte is kept (one in four of the bound at most).
    let mut c = config(&[&w], PolicyConfig::cache_aware(), true);
    c.tokenizer_caches = renderer::CacheBounds { segment_entries: 5, segment_bytes: 4, word_bytes: 0 };
    let r = start(c).await;
    let q = chat("A system prompt longer than four bytes.", "and a question");
    assert_eq!(post(&format!("{}/v1/chat/completions", r.url), &q).await.status(), 200);
    assert!(common::app::metric(&r.url, "router_tokenizer_cache_bytes{cache=\"segment\"}").await <= 4.0);
    assert_eq!(common::app::metric(&r.url, "router_tokenizer_cache_bytes{cache=\"word\"}").await, 0.0);
}

/// Requests sharing a cold prefix, sent at the same moment, land on one worker before any KV
/// event arrives: with `--cache-pending-prefix-ttl-ms` the match and the chosen worker's
/// pending credit are one step, so each request sees the credit of the ones planned before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_burst_lands_on_one_worker() {
    use std::sync::atomic::Ordering::Relaxed;
    let (w0, w1) =
        (MockEngine::spawn(engine_config()).await.unwrap(), MockEngine::spawn(engine_config()).await.unwrap());
    let mut cfg = config(&[&w0, &w1], PolicyConfig::cache_aware(), true);
    cfg.pending_ttl = Duration::from_secs(10);
    // The credit lock is what this checks: overload protection would spread a burst that fills
    // one worker's reported queue (`liveness::an_overloaded_worker_is_skipped...`).
    cfg.liveness = fleet::liveness::LivenessConfig::off();
    // More serving threads than cores, and long prompts: plans overlap often without the lock.
    cfg.serve_threads = 4;
    let r = start(cfg).await;
    let served = || [w0.engine().requests.load(Relaxed), w1.engine().requests.load(Relaxed)];
    // One client: after the first round the burst goes over open connections, all at once.
    let http = reqwest::Client::new();
    for round in 0..120 {
        let system = format!("Round {round}. ") + &"A cold system prompt no worker holds yet. ".repeat(200);
        let before = served();
        let burst: Vec<_> = (0..16)
            .map(|i| {
                let request =
                    http.post(format!("{}/v1/chat/completions", r.url)).json(&chat(&system, &format!("q{i}")));
                tokio::spawn(async move { request.send().await.unwrap().status() })
            })
            .collect();
        for status in burst {
            assert_eq!(status.await.unwrap(), 200);
        }
        let after = served();
        let got = [after[0] - before[0], after[1] - before[1]];
        assert!(got.contains(&16), "round {round}: a burst of one cold prefix on one worker: {got:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_key_headers_name_the_worker_after_smgs_own() {
    let (a, b) = (MockEngine::spawn(engine_config()).await.unwrap(), MockEngine::spawn(engine_config()).await.unwrap());
    let requests = |m: &MockEngine| m.engine().requests.load(std::sync::atomic::Ordering::Relaxed);
    for (headers, stuck) in [(vec![], false), (vec!["X-User".to_string()], true)] {
        let mut c = config(&[&a, &b], PolicyConfig::RoundRobin, false);
        c.routing_key_headers = headers.iter().map(|h| h.to_ascii_lowercase()).collect();
        let r = start(c).await;
        let before = (requests(&a), requests(&b));
        for i in 0..6 {
            let resp = reqwest::Client::new()
                .post(format!("{}/v1/chat/completions", r.url))
                .header("x-user", "alice")
                .json(&chat("s", &format!("q{i}")))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
        }
        let got = (requests(&a) - before.0, requests(&b) - before.1);
        if stuck {
            assert!(got == (6, 0) || got == (0, 6), "alice's key names one worker: {got:?}");
            // SMG's own header is read first: a key of it that names the other worker wins.
            let explain = async |headers: &[(&str, String)]| -> Value {
                let mut req = reqwest::Client::new()
                    .post(format!("{}/debug/route", r.url))
                    .bearer_auth(common::app::ADMIN_KEY)
                    .json(&chat("s", "q"));
                for (n, v) in headers {
                    req = req.header(*n, v);
                }
                req.send().await.unwrap().json().await.unwrap()
            };
            let alice = explain(&[("x-user", "alice".into())]).await;
            assert_eq!(alice["reason"], "routing_key", "{alice}");
            // A key of SMG's header that names the other worker than alice's.
            let mut other = None;
            for i in 0..64 {
                let k = format!("key{i}");
                if explain(&[("x-smg-routing-key", k.clone())]).await["worker"] != alice["worker"] {
                    other = Some(k);
                    break;
                }
            }
            let other = other.expect("some key names the other worker");
            let both = explain(&[("x-user", "alice".into()), ("x-smg-routing-key", other.clone())]).await;
            assert_ne!(both["worker"], alice["worker"], "x-smg-routing-key wins over x-user: {both}");
        } else {
            assert_eq!(got, (3, 3), "round robin without the flag");
        }
        let _ = r.stop.send(());
    }
}
