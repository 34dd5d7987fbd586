//! The subscriber against a real ZMQ publisher on 127.0.0.1: in-order batches,
//! a gap repaired by replay, a late joiner, a publisher restart, END_SEQ;
//! undecodable batches (recovered by replay, or reset); and the bounds on
//! what a worker's replay socket can cost: a deadline and a backoff, a hold
//! buffer for live batches meanwhile, a limit on batches per replay. Every
//! wait has a timeout.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{
    Harness, Replay, ReplayStub, batch, eventually, harness, harness_on, harness_with, next, publish_until_joined,
    seq_tag, seqs, tag_of,
};
use kv_events::{
    EventForm, EventMetrics, PublisherConfig, StreamMessage, StreamUpdate, SubscriberConfig, encode_batch,
};

fn get(h: &Harness, counter: impl Fn(&EventMetrics) -> &std::sync::atomic::AtomicU64) -> u64 {
    EventMetrics::get(counter(&h.metrics))
}

/// The seq the next published batch gets, after `joined`.
fn after(joined: &[StreamMessage]) -> u64 {
    joined.last().expect("joined").seq + 1
}

fn encoded(tag: i64) -> Bytes {
    Bytes::from(encode_batch(&batch(tag), EventForm::Map))
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

/// A batch that decodes in no copy (the replay buffer holds the same bad
/// bytes) resets the stream, then the stream goes on from the next seq.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_batch_resets_the_stream_when_its_replayed_copy_is_bad_too() {
    let mut h = harness(0).await;
    let n = after(&publish_until_joined(&mut h).await);
    h.publisher.publish_raw(Bytes::from_static(&[0x93, 0xc1, 0x00])).await.unwrap();
    h.publisher.publish(&batch(9)).await.unwrap();
    assert_eq!(next(&mut h).await, StreamMessage { key: common::key(), seq: n, update: StreamUpdate::Reset });
    assert_eq!(seq_tag(&next(&mut h).await), (n + 1, Some(9)), "continues from the following seq, no gap");
    assert_eq!(get(&h, |m| &m.undecodable_batches), 1);
    assert_eq!(get(&h, |m| &m.decode_errors), 2, "the live copy and the replayed copy");
    assert_eq!(get(&h, |m| &m.bad_batch_resets), 1);
    assert_eq!(get(&h, |m| &m.bad_batches_replayed), 0);
    assert_eq!((get(&h, |m| &m.resets), get(&h, |m| &m.gap_resets)), (0, 0));
}

/// A batch missing from the live stream whose replayed copy does not decode:
/// there is no other copy, so the stream is reset and goes on after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_replayed_batch_resets_the_stream() {
    let mut h = harness(0).await;
    let n = after(&publish_until_joined(&mut h).await);
    h.publisher.drop_next(1);
    h.publisher.publish_raw(Bytes::from_static(&[0x93, 0xc1, 0x00])).await.unwrap();
    h.publisher.publish(&batch(70)).await.unwrap();
    assert_eq!(seq_tag(&next(&mut h).await), (n, None));
    assert_eq!(seq_tag(&next(&mut h).await), (n + 1, Some(70)));
    assert_eq!((get(&h, |m| &m.undecodable_batches), get(&h, |m| &m.bad_batch_resets)), (1, 1));
    assert_eq!(get(&h, |m| &m.gap_resets), 0);
}

/// A gap whose start the publisher's buffer no longer holds: what the stream
/// holds may be stale, so it is reset before the replayed rest is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_missing_the_start_of_a_gap_resets_the_stream() {
    let publisher = PublisherConfig { buffer_steps: 2, ..PublisherConfig::loopback() };
    let mut h = harness_on(publisher, 0, Replay::Publisher, SubscriberConfig::default()).await;
    let n = after(&publish_until_joined(&mut h).await);
    let incomplete = get(&h, |m| &m.replay_incomplete); // a late join may have been one
    h.publisher.drop_next(3);
    for tag in 80..84 {
        h.publisher.publish(&batch(tag)).await.unwrap();
    }
    // The buffer holds n + 2 and n + 3 only: n and n + 1 are lost.
    assert_eq!(seq_tag(&next(&mut h).await), (n + 2, None));
    assert_eq!(seq_tag(&next(&mut h).await), (n + 2, Some(82)));
    assert_eq!(seq_tag(&next(&mut h).await), (n + 3, Some(83)));
    assert_eq!((get(&h, |m| &m.gap_resets), get(&h, |m| &m.replay_incomplete)), (1, incomplete + 1));
}

