//! The production features SGLang Model Gateway users expect, on real
//! sockets and on both front ends: retries that happen only before any byte
//! of an answer went out, the queue for a slot (429 when full, 408 when the
//! wait is too long), request ids (the client's, or made here; sent to the
//! worker, echoed to the client) and CORS.

mod h1_support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use gateway::pipeline::context::Cors;
use h1_support::{Client, RawWorker, Reply, chat, limits, post, start, start_with, until};

const OK: &str = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
const BUSY: &str = "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";

async fn chat_once(addr: std::net::SocketAddr, extra: &str) -> h1_support::Answer {
    let mut c = Client::connect(addr).await;
    c.send(&post("/v1/chat/completions", &chat(false), extra)).await;
    c.answer().await
}

#[tokio::test]
async fn a_retryable_status_is_retried_elsewhere_before_any_byte_went_out() {
    for fast in [true, false] {
        let (a, b) = (
            RawWorker::spawn(vec![Reply::Send(BUSY), Reply::Send(OK)]).await,
            RawWorker::spawn(vec![Reply::Send(BUSY), Reply::Send(OK)]).await,
        );
        let r = start(&[&a.url, &b.url], limits(), fast).await;
        let answer = chat_once(r.addr, "").await;
        assert_eq!(answer.status, 200, "fast {fast}: {answer:?}");
        // 503 from one, 503 from the other, then the first again (the only ones there are).
        assert_eq!((a.posts() + b.posts(), a.posts().min(b.posts())), (3, 1), "fast {fast}");
        assert_eq!(r.gw.metrics.retries.load(Ordering::Relaxed), 2, "fast {fast}");
    }
}

#[tokio::test]
async fn retries_stop_at_the_attempt_limit_and_can_be_disabled() {
    for (enabled, attempts) in [(true, 2), (false, 1)] {
        let (a, b) = (RawWorker::spawn(vec![Reply::Send(BUSY)]).await, RawWorker::spawn(vec![Reply::Send(BUSY)]).await);
        let r = start_with(&[&a.url, &b.url], limits(), true, |c| {
            c.retry.enabled = enabled;
            c.retry.max_retries = 2;
        })
        .await;
        let answer = chat_once(r.addr, "").await;
        assert_eq!(answer.status, 503, "the worker's own answer, once attempts run out");
        assert_eq!(a.posts() + b.posts(), attempts, "retries enabled: {enabled}");
    }
}

#[tokio::test]
async fn an_answer_that_started_is_never_retried() {
    for fast in [true, false] {
        // Both workers send a head and part of the body, then fall silent.
        let partial = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"partial\"";
        let (a, b) =
            (RawWorker::spawn(vec![Reply::Stall(partial)]).await, RawWorker::spawn(vec![Reply::Stall(partial)]).await);
        let r = start(&[&a.url, &b.url], limits(), fast).await;
        let mut c = Client::connect(r.addr).await;
        c.send(&post("/v1/chat/completions", &chat(false), "")).await;
        // The head went out; the body ends short when the worker's silence runs past the limit.
        let status = c.line().await;
        assert!(status.starts_with("HTTP/1.1 200"), "fast {fast}: {status}");
        while c.fill().await > 0 {}
        assert_eq!(a.posts() + b.posts(), 1, "fast {fast}: one attempt only");
        assert_eq!(r.gw.metrics.retries.load(Ordering::Relaxed), 0, "fast {fast}");
    }
}

#[tokio::test]
async fn request_ids_are_echoed_forwarded_and_made_when_absent() {
    for fast in [true, false] {
        let w = RawWorker::spawn(vec![Reply::Send(
            "HTTP/1.1 200 OK\r\nx-request-id: the-workers-own\r\ncontent-length: 2\r\n\r\n{}",
        )])
        .await;
        let r = start(&[&w.url], limits(), fast).await;
        // The client's id, from the first listed header it sent.
        let a = chat_once(r.addr, "x-trace-id: trace-7\r\nrequest-id: later-in-the-list\r\n").await;
        assert_eq!(a.header("x-request-id"), Some("trace-7"), "fast {fast}: {a:?}");
        assert_eq!(a.headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case("x-request-id")).count(), 1);
        let head = w.heads().pop().unwrap().to_ascii_lowercase();
        assert!(head.contains("\nx-request-id: trace-7"), "fast {fast}: the worker sees it as x-request-id: {head}");
        assert!(head.contains("\nx-trace-id: trace-7"), "and the client's own header: {head}");
        // None sent: one is made, the same for the worker and the client.
        let a = chat_once(r.addr, "").await;
        let id = a.header("x-request-id").unwrap().to_string();
        assert!(id.starts_with("chatcmpl-") && id.len() == 33, "fast {fast}: {id}");
        let head = w.heads().pop().unwrap().to_ascii_lowercase();
        assert!(head.contains(&format!("\nx-request-id: {}", id.to_ascii_lowercase())), "{head}");
        // The router's own error answers carry it too.
        let mut c = Client::connect(r.addr).await;
        c.send(&post("/v1/chat/completions", b"{not json", "x-request-id: bad-body-1\r\n")).await;
        let a = c.answer().await;
        a.assert_error(400, "invalid_request_error");
        assert_eq!(a.header("x-request-id"), Some("bad-body-1"), "fast {fast}");
    }
}

