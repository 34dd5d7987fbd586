//! What a worker's frame headers may make the router hold. A worker's PUB and
//! replay ROUTER sockets are untrusted peers, and `zeromq` 0.7 reserved a
//! frame's declared length before reading any of it: a 9-byte header claiming
//! 2^40 bytes aborted the whole process ("memory allocation of 1099511693412
//! bytes failed"); it also gathered MORE frames without end. The vendored copy
//! (`vendor/zeromq`, see its PATCHES.md) refuses an oversize frame, command or
//! message as a decode error. These tests play the worker byte by byte on
//! 127.0.0.1 and check that the connection is dropped and the subscriber
//! reconnects and goes on (or the replay fails, for the DEALER), where the
//! unpatched crate aborts the test binary or holds the connection for ever.
//! Every wait has a timeout.

mod common;

use std::sync::Arc;

use common::{WAIT, batch, tag_of};
use kv_events::replay::ReplayError;
use kv_events::{
    EventForm, EventMetrics, StreamEndpoints, StreamMessage, SubscriberConfig, encode_batch, spawn_subscriber,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::timeout;
use tokio_util::sync::{CancellationToken, DropGuard};
use zeromq::{DealerSocket, Socket, SocketRecv};

/// The tag of the batch a well-behaved connection publishes.
const TAG: i64 = 42;

// The codec must never refuse a message the wire decoder would accept: the
// largest payload, beside its topic and seq frames, in the live (3 frames) or
// the replay (4 frames) shape.
const _: () = assert!(kv_events::wire::DEFAULT_MAX_PAYLOAD_BYTES + 1024 <= zeromq::MAX_MESSAGE_BYTES);
const _: () = assert!(kv_events::wire::DEFAULT_MAX_PAYLOAD_BYTES <= zeromq::MAX_FRAME_BYTES);
const _: () = assert!(4 <= zeromq::MAX_MESSAGE_FRAMES);

/// A worker's socket scripted byte by byte: the listener subscribers connect to.
struct RawPeer {
    listener: TcpListener,
    endpoint: String,
}

/// A subscriber to a [`RawPeer`]; dropping it stops the subscriber.
struct Subscribed {
    rx: mpsc::Receiver<StreamMessage>,
    metrics: Arc<EventMetrics>,
    _stop: DropGuard,
}

// === impl RawPeer ===

impl RawPeer {
    async fn bind() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("tcp://{}", listener.local_addr().unwrap());
        Self { listener, endpoint }
    }

    /// Accepts the next connection and sends it the ZMTP greeting.
    async fn accept(&self) -> TcpStream {
        let (mut socket, _) = timeout(WAIT, self.listener.accept()).await.expect("a connection in time").unwrap();
        write(&mut socket, &greeting()).await;
        socket
    }

    /// Starts a subscriber (no replay endpoint) to this peer.
    fn subscribe(&self) -> Subscribed {
        let (tx, rx) = mpsc::channel(4);
        let metrics = Arc::new(EventMetrics::default());
        let cancel = CancellationToken::new();
        let stream = StreamEndpoints {
            key: common::key(),
            endpoint: self.endpoint.clone(),
            replay_endpoint: None,
            topic: String::new(),
        };
        spawn_subscriber(stream, SubscriberConfig::default(), tx, metrics.clone(), cancel.clone());
        Subscribed { rx, metrics, _stop: cancel.drop_guard() }
    }

    /// From now on answers every connection as a well-behaved PUB publishing
    /// one batch, until the subscriber has it. More than one connection may come:
    /// the dropped socket's own reconnect can race the subscriber's new socket.
    async fn assert_serves(self, subscribed: &mut Subscribed) {
        let serving = tokio::spawn(async move {
            let mut open = Vec::new();
            loop {
                let mut socket = self.accept().await;
                let mut bytes = ready(b"PUB");
                bytes.extend(live_message(0, TAG));
                write(&mut socket, &bytes).await;
                open.push(socket); // keep it open: a closed one would be a reconnect
            }
        });
        assert_eq!(next_batch(subscribed).await, TAG, "the subscriber reconnected and received");
        serving.abort();
    }
}

// === helpers ===

/// The ZMTP 3.0 greeting of a NULL-mechanism server.
fn greeting() -> Vec<u8> {
    let mut out = vec![0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0];
    out.extend_from_slice(b"NULL");
    out.resize(64, 0);
    out
}

/// The READY command of a `socket_type` socket, with no other metadata.
fn ready(socket_type: &[u8]) -> Vec<u8> {
    let mut body = vec![5];
    body.extend_from_slice(b"READY");
    body.push(11);
    body.extend_from_slice(b"Socket-Type");
    body.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    body.extend_from_slice(socket_type);
    let mut out = vec![0x04, body.len() as u8];
    out.extend(body);
    out
}

/// A long frame header (flags, 8-byte length) declaring `len` body bytes.
fn long_header(len: u64, command: bool, more: bool) -> Vec<u8> {
    let mut out = vec![0x02 | if command { 0x04 } else { 0 } | u8::from(more)];
    out.extend_from_slice(&len.to_be_bytes());
    out
}

/// One message frame with its body.
fn frame(body: &[u8], more: bool) -> Vec<u8> {
    let mut out = match u8::try_from(body.len()) {
        Ok(len) => vec![u8::from(more), len],
        Err(_) => long_header(body.len() as u64, false, more),
    };
    out.extend_from_slice(body);
    out
}

/// A KV-event message as the engines publish it: topic, seq, payload.
fn live_message(seq: u64, tag: i64) -> Vec<u8> {
    let mut out = frame(b"", true);
    out.extend(frame(&seq.to_be_bytes(), true));
    out.extend(frame(&encode_batch(&batch(tag), EventForm::Map), false));
    out
}

