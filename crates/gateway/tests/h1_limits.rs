//! The client limits of both HTTP/1.1 front ends (the fast path and the hyper
//! fallback), on real sockets: a head or body too slow to arrive is answered
//! 408 (JSON) and closed, an idle keep-alive connection is closed silently,
//! the accept loop holds at most `max_connections`; and towards the workers,
//! one silent mid-answer is a worker failure and a client that resets
//! mid-answer lets go of the worker at once.

mod h1_support;

use std::time::{Duration, Instant};

use h1_support::{Client, RawWorker, Reply, WAIT, chat, limits, post, start, until};

/// A stream's head and first event.
const FIRST_EVENT: &str =
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n";

#[tokio::test]
async fn a_partial_head_is_answered_408_and_closed_on_both_front_ends() {
    let (fast, slow) = (start(&[], limits(), true).await, start(&[], limits(), false).await);
    // On the fast path, a connection handed to hyper, and with the fast path off.
    let cases: [(&h1_support::Running, &[u8], &[u8]); 3] = [
        (&fast, b"", b"POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\ncontent-le"),
        (&fast, b"GET /health HTTP/1.1\r\nhost: r\r\n\r\n", b"GET /health HTTP/1.1\r\nho"),
        (&slow, b"", b"GET /health HTTP/1.1\r\nho"),
    ];
    for (r, before, partial) in cases {
        let mut c = Client::connect(r.addr).await;
        if !before.is_empty() {
            c.send(before).await;
            assert_eq!(c.answer().await.status, 200);
        }
        c.send(partial).await;
        let t0 = Instant::now();
        let a = c.answer().await;
        a.assert_error(408, "request_timeout");
        assert_eq!(a.header("connection"), Some("close"), "{a:?}");
        assert!(t0.elapsed() >= Duration::from_millis(250), "408 before the deadline: {:?}", t0.elapsed());
        assert!(c.closed().await, "closed after the 408");
    }
}

#[tokio::test]
async fn a_half_sent_body_is_answered_408_and_closed_on_both_front_ends() {
    let (fast, slow) = (start(&[], limits(), true).await, start(&[], limits(), false).await);
    let body = chat(false);
    // The fast path; an HTTP/1.0 request (hyper's); a chunked one (hyper's) cut inside a chunk.
    let mut chunked = b"POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    chunked.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
    chunked.extend_from_slice(&body[..10]);
    let cut = |raw: String| {
        let mut raw = raw.into_bytes();
        raw.extend_from_slice(&body[..10]);
        raw
    };
    let sized = |version: &str| {
        format!("POST /v1/chat/completions HTTP/{version}\r\nhost: r\r\ncontent-length: {}\r\n\r\n", body.len())
    };
    let cases = [(&fast, cut(sized("1.1"))), (&fast, cut(sized("1.0"))), (&fast, chunked.clone()), (&slow, chunked)];
    for (r, raw) in cases {
        let mut c = Client::connect(r.addr).await;
        c.send(&raw).await;
        let a = c.answer().await;
        a.assert_error(408, "request_timeout");
        assert!(c.closed().await, "closed after the 408");
    }
}

/// A request's head and the first ten bytes of its body, sized (the fast path) or chunked
/// (hyper's), and the rest of the body as the client would send it.
fn split_body(chunked: bool) -> (Vec<u8>, Vec<u8>) {
    let body = chat(false);
    if chunked {
        let mut head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        head.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
        head.extend_from_slice(&body[..10]);
        let mut rest = body[10..].to_vec();
        rest.extend_from_slice(b"\r\n0\r\n\r\n");
        (head, rest)
    } else {
        let mut head =
            format!("POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\ncontent-length: {}\r\n\r\n", body.len())
                .into_bytes();
        head.extend_from_slice(&body[..10]);
        (head, body[10..].to_vec())
    }
}

