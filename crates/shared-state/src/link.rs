//! One command connection once it is ready: the writer (coalesces queued requests into one
//! write, recording each as pending first) and the reader (decodes replies and hands each to
//! the oldest pending request: replies are matched FIFO), run together until the connection
//! fails. Also which commands may share such a connection at all.
//!
//! The FIFO match is the invariant everything here protects: a reply is only ever matched on
//! the connection its command was written to, a timed-out command breaks its connection
//! (never just forgets its slot), and commands that would change the connection's state or
//! answer out of turn (`SUBSCRIBE`, `MONITOR`, `CLIENT REPLY`, a `MULTI` left open) are refused
//! before they are sent.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Notify, mpsc, oneshot};

use crate::conn::{Conn, Reader};
use crate::{Error, Reply};

/// Requests taken from the queue for one write, until the write holds this many bytes.
const WRITE_BATCH: usize = 64 << 10;

/// Commands refused on a shared connection: they change its state for every later caller, or
/// make the server answer out of turn.
const REFUSED: &[&str] = &[
    "SUBSCRIBE",
    "PSUBSCRIBE",
    "SSUBSCRIBE",
    "UNSUBSCRIBE",
    "PUNSUBSCRIBE",
    "SUNSUBSCRIBE",
    "MONITOR",
    "SELECT",
    "AUTH",
    "HELLO",
    "RESET",
    "QUIT",
    "SYNC",
    "PSYNC",
    "WATCH",
    "UNWATCH",
];

/// One or more encoded commands and where their replies go.
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) wire: Vec<u8>,
    pub(crate) count: usize,
    pub(crate) reply: oneshot::Sender<Result<Vec<Reply>, Error>>,
}

/// The callers' handle on the current connection.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) tx: mpsc::Sender<Request>,
    broken: Notify,
}

/// A request written and not yet fully answered.
#[derive(Debug)]
struct Pending {
    count: usize,
    replies: Vec<Reply>,
    reply: oneshot::Sender<Result<Vec<Reply>, Error>>,
}

type Queue = Mutex<VecDeque<Pending>>;

// === impl Link ===

impl Link {
    pub(crate) fn new(capacity: usize) -> (Arc<Link>, mpsc::Receiver<Request>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (Arc::new(Link { tx, broken: Notify::new() }), rx)
    }

    /// A command on this connection got no reply in time: drop the connection, so its late
    /// reply can never be read, let alone matched to another command.
    pub(crate) fn broken(&self) {
        self.broken.notify_one();
    }
}

/// Whether `cmds`, sent together, leave the shared connection as they found it.
pub(crate) fn check<A: AsRef<[u8]>>(cmds: &[&[A]]) -> Result<(), Error> {
    let is = |arg: Option<&A>, name: &str| arg.is_some_and(|a| a.as_ref().eq_ignore_ascii_case(name.as_bytes()));
    let mut in_multi = false;
    for cmd in cmds {
        let Some(first) = cmd.first() else { return Err(Error::Invalid("empty command".into())) };
        let name = Some(first);
        if REFUSED.iter().any(|r| is(name, r)) || (is(name, "CLIENT") && is(cmd.get(1), "REPLY")) {
            return Err(Error::Invalid(refused_name(first.as_ref())));
        }
        if is(name, "MULTI") {
            if in_multi {
                return Err(Error::Invalid("MULTI inside MULTI".into()));
            }
            in_multi = true;
        } else if is(name, "EXEC") || is(name, "DISCARD") {
            if !in_multi {
                return Err(Error::Invalid(format!("{} without MULTI", refused_name(first.as_ref()))));
            }
            in_multi = false;
        }
    }
    if in_multi {
        return Err(Error::Invalid("MULTI without EXEC or DISCARD in the same pipeline".into()));
    }
    Ok(())
}

fn refused_name(name: &[u8]) -> String {
    String::from_utf8_lossy(name).to_ascii_uppercase()
}

/// Serves `link` over `conn` until the connection fails (the error) or `stop` resolves
/// (`Ok`). Every request still queued or waiting for its replies then gets the error
/// ([`Error::Down`] on stop), and the queue is closed so later sends fail at once.
pub(crate) async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    conn: Conn<S>,
    link: &Link,
    rx: &mut mpsc::Receiver<Request>,
    stop: impl Future<Output = ()>,
) -> Result<(), Error> {
    let Conn { stream, mut reader } = conn;
    let (mut rd, mut wr) = tokio::io::split(stream);
    let pending = Queue::default();
    let end = tokio::select! {
        biased;
        () = stop => Ok(()),
        () = link.broken.notified() => Err(Error::Timeout),
        e = read_loop(&mut reader, &mut rd, &pending) => Err(e),
        e = write_loop(rx, &mut wr, &pending) => Err(e),
    };
    let err = end.clone().err().unwrap_or(Error::Down);
    rx.close();
    while let Ok(req) = rx.try_recv() {
        let _ = req.reply.send(Err(err.clone()));
    }
    for p in lock(&pending).drain(..) {
        let _ = p.reply.send(Err(err.clone()));
    }
    end
}

async fn write_loop<W: AsyncWrite + Unpin>(rx: &mut mpsc::Receiver<Request>, wr: &mut W, pending: &Queue) -> Error {
    let mut out = Vec::new();
    loop {
        // The link outlives this loop and holds a sender: `None` cannot happen while serving.
        let Some(first) = rx.recv().await else { return Error::Down };
        out.clear();
        let mut next = Some(first);
        while let Some(req) = next {
            // A caller that already gave up is neither written nor waited for.
            if !req.reply.is_closed() {
                out.extend_from_slice(&req.wire);
                let replies = Vec::with_capacity(req.count);
                lock(pending).push_back(Pending { count: req.count, replies, reply: req.reply });
            }
            next = if out.len() < WRITE_BATCH { rx.try_recv().ok() } else { None };
        }
        if out.is_empty() {
            continue;
        }
        if let Err(e) = wr.write_all(&out).await {
            return Error::io(e);
        }
        if let Err(e) = wr.flush().await {
            return Error::io(e);
        }
        if out.capacity() > 4 * WRITE_BATCH {
            out = Vec::new();
        }
    }
}

async fn read_loop<R: AsyncRead + Unpin>(reader: &mut Reader, rd: &mut R, pending: &Queue) -> Error {
    loop {
        let reply = match reader.read(rd).await {
            Ok(reply) => reply,
            Err(e) => return e,
        };
        let done = {
            let mut queue = lock(pending);
            let Some(front) = queue.front_mut() else {
                return Error::Protocol("a reply arrived with no command waiting for it".into());
            };
            front.replies.push(reply);
            if front.replies.len() == front.count { queue.pop_front() } else { None }
        };
        if let Some(p) = done {
            let _ = p.reply.send(Ok(p.replies));
        }
    }
}

/// The queue is only touched between awaits and nothing in those sections panics; a poisoned
/// lock would still hold a consistent queue.
fn lock(q: &Queue) -> MutexGuard<'_, VecDeque<Pending>> {
    q.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