#[tokio::test]
async fn cors_answers_preflights_and_marks_answers_for_allowed_origins() {
    for fast in [true, false] {
        let w = RawWorker::spawn(vec![Reply::Send(OK)]).await;
        let r = start_with(&[&w.url], limits(), fast, |c| {
            c.cors = Cors::from_flag(&["https://app.example.com".into()]);
        })
        .await;
        let preflight = |origin: &str| {
            format!(
                "OPTIONS /v1/chat/completions HTTP/1.1\r\nhost: r\r\norigin: {origin}\r\naccess-control-request-method: POST\r\naccess-control-request-headers: content-type, authorization\r\ncontent-length: 0\r\n\r\n"
            )
        };
        let mut c = Client::connect(r.addr).await;
        c.send(preflight("https://app.example.com").as_bytes()).await;
        let a = c.answer().await;
        assert_eq!(a.status, 204, "{a:?}");
        assert_eq!(a.header("access-control-allow-origin"), Some("https://app.example.com"));
        assert_eq!(a.header("access-control-allow-headers"), Some("content-type, authorization"));
        assert!(a.header("access-control-allow-methods").is_some_and(|m| m.contains("POST")));
        assert_eq!(w.posts(), 0, "a preflight never reaches a worker");
        let mut c = Client::connect(r.addr).await;
        c.send(preflight("https://evil.example.net").as_bytes()).await;
        c.answer().await.assert_error(403, "permission_error");
        // The request itself: its answer names the origin it may be read by.
        let a = chat_once(r.addr, "origin: https://app.example.com\r\n").await;
        assert_eq!(
            (a.status, a.header("access-control-allow-origin")),
            (200, Some("https://app.example.com")),
            "fast {fast}"
        );
        assert_eq!(a.header("access-control-expose-headers"), Some("x-request-id"));
        let a = chat_once(r.addr, "origin: https://evil.example.net\r\n").await;
        assert_eq!((a.status, a.header("access-control-allow-origin")), (200, None), "fast {fast}");
    }
}

#[tokio::test]
async fn a_full_queue_is_429_and_a_wait_past_the_timeout_is_408() {
    for fast in [true, false] {
        let w = RawWorker::spawn(vec![Reply::Later(Duration::from_millis(1500), OK)]).await;
        let r = start_with(&[&w.url], limits(), fast, |c| {
            c.max_concurrent = 1;
            c.queue_size = 1;
            c.queue_timeout = Duration::from_millis(300);
        })
        .await;
        let mut first = Client::connect(r.addr).await;
        first.send(&post("/v1/chat/completions", &chat(false), "")).await;
        until("the first request holds the slot", || r.gw.in_flight() == 1).await;
        let mut queued = Client::connect(r.addr).await;
        queued.send(&post("/v1/chat/completions", &chat(false), "")).await;
        until("the second request waits", || r.gw.queue.waiting.load(Ordering::Relaxed) == 1).await;
        let a = chat_once(r.addr, "").await;
        a.assert_error(429, "queue_full");
        let started = std::time::Instant::now();
        queued.answer().await.assert_error(408, "queue_timeout");
        assert!(started.elapsed() < Duration::from_millis(1200), "it waited its timeout, not the first request");
        assert_eq!(first.answer().await.status, 200, "fast {fast}");
        assert_eq!(w.posts(), 1, "only the first request reached the worker");
    }
}

