//! The response cache end to end (`tests/routing/cache.yaml`): a decision
//! with a `response_cache` plugin answers a repeated request from the cache
//! (whole answers and event streams alike, byte for byte), never from a
//! failed stream, not for a request that samples or says `no-cache`, and
//! keeps what the engine did not have to do.

use crate::common;

use common::app::{config, metric, pools, start};
use mock_engine::Faults;
use serde_json::{Value, json};
use sgl_router::app::PolicyConfig;

fn faq(question: &str, stream: bool) -> Value {
    json!({"model": "auto", "temperature": 0, "max_tokens": 6, "stream": stream,
           "messages": [{"role": "user", "content": format!("faq: {question}")}]})
}

/// A router config over `tests/routing/cache.yaml` (round robin), and the pool's engines.
async fn cache_app() -> (sgl_router::app::AppConfig, Vec<mock_engine::MockEngine>) {
    let (routing, engines) = pools("tests/routing/cache.yaml").await;
    let mut app = config(&[], PolicyConfig::RoundRobin, false);
    app.routing = Some(routing);
    (app, engines)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_requests_are_answered_from_the_cache_byte_for_byte() {
    let (app, engines) = cache_app().await;
    let router = start(app).await;
    let url = format!("{}/v1/chat/completions", router.url);
    let http = reqwest::Client::new();
    let seen = || engines[0].engine().legs().len();
    let send = async |body: &Value, extra: Option<(&str, &str)>| {
        let mut r = http.post(&url).json(body);
        if let Some((n, v)) = extra {
            r = r.header(n, v);
        }
        let r = r.send().await.unwrap();
        let status = r.status().as_u16();
        let cache = r.headers().get("x-route-cache").map(|v| v.to_str().unwrap().to_owned());
        let ct = r.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned());
        (status, cache, ct, r.bytes().await.unwrap())
    };

    // A whole answer: the second is the first, and the engine saw one request.
    let (s1, c1, _, b1) = send(&faq("opening hours?", false), None).await;
    let (s2, c2, _, b2) = send(&faq("opening hours?", false), None).await;
    assert_eq!((s1, c1.as_deref(), s2, c2.as_deref()), (200, Some("miss"), 200, Some("hit-exact")));
    assert_eq!(b1, b2);
    assert_eq!(seen(), 1);
    // Served on the router's own HTTP/1.1 path, recorded and replayed there (hyper's front end
    // would add a `date` header to the router's own answer; the fast path writes none).
    let hit = http.post(&url).json(&faq("opening hours?", false)).send().await.unwrap();
    assert_eq!(hit.headers()["x-route-cache"], "hit-exact");
    assert!(hit.headers().get("date").is_none(), "a cache decision keeps the fast path: {:?}", hit.headers());
    // An event stream is replayed as it came: the same bytes, the same content type.
    let (_, c1, ct1, b1) = send(&faq("opening hours?", true), None).await;
    let (_, c2, ct2, b2) = send(&faq("opening hours?", true), None).await;
    assert_eq!((c1.as_deref(), c2.as_deref()), (Some("miss"), Some("hit-exact")), "the stream flag is part of the key");
    assert_eq!((ct1.as_deref(), ct2.as_deref()), (Some("text/event-stream"), Some("text/event-stream")));
    assert!(b1.ends_with(b"data: [DONE]\n\n"));
    assert_eq!(b1, b2, "replayed byte for byte");
    assert_eq!(seen(), 2);
    // Anything else different is another request; the key ignores `model` (the decision picks it).
    let mut other = faq("opening hours?", false);
    other["max_tokens"] = json!(5);
    assert_eq!(send(&other, None).await.1.as_deref(), Some("miss"));
    // Sampling (no temperature: the engine's default) is not cached, nor a request that says no-cache.
    let mut sampled = faq("opening hours?", false);
    sampled.as_object_mut().unwrap().remove("temperature");
    assert_eq!(send(&sampled, None).await.1, None);
    assert_eq!(send(&faq("opening hours?", false), Some(("cache-control", "no-cache"))).await.1, None);
    assert_eq!(seen(), 5);
    // Another decision has no cache.
    let plain = json!({"model": "auto", "temperature": 0, "messages": [{"role": "user", "content": "hello"}]});
    assert_eq!(send(&plain, None).await.1, None);

    // A stream that fails half-way is never kept: the next ask is not a hit (the only worker
    // left rotation, so it is refused).
    engines[0].engine().set_faults(Faults { die_mid_stream_next: 1, ..Faults::default() }).await;
    let (_, cache, _, text) = send(&faq("refunds?", true), None).await;
    assert_eq!(cache.as_deref(), Some("miss"));
    assert!(String::from_utf8_lossy(&text).contains("upstream_unreachable"));
    let (status, cache, _, _) = send(&faq("refunds?", true), None).await;
    assert_eq!((status, cache), (503, None), "not answered from the cache");

    let lookups = "router_response_cache_lookups_total{decision=\"faq\",outcome=";
    assert_eq!(metric(&router.url, &format!("{lookups}\"hit_exact\"}}")).await, 3.0);
    assert_eq!(metric(&router.url, &format!("{lookups}\"miss\"}}")).await, 4.0);
    assert_eq!(metric(&router.url, &format!("{lookups}\"skip_sampling\"}}")).await, 1.0);
    assert_eq!(metric(&router.url, &format!("{lookups}\"skip_bypass\"}}")).await, 1.0);
    assert_eq!(metric(&router.url, "router_response_cache_stores_total{decision=\"faq\"}").await, 3.0);
    assert_eq!(metric(&router.url, "router_response_cache_entries{decision=\"faq\"}").await, 3.0);
    // Every request counted once, the two answered from the cache included (ten 200s, the stream
    // that broke off after its 200 head among them and counted as cut, one 503 refused before
    // any worker), each answered one with its latency.
    let chats = |status: &str| format!("router_http_requests_total{{route=\"chat\",status=\"{status}\"}}");
    assert_eq!(metric(&router.url, &chats("200")).await, 10.0);
    assert_eq!(metric(&router.url, "router_http_answers_cut_total{route=\"chat\"}").await, 1.0);
    assert_eq!(metric(&router.url, &chats("503")).await, 1.0);
    assert_eq!(metric(&router.url, "router_http_request_duration_seconds_count").await, 10.0);
    let _ = router.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_never_gets_another_callers_stored_answer() {
    let http = reqwest::Client::new();
    let ask = async |url: &str, key: Option<&str>, route: &str, body: &Value| {
        let mut r = http.post(format!("{url}{route}")).json(body);
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        let r = r.send().await.unwrap();
        let (status, cache) =
            (r.status().as_u16(), r.headers().get("x-route-cache").map(|v| v.to_str().unwrap().to_owned()));
        // The whole answer: a stored one is kept before its last byte reaches the client.
        r.bytes().await.unwrap();
        (status, cache)
    };
    let hit = |a: (u16, Option<String>)| (a.0, a.1.as_deref() == Some("hit-exact"));
    // Pass-through (no client keys): the client's own credentials go to the engine, so they key the answer.
    let (app, _engines) = cache_app().await;
    let router = start(app).await;
    let chat = "/v1/chat/completions";
    let q = faq("who may see this?", false);
    assert_eq!(hit(ask(&router.url, Some("ENGINE-KEY"), chat, &q).await), (200, false));
    assert_eq!(hit(ask(&router.url, Some("ENGINE-KEY"), chat, &q).await), (200, true), "the same caller");
    assert_eq!(hit(ask(&router.url, None, chat, &q).await), (200, false), "an anonymous caller");
    assert_eq!(hit(ask(&router.url, Some("OTHER"), chat, &q).await), (200, false), "another credential");
    // A stored answer carries no route id: feedback on it would steer the decisions for free.
    let again = http.post(format!("{}{chat}", router.url)).bearer_auth("OTHER").json(&q).send().await.unwrap();
    assert_eq!(again.headers()["x-route-cache"], "hit-exact");
    assert!(again.headers().get("x-route-id").is_none());
    let fresh = faq("a question never asked", false);
    let miss = http.post(format!("{}{chat}", router.url)).json(&fresh).send().await.unwrap();
    assert_eq!(miss.headers()["x-route-cache"], "miss");
    assert!(miss.headers().get("x-route-id").is_some(), "a worker's answer has one");
    // The route is part of the key: a body both routes accept is two requests.
    let mut both = q.clone();
    both["prompt"] = json!("faq: who may see this?");
    assert_eq!(hit(ask(&router.url, Some("ENGINE-KEY"), chat, &both).await), (200, false));
    let completions = ask(&router.url, Some("ENGINE-KEY"), "/v1/completions", &both).await;
    assert_ne!(completions.1.as_deref(), Some("hit-exact"), "the chat answer is not the completion's");
    let _ = router.stop.send(());

    // Client keys: each tenant has its own answers.
    let (mut app, _engines) = cache_app().await;
    app.client_keys = vec!["tenant-a".into(), "tenant-b".into()];
    let router = start(app).await;
    assert_eq!(hit(ask(&router.url, Some("tenant-a"), chat, &q).await), (200, false));
    assert_eq!(hit(ask(&router.url, Some("tenant-b"), chat, &q).await), (200, false), "tenant B asks anew");
    assert_eq!(hit(ask(&router.url, Some("tenant-a"), chat, &q).await), (200, true));
    assert_eq!(hit(ask(&router.url, Some("tenant-b"), chat, &q).await), (200, true));
    assert_eq!(ask(&router.url, None, chat, &q).await.0, 401);
    let _ = router.stop.send(());
}

/// `x-route-mode` (a control-plane caller's, with `x-route-debug: KEY`): `preview` runs the
/// decision and its plugins and calls no model; `probe` calls the model and writes no plugin
/// storage (the cache is neither read nor written, no route id is issued); anyone else, or
/// another mode, is refused before anything is read; the header never reaches a worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preview_calls_no_model_and_probe_writes_no_plugin_storage() {
    let (app, engines) = cache_app().await;
    let router = start(app).await;
    let url = format!("{}/v1/chat/completions", router.url);
    let http = reqwest::Client::new();
    let seen = || engines[0].engine().legs().len();
    let send = async |mode: Option<&str>, key: Option<&str>| {
        let mut r = http.post(&url).json(&faq("parking?", false));
        if let Some(mode) = mode {
            r = r.header("x-route-mode", mode);
        }
        if let Some(key) = key {
            r = r.header("x-route-debug", key);
        }
        let r = r.send().await.unwrap();
        let header = |n: &str| r.headers().get(n).map(|v| v.to_str().unwrap().to_owned());
        let heads = (header("x-route-mode"), header("x-route-cache"), header("x-route-id"));
        (r.status().as_u16(), heads, r.bytes().await.unwrap())
    };
    let admin = Some(common::app::ADMIN_KEY);

    // Preview: the decision's answer, as POST /v1/route/preview gives it; no model called.
    let (status, (mode, cache, id), body) = send(Some("preview"), admin).await;
    assert_eq!((status, mode.as_deref(), cache, id), (200, Some("preview"), None, None));
    let out: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((out["decision"].as_str(), out["pool"].as_str()), (Some("faq"), Some("small")), "{out}");
    assert_eq!(seen(), 0);
    // Not a control-plane caller, or not a mode: refused, nothing read or sent.
    for (mode, key, want) in [("preview", None, 403), ("probe", Some("not-the-key"), 403), ("shadow", admin, 400)] {
        let (status, _, body) = send(Some(mode), key).await;
        assert_eq!(status, want, "{mode} {key:?}: {}", String::from_utf8_lossy(&body));
    }
    assert_eq!(seen(), 0);

    // Probe: the model answers; nothing is stored (the next plain ask misses), nothing read (a
    // probe after a stored answer still calls the model), no route id (nothing to give feedback on).
    let (status, (mode, cache, id), _) = send(Some("probe"), admin).await;
    assert_eq!((status, mode.as_deref(), cache, id), (200, Some("probe"), None, None));
    assert_eq!(seen(), 1);
    let (_, (mode, cache, id), _) = send(None, None).await;
    assert_eq!((mode, cache.as_deref()), (None, Some("miss")), "the probe stored nothing");
    assert!(id.is_some(), "a plain answer carries its route id");
    assert_eq!(send(None, None).await.1.1.as_deref(), Some("hit-exact"));
    assert_eq!(seen(), 2);
    let (_, (_, cache, _), _) = send(Some("probe"), admin).await;
    assert_eq!((cache, seen()), (None, 3), "a probe reads no stored answer");
    // The mode header is the router's: no worker saw it (nor the key that came with it).
    for leg in engines[0].engine().legs() {
        assert!(leg.headers.iter().all(|(n, _)| n != "x-route-mode" && n != "x-route-debug"), "{:?}", leg.headers);
    }
    assert_eq!(metric(&router.url, "router_response_cache_stores_total{decision=\"faq\"}").await, 1.0);
    let _ = router.stop.send(());
}
