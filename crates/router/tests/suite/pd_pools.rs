//! A routing config's disaggregated pool (`disaggregation: sglang`, its
//! `prefill` and `decode` workers): `model: "auto"` picks the pool by the
//! decisions, then a pair of its workers serves the request (prefill by the
//! pool's policy, decode by load), the answer coming from the decode worker
//! with the route headers; the other pools keep their regular workers.

use crate::common;

use std::sync::atomic::Ordering::Relaxed;

use common::app::{admin_get, admin_post, config, engine_config, start};
use common::pd::{role_config, url};
use gateway::pd::{KvConnector, PdMode};
use mock_engine::{Flavor, MockEngine, MockEngineConfig, PdRole};
use router_types::Bootstrap;
use serde_json::{Value, json};
use sgl_router::app::{PolicyConfig, PoolPd, PoolSetup, RoutingSetup};

const ROUTING: &str = r#"
version: 1
auto_model_names: [auto]
default_pool: small
pools:
  - name: small
    served_model: small-model
  - name: large
    served_model: large-model
    disaggregation: sglang
    prefill: [http://127.0.0.1:9]
    decode: [http://127.0.0.1:9]
signals:
  keywords:
    - {name: proof, operator: OR, keywords: [prove, theorem]}
  context:
    - {name: long, min_tokens: 100000}
decisions:
  - {name: reasoning, priority: 10, pools: [large],
     rules: {operator: OR, conditions: [{type: keyword, name: proof}, {type: context, name: long}]},
     plugins: [{type: header_mutation, set: {x-reasoning: "on"}}]}
  - {name: chat, pools: [small]}
"#;

async fn ask(url: &str, text: &str) -> (u16, reqwest::header::HeaderMap, Value) {
    let body = json!({"model": "auto", "messages": [{"role": "user", "content": text}], "max_tokens": 4});
    let resp = reqwest::Client::new().post(format!("{url}/v1/chat/completions")).json(&body).send().await.unwrap();
    let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
    (status, headers, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disaggregated_pool_serves_auto_requests_from_its_decode_worker() {
    let serving = |c: MockEngineConfig, model: &str| MockEngineConfig {
        model_id: model.into(),
        strict_model: true,
        record_requests: true,
        ..c
    };
    let small = MockEngine::spawn(serving(engine_config(), "small-model")).await.unwrap();
    let prefill =
        MockEngine::spawn(serving(role_config(PdRole::Prefill, Flavor::Sglang, 1), "large-model")).await.unwrap();
    let decode =
        MockEngine::spawn(serving(role_config(PdRole::Decode, Flavor::Sglang, 1), "large-model")).await.unwrap();
    let mut c = config(&[], PolicyConfig::cache_aware(), true);
    // The workers are the engines started here (the file's are placeholders).
    let file = model_select::parse_yaml(ROUTING).unwrap();
    let pool = |name: &str, served: &str| PoolSetup {
        name: name.into(),
        served_model: served.into(),
        workers: Vec::new(),
        policy: PolicyConfig::cache_aware(),
        tokenizer_path: None,
        chat_template: None,
        context_window: None,
        pd: None,
    };
    let mut large = pool("large", "large-model");
    large.pd = Some(PoolPd {
        mode: PdMode::Sglang,
        connector: KvConnector::Nixl,
        prefill: vec![(url(&prefill), Bootstrap::Discover)],
        decode: vec![url(&decode)],
        decode_policy: PolicyConfig::RoundRobin,
    });
    let small_pool = PoolSetup { workers: vec![url(&small)], ..pool("small", "small-model") };
    c.routing = Some(RoutingSetup { config: file, pools: vec![small_pool, large], source: None });
    let r = start(c).await;

    // The reasoning decision: the disaggregated pool, both legs, the decode worker's answer.
    let (status, headers, answer) =
        ask(&r.url, "Please prove the theorem that there are infinitely many primes.").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(headers["x-route-pool"], "large");
    assert_eq!(headers["x-route-decision"], "reasoning");
    assert_eq!(answer["model"], "large-model", "{answer}");
    let (p, d) = (prefill.engine().legs(), decode.engine().legs());
    assert_eq!((p.len(), d.len()), (1, 1), "one leg on each");
    for leg in [&p[0], &d[0]] {
        assert_eq!(leg.body["model"], "large-model", "the pool's served model on both legs");
        assert_eq!(leg.body["bootstrap_room"], p[0].body["bootstrap_room"], "both legs in one room");
        let edited = leg.headers.iter().any(|(n, v)| n == "x-reasoning" && v == "on");
        assert!(edited, "the decision's header edits reach both legs: {:?}", leg.headers);
    }
    let counters = &prefill.engine().pd().unwrap().counters;
    assert_eq!(counters.rendezvous.load(Relaxed), 1, "the legs met in their room");
    assert_eq!(small.engine().requests.load(Relaxed), 0);
    // The context signal rendered the prompt (the pools share the router's renderer); the
    // disaggregated pool's plan took that render instead of making another.
    let m = admin_get(&format!("{}/metrics", r.url)).await.text().await.unwrap();
    assert!(m.lines().any(|l| l == "router_prompt_renders_total 1"), "one render for signals and pair: {m}");

    // The chat decision: the regular pool, its one worker, no leg anywhere.
    let (status, headers, answer) = ask(&r.url, "Hello there, how are you?").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(headers["x-route-pool"], "small");
    assert_eq!(answer["model"], "small-model");
    assert_eq!(small.engine().requests.load(Relaxed), 1);
    assert_eq!((prefill.engine().legs().len(), decode.engine().legs().len()), (1, 1));

    // The explain shows the pool's pair; the metrics count its decisions.
    let asked = json!({"model": "auto", "messages": [{"role": "user", "content": "prove it"}]});
    let explain: Value = admin_post(&format!("{}/debug/route", r.url), &asked).await.json().await.unwrap();
    assert_eq!(explain["pool"], "large", "{explain}");
    assert_eq!(explain["prefill"]["worker"], url(&prefill).as_str(), "{explain}");
    assert_eq!(explain["decode"]["worker"], url(&decode).as_str(), "{explain}");
    // The preview names the decision, the pool and the pair.
    let preview: Value = admin_post(&format!("{}/v1/route/preview", r.url), &asked).await.json().await.unwrap();
    assert_eq!((&preview["decision"], &preview["pool"]), (&json!("reasoning"), &json!("large")), "{preview}");
    assert_eq!(preview["pair"]["decode"]["worker"], url(&decode).as_str(), "{preview}");
    let m = admin_get(&format!("{}/metrics", r.url)).await.text().await.unwrap();
    assert!(m.contains("router_pd_decisions_total{leg=\"decode\",policy=\"round_robin\""), "{m}");
    let _ = r.stop.send(());
}
