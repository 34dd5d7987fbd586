//! Hostile and broken servers (fakes on 127.0.0.1:0): garbage, a 4 GiB claim, no answer at
//! all, a reply nobody asked for. Each must cost one connection and a precise error, never a
//! mismatched reply, memory or a hang. Also which commands may share a connection.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::*;
use crate::test_support::{DEADLINE, fake, opts};
use crate::testing::eventually;
use crate::{Backend, Options};

#[tokio::test]
async fn garbage_is_a_protocol_error_and_the_backend_reconnects() {
    let (target, accepted) = fake(|_, mut peer| async move {
        peer.handshake().await;
        if peer.command().await.is_some() {
            peer.send(b"?garbage\r\n").await;
        }
        peer.until_closed().await;
    })
    .await;
    let b = Backend::start(target, opts());
    for round in 1..=3 {
        assert!(eventually(DEADLINE, async || b.stats().connects >= round && b.is_up()).await, "round {round}");
        match b.cmd(&[b"GET", b"k"]).await {
            Err(Error::Protocol(why)) => assert!(why.contains("type byte 0x3f"), "{why}"),
            other => panic!("round {round}: {other:?}"),
        }
    }
    let s = b.stats();
    assert_eq!(s.errors_protocol, 3);
    assert!(s.disconnects >= 3 && accepted.load(Ordering::SeqCst) >= 3, "{s:?}");
}

#[tokio::test]
async fn garbage_during_setup_keeps_the_backend_down_and_retrying() {
    let (target, accepted) = fake(|_, mut peer| async move {
        let _ = peer.command().await;
        peer.send(b"\x00\x01\x02").await;
        peer.until_closed().await;
    })
    .await;
    let b = Backend::start(target, opts());
    assert!(eventually(DEADLINE, async || b.stats().connect_failures >= 3).await);
    assert!(accepted.load(Ordering::SeqCst) >= 3);
    assert!(!b.is_up());
    assert!(matches!(b.last_error(), Some(Error::Protocol(why)) if why.contains("0x00")));
    assert!(matches!(b.cmd(&[b"PING"]).await, Err(Error::Down)));
}

