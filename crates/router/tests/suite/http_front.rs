//! The router's HTTP/1.1 front end over raw sockets: its fast path for the
//! proxied routes (keep-alive, pipelining, `Expect: 100-continue`,
//! `Connection: close`, errors, a client leaving while its worker works) and
//! the hand-off to hyper for everything else on the same connection; and the
//! same answers with the fast path off.

use crate::common;

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::app::{ADMIN_KEY, Running, admin_get, chat, config, engine_config, start};
use common::eventually as until;
use mock_engine::{Faults, MockEngine};
use serde_json::{Value, json};
use sgl_router::app::PolicyConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An answer read off a raw connection.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// Every line of a list header, as one list.
    fn list(&self, name: &str) -> String {
        let values: Vec<&str> =
            self.headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str()).collect();
        values.join(", ")
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
}

/// A client connection that reads answers one by one (bytes past an answer are kept).
struct Client {
    tcp: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    async fn connect(r: &Running) -> Client {
        Client { tcp: TcpStream::connect(r.url.trim_start_matches("http://")).await.unwrap(), buf: Vec::new() }
    }

    async fn send(&mut self, raw: &[u8]) {
        self.tcp.write_all(raw).await.unwrap();
    }

    async fn fill(&mut self) -> usize {
        let mut chunk = [0u8; 16384];
        let n = tokio::time::timeout(Duration::from_secs(10), self.tcp.read(&mut chunk)).await.unwrap().unwrap_or(0);
        self.buf.extend_from_slice(&chunk[..n]);
        n
    }

    /// Reads until `n` bytes are buffered; false at end of stream.
    async fn want(&mut self, n: usize) -> bool {
        while self.buf.len() < n {
            if self.fill().await == 0 {
                return false;
            }
        }
        true
    }

    async fn line(&mut self) -> String {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8(self.buf[..i].to_vec()).unwrap();
                self.buf.drain(..i + 2);
                return line;
            }
            assert!(self.fill().await > 0, "connection closed mid-line");
        }
    }

    async fn answer(&mut self) -> Answer {
        let status_line = self.line().await;
        let status =
            status_line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{status_line}"));
        let mut headers = Vec::new();
        loop {
            let line = self.line().await;
            if line.is_empty() {
                break;
            }
            let (n, v) = line.split_once(':').unwrap();
            headers.push((n.trim().to_string(), v.trim().to_string()));
        }
        let mut a = Answer { status, headers, body: Vec::new() };
        if let Some(n) = a.header("content-length").map(|v| v.parse::<usize>().unwrap()) {
            assert!(self.want(n).await, "body cut short");
            a.body = self.buf.drain(..n).collect();
        } else if a.list("transfer-encoding").ends_with("chunked") {
            loop {
                let size = usize::from_str_radix(self.line().await.split(';').next().unwrap(), 16).unwrap();
                if size == 0 {
                    assert_eq!(self.line().await, "", "no trailers");
                    break;
                }
                assert!(self.want(size + 2).await, "chunk cut short");
                a.body.extend(self.buf.drain(..size));
                assert_eq!(self.buf.drain(..2).collect::<Vec<_>>(), b"\r\n");
            }
        }
        a
    }

    /// True once the router has closed the connection.
    async fn closed(&mut self) -> bool {
        self.buf.is_empty() && self.fill().await == 0
    }
}

