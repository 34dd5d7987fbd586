//! The cascade end to end (`tests/routing/cascade.yaml`): a whole chat goes
//! to the small pool with logprobs asked for; a sure answer is the client's
//! (without the logprobs it did not ask for), an unsure one sends the same
//! request to the large pool; streams and completions are judged or let
//! pass as documented, and everything is counted.

use crate::common;

use common::app::{config, metric, pools, start};
use serde_json::{Value, json};
use sgl_router::app::PolicyConfig;

fn chat(stream: bool) -> Value {
    json!({"model": "auto", "max_tokens": 3, "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
}

/// `body` POSTed to `url`: with its length (the HTTP/1.1 fast path), or chunked (the axum one).
async fn post(http: &reqwest::Client, url: String, body: &Value, chunked: bool) -> reqwest::Response {
    let r = http.post(url).header("content-type", "application/json");
    let bytes = bytes::Bytes::from(serde_json::to_vec(body).unwrap());
    let r = match chunked {
        false => r.body(bytes),
        true => r.body(reqwest::Body::wrap_stream(futures_util::stream::iter([Ok::<_, std::io::Error>(bytes)]))),
    };
    r.send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsure_small_answer_goes_to_the_large_pool() {
    cascade_on(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsure_small_answer_goes_to_the_large_pool_on_the_axum_front_end() {
    cascade_on(true).await;
}

/// Both front ends judge alike: the fast path (a sized body) and the axum one (`chunked`).
async fn cascade_on(chunked: bool) {
    let (routing, engines) = pools("tests/routing/cascade.yaml").await;
    let (small, large) = (&engines[0], &engines[1]);
    let mut app = config(&[], PolicyConfig::RoundRobin, false);
    app.routing = Some(routing);
    let router = start(app).await;
    let http = reqwest::Client::new();
    let send = async |body: &Value| {
        let r = post(&http, format!("{}/v1/chat/completions", router.url), body, chunked).await;
        let h = |n: &str| r.headers().get(n).map(|v| v.to_str().unwrap().to_owned());
        let (pool, cascade, id) = (h("x-route-pool"), h("x-route-cascade"), h("x-route-id"));
        assert_eq!(r.status(), 200);
        (pool, cascade, id, r.json::<Value>().await.unwrap())
    };

    // Sure (-0.1 a token): the small pool's answer, its logprobs taken out again.
    let (pool, cascade, id, answer) = send(&chat(false)).await;
    assert_eq!((pool.as_deref(), cascade.as_deref()), (Some("small"), Some("kept;mean_logprob=-0.100")));
    assert!(id.is_some());
    assert_eq!(answer["choices"][0]["logprobs"], Value::Null, "{answer}");
    assert_eq!(small.engine().legs().last().unwrap().body["logprobs"], true, "asked of the small pool");
    assert_eq!(large.engine().legs().len(), 0);

    // Unsure (-2.5 a token): the large pool answers the same request, without logprobs asked.
    small.engine().set_token_logprob(-2.5);
    let (pool, cascade, _, answer) = send(&chat(false)).await;
    assert_eq!((pool.as_deref(), cascade.as_deref()), (Some("large"), Some("escalated;mean_logprob=-2.500")));
    assert_eq!(answer["model"], "qwen-large");
    let leg = large.engine().legs().last().unwrap().body.clone();
    assert_eq!((leg["model"].as_str(), leg.get("logprobs")), (Some("qwen-large"), None), "{leg}");
    assert_eq!(leg["messages"], chat(false)["messages"]);
    let tier = large.engine().legs().last().unwrap().headers.iter().find(|(n, _)| n == "x-tier").map(|h| h.1.clone());
    assert_eq!(tier.as_deref(), Some("cascade"), "the decision's header changes apply to the second attempt");

    // A client that asked for logprobs gets them; a stream is never judged.
    let mut asked = chat(false);
    asked["logprobs"] = json!(true);
    small.engine().set_token_logprob(-0.2);
    let (_, cascade, _, answer) = send(&asked).await;
    assert_eq!(cascade.as_deref(), Some("kept;mean_logprob=-0.200"));
    assert_eq!(answer["choices"][0]["logprobs"]["content"][0]["logprob"], -0.2);
    let r = post(&http, format!("{}/v1/chat/completions", router.url), &chat(true), chunked).await;
    assert!(r.headers().get("x-route-cascade").is_none());
    assert!(r.text().await.unwrap().ends_with("data: [DONE]\n\n"));

    let count = |o: &str| format!("router_cascade_total{{decision=\"chat\",outcome=\"{o}\"}}");
    assert_eq!(metric(&router.url, &count("kept")).await, 2.0);
    assert_eq!(metric(&router.url, &count("escalated")).await, 1.0);
    assert_eq!(metric(&router.url, &count("skip_stream")).await, 1.0);
    let served = "router_model_requests_total{pool=\"large\",decision=\"chat\"}";
    assert_eq!(metric(&router.url, served).await, 1.0, "the escalated attempt counts under its decision");
    let ids = metric(&router.url, "router_route_ids").await;
    assert_eq!(ids, 4.0, "one route id per answer the client got: the escalated first answer's is forgotten");
    // Four requests, four answers: the escalated one is counted once, as is its latency.
    let chats = metric(&router.url, "router_http_requests_total{route=\"chat\",status=\"200\"}").await;
    assert_eq!(chats, 4.0);
    assert_eq!(metric(&router.url, "router_http_request_duration_seconds_count").await, 4.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_during_a_request_leaves_it_under_the_config_it_started_with() {
    let dir = std::env::temp_dir().join(format!("sgl-cascade-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("routing.yaml");
    let original = std::fs::read_to_string(common::app::repo("tests/routing/cascade.yaml")).unwrap();
    std::fs::write(&file, &original).unwrap();
    let (routing, engines) = pools(file.to_str().unwrap()).await;
    let (small, large) = (&engines[0], &engines[1]);
    let mut app = config(&[], PolicyConfig::RoundRobin, false);
    app.routing = Some(routing);
    let router = start(app).await;
    // Unsure, and held: the first attempt waits in the small pool's engine.
    small.engine().set_token_logprob(-2.5);
    small.engine().set_faults(mock_engine::Faults { hold_next: 1, ..Default::default() }).await;
    let asked = tokio::spawn({
        let url = format!("{}/v1/chat/completions", router.url);
        async move {
            let r = reqwest::Client::new().post(url).json(&chat(false)).send().await.unwrap();
            let cascade = r.headers().get("x-route-cascade").map(|v| v.to_str().unwrap().to_owned());
            (r.status().as_u16(), cascade)
        }
    });
    common::eventually("the first attempt is held by the small pool", async || {
        small.engine().held.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    // Meanwhile the decision's header changes.
    std::fs::write(&file, original.replace("x-tier: cascade", "x-tier: reloaded")).unwrap();
    let reloaded = common::app::admin_client().post(format!("{}/routing/reload", router.url)).send().await.unwrap();
    assert_eq!(reloaded.status(), 200);
    small.engine().release_held(1);
    let (status, cascade) = asked.await.unwrap();
    assert_eq!(status, 200);
    assert!(cascade.unwrap().starts_with("escalated"));
    // The escalated attempt went out under the config the request came in under.
    let leg = large.engine().legs().last().unwrap().clone();
    let tier = leg.headers.iter().find(|(n, _)| n == "x-tier").map(|h| h.1.clone());
    assert_eq!(tier.as_deref(), Some("cascade"));
    // The next request is under the new one.
    let r = reqwest::Client::new().post(format!("{}/v1/chat/completions", router.url)).json(&chat(false));
    assert_eq!(r.send().await.unwrap().status(), 200);
    let leg = large.engine().legs().last().unwrap().clone();
    let tier = leg.headers.iter().find(|(n, _)| n == "x-tier").map(|h| h.1.clone());
    assert_eq!(tier.as_deref(), Some("reloaded"));
    let _ = router.stop.send(());
    let _ = std::fs::remove_dir_all(&dir);
}