/// A live frame damaged on the way: the replay socket's copy decodes, and is
/// applied in its place; nothing is reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_live_batch_is_recovered_from_the_replay() {
    let mut h = harness(0).await;
    let n = after(&publish_until_joined(&mut h).await);
    h.publisher.corrupt_next(1);
    h.publisher.publish(&batch(50)).await.unwrap();
    h.publisher.publish(&batch(51)).await.unwrap();
    assert_eq!(seq_tag(&next(&mut h).await), (n, Some(50)));
    assert_eq!(seq_tag(&next(&mut h).await), (n + 1, Some(51)));
    assert_eq!(get(&h, |m| &m.undecodable_batches), 1);
    assert_eq!(get(&h, |m| &m.bad_batches_replayed), 1);
    assert_eq!(get(&h, |m| &m.bad_batch_resets), 0);
    assert_eq!(get(&h, |m| &m.resets), 0);
}

/// No replay socket to ask: an undecodable batch resets the stream at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_batch_without_replay_resets_the_stream() {
    let mut h = harness_with(0, Replay::None, SubscriberConfig::default()).await;
    let n = after(&publish_until_joined(&mut h).await);
    h.publisher.corrupt_next(1);
    h.publisher.publish(&batch(60)).await.unwrap();
    h.publisher.publish(&batch(61)).await.unwrap();
    assert_eq!(seq_tag(&next(&mut h).await), (n, None));
    assert_eq!(seq_tag(&next(&mut h).await), (n + 1, Some(61)));
    assert_eq!(get(&h, |m| &m.bad_batch_resets), 1);
}

/// A replay socket that never answers: the gap replay gives up at the
/// deadline and resets the stream; the next gap, within the backoff, resets
/// at once without asking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_replay_socket_times_out_resets_and_backs_off() {
    let mut stub = ReplayStub::bind().await;
    let config = SubscriberConfig {
        replay_timeout: Duration::from_millis(200),
        replay_backoff: Duration::from_secs(600),
        ..SubscriberConfig::default()
    };
    let mut h = harness_with(0, Replay::At(stub.endpoint.clone()), config).await;
    let n = after(&publish_until_joined(&mut h).await);
    stub.script();
    h.publisher.drop_next(1);
    h.publisher.publish(&batch(1000)).await.unwrap();
    h.publisher.publish(&batch(1001)).await.unwrap();
    let request = stub.request().await;
    assert_eq!(request.from, n);
    drop(request); // never answered
    assert_eq!(seq_tag(&next(&mut h).await), (n + 1, None), "a reset, revealed by the live batch");
    assert_eq!(seq_tag(&next(&mut h).await), (n + 1, Some(1001)));
    assert_eq!((get(&h, |m| &m.replay_timeouts), get(&h, |m| &m.gap_resets)), (1, 1));

    h.publisher.drop_next(1);
    h.publisher.publish(&batch(1002)).await.unwrap();
    h.publisher.publish(&batch(1003)).await.unwrap();
    assert_eq!(seq_tag(&next(&mut h).await), (n + 3, None));
    assert_eq!(seq_tag(&next(&mut h).await), (n + 3, Some(1003)));
    assert_eq!((get(&h, |m| &m.replay_skipped), get(&h, |m| &m.gap_resets)), (1, 2));
    assert_eq!(get(&h, |m| &m.replay_timeouts), 1);
    assert!(stub.requests.try_recv().is_err(), "not asked again within the backoff");
}

