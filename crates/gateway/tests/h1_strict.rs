//! Strictness of the HTTP/1.1 fast path, on real sockets. Towards the
//! workers: one valid `Content-Length` per answer, chunk sizes of hex digits
//! only, and a request written to a pooled connection never sent twice.
//! Towards the clients: a half-close is no disconnect, and a malformed or
//! oversized head gets a precise JSON error on both front ends.

mod h1_support;

use std::time::Duration;

use h1_support::{Client, RawWorker, Reply, chat, limits, post, start, until};

/// Serves one chat request through a fresh gateway in front of a worker that answers `reply`.
async fn through(reply: Reply) -> (h1_support::Answer, Client, RawWorker, h1_support::Running) {
    let w = RawWorker::spawn(vec![reply]).await;
    let r = start(&[&w.url], limits(), true).await;
    let mut c = Client::connect(r.addr).await;
    c.send(&post("/v1/chat/completions", &chat(false), "")).await;
    (c.answer().await, c, w, r)
}

#[tokio::test]
async fn an_answer_with_two_lengths_or_a_length_and_a_coding_is_a_502() {
    for raw in [
        "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\n{}",
        "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 2\r\n\r\n{}",
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 2\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: +2\r\n\r\n{}",
    ] {
        let (a, ..) = through(Reply::Send(raw)).await;
        a.assert_error(502, "upstream_unreachable");
    }
    // One length is fine.
    let (a, ..) = through(Reply::Send("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")).await;
    assert_eq!((a.status, a.body.as_slice()), (200, &b"{}"[..]));
}

#[tokio::test]
async fn chunk_sizes_are_hex_digits_only() {
    let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
    // Bad from the first chunk: nothing went out yet, so the client gets a plain 502.
    for bad in ["+5\r\nhello\r\n0\r\n\r\n", " 5\r\nhello\r\n0\r\n\r\n", "0x5\r\nhello\r\n0\r\n\r\n", "\r\n"] {
        let raw: &'static str = Box::leak(format!("{head}{bad}").into_boxed_str());
        let (a, _, _, r) = through(Reply::Send(raw)).await;
        a.assert_error(502, "upstream_unreachable");
        assert!(r.gw.fleet.snapshot().iter().all(|w| !w.is_routable()), "an invalid answer is a worker failure");
    }
    // Bad after a good chunk went out: the body is cut (no last chunk) and the connection closes.
    let first: &'static str = Box::leak(format!("{head}5\r\nhello\r\n").into_boxed_str());
    let w = RawWorker::spawn(vec![Reply::Then(first, Duration::from_millis(100), "-5\r\nworld\r\n0\r\n\r\n")]).await;
    let r = start(&[&w.url], limits(), true).await;
    let mut c = Client::connect(r.addr).await;
    c.send(&post("/v1/chat/completions", &chat(false), "")).await;
    assert_eq!(c.line().await, "HTTP/1.1 200 OK");
    while !c.line().await.is_empty() {}
    assert_eq!(c.line().await, "5");
    assert_eq!(c.line().await, "hello");
    assert!(c.try_line().await.is_none(), "the cut body must not end cleanly: {:?}", String::from_utf8_lossy(&c.buf));
}

#[tokio::test]
async fn a_request_written_to_a_pooled_connection_is_never_sent_again() {
    let ok = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
    // The second request reaches the worker on the kept connection, which closes without answering.
    let w = RawWorker::spawn(vec![Reply::Send(ok), Reply::Drop, Reply::Send(ok)]).await;
    let r = start(&[&w.url], limits(), true).await;
    let mut c = Client::connect(r.addr).await;
    c.send(&post("/v1/chat/completions", &chat(false), "")).await;
    assert_eq!(c.answer().await.status, 200);
    c.send(&post("/v1/chat/completions", &chat(false), "")).await;
    let a = c.answer().await;
    // The worker may have started on it: a worker error, not a silent second run.
    a.assert_error(502, "upstream_unreachable");
    assert_eq!(w.posts(), 2, "the written request was sent again");
}

