//! `sgl-router kv-events` as an operator runs it: workers found through
//! `/server_info` (real HTTP on 127.0.0.1) and through explicit flags, a
//! worker with the wrong page size refused with a reason and a metric, real
//! ZMQ publishers feeding the index, Prometheus text at the end.

use std::num::NonZeroUsize;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kv_events::{Publisher, PublisherConfig};
use renderer::{HashMode, PageHasher};
use router_types::{EngineBlockHash, EventBatch, KvEvent, StoredBlocks};
use serde_json::Value;

/// A worker answering every request with `body`, except `/server_info`: 503 until `first` says
/// another worker's `/server_info` was served, then twice more (the router's discovery retries
/// after 50 then 100 ms), so that worker fixes the pool's page size first. Counts its own
/// `/server_info` answers in `served`.
async fn gated(body: String, first: Option<Arc<AtomicUsize>>, served: Arc<AtomicUsize>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let refused_after = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else { return };
            let (body, first, served, refused_after) =
                (body.clone(), first.clone(), served.clone(), refused_after.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let n = socket.read(&mut buf).await.unwrap_or(0);
                let info = buf[..n].starts_with(b"GET /server_info");
                let wait = info
                    && first.as_ref().is_some_and(|f| {
                        f.load(Ordering::SeqCst) == 0 || refused_after.fetch_add(1, Ordering::SeqCst) < 2
                    });
                let response = if wait {
                    "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_owned()
                } else {
                    if info {
                        served.fetch_add(1, Ordering::SeqCst);
                    }
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    )
                };
                let _ = socket.write_all(response.as_bytes()).await;
            });
        }
    });
    url
}

fn port(endpoint: &str) -> u16 {
    endpoint.rsplit(':').next().unwrap().parse().unwrap()
}

fn store(tokens: &[u32], sglang: bool) -> EventBatch {
    let hashes = PageHasher::new(NonZeroUsize::new(4).unwrap(), HashMode::Unigram).block_hashes(tokens, None).unwrap();
    let block_hashes = hashes
        .iter()
        .enumerate()
        .map(|(i, h)| if sglang { EngineBlockHash::I64(h.0) } else { EngineBlockHash::U64(u64::MAX - i as u64) })
        .collect();
    EventBatch {
        ts: 0.0,
        dp_rank: None,
        events: vec![KvEvent::Stored(StoredBlocks::plain(
            block_hashes,
            None,
            tokens.iter().map(|t| u64::from(*t)).collect(),
            4,
        ))],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_discovered_and_explicit_workers_and_refuses_a_page_size_mismatch() {
    let sglang = Publisher::bind(PublisherConfig::loopback()).await.unwrap();
    let vllm = Publisher::bind(PublisherConfig::loopback()).await.unwrap();
    let info = |block: usize, p: &Publisher| {
        format!(
            r#"{{"kv_events": {{"publisher": "zmq", "endpoint_host": "0.0.0.0", "endpoint_port_base": {}, "replay_endpoint_port_base": {}, "topic": "", "block_size": {block}, "dp_size": 1}}}}"#,
            port(p.endpoint()),
            port(p.replay_endpoint().unwrap())
        )
    };
    // Discovery runs in parallel and the first worker followed fixes the page size: `b` is
    // made to wait for `a`'s answer, so `a`'s 4 is the pool's and `b`'s 8 the mismatch.
    let (a_served, b_served) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let a = gated(info(4, &sglang), None, a_served.clone()).await;
    let b = gated(info(8, &sglang), Some(a_served.clone()), b_served.clone()).await;
    let c = "http://vllm-worker:8000";
    let bin = env!("CARGO_BIN_EXE_sgl-router");
    let child = Command::new(bin)
        .args(["kv-events", "--worker-urls", &format!("{a},{b},{c}")])
        .args(["--kv-events-endpoint", &format!("{c}={}", vllm.endpoint())])
        .args(["--kv-events-replay-endpoint", &format!("{c}={}", vllm.replay_endpoint().unwrap())])
        .args(["--kv-events-block-size", "4", "--interval-ms", "200", "--duration-secs", "3", "--metrics"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for i in 0..20u32 {
        sglang.publish(&store(&(i * 100..i * 100 + 8).collect::<Vec<_>>(), true)).await.unwrap();
        vllm.publish(&store(&(50_000 + i * 100..50_000 + i * 100 + 12).collect::<Vec<_>>(), false)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()).await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<Value> =
        stdout.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect();
    let first = &lines[0];
    assert_eq!(first["block_size"], 4);
    let status = |url: &str| first["workers"].as_array().unwrap().iter().find(|w| w["worker"] == url).unwrap().clone();
    assert_eq!(status(&a)["status"], "subscribed");
    assert_eq!(status(c)["status"], "subscribed");
    assert_eq!(status(&b)["status"], "refused");
    assert!(status(&b)["reason"].as_str().unwrap().contains("page size 8"), "{}", status(&b));
    assert!(b_served.load(Ordering::SeqCst) >= 1, "b was asked and answered after a");
    let last = lines.last().unwrap();
    // 20 chains of 2 blocks from the SGLang worker, 20 of 3 from the vLLM one.
    assert_eq!(last["nodes"], 100, "{last}");
    assert_eq!(last["hash_mismatches"], 0);
    assert_eq!(last["connected_streams"], 2);
    assert!(stdout.contains("router_kv_events_refused_workers_total{reason=\"block_size\"} 1"), "{stdout}");
    assert!(stdout.contains("# TYPE router_kv_events_lag_seconds histogram"));
}