/// While a replay runs the subscriber keeps reading live batches, holding up
/// to `live_hold_batches`; one more is dropped, counted, and repaired later
/// as the gap it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_batches_are_held_while_a_replay_runs() {
    let mut stub = ReplayStub::bind().await;
    let config = SubscriberConfig { live_hold_batches: 2, replay_timeout: common::WAIT, ..SubscriberConfig::default() };
    let mut h = harness_with(0, Replay::At(stub.endpoint.clone()), config).await;
    let n = after(&publish_until_joined(&mut h).await);
    stub.script();
    let (held, dropped) = (get(&h, |m| &m.live_held), get(&h, |m| &m.live_dropped));
    h.publisher.drop_next(1);
    h.publisher.publish(&batch(2000)).await.unwrap();
    h.publisher.publish(&batch(2001)).await.unwrap();
    let request = stub.request().await;
    assert_eq!(request.from, n);
    for tag in 2002..=2004 {
        h.publisher.publish(&batch(tag)).await.unwrap();
    }
    eventually("the third live batch dropped", || get(&h, |m| &m.live_dropped) == dropped + 1).await;
    assert_eq!(get(&h, |m| &m.live_held), held + 2);
    request.answer.send(vec![(n, encoded(2000))]).unwrap();
    let got: Vec<_> =
        [next(&mut h).await, next(&mut h).await, next(&mut h).await, next(&mut h).await].iter().map(seq_tag).collect();
    assert_eq!(got, vec![(n, Some(2000)), (n + 1, Some(2001)), (n + 2, Some(2002)), (n + 3, Some(2003))]);

    // The dropped batch is a gap the next live batch reveals.
    h.publisher.publish(&batch(2005)).await.unwrap();
    let request = stub.request().await;
    assert_eq!(request.from, n + 4);
    request.answer.send(vec![(n + 4, encoded(2004))]).unwrap();
    assert_eq!(seq_tag(&next(&mut h).await), (n + 4, Some(2004)));
    assert_eq!(seq_tag(&next(&mut h).await), (n + 5, Some(2005)));
    assert_eq!((get(&h, |m| &m.resets), get(&h, |m| &m.gap_resets)), (0, 0));
}

/// A replay returning more batches than `max_replay_batches` is refused and
/// the gap reset; one within the limit repairs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_over_the_batch_limit_resets_the_stream() {
    let config =
        SubscriberConfig { max_replay_batches: 3, replay_backoff: Duration::ZERO, ..SubscriberConfig::default() };
    let mut h = harness_with(0, Replay::Publisher, config).await;
    let n = after(&publish_until_joined(&mut h).await);
    let over_limit = get(&h, |m| &m.replay_over_limit);
    h.publisher.drop_next(4);
    for tag in 3000..3005 {
        h.publisher.publish(&batch(tag)).await.unwrap();
    }
    assert_eq!(seq_tag(&next(&mut h).await), (n + 4, None));
    assert_eq!(seq_tag(&next(&mut h).await), (n + 4, Some(3004)));
    assert_eq!(get(&h, |m| &m.replay_over_limit), over_limit + 1);
    assert_eq!(get(&h, |m| &m.gap_resets), 1);

    h.publisher.drop_next(3);
    for tag in 3005..3009 {
        h.publisher.publish(&batch(tag)).await.unwrap();
    }
    for i in 5..9 {
        assert_eq!(seq_tag(&next(&mut h).await), (n + i, Some(3000 + i as i64)));
    }
    assert_eq!(get(&h, |m| &m.gap_resets), 1);
}