#[tokio::test]
async fn a_client_that_half_closes_is_still_answered_and_one_that_leaves_is_let_go() {
    let ok = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
    let w = RawWorker::spawn(vec![Reply::Later(Duration::from_millis(300), ok)]).await;
    let mut l = limits();
    l.idle_timeout = Duration::from_secs(30);
    let r = start(&[&w.url], l, true).await;
    // A whole request, then the client shuts its sending side: answered, then closed.
    let mut c = Client::connect(r.addr).await;
    c.send(&post("/v1/chat/completions", &chat(false), "")).await;
    tokio::io::AsyncWriteExt::shutdown(&mut c.tcp).await.unwrap();
    let a = c.answer().await;
    assert_eq!((a.status, a.body.as_slice()), (200, &b"{}"[..]), "{a:?}");
    assert!(c.closed().await, "the connection closes after the answer");
    // A client that closes altogether while its worker works is let go well before the answer.
    let w = RawWorker::spawn(vec![Reply::Later(Duration::from_secs(3), ok)]).await;
    let r = start(&[&w.url], l, true).await;
    let mut c = Client::connect(r.addr).await;
    c.send(&post("/v1/chat/completions", &chat(false), "")).await;
    until("the request reached the worker", || w.posts() == 1).await;
    drop(c);
    let t0 = std::time::Instant::now();
    until("the request was released", || r.gw.in_flight() == 0).await;
    assert!(t0.elapsed() < Duration::from_secs(2), "released by the answer, not the close: {:?}", t0.elapsed());
}

#[tokio::test]
async fn malformed_and_oversized_heads_get_json_errors_on_both_front_ends() {
    let (fast, slow) = (start(&[], limits(), true).await, start(&[], limits(), false).await);
    let many: String = (0..70).map(|i| format!("x-h{i}: v\r\n")).collect();
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"BAD\0 REQUEST\r\n\r\n".to_vec(), 400, "invalid_request_error"),
        (b"GET /health HTTP/1.1\r\nbad header\r\n\r\n".to_vec(), 400, "invalid_request_error"),
        (b"GET /health HTTP/2.0\r\n\r\n".to_vec(), 400, "invalid_request_error"),
        (
            b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n".to_vec(),
            400,
            "invalid_request_error",
        ),
        (
            b"POST /x HTTP/1.1\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n{}".to_vec(),
            400,
            "invalid_request_error",
        ),
        (
            format!("POST /v1/chat/completions HTTP/1.1\r\n{many}\r\n").into_bytes(),
            431,
            "request_header_fields_too_large",
        ),
        (
            format!("GET /health HTTP/1.1\r\nx-big: {}\r\n\r\n", "a".repeat(70 << 10)).into_bytes(),
            431,
            "request_header_fields_too_large",
        ),
        (format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(70 << 10)).into_bytes(), 414, "uri_too_long"),
    ];
    for (raw, status, kind) in &cases {
        // On the fast path, after a hand-off to hyper on the same connection, and with the fast path off.
        for (r, handed_off) in [(&fast, false), (&fast, true), (&slow, false)] {
            let mut c = Client::connect(r.addr).await;
            if handed_off {
                c.send(b"GET /health HTTP/1.1\r\nhost: r\r\n\r\n").await;
                assert_eq!(c.answer().await.status, 200);
            }
            c.send(raw).await;
            let a = c.answer().await;
            a.assert_error(*status, kind);
            assert_eq!(a.header("connection"), Some("close"), "{a:?}");
            assert!(c.closed().await, "closed after the refusal");
        }
    }
    // Well-formed requests the fast path does not serve still reach hyper.
    for r in [&fast, &slow] {
        let mut c = Client::connect(r.addr).await;
        c.send(b"GET /health HTTP/1.1\r\nhost: r\r\n\r\nGET /health HTTP/1.0\r\n\r\n").await;
        for _ in 0..2 {
            let a = c.answer().await;
            assert_eq!((a.status, a.body.as_slice()), (200, &b"ok"[..]), "{a:?}");
        }
    }
}

#[tokio::test]
async fn a_malformed_chunked_request_body_is_a_json_400_on_the_fallback() {
    let (fast, slow) = (start(&[], limits(), true).await, start(&[], limits(), false).await);
    // An overflowing chunk size, a bare LF, a signed size: the guard stops at the framing, mid-request.
    for body in [&b"fffffffffffffffffffff\r\n{}\r\n0\r\n\r\n"[..], b"2\n{}\r\n0\r\n\r\n", b"+2\r\n{}\r\n0\r\n\r\n"] {
        for r in [&fast, &slow] {
            let mut c = Client::connect(r.addr).await;
            let mut raw =
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
            raw.extend_from_slice(body);
            c.send(&raw).await;
            c.answer().await.assert_error(400, "invalid_request_error");
            assert!(c.closed().await, "closed after the refusal");
        }
    }
}
