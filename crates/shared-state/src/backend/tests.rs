//! Against a real `redis-server` (`testing::RedisServer`): commands and replies of every shape,
//! binary safety, pipelines, `AUTH` and `SELECT`, the in-flight cap, and the backend's life
//! through a server stopped and restarted.

use std::time::Instant;

use bytes::Bytes;

use super::*;
use crate::test_support::{DEADLINE, opts};
use crate::testing::{RedisServer, eventually};

fn bulk(b: &[u8]) -> Reply {
    Reply::Bulk(Bytes::copy_from_slice(b))
}

async fn started(url: &str, opts: Options) -> Backend {
    let b = Backend::start(Target::parse(url).unwrap(), opts);
    assert!(b.wait_up(DEADLINE).await, "not up: {:?}", b.last_error());
    b
}

#[tokio::test]
async fn commands_and_every_reply_shape() {
    let server = RedisServer::start().unwrap();
    let b = started(&server.url(), opts()).await;
    assert!(b.cmd(&[b"SET", b"greeting", b"hello"]).await.unwrap().is_ok());
    assert_eq!(b.cmd(&[b"GET", b"greeting"]).await.unwrap(), bulk(b"hello"));
    assert_eq!(b.cmd(&[b"GET", b"missing"]).await.unwrap(), Reply::Nil);
    assert_eq!(b.cmd(&[b"INCR", b"n"]).await.unwrap(), Reply::Int(1));
    assert_eq!(b.cmd(&[b"INCRBY", b"n", b"-5"]).await.unwrap(), Reply::Int(-4));
    assert_eq!(b.cmd(&[b"EXPIRE", b"n", b"100"]).await.unwrap(), Reply::Int(1));
    let ttl = b.cmd(&[b"TTL", b"n"]).await.unwrap().as_int().unwrap();
    assert!((1..=100).contains(&ttl), "{ttl}");
    let script = b"return {1, 'two', redis.call('INCR', KEYS[1]), {ARGV[1], false}}";
    let reply = b.cmd(&[b"EVAL", script, b"1", b"n", b"arg"]).await.unwrap();
    assert_eq!(
        reply,
        Reply::Array(vec![Reply::Int(1), bulk(b"two"), Reply::Int(-3), Reply::Array(vec![bulk(b"arg"), Reply::Nil])])
    );
    // A refusal is a reply, and the connection carries on.
    match b.cmd(&[b"LPUSH", b"greeting", b"x"]).await.unwrap() {
        Reply::Error(e) => assert!(e.starts_with("WRONGTYPE"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(b.cmd(&[b"PING"]).await.unwrap(), Reply::Simple("PONG".into()));
    let name = b.cmd(&[b"CLIENT", b"GETNAME"]).await.unwrap();
    assert_eq!(name, bulk(b"sgl-router"));
    let s = b.stats();
    assert!(s.up && s.connects == 1 && s.commands == 11 && s.errors_down == 0, "{s:?}");
}

#[tokio::test]
async fn values_and_keys_are_binary_safe() {
    let server = RedisServer::start().unwrap();
    let b = started(&server.url(), opts()).await;
    let mut value: Vec<u8> = (0..=255).collect();
    value.extend_from_slice(b"\r\n$5\r\n*1\r\n\r\n");
    let key = b"k\r\n\x00\xff";
    assert!(b.cmd(&[b"SET", key, &value]).await.unwrap().is_ok());
    assert_eq!(b.cmd(&[b"GET", key]).await.unwrap(), bulk(&value));
    assert!(b.cmd(&[b"SET", b"empty", b""]).await.unwrap().is_ok());
    assert_eq!(b.cmd(&[b"GET", b"empty"]).await.unwrap(), bulk(b""));
}

#[tokio::test]
async fn a_pipeline_of_100_commands_answers_in_order() {
    let server = RedisServer::start().unwrap();
    let b = started(&server.url(), opts()).await;
    let cmds: Vec<Vec<Vec<u8>>> = (0..100)
        .map(|i| match i % 2 {
            0 => vec![b"INCR".to_vec(), b"counter".to_vec()],
            _ => vec![b"SET".to_vec(), format!("k{i}").into_bytes(), vec![b'v'; i]],
        })
        .collect();
    let replies = b.pipeline(&cmds).await.unwrap();
    assert_eq!(replies.len(), 100);
    for (i, r) in replies.iter().enumerate() {
        match i % 2 {
            0 => assert_eq!(*r, Reply::Int(i as i64 / 2 + 1)),
            _ => assert!(r.is_ok(), "{i}: {r:?}"),
        }
    }
    assert_eq!(b.cmd(&[b"STRLEN", b"k99"]).await.unwrap(), Reply::Int(99));
    assert_eq!(b.pipeline(&[]).await.unwrap(), vec![]);
    // A transaction inside a pipeline.
    let tx = [&b"MULTI"[..], b"INCR counter", b"EXEC"]
        .map(|c| c.split(|b| *b == b' ').map(<[u8]>::to_vec).collect::<Vec<_>>());
    let replies = b.pipeline(&tx).await.unwrap();
    assert_eq!(replies[2], Reply::Array(vec![Reply::Int(51)]));
    assert!(matches!(b.pipeline(&tx[..2]).await, Err(Error::Invalid(_))));
    assert!(matches!(b.cmd(&[b"SUBSCRIBE", b"ch"]).await, Err(Error::Invalid(_))));
    assert!(matches!(b.cmd(&[]).await, Err(Error::Invalid(_))));
}

#[tokio::test]
async fn auth_with_the_password_from_the_url_or_a_file() {
    let server = RedisServer::start_with(&["--requirepass", "s3 cr@t"]).unwrap();
    let port = server.port();
    let b = started(&format!("redis://:s3%20cr%40t@127.0.0.1:{port}"), opts()).await;
    assert_eq!(b.cmd(&[b"PING"]).await.unwrap(), Reply::Simple("PONG".into()));
    let b = started(&format!("redis://default:s3%20cr%40t@127.0.0.1:{port}"), opts()).await;
    assert_eq!(b.cmd(&[b"PING"]).await.unwrap(), Reply::Simple("PONG".into()));

    let file = std::env::temp_dir().join(format!("shared-state-password-{}-{port}", std::process::id()));
    std::fs::write(&file, "s3 cr@t\n").unwrap();
    let target = Target::parse(&format!("redis://127.0.0.1:{port}")).unwrap().with_password_file(&file).unwrap();
    let _ = std::fs::remove_file(&file);
    let b = Backend::start(target, opts());
    assert!(b.wait_up(DEADLINE).await);
    assert_eq!(b.cmd(&[b"PING"]).await.unwrap(), Reply::Simple("PONG".into()));
}

#[tokio::test]
async fn a_wrong_or_missing_password_keeps_the_backend_down_with_a_precise_error() {
    let server = RedisServer::start_with(&["--requirepass", "right"]).unwrap();
    let port = server.port();
    for (url, expected) in [
        (format!("redis://:wrong@127.0.0.1:{port}"), "WRONGPASS"),
        (format!("redis://nobody:right@127.0.0.1:{port}"), "WRONGPASS"),
        (format!("redis://127.0.0.1:{port}"), "NOAUTH"),
    ] {
        let b = Backend::start(Target::parse(&url).unwrap(), opts());
        assert!(eventually(DEADLINE, async || b.stats().connect_failures >= 2).await, "{url}");
        match b.last_error() {
            Some(Error::Auth(why)) => assert!(why.starts_with(expected), "{url}: {why}"),
            other => panic!("{url}: {other:?}"),
        }
        assert!(!b.is_up());
        assert!(matches!(b.cmd(&[b"PING"]).await, Err(Error::Down)));
        assert_eq!(b.stats().connects, 0);
    }
}

#[tokio::test]
async fn select_isolates_databases() {
    let server = RedisServer::start().unwrap();
    let db0 = started(&server.url(), opts()).await;
    let db2 = started(&format!("{}/2", server.url()), opts()).await;
    assert!(db2.cmd(&[b"SET", b"k", b"in-2"]).await.unwrap().is_ok());
    assert_eq!(db0.cmd(&[b"GET", b"k"]).await.unwrap(), Reply::Nil);
    assert_eq!(db2.cmd(&[b"GET", b"k"]).await.unwrap(), bulk(b"in-2"));
    assert_eq!(db2.cmd(&[b"DBSIZE"]).await.unwrap(), Reply::Int(1));
    assert_eq!(db0.cmd(&[b"DBSIZE"]).await.unwrap(), Reply::Int(0));
    // A database the server does not have: refused at setup, precisely.
    let b = Backend::start(Target::parse(&format!("{}/99", server.url())).unwrap(), opts());
    assert!(eventually(DEADLINE, async || b.last_error().is_some()).await);
    assert!(matches!(b.last_error(), Some(Error::Setup(why)) if why.contains("SELECT 99")));
}

#[tokio::test]
async fn beyond_max_in_flight_is_busy_at_once() {
    let server = RedisServer::start().unwrap();
    let opts = Options { max_in_flight: 2, command_timeout: Duration::from_secs(1), ..opts() };
    let b = started(&server.url(), opts).await;
    // Two commands that hold the connection (BLPOP blocks it) until the deadline.
    let blocked: Vec<_> = (0..2)
        .map(|_| {
            let b = b.clone();
            tokio::spawn(async move { b.cmd(&[b"BLPOP", b"nothing", b"0"]).await })
        })
        .collect();
    assert!(eventually(DEADLINE, async || b.stats().commands >= 2).await);
    let started = Instant::now();
    assert!(matches!(b.cmd(&[b"PING"]).await, Err(Error::Busy)));
    assert!(started.elapsed() < Duration::from_millis(500));
    assert!(matches!(b.pipeline(&vec![vec![b"PING".to_vec()]; 3]).await, Err(Error::Busy)));
    for task in blocked {
        assert!(matches!(task.await.unwrap(), Err(Error::Timeout)));
    }
    // The slots come back, and a new connection answers.
    assert!(eventually(DEADLINE, async || b.cmd(&[b"PING"]).await.is_ok()).await);
    let s = b.stats();
    assert_eq!((s.errors_busy, s.errors_timeout), (2, 2));
}

#[tokio::test]
async fn a_stopped_server_fails_commands_fast_and_a_restarted_one_is_reconnected() {
    let mut server = RedisServer::start().unwrap();
    let opts = Options { command_timeout: Duration::from_secs(5), ..opts() };
    let b = started(&server.url(), opts).await;
    assert!(b.cmd(&[b"SET", b"k", b"v"]).await.unwrap().is_ok());
    server.stop();
    assert!(eventually(DEADLINE, async || !b.is_up()).await);
    let started = Instant::now();
    assert!(matches!(b.cmd(&[b"GET", b"k"]).await, Err(Error::Down)));
    assert!(started.elapsed() < Duration::from_millis(100), "{:?}", started.elapsed());
    assert!(matches!(b.last_error(), Some(Error::Io(_))));

    server.restart().unwrap();
    assert!(eventually(DEADLINE, async || b.is_up()).await);
    // The restarted server is empty.
    assert_eq!(b.cmd(&[b"GET", b"k"]).await.unwrap(), Reply::Nil);
    let s = b.stats();
    assert!(s.connects == 2 && s.disconnects == 1 && s.errors_down >= 1, "{s:?}");
}

#[tokio::test]
async fn dropping_the_last_handle_closes_the_connection() {
    let server = RedisServer::start().unwrap();
    let watcher = started(&server.url(), opts()).await;
    let clients = async || match watcher.cmd(&[b"CLIENT", b"LIST"]).await {
        Ok(Reply::Bulk(list)) => list.split(|b| *b == b'\n').filter(|l| !l.is_empty()).count(),
        other => panic!("{other:?}"),
    };
    let b = started(&server.url(), opts()).await;
    let clone = b.clone();
    assert!(eventually(DEADLINE, async || clients().await == 2).await);
    drop(b);
    assert!(clone.cmd(&[b"PING"]).await.is_ok(), "a clone keeps the connection");
    drop(clone);
    assert!(eventually(DEADLINE, async || clients().await == 1).await);
}
