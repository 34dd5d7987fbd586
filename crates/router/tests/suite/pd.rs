//! Prefill/decode disaggregation end to end: the router in front of
//! simulated engines in the prefill and decode roles (real HTTP, a real
//! rendezvous over TCP, real KV events from the prefill workers). Each test
//! fails on one of the router bugs `../shared/docs/pd.md` §4 lists: rooms or
//! bootstrap addresses the legs cannot meet by, sequential dispatch (the
//! legs deadlock), the answer taken from prefill, a failed leg left waiting,
//! a retry in an old room, unaligned data-parallel rooms, logprobs not
//! merged, prefill chosen without events, decode chosen by prefix, and for
//! vLLM a decode leg sent without complete `kv_transfer_params`.

use crate::common;

use std::collections::HashSet;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use common::app::{ADMIN_KEY, Running, admin_get, chat, post, post_within, start};
use common::pd::{engines, pd_config, role_config};
use gateway::pd::PdMode;
use mock_engine::{Faults, Flavor, MockEngine, PdRole};
use policy::CacheAwareConfig;
use serde_json::{Value, json};
use sgl_router::app::PolicyConfig;

fn cache_aware(min_matched_tokens: u64) -> PolicyConfig {
    match PolicyConfig::cache_aware() {
        PolicyConfig::CacheAware(c, t) => PolicyConfig::CacheAware(CacheAwareConfig { min_matched_tokens, ..c }, t),
        other => other,
    }
}

async fn pd_router(mode: PdMode, prefill: &[MockEngine], decode: &[MockEngine]) -> Running {
    start(pd_config(mode, prefill, decode, cache_aware(16), PolicyConfig::power_of_two())).await
}

fn counters(m: &MockEngine) -> &mock_engine::PdCounters {
    &m.engine().pd().unwrap().counters
}

fn sum(ms: &[MockEngine], f: impl Fn(&mock_engine::PdCounters) -> u64) -> u64 {
    ms.iter().map(|m| f(counters(m))).sum()
}

fn requests(ms: &[MockEngine]) -> Vec<u64> {
    ms.iter().map(|m| m.engine().requests.load(Relaxed)).collect()
}

