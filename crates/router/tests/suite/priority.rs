//! The priority scheduler end to end on slow simulated engines (issue 30):
//! an interactive tenant keeps its latency while a bulk tenant saturates the
//! router, its class clamped by its tenant's key; a queued bulk request is
//! preempted by an interactive one, answered 503 with `x-smg-preempted` and
//! `Retry-After` before anything of it was sent.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::app::{chat, config, engine_config, start};
use common::eventually as until;
use gateway::pipeline::scheduler::{Class, ClassConfig, SchedulerConfig, Tenants};
use mock_engine::{Faults, MockEngine, MockEngineConfig};
use sgl_router::app::PolicyConfig;

/// Every class queued without reservations, timeouts long, no preemption; `tweak` changes it.
fn scheduler(tweak: impl FnOnce(&mut [ClassConfig; 4])) -> SchedulerConfig {
    let mut classes = Class::ALL.map(|_| ClassConfig {
        reserved_floor: 0,
        reserved_per_slot: 0.0,
        queue_size: 64,
        queue_timeout_secs: 60,
        starvation_threshold_secs: 60,
        can_preempt: false,
    });
    tweak(&mut classes);
    let mut c = SchedulerConfig { classes, ..SchedulerConfig::default() };
    c.tenant_max_class.insert("ops".into(), Class::Interactive);
    c
}

/// Tenants by key: `ops` (interactive at most) and `batch` (the default's ceiling).
fn tenants() -> Tenants {
    let mut t = Tenants::default();
    t.by_key.insert(b"Bearer ops-key".to_vec(), "ops".into());
    t.by_key.insert(b"Bearer batch-key".to_vec(), "batch".into());
    t
}

async fn send(http: &reqwest::Client, url: &str, key: &str, class: &str, user: &str) -> reqwest::Response {
    http.post(url)
        .bearer_auth(key)
        .header("x-smg-priority", class)
        .json(&chat("s", user))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap()
}

