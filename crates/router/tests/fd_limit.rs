//! The real binary under a small open-file limit (issue #9): `--max-connections`
//! (16,384 by default) is capped to what `ulimit -n` leaves after a reserve, so
//! clients holding more connections than that never take the descriptors the
//! router needs. It stops accepting at the cap instead of failing accepts with
//! "Too many open files", keeps answering on the connections it holds (`/health`),
//! still reaches its worker, and accepts again once clients leave.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use mock_engine::{MockEngine, MockEngineConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// The router's open-file limit: a quarter (64) is kept, 192 connections allowed.
const NOFILE: u64 = 256;
const CAP: usize = 192;
/// Client connections opened at once: more than the cap, more than the limit.
const CLIENTS: usize = 300;
/// Every wait's deadline.
const WAIT: Duration = Duration::from_secs(20);

/// The router process; killed on drop.
struct Router(Child);

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The router's URL from its first line on standard output; the rest of that output is read to
/// its end (a closed pipe would fail the router's later lines: a panic on EPIPE).
async fn listening_url(router: &mut Router) -> String {
    let stdout = BufReader::new(router.0.stdout.take().unwrap());
    let (first_tx, first) = tokio::sync::oneshot::channel::<String>();
    std::thread::spawn(move || {
        let mut lines = stdout.lines().map_while(Result::ok);
        if let Some(line) = lines.next() {
            let _ = first_tx.send(line);
        }
        lines.for_each(drop);
    });
    let first = tokio::time::timeout(WAIT, first).await.expect("the listening line in time").expect("a listening line");
    first.strip_prefix("sgl-router listening on ").expect("the listening line").to_string()
}

/// One request on `conn` (keep-alive): the status and the body.
async fn request(conn: &mut TcpStream, method: &str, path: &str, body: &str) -> (u16, String) {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: router\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    tokio::time::timeout(WAIT, async {
        conn.write_all(head.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = conn.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the router closed the connection: {}", String::from_utf8_lossy(&buf));
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf).into_owned();
            let Some((head, rest)) = text.split_once("\r\n\r\n") else { continue };
            let length = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>()))
                .expect("a content-length")
                .unwrap();
            if rest.len() >= length {
                let status = head.split(' ').nth(1).unwrap().parse().unwrap();
                return (status, rest[..length].to_string());
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{method} {path}: no answer within {WAIT:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_clients_than_the_open_file_limit_leaves_room_for() {
    let engine =
        MockEngine::spawn(MockEngineConfig { fast: true, default_max_tokens: 4, ..MockEngineConfig::default() })
            .await
            .unwrap();
    let child = Command::new("bash")
        .args(["-c", &format!("ulimit -n {NOFILE} && exec \"$0\" \"$@\""), env!("CARGO_BIN_EXE_sgl-router")])
        .args(["--worker-urls", &engine.url(), "--host", "127.0.0.1", "--port", "0", "--log-level", "info"])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut router = Router(child);
    // Every log line, as it comes: the test waits on the ones it needs.
    let (log_tx, mut log) = mpsc::channel::<String>(1024);
    let stderr = BufReader::new(router.0.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if log_tx.blocking_send(line).is_err() {
                return;
            }
        }
    });
    let url = listening_url(&mut router).await;
    let addr = url.strip_prefix("http://").unwrap().to_string();
    let mut seen = Vec::new();
    let mut wait_for = async |what: &str, seen: &mut Vec<String>| {
        let found = tokio::time::timeout(WAIT, async {
            while let Some(line) = log.recv().await {
                seen.push(line.clone());
                if line.contains(what) {
                    return line;
                }
            }
            panic!("the router's log ended before {what:?}: {seen:#?}");
        })
        .await;
        found.unwrap_or_else(|_| panic!("no {what:?} in the log within {WAIT:?}: {seen:#?}"))
    };
    let lowered = wait_for("--max-connections lowered", &mut seen).await;
    assert!(lowered.contains(&format!("effective={CAP}")), "{lowered}");
    assert!(lowered.contains(&format!("nofile_soft_limit={NOFILE}")), "{lowered}");

    // A client connection the router holds, then more clients than it may hold.
    let mut held = TcpStream::connect(&addr).await.unwrap();
    assert_eq!(request(&mut held, "GET", "/health", "").await.0, 200);
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        clients.push(tokio::time::timeout(WAIT, TcpStream::connect(&addr)).await.unwrap().unwrap());
    }
    wait_for("connection cap reached", &mut seen).await;

    // At the cap, the connections held are served, and the router still reaches its worker
    // (its first proxied request: a new upstream connection, a descriptor of the reserve).
    assert_eq!(request(&mut held, "GET", "/health", "").await.0, 200);
    let chat = r#"{"model": "default", "messages": [{"role": "user", "content": "hello"}]}"#;
    let (status, body) = request(&mut held, "POST", "/v1/chat/completions", chat).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(request(&mut held, "GET", "/readiness", "").await.0, 200);

    // The clients leave: a new connection is accepted and answered again.
    drop(clients);
    let mut fresh = tokio::time::timeout(WAIT, TcpStream::connect(&addr)).await.unwrap().unwrap();
    assert_eq!(request(&mut fresh, "GET", "/health", "").await.0, 200);
    while let Ok(line) = log.try_recv() {
        seen.push(line);
    }
    let exhausted: Vec<&String> =
        seen.iter().filter(|l| l.contains("Too many open files") || l.contains("accept failed")).collect();
    assert!(exhausted.is_empty(), "the router ran out of descriptors: {exhausted:#?}");
}