/// The test limits with a pause bound of `stall` mid-body, and 30 s for the whole body (longer
/// than any wait of these tests).
fn stall_limits(stall: Duration) -> gateway::ClientLimits {
    gateway::ClientLimits { body_read_timeout: Duration::from_secs(30), body_stall_timeout: stall, ..limits() }
}

#[tokio::test]
async fn a_body_that_pauses_past_the_stall_bound_is_answered_408_on_both_front_ends() {
    let l = stall_limits(Duration::from_millis(300));
    let (fast, slow) = (start(&[], l, true).await, start(&[], l, false).await);
    for (r, chunked) in [(&fast, false), (&fast, true), (&slow, true)] {
        let (head, _) = split_body(chunked);
        let mut c = Client::connect(r.addr).await;
        let t0 = Instant::now();
        c.send(&head).await;
        let a = c.answer().await;
        a.assert_error(408, "request_timeout");
        assert!(a.json()["error"]["message"].as_str().unwrap().contains("no byte"), "{:?}", a.json());
        assert!(t0.elapsed() >= Duration::from_millis(250), "408 before the bound: {:?}", t0.elapsed());
        assert!(c.closed().await, "closed after the 408");
    }
}

#[tokio::test]
async fn a_body_that_keeps_coming_is_not_cut_by_the_stall_bound() {
    // Pauses of 100 ms for a body that takes about 1.5 s in all, against a pause bound of
    // 1 s (ten times the pause): the bound restarts with every byte. No worker: the whole
    // request is answered 503, not 408.
    let l = stall_limits(Duration::from_secs(1));
    let (fast, slow) = (start(&[], l, true).await, start(&[], l, false).await);
    for (r, chunked) in [(&fast, false), (&slow, true)] {
        let (head, rest) = split_body(chunked);
        let mut c = Client::connect(r.addr).await;
        c.send(&head).await;
        let pieces: Vec<&[u8]> = rest.chunks(rest.len().div_ceil(15)).collect();
        for piece in pieces {
            tokio::time::sleep(Duration::from_millis(100)).await;
            c.send(piece).await;
        }
        let a = c.answer().await;
        assert_eq!(a.status, 503, "{a:?}");
    }
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_silently_on_both_front_ends() {
    let w = RawWorker::spawn(vec![Reply::Send("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")]).await;
    let (fast, slow) = (start(&[&w.url], limits(), true).await, start(&[&w.url], limits(), false).await);
    for r in [&fast, &slow] {
        // Idle from the start, and idle after an answer (a fast-path one, then a hyper one).
        for first in
            [None, Some(post("/v1/chat/completions", &chat(false), "")), Some(b"GET /health HTTP/1.1\r\n\r\n".to_vec())]
        {
            let mut c = Client::connect(r.addr).await;
            if let Some(first) = &first {
                c.send(first).await;
                assert_eq!(c.answer().await.status, 200);
            }
            let t0 = Instant::now();
            assert!(c.closed().await, "an idle connection is closed without a word");
            assert!(t0.elapsed() >= Duration::from_millis(250), "closed before the idle deadline: {:?}", t0.elapsed());
        }
        // Requests more often than the idle deadline keep a connection open: each idle spell counts alone.
        let mut c = Client::connect(r.addr).await;
        for _ in 0..4 {
            c.send(b"GET /health HTTP/1.1\r\n\r\n").await;
            assert_eq!(c.answer().await.status, 200);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

#[tokio::test]
async fn the_accept_loop_holds_at_most_max_connections() {
    let mut l = limits();
    (l.max_connections, l.idle_timeout) = (2, Duration::from_secs(30));
    let r = start(&[], l, true).await;
    let health = b"GET /health HTTP/1.1\r\nhost: r\r\n\r\n";
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut c = Client::connect(r.addr).await;
        c.send(health).await;
        assert_eq!(c.answer().await.status, 200);
        open.push(c);
    }
    // The kernel completes the third handshake, but the router does not take it.
    let mut third = Client::connect(r.addr).await;
    third.send(health).await;
    let early = tokio::time::timeout(Duration::from_millis(500), third.tcp.readable()).await;
    assert!(early.is_err(), "a third connection was served past the cap of 2");
    // One closes: the third is accepted and served.
    drop(open.pop());
    assert_eq!(third.answer().await.status, 200);
}

#[tokio::test]
async fn a_worker_silent_mid_answer_fails_it_and_ends_the_answer() {
    let mut l = limits();
    l.idle_timeout = Duration::from_secs(30);
    // A stream: its first event, then silence; on both front ends.
    for fast in [true, false] {
        let w = RawWorker::spawn(vec![Reply::Stall(FIRST_EVENT)]).await;
        let r = start(&[&w.url], l, fast).await;
        let mut c = Client::connect(r.addr).await;
        c.send(&post("/v1/chat/completions", &chat(true), "")).await;
        let t0 = Instant::now();
        let a = c.answer().await;
        assert!(t0.elapsed() < WAIT / 2, "fast {fast}: ended by the upstream idle deadline");
        let body = String::from_utf8(a.body.clone()).unwrap();
        assert!(body.starts_with("data: 1\n\ndata: {\"error\""), "fast {fast}: {body}");
        assert!(body.contains("upstream_unreachable") && body.ends_with("data: [DONE]\n\n"), "{body}");
        until("the worker left rotation", || r.gw.fleet.snapshot().iter().all(|w| !w.is_routable())).await;
        until("the stalled request released its load", || r.gw.in_flight() == 0).await;
        until("the stalled upstream connection was dropped", || {
            w.hung_up.load(std::sync::atomic::Ordering::SeqCst) == 1
        })
        .await;
    }
    // A sized answer (half its body, then silence) cannot end cleanly: the head and what came, then the close.
    let sized = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 10\r\n\r\n{\"a\":";
    let w = RawWorker::spawn(vec![Reply::Stall(sized)]).await;
    let r = start(&[&w.url], l, true).await;
    let mut c = Client::connect(r.addr).await;
    c.send(&post("/v1/chat/completions", &chat(false), "")).await;
    let head = c.line().await;
    assert_eq!(head, "HTTP/1.1 200 OK");
    while !c.line().await.is_empty() {}
    assert!(c.want(5).await && !c.want(6).await, "{:?}", String::from_utf8_lossy(&c.buf));
}

#[tokio::test]
async fn a_client_that_resets_mid_answer_lets_go_of_the_worker_at_once() {
    let w = RawWorker::spawn(vec![Reply::Stall(FIRST_EVENT)]).await;
    let mut l = limits();
    (l.idle_timeout, l.upstream_idle_timeout) = (Duration::from_secs(30), Duration::from_secs(30));
    let r = start(&[&w.url], l, true).await;
    let mut c = Client::connect(r.addr).await;
    c.send(&post("/v1/chat/completions", &chat(true), "")).await;
    while !String::from_utf8_lossy(&c.buf).contains("data: 1") {
        assert!(c.fill().await > 0, "the first event never came");
    }
    assert!(String::from_utf8_lossy(&c.buf).starts_with("HTTP/1.1 200 OK\r\n"));
    assert_eq!(r.gw.in_flight(), 1);
    // A reset (not a half-close): the router notices while it waits for the silent worker.
    c.tcp.set_zero_linger().unwrap();
    drop(c);
    let t0 = Instant::now();
    until("the request released its load", || r.gw.in_flight() == 0).await;
    until("the upstream connection was dropped", || w.hung_up.load(std::sync::atomic::Ordering::SeqCst) == 1).await;
    assert!(t0.elapsed() < Duration::from_secs(2), "noticed by a timeout, not the reset: {:?}", t0.elapsed());
    assert!(r.gw.fleet.snapshot()[0].is_routable(), "a client leaving is no worker failure");
}
