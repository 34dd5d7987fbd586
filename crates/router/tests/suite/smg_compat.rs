//! An SGLang Model Gateway command line, run unchanged by the real binary
//! against simulated engines: space-separated `--worker-urls`,
//! `--policy cache_aware` without `--kv-events` (one engine publishes no
//! events and is routed by the text tree), SMG's retry, circuit-breaker,
//! health, queue, request-id and metrics flags, and one engine that answers
//! 503 to every request. Every client request succeeds and that engine's
//! breaker opens.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use mock_engine::{Faults, MockEngine, MockEngineConfig};
use serde_json::json;

/// Kills the router when the test ends, however it ends.
pub(crate) struct Router(Child);

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn engine(kv_events: bool) -> MockEngine {
    let config = MockEngineConfig { kv_events, fast: true, ..MockEngineConfig::default() };
    MockEngine::spawn(config).await.unwrap()
}

/// The value of the series `name{labels}` in a Prometheus text page.
pub(crate) fn series(page: &str, name_and_labels: &str) -> Option<f64> {
    page.lines().find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
}

/// The real binary with `args`: the router, its URL and its metrics URL (read from its
/// first three lines of output; `args` must have a `--prometheus-port`).
pub(crate) fn launch(args: &[&str]) -> (Router, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sgl-router"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines: Vec<String> = {
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut lines = Vec::new();
        // The listening line, then the metrics line.
        for _ in 0..3 {
            lines.push(out.next().unwrap().unwrap());
        }
        // The rest is read too: a router writing to a closed pipe would fail.
        std::thread::spawn(move || out.for_each(drop));
        lines
    };
    let router = Router(child);
    let url = lines[0].strip_prefix("sgl-router listening on ").expect("the listening line").to_string();
    let metrics_url = lines
        .iter()
        .find_map(|l| l.trim().strip_prefix("metrics on "))
        .unwrap_or_else(|| panic!("a metrics line in {lines:?}"))
        .to_string();
    (router, url, metrics_url)
}

/// The real binary as cache_aware over two engines with KV events, with `tuning` flags: short
/// prompts are hits, no warm-up slice takes a hit elsewhere, the control plane's key is `k`.
/// Returned once both engines are healthy.
async fn cache_aware_cli(engines: [&str; 2], tuning: &[&str]) -> (Router, String, String) {
    let mut flags = vec!["--policy", "cache_aware", "--kv-events"];
    flags.extend_from_slice(tuning);
    flags.extend_from_slice(&["--cache-affinity-min-matched-tokens", "16"]);
    over_two(engines, &flags).await
}

