//! `/server_info` discovery against a real HTTP server on 127.0.0.1: retried
//! with backoff until it answers, a clear error when it never does, and
//! refused when what it answers is over the bounds (dp ranks, body size).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kv_events::discovery::MAX_SERVER_INFO_BYTES;
use kv_events::{DiscoveryError, discover};
use router_types::WorkerUrl;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Answers 503 to the first `failures` requests, then `body` with 200.
async fn server(failures: usize, body: &'static str) -> (WorkerUrl, Arc<AtomicUsize>) {
    server_with(failures, body, true).await
}

/// The same; without `content-length` when `length` is false (the body ends with the connection).
async fn server_with(failures: usize, body: &'static str, length: bool) -> (WorkerUrl, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = WorkerUrl::new(format!("http://{}", listener.local_addr().unwrap()));
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else { return };
            let n = counter.fetch_add(1, Ordering::SeqCst);
            let mut buf = vec![0u8; 4096];
            let _ = socket.read(&mut buf).await;
            let (status, body) = if n < failures { ("503 Service Unavailable", "busy") } else { ("200 OK", body) };
            let length = if length { format!("content-length: {}\r\n", body.len()) } else { String::new() };
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{length}connection: close\r\n\r\n{body}"
            );
            let _ = socket.write_all(response.as_bytes()).await;
        }
    });
    (url, hits)
}

#[tokio::test]
async fn retries_until_the_worker_answers() {
    let body = r#"{"kv_events": {"publisher": "zmq", "endpoint_host": "0.0.0.0", "endpoint_port_base": 5557, "block_size": 16, "dp_size": 1}}"#;
    let (url, hits) = server(2, body).await;
    let client = reqwest::Client::new();
    let found = discover(&client, &url, Duration::from_millis(10), Duration::from_secs(5)).await.unwrap().unwrap();
    assert_eq!(hits.load(Ordering::SeqCst), 3);
    assert_eq!(found.block_size, 16);
    assert_eq!(found.streams[0].endpoint, "tcp://127.0.0.1:5557");
}

#[tokio::test]
async fn a_worker_that_never_answers_is_a_clear_error() {
    // A port bound and kept but never listened on: a connection to it is refused. (A port
    // bound and let go could be handed to a parallel test's server before this one connects:
    // it then answered this test, and both failed.)
    let closed = tokio::net::TcpSocket::new_v4().unwrap();
    closed.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = closed.local_addr().unwrap().port();
    let url = WorkerUrl::new(format!("http://127.0.0.1:{port}"));
    let client = reqwest::Client::new();
    let err = discover(&client, &url, Duration::from_millis(10), Duration::from_millis(300)).await.unwrap_err();
    assert!(matches!(err, DiscoveryError::Unreachable { .. }), "{err}");
    assert!(err.to_string().contains(url.as_str()));
}

#[tokio::test]
async fn a_worker_without_events_says_so() {
    let (url, _) = server(0, r#"{"kv_events": null}"#).await;
    let client = reqwest::Client::new();
    assert_eq!(discover(&client, &url, Duration::from_millis(10), Duration::from_secs(2)).await.unwrap(), None);
}

/// A worker advertising thousands of dp ranks is refused, not followed with
/// one subscriber task per rank; it is not asked again either.
#[tokio::test]
async fn a_worker_advertising_too_many_ranks_is_refused() {
    let body = r#"{"kv_events": {"endpoint_host": "0.0.0.0", "endpoint_port_base": 5557, "block_size": 16, "dp_size": 100000}}"#;
    let (url, hits) = server(0, body).await;
    let client = reqwest::Client::new();
    let err = discover(&client, &url, Duration::from_millis(10), Duration::from_secs(5)).await.unwrap_err();
    assert!(matches!(err, DiscoveryError::TooManyRanks { dp_size: 100_000, max: 256, .. }), "{err}");
    assert_eq!(err.kind(), "too_many_ranks");
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

/// A `/server_info` body over the limit is refused, with or without a
/// `content-length`, without reading it all and without asking again.
#[tokio::test]
async fn an_oversized_server_info_body_is_refused() {
    let padding = " ".repeat(MAX_SERVER_INFO_BYTES);
    let body: &'static str = format!(r#"{{"kv_events": null}}{padding}"#).leak();
    for length in [true, false] {
        let (url, hits) = server_with(0, body, length).await;
        let client = reqwest::Client::new();
        let err = discover(&client, &url, Duration::from_millis(10), Duration::from_secs(5)).await.unwrap_err();
        assert!(matches!(err, DiscoveryError::Invalid { .. }), "{err}");
        assert!(err.to_string().contains("larger than"), "content-length {length}: {err}");
        assert_eq!(hits.load(Ordering::SeqCst), 1);
    }
}
