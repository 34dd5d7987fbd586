//! The replay client against a real publisher's ROUTER socket on 127.0.0.1:
//! a range stops at its end, and a replay over its batch or byte limit, or
//! past its deadline, is refused whole. Every wait has a timeout.

mod common;

use std::time::Duration;

use common::{ReplayStub, WAIT, batch};
use kv_events::replay::{ReplayError, ReplayLimits, fetch_range};
use kv_events::{Publisher, PublisherConfig};

async fn publisher_with(batches: i64) -> Publisher {
    let publisher = Publisher::bind(PublisherConfig::loopback()).await.unwrap();
    for tag in 0..batches {
        publisher.publish(&batch(tag)).await.unwrap();
    }
    publisher
}

fn limits(max_batches: usize, max_bytes: usize) -> ReplayLimits {
    ReplayLimits { max_batches, max_bytes, timeout: WAIT }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_stops_at_its_end_and_within_the_limits() {
    let publisher = publisher_with(10).await;
    let endpoint = publisher.replay_endpoint().unwrap();
    let got = fetch_range(endpoint, 2, Some(5), &limits(3, usize::MAX)).await.unwrap();
    assert_eq!(got.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![2, 3, 4], "3 batches: at the limit, not over");
    let all = fetch_range(endpoint, 0, None, &limits(10, usize::MAX)).await.unwrap();
    assert_eq!(all.len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_over_its_batch_limit_is_refused() {
    let publisher = publisher_with(10).await;
    let endpoint = publisher.replay_endpoint().unwrap();
    let err = fetch_range(endpoint, 0, None, &limits(9, usize::MAX)).await.unwrap_err();
    assert!(matches!(err, ReplayError::OverLimit { what: "batches", limit: 9 }), "{err}");
    assert_eq!(err.kind(), "over_limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_over_its_byte_limit_is_refused() {
    let publisher = publisher_with(10).await;
    let endpoint = publisher.replay_endpoint().unwrap();
    let all = fetch_range(endpoint, 0, None, &limits(100, usize::MAX)).await.unwrap();
    let total: usize = all.iter().map(|(_, p)| p.len()).sum();
    assert!(fetch_range(endpoint, 0, None, &limits(100, total)).await.is_ok(), "at the limit");
    let err = fetch_range(endpoint, 0, None, &limits(100, total - 1)).await.unwrap_err();
    assert!(matches!(err, ReplayError::OverLimit { what: "bytes", .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_replay_socket_times_out_at_the_deadline() {
    let mut stub = ReplayStub::bind().await;
    stub.script();
    let limits = ReplayLimits { timeout: Duration::from_millis(200), ..ReplayLimits::default() };
    let endpoint = stub.endpoint.clone();
    let fetch = tokio::spawn(async move { fetch_range(&endpoint, 7, None, &limits).await });
    let request = stub.request().await;
    assert_eq!(request.from, 7);
    drop(request);
    let err = tokio::time::timeout(WAIT, fetch).await.expect("the deadline holds").unwrap().unwrap_err();
    assert!(matches!(err, ReplayError::Timeout(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_socket_taken_down_refuses_replays_then_serves_its_buffer_again() {
    let publisher = std::sync::Arc::new(publisher_with(5).await);
    let endpoint = publisher.replay_endpoint().unwrap().to_owned();
    let short = ReplayLimits { timeout: Duration::from_millis(300), ..limits(100, usize::MAX) };
    let down = tokio::spawn({
        let p = publisher.clone();
        async move { p.replay_down(Duration::from_millis(600)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let err = fetch_range(&endpoint, 0, None, &short).await.unwrap_err();
    assert!(matches!(err, ReplayError::Socket(_) | ReplayError::Timeout(_)), "{err}");
    // The live stream goes on while the replay socket is down.
    publisher.publish(&batch(5)).await.unwrap();
    tokio::time::timeout(WAIT, down).await.unwrap().unwrap().unwrap();
    let all = fetch_range(&endpoint, 0, None, &limits(100, usize::MAX)).await.unwrap();
    assert_eq!(all.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4, 5], "its buffer intact");
}