/// A publisher restart only the reconnect's replay shows, where the new publisher's batches
/// overlap the ones remembered (found by the chaos run, `crates/router/tests/chaos.rs`): the
/// old publisher sent 0..=18 (the subscriber remembers 3..=18), the new one 0..=4 while the
/// subscriber was away. The replay from 3 shows other bytes at 3: the stream is reset and the
/// new publisher's batches are applied from its first, not from 3 (its 0..=2 would be lost, and
/// every later store continuing them an orphan).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_seen_on_reconnect_replays_the_new_publisher_from_its_start() {
    let mut h = harness(0).await;
    let joined = publish_until_joined(&mut h).await;
    let mut last = joined.last().expect("joined").seq;
    assert!(last < 18, "joined late: {last}");
    while last < 18 {
        h.publisher.publish(&batch(200 + last as i64)).await.unwrap();
        last = next(&mut h).await.seq;
    }
    // Back 10 ms later; the subscriber's first reconnect attempt waits 100 ms.
    h.publisher.crash(Duration::from_millis(10)).await.unwrap();
    for i in 0..5 {
        h.publisher.publish(&batch(500 + i)).await.unwrap();
    }
    assert_eq!(next(&mut h).await.update, StreamUpdate::Reset);
    let got = [next(&mut h).await, next(&mut h).await, next(&mut h).await, next(&mut h).await, next(&mut h).await];
    assert_eq!(seqs(&got), vec![0, 1, 2, 3, 4]);
    assert_eq!(got.iter().map(tag_of).collect::<Vec<_>>(), (500..505).map(Some).collect::<Vec<_>>());
    assert_eq!(get(&h, |m| &m.rewritten_resets), 1);
    assert_eq!(get(&h, |m| &m.reconnects), 1);
}

/// Found by the chaos run: after a restart (END_SEQ here) the new publisher's first batches
/// are lost live and no replay can give them (none configured; in the chaos run, the endpoint
/// was backing off after an earlier failure). The stream starts at the first batch it sees,
/// and the batches before it are counted as missed history, never lost silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_publishers_first_batches_lost_without_replay_are_counted_missed() {
    let mut h = harness_with(0, Replay::None, kv_events::SubscriberConfig::default()).await;
    publish_until_joined(&mut h).await;
    let missed_before = get(&h, |m| &m.history_missed_batches);
    h.publisher.send_end().await.unwrap();
    assert_eq!(next(&mut h).await.update, StreamUpdate::Reset);
    h.publisher.restart().await;
    h.publisher.drop_next(2);
    for i in 0..3 {
        h.publisher.publish(&batch(700 + i)).await.unwrap();
    }
    let first = next(&mut h).await;
    assert_eq!(seq_tag(&first), (2, Some(702)));
    assert_eq!(get(&h, |m| &m.history_missed_batches) - missed_before, 2, "seq 0 and 1 of the new publisher");
    assert_eq!(h.metrics.history(&common::key()), Some(kv_events::StreamHistory::Missed { batches: 2 }));
}

/// Found by the chaos run: a replay that failed suspends the endpoint for `replay_backoff`
/// (5 s); a publisher crash within it made the reconnect skip its catch-up, and the new
/// publisher's first batches were lost. A reconnect now asks again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_catches_up_even_while_a_failed_replay_endpoint_backs_off() {
    let mut h = harness(0).await;
    publish_until_joined(&mut h).await;
    let failed = get(&h, |m| &m.replay_failed) + get(&h, |m| &m.replay_timeouts);
    // The replay socket down while a gap shows: the stream is reset, the endpoint backs off.
    let gap = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        h.publisher.drop_next(1);
        h.publisher.publish(&batch(800)).await.unwrap();
        h.publisher.publish(&batch(801)).await.unwrap();
        let reset = tokio::time::timeout(common::WAIT, h.rx.recv()).await.unwrap().unwrap();
        let live = tokio::time::timeout(common::WAIT, h.rx.recv()).await.unwrap().unwrap();
        (reset, live)
    };
    let (down, (reset, live)) = tokio::join!(h.publisher.replay_down(Duration::from_millis(1000)), gap);
    down.unwrap();
    assert_eq!(reset.update, StreamUpdate::Reset);
    assert_eq!(tag_of(&live), Some(801));
    assert!(get(&h, |m| &m.replay_failed) + get(&h, |m| &m.replay_timeouts) > failed);
    // Within the backoff, the engine crashes; its first batches go out before we reconnect.
    h.publisher.crash(Duration::from_millis(10)).await.unwrap();
    for i in 0..3 {
        h.publisher.publish(&batch(900 + i)).await.unwrap();
    }
    assert_eq!(next(&mut h).await.update, StreamUpdate::Reset);
    let got = [next(&mut h).await, next(&mut h).await, next(&mut h).await];
    assert_eq!(got.iter().map(seq_tag).collect::<Vec<_>>(), vec![(0, Some(900)), (1, Some(901)), (2, Some(902))]);
}
