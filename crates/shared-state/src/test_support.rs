//! Helpers for this crate's tests: small timeouts, and fake servers on 127.0.0.1:0 that speak
//! as much RESP as a test needs (or garbage).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use crate::conn::Reader;
use crate::resp::Limits;
use crate::{Options, Reply, Target};

/// Every wait in a test is bounded by this (generous: the builder is shared).
pub(crate) const DEADLINE: Duration = Duration::from_secs(10);

/// Options with reconnects fast enough for tests.
pub(crate) fn opts() -> Options {
    Options {
        command_timeout: Duration::from_secs(2),
        reconnect_min: Duration::from_millis(10),
        reconnect_max: Duration::from_millis(100),
        ..Options::default()
    }
}

/// A fake server's side of one connection.
pub(crate) struct Peer {
    stream: TcpStream,
    reader: Reader,
}

/// A fake server: accepts connections forever and runs `handler(n, peer)` for the n-th.
pub(crate) async fn fake<F, Fut>(handler: F) -> (Target, Arc<AtomicUsize>)
where
    F: Fn(usize, Peer) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let n = count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(handler(n, Peer { stream, reader: Reader::new(Limits { max_reply_bytes: 1 << 20 }) }));
        }
    });
    (Target::parse(&format!("redis://127.0.0.1:{port}")).unwrap(), accepted)
}

impl Peer {
    /// The next command's arguments; `None` once the client has closed the connection.
    pub(crate) async fn command(&mut self) -> Option<Vec<Vec<u8>>> {
        match self.reader.read(&mut self.stream).await.ok()? {
            Reply::Array(args) => Some(args.iter().map(|a| a.as_bytes().unwrap_or_default().to_vec()).collect()),
            other => panic!("the client sent {other:?}"),
        }
    }

    /// Answers the client's `CLIENT SETNAME` with `+OK`.
    pub(crate) async fn handshake(&mut self) {
        let cmd = self.command().await.expect("CLIENT SETNAME");
        assert_eq!(cmd, [&b"CLIENT"[..], b"SETNAME", b"sgl-router"]);
        self.send(b"+OK\r\n").await;
    }

    /// Writes raw bytes (errors ignored: the client may be gone).
    pub(crate) async fn send(&mut self, bytes: &[u8]) {
        let _ = self.stream.write_all(bytes).await;
    }

    /// Waits until the client closes the connection, ignoring what it sends.
    pub(crate) async fn until_closed(&mut self) {
        while self.command().await.is_some() {}
    }
}
