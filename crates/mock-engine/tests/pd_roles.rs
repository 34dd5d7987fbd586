//! The simulated PD roles over real HTTP and TCP on 127.0.0.1, driven the
//! way a router drives them: SGLang's two legs met by room (and each way of
//! getting it wrong), vLLM's two stages linked by `kv_transfer_params` (and
//! the silent local-prefill fallback when they are missing).

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use mock_engine::{Flavor, MockEngine, MockEngineConfig, PdRole};
use serde_json::{Value, json};

async fn engine(role: PdRole, flavor: Flavor, dp_size: usize) -> MockEngine {
    let mut config =
        MockEngineConfig { fast: true, default_max_tokens: 3, dp_size, ..MockEngineConfig::in_role(role, flavor) };
    config.pd.bootstrap_timeout = Duration::from_secs(2);
    MockEngine::spawn(config).await.unwrap()
}

async fn post(url: String, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new().post(url).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

fn sglang_body(prefill: &MockEngine, room: u64) -> Value {
    let port = prefill.engine().pd().unwrap().bootstrap_port().unwrap();
    json!({"text": "a prompt of some length to prefill", "sampling_params": {"max_new_tokens": 3},
           "bootstrap_host": "127.0.0.1", "bootstrap_port": port, "bootstrap_room": room})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_legs_meet_by_room_and_only_together() {
    let p = engine(PdRole::Prefill, Flavor::Sglang, 1).await;
    let d = engine(PdRole::Decode, Flavor::Sglang, 1).await;
    let body = sglang_body(&p, 42);
    let (a, b) =
        tokio::join!(post(format!("{}/generate", p.url()), body.clone()), post(format!("{}/generate", d.url()), body));
    assert_eq!((a.0, b.0), (200, 200), "{a:?} {b:?}");
    assert_eq!(b.1["meta_info"]["completion_tokens"], 3, "decode generates: {b:?}");
    assert_eq!(a.1["meta_info"]["completion_tokens"], 1, "prefill answers one token: {a:?}");
    assert_eq!(p.engine().pd().unwrap().counters.rendezvous.load(Relaxed), 1);

    // /server_info tells the role and the bootstrap port.
    let info: Value = reqwest::get(format!("{}/server_info", p.url())).await.unwrap().json().await.unwrap();
    assert_eq!(info["disaggregation_mode"], "prefill");
    assert_eq!(info["disaggregation_bootstrap_port"], p.engine().pd().unwrap().bootstrap_port().unwrap());

    // No room: 400 on both roles.
    let mut no_room = sglang_body(&p, 1);
    no_room.as_object_mut().unwrap().remove("bootstrap_room");
    assert_eq!(post(format!("{}/generate", p.url()), no_room.clone()).await.0, 400);
    assert_eq!(post(format!("{}/generate", d.url()), no_room).await.0, 400);

    // Sequential dispatch deadlocks: prefill alone waits for its peer, then fails.
    let t = Instant::now();
    let (s, _) = post(format!("{}/generate", p.url()), sglang_body(&p, 7)).await;
    assert_eq!(s, 500);
    assert!(t.elapsed() >= Duration::from_secs(2));

    // Mismatched rooms: neither meets.
    let (a, b) = tokio::join!(
        post(format!("{}/generate", p.url()), sglang_body(&p, 100)),
        post(format!("{}/generate", d.url()), sglang_body(&p, 101))
    );
    assert_eq!((a.0, b.0), (500, 500));

    // A wrong bootstrap port: decode fails at once.
    let mut wrong = sglang_body(&p, 9);
    wrong["bootstrap_port"] = json!(1);
    let t = Instant::now();
    let (s, _) = post(format!("{}/generate", d.url()), wrong).await;
    assert_eq!(s, 500);
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(d.engine().pd().unwrap().counters.bootstrap_unreachable.load(Relaxed), 1);

    // A prompt mismatch fails both.
    let mut other = sglang_body(&p, 11);
    other["text"] = json!("another prompt altogether");
    let (a, b) = tokio::join!(
        post(format!("{}/generate", p.url()), sglang_body(&p, 11)),
        post(format!("{}/generate", d.url()), other)
    );
    assert_eq!((a.0, b.0), (500, 500));
    assert_eq!(p.engine().pd().unwrap().counters.prompt_mismatch.load(Relaxed), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_dp_rule_and_batches() {
    let p = engine(PdRole::Prefill, Flavor::Sglang, 4).await;
    let d = engine(PdRole::Decode, Flavor::Sglang, 1).await;
    // routed_dp_rank off the room, decode not told: the transfer fails.
    let mut prefill = sglang_body(&p, 5);
    prefill["routed_dp_rank"] = json!(2);
    let (a, b) = tokio::join!(
        post(format!("{}/generate", p.url()), prefill.clone()),
        post(format!("{}/generate", d.url()), sglang_body(&p, 5))
    );
    assert_eq!((a.0, b.0), (500, 500));
    assert_eq!(p.engine().pd().unwrap().counters.dp_mismatch.load(Relaxed), 1);
    // The same with decode told the rank: it works.
    let mut decode = sglang_body(&p, 6);
    decode["disagg_prefill_dp_rank"] = json!(2);
    prefill["bootstrap_room"] = json!(6);
    let (a, b) =
        tokio::join!(post(format!("{}/generate", p.url()), prefill), post(format!("{}/generate", d.url()), decode));
    assert_eq!((a.0, b.0), (200, 200), "{a:?} {b:?}");

    // A batch: one room per item.
    let mut batch = sglang_body(&p, 0);
    batch["text"] = json!(["first prompt", "second prompt"]);
    batch["bootstrap_room"] = json!([20, 21]);
    batch["bootstrap_host"] = json!(["127.0.0.1", "127.0.0.1"]);
    let (a, b) = tokio::join!(
        post(format!("{}/generate", p.url()), batch.clone()),
        post(format!("{}/generate", d.url()), batch.clone())
    );
    assert_eq!((a.0, b.0), (200, 200), "{a:?} {b:?}");
    assert_eq!(b.1.as_array().map(Vec::len), Some(2));
    batch["bootstrap_room"] = json!(20);
    assert_eq!(post(format!("{}/generate", p.url()), batch).await.0, 400, "a batch needs a room per item");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_two_stages_and_the_silent_fallback() {
    let p = engine(PdRole::Prefill, Flavor::Vllm, 1).await;
    let d = engine(PdRole::Decode, Flavor::Vllm, 1).await;
    let client = reqwest::Client::new();
    let body = json!({"model": "m", "prompt": "a prompt to prefill remotely", "max_tokens": 3});
    let mut first = body.clone();
    first["max_tokens"] = json!(1);
    first["kv_transfer_params"] = json!({"do_remote_decode": true, "do_remote_prefill": false,
        "remote_engine_id": null, "remote_block_ids": null, "remote_host": null, "remote_port": null});
    let r = client
        .post(format!("{}/v1/completions", p.url()))
        .header("x-request-id", "req-1")
        .json(&first)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let answer: Value = r.json().await.unwrap();
    let params = answer["kv_transfer_params"].clone();
    assert_eq!(params["do_remote_prefill"], true);
    // vLLM's internal id: the route's prefix, the X-Request-Id, a random suffix.
    assert!(params["remote_request_id"].as_str().unwrap().starts_with("cmpl-req-1-"), "{params}");
    let mut second = body.clone();
    second["kv_transfer_params"] = params;
    let r = client
        .post(format!("{}/v1/completions", d.url()))
        .header("x-request-id", "req-1")
        .json(&second)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let c = &d.engine().pd().unwrap().counters;
    assert_eq!(c.local_prefill_fallbacks.load(Relaxed), 0);
    assert_eq!(p.engine().pd().unwrap().counters.rendezvous.load(Relaxed), 1);

    // Decode without params: a right answer, prefilled locally, counted.
    let r = client.post(format!("{}/v1/completions", d.url())).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(c.local_prefill_fallbacks.load(Relaxed), 1);
    // Prefill refuses a body not shaped for it.
    let (s, _) = post(format!("{}/v1/completions", p.url()), body).await;
    assert_eq!(s, 400);
}