#[tokio::test]
async fn a_claimed_4_gib_bulk_is_refused_from_its_header() {
    let (target, _) = fake(|_, mut peer| async move {
        peer.handshake().await;
        if peer.command().await.is_some() {
            // The header and a few bytes: the client must not wait for (or reserve) the rest.
            peer.send(b"$4294967296\r\nabc").await;
        }
        peer.until_closed().await;
    })
    .await;
    let b = Backend::start(target, opts());
    assert!(b.wait_up(DEADLINE).await);
    let started = Instant::now();
    match b.cmd(&[b"GET", b"big"]).await {
        Err(Error::Protocol(why)) => assert!(why.contains("bulk string of 4294967296 bytes"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < opts().command_timeout, "refused without waiting for the body");
    assert!(eventually(DEADLINE, async || !b.is_up() || b.stats().connects >= 2).await);
}

#[tokio::test]
async fn huge_arrays_and_deep_nesting_are_refused() {
    let (target, _) = fake(|n, mut peer| async move {
        peer.handshake().await;
        if peer.command().await.is_some() {
            let deep = "*1\r\n".repeat(9);
            let wire = if n == 0 { "*2147483647\r\n:1\r\n".to_owned() } else { format!("{deep}:1\r\n") };
            peer.send(wire.as_bytes()).await;
        }
        peer.until_closed().await;
    })
    .await;
    let b = Backend::start(target, opts());
    assert!(b.wait_up(DEADLINE).await);
    assert!(matches!(b.cmd(&[b"GET", b"k"]).await, Err(Error::Protocol(why)) if why.contains("2147483647 elements")));
    assert!(eventually(DEADLINE, async || b.stats().connects >= 2 && b.is_up()).await);
    assert!(matches!(b.cmd(&[b"GET", b"k"]).await, Err(Error::Protocol(why)) if why.contains("nested deeper")));
}

#[tokio::test]
async fn no_answer_times_out_and_the_late_reply_never_reaches_the_next_command() {
    let (target, _) = fake(|n, mut peer| async move {
        peer.handshake().await;
        if n == 0 {
            // Swallow the command; once the client has given up on this connection, answer anyway.
            let _ = peer.command().await;
            peer.until_closed().await;
            peer.send(b"$3\r\nold\r\n").await;
            return;
        }
        while peer.command().await.is_some() {
            peer.send(b"$3\r\nnew\r\n").await;
        }
    })
    .await;
    let timeout = Duration::from_millis(300);
    let b = Backend::start(target, Options { command_timeout: timeout, ..opts() });
    assert!(b.wait_up(DEADLINE).await);
    let started = Instant::now();
    assert!(matches!(b.cmd(&[b"GET", b"k"]).await, Err(Error::Timeout)));
    let took = started.elapsed();
    assert!(took >= timeout && took < timeout + Duration::from_secs(2), "{took:?}");
    // The connection is dropped and remade; the next command is answered on the new one.
    assert!(eventually(DEADLINE, async || b.stats().connects >= 2 && b.is_up()).await);
    assert_eq!(b.cmd(&[b"GET", b"k"]).await.unwrap(), Reply::Bulk(Bytes::from_static(b"new")));
    let s = b.stats();
    assert_eq!((s.errors_timeout, s.connects, s.disconnects), (1, 2, 1));
}

#[tokio::test]
async fn a_reply_nobody_asked_for_breaks_the_connection() {
    let (target, _) = fake(|n, mut peer| async move {
        peer.handshake().await;
        if n == 0 {
            peer.send(b"+surprise\r\n").await;
            peer.until_closed().await;
            return;
        }
        while peer.command().await.is_some() {
            peer.send(b":1\r\n").await;
        }
    })
    .await;
    // A slow first reconnect leaves time to read why the first connection ended.
    let b = Backend::start(target, Options { reconnect_min: Duration::from_secs(2), ..opts() });
    assert!(eventually(DEADLINE, async || b.stats().disconnects >= 1).await);
    assert!(matches!(b.last_error(), Some(Error::Protocol(why)) if why.contains("no command waiting")));
    assert!(eventually(DEADLINE, async || b.is_up()).await);
    assert_eq!(b.cmd(&[b"INCR", b"k"]).await.unwrap(), Reply::Int(1));
}

#[tokio::test]
async fn a_pipeline_fails_whole_when_its_connection_breaks_midway() {
    let (target, _) = fake(|_, mut peer| async move {
        peer.handshake().await;
        let (_, _) = (peer.command().await, peer.command().await);
        // One of two replies, then the connection closes.
        peer.send(b":1\r\n").await;
    })
    .await;
    let b = Backend::start(target, opts());
    assert!(b.wait_up(DEADLINE).await);
    let cmds = vec![vec![b"INCR".to_vec(), b"a".to_vec()], vec![b"INCR".to_vec(), b"b".to_vec()]];
    match b.pipeline(&cmds).await {
        Err(Error::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof),
        other => panic!("{other:?}"),
    }
}

/// `check` on commands written as space-separated words.
fn check_words(cmds: &[&str]) -> Result<(), Error> {
    let cmds: Vec<Vec<&[u8]>> = cmds.iter().map(|c| c.split_whitespace().map(str::as_bytes).collect()).collect();
    check(&cmds.iter().map(Vec::as_slice).collect::<Vec<_>>())
}

#[test]
fn commands_that_would_change_the_shared_connection_are_refused() {
    let invalid = |cmds: &[&str]| match check_words(cmds) {
        Err(Error::Invalid(why)) => why,
        other => panic!("{cmds:?}: {other:?}"),
    };
    assert_eq!(invalid(&[""]), "empty command");
    assert_eq!(invalid(&["subscribe ch"]), "SUBSCRIBE");
    assert_eq!(invalid(&["GET k", "Select 1"]), "SELECT");
    assert_eq!(invalid(&["MONITOR"]), "MONITOR");
    assert_eq!(invalid(&["client reply off"]), "CLIENT");
    assert!(invalid(&["MULTI"]).contains("without EXEC"));
    assert!(invalid(&["EXEC"]).contains("without MULTI"));
    assert!(invalid(&["MULTI", "MULTI"]).contains("inside"));
    assert!(check_words(&["MULTI", "INCR k", "EXEC", "multi", "discard"]).is_ok());
    assert!(check_words(&["CLIENT", "CLIENT SETNAME x", "GET SUBSCRIBE"]).is_ok());
}
