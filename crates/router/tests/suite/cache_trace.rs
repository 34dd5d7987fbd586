//! SMG's `x-smg-cache-trace` through the real binary: a request that asks
//! gets its dispatch's decision record in the answer (the fast path's and a
//! stream's head alike), naming the worker that answered, the policy, and
//! what the KV index said that worker holds; a retry adds its selection; a
//! request that does not ask gets no record. And SMG's `--cache-ttl-secs`:
//! the text tree's placements expire.

use mock_engine::{Faults, MockEngine, MockEngineConfig};
use serde_json::{Value, json};

use crate::smg_compat::over_two;

async fn engine() -> MockEngine {
    MockEngine::spawn(MockEngineConfig { fast: true, ..MockEngineConfig::default() }).await.unwrap()
}

/// The decision record an answer carries, parsed; `None` without one.
fn record(answer: &reqwest::Response) -> Option<Value> {
    let v = answer.headers().get("x-smg-cache-trace")?;
    Some(serde_json::from_str(v.to_str().unwrap()).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_asks_gets_its_decision_record_and_what_the_index_predicted() {
    let (e0, e1) = (engine().await, engine().await);
    let (u0, u1) = (e0.url(), e1.url());
    #[rustfmt::skip]
    let flags = [
        "--policy", "cache_aware", "--kv-events", "--cache-affinity-min-matched-tokens", "16",
        "--retry-max-retries", "3", "--retry-initial-backoff-ms", "1",
    ];
    let (_router, url, _) = over_two([&u0, &u1], &flags).await;
    let http = reqwest::Client::new();
    let prompt = "a shared system prompt long enough to fill several pages of the cache ".repeat(8);
    let chat = |stream: bool| {
        json!({"model": "default", "max_tokens": 2, "stream": stream,
            "messages": [{"role": "user", "content": prompt.clone()}]})
    };
    let post = |q: Value, ask: bool| {
        let r = http.post(format!("{url}/v1/chat/completions")).json(&q);
        if ask { r.header("x-smg-cache-trace", "1") } else { r }
    };

    // Not asked: no record.
    let answer = post(chat(false), false).send().await.unwrap();
    assert_eq!(answer.status(), 200);
    assert!(record(&answer).is_none());
    let first = if e0.engine().requests.load(std::sync::atomic::Ordering::Relaxed) == 1 { &u0 } else { &u1 };

    // Once the first answer's pages are in the index (the explain route sends nothing, so no
    // other engine gets the prompt meanwhile), an asked request's record: the same worker,
    // predicted by the index.
    crate::common::eventually("the first answer's pages in the index", async || {
        let r = http.post(format!("{url}/debug/route")).bearer_auth("k").json(&chat(false)).send().await.unwrap();
        let explain: Value = r.json().await.unwrap();
        explain["reason"] == "cache_hit" && explain["worker"] == **first
    })
    .await;
    let answer = post(chat(false), true).send().await.unwrap();
    assert_eq!(answer.status(), 200);
    let id = answer.headers()["x-request-id"].to_str().unwrap().to_string();
    let r = record(&answer).expect("asked: a record");
    assert_eq!((r["schema"].clone(), r["root_id"].clone(), r["attempt"].clone()), (json!(1), json!(id), json!(1)));
    assert_eq!(r["engine_ids"], json!([first]), "{r}");
    assert_eq!(r["selections"][0]["worker"], **first, "{r}");
    assert_eq!(r["selections"][0]["policy"], "cache_aware");
    assert!(r["selections"][0].get("candidates").is_none(), "no candidates in the header: {r}");
    let p = &r["selections"][0]["prediction"];
    assert_eq!(p["source"], "event_index", "{r}");
    assert!(
        p["matched_tokens"].as_u64() > Some(0) && p["matched_tokens"].as_u64() <= p["input_tokens"].as_u64(),
        "{r}"
    );

    // A stream's head carries it too.
    let answer = post(chat(true), true).send().await.unwrap();
    let r = record(&answer).expect("a stream's record");
    assert_eq!(r["engine_ids"][0], **first);
    assert!(answer.text().await.unwrap().contains("[DONE]"));

    // A chunked body is served by the hyper front end, which reads the ask from its header map.
    let bytes = serde_json::to_vec(&chat(false)).unwrap();
    let chunked = reqwest::Body::wrap_stream(futures_util::stream::iter([Ok::<_, std::io::Error>(bytes)]));
    let r = http.post(format!("{url}/v1/chat/completions")).header("x-smg-cache-trace", "1");
    let answer = r.header("content-type", "application/json").body(chunked).send().await.unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(record(&answer).expect("the hyper front end's record")["engine_ids"][0], **first);

    // The worker holding the prompt answers 503: the retry's selection is recorded after the policy's.
    let holder = if *first == u0 { &e0 } else { &e1 };
    holder.engine().set_faults(Faults { fail_next: 1, fail_status: 503, ..Faults::default() }).await;
    let answer = post(chat(false), true).send().await.unwrap();
    assert_eq!(answer.status(), 200);
    let r = record(&answer).unwrap();
    let origins: Vec<&Value> = r["selections"].as_array().unwrap().iter().map(|s| &s["origin"]).collect();
    assert_eq!(origins, [&json!("policy"), &json!("retry")], "{r}");
    assert_eq!(r["attempt"], 2);
    assert_eq!(r["selections"][0]["worker"], **first);
    assert_ne!(r["engine_ids"][0], **first, "answered by the other: {r}");
    assert_eq!(r["engine_ids"][0], r["selections"][1]["worker"]);
}

/// SMG's `--cache-ttl-secs` through the real binary: the text tree (engines without KV events)
/// sends a prompt back to the engine it went to, until that placement is older than the TTL;
/// the explain route (which learns nothing) sees it expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_tree_placement_is_routable_until_its_ttl() {
    let cold = || MockEngine::spawn(MockEngineConfig { fast: true, kv_events: false, ..MockEngineConfig::default() });
    let (e0, e1) = (cold().await.unwrap(), cold().await.unwrap());
    let (u0, u1) = (e0.url(), e1.url());
    let (_router, url, _) = over_two([&u0, &u1], &["--policy", "cache_aware", "--cache-ttl-secs", "1"]).await;
    let http = reqwest::Client::new();
    let q = json!({"model": "default", "max_tokens": 2,
        "messages": [{"role": "user", "content": "the one prompt this test sends, long enough to match"}]});
    let sent = std::time::Instant::now();
    let first = http.post(format!("{url}/v1/chat/completions")).json(&q).send().await.unwrap();
    assert_eq!(first.status(), 200);
    let explain = async || -> Value {
        let r = http.post(format!("{url}/debug/route")).bearer_auth("k").json(&q).send().await.unwrap();
        r.json().await.unwrap()
    };
    let fresh = explain().await;
    if sent.elapsed() < std::time::Duration::from_millis(900) {
        assert_eq!(fresh["reason"], "text_tree_hit", "within the TTL: {fresh}");
    }
    crate::common::eventually("the placement past its TTL", async || explain().await["reason"] != "text_tree_hit")
        .await;
    assert!(sent.elapsed() >= std::time::Duration::from_secs(1), "not before the TTL: {:?}", sent.elapsed());
}

/// SMG's `--cache-index hash` through the real binary (engines without KV events): a request
/// is matched by its heads at `--cache-boundaries`, so a prompt sharing the first 64 tokens of
/// one sent before goes to that worker (`head_hash_hit`), a prompt
/// sharing none is load-balanced, and a placement older than `--cache-ttl-secs` is not matched.
/// The map's bytes are reported as the tree's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_hash_placement_sends_a_shared_head_back_until_its_ttl() {
    let cold = || MockEngine::spawn(MockEngineConfig { fast: true, kv_events: false, ..MockEngineConfig::default() });
    let (e0, e1) = (cold().await.unwrap(), cold().await.unwrap());
    let (u0, u1) = (e0.url(), e1.url());
    #[rustfmt::skip]
    let flags = [
        "--policy", "cache_aware", "--cache-index", "hash", "--cache-boundaries", "64,16",
        "--cache-ttl-secs", "2",
    ];
    let (_router, url, metrics_url) = over_two([&u0, &u1], &flags).await;
    let http = reqwest::Client::new();
    // No tokenizer: one token per byte of the rendered chat, the system prompt first.
    let chat = |system: &str, user: &str| {
        json!({"model": "default", "max_tokens": 2, "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": user}]})
    };
    let system = "a system prompt shared by the conversation, longer than sixty-four bytes";
    let explain = async |q: &Value| -> Value {
        let r = http.post(format!("{url}/debug/route")).bearer_auth("k").json(q).send().await.unwrap();
        r.json().await.unwrap()
    };
    let before = explain(&chat(system, "the first question")).await;
    assert_eq!(before["reason"], "no_cache_candidate", "nothing placed yet: {before}");
    let sent = std::time::Instant::now();
    let first = http.post(format!("{url}/v1/chat/completions")).json(&chat(system, "the first question"));
    assert_eq!(first.send().await.unwrap().status(), 200);
    let placed = crate::smg_compat::series(
        &http.get(&metrics_url).send().await.unwrap().text().await.unwrap(),
        "router_policy_tree_bytes{pool=\"default\"}",
    );
    assert_eq!(placed, Some(2.0 * policy::HEAD_ENTRY_BYTES as f64), "two heads placed, 16 and 64 tokens");
    let again = explain(&chat(system, "another question, the same conversation")).await;
    let other = explain(&chat("a different system prompt from its first byte on, as long as the other", "q")).await;
    if sent.elapsed() < std::time::Duration::from_millis(1_800) {
        assert_eq!(again["reason"], "head_hash_hit", "the same first 64 tokens: {again}");
        let holder = again["worker"].clone();
        assert!(holder == json!(u0) || holder == json!(u1), "{again}");
        assert_eq!(other["reason"], "no_cache_candidate", "no shared head: {other}");
    }
    crate::common::eventually("the placement past its TTL", async || {
        explain(&chat(system, "a later question")).await["reason"] != "head_hash_hit"
    })
    .await;
    assert!(sent.elapsed() >= std::time::Duration::from_secs(2), "not before the TTL: {:?}", sent.elapsed());
}