async fn write(socket: &mut TcpStream, bytes: &[u8]) {
    timeout(WAIT, socket.write_all(bytes)).await.expect("written in time").unwrap();
}

/// Reads (and discards what the subscriber sent) until the peer closes.
async fn assert_dropped(socket: &mut TcpStream) {
    let closed = async {
        let mut buf = [0u8; 1024];
        while let Ok(n) = socket.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    };
    timeout(WAIT, closed).await.expect("the connection is dropped");
}

/// The tag of the next batch (resets skipped).
async fn next_batch(subscribed: &mut Subscribed) -> i64 {
    loop {
        let m = timeout(WAIT, subscribed.rx.recv()).await.expect("a batch in time").expect("subscriber alive");
        if let Some(tag) = tag_of(&m) {
            return tag;
        }
    }
}

/// A PUB peer that completes the handshake and then sends `attack`: the
/// subscriber must drop the connection and keep working.
async fn assert_survives(attack: &[u8]) {
    let peer = RawPeer::bind().await;
    let mut subscribed = peer.subscribe();
    let mut socket = peer.accept().await;
    write(&mut socket, &ready(b"PUB")).await;
    // The subscriber may drop the connection before all of it is written.
    let _ = timeout(WAIT, socket.write_all(attack)).await.expect("written or refused in time");
    assert_dropped(&mut socket).await;
    peer.assert_serves(&mut subscribed).await;
}

// === tests ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_header_claiming_a_terabyte_drops_the_connection() {
    // The colleague's reproduction: 9 bytes that aborted the process.
    assert_survives(&long_header(1 << 40, false, false)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_one_byte_over_the_limit_drops_the_connection() {
    assert_survives(&long_header(zeromq::MAX_FRAME_BYTES as u64 + 1, false, false)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_more_frames_drop_the_connection() {
    // Empty frames, each with MORE set: unpatched, the message grows for ever.
    let endless = frame(b"", true).repeat(100 * zeromq::MAX_MESSAGE_FRAMES);
    assert_survives(&endless).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_byte_limit_drops_the_connection() {
    // Two frames each within the frame limit, together over the message limit:
    // refused at the second header, before its body is read.
    let half = zeromq::MAX_MESSAGE_BYTES / 2 + 1;
    let mut attack = frame(&vec![0; half], true);
    attack.extend(long_header(half as u64, false, false));
    assert_survives(&attack).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_claiming_a_terabyte_fails_the_handshake() {
    let peer = RawPeer::bind().await;
    let mut subscribed = peer.subscribe();
    let mut socket = peer.accept().await;
    write(&mut socket, &long_header(1 << 40, true, false)).await;
    assert_dropped(&mut socket).await;
    peer.assert_serves(&mut subscribed).await;
    assert!(EventMetrics::get(&subscribed.metrics.connect_failures) >= 1, "counted as a failed connect");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_at_the_limits_is_received() {
    // MAX_MESSAGE_FRAMES frames is not too many: the message is delivered (and,
    // not being 3 frames, counted as malformed), and the connection stays up.
    let peer = RawPeer::bind().await;
    let mut subscribed = peer.subscribe();
    let mut socket = peer.accept().await;
    let mut bytes = ready(b"PUB");
    bytes.extend(frame(b"", true).repeat(zeromq::MAX_MESSAGE_FRAMES - 1));
    bytes.extend(frame(b"", false));
    bytes.extend(live_message(0, TAG));
    write(&mut socket, &bytes).await;
    assert_eq!(next_batch(&mut subscribed).await, TAG);
    assert_eq!(EventMetrics::get(&subscribed.metrics.malformed_frames), 1);
    assert_eq!(EventMetrics::get(&subscribed.metrics.connect_failures), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_reply_claiming_a_terabyte_fails_the_replay() {
    // The replay DEALER decodes with the same codec.
    let peer = RawPeer::bind().await;
    let endpoint = peer.endpoint.clone();
    let replay = tokio::spawn(async move { kv_events::replay::fetch(&endpoint, 0, WAIT).await });
    let mut socket = peer.accept().await;
    let mut bytes = ready(b"ROUTER");
    bytes.extend(long_header(1 << 40, false, false));
    write(&mut socket, &bytes).await;
    let result = timeout(WAIT, replay).await.expect("the replay ends in time").expect("no panic");
    assert!(matches!(result, Err(ReplayError::Socket(_))), "{result:?}");
    assert_dropped(&mut socket).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dealer_drops_the_peer_once_a_frame_is_refused() {
    // A DEALER does not disconnect on a receive error by itself; the patched
    // reader ends the stream after its first error, so the next receive drops
    // the peer instead of decoding on from the middle of a refused frame.
    let peer = RawPeer::bind().await;
    let endpoint = peer.endpoint.clone();
    let connecting = tokio::spawn(async move {
        let mut dealer = DealerSocket::new();
        dealer.connect(&endpoint).await.map(|()| dealer)
    });
    let mut socket = peer.accept().await;
    let mut bytes = ready(b"ROUTER");
    bytes.extend(long_header(1 << 40, false, false));
    write(&mut socket, &bytes).await;
    let mut dealer = timeout(WAIT, connecting).await.expect("connected in time").unwrap().unwrap();
    assert!(timeout(WAIT, dealer.recv()).await.expect("an error in time").is_err());
    let receiving = tokio::spawn(async move { dealer.recv().await });
    assert_dropped(&mut socket).await;
    receiving.abort();
}
