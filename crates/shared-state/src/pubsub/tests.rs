//! Subscriptions against a real `redis-server`: order, a full queue dropping and counting,
//! resubscription after a restart, the end when the receiver goes; and against a fake server
//! that goes silent (the idle `PING` notices it).

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::timeout;

use crate::test_support::{DEADLINE, fake, opts};
use crate::testing::{RedisServer, eventually};
use crate::{Backend, Message, Options, Reply, Target};

async fn started(url: &str, opts: Options) -> Backend {
    let b = Backend::start(Target::parse(url).unwrap(), opts);
    assert!(b.wait_up(DEADLINE).await, "not up: {:?}", b.last_error());
    b
}

/// Subscribers the server counts on `channel` (0 while the backend is down).
async fn subscribers(b: &Backend, channel: &[u8]) -> i64 {
    match b.cmd(&[b"PUBSUB", b"NUMSUB", channel]).await {
        Ok(Reply::Array(r)) => r.get(1).and_then(Reply::as_int).unwrap_or(0),
        _ => 0,
    }
}

async fn publish(b: &Backend, channel: &[u8], payload: &[u8]) {
    assert_eq!(b.cmd(&[b"PUBLISH", channel, payload]).await.unwrap(), Reply::Int(1));
}

fn message(channel: &'static [u8], payload: String) -> Message {
    Message { channel: Bytes::from_static(channel), payload: Bytes::from(payload) }
}

#[tokio::test]
async fn messages_arrive_in_order_on_every_channel() {
    let server = RedisServer::start().unwrap();
    let b = started(&server.url(), opts()).await;
    let mut rx = b.subscribe(vec![b"a".to_vec(), b"b\r\n\x00".to_vec()], 100);
    assert!(eventually(DEADLINE, async || subscribers(&b, b"b\r\n\x00").await == 1).await);
    for i in 0..50 {
        let channel: &[u8] = if i % 2 == 0 { b"a" } else { b"b\r\n\x00" };
        publish(&b, channel, format!("m{i}").as_bytes()).await;
    }
    for i in 0..50 {
        let m = timeout(DEADLINE, rx.recv()).await.unwrap().unwrap();
        let channel: &'static [u8] = if i % 2 == 0 { b"a" } else { b"b\r\n\x00" };
        assert_eq!(m, message(channel, format!("m{i}")));
    }
    let s = b.stats();
    assert_eq!((s.pubsub_messages, s.pubsub_dropped, s.pubsub_connects), (50, 0, 1));
}

#[tokio::test]
async fn a_full_queue_drops_and_counts_without_blocking_the_reader() {
    let server = RedisServer::start().unwrap();
    let b = started(&server.url(), opts()).await;
    let mut rx = b.subscribe(vec![b"ch".to_vec()], 2);
    assert!(eventually(DEADLINE, async || subscribers(&b, b"ch").await == 1).await);
    for i in 0..5 {
        publish(&b, b"ch", format!("m{i}").as_bytes()).await;
    }
    assert!(eventually(DEADLINE, async || b.stats().pubsub_messages + b.stats().pubsub_dropped == 5).await);
    assert_eq!((b.stats().pubsub_messages, b.stats().pubsub_dropped), (2, 3));
    assert_eq!(rx.recv().await.unwrap(), message(b"ch", "m0".into()));
    assert_eq!(rx.recv().await.unwrap(), message(b"ch", "m1".into()));
    // Room again: later messages are delivered.
    publish(&b, b"ch", b"m5").await;
    assert_eq!(timeout(DEADLINE, rx.recv()).await.unwrap().unwrap(), message(b"ch", "m5".into()));
}

#[tokio::test]
async fn a_restarted_server_is_resubscribed() {
    let mut server = RedisServer::start().unwrap();
    let b = started(&server.url(), opts()).await;
    let mut rx = b.subscribe(vec![b"ch".to_vec()], 16);
    assert!(eventually(DEADLINE, async || subscribers(&b, b"ch").await == 1).await);
    publish(&b, b"ch", b"before").await;
    assert_eq!(timeout(DEADLINE, rx.recv()).await.unwrap().unwrap().payload, "before");

    server.restart().unwrap();
    assert!(eventually(DEADLINE, async || subscribers(&b, b"ch").await == 1).await);
    publish(&b, b"ch", b"after").await;
    assert_eq!(timeout(DEADLINE, rx.recv()).await.unwrap().unwrap().payload, "after");
    assert_eq!(b.stats().pubsub_connects, 2);
}

#[tokio::test]
async fn dropping_the_receiver_ends_the_subscription() {
    let server = RedisServer::start().unwrap();
    let b = started(&server.url(), opts()).await;
    let rx = b.subscribe(vec![b"ch".to_vec()], 4);
    assert!(eventually(DEADLINE, async || subscribers(&b, b"ch").await == 1).await);
    drop(rx);
    assert!(eventually(DEADLINE, async || subscribers(&b, b"ch").await == 0).await);
    // No channels: a closed receiver, no task.
    let mut none = b.subscribe(Vec::new(), 4);
    assert!(none.recv().await.is_none());
}

#[tokio::test]
async fn a_silent_server_is_noticed_by_the_idle_ping_and_left() {
    let (target, accepted) = fake(|_, mut peer| async move {
        peer.handshake().await;
        // The command link connects here too, and sends nothing.
        let Some(subscribe) = peer.command().await else { return };
        assert_eq!(subscribe, [&b"SUBSCRIBE"[..], b"ch"]);
        peer.send(b"*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n").await;
        peer.send(b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$5\r\nhello\r\n").await;
        // The PING is read and never answered.
        peer.until_closed().await;
    })
    .await;
    let opts =
        Options { ping_interval: Duration::from_millis(100), command_timeout: Duration::from_millis(100), ..opts() };
    let b = Backend::start(target, opts);
    let mut rx = b.subscribe(vec![b"ch".to_vec()], 4);
    assert_eq!(timeout(DEADLINE, rx.recv()).await.unwrap().unwrap(), message(b"ch", "hello".into()));
    // Given up on and subscribed again on a new connection (the command link made one too).
    assert!(eventually(DEADLINE, async || b.stats().pubsub_connects >= 2).await);
    assert_eq!(timeout(DEADLINE, rx.recv()).await.unwrap().unwrap(), message(b"ch", "hello".into()));
    assert!(accepted.load(Ordering::SeqCst) >= 3);
}