const SYSTEM: &str = "You are a careful assistant who answers in full sentences. ";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_both_legs_meet_and_decode_answers_every_route() {
    let prefill = engines(PdRole::Prefill, Flavor::Sglang, 2, 1).await;
    let decode = engines(PdRole::Decode, Flavor::Sglang, 2, 1).await;
    let r = pd_router(PdMode::Sglang, &prefill, &decode).await;
    let bodies = [
        ("/v1/chat/completions", chat(SYSTEM, "What is a KV cache?")),
        ("/v1/completions", json!({"model": "default", "prompt": "Once upon a time", "max_tokens": 4})),
        ("/generate", json!({"text": "Once upon a time", "sampling_params": {"max_new_tokens": 4}})),
    ];
    for (path, body) in &bodies {
        for stream in [false, true] {
            let mut body = body.clone();
            body["stream"] = json!(stream);
            let resp = post(&format!("{}{path}", r.url), &body).await;
            assert_eq!(resp.status(), 200, "{path} stream={stream}");
            let text = resp.text().await.unwrap();
            if stream {
                // Decode's stream: its four tokens (a prefill answers one), then [DONE].
                assert_eq!(text.matches("data: ").count() - 1, if *path == "/generate" { 4 } else { 5 }, "{text}");
                assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
            } else {
                let v: Value = serde_json::from_str(&text).unwrap();
                let n = v.pointer("/usage/completion_tokens").or_else(|| v.pointer("/meta_info/completion_tokens"));
                assert_eq!(n, Some(&json!(4)), "the answer is decode's, not prefill's: {v}");
            }
        }
    }
    // Every request met in one room, on a prefill and a decode worker.
    assert_eq!(sum(&prefill, |c| c.rendezvous.load(Relaxed)), 6);
    assert_eq!(requests(&decode).iter().sum::<u64>(), 6, "decode legs went to decode workers");
    assert_eq!(requests(&prefill).iter().sum::<u64>(), 6, "prefill legs went to prefill workers");
    let legs: Vec<_> = prefill.iter().chain(&decode).flat_map(|m| m.engine().legs()).collect();
    let rooms: HashSet<u64> = legs.iter().filter_map(|l| l.body["bootstrap_room"].as_u64()).collect();
    assert_eq!(rooms.len(), 6, "one fresh room per request, the same on both legs");
    for l in &legs {
        let port = l.body["bootstrap_port"].as_u64().unwrap() as u16;
        let own = prefill.iter().map(|p| p.engine().pd().unwrap().bootstrap_port().unwrap()).collect::<Vec<_>>();
        assert!(own.contains(&port), "the bootstrap port is a prefill worker's: {}", l.body);
        assert_eq!(l.body["bootstrap_host"], "127.0.0.1");
        assert!(l.body["rid"].as_str().is_some_and(|rid| !rid.is_empty()), "the router sets a rid to abort by");
    }
    assert_eq!(sum(&prefill, |c| c.bootstrap_timeouts.load(Relaxed)), 0);
    // Answered requests abort nothing: a prefill answer still coming when decode's ended is read
    // to its end (its connection pooled), not aborted with an /abort_request of its own.
    let m = admin_get(&format!("{}/metrics", r.url)).await.text().await.unwrap();
    assert!(!m.contains("router_pd_aborts_total{"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_prefill_aborts_decode_at_once() {
    let prefill = engines(PdRole::Prefill, Flavor::Sglang, 1, 1).await;
    let decode = engines(PdRole::Decode, Flavor::Sglang, 1, 1).await;
    let mut c = pd_config(PdMode::Sglang, &prefill, &decode, PolicyConfig::RoundRobin, PolicyConfig::RoundRobin);
    c.retry.enabled = false;
    let r = start(c).await;
    // The prefill refuses the request; decode would wait its 10 s bootstrap timeout for a peer.
    prefill[0].engine().set_faults(Faults { fail_next: 1, fail_status: 400, ..Faults::default() }).await;
    let t = Instant::now();
    let resp = post(&format!("{}/v1/chat/completions", r.url), &chat(SYSTEM, "hi")).await;
    assert_eq!(resp.status(), 400, "the prefill's own error");
    assert_eq!(resp.headers()["x-sgl-router-pd-leg"], "prefill");
    assert!(t.elapsed() < Duration::from_secs(1), "answered in {:?}", t.elapsed());
    // The decode leg was aborted (its connection closed, /abort_request by rid), not left waiting.
    // (A decode leg stopped before it was written never reached the engine: nothing waits then.)
    wait_for(|| counters(&decode[0]).cancelled.load(Relaxed) == decode[0].engine().legs().len() as u64).await;
    assert_eq!(counters(&decode[0]).rendezvous.load(Relaxed), 0);
    let m = common::app::admin_get(&format!("{}/metrics", r.url)).await.text().await.unwrap();
    assert!(m.contains("router_pd_aborts_total{leg=\"decode\"} 1"), "{m}");
    assert!(m.contains("router_pd_legs_total{leg=\"prefill\",outcome=\"status\"} 1"), "{m}");
}

/// Issue 28 #2 on the disaggregated path: a prefill engine (or a proxy in front of it) with a body
/// limit below the router's answers 413 before it has read the body and closes. The legs go with
/// the router's own client, which reads that answer: the client gets the 413 and the worker stays
/// in rotation (hyper's client took it for a broken connection: 502 and quarantine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_refusing_a_large_body_early_answers_the_client_and_stays_in_rotation() {
    let mut small = role_config(PdRole::Prefill, Flavor::Sglang, 1);
    small.max_body_bytes = 1 << 20;
    let prefill = vec![MockEngine::spawn(small).await.unwrap()];
    // The decode engine takes the whole body: only the prefill refuses it.
    let mut large = role_config(PdRole::Decode, Flavor::Sglang, 1);
    large.max_body_bytes = 16 << 20;
    let decode = vec![MockEngine::spawn(large).await.unwrap()];
    let mut c = pd_config(PdMode::Sglang, &prefill, &decode, PolicyConfig::RoundRobin, PolicyConfig::RoundRobin);
    c.max_body_bytes = 8 << 20;
    c.retry.enabled = false;
    // The simulated decode engine tokenizes the 7 MB prompt on a thread of this test's runtime
    // (seconds in a debug build, more on a loaded machine), which the router's tasks share: the
    // legs' deadline is the test's, not the 5 s the other tests run under.
    c.request_timeout = Duration::from_secs(60);
    let r = start(c).await;
    let big = chat(SYSTEM, &"many words in a long prompt ".repeat(250_000));
    for _ in 0..3 {
        let resp = post_within(&format!("{}/v1/chat/completions", r.url), &big, Duration::from_secs(60)).await;
        assert_eq!(resp.status(), 413, "the prefill engine's own answer");
        assert_eq!(resp.headers()["x-sgl-router-pd-leg"], "prefill");
    }
    let worker = r.gateway.fleet.all().into_iter().find(|w| w.url.as_str() == prefill[0].url()).unwrap();
    assert!(worker.is_routable() && !worker.quarantined(), "a client's oversized body is not the worker's fault");
    let small = post(&format!("{}/v1/chat/completions", r.url), &chat(SYSTEM, "small")).await;
    let status = small.status();
    assert_eq!(status, 200, "{}", small.text().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_decode_aborts_prefill_and_a_retry_takes_a_new_room() {
    let prefill = engines(PdRole::Prefill, Flavor::Sglang, 2, 1).await;
    let decode = engines(PdRole::Decode, Flavor::Sglang, 2, 1).await;
    let r =
        start(pd_config(PdMode::Sglang, &prefill, &decode, PolicyConfig::RoundRobin, PolicyConfig::RoundRobin)).await;
    // One decode worker is overloaded (503, retryable): the attempt is retried on a new pair.
    decode[0].engine().set_faults(Faults { fail_next: 1, fail_status: 503, ..Faults::default() }).await;
    decode[1].engine().set_faults(Faults { fail_next: 1, fail_status: 503, ..Faults::default() }).await;
    let t = Instant::now();
    let resp = post(&format!("{}/v1/chat/completions", r.url), &chat(SYSTEM, "retry me")).await;
    assert_eq!(resp.status(), 200);
    assert!(t.elapsed() < Duration::from_secs(2), "no leg waited for a peer: {:?}", t.elapsed());
    // The prefill legs of the failed attempts that reached a prefill worker were aborted, not
    // left in their rooms (a decode that fails first may stop its prefill leg before it is sent).
    let prefill_legs = || prefill.iter().map(|m| m.engine().legs().len() as u64).sum::<u64>();
    wait_for(|| sum(&prefill, |c| c.cancelled.load(Relaxed)) + 1 == prefill_legs()).await;
    let rooms: Vec<u64> =
        decode.iter().flat_map(|m| m.engine().legs()).filter_map(|l| l.body["bootstrap_room"].as_u64()).collect();
    assert_eq!(rooms.len(), 3, "three attempts: {rooms:?}");
    assert_eq!(rooms.iter().collect::<HashSet<_>>().len(), 3, "each attempt in a new room: {rooms:?}");
    assert_eq!(sum(&prefill, |c| c.rendezvous.load(Relaxed)), 1);
    assert_eq!(sum(&prefill, |c| c.duplicate_room.load(Relaxed)), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rooms_are_aligned_with_the_prefill_rank() {
    let prefill = engines(PdRole::Prefill, Flavor::Sglang, 1, 4).await;
    let decode = engines(PdRole::Decode, Flavor::Sglang, 1, 1).await;
    let r = pd_router(PdMode::Sglang, &prefill, &decode).await;
    let long = SYSTEM.repeat(8);
    for i in 0..6 {
        let body = json!({"text": format!("{long} question {}", i % 2), "sampling_params": {"max_new_tokens": 2}});
        assert_eq!(post(&format!("{}/generate", r.url), &body).await.status(), 200);
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert_eq!(counters(&prefill[0]).dp_mismatch.load(Relaxed), 0);
    for leg in prefill[0].engine().legs() {
        let (room, rank) = (leg.body["bootstrap_room"].as_u64().unwrap(), leg.body["routed_dp_rank"].as_u64().unwrap());
        assert_eq!(room % 4, rank, "room {room} follows the rank it is sent to");
        assert_eq!(leg.body["disagg_prefill_dp_rank"], rank);
    }
    for leg in decode[0].engine().legs() {
        assert!(leg.body.get("routed_dp_rank").is_none(), "decode's own ranks are its business: {}", leg.body);
        assert_eq!(leg.body["disagg_prefill_dp_rank"].as_u64(), Some(leg.body["bootstrap_room"].as_u64().unwrap() % 4));
    }
    // Repeated prompts went back to the rank holding them (the prefill's cache hits).
    assert!(prefill[0].engine().cached_tokens.load(Relaxed) > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_logprobs_are_merged_from_prefill() {
    let prefill = engines(PdRole::Prefill, Flavor::Sglang, 1, 1).await;
    let decode = engines(PdRole::Decode, Flavor::Sglang, 1, 1).await;
    let r = pd_router(PdMode::Sglang, &prefill, &decode).await;
    let text = "Count the prompt tokens";
    let body = json!({"text": text, "return_logprob": true, "sampling_params": {"max_new_tokens": 3}});
    let v: Value = post(&format!("{}/generate", r.url), &body).await.json().await.unwrap();
    assert_eq!(v["meta_info"]["input_token_logprobs"].as_array().map(Vec::len), Some(text.len()), "{v}");
    let mut body = body;
    body["stream"] = json!(true);
    let s = post(&format!("{}/generate", r.url), &body).await.text().await.unwrap();
    let events: Vec<Value> = s
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(events.len(), 3, "{s}");
    for e in &events {
        assert_eq!(e["meta_info"]["input_token_logprobs"].as_array().map(Vec::len), Some(text.len()), "{e}");
    }
    // A batch: one room per item, logprobs merged per item.
    let body =
        json!({"text": ["first prompt", "second"], "return_logprob": true, "sampling_params": {"max_new_tokens": 2}});
    let v: Value = post(&format!("{}/generate", r.url), &body).await.json().await.unwrap();
    let lens: Vec<usize> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["meta_info"]["input_token_logprobs"].as_array().unwrap().len())
        .collect();
    assert_eq!(lens, vec![12, 6]);
    let batch = prefill[0].engine().legs().pop().unwrap().body;
    assert_eq!(batch["bootstrap_room"].as_array().map(Vec::len), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefill_is_chosen_by_events_and_a_cold_burst_lands_on_one_worker() {
    let prefill = engines(PdRole::Prefill, Flavor::Sglang, 2, 1).await;
    let decode = engines(PdRole::Decode, Flavor::Sglang, 2, 1).await;
    let mut c = pd_config(PdMode::Sglang, &prefill, &decode, cache_aware(16), PolicyConfig::power_of_two());
    c.pending_ttl = Duration::from_secs(2);
    let r = start(c).await;
    // A burst of one cold prompt: the pending prefix sends it all to one prefill worker.
    let long = SYSTEM.repeat(10);
    let burst: Vec<_> = (0..4)
        .map(|i| {
            let (url, body) = (format!("{}/v1/chat/completions", r.url), chat(&long, &format!("q{i}")));
            tokio::spawn(async move { post(&url, &body).await.status() })
        })
        .collect();
    for status in burst {
        assert_eq!(status.await.unwrap(), 200);
    }
    let served = requests(&prefill);
    assert!(served.contains(&4), "a cold burst of one prompt on one prefill worker: {served:?}");
    // The prefill workers' events show where the prefix is: the next request goes there too.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let hot = served.iter().position(|n| *n == 4).unwrap();
    for i in 0..3 {
        post(&format!("{}/v1/chat/completions", r.url), &chat(&long, &format!("later {i}"))).await;
    }
    assert_eq!(requests(&prefill)[hot], 7, "{:?}", requests(&prefill));
    // Decode legs were balanced by load: both decode workers served some.
    assert!(requests(&decode).iter().all(|n| *n > 0), "{:?}", requests(&decode));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_is_chosen_by_load_not_by_prefix() {
    let prefill = engines(PdRole::Prefill, Flavor::Sglang, 1, 1).await;
    let mut slow = role_config(PdRole::Decode, Flavor::Sglang, 1);
    slow.fast = false;
    slow.decode_per_token = Duration::from_millis(100);
    let decode = vec![MockEngine::spawn(slow.clone()).await.unwrap(), MockEngine::spawn(slow).await.unwrap()];
    // cache_aware for both legs: a router that matched prefixes on decode would stick to one.
    let r = start(pd_config(PdMode::Sglang, &prefill, &decode, cache_aware(16), cache_aware(16))).await;
    let long = SYSTEM.repeat(10);
    let mut first = chat(&long, "same question");
    first["max_tokens"] = json!(20);
    let url = format!("{}/v1/chat/completions", r.url);
    let held = tokio::spawn({
        let (url, first) = (url.clone(), first.clone());
        async move { post(&url, &first).await.status() }
    });
    // While that one decodes (2 s), the same prompt again: the idle decode worker takes it.
    wait_for(|| requests(&decode).iter().sum::<u64>() == 1).await;
    let busy = requests(&decode).iter().position(|n| *n == 1).unwrap();
    let mut second = first.clone();
    second["max_tokens"] = json!(1);
    assert_eq!(post(&url, &second).await.status(), 200);
    assert_eq!(requests(&decode)[1 - busy], 1, "decode by load: {:?}", requests(&decode));
    assert_eq!(held.await.unwrap(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_report_contradicts_its_role_is_refused() {
    let decode = engines(PdRole::Decode, Flavor::Sglang, 2, 1).await;
    // The first decode engine is given as a prefill worker.
    let r = start(pd_config(
        PdMode::Sglang,
        &decode[..1],
        &decode[1..],
        PolicyConfig::RoundRobin,
        PolicyConfig::RoundRobin,
    ))
    .await;
    let w: Value = admin_get(&format!("{}/workers", r.url)).await.json().await.unwrap();
    let states: Vec<(&str, &str)> = w["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["role"].as_str().unwrap_or(""), w["state"].as_str().unwrap_or("")))
        .collect();
    assert!(states.contains(&("prefill", "refused")), "{w}");
    let resp = post(&format!("{}/v1/chat/completions", r.url), &chat(SYSTEM, "hi")).await;
    assert_eq!(resp.status(), 503, "no prefill worker to pair with");
    let _ = ADMIN_KEY;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_two_stages_with_complete_params_and_never_without() {
    let prefill = engines(PdRole::Prefill, Flavor::Vllm, 1, 1).await;
    let decode = engines(PdRole::Decode, Flavor::Vllm, 1, 1).await;
    let mut c = pd_config(PdMode::Vllm, &prefill, &decode, cache_aware(16), PolicyConfig::power_of_two());
    c.retry.enabled = false;
    let r = start(c).await;
    for (path, body) in [
        ("/v1/chat/completions", chat(SYSTEM, "What is NIXL?")),
        ("/v1/completions", json!({"model": "default", "prompt": "Once upon a time", "max_tokens": 4})),
    ] {
        for stream in [false, true] {
            let mut body = body.clone();
            body["stream"] = json!(stream);
            let resp = post(&format!("{}{path}", r.url), &body).await;
            assert_eq!(resp.status(), 200, "{path}");
            let text = resp.text().await.unwrap();
            if !stream {
                let v: Value = serde_json::from_str(&text).unwrap();
                assert_eq!(v["usage"]["completion_tokens"], 4, "decode's answer: {v}");
            }
        }
    }
    let (p, d) = (counters(&prefill[0]), counters(&decode[0]));
    assert_eq!(d.local_prefill_fallbacks.load(Relaxed), 0, "every decode pulled its KV");
    assert_eq!(p.rendezvous.load(Relaxed), 4);
    assert_eq!(p.bad_prefill_shape.load(Relaxed), 0);
    assert_eq!(d.request_id_mismatch.load(Relaxed), 0, "one X-Request-Id on both legs");
    let ids: Vec<Option<String>> = prefill[0].engine().legs().into_iter().map(|l| l.request_id).collect();
    let decode_ids: Vec<Option<String>> = decode[0].engine().legs().into_iter().map(|l| l.request_id).collect();
    assert_eq!(ids, decode_ids);
    // Prompt logprobs come from prefill.
    let body = json!({"model": "default", "prompt": "Score this prompt", "max_tokens": 2, "prompt_logprobs": 1});
    let v: Value = post(&format!("{}/v1/completions", r.url), &body).await.json().await.unwrap();
    assert_eq!(v["choices"][0]["prompt_logprobs"].as_array().map(Vec::len), Some("Score this prompt".len()), "{v}");
    // A prefill answering without params: decode is never sent a leg it would prefill itself.
    prefill[0].engine().set_faults(Faults { drop_kv_params_next: 1, ..Faults::default() }).await;
    let before = decode[0].engine().requests.load(Relaxed);
    let resp = post(&format!("{}/v1/chat/completions", r.url), &chat(SYSTEM, "broken prefill")).await;
    assert_eq!(resp.status(), 502);
    let e: Value = resp.json().await.unwrap();
    assert!(e["error"]["message"].as_str().unwrap().contains("kv_transfer_params"), "{e}");
    assert_eq!(decode[0].engine().requests.load(Relaxed), before, "no decode leg");
    assert_eq!(d.local_prefill_fallbacks.load(Relaxed), 0);
    // A failing prefill: no decode leg either.
    prefill[0].engine().set_faults(Faults { fail_next: 1, ..Faults::default() }).await;
    assert_eq!(post(&format!("{}/v1/chat/completions", r.url), &chat(SYSTEM, "x")).await.status(), 500);
    assert_eq!(decode[0].engine().requests.load(Relaxed), before);
    // A prefill whose params are too large (1.5 MB: within the 2 MiB read, over the 1 MiB bound)
    // or whose answer is (60 MB: past the read bound): a precise 502, no decode leg, the
    // memory reserved for the read given back.
    for (bloat, said) in [(1_500_000, "kv_transfer_params within 1048576 bytes"), (60_000_000, "length limit")] {
        prefill[0].engine().set_faults(Faults { bloat_kv_params_bytes: bloat, ..Faults::default() }).await;
        let resp = post(&format!("{}/v1/chat/completions", r.url), &chat(SYSTEM, "hostile prefill")).await;
        assert_eq!(resp.status(), 502);
        let e: Value = resp.json().await.unwrap();
        assert!(e["error"]["message"].as_str().unwrap().contains(said), "{e}");
        assert_eq!(decode[0].engine().requests.load(Relaxed), before, "no decode leg");
        assert_eq!(r.gateway.budget.used(), 0, "the read's reservation is released");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_push_mode_sends_both_legs_at_once_once_seen() {
    let mut pc = role_config(PdRole::Prefill, Flavor::Vllm, 1);
    pc.pd.push = true;
    // A prefill that takes 300 ms: two stages put decode 300 ms after prefill, push mode at once.
    pc.fast = false;
    pc.prefill_fixed = Duration::from_millis(300);
    pc.decode_per_token = Duration::ZERO;
    let prefill = vec![MockEngine::spawn(pc).await.unwrap()];
    let decode = engines(PdRole::Decode, Flavor::Vllm, 1, 1).await;
    let r = pd_router(PdMode::Vllm, &prefill, &decode).await;
    for i in 0..2 {
        let resp = post(&format!("{}/v1/chat/completions", r.url), &chat(SYSTEM, &format!("push {i}"))).await;
        assert_eq!(resp.status(), 200);
    }
    let (p, d) = (prefill[0].engine().legs(), decode[0].engine().legs());
    assert_eq!((p.len(), d.len()), (2, 2));
    let gap = |i: usize| d[i].at.saturating_duration_since(p[i].at);
    assert!(gap(0) >= Duration::from_millis(250), "first request two-stage: decode after prefill ({:?})", gap(0));
    assert!(gap(1) < Duration::from_millis(150), "then push mode: both at once ({:?})", gap(1));
    let params = &d[1].body["kv_transfer_params"];
    assert_eq!(params["transfer_mode"], "push");
    assert!(params.get("remote_block_ids").is_none(), "push needs no block ids: {params}");
    assert_eq!(d[1].request_id, p[1].request_id, "matched by one request id");
    assert_eq!(counters(&decode[0]).local_prefill_fallbacks.load(Relaxed), 0, "the KV was pushed");
    assert_eq!(counters(&prefill[0]).rendezvous.load(Relaxed), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_mooncake_links_both_legs_by_a_transfer_id() {
    let mut pc = role_config(PdRole::Prefill, Flavor::Vllm, 1);
    pc.pd.mooncake = true;
    let prefill = vec![MockEngine::spawn(pc.clone()).await.unwrap(), MockEngine::spawn(pc).await.unwrap()];
    let decode = engines(PdRole::Decode, Flavor::Vllm, 1, 1).await;
    let mut c = pd_config(PdMode::Vllm, &prefill, &decode, PolicyConfig::RoundRobin, PolicyConfig::power_of_two());
    c.pd.as_mut().unwrap().connector = gateway::pd::KvConnector::Mooncake;
    let r = start(c).await;
    for i in 0..4 {
        let mut body = chat(SYSTEM, &format!("mooncake {i}"));
        body["stream"] = json!(i % 2 == 1);
        let resp = post(&format!("{}/v1/chat/completions", r.url), &body).await;
        let (status, leg) = (resp.status(), resp.headers().get("x-sgl-router-pd-leg").cloned());
        // Read to the end: a streamed decode pulls its KV inside its stream.
        let text = resp.text().await.unwrap();
        assert_eq!(status, 200, "{leg:?} {text}");
    }
    let d = decode[0].engine().legs();
    assert_eq!(d.len(), 4);
    assert_eq!(counters(&decode[0]).local_prefill_fallbacks.load(Relaxed), 0, "every decode pulled by transfer id");
    assert_eq!(sum(&prefill, |c| c.rendezvous.load(Relaxed)), 4);
    assert_eq!(sum(&prefill, |c| c.bad_prefill_shape.load(Relaxed)), 0, "every prefill got its transfer_id");
    let ids: HashSet<&str> = d.iter().filter_map(|l| l.body["kv_transfer_params"]["transfer_id"].as_str()).collect();
    assert_eq!(ids.len(), 4, "a fresh transfer id per request");
    for l in &d {
        let p = &l.body["kv_transfer_params"];
        let engine = p["remote_engine_id"].as_str().unwrap();
        assert!(prefill.iter().any(|m| m.engine().pd().unwrap().engine_id == engine), "an engine id from /query: {p}");
        assert!(p["remote_bootstrap_addr"].as_str().unwrap().starts_with("http://127.0.0.1:"), "{p}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_disaggregated_is_refused_clearly() {
    let prefill = engines(PdRole::Prefill, Flavor::Sglang, 1, 1).await;
    let decode = engines(PdRole::Decode, Flavor::Sglang, 1, 1).await;
    let r = pd_router(PdMode::Sglang, &prefill, &decode).await;
    let mut body = chat(SYSTEM, "two samples");
    body["n"] = json!(2);
    let resp = post(&format!("{}/v1/chat/completions", r.url), &body).await;
    assert_eq!(resp.status(), 400);
    let e: Value = resp.json().await.unwrap();
    assert!(e["error"]["message"].as_str().unwrap().contains("bootstrap room"), "{e}");
    let resp = post(&format!("{}/v1/embeddings", r.url), &json!({"input": "x"})).await;
    assert_eq!(resp.status(), 400);
    // The explain shows both choices.
    let v: Value = common::app::admin_post(&format!("{}/debug/route", r.url), &chat(SYSTEM, "explain"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["mode"], "sglang");
    assert_eq!(v["prefill"]["worker"].as_str(), Some(prefill[0].url().as_str()), "{v}");
    assert_eq!(v["decode"]["worker"].as_str(), Some(decode[0].url().as_str()), "{v}");
}

async fn wait_for(f: impl Fn() -> bool) {
    for _ in 0..300 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(f(), "condition not met within 3 s");
}