/// A disaggregated request's record: the pair's prefill (with its prediction) and decode
/// selections, then each retry's new pair; the engines are the pair that answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disaggregated_requests_record_names_both_legs_and_each_retrys_pair() {
    use crate::common::app::{chat, start};
    use crate::common::pd::{engines, pd_config};
    use mock_engine::{Flavor, PdRole};
    use sgl_router::app::PolicyConfig;

    let prefill = engines(PdRole::Prefill, Flavor::Sglang, 2, 1).await;
    let decode = engines(PdRole::Decode, Flavor::Sglang, 2, 1).await;
    let config =
        pd_config(gateway::pd::PdMode::Sglang, &prefill, &decode, PolicyConfig::RoundRobin, PolicyConfig::RoundRobin);
    let r = start(config).await;
    // The first decode leg fails retryably: the request is answered by the second pair.
    for d in &decode {
        d.engine().set_faults(Faults { fail_next: 1, fail_status: 503, ..Faults::default() }).await;
    }
    let body = chat("You are a careful assistant who answers in full sentences. ", "trace me");
    let http = reqwest::Client::new();
    let answer = http.post(format!("{}/v1/chat/completions", r.url)).header("x-smg-cache-trace", "1").json(&body);
    let answer = answer.send().await.unwrap();
    assert_eq!(answer.status(), 200);
    let rec = record(&answer).expect("a record");
    let s = rec["selections"].as_array().unwrap();
    let origins: Vec<&str> = s.iter().map(|s| s["origin"].as_str().unwrap()).collect();
    let attempts = rec["attempt"].as_u64().unwrap() as usize;
    assert!(attempts >= 2, "{rec}");
    assert_eq!(s.len(), 2 * attempts, "a prefill and a decode per attempt: {rec}");
    assert_eq!(&origins[..2], ["policy", "policy"]);
    assert!(origins[2..].iter().all(|o| *o == "retry"), "{rec}");
    assert!(s[0]["prediction"].is_object() && s[1]["prediction"].is_null(), "the decode leg predicts nothing: {rec}");
    let last = &s[s.len() - 2..];
    assert_eq!(rec["engine_ids"], json!([last[0]["worker"], last[1]["worker"]]), "the pair that answered: {rec}");
    let prefills: Vec<String> = prefill.iter().map(MockEngine::url).collect();
    assert!(prefills.iter().any(|u| last[0]["worker"] == **u), "{rec}");
}
