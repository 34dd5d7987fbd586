//! Overload in every `cargo test` (the figures with a router process are
//! `benches/overload.sh`): ten times the admitted concurrency at once against
//! slow simulated engines. Every admitted request is answered whole, every
//! other one refused with 429/503 well before an admitted one ends, nothing
//! stays reserved afterwards; then the same with clients that hang up after
//! the first chunk, whose requests the engines must see cancelled.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::app::{config, start};
use mock_engine::{MockEngine, MockEngineConfig};
use serde_json::json;
use sgl_router::app::PolicyConfig;

const ADMITTED: usize = 8;
const CLIENTS: usize = 10 * ADMITTED;

/// One client's outcome: status (0: no answer), time to the status, to the end, and whether
/// a 200's stream ended with `[DONE]` and no error event.
struct Outcome {
    status: u16,
    head: Duration,
    total: Duration,
    whole: bool,
}

async fn wave(url: &str, hang_up: bool) -> Vec<Outcome> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let start = Arc::new(tokio::sync::Barrier::new(CLIENTS));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..CLIENTS {
        let (http, url, start) = (http.clone(), format!("{url}/v1/chat/completions"), start.clone());
        tasks.spawn(async move {
            let body = json!({"model": "default", "stream": true,
                "messages": [{"role": "user", "content": format!("client {i}: tell me a story")}]});
            start.wait().await;
            let t = Instant::now();
            let Ok(mut resp) = http.post(url).json(&body).timeout(Duration::from_secs(30)).send().await else {
                return Outcome { status: 0, head: t.elapsed(), total: t.elapsed(), whole: false };
            };
            let (status, head) = (resp.status().as_u16(), t.elapsed());
            let mut text = Vec::new();
            while let Ok(Some(chunk)) = resp.chunk().await {
                text.extend_from_slice(&chunk);
                if hang_up && status == 200 {
                    break; // dropping `resp` closes the connection mid-stream
                }
            }
            drop(resp);
            let text = String::from_utf8_lossy(&text);
            let whole = text.contains("[DONE]") && !text.contains("data: {\"error\"");
            Outcome { status, head, total: t.elapsed(), whole }
        });
    }
    let mut out = Vec::new();
    while let Some(o) = tasks.join_next().await {
        out.push(o.unwrap());
    }
    out
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_times_the_admitted_load_is_refused_fast_and_hung_up_streams_are_cancelled() {
    let mut engines = Vec::new();
    for _ in 0..2 {
        let cfg = MockEngineConfig {
            decode_per_token: Duration::from_millis(10),
            prefill_fixed: Duration::from_millis(2),
            default_max_tokens: 40,
            ..MockEngineConfig::default()
        };
        engines.push(MockEngine::spawn(cfg).await.unwrap());
    }
    let mut c = config(&engines.iter().collect::<Vec<_>>(), PolicyConfig::RoundRobin, false);
    c.max_concurrent = ADMITTED;
    c.queue_size = 0;
    c.request_timeout = Duration::from_secs(30);
    let router = start(c).await;
    let cancelled = || engines.iter().map(|e| e.engine().cancelled_streams.load(Ordering::Relaxed)).sum::<u64>();

    let over = wave(&router.url, false).await;
    let ok: Vec<&Outcome> = over.iter().filter(|o| o.status == 200).collect();
    let refused: Vec<&Outcome> = over.iter().filter(|o| o.status == 429 || o.status == 503).collect();
    assert_eq!(ok.len() + refused.len(), CLIENTS, "every request answered 200, 429 or 503");
    assert!(ok.len() >= ADMITTED, "at least the admitted number served: {}", ok.len());
    assert!(refused.len() >= CLIENTS / 2, "most refused: {}", refused.len());
    assert!(ok.iter().all(|o| o.whole), "every admitted stream whole");
    // An admitted answer streams 40 tokens at 10 ms; a refusal must not wait for one.
    let (ok_p50, refused_p50) =
        (median(ok.iter().map(|o| o.total).collect()), median(refused.iter().map(|o| o.head).collect()));
    assert!(ok_p50 >= Duration::from_millis(400), "{ok_p50:?}");
    assert!(refused_p50 * 4 < ok_p50, "refused in {refused_p50:?}, admitted answered in {ok_p50:?}");

    let before = cancelled();
    let hung = wave(&router.url, true).await;
    let hung_ok = hung.iter().filter(|o| o.status == 200).count() as u64;
    assert!(hung_ok >= ADMITTED as u64);
    assert_eq!(hung.iter().filter(|o| ![200, 429, 503].contains(&o.status)).count(), 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while cancelled() - before < hung_ok {
        assert!(
            Instant::now() < deadline,
            "{} hung-up streams, {} cancelled at the engines",
            hung_ok,
            cancelled() - before
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Nothing left reserved: no request in flight, no body memory held.
    let deadline = Instant::now() + Duration::from_secs(10);
    while router.gateway.in_flight() > 0 || router.gateway.budget.used() > 0 {
        assert!(
            Instant::now() < deadline,
            "in flight {}, memory {}",
            router.gateway.in_flight(),
            router.gateway.budget.used()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // And the router serves at its limit again.
    let after = wave(&router.url, false).await;
    assert!(after.iter().filter(|o| o.status == 200 && o.whole).count() >= ADMITTED);
    let _ = router.stop.send(());
}
