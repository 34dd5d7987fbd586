//! NVIDIA Dynamo 1.6.1 as a third-party publisher: its simulated engine publishes vLLM-format
//! KV events (and answers replays with four frames, `["", "", seq, payload]`) behind its own
//! OpenAI frontend. The router's replay client reads its buffer, the router follows the
//! events, predicts each answer's cached tokens to the token, and never sends the rank
//! header Dynamo's frontend refuses (400 `Invalid request`).

use crate::common;

use common::app::{Running, admin_post, config, metric, post, start};
use common::dynamo::{Dynamo, python};
use common::eventually as until;

use router_types::WorkerUrl;
use serde_json::{Value, json};
use sgl_router::app::{AppConfig, PolicyConfig};

fn chat(model: &str, system: &str, user: &str) -> Value {
    json!({"model": model, "max_tokens": 2, "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]})
}

/// A cache-aware router over the frontend, following the mocker's events.
fn over(d: &Dynamo, rank_header: fleet::RankHeader) -> AppConfig {
    let mut c = config(&[], PolicyConfig::cache_aware(), true);
    let worker = WorkerUrl::parse(&d.url).unwrap();
    c.workers = vec![worker.clone()];
    let events = c.kv_events.as_mut().unwrap();
    events.explicit.endpoints.insert(worker.clone(), d.events.clone());
    events.explicit.replay_endpoints.insert(worker, d.replay.clone());
    c.tokenizer_path = Some(d.model_dir.clone());
    c.backend = renderer::anthropic::Backend::Vllm;
    c.model_id = d.model.into();
    c.request_timeout = std::time::Duration::from_secs(30);
    c.rank_header = rank_header;
    c
}

async fn matched(r: &Running, body: &Value) -> u64 {
    let plan: Value = admin_post(&format!("{}/debug/route", r.url), body).await.json().await.unwrap();
    plan["candidates"][0]["matched_tokens"].as_u64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_follows_dynamos_mocker_through_its_frontend() {
    let Some(python) = python("the Dynamo interop tests") else { return };
    let d = Dynamo::start(&python).await;
    let system = "Dynamo's simulated engine publishes what it caches. ".repeat(40);
    // Before the router subscribes: only a replay can tell it of this one.
    let first = post(&format!("{}/v1/chat/completions", d.url), &chat(d.model, &system, "first")).await;
    assert_eq!(first.status(), 200, "{}", first.text().await.unwrap());
    // The mocker's replay socket (its ROUTER answers `["", "", seq, payload]`, a frame more than
    // vLLM's publisher): the router's replay client reads its buffer, the batches decode.
    let limits = kv_events::replay::ReplayLimits { timeout: std::time::Duration::from_secs(5), ..Default::default() };
    let replayed = kv_events::replay::fetch_range(&d.replay, 0, None, &limits).await.unwrap();
    assert!(!replayed.is_empty(), "the first request's batch is buffered");
    for (seq, payload) in &replayed {
        let decoded = kv_events::decode_batch(payload, &kv_events::Limits::default()).unwrap();
        assert!(!decoded.batch.events.is_empty(), "batch {seq}: {decoded:?}");
    }
    let r = start(over(&d, fleet::RankHeader::Auto)).await;
    assert_eq!(post(&format!("{}/v1/chat/completions", d.url), &chat(d.model, &system, "second")).await.status(), 200);
    let next = chat(d.model, &system, "third");
    until("the router learned the prefix", async || matched(&r, &next).await >= 320).await;
    // Through the router: no rank header (the engine advertised no ranks), the cached tokens predicted.
    for user in ["third", "fourth"] {
        let resp = post(&format!("{}/v1/chat/completions", r.url), &chat(d.model, &system, user)).await;
        assert_eq!(resp.status(), 200);
        let v: Value = resp.json().await.unwrap();
        let cached = v.pointer("/usage/prompt_tokens_details/cached_tokens").and_then(Value::as_u64);
        assert!(cached >= Some(320), "{v}");
    }
    let predicted = metric(&r.url, "router_cached_tokens_total{source=\"predicted\"}").await;
    let observed = metric(&r.url, "router_cached_tokens_total{source=\"observed\"}").await;
    assert_eq!(metric(&r.url, "router_cached_tokens_answers_total{reported=\"true\"}").await, 2.0);
    assert_eq!(predicted, observed, "the router's prediction meets the mocker's report");
    for bad in ["router_kv_events_hash_mismatches_total", "router_kv_events_decode_errors_total"] {
        let text = common::app::admin_get(&format!("{}/metrics", r.url)).await.text().await.unwrap();
        let total: f64 =
            text.lines().filter(|l| l.starts_with(bad)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum();
        assert_eq!(total, 0.0, "{bad}");
    }
    let _ = r.stop.send(());

    // The header named: Dynamo's frontend refuses it, which is why it is not sent by default.
    let r = start(over(&d, fleet::RankHeader::Always)).await;
    // A new conversation, its first turn straight to Dynamo: the router learns it live.
    let system = "A conversation the second router sees from its start. ".repeat(40);
    assert_eq!(post(&format!("{}/v1/chat/completions", d.url), &chat(d.model, &system, "first")).await.status(), 200);
    let next = chat(d.model, &system, "second");
    until("the second router learned the prefix", async || matched(&r, &next).await >= 400).await;
    let resp = post(&format!("{}/v1/chat/completions", r.url), &next).await;
    assert_eq!(resp.status(), 400, "Dynamo refuses X-Data-Parallel-Rank");
    let _ = r.stop.send(());
}
