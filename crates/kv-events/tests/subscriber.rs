//! The subscriber against a real ZMQ publisher on 127.0.0.1: in-order batches,
//! a gap repaired by replay, a late joiner, a publisher restart, END_SEQ, and
//! an undecodable payload. Every wait has a timeout.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kv_events::{
    EventMetrics, Publisher, PublisherConfig, StreamEndpoints, StreamMessage, StreamUpdate, SubscriberConfig,
    spawn_subscriber,
};
use router_types::{DpRank, EngineBlockHash, EventBatch, KvEvent, WorkerKey, WorkerUrl};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(10);

fn batch(tag: i64) -> EventBatch {
    EventBatch {
        ts: 1.0,
        dp_rank: None,
        events: vec![KvEvent::Removed {
            block_hashes: vec![EngineBlockHash::I64(tag)],
            tier: router_types::Tier::Device,
            group_idx: None,
        }],
    }
}

fn tag_of(m: &StreamMessage) -> Option<i64> {
    match &m.update {
        StreamUpdate::Batch(d) => match &d.batch.events[0] {
            KvEvent::Removed { block_hashes, .. } => match block_hashes[0] {
                EngineBlockHash::I64(t) => Some(t),
                _ => None,
            },
            _ => None,
        },
        StreamUpdate::Reset => None,
    }
}

struct Harness {
    publisher: Publisher,
    rx: mpsc::Receiver<StreamMessage>,
    metrics: Arc<EventMetrics>,
    cancel: CancellationToken,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

async fn harness(publish_before_subscribe: usize) -> Harness {
    let publisher = Publisher::bind(PublisherConfig::loopback()).await.unwrap();
    for i in 0..publish_before_subscribe {
        publisher.publish(&batch(i as i64)).await.unwrap();
    }
    let (tx, rx) = mpsc::channel(4);
    let metrics = Arc::new(EventMetrics::default());
    let cancel = CancellationToken::new();
    let stream = StreamEndpoints {
        key: WorkerKey::new(WorkerUrl::new("http://w:1"), DpRank(0)),
        endpoint: publisher.endpoint().to_string(),
        replay_endpoint: publisher.replay_endpoint().map(str::to_string),
        topic: String::new(),
    };
    spawn_subscriber(stream, SubscriberConfig::default(), tx, metrics.clone(), cancel.clone());
    Harness { publisher, rx, metrics, cancel }
}

async fn next(h: &mut Harness) -> StreamMessage {
    tokio::time::timeout(WAIT, h.rx.recv()).await.expect("a message in time").expect("channel open")
}

/// Publishes until the subscriber has joined: the first batches may be lost to
/// the PUB slow-joiner effect, but the subscriber replays them from seq 0.
async fn publish_until_joined(h: &mut Harness) -> Vec<StreamMessage> {
    let mut got = Vec::new();
    for i in 0..100 {
        h.publisher.publish(&batch(100 + i)).await.unwrap();
        if let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(100), h.rx.recv()).await {
            got.push(m);
            break;
        }
    }
    // Drain what the replay delivered.
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(300), h.rx.recv()).await {
        got.push(m);
    }
    got
}

fn seqs(ms: &[StreamMessage]) -> Vec<u64> {
    ms.iter().map(|m| m.seq).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_order_then_gap_repaired_by_replay() {
    let mut h = harness(0).await;
    let joined = publish_until_joined(&mut h).await;
    let n = joined.len() as u64;
    assert_eq!(seqs(&joined), (0..n).collect::<Vec<_>>(), "every batch from seq 0, in order, once");
    // Two batches kept out of the live stream: the subscriber must repair them.
    h.publisher.drop_next(2);
    for i in 0..3 {
        h.publisher.publish(&batch(1000 + i)).await.unwrap();
    }
    let got: Vec<StreamMessage> = vec![next(&mut h).await, next(&mut h).await, next(&mut h).await];
    assert_eq!(seqs(&got), vec![n, n + 1, n + 2]);
    assert_eq!(got.iter().map(tag_of).collect::<Vec<_>>(), vec![Some(1000), Some(1001), Some(1002)]);
    assert!(EventMetrics::get(&h.metrics.replay_repaired) >= 1);
    assert_eq!(EventMetrics::get(&h.metrics.resets), 0, "replayed overlap is not a restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_joiner_replays_from_the_start() {
    let mut h = harness(5).await;
    let joined = publish_until_joined(&mut h).await;
    assert!(joined.len() >= 6);
    assert_eq!(seqs(&joined), (0..joined.len() as u64).collect::<Vec<_>>());
    assert_eq!(tag_of(&joined[0]), Some(0), "the batches published before the subscription came by replay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_and_end_seq_reset_the_stream() {
    let mut h = harness(0).await;
    publish_until_joined(&mut h).await;
    h.publisher.restart().await;
    h.publisher.publish(&batch(7)).await.unwrap();
    let reset = next(&mut h).await;
    assert_eq!(reset.update, StreamUpdate::Reset);
    let first = next(&mut h).await;
    assert_eq!((first.seq, tag_of(&first)), (0, Some(7)));
    h.publisher.send_end().await.unwrap();
    assert_eq!(next(&mut h).await.update, StreamUpdate::Reset);
    h.publisher.publish(&batch(8)).await.unwrap();
    // After END_SEQ the stream starts over: seq 1 from this publisher is a late join, replayed from 0.
    let mut after = [next(&mut h).await, next(&mut h).await];
    after.sort_by_key(|m| m.seq);
    assert_eq!(after.iter().map(tag_of).collect::<Vec<_>>(), vec![Some(7), Some(8)]);
    assert_eq!(EventMetrics::get(&h.metrics.resets), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_payload_is_counted_and_skipped() {
    let mut h = harness(0).await;
    publish_until_joined(&mut h).await;
    let replays = |m: &EventMetrics| EventMetrics::get(&m.replay_repaired) + EventMetrics::get(&m.replay_failed);
    let replays_before = replays(&h.metrics);
    h.publisher.publish_raw(Bytes::from_static(&[0x93, 0xc1, 0x00])).await.unwrap();
    h.publisher.publish(&batch(9)).await.unwrap();
    let m = next(&mut h).await;
    assert_eq!(tag_of(&m), Some(9));
    assert_eq!(EventMetrics::get(&h.metrics.decode_errors), 1);
    assert_eq!(replays(&h.metrics), replays_before, "a bad payload is not a gap");
}
