//! SMG's `--upstream-http2` through the real binary: a worker that answers
//! HTTP/2 by prior knowledge gets every request over it (whole and streamed
//! answers relayed as they came, on both front ends' client), a worker that
//! does not stays on HTTP/1.1, and `/workers` says which is which. The
//! health probes and load polls speak what the requests do, so a worker that
//! answers HTTP/2 alone is healthy, polled and served.

use std::sync::atomic::Ordering::Relaxed;

use mock_engine::{MockEngine, MockEngineConfig};
use serde_json::{Value, json};

use crate::smg_compat::over_two;

async fn engine(http2: bool) -> MockEngine {
    let config = MockEngineConfig { kv_events: false, fast: true, http2, ..MockEngineConfig::default() };
    MockEngine::spawn(config).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_answers_http2_gets_it_and_one_that_does_not_stays_on_http1() {
    let (h2, h1) = (engine(true).await, engine(false).await);
    let (u2, u1) = (h2.url(), h1.url());
    let (_router, url, _) = over_two([&u2, &u1], &["--policy", "round_robin", "--upstream-http2"]).await;
    let http = reqwest::Client::new();
    for i in 0..8 {
        let stream = i % 2 == 1;
        let q = json!({"model": "default", "max_tokens": 3, "stream": stream,
            "messages": [{"role": "user", "content": format!("hello {i}")}]});
        let answer = http.post(format!("{url}/v1/chat/completions")).json(&q).send().await.unwrap();
        assert_eq!(answer.status(), 200);
        let text = answer.text().await.unwrap();
        if stream {
            assert!(text.trim_end().ends_with("data: [DONE]"), "a whole event stream: {text}");
        } else {
            let v: Value = serde_json::from_str(&text).unwrap();
            assert!(!v["choices"][0]["message"]["content"].as_str().unwrap().is_empty(), "{v}");
        }
    }
    // A chunked request body goes through the hyper front end, which sends with the same client.
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter([Ok::<_, std::io::Error>(
        br#"{"text": "chunked", "sampling_params": {"max_new_tokens": 2}}"#.to_vec(),
    )]));
    let answer = http.post(format!("{url}/generate")).body(body).send().await.unwrap();
    assert_eq!(answer.status(), 200);
    let (e2, e1) = (h2.engine(), h1.engine());
    let (n2, n1) = (e2.requests.load(Relaxed), e1.requests.load(Relaxed));
    assert_eq!(n2 + n1, 9);
    assert!(n2 >= 4 && n1 >= 4, "round robin: {n2} and {n1}");
    // Every request over HTTP/2, and the probes and load polls too (the first probe asked).
    assert!(e2.http2_requests.load(Relaxed) > n2, "the requests and at least one probe");
    assert_eq!(e2.http1_requests.load(Relaxed), 0, "nothing over HTTP/1.1");
    assert_eq!(e1.http2_requests.load(Relaxed), 0, "asked, it did not answer HTTP/2");
    let workers: Value =
        http.get(format!("{url}/workers")).bearer_auth("k").send().await.unwrap().json().await.unwrap();
    let said = |u: &str| {
        let list = workers["workers"].as_array().unwrap();
        list.iter().find(|w| w["url"] == u).unwrap()["upstream_http2"].clone()
    };
    assert_eq!((said(&u2), said(&u1)), (json!(true), json!(false)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_answers_http2_alone_is_probed_polled_and_served_over_it() {
    let only = MockEngineConfig { kv_events: false, fast: true, http2_only: true, ..MockEngineConfig::default() };
    let (h2, h1) = (MockEngine::spawn(only).await.unwrap(), engine(false).await);
    h2.engine().set_faults(mock_engine::Faults { report_waiting_extra: 5, ..Default::default() }).await;
    let (u2, u1) = (h2.url(), h1.url());
    // Healthy (over_two waits for both): its probe asked over HTTP/2.
    let (_router, url, metrics_url) = over_two([&u2, &u1], &["--policy", "round_robin", "--upstream-http2"]).await;
    let http = reqwest::Client::new();
    // Its load report, polled over HTTP/2.
    let waiting = format!("router_worker_reported_waiting_requests{{worker=\"{u2}\"}}");
    crate::common::eventually("its load polled", async || {
        let page = http.get(&metrics_url).send().await.unwrap().text().await.unwrap();
        crate::smg_compat::series(&page, &waiting) == Some(5.0)
    })
    .await;
    for i in 0..4 {
        let q =
            json!({"model": "default", "max_tokens": 2, "messages": [{"role": "user", "content": format!("q {i}")}]});
        let answer = http.post(format!("{url}/v1/chat/completions")).json(&q).send().await.unwrap();
        assert_eq!(answer.status(), 200);
    }
    let n2 = h2.engine().requests.load(Relaxed);
    assert_eq!(n2 + h1.engine().requests.load(Relaxed), 4);
    assert!(n2 >= 1, "round robin reaches it: {n2}");
    assert_eq!(h2.engine().http1_requests.load(Relaxed), 0);
}