/// The real binary over two engines with `flags`, no warm-up slice, the control plane's key
/// `k`, logging warnings: the router, its URL and its metrics URL, once both engines are healthy.
pub(crate) async fn over_two(engines: [&str; 2], flags: &[&str]) -> (Router, String, String) {
    let mut args = vec!["--worker-urls", engines[0], engines[1]];
    args.extend_from_slice(flags);
    #[rustfmt::skip]
    args.extend_from_slice(&[
        "--worker-warmup-share", "0", "--worker-warmup-divert-every", "0",
        "--control-plane-api-keys", "k", "--log-level", "warn",
        "--prometheus-port", "0", "--prometheus-host", "127.0.0.1", "--host", "127.0.0.1", "--port", "0",
    ]);
    let (router, url, metrics_url) = launch(&args);
    let http = reqwest::Client::new();
    crate::common::eventually("both engines healthy", async || {
        let page = http.get(&metrics_url).send().await.unwrap().text().await.unwrap();
        series(&page, "router_workers{state=\"healthy\"}") == Some(2.0)
    })
    .await;
    (router, url, metrics_url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_smg_command_line_runs_unchanged_and_routes_around_a_failing_engine() {
    let (followed, silent, failing) = (engine(true).await, engine(false).await, engine(true).await);
    failing.engine().set_faults(Faults { fail_next: usize::MAX, fail_status: 503, ..Faults::default() }).await;
    let (u0, u1, u2) = (followed.url(), silent.url(), failing.url());
    #[rustfmt::skip]
    let args = [
        "--worker-urls", &u0, &u1, &u2,
        "--policy", "cache_aware", "--kv-index", "chain", "--cache-index", "tree",
        "--cache-threshold", "0.3", "--balance-abs-threshold", "64", "--balance-rel-threshold", "1.5",
        "--eviction-interval-secs", "60", "--max-tree-size", "67108864",
        "--max-payload-size", "1048576",
        "--tokenizer-cache-enable-l0", "--tokenizer-cache-l0-max-entries", "10000",
        "--tokenizer-cache-enable-l1", "--tokenizer-cache-l1-max-memory", "52428800",
        "--retry-max-retries", "5", "--retry-initial-backoff-ms", "10", "--retry-max-backoff-ms", "200",
        "--retry-backoff-multiplier", "1.5", "--retry-jitter-factor", "0.2",
        "--cb-failure-threshold", "3", "--cb-success-threshold", "2",
        "--cb-timeout-duration-secs", "600", "--cb-window-duration-secs", "120",
        "--health-failure-threshold", "3", "--health-success-threshold", "2",
        "--health-check-timeout-secs", "5", "--health-check-interval-secs", "60", "--health-check-endpoint", "/health",
        "--max-concurrent-requests", "-1", "--queue-size", "100", "--queue-timeout-secs", "60",
        "--request-id-headers", "x-request-id", "x-trace-id",
        "--log-level", "warn",
        "--prometheus-port", "0", "--prometheus-host", "127.0.0.1",
        "--prometheus-duration-buckets", "0.005", "0.05", "0.5", "5",
        "--host", "127.0.0.1", "--port", "0",
    ];
    let (router, url, metrics_url) = launch(&args);
    let http = reqwest::Client::new();
    // Every worker found and probed.
    for _ in 0..500 {
        let page = http.get(&metrics_url).send().await.unwrap().text().await.unwrap();
        if series(&page, "router_workers{state=\"healthy\"}") == Some(3.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Short chats, each its own: every one succeeds, those sent to the failing engine retried
    // elsewhere, until its breaker opens (the policy picks it about one time in three).
    // Long and different from their first character: no text-tree match past the template's few bytes.
    for i in 0..60u64 {
        let words: Vec<String> =
            (0..40u64).map(|k| format!("{:x}", (i * 7919 + 13) * (k + 104_729) % 1_000_003)).collect();
        let body =
            json!({"model": "default", "max_tokens": 2, "messages": [{"role": "user", "content": words.join(" ")}]});
        let r = http.post(format!("{url}/v1/chat/completions")).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200, "chat {i}");
        let id = r.headers()["x-request-id"].to_str().unwrap().to_string();
        assert!(id.starts_with("chatcmpl-"), "an id made for a request without one: {id}");
    }
    let page = http.get(&metrics_url).send().await.unwrap().text().await.unwrap();
    let circuit = |u: &str| series(&page, &format!("router_worker_circuit_state{{worker=\"{u}\"}}"));
    assert_eq!(circuit(&u2), Some(1.0), "the failing engine's breaker is open:\n{page}");
    assert_eq!((circuit(&u0), circuit(&u1)), (Some(0.0), Some(0.0)));
    assert_eq!(series(&page, &format!("router_worker_circuit_opened_total{{worker=\"{u2}\"}}")), Some(1.0));
    assert!(series(&page, "router_http_retries_total") >= Some(3.0), "the 503s were retried:\n{page}");
    assert!(
        page.contains("router_http_request_duration_seconds_bucket{le=\"0.05\"}"),
        "the buckets asked for:\n{page}"
    );
    assert!(!page.contains("router_http_request_duration_seconds_bucket{le=\"0.0005\"}"), "and no others");
    let decided_before = |r: &str| {
        series(&page, &format!("router_policy_decisions_total{{policy=\"cache_aware\",reason=\"{r}\"}}")).unwrap_or(0.0)
    };
    let (tree_before, exact_before) =
        (decided_before("text_tree_hit"), decided_before("cache_hit") + decided_before("cache_hit_less_loaded"));

    // Conversations with a long shared system prompt (over 1,024 tokens: an exact cache hit
    // needs that many), each asked three times.
    let conversations = 8;
    let mut firsts_on_silent = 0.0;
    for c in 0..conversations {
        let system = format!("conversation {c}: {}", "you are a careful assistant who answers briefly. ".repeat(40));
        for turn in 0..3 {
            let before = silent.engine().requests.load(std::sync::atomic::Ordering::Relaxed);
            let body = json!({"model": "default", "max_tokens": 4, "messages": [
                {"role": "system", "content": system}, {"role": "user", "content": format!("question {turn}")}]});
            let r = http.post(format!("{url}/v1/chat/completions")).header("x-trace-id", format!("c{c}t{turn}"));
            let r = r.json(&body).send().await.unwrap();
            assert_eq!(r.status(), 200, "conversation {c} turn {turn}");
            assert_eq!(r.headers()["x-request-id"], format!("c{c}t{turn}").as_str());
            let landed_on_silent = silent.engine().requests.load(std::sync::atomic::Ordering::Relaxed) > before;
            if turn == 0 && landed_on_silent {
                firsts_on_silent += 1.0;
            }
            // Give the followed engine's events time to reach the index before the next turn.
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    }

    let page = http.get(&metrics_url).send().await.unwrap().text().await.unwrap();
    assert_eq!(series(&page, &format!("router_worker_circuit_state{{worker=\"{u2}\"}}")), Some(1.0), "still open");
    // Every follow-up stayed where its conversation began: on the engine without events by the
    // text tree, on the followed one by its exact KV events.
    let reason = |r: &str| {
        series(&page, &format!("router_policy_decisions_total{{policy=\"cache_aware\",reason=\"{r}\"}}")).unwrap_or(0.0)
    };
    let tree = reason("text_tree_hit") - tree_before;
    let exact = reason("cache_hit") + reason("cache_hit_less_loaded") - exact_before;
    assert_eq!(tree, 2.0 * firsts_on_silent, "{page}");
    assert_eq!(exact, 2.0 * (conversations as f64 - firsts_on_silent), "{page}");
    // A body over --max-payload-size is refused.
    let big = json!({"messages": [{"role": "user", "content": "x".repeat(1 << 20)}]});
    let r = http.post(format!("{url}/v1/chat/completions")).json(&big).send().await.unwrap();
    assert_eq!(r.status(), 413);
    drop(router);
}

/// SMG's `--selection-temperature`: once both engines hold a prompt, each request for it draws
/// its worker from the softmax of their scores instead of taking the best (`cache_hit_sampled`),
/// and the draws reach both. `--overlap-decay` is taken too (its ranking: the policy's unit tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selection_temperature_draws_among_the_engines_holding_the_prompt() {
    use std::sync::atomic::Ordering::Relaxed;
    let (e0, e1) = (engine(true).await, engine(true).await);
    let (u0, u1) = (e0.url(), e1.url());
    let tuning = ["--selection-temperature", "1000", "--overlap-decay", "0.5"];
    let (_router, url, metrics_url) = cache_aware_cli([&u0, &u1], &tuning).await;
    let http = reqwest::Client::new();
    let q = json!({"model": "default", "max_tokens": 2, "messages": [
        {"role": "system", "content": "a system prompt both engines will hold. ".repeat(20)},
        {"role": "user", "content": "and one question"}]});
    let explain = async |key: Option<&str>| -> serde_json::Value {
        let mut req = http.post(format!("{url}/debug/route")).bearer_auth("k").json(&q);
        if let Some(k) = key {
            req = req.header("x-smg-routing-key", k);
        }
        req.send().await.unwrap().json().await.unwrap()
    };
    // The prompt sent to each engine by a routing key that names it.
    let mut sent = Vec::new();
    for i in 0..64 {
        let key = format!("key{i}");
        let worker = explain(Some(&key)).await["worker"].clone();
        if sent.contains(&worker) {
            continue;
        }
        let r = http.post(format!("{url}/v1/chat/completions")).header("x-smg-routing-key", &key).json(&q);
        assert_eq!(r.send().await.unwrap().status(), 200);
        sent.push(worker);
        if sent.len() == 2 {
            break;
        }
    }
    assert_eq!(sent.len(), 2, "routing keys that name each engine");
    // Once both engines' events say they hold it, the hit is drawn.
    crate::common::eventually("a drawn hit", async || explain(None).await["reason"] == "cache_hit_sampled").await;
    let before = (e0.engine().requests.load(Relaxed), e1.engine().requests.load(Relaxed));
    for _ in 0..40 {
        assert_eq!(http.post(format!("{url}/v1/chat/completions")).json(&q).send().await.unwrap().status(), 200);
    }
    let page = http.get(&metrics_url).send().await.unwrap().text().await.unwrap();
    let drawn = series(&page, "router_policy_decisions_total{policy=\"cache_aware\",reason=\"cache_hit_sampled\"}");
    assert_eq!(drawn, Some(40.0), "{page}");
    // The runtimes are watched (SMG's smg_tokio_* gauges): the main one and each serving thread's.
    assert!(series(&page, "router_runtime_workers{runtime=\"main\"}") >= Some(1.0), "{page}");
    assert_eq!(series(&page, "router_runtime_workers{runtime=\"serve-0\"}"), Some(1.0), "{page}");
    assert!(series(&page, "router_event_loop_wakes_total{runtime=\"serve-0\"}").is_some(), "{page}");
    assert!(series(&page, "router_runtime_worker_busy_ratio{runtime=\"main\",worker=\"0\"}").is_some(), "{page}");
    let got = (e0.engine().requests.load(Relaxed) - before.0, e1.engine().requests.load(Relaxed) - before.1);
    // At this temperature each draw is nearly a coin toss: both engines get some of the 40.
    assert!(got.0 > 0 && got.1 > 0 && got.0 + got.1 == 40, "{got:?}");
}

/// SMG's `--balance-token-usage-threshold` and `--overload-token-usage-threshold`, from the
/// engines' reported KV-cache usage (`/v1/loads`): a spread over the threshold sends the
/// prompt's hit to the shortest queue instead (`imbalanced`); the hottest engine over the
/// ceiling is left out, its hit with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engines_kv_usage_spread_and_ceiling_move_a_hit() {
    use std::sync::atomic::Ordering::Relaxed;
    let (e0, e1) = (engine(true).await, engine(true).await);
    let (u0, u1) = (e0.url(), e1.url());
    // Under the worker overload veto's 0.8 (on by default), which would leave a worker out.
    let tuning = ["--balance-token-usage-threshold", "0.5", "--overload-token-usage-threshold", "0.65"];
    let (_router, url, metrics_url) = cache_aware_cli([&u0, &u1], &tuning).await;
    let http = reqwest::Client::new();
    let q = json!({"model": "default", "max_tokens": 2, "messages": [
        {"role": "system", "content": "a system prompt one engine will hold. ".repeat(20)},
        {"role": "user", "content": "and one question"}]});
    let explain = async || -> serde_json::Value {
        let req = http.post(format!("{url}/debug/route")).bearer_auth("k").json(&q);
        req.send().await.unwrap().json().await.unwrap()
    };
    let page = async || http.get(&metrics_url).send().await.unwrap().text().await.unwrap();
    assert_eq!(http.post(format!("{url}/v1/chat/completions")).json(&q).send().await.unwrap().status(), 200);
    let (holder, other) = if e0.engine().requests.load(Relaxed) == 1 { (&e0, &e1) } else { (&e1, &e0) };
    crate::common::eventually("a hit on the engine holding the prompt", async || {
        let e = explain().await;
        e["reason"] == "cache_hit" && e["worker"] == holder.url().as_str()
    })
    .await;
    // Each engine reports its usage (e0's, e1's); the router reads it at its next poll.
    let report = async |first: f64, second: f64| {
        e0.engine().set_faults(Faults { report_token_usage: Some(first), ..Faults::default() }).await;
        e1.engine().set_faults(Faults { report_token_usage: Some(second), ..Faults::default() }).await;
        crate::common::eventually("the usage reported", async || {
            let p = page().await;
            let usage =
                |e: &MockEngine| series(&p, &format!("router_worker_reported_token_usage{{worker=\"{}\"}}", e.url()));
            usage(&e0) == Some(first) && usage(&e1) == Some(second)
        })
        .await;
    };
    // A spread of 0.6 (the holder the hotter): the shortest queue, not the hit.
    let holder_first = std::ptr::eq(holder, &e0);
    if holder_first {
        report(0.7, 0.1).await
    } else {
        report(0.1, 0.7).await
    }
    let e = explain().await;
    assert_eq!((&e["reason"], &e["worker"]), (&json!("imbalanced"), &json!(other.url())), "{e}");
    let before = other.engine().requests.load(Relaxed);
    assert_eq!(http.post(format!("{url}/v1/chat/completions")).json(&q).send().await.unwrap().status(), 200);
    assert_eq!(other.engine().requests.load(Relaxed), before + 1);
    // Both hold the prompt now; equal hits go to the lower id, e0, when neither is over the
    // ceiling...
    report(0.5, 0.3).await;
    crate::common::eventually("both engines' events say they hold the prompt", async || {
        let e = explain().await;
        e["reason"] == "cache_hit" && e["worker"] == e0.url().as_str()
    })
    .await;
    // ...and e1 when e0 is over it (the spread, 0.4, within the threshold).
    report(0.7, 0.3).await;
    let e = explain().await;
    assert_eq!((&e["reason"], &e["worker"]), (&json!("cache_hit"), &json!(e1.url())), "{e}");
}

/// SMG's least_load through the real command line: the engines' reported queues set the
/// expected wait (not this router's own count), and `--least-load-max-waiting-requests`
/// leaves out full queues; with every queue full a request waits (SMG's admission queue) for
/// a report with room, or answers 503 at its `--queue-timeout-secs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_load_waits_least_by_the_engines_reported_queues() {
    let (e0, e1) = (engine(false).await, engine(false).await);
    let (u0, u1) = (e0.url(), e1.url());
    #[rustfmt::skip]
    let args = [
        "--worker-urls", &u0, &u1, "--policy", "least_load",
        "--least-load-kv-pressure-weight", "0.2", "--least-load-default-throughput", "1000",
        "--least-load-mean-prefill-tokens", "512", "--least-load-max-waiting-requests", "3",
        "--queue-timeout-secs", "3", "--control-plane-api-keys", "k", "--log-level", "warn",
        "--prometheus-port", "0", "--prometheus-host", "127.0.0.1", "--host", "127.0.0.1", "--port", "0",
    ];
    let (_router, url, metrics_url) = launch(&args);
    let http = reqwest::Client::new();
    let q = json!({"model": "default", "max_tokens": 2, "messages": [{"role": "user", "content": "hello"}]});
    let explain = async || -> serde_json::Value {
        let req = http.post(format!("{url}/debug/route")).bearer_auth("k").json(&q);
        req.send().await.unwrap().json().await.unwrap()
    };
    // Each engine reports this many waiting requests (no token count: each counts at the mean
    // prompt); the router reads them at its next poll.
    let report = async |first: u64, second: u64| {
        e0.engine().set_faults(Faults { report_waiting_extra: first, ..Faults::default() }).await;
        e1.engine().set_faults(Faults { report_waiting_extra: second, ..Faults::default() }).await;
        crate::common::eventually("the queues reported", async || {
            let p = http.get(&metrics_url).send().await.unwrap().text().await.unwrap();
            let waiting = |e: &MockEngine| {
                series(&p, &format!("router_worker_reported_waiting_requests{{worker=\"{}\"}}", e.url()))
            };
            waiting(&e0) == Some(first as f64) && waiting(&e1) == Some(second as f64)
        })
        .await;
    };
    for (first, second, expected) in [(2, 0, &e1), (0, 2, &e0), (1, 2, &e0), (2, 1, &e1)] {
        report(first, second).await;
        let e = explain().await;
        assert_eq!(
            (&e["reason"], &e["worker"]),
            (&json!("least_load"), &json!(expected.url())),
            "{first} {second}: {e}"
        );
    }
    // A queue at the cap is left out however short the other's wait would be...
    report(3, 0).await;
    assert_eq!(explain().await["worker"], json!(e1.url()));
    // ...and with every queue at it, no worker takes the request: it waits its queue timeout.
    report(3, 5).await;
    let sent = (e0.engine().requests.load(Relaxed), e1.engine().requests.load(Relaxed));
    let asked = std::time::Instant::now();
    let r = http.post(format!("{url}/v1/chat/completions")).json(&q).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(asked.elapsed() >= std::time::Duration::from_secs(3), "{:?}", asked.elapsed());
    assert!(r.text().await.unwrap().contains("worker_waiting_queue_cap"));
    let page = http.get(&metrics_url).send().await.unwrap().text().await.unwrap();
    assert_eq!(series(&page, "router_http_queue_rejected_total{cause=\"waiting_cap\"}"), Some(1.0));
    assert_eq!((e0.engine().requests.load(Relaxed), e1.engine().requests.load(Relaxed)), sent, "none sent");
    // A request waiting when a queue gets room is sent then.
    let waiting = tokio::spawn(http.post(format!("{url}/v1/chat/completions")).json(&q).send());
    crate::common::eventually("the request waiting", async || {
        let page = http.get(&metrics_url).send().await.unwrap().text().await.unwrap();
        series(&page, "router_http_waiting_cap_waiting") == Some(1.0)
    })
    .await;
    report(0, 5).await;
    let r = waiting.await.unwrap().unwrap();
    assert_eq!(r.status(), 200, "sent once a queue had room");
    assert_eq!(e0.engine().requests.load(Relaxed), sent.0 + 1, "to the queue with room");
    report(0, 0).await;
    let r = http.post(format!("{url}/v1/chat/completions")).json(&q).send().await.unwrap();
    assert_eq!(r.status(), 200);
    // Equal queues: the engine that reports generating faster drains its queue sooner.
    for (first, second, expected) in [(4000.0, 500.0, &e0), (500.0, 4000.0, &e1)] {
        for (e, tps) in [(&e0, first), (&e1, second)] {
            let f = Faults { report_waiting_extra: 2, report_gen_throughput: tps, ..Faults::default() };
            e.engine().set_faults(f).await;
        }
        crate::common::eventually("the throughput reported", async || {
            let p = http.get(&metrics_url).send().await.unwrap().text().await.unwrap();
            let tps = |e: &MockEngine| {
                series(&p, &format!("router_worker_reported_gen_throughput{{worker=\"{}\"}}", e.url()))
            };
            tps(&e0) == Some(first) && tps(&e1) == Some(second)
        })
        .await;
        let e = explain().await;
        assert_eq!(e["worker"], json!(expected.url()), "{first} {second}: {e}");
    }
}

#[test]
fn the_load_models_options_are_checked_and_owned() {
    for (args, wanted) in [
        (&["--policy", "least_load", "--least-load-default-throughput", "0"][..], "default throughput"),
        (&["--policy", "least_load", "--least-load-kv-pressure-weight=-1"][..], "KV pressure weight"),
        (&["--policy", "power_of_two", "--least-load-mean-prefill-tokens", "0"][..], "mean prefill tokens"),
        (&["--policy", "round_robin", "--least-load-kv-pressure-weight", "0.3"][..], "expected wait of least_load"),
        (&["--policy", "power_of_two", "--least-load-max-waiting-requests", "4"][..], "the least_load policy"),
        (&["--policy", "least_load", "--power-of-two-load-metric", "requests"][..], "the power_of_two policy"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_sgl-router"))
            .args(["--worker-urls", "http://127.0.0.1:9"])
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(wanted), "{args:?}: {stderr}");
    }
}

/// Between two load reports least_load counts what it sent each worker since the last one,
/// so a burst spreads instead of all going to the worker that reported least. Reports come
/// every 2 s: a burst of six crosses at most one, and either side of it a run of three
/// requests sends one to e0 (e1 is ahead by one mean prompt: the first goes to e1, the second
/// ties, the third goes to e0 if the second did not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_load_counts_what_it_sent_since_the_last_report() {
    use std::sync::atomic::Ordering::Relaxed;
    let (e0, e1) = (engine(false).await, engine(false).await);
    e0.engine().set_faults(Faults { report_waiting_extra: 1, ..Faults::default() }).await;
    let (u0, u1) = (e0.url(), e1.url());
    #[rustfmt::skip]
    let args = [
        "--worker-urls", &u0, &u1, "--policy", "least_load", "--worker-load-poll-ms", "2000",
        "--log-level", "warn",
        "--prometheus-port", "0", "--prometheus-host", "127.0.0.1", "--host", "127.0.0.1", "--port", "0",
    ];
    let (_router, url, metrics_url) = launch(&args);
    let http = reqwest::Client::new();
    crate::common::eventually("the first reports", async || {
        let p = http.get(&metrics_url).send().await.unwrap().text().await.unwrap();
        let waiting =
            |e: &MockEngine| series(&p, &format!("router_worker_reported_waiting_requests{{worker=\"{}\"}}", e.url()));
        let healthy = series(&p, "router_workers{state=\"healthy\"}") == Some(2.0);
        healthy && waiting(&e0) == Some(1.0) && waiting(&e1) == Some(0.0)
    })
    .await;
    let q = json!({"model": "default", "max_tokens": 2, "messages": [{"role": "user", "content": "hello"}]});
    for _ in 0..6 {
        assert_eq!(http.post(format!("{url}/v1/chat/completions")).json(&q).send().await.unwrap().status(), 200);
    }
    // Without the requests sent since, all six would go to e1 (its report: an empty queue).
    let (n0, n1) = (e0.engine().requests.load(Relaxed), e1.engine().requests.load(Relaxed));
    assert_eq!(n0 + n1, 6);
    assert!(n0 >= 1 && n1 >= 3, "e0 {n0}, e1 {n1}");
}

/// SMG's `--stream-body-stall-timeout-secs` through the real command line: a client that stops
/// sending its body for that long is answered 408, well before the whole body's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_paused_past_the_stall_bound_is_answered_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let e = engine(false).await;
    let u = e.url();
    #[rustfmt::skip]
    let args = [
        "--worker-urls", &u, "--stream-body-stall-timeout-secs", "1", "--client-body-timeout-secs", "60",
        "--log-level", "warn",
        "--prometheus-port", "0", "--prometheus-host", "127.0.0.1", "--host", "127.0.0.1", "--port", "0",
    ];
    let (_router, url, _) = launch(&args);
    let addr = url.trim_start_matches("http://").to_owned();
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let t0 = std::time::Instant::now();
    let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"model\":";
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), tcp.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "no answer within 30 s");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    assert!(answer.contains("no byte of the request body"), "{answer}");
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
}
