//! Conditional disaggregation (vLLM): a request its decode worker would prefill little of
//! itself (a short prompt, or one its cache holds by its KV events) skips the prefill leg and
//! is served by the decode worker alone; a long cold prompt still goes through both legs.
//! SGLang's decode-mode servers cannot prefill, so the flags are refused there.

use crate::common;

use std::sync::atomic::Ordering::Relaxed;

use common::app::{Running, admin_post, chat, metric, post, start};
use common::eventually as until;
use common::pd::{pd_config, role_config};
use gateway::pd::{PdMode, SkipPrefill};
use mock_engine::{Flavor, MockEngine, MockEngineConfig, PdRole};
use serde_json::Value;
use sgl_router::app::PolicyConfig;

async fn explain(r: &Running, body: &Value) -> Value {
    admin_post(&format!("{}/debug/route", r.url), body).await.json().await.unwrap()
}

fn legs(m: &MockEngine) -> usize {
    m.engine().legs().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_or_held_prompt_is_served_by_its_decode_worker_alone() {
    let prefill = MockEngine::spawn(role_config(PdRole::Prefill, Flavor::Vllm, 1)).await.unwrap();
    // vLLM's decode caches the blocks it pulled and publishes them, as its engine does.
    let decode_config = MockEngineConfig { kv_events: true, ..role_config(PdRole::Decode, Flavor::Vllm, 1) };
    let decode = MockEngine::spawn(decode_config).await.unwrap();
    let (prefill, decode) = (vec![prefill], vec![decode]);
    let mut c = pd_config(PdMode::Vllm, &prefill, &decode, PolicyConfig::cache_aware(), PolicyConfig::power_of_two());
    c.pd.as_mut().unwrap().skip_prefill = SkipPrefill { uncached_below: 64, cached_fraction: 0.0 };
    let r = start(c).await;
    let url = format!("{}/v1/chat/completions", r.url);
    let path = |p: &str| format!("router_pd_paths_total{{path=\"{p}\"}}");

    // A short prompt: decode alone, no prefill leg.
    let short = serde_json::json!({"model": "default", "messages": [{"role": "user", "content": "Hi"}]});
    assert_eq!(post(&url, &short).await.status(), 200);
    assert_eq!(legs(&prefill[0]), 0, "no prefill leg for a short prompt");
    assert_eq!(metric(&r.url, &path("decode_alone")).await, 1.0);

    // A long cold prompt: both legs; decode keeps the blocks it pulled.
    let system = "Conditional disaggregation keeps short work on the decode worker. ".repeat(20);
    let answer = post(&url, &chat(&system, "first question")).await;
    assert_eq!(answer.status(), 200);
    assert_eq!(legs(&prefill[0]), 1, "a cold long prompt is prefilled remotely");
    assert_eq!(metric(&r.url, &path("disaggregated")).await, 1.0);

    // Its next turn: the decode worker holds all but the new question (by its events).
    let next = chat(&system, "second question");
    until("the index learned what decode holds", async || {
        explain(&r, &next).await["decode_held_tokens"].as_u64() > Some(1000)
    })
    .await;
    let plan = explain(&r, &next).await;
    assert_eq!(plan["decode_alone"], true, "{plan}");
    let v: Value = post(&url, &next).await.json().await.unwrap();
    let cached = v.pointer("/usage/prompt_tokens_details/cached_tokens").and_then(Value::as_u64).unwrap_or(0);
    assert!(cached > 1000, "decode prefilled only what it did not hold: {v}");
    assert_eq!(legs(&prefill[0]), 1, "no prefill leg for a prompt decode holds");
    assert_eq!(metric(&r.url, &path("decode_alone")).await, 2.0);
    let d = &decode[0].engine().pd().unwrap().counters;
    assert_eq!(d.local_prefill_fallbacks.load(Relaxed), 2, "both decode-alone requests prefilled locally");
    // The router predicted what decode held: its report meets the prediction.
    let predicted = metric(&r.url, "router_cached_tokens_total{source=\"predicted\"}").await;
    let observed = metric(&r.url, "router_cached_tokens_total{source=\"observed\"}").await;
    assert_eq!(predicted, observed);
    assert!(observed > 1000.0);
    let _ = r.stop.send(());
}