/// The router process's resident memory now and at its peak, in bytes.
fn rss(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Issue 28 #8: the memory budget holds what large requests really hold. Eight 1 MB completions at
/// once through a policy that tokenizes them (the built-in byte-level model: a million tokens
/// each, through the `tokenizers` pipeline, about 150 bytes per body byte while it runs): each
/// is admitted only with the tokenizer's working memory reserved, so the router's peak resident
/// memory stays under its budget plus a fixed overhead, and the others are refused with 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_large_prompts_stays_within_the_memory_budget() {
    const BUDGET: u64 = 256 << 20;
    const OVERHEAD: u64 = 64 << 20;
    let engine = MockEngine::spawn(MockEngineConfig {
        fast: true,
        default_max_tokens: 1,
        max_body_bytes: 8 << 20,
        ..MockEngineConfig::default()
    })
    .await
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_sgl-router"))
        .args(["--worker-urls", &engine.url(), "--host", "127.0.0.1", "--port", "0", "--policy", "min_ttft"])
        .args(["--max-request-memory-bytes", &BUDGET.to_string(), "--log-level", "warn"])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut router = Router(child);
    let url = listening_url(&mut router).await;
    let http = reqwest::Client::new();
    let ready = async || http.get(format!("{url}/readiness")).send().await.is_ok_and(|r| r.status() == 200);
    tokio::time::timeout(WAIT, async {
        while !ready().await {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the router is ready in time");
    let (base, _) = rss(router.0.id());
    let body = format!(r#"{{"model": "default", "max_tokens": 1, "prompt": "{}"}}"#, "word ".repeat(200_000));
    let sends = (0..8).map(|_| {
        let (http, url, body) = (http.clone(), url.clone(), body.clone());
        tokio::spawn(async move {
            let r = http.post(format!("{url}/v1/completions")).header("content-type", "application/json").body(body);
            r.timeout(Duration::from_secs(120)).send().await.unwrap().status().as_u16()
        })
    });
    let mut statuses = Vec::new();
    for s in sends.collect::<Vec<_>>() {
        statuses.push(s.await.unwrap());
    }
    statuses.sort();
    let (_, peak) = rss(router.0.id());
    assert!(statuses.iter().all(|s| *s == 200 || *s == 429), "{statuses:?}");
    assert!(statuses.contains(&200) && statuses.contains(&429), "{statuses:?}");
    let grew = peak.saturating_sub(base);
    assert!(
        grew <= BUDGET + OVERHEAD,
        "peak {} MiB over {} MiB at rest: budget {} MiB ({statuses:?})",
        grew >> 20,
        base >> 20,
        BUDGET >> 20
    );
}