fn post(path: &str, body: &[u8], extra: &str) -> Vec<u8> {
    let mut raw = format!(
        "POST {path} HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{extra}\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(body);
    raw
}

fn chat_body(user: &str) -> Vec<u8> {
    serde_json::to_vec(&chat("You are terse.", user)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_pipelining_and_hand_off_on_one_connection() {
    let w = MockEngine::spawn(engine_config()).await.unwrap();
    let r = start(config(&[&w], PolicyConfig::RoundRobin, false)).await;
    let mut c = Client::connect(&r).await;
    // Two requests in one write: both answered, in order, on the same connection.
    let mut two = post("/v1/chat/completions", &chat_body("one"), "");
    two.extend(post("/v1/completions", br#"{"model":"default","prompt":"two","max_tokens":2}"#, ""));
    c.send(&two).await;
    let (a, b) = (c.answer().await, c.answer().await);
    assert_eq!((a.status, b.status), (200, 200), "{a:?} {b:?}");
    assert_eq!(a.json()["object"], "chat.completion");
    assert_eq!(b.json()["object"], "text_completion");
    assert_eq!(a.header("content-type"), Some("application/json"));
    assert!(a.header("connection").is_none(), "keep-alive is the default: {a:?}");
    // A streamed answer is re-framed into chunks and ends cleanly.
    let mut streamed: Value = serde_json::from_slice(&chat_body("three")).unwrap();
    streamed["stream"] = json!(true);
    c.send(&post("/v1/chat/completions", &serde_json::to_vec(&streamed).unwrap(), "")).await;
    let s = c.answer().await;
    assert_eq!(s.header("content-type").map(|t| t.starts_with("text/event-stream")), Some(true), "{s:?}");
    let text = String::from_utf8(s.body).unwrap();
    assert!(text.starts_with("data: {") && text.ends_with("data: [DONE]\n\n"), "{text}");
    // A body several times the read buffer reaches the worker whole: it counts the prompt as it does direct.
    let big = chat_body(&"many words of a long question ".repeat(1400));
    c.send(&post("/v1/chat/completions", &big, "")).await;
    let via = c.answer().await;
    let direct: Value = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", w.url()))
        .header("content-type", "application/json")
        .body(big)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(via.status, 200, "{via:?}");
    assert!(direct["usage"]["prompt_tokens"].as_u64().is_some_and(|n| n > 40_000), "{direct}");
    assert_eq!(via.json()["usage"]["prompt_tokens"], direct["usage"]["prompt_tokens"]);
    // Another route on the same connection: hyper takes over and serves the rest.
    c.send(format!("GET /metrics HTTP/1.1\r\nhost: r\r\nauthorization: Bearer {ADMIN_KEY}\r\n\r\n").as_bytes()).await;
    let m = c.answer().await;
    assert_eq!(m.status, 200);
    let metrics = String::from_utf8(m.body).unwrap();
    assert!(metrics.contains("router_http_requests_total{route=\"chat\",status=\"200\"} 3"), "{metrics}");
    assert!(metrics.contains("router_http_requests_total{route=\"completions\",status=\"200\"} 1"), "{metrics}");
    c.send(&post("/generate", br#"{"text":"four","sampling_params":{"max_new_tokens":2}}"#, "")).await;
    assert_eq!(c.answer().await.status, 200);
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_continue_connection_close_and_chunked_requests() {
    let w = MockEngine::spawn(engine_config()).await.unwrap();
    let r = start(config(&[&w], PolicyConfig::RoundRobin, false)).await;
    // The body follows the interim answer, as curl sends large bodies.
    let body = chat_body("expect");
    let mut c = Client::connect(&r).await;
    let raw = post("/v1/chat/completions", &body, "expect: 100-continue\r\n");
    c.send(&raw[..raw.len() - body.len()]).await;
    assert_eq!(c.line().await, "HTTP/1.1 100 Continue");
    assert_eq!(c.line().await, "");
    c.send(&body).await;
    assert_eq!(c.answer().await.status, 200);
    // `Connection: close`: answered, marked, closed.
    c.send(&post("/v1/chat/completions", &chat_body("bye"), "connection: close\r\n")).await;
    let a = c.answer().await;
    assert_eq!((a.status, a.header("connection")), (200, Some("close")));
    assert!(c.closed().await);
    // A chunked request body is hyper's to read.
    let mut c = Client::connect(&r).await;
    let body = chat_body("chunked");
    let mut raw = b"POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    raw.extend(format!("{:x}\r\n", body.len()).as_bytes());
    raw.extend(&body);
    raw.extend(b"\r\n0\r\n\r\n");
    c.send(&raw).await;
    let a = c.answer().await;
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(a.json()["object"], "chat.completion");
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_path_and_fallback_answer_alike() {
    let w = MockEngine::spawn(engine_config()).await.unwrap();
    let fast = start(config(&[&w], PolicyConfig::RoundRobin, false)).await;
    let mut cfg = config(&[&w], PolicyConfig::RoundRobin, false);
    cfg.fast_proxy = false;
    let slow = start(cfg).await;
    let cases: [(&str, Vec<u8>); 5] = [
        ("/v1/chat/completions", chat_body("same")),
        ("/v1/chat/completions", b"{not json".to_vec()),
        ("/v1/chat/completions", br#"{"messages": "not a list"}"#.to_vec()),
        ("/v1/completions", br#"[1, 2]"#.to_vec()),
        ("/generate", br#"{"sampling_params": {}}"#.to_vec()),
    ];
    for (path, body) in cases {
        let mut answers = Vec::new();
        for r in [&fast, &slow] {
            let mut c = Client::connect(r).await;
            c.send(&post(path, &body, "")).await;
            answers.push(c.answer().await);
        }
        let (f, s) = (&answers[0], &answers[1]);
        assert_eq!(f.status, s.status, "{path} {:?}", String::from_utf8_lossy(&body));
        assert_eq!(f.header("content-type"), s.header("content-type"));
        if f.status == 200 {
            // The second one hit the engine's cache: compare what does not depend on it.
            for field in ["prompt_tokens", "completion_tokens"] {
                assert_eq!(f.json()["usage"][field], s.json()["usage"][field]);
            }
            assert_eq!(f.json()["choices"][0]["message"], s.json()["choices"][0]["message"]);
        } else {
            assert_eq!(f.json(), s.json(), "the same error, word for word");
        }
    }
    // Over the body limit: 413 as soon as the head is read, then a clean
    // close: the body the client goes on sending is read and dropped, not
    // answered with a reset (which can destroy the answer before it is read).
    let mut c = Client::connect(&fast).await;
    let mut big = post("/v1/chat/completions", &vec![b' '; 1 << 20], "");
    let rest = big.split_off(big.len() - (768 << 10));
    c.send(&big).await;
    let a = c.answer().await;
    assert_eq!((a.status, a.json()["error"]["type"].as_str()), (413, Some("request_too_large")));
    assert_eq!(a.header("connection"), Some("close"));
    // A client slowed down (a loaded machine) pauses for longer than a second
    // before it writes the rest: the router still waits for it (up to 5 s idle).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let sent = c.tcp.write_all(&rest).await;
    assert!(sent.is_ok(), "the router still reads the body it refused: {sent:?}");
    let end = tokio::time::timeout(Duration::from_secs(5), c.tcp.read(&mut [0u8; 1])).await.unwrap();
    assert!(matches!(end, Ok(0)), "a clean end of stream, not a reset: {end:?}");
    let _ = (fast.stop.send(()), slow.stop.send(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_while_its_worker_works_releases_the_request() {
    let w = MockEngine::spawn(engine_config()).await.unwrap();
    let r = start(config(&[&w], PolicyConfig::RoundRobin, false)).await;
    w.engine().set_faults(Faults { hang_next: 1, ..Faults::default() }).await;
    let mut c = Client::connect(&r).await;
    c.send(&post("/v1/chat/completions", &chat_body("hang"), "")).await;
    until("the request reached the worker", async || r.gateway.in_flight() == 1).await;
    drop(c);
    // Released well before the 5 s request timeout.
    let t0 = std::time::Instant::now();
    until("the router released the request", async || r.gateway.in_flight() == 0).await;
    assert!(t0.elapsed() < Duration::from_secs(3), "released by the timeout, not the hang-up");
    assert!(r.gateway.fleet.all().iter().all(|x| x.load().in_flight == 0));
    let _ = r.stop.send(());
}

/// A worker speaking raw HTTP/1.1: `GET /health` is 200, other GETs 404; the
/// n-th POST gets `answers[n]`, then the connection closes if the answer
/// said so, or silently after 300 ms idle, as workers drop idle connections.
/// The answer `CRASH` closes the connection after 400 ms of "work" without
/// answering; `DROP` closes it at once (an idle close racing the request, which
/// the router cannot tell from a worker that failed on it).
/// Returns its URL, the count of POSTs it received, and their heads.
async fn raw_worker(answers: Vec<&'static str>) -> (String, Arc<AtomicUsize>, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let answers = Arc::new(answers);
    let posts = Arc::new(AtomicUsize::new(0));
    let counted = posts.clone();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (answers, posts, heads) = (answers.clone(), posts.clone(), heads.clone());
            tokio::spawn(async move {
                let mut c = Client { tcp, buf: Vec::new() };
                loop {
                    // Idle connections are closed after 300 ms, without a word.
                    if c.buf.is_empty()
                        && !matches!(tokio::time::timeout(Duration::from_millis(300), c.fill()).await, Ok(n) if n > 0)
                    {
                        return;
                    }
                    let request = c.line().await;
                    let mut head = request.clone();
                    let mut length = 0;
                    loop {
                        let line = c.line().await;
                        if line.is_empty() {
                            break;
                        }
                        head.push('\n');
                        head.push_str(&line);
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap();
                        }
                    }
                    assert!(c.want(length).await);
                    c.buf.drain(..length);
                    let answer = if request.starts_with("GET /health ") {
                        "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
                    } else if request.starts_with("GET ") {
                        "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"
                    } else {
                        heads.lock().unwrap().push(head);
                        let n = posts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        answers[n % answers.len()]
                    };
                    if answer == "CRASH" {
                        tokio::time::sleep(Duration::from_millis(400)).await;
                        return;
                    }
                    if answer == "DROP" {
                        return;
                    }
                    c.send(answer.as_bytes()).await;
                    if answer.contains("connection: close") {
                        return;
                    }
                }
            });
        }
    });
    (url, counted, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_answers_are_relayed_whatever_their_framing() {
    let (url, posts, _) = raw_worker(vec![
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-engine: a\r\ncontent-length: 9\r\n\r\n{\"n\": 1}\n",
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\nuntil the end",
        "HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n4;ext=1\r\nchun\r\n3\r\nked\r\n0\r\nx-trailer: t\r\n\r\n",
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nx-engine: d\r\n\r\n",
        "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n3\r\ngz!\r\n0\r\n\r\n",
        "DROP",
        "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nagain",
        "CRASH",
    ])
    .await;
    let mut cfg = config(&[], PolicyConfig::RoundRobin, false);
    cfg.workers = vec![router_types::WorkerUrl::new(url.as_str())];
    let r = start(cfg).await;
    let mut c = Client::connect(&r).await;
    let mut bodies = Vec::new();
    for i in 0..5 {
        // Each time the worker has since closed the connection the router keeps: it reconnects.
        tokio::time::sleep(Duration::from_millis(400)).await;
        c.send(&post("/v1/chat/completions", &chat_body(&format!("q{i}")), "")).await;
        let a = c.answer().await;
        bodies.push((a.status, String::from_utf8(a.body.clone()).unwrap()));
        match i {
            0 => assert_eq!((a.header("x-engine"), a.header("content-length")), (Some("a"), Some("9"))),
            1 => assert_eq!(a.header("transfer-encoding"), Some("chunked"), "close-delimited, re-framed"),
            3 => assert_eq!((a.header("x-engine"), a.header("content-length")), (Some("d"), None)),
            // Re-framed, the body keeps its other transfer coding.
            4 => assert_eq!(a.header("transfer-encoding"), Some("gzip, chunked")),
            _ => {}
        }
        assert!(a.header("connection").is_none(), "the worker's hop headers stay with the worker: {a:?}");
    }
    let expected = [(200, "{\"n\": 1}\n"), (200, "until the end"), (201, "chunked"), (204, ""), (200, "gz!")]
        .map(|(s, b)| (s, b.to_string()));
    assert_eq!(bodies, expected);
    assert!(r.gateway.fleet.all()[0].is_healthy(), "none of those was an upstream failure");
    // Each request reached the worker once, though each found its pooled connection closed.
    assert_eq!(posts.load(std::sync::atomic::Ordering::SeqCst), 5);
    // The worker closes the kept connection just as a request arrives on it. The request was
    // written: the worker may have started on it, so it is not sent again (a POST is not
    // idempotent): 502, and the worker sits out its quarantine.
    c.send(&post("/v1/chat/completions", &chat_body("dropped"), "")).await;
    let a = c.answer().await;
    assert_eq!((a.status, a.json()["error"]["type"].as_str()), (502, Some("upstream_unreachable")), "{a:?}");
    assert_eq!(posts.load(std::sync::atomic::Ordering::SeqCst), 6);
    until("the worker is back after its quarantine", async || r.gateway.fleet.all()[0].is_routable()).await;
    c.send(&post("/v1/chat/completions", &chat_body("again"), "")).await;
    let a = c.answer().await;
    assert_eq!((a.status, a.body.as_slice()), (200, &b"again"[..]), "{a:?}");
    assert_eq!(posts.load(std::sync::atomic::Ordering::SeqCst), 7);
    // A worker that fails while working on a request: 502, and the request is not sent again.
    c.send(&post("/v1/chat/completions", &chat_body("crash"), "")).await;
    let a = c.answer().await;
    assert_eq!((a.status, a.json()["error"]["type"].as_str()), (502, Some("upstream_unreachable")), "{a:?}");
    assert_eq!(posts.load(std::sync::atomic::Ordering::SeqCst), 8);
    let _ = r.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_coded_answer_keeps_its_coding_on_both_paths() {
    // The codings on one line, and over two lines (one list).
    let (url, _, _) = raw_worker(vec![
        "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n3\r\ngz!\r\n0\r\n\r\n",
        "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\nx-engine: e\r\ntransfer-encoding: chunked\r\n\r\n3\r\ngz!\r\n0\r\n\r\n",
    ])
    .await;
    for fast_proxy in [true, false] {
        let mut cfg = config(&[], PolicyConfig::RoundRobin, false);
        cfg.workers = vec![router_types::WorkerUrl::new(url.as_str())];
        cfg.fast_proxy = fast_proxy;
        let r = start(cfg).await;
        let mut c = Client::connect(&r).await;
        for _ in 0..2 {
            c.send(&post("/v1/chat/completions", &chat_body("coded"), "")).await;
            let a = c.answer().await;
            assert_eq!(a.list("transfer-encoding"), "gzip, chunked", "fast path {fast_proxy}: {a:?}");
            assert_eq!((a.status, a.body.as_slice()), (200, &b"gz!"[..]), "fast path {fast_proxy}: {a:?}");
        }
        let _ = r.stop.send(());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_to_end_headers_reach_the_worker_and_hop_headers_do_not() {
    // The worker's own hop-only headers (named by its `connection`, or proxy challenges) stay on its hop.
    let ok = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: x-worker-hop\r\nx-worker-hop: 1\r\n\
              proxy-authenticate: Basic\r\nx-kept: yes\r\n\r\n{}";
    let (url, _, heads) = raw_worker(vec![ok]).await;
    let mut runs = Vec::new();
    for fast_proxy in [true, false] {
        let mut cfg = config(&[], PolicyConfig::RoundRobin, false);
        cfg.workers = vec![router_types::WorkerUrl::new(url.as_str())];
        cfg.fast_proxy = fast_proxy;
        cfg.worker_api_key = Some("router-key".into());
        runs.push(start(cfg).await);
    }
    let hop = "authorization: Bearer client-key\r\nx-request-id: abc-1\r\ntraceparent: 00-t-s-01\r\n\
               connection: keep-alive, x-hop\r\nx-hop: 1\r\nkeep-alive: timeout=5\r\nte: trailers\r\n\
               x-data-parallel-rank: 1\r\nproxy-authorization: Basic cHJveHk6cGFzcw==\r\n";
    // An id that cannot be echoed safely is replaced by one made here: the worker gets that one only.
    let unusable = "x-request-id: two words\r\n";
    for r in &runs {
        for (extra, auth) in [(hop, Some("Bearer client-key")), ("", None), (unusable, None)] {
            let mut c = Client::connect(r).await;
            c.send(&post("/v1/chat/completions", &chat_body("headers"), extra)).await;
            let a = c.answer().await;
            assert_eq!(a.status, 200);
            assert_eq!(a.list("x-kept"), "yes", "{a:?}");
            for gone in ["x-worker-hop", "proxy-authenticate", "connection"] {
                assert_eq!(a.list(gone), "", "{gone} is the worker's hop only: {a:?}");
            }
            let head = heads.lock().unwrap().pop().unwrap().to_ascii_lowercase();
            let has = |line: &str| head.lines().any(|l| l == line);
            assert!(has(&format!("host: {}", url.trim_start_matches("http://"))), "{head}");
            assert!(has("content-type: application/json"), "{head}");
            // The client's credentials pass; an anonymous client is never given the router's
            // key for the workers (that takes a --client-api-keys key).
            match auth {
                Some(auth) => {
                    assert!(has(&format!("authorization: {}", auth.to_ascii_lowercase())), "{head}");
                    assert_eq!(head.matches("\nauthorization:").count(), 1, "{head}");
                }
                None => assert!(!head.contains("\nauthorization:"), "{head}"),
            }
            assert!(!head.contains("proxy-authorization"), "a proxy credential is for this hop: {head}");
            // The request's id, one line, the one the client is answered with.
            assert_eq!(head.matches("\nx-request-id:").count(), 1, "{head}");
            let id = a.list("x-request-id").to_ascii_lowercase();
            assert!(has(&format!("x-request-id: {id}")), "{id}: {head}");
            if extra == unusable {
                assert!(id.starts_with("chatcmpl-"), "{id}");
            }
            if extra == hop {
                assert!(has("x-request-id: abc-1") && has("traceparent: 00-t-s-01"), "{head}");
                assert!(
                    has("x-data-parallel-rank: 1"),
                    "the client's rank hint passes when the router has none: {head}"
                );
                for gone in ["x-hop:", "keep-alive:", "te:", "connection: keep-alive"] {
                    assert!(!head.contains(gone), "{gone} is the client's hop only: {head}");
                }
            }
        }
    }
    for r in runs {
        let _ = r.stop.send(());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_that_require_an_api_key_are_followed_and_served() {
    let key = |k: &str| mock_engine::MockEngineConfig { api_key: Some(k.into()), ..engine_config() };
    let (w0, w1) = (MockEngine::spawn(key("s3cret")).await.unwrap(), MockEngine::spawn(key("s3cret")).await.unwrap());
    let mut runs = Vec::new();
    // (fast path, the workers' key, client keys)
    let setups = [
        (true, Some("s3cret"), vec!["client-k"]),
        (false, Some("s3cret"), vec!["client-k"]),
        (true, Some("s3cret"), vec![]),
        (true, None, vec![]),
    ];
    for (fast_proxy, api_key, client_keys) in &setups {
        let mut cfg = config(&[&w0, &w1], PolicyConfig::cache_aware(), true);
        cfg.fast_proxy = *fast_proxy;
        cfg.worker_api_key = api_key.map(str::to_string);
        cfg.client_keys = client_keys.iter().map(|k| k.to_string()).collect();
        cfg.kv_events.as_mut().unwrap().discovery_deadline = Duration::from_millis(500);
        runs.push(start(cfg).await);
    }
    for (r, (_, api_key, client_keys)) in runs.iter().zip(&setups) {
        // With the key, /server_info gave up the publishers: every subscription is up.
        if api_key.is_some() {
            let connected = async || {
                let m = admin_get(&format!("{}/metrics", r.url)).await.text().await.unwrap();
                m.lines().filter(|l| l.starts_with("router_kv_events_connected{")).filter(|l| l.ends_with(" 1")).count()
                    == 2
            };
            until("subscribed to both workers' events", connected).await;
        }
        let mut c = Client::connect(r).await;
        // An anonymous client is never given the workers' key: refused by the router when it
        // takes client keys, else by the worker.
        c.send(&post("/v1/chat/completions", &chat_body("keyed"), "")).await;
        let a = c.answer().await;
        assert_eq!(a.status, 401, "{a:?}");
        if !client_keys.is_empty() {
            assert!(String::from_utf8_lossy(&a.body).contains("--client-api-keys"), "{a:?}");
            // Refused before its body is read: the connection closes.
            let mut c = Client::connect(r).await;
            // A client with a client key reaches the workers with the workers' key.
            c.send(&post("/v1/chat/completions", &chat_body("keyed"), "authorization: Bearer client-k\r\n")).await;
            assert_eq!(c.answer().await.status, 200);
            c.send(&post("/v1/chat/completions", &chat_body("keyed"), "authorization: Bearer wrong\r\n")).await;
            assert_eq!(c.answer().await.status, 401);
        } else {
            let mut c = Client::connect(r).await;
            // A client's own credentials are passed on: the right ones are served, wrong ones refused.
            c.send(&post("/v1/chat/completions", &chat_body("keyed"), "authorization: Bearer s3cret\r\n")).await;
            assert_eq!(c.answer().await.status, 200);
            c.send(&post("/v1/chat/completions", &chat_body("keyed"), "authorization: Bearer wrong\r\n")).await;
            assert_eq!(c.answer().await.status, 401);
        }
    }
    for r in runs {
        let _ = r.stop.send(());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_framing_errors_are_400_and_an_oversized_expect_is_refused_before_continue() {
    let w = MockEngine::spawn(engine_config()).await.unwrap();
    let r = start(config(&[&w], PolicyConfig::RoundRobin, false)).await;
    // A chunked body with a chunk size that overflows, and one with a bare LF: malformed, not large.
    for body in [&b"fffffffffffffffffffff\r\n{}\r\n0\r\n\r\n"[..], b"2\n{}\r\n0\r\n\r\n"] {
        let mut c = Client::connect(&r).await;
        let mut raw = b"POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        raw.extend_from_slice(body);
        c.send(&raw).await;
        let a = c.answer().await;
        assert_eq!(a.status, 400, "{a:?}");
        assert_eq!(a.json()["error"]["type"], "invalid_request_error", "{a:?}");
    }
    // Over the limit with `Expect: 100-continue` on the hyper path (a chunked-free GET-less route
    // that the fast path hands over: /debug/route): 413 at once, never `100 Continue`.
    let mut c = Client::connect(&r).await;
    c.send(
        format!(
            "POST /debug/route HTTP/1.1\r\nhost: r\r\nauthorization: Bearer {ADMIN_KEY}\r\ncontent-length: 100000000\r\n\
             expect: 100-continue\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    let a = c.answer().await;
    assert_eq!(a.status, 413, "{a:?}");
    let _ = r.stop.send(());
}

/// A worker silent mid-stream (a long prefill, a wedged engine): the fast path sends SSE
/// keep-alive comments between events (`--sse-keepalive-secs`), and the stream goes on intact
/// when the worker does; with the fast path off (hyper's relay) the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_event_stream_gets_keep_alive_comments_between_events() {
    for fast in [true, false] {
        let w = MockEngine::spawn(engine_config()).await.unwrap();
        let mut app = config(&[&w], PolicyConfig::RoundRobin, false);
        (app.limits.sse_keepalive, app.fast_proxy) = (Duration::from_millis(100), fast);
        let r = start(app).await;
        w.engine().set_faults(Faults { wedge_mid_stream_next: 1, ..Faults::default() }).await;
        let body = json!({"model": "default", "stream": true, "max_tokens": 3,
                          "messages": [{"role": "user", "content": "hi"}]});
        let url = format!("{}/v1/chat/completions", r.url);
        let mut resp = reqwest::Client::new().post(url).json(&body).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let mut got = Vec::new();
        let keepalive: &[u8] = b": keep-alive\n\n";
        let pinged = tokio::time::timeout(Duration::from_secs(10), async {
            while !got.windows(keepalive.len()).any(|w| w == keepalive) {
                got.extend_from_slice(&resp.chunk().await.unwrap().expect("the stream stays open"));
            }
        });
        assert!(pinged.await.is_ok(), "fast path {fast}: no keep-alive while the worker was silent");
        w.engine().release_held(1);
        while let Some(c) = resp.chunk().await.unwrap() {
            got.extend_from_slice(&c);
        }
        let text = String::from_utf8(got).unwrap();
        assert!(text.starts_with("data: {"), "the first event came before the silence: {text}");
        assert!(text.contains("\n\n: keep-alive\n\n"), "between events: {text}");
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        // Every event but the comments is the worker's, whole.
        for event in text.split("\n\n").filter(|e| !e.is_empty() && !e.starts_with(':')) {
            let data = event.strip_prefix("data: ").unwrap_or_else(|| panic!("{event:?}"));
            assert!(data == "[DONE]" || serde_json::from_str::<Value>(data).is_ok(), "{data}");
        }
        let _ = r.stop.send(());
    }
}