/// The largest of `n` sequential interactive requests' latencies (their p99 for n ≤ 100).
async fn interactive_p99(http: &reqwest::Client, url: &str, n: usize) -> Duration {
    let mut worst = Duration::ZERO;
    for i in 0..n {
        let t = Instant::now();
        let resp = send(http, url, "ops-key", "interactive", &format!("i{i}")).await;
        assert_eq!(resp.status(), 200);
        worst = worst.max(t.elapsed());
    }
    worst
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interactive_tenant_keeps_its_latency_while_a_bulk_tenant_saturates_the_router() {
    // 8 tokens of 50 ms each, no prefill to speak of: a request takes about 400 ms (a scheduling
    // hiccup on a loaded machine is small beside it), and the engine runs any number at once; the
    // router's 4 slots are the bottleneck.
    let slow = MockEngineConfig {
        fast: false,
        default_max_tokens: 8,
        decode_per_token: Duration::from_millis(50),
        prefill_fixed: Duration::ZERO,
        prefill_tokens_per_s: 1e9,
        ..engine_config()
    };
    let w = MockEngine::spawn(slow).await.unwrap();
    let mut c = config(&[&w], PolicyConfig::RoundRobin, false);
    c.max_concurrent = 4;
    c.client_keys = vec!["ops-key".into(), "batch-key".into()];
    c.scheduler = Some(scheduler(|classes| classes[Class::Interactive as usize].reserved_floor = 1));
    c.tenants = tenants();
    let r = start(c).await;
    let url = format!("{}/v1/chat/completions", r.url);
    let http = reqwest::Client::new();
    let alone = interactive_p99(&http, &url, 10).await;
    // The bulk tenant floods: 12 clients back to back (its header asks for interactive: clamped).
    let stop = Arc::new(AtomicBool::new(false));
    let bulk_served = Arc::new(AtomicU64::new(0));
    let flood: Vec<_> = (0..12)
        .map(|i| {
            let (http, url, stop, served) = (http.clone(), url.clone(), stop.clone(), bulk_served.clone());
            tokio::spawn(async move {
                let class = if i == 0 { "interactive" } else { "bulk" };
                while !stop.load(Ordering::Relaxed) {
                    if send(&http, &url, "batch-key", class, "b").await.status() == 200 {
                        served.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let sched = r.gateway.scheduler.clone().expect("the scheduler is on");
    until("the bulk tenant saturates the router and queues", async || {
        let (in_flight, waiting) = sched.occupancy();
        in_flight[Class::Bulk as usize] + in_flight[Class::Default as usize] == 3 && waiting[Class::Bulk as usize] > 0
    })
    .await;
    let loaded = interactive_p99(&http, &url, 10).await;
    let (in_flight, waiting) = sched.occupancy();
    stop.store(true, Ordering::Relaxed);
    for f in flood {
        f.await.unwrap();
    }
    eprintln!(
        "interactive p99 alone {alone:?}, with the bulk tenant saturating {loaded:?} ({:.2}x); bulk served {}, in flight {in_flight:?}, waiting {waiting:?}",
        loaded.as_secs_f64() / alone.as_secs_f64(),
        bulk_served.load(Ordering::Relaxed)
    );
    assert!(waiting[Class::Bulk as usize] > 0, "the bulk class was queued meanwhile");
    // The ops tenant's 20 requests, none of the bulk tenant's: its interactive header was clamped.
    // (Counted at admission: a snapshot of the classes in flight could still hold the ops
    // tenant's last request, its slot freed just after its answer reached the client.)
    let admitted = common::app::metric(&r.url, "router_scheduler_admitted_total{class=\"interactive\"}").await;
    assert_eq!(admitted, 20.0, "the bulk tenant's interactive header was clamped");
    assert!(loaded.as_secs_f64() <= 1.2 * alone.as_secs_f64(), "interactive p99 {loaded:?} against {alone:?} alone");
    assert!(bulk_served.load(Ordering::Relaxed) > 0);
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_bulk_request_is_preempted_by_an_interactive_one_before_anything_is_sent() {
    let w = MockEngine::spawn(engine_config()).await.unwrap();
    let mut c = config(&[&w], PolicyConfig::RoundRobin, false);
    c.max_concurrent = 1;
    c.client_keys = vec!["ops-key".into(), "batch-key".into()];
    c.scheduler = Some(scheduler(|classes| {
        let interactive = &mut classes[Class::Interactive as usize];
        (interactive.queue_size, interactive.can_preempt) = (0, true);
    }));
    c.tenants = tenants();
    let r = start(c).await;
    let url = format!("{}/v1/chat/completions", r.url);
    let http = reqwest::Client::new();
    // The one slot is held by a request the engine holds; a bulk request queues behind it.
    w.engine().set_faults(Faults { hold_next: 1, ..Faults::default() }).await;
    let holder = tokio::spawn({
        let (http, url) = (http.clone(), url.clone());
        async move { send(&http, &url, "batch-key", "bulk", "held").await.status() }
    });
    until("the engine holds it", async || w.engine().held.load(Ordering::SeqCst) == 1).await;
    let queued = tokio::spawn({
        let (http, url) = (http.clone(), url.clone());
        async move { send(&http, &url, "batch-key", "bulk", "queued").await }
    });
    let sched = r.gateway.scheduler.clone().unwrap();
    until("the bulk request queues", async || sched.occupancy().1[Class::Bulk as usize] == 1).await;
    // The interactive class's queue holds no one: it takes the bulk request's place.
    let interactive = tokio::spawn({
        let (http, url) = (http.clone(), url.clone());
        async move { send(&http, &url, "ops-key", "interactive", "urgent").await.status() }
    });
    let preempted = queued.await.unwrap();
    assert_eq!(preempted.status(), 503);
    assert_eq!(preempted.headers()["x-smg-preempted"], "bulk");
    assert_eq!(preempted.headers()["retry-after"], "1");
    let body: serde_json::Value = preempted.json().await.unwrap();
    assert_eq!(body["error"]["type"], "preempted", "{body}");
    let counted = common::app::metric(&r.url, "router_scheduler_preempted_total{class=\"bulk\"}").await;
    assert_eq!(counted, 1.0);
    let before = w.engine().requests.load(Ordering::SeqCst);
    w.engine().release_held(1);
    assert_eq!(holder.await.unwrap(), 200);
    assert_eq!(interactive.await.unwrap(), 200, "the interactive request got the freed slot");
    // The engine counts a request once admitted: the held one and the interactive one.
    assert_eq!(w.engine().requests.load(Ordering::SeqCst), before + 2, "the preempted one was never sent");
    let _ = r.stop.send(());
}

/// SMG's `--tenant-rate-limit-*`: each tenant's requests and prompt tokens per minute hold while
/// two tenants send at once, and neither is charged for the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tenants_rate_limits_hold_while_two_tenants_send_at_once() {
    use gateway::pipeline::tenant_limits::{Limits, TenantLimitsConfig};
    let w = MockEngine::spawn(engine_config()).await.unwrap();
    let mut c = config(&[&w], PolicyConfig::RoundRobin, false);
    c.client_keys = vec!["ops-key".into(), "batch-key".into(), "thin-key".into()];
    let mut t = tenants();
    t.by_key.insert(b"Bearer thin-key".to_vec(), "thin".into());
    c.tenants = t;
    let mut limits = std::collections::HashMap::new();
    limits.insert("auth:batch".to_string(), Limits { requests_per_minute: 5, tokens_per_minute: 1_000_000 });
    limits.insert("auth:thin".to_string(), Limits { requests_per_minute: 1000, tokens_per_minute: 100 });
    let default = Limits { requests_per_minute: 1000, tokens_per_minute: 1_000_000 };
    c.tenant_limits = Some(TenantLimitsConfig { default, tenants: limits });
    let r = start(c).await;
    let url = format!("{}/v1/chat/completions", r.url);
    let http = reqwest::Client::new();
    let burst = |key: &'static str| {
        let (http, url) = (http.clone(), url.clone());
        tokio::spawn(async move {
            let mut statuses = Vec::new();
            for i in 0..10 {
                let resp = send(&http, &url, key, "default", &format!("{key} {i}")).await;
                if resp.status() == 429 {
                    assert!(resp.headers()["retry-after"].to_str().unwrap().parse::<u32>().unwrap() >= 1);
                    let body: serde_json::Value = resp.json().await.unwrap();
                    assert_eq!(body["error"]["type"], "tenant_rate_limit_exceeded", "{body}");
                    statuses.push(429);
                } else {
                    statuses.push(resp.status().as_u16());
                }
            }
            statuses
        })
    };
    let (batch, ops) = (burst("batch-key"), burst("ops-key"));
    let (batch, ops) = (batch.await.unwrap(), ops.await.unwrap());
    assert_eq!(batch.iter().filter(|s| **s == 200).count(), 5, "{batch:?}");
    assert_eq!(batch.iter().filter(|s| **s == 429).count(), 5, "{batch:?}");
    assert!(ops.iter().all(|s| *s == 200), "the other tenant is not charged: {ops:?}");
    // Tokens: a body of about 1 KB is a minute's worth of the thin tenant's 100 tokens.
    let long = "x".repeat(1024);
    assert_eq!(send(&http, &url, "thin-key", "default", &long).await.status(), 200);
    assert_eq!(send(&http, &url, "thin-key", "default", "short").await.status(), 429);
    assert_eq!(common::app::metric(&r.url, "router_tenant_rate_limited_total").await, 6.0);
    let _ = r.stop.send(());
}