#[tokio::test]
async fn a_queued_request_runs_when_a_slot_frees() {
    let w = RawWorker::spawn(vec![Reply::Later(Duration::from_millis(200), OK)]).await;
    let r = start_with(&[&w.url], limits(), true, |c| {
        c.max_concurrent = 1;
        c.queue_size = 4;
        c.queue_timeout = Duration::from_secs(5);
    })
    .await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        let mut c = Client::connect(r.addr).await;
        c.send(&post("/v1/chat/completions", &chat(false), "")).await;
        clients.push(c);
    }
    for c in &mut clients {
        assert_eq!(c.answer().await.status, 200);
    }
    assert_eq!(w.posts(), 3);
    assert_eq!(r.gw.metrics.queue_timeouts.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn dp_aware_sends_each_request_to_the_least_loaded_rank() {
    // A worker of four ranks whose report says ranks 0, 1 and 3 have prefill queued.
    let info = r#"{"model_path": "m", "dp_size": 4, "page_size": 16}"#.to_string();
    let loads = r#"{"loads": [{"dp_rank": 0, "num_waiting_uncached_tokens": 9000},
        {"dp_rank": 1, "num_waiting_uncached_tokens": 4000}, {"dp_rank": 2, "num_waiting_uncached_tokens": 10},
        {"dp_rank": 3, "num_waiting_uncached_tokens": 7000}]}"#
        .to_string();
    for dp_aware in [true, false] {
        let w = RawWorker::spawn_with_gets(
            vec![Reply::Send(OK)],
            vec![("/server_info", info.clone()), ("/v1/loads", loads.clone())],
        )
        .await;
        let r = h1_support::start_fleet(
            &[&w.url],
            limits(),
            true,
            |_| {},
            |f| {
                f.dp_aware = dp_aware;
                f.load_poll = Duration::from_millis(20);
            },
        )
        .await;
        until("the worker's ranks and loads are known", || {
            let all = r.gw.fleet.all();
            all[0].info().is_some_and(|i| i.dp_size == Some(4)) && all[0].reported_uncached_tokens() == 20_010
        })
        .await;
        for _ in 0..3 {
            assert_eq!(chat_once(r.addr, "").await.status, 200);
        }
        for head in w.heads() {
            let rank = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("x-data-parallel-rank: ").map(str::to_string));
            let expected = dp_aware.then(|| "2".to_string());
            assert_eq!(rank, expected, "dp_aware {dp_aware}: {head}");
        }
    }
}

#[tokio::test]
async fn the_rate_limit_refuses_past_its_tokens_or_queues() {
    let w = RawWorker::spawn(vec![Reply::Send(OK)]).await;
    // No queue: one second's worth of tokens (2), then 429.
    let r = start_with(&[&w.url], limits(), true, |c| c.rate_limit = Some(2)).await;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(chat_once(r.addr, "").await.status);
    }
    assert_eq!(statuses, [200, 200, 429]);
    let a = chat_once(r.addr, "").await;
    a.assert_error(429, "rate_limited");
    assert!(a.header("retry-after").is_some());
    // With a queue, the request waits for its token instead.
    let r = start_with(&[&w.url], limits(), true, |c| {
        c.rate_limit = Some(4);
        c.queue_size = 8;
        c.queue_timeout = Duration::from_secs(3);
    })
    .await;
    let started = std::time::Instant::now();
    for _ in 0..6 {
        assert_eq!(chat_once(r.addr, "").await.status, 200);
    }
    assert!(started.elapsed() >= Duration::from_millis(400), "two of them waited a quarter second each");
}

#[tokio::test]
async fn embeddings_rerank_and_classify_pass_through_to_one_worker() {
    for fast in [true, false] {
        let w = RawWorker::spawn(vec![Reply::Send(OK)]).await;
        let r = start(&[&w.url], limits(), fast).await;
        for (path, to) in [
            ("/v1/embeddings", "/v1/embeddings"),
            ("/v1/rerank", "/v1/rerank"),
            ("/rerank", "/v1/rerank"),
            ("/v1/classify", "/v1/classify"),
        ] {
            let mut c = Client::connect(r.addr).await;
            c.send(&post(path, br#"{"model": "m", "input": ["a", "b"], "query": "q"}"#, "")).await;
            assert_eq!(c.answer().await.status, 200, "fast {fast}: {path}");
            let head = w.heads().pop().unwrap();
            assert!(head.starts_with(&format!("POST {to} HTTP/1.1")), "{path}: {head}");
            // Not JSON: refused before any worker sees it.
            let mut c = Client::connect(r.addr).await;
            c.send(&post(path, b"[1, 2]", "")).await;
            c.answer().await.assert_error(400, "invalid_request_error");
        }
        assert_eq!(w.posts(), 4, "fast {fast}");
    }
}
