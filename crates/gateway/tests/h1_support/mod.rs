//! Shared by the HTTP/1.1 front-end tests (`h1_limits`, `h1_strict`): a
//! gateway on 127.0.0.1 built directly (no router binary), hand-rolled
//! workers that answer each POST with a scripted reply, and a raw client.
//! Every network wait has a deadline; readiness is awaited, never slept for.
#![allow(dead_code)] // not every test binary uses all of it

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use gateway::{ClientLimits, Gateway, GatewayConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Longest any single network wait of a test may take.
pub(crate) const WAIT: Duration = Duration::from_secs(5);

/// Limits small enough for tests: every deadline 300 ms.
pub(crate) fn limits() -> ClientLimits {
    let short = Duration::from_millis(300);
    ClientLimits {
        header_read_timeout: short,
        body_read_timeout: short,
        body_stall_timeout: Duration::ZERO,
        idle_timeout: short,
        max_connections: 64,
        upstream_idle_timeout: short,
        sse_keepalive: Duration::ZERO,
    }
}

/// A gateway serving on 127.0.0.1; stops when dropped.
pub(crate) struct Running {
    pub(crate) addr: SocketAddr,
    pub(crate) gw: Arc<Gateway>,
    stop: CancellationToken,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Starts a gateway in front of `workers` (URLs) with `limits`, its fast path on or off.
pub(crate) async fn start(workers: &[&str], limits: ClientLimits, fast: bool) -> Running {
    start_with(workers, limits, fast, |_| {}).await
}

/// [`start`], with the gateway's configuration changed by `tweak` first.
pub(crate) async fn start_with(
    workers: &[&str],
    limits: ClientLimits,
    fast: bool,
    tweak: impl FnOnce(&mut GatewayConfig),
) -> Running {
    start_fleet(workers, limits, fast, tweak, |_| {}).await
}

/// [`start_with`], with the fleet's configuration changed by `fleet_tweak` too.
pub(crate) async fn start_fleet(
    workers: &[&str],
    limits: ClientLimits,
    fast: bool,
    tweak: impl FnOnce(&mut GatewayConfig),
    fleet_tweak: impl FnOnce(&mut fleet::FleetConfig),
) -> Running {
    let stop = CancellationToken::new();
    let urls: Vec<router_types::WorkerUrl> =
        workers.iter().map(|u| router_types::WorkerUrl::parse(u).unwrap()).collect();
    let mut fleet_config = fleet::FleetConfig {
        health: fleet::HealthConfig {
            interval: Duration::from_secs(3600),
            failure_threshold: 1,
            success_threshold: 1,
            ..Default::default()
        },
        breaker: fleet::BreakerConfig::default(),
        index_retention: Duration::from_secs(300),
        load_poll: Duration::ZERO,
        api_key: None,
        events: None,
        proxied_paths: gateway::PROXIED_PATHS,
        dp_aware: false,
        rank_header: fleet::RankHeader::Auto,
        tls: fleet::WorkerTls::default(),
        liveness: fleet::liveness::LivenessConfig::off(),
    };
    fleet_tweak(&mut fleet_config);
    let fleet = fleet::Fleet::start(fleet_config, None, &urls, stop.clone());
    let mut config = GatewayConfig {
        max_body_bytes: gateway::DEFAULT_MAX_BODY_BYTES,
        request_timeout: Duration::from_secs(10),
        max_concurrent: 64,
        credit_pending: false,
        model_id: "default".into(),
        worker_api_key: None,
        limits,
        control_plane_keys: Vec::new(),
        client_keys: Vec::new(),
        max_request_memory: 1 << 30,
        render_threads: 1,
        chain_memo_pages: renderer::DEFAULT_CHAIN_MEMO_PAGES,
        scheduler: None,
        tenants: Default::default(),
        tenant_limits: None,
        jwt: None,
        audit: false,
        upstream_pool_idle: gateway::DEFAULT_UPSTREAM_POOL_IDLE,
        upstream_http2: false,
        cache_trace: Default::default(),
        reasoning_parser: None,
        tool_call_parser: None,
        tracer: None,
        routing_key_headers: Vec::new(),
        shared_state: None,
        admin_listener: false,
        retry: gateway::RetryConfig { initial_backoff: Duration::from_millis(1), ..Default::default() },
        queue_size: 0,
        queue_timeout: Duration::from_secs(1),
        duration_buckets: gateway::metrics::LATENCY_BUCKETS.to_vec(),
        rate_limit: None,
        request_id_headers: gateway::pipeline::context::DEFAULT_REQUEST_ID_HEADERS
            .iter()
            .map(|h| h.to_string())
            .collect(),
        cors: Default::default(),
        tls: None,
        index_snapshot: Default::default(),
    };
    tweak(&mut config);
    let renderer = Arc::new(renderer::Renderer::builtin().unwrap());
    let policy = Arc::new(policy::RoundRobin::default());
    let gw = Arc::new(Gateway::new(config, fleet.clone(), policy, None, renderer));
    // The fleet probes new workers at once; a worker is routed to once its probe answered.
    for _ in 0..200 {
        if fleet.all().iter().all(|w| matches!(w.state(), fleet::State::Healthy | fleet::State::Down)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(gateway::serve(listener, gw.clone(), fast, stop.clone()));
    Running { addr, gw, stop }
}

/// Waits (polling every 10 ms, up to [`WAIT`]) until `cond` holds.
pub(crate) async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let give_up = tokio::time::Instant::now() + WAIT;
    while !cond() {
        assert!(tokio::time::Instant::now() < give_up, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What a hand-rolled worker does with one POST.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Reply {
    /// Sends these bytes, then serves the next request on the connection.
    Send(&'static str),
    /// Sends these bytes after a delay.
    Later(Duration, &'static str),
    /// Sends the first bytes, pauses, then sends the rest.
    Then(&'static str, Duration, &'static str),
    /// Sends these bytes, then says nothing more (the connection held open).
    Stall(&'static str),
    /// Closes the connection without a word (the request read whole).
    Drop,
}

/// A hand-rolled HTTP/1.1 worker: `GET /health` is 200, other GETs 404, the
/// n-th POST gets `replies[n]` (the last one repeats).
pub(crate) struct RawWorker {
    pub(crate) url: String,
    /// POSTs received.
    pub(crate) posts: Arc<AtomicUsize>,
    /// Connections the router closed while the worker held them open after a [`Reply::Stall`].
    pub(crate) hung_up: Arc<AtomicUsize>,
    /// The head of every POST received (request line and header lines, `\n` between them).
    pub(crate) heads: Arc<std::sync::Mutex<Vec<String>>>,
}

impl RawWorker {
    pub(crate) async fn spawn(replies: Vec<Reply>) -> RawWorker {
        Self::spawn_with_gets(replies, Vec::new()).await
    }

    /// A worker that also answers `GET path` with the JSON `body` for each of `gets`.
    pub(crate) async fn spawn_with_gets(replies: Vec<Reply>, gets: Vec<(&'static str, String)>) -> RawWorker {
        let gets: Arc<Vec<(&'static str, &'static str)>> = Arc::new(
            gets.into_iter()
                .map(|(p, b)| {
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{b}",
                        b.len()
                    );
                    (p, &*Box::leak(answer.into_boxed_str()))
                })
                .collect(),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (posts, hung_up) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (p, h, replies, hd) = (posts.clone(), hung_up.clone(), Arc::new(replies), heads.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let conn = worker_connection(tcp, replies.clone(), p.clone(), h.clone(), hd.clone(), gets.clone());
                tokio::spawn(conn);
            }
        });
        RawWorker { url, posts, hung_up, heads }
    }

    /// The heads of the POSTs received so far.
    pub(crate) fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }

    pub(crate) fn posts(&self) -> usize {
        self.posts.load(Ordering::SeqCst)
    }
}

async fn worker_connection(
    tcp: TcpStream,
    replies: Arc<Vec<Reply>>,
    posts: Arc<AtomicUsize>,
    hung_up: Arc<AtomicUsize>,
    heads: Arc<std::sync::Mutex<Vec<String>>>,
    gets: Arc<Vec<(&'static str, &'static str)>>,
) {
    // A worker waits for the router as long as it likes (its connections end with the test).
    let mut c = Client { tcp, buf: Vec::new(), patient: true };
    loop {
        let Some(request) = c.try_line().await else { return };
        let mut length = 0;
        let mut head = request.clone();
        loop {
            let Some(line) = c.try_line().await else { return };
            if line.is_empty() {
                break;
            }
            head.push('\n');
            head.push_str(&line);
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
        }
        if !c.want(length).await {
            return;
        }
        c.buf.drain(..length);
        let path = request.split(' ').nth(1).unwrap_or("");
        let scripted = gets.iter().find(|(p, _)| *p == path.split('?').next().unwrap_or(""));
        let reply = if request.starts_with("GET /health ") {
            Reply::Send("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        } else if let (true, Some((_, answer))) = (request.starts_with("GET "), scripted) {
            Reply::Send(answer)
        } else if request.starts_with("GET ") {
            Reply::Send("HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
        } else {
            heads.lock().unwrap().push(head);
            let n = posts.fetch_add(1, Ordering::SeqCst);
            replies[n.min(replies.len() - 1)]
        };
        match reply {
            Reply::Send(a) => c.send(a.as_bytes()).await,
            Reply::Later(after, a) => {
                tokio::time::sleep(after).await;
                c.send(a.as_bytes()).await;
            }
            Reply::Then(first, pause, rest) => {
                c.send(first.as_bytes()).await;
                tokio::time::sleep(pause).await;
                c.send(rest.as_bytes()).await;
            }
            Reply::Stall(a) => {
                c.send(a.as_bytes()).await;
                // Held open, silent, until the router lets go.
                let mut sink = [0u8; 1024];
                while matches!(c.tcp.read(&mut sink).await, Ok(n) if n > 0) {}
                hung_up.fetch_add(1, Ordering::SeqCst);
                return;
            }
            Reply::Drop => return,
        }
    }
}

/// An answer read off a raw connection.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Answer {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {:?} ({:?})", String::from_utf8_lossy(&self.body), self.headers))
    }

    /// Asserts a JSON error answer `{"error": {"message", "type", "code"}}` with `status`.
    pub(crate) fn assert_error(&self, status: u16, kind: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.header("content-type"), Some("application/json"), "{self:?}");
        let v = self.json();
        assert_eq!(
            (v["error"]["code"].as_u64(), v["error"]["type"].as_str()),
            (Some(status.into()), Some(kind)),
            "{v}"
        );
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    }
}

/// A raw client connection that reads answers one by one (bytes past an answer are kept).
pub(crate) struct Client {
    pub(crate) tcp: TcpStream,
    pub(crate) buf: Vec<u8>,
    /// Reads wait without a deadline (the workers' side), else up to [`WAIT`].
    patient: bool,
}

impl Client {
    pub(crate) async fn connect(addr: SocketAddr) -> Client {
        let tcp = tokio::time::timeout(WAIT, TcpStream::connect(addr)).await.unwrap().unwrap();
        Client { tcp, buf: Vec::new(), patient: false }
    }

    pub(crate) async fn send(&mut self, raw: &[u8]) {
        tokio::time::timeout(WAIT, self.tcp.write_all(raw)).await.unwrap().unwrap();
    }

    /// Reads once more (up to [`WAIT`]); 0 at end of stream or on a reset.
    pub(crate) async fn fill(&mut self) -> usize {
        let mut chunk = [0u8; 16384];
        let read = if self.patient {
            self.tcp.read(&mut chunk).await
        } else {
            tokio::time::timeout(WAIT, self.tcp.read(&mut chunk)).await.expect("no answer in time")
        };
        let n = read.unwrap_or(0);
        self.buf.extend_from_slice(&chunk[..n]);
        n
    }

    /// Reads until `n` bytes are buffered; false at end of stream.
    pub(crate) async fn want(&mut self, n: usize) -> bool {
        while self.buf.len() < n {
            if self.fill().await == 0 {
                return false;
            }
        }
        true
    }

    /// The next line, without its CRLF; `None` at end of stream.
    pub(crate) async fn try_line(&mut self) -> Option<String> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8(self.buf[..i].to_vec()).unwrap();
                self.buf.drain(..i + 2);
                return Some(line);
            }
            if self.fill().await == 0 {
                return None;
            }
        }
    }

    pub(crate) async fn line(&mut self) -> String {
        self.try_line().await.expect("connection closed mid-line")
    }

    /// The next final answer (interim 1xx ones skipped), its body read whole.
    pub(crate) async fn answer(&mut self) -> Answer {
        let (status, headers) = loop {
            let status_line = self.line().await;
            let status: u16 =
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
            if status >= 200 {
                break (status, headers);
            }
        };
        let mut a = Answer { status, headers, body: Vec::new() };
        if let Some(n) = a.header("content-length").map(|v| v.parse::<usize>().unwrap()) {
            assert!(self.want(n).await, "body cut short: {a:?}");
            a.body = self.buf.drain(..n).collect();
        } else if a.header("transfer-encoding").is_some_and(|te| te.ends_with("chunked")) {
            loop {
                let size = usize::from_str_radix(self.line().await.split(';').next().unwrap(), 16).unwrap();
                if size == 0 {
                    assert_eq!(self.line().await, "", "no trailers");
                    break;
                }
                assert!(self.want(size + 2).await, "chunk cut short: {a:?}");
                a.body.extend(self.buf.drain(..size));
                assert_eq!(self.buf.drain(..2).collect::<Vec<_>>(), b"\r\n");
            }
        }
        a
    }

    /// True once the router has closed the connection (nothing more was sent).
    pub(crate) async fn closed(&mut self) -> bool {
        self.buf.is_empty() && self.fill().await == 0
    }
}

/// A POST with a sized body.
pub(crate) fn post(path: &str, body: &[u8], extra: &str) -> Vec<u8> {
    let mut raw = format!(
        "POST {path} HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{extra}\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(body);
    raw
}

/// A chat request's body (`stream` as asked).
pub(crate) fn chat(stream: bool) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "model": "default",
        "messages": [{"role": "user", "content": "hello"}],
        "stream": stream,
    }))
    .unwrap()
}
