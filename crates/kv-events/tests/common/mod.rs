//! What the subscriber and replay tests share: a publisher and a subscriber
//! on 127.0.0.1 with RAII shutdown, and a replay socket the test scripts.
//! Every wait has a timeout.
#![allow(dead_code)] // not every test binary uses every helper

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use kv_events::replay::{END_SEQ, parse_seq};
use kv_events::{
    EventMetrics, Publisher, PublisherConfig, StreamEndpoints, StreamMessage, StreamUpdate, SubscriberConfig,
    spawn_subscriber,
};
use router_types::{DpRank, EngineBlockHash, EventBatch, KvEvent, WorkerKey, WorkerUrl};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use zeromq::{RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// Longest any single wait may take before the test fails.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// A batch removing one block whose hash is `tag`: tells batches apart.
pub(crate) fn batch(tag: i64) -> EventBatch {
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

/// The key of the harness's stream.
pub(crate) fn key() -> WorkerKey {
    WorkerKey::new(WorkerUrl::new("http://w:1"), DpRank(0))
}

pub(crate) fn tag_of(m: &StreamMessage) -> Option<i64> {
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

/// `(seq, tag)` of a batch, `(seq, None)` of a reset.
pub(crate) fn seq_tag(m: &StreamMessage) -> (u64, Option<i64>) {
    (m.seq, tag_of(m))
}

pub(crate) fn seqs(ms: &[StreamMessage]) -> Vec<u64> {
    ms.iter().map(|m| m.seq).collect()
}

/// A publisher and one subscriber to it; dropping it stops the subscriber.
pub(crate) struct Harness {
    pub(crate) publisher: Publisher,
    pub(crate) rx: mpsc::Receiver<StreamMessage>,
    pub(crate) metrics: Arc<EventMetrics>,
    pub(crate) cancel: CancellationToken,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Which replay socket the subscriber is given.
pub(crate) enum Replay {
    /// The publisher's own.
    Publisher,
    /// None at all.
    None,
    /// Another one (a [`ReplayStub`]).
    At(String),
}

/// A loopback publisher with replay, `publish_before_subscribe` batches
/// published, and a subscriber with the default config.
pub(crate) async fn harness(publish_before_subscribe: usize) -> Harness {
    harness_with(publish_before_subscribe, Replay::Publisher, SubscriberConfig::default()).await
}

pub(crate) async fn harness_with(publish_before_subscribe: usize, replay: Replay, config: SubscriberConfig) -> Harness {
    harness_on(PublisherConfig::loopback(), publish_before_subscribe, replay, config).await
}

/// The same with a publisher configured by the test (its replay endpoint is
/// dropped unless `replay` is [`Replay::Publisher`]).
pub(crate) async fn harness_on(
    mut publisher_config: PublisherConfig,
    publish_before_subscribe: usize,
    replay: Replay,
    config: SubscriberConfig,
) -> Harness {
    if !matches!(replay, Replay::Publisher) {
        publisher_config.replay_endpoint = None;
    }
    let publisher = Publisher::bind(publisher_config).await.unwrap();
    for i in 0..publish_before_subscribe {
        publisher.publish(&batch(i as i64)).await.unwrap();
    }
    let (tx, rx) = mpsc::channel(4);
    let metrics = Arc::new(EventMetrics::default());
    let cancel = CancellationToken::new();
    let replay_endpoint = match replay {
        Replay::Publisher => publisher.replay_endpoint().map(str::to_string),
        Replay::None => None,
        Replay::At(endpoint) => Some(endpoint),
    };
    let stream = StreamEndpoints {
        key: key(),
        endpoint: publisher.endpoint().to_string(),
        replay_endpoint,
        topic: String::new(),
    };
    spawn_subscriber(stream, config, tx, metrics.clone(), cancel.clone());
    Harness { publisher, rx, metrics, cancel }
}

pub(crate) async fn next(h: &mut Harness) -> StreamMessage {
    tokio::time::timeout(WAIT, h.rx.recv()).await.expect("a message in time").expect("channel open")
}

/// Publishes until the subscriber has joined: the first batches may be lost to
/// the PUB slow-joiner effect, but the subscriber replays them from seq 0.
pub(crate) async fn publish_until_joined(h: &mut Harness) -> Vec<StreamMessage> {
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

/// Polls `cond` until it holds, failing the test after [`WAIT`].
pub(crate) async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A replay ROUTER socket the test scripts. While `auto_empty` is set it
/// answers every request with an empty replay by itself; otherwise it hands
/// each request to the test, which answers it or drops it (never answered).
pub(crate) struct ReplayStub {
    pub(crate) endpoint: String,
    pub(crate) requests: mpsc::Receiver<StubRequest>,
    auto_empty: Arc<AtomicBool>,
    cancel: CancellationToken,
}

/// One replay request, held by the test.
pub(crate) struct StubRequest {
    /// The seq asked from.
    pub(crate) from: u64,
    /// Send the batches to reply with; drop to never answer.
    pub(crate) answer: oneshot::Sender<Vec<(u64, Bytes)>>,
}

impl ReplayStub {
    pub(crate) async fn bind() -> Self {
        let mut router = RouterSocket::new();
        let endpoint = router.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
        let (tx, requests) = mpsc::channel(16);
        let auto_empty = Arc::new(AtomicBool::new(true));
        let cancel = CancellationToken::new();
        tokio::spawn(serve_stub(router, tx, auto_empty.clone(), cancel.clone()));
        Self { endpoint, requests, auto_empty, cancel }
    }

    /// From now on, hand requests to the test.
    pub(crate) fn script(&self) {
        self.auto_empty.store(false, Ordering::SeqCst);
    }

    pub(crate) async fn request(&mut self) -> StubRequest {
        tokio::time::timeout(WAIT, self.requests.recv()).await.expect("a replay request in time").expect("stub alive")
    }
}

impl Drop for ReplayStub {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

async fn serve_stub(
    mut router: RouterSocket,
    requests: mpsc::Sender<StubRequest>,
    auto_empty: Arc<AtomicBool>,
    cancel: CancellationToken,
) {
    loop {
        let request = tokio::select! {
            _ = cancel.cancelled() => return,
            r = router.recv() => match r {
                Ok(m) => m.into_vec(),
                Err(_) => continue,
            },
        };
        let (identity, Some(from)) = (match request.as_slice() {
            [identity, _, start] | [identity, start] => (identity.clone(), parse_seq(start)),
            _ => continue,
        }) else {
            continue;
        };
        let batches = if auto_empty.load(Ordering::SeqCst) {
            Vec::new()
        } else {
            let (answer, answered) = oneshot::channel();
            if requests.send(StubRequest { from, answer }).await.is_err() {
                return;
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                r = answered => match r {
                    Ok(b) => b,
                    Err(_) => continue, // dropped: never answer
                },
            }
        };
        let end = (END_SEQ, Bytes::new());
        for (seq, payload) in batches.into_iter().chain([end]) {
            let frames =
                vec![identity.clone(), Bytes::new(), Bytes::new(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload];
            let _ = router.send(ZmqMessage::try_from(frames).unwrap()).await;
        }
    }
}
