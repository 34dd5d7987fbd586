//! The control plane on an open network: fleet changes, topology and the
//! explain route need a control-plane key (closed without one, never open);
//! worker URLs are validated and spelled once; readiness means "can route";
//! "not now" answers say when to retry; the control plane can have its own port.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::app::{admin_client, admin_get, admin_post, chat, config, engine_config, post, start};
use common::eventually as until;
use mock_engine::MockEngine;
use serde_json::{Value, json};
use sgl_router::app::PolicyConfig;

/// A TCP listener that counts the connections made to it: an attacker's "worker".
async fn attacker() -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            drop(tcp);
        }
    });
    (url, hits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_control_plane_keys_nobody_changes_or_sees_the_fleet() {
    let w = MockEngine::spawn(engine_config()).await.unwrap();
    let mut cfg = config(&[&w], PolicyConfig::RoundRobin, false);
    cfg.control_plane_keys = Vec::new();
    cfg.worker_api_key = Some("engines-key".into());
    cfg.load_poll = Duration::from_millis(20);
    let r = start(cfg).await;
    let (evil, hits) = attacker().await;
    let client = reqwest::Client::new();
    let closed = |resp: reqwest::Response| async move {
        assert_eq!(resp.status(), 403);
        let e: Value = resp.json().await.unwrap();
        assert!(e["error"]["message"].as_str().unwrap().contains("--control-plane-api-keys"), "{e}");
    };
    closed(client.post(format!("{}/workers", r.url)).json(&json!({"url": evil})).send().await.unwrap()).await;
    let real = w.url().replace(':', "%3A").replace('/', "%2F");
    closed(client.delete(format!("{}/workers/{real}", r.url)).send().await.unwrap()).await;
    closed(client.get(format!("{}/workers", r.url)).send().await.unwrap()).await;
    closed(client.get(format!("{}/metrics", r.url)).send().await.unwrap()).await;
    let explain = client.post(format!("{}/debug/route", r.url)).json(&chat("s", "u")).send().await.unwrap();
    closed(explain).await;
    // Even a key does not open a closed control plane.
    let keyed = admin_client().post(format!("{}/workers", r.url)).json(&json!({"url": evil})).send().await.unwrap();
    closed(keyed).await;
    // The attacker's URL was never added, so it never got a load poll (with the engines' key) or a prompt.
    for _ in 0..5 {
        assert_eq!(post(&format!("{}/v1/chat/completions", r.url), &chat("secret", "prompt")).await.status(), 200);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(hits.load(Ordering::SeqCst), 0, "the attacker's worker was contacted");
    assert_eq!(r.gateway.fleet.all().len(), 1);
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_takes_its_keys_and_only_them() {
    let w = MockEngine::spawn(engine_config()).await.unwrap();
    let r = start(config(&[&w], PolicyConfig::RoundRobin, false)).await;
    let (evil, hits) = attacker().await;
    let anonymous = reqwest::Client::new();
    for resp in [
        anonymous.post(format!("{}/workers", r.url)).json(&json!({"url": evil})).send().await.unwrap(),
        anonymous.get(format!("{}/metrics", r.url)).bearer_auth("wrong").send().await.unwrap(),
        anonymous.post(format!("{}/debug/route", r.url)).json(&chat("s", "u")).send().await.unwrap(),
    ] {
        assert_eq!(resp.status(), 401);
        assert_eq!(resp.headers()["www-authenticate"], "Bearer");
    }
    assert_eq!(hits.load(Ordering::SeqCst), 0);
    // /debug/route reveals prompts' placement and worker URLs: only to the control plane.
    let d: Value = admin_post(&format!("{}/debug/route", r.url), &chat("s", "u")).await.json().await.unwrap();
    assert_eq!(d["worker"], w.url());
    // A known route with the wrong method: 405, in the same JSON error shape as every error.
    let wrong = anonymous.get(format!("{}/v1/chat/completions", r.url)).send().await.unwrap();
    assert_eq!(wrong.status(), 405);
    assert_eq!(wrong.json::<Value>().await.unwrap()["error"]["type"], "method_not_allowed");
    // The probes stay open: orchestrators call them without keys.
    assert_eq!(reqwest::get(format!("{}/health", r.url)).await.unwrap().status(), 200);
    assert_eq!(reqwest::get(format!("{}/readiness", r.url)).await.unwrap().status(), 200);
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_urls_are_validated_and_one_engine_is_one_worker() {
    let w = MockEngine::spawn(engine_config()).await.unwrap();
    let r = start(config(&[&w], PolicyConfig::RoundRobin, false)).await;
    let add = async |url: &str| admin_post(&format!("{}/workers", r.url), &json!({"url": url})).await;
    for bad in [
        "http://:80",
        "http://127.0.0.1:99999",
        "http://127.0.0.1:8000#x",
        "http://user:pass@127.0.0.1:8000",
        "http://127.0.0.1:8000/../..",
        "ftp://127.0.0.1:8000",
    ] {
        let resp = add(bad).await;
        assert_eq!(resp.status(), 400, "{bad}");
    }
    // Other spellings of the worker already there are that worker.
    let port = w.url().rsplit(':').next().unwrap().to_string();
    for alias in [format!("{}/", w.url()), format!("HTTP://127.0.0.1:{port}//")] {
        let resp = add(&alias).await;
        assert_eq!(resp.status(), 200, "{alias}");
        assert_eq!(resp.json::<Value>().await.unwrap()["added"], false);
    }
    let listed: Value = admin_get(&format!("{}/workers", r.url)).await.json().await.unwrap();
    assert_eq!(listed["workers"].as_array().unwrap().len(), 1, "{listed}");
    // Credentials never reach /workers or /metrics, since they are never accepted.
    let metrics = admin_get(&format!("{}/metrics", r.url)).await.text().await.unwrap();
    assert!(!metrics.contains("pass@"));
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_engine_down_does_not_fail_readiness() {
    let (w0, w1) =
        (MockEngine::spawn(engine_config()).await.unwrap(), MockEngine::spawn(engine_config()).await.unwrap());
    let mut cfg = config(&[&w0, &w1], PolicyConfig::cache_aware(), true);
    cfg.health.interval = Duration::from_millis(200);
    let r = start(cfg).await;
    let ready = async || reqwest::get(format!("{}/readiness", r.url)).await.unwrap();
    until("ready", async || ready().await.status() == 200).await;
    // One engine crashes (its HTTP server and its publishers go): its subscription drops and it
    // leaves rotation; the other still routes.
    drop(w1);
    until("w1 out of rotation", async || r.gateway.fleet.all().iter().any(|w| !w.is_healthy())).await;
    until("its subscription is down", async || {
        ready().await.json::<Value>().await.unwrap()["degraded_subscriptions"] == 1
    })
    .await;
    let resp = ready().await;
    assert_eq!(resp.status(), 200, "one engine down is not a router outage");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["healthy_workers"], 1, "{body}");
    // The degraded subscription is a field of /workers too.
    let listed: Value = admin_get(&format!("{}/workers", r.url)).await.json().await.unwrap();
    let connected: Vec<&Value> =
        listed["workers"].as_array().unwrap().iter().map(|w| &w["kv_streams_connected"]).collect();
    assert_eq!(connected, [&json!(1), &json!(0)], "{listed}");
    assert_eq!(post(&format!("{}/v1/chat/completions", r.url), &chat("s", "u")).await.status(), 200);
    // Every engine down: not ready (nothing to route to).
    w0.shutdown();
    until("not ready", async || ready().await.status() == 503).await;
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_now_answers_carry_retry_after_on_both_paths() {
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    for fast_proxy in [true, false] {
        let mut cfg = config(&[], PolicyConfig::RoundRobin, false);
        cfg.workers = vec![router_types::WorkerUrl::new(gone.as_str())];
        cfg.health.interval = Duration::from_millis(100);
        cfg.fast_proxy = fast_proxy;
        let r = start(cfg).await;
        until("the dead worker is out", async || r.gateway.fleet.all().iter().all(|w| !w.is_healthy())).await;
        let resp = post(&format!("{}/v1/chat/completions", r.url), &chat("s", "u")).await;
        assert_eq!(resp.status(), 503, "fast path {fast_proxy}");
        assert_eq!(resp.headers()["retry-after"], "1", "fast path {fast_proxy}");
        let _ = r.stop.send(());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_can_have_a_listener_of_its_own() {
    let w = MockEngine::spawn(engine_config()).await.unwrap();
    let mut cfg = config(&[&w], PolicyConfig::RoundRobin, false);
    cfg.admin_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    let app = sgl_router::app::App::build(cfg).await.unwrap();
    let (url, admin) = (format!("http://{}", app.local_addr()), format!("http://{}", app.admin_addr().unwrap()));
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(app.run(async move {
        let _ = rx.await;
    }));
    // The client port serves no control route, key or not.
    assert_eq!(admin_get(&format!("{url}/workers")).await.status(), 404);
    assert_eq!(admin_get(&format!("{url}/metrics")).await.status(), 404);
    assert_eq!(post(&format!("{url}/v1/chat/completions"), &chat("s", "u")).await.status(), 200);
    // The admin port does, with the key.
    assert_eq!(admin_get(&format!("{admin}/workers")).await.status(), 200);
    let anonymous = reqwest::get(format!("{admin}/workers")).await.unwrap();
    assert_eq!(anonymous.status(), 401);
    assert_eq!(reqwest::get(format!("{admin}/readiness")).await.unwrap().status(), 200);
    let _ = stop.send(());
}
