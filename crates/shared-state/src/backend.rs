//! [`Backend`]: the public handle (commands, pipelines, subscriptions, state) and the task that
//! keeps one command connection up (connect, serve, note the loss, back off, again). It owns
//! the backend's up/down state and its transitions' logs; the wire work is in `link`.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, info, warn};

use crate::conn::{Backoff, Connector};
use crate::link::{self, Link, Request};
use crate::stats::{Counters, bump};
use crate::{Error, Message, Options, Reply, Stats, Target, pubsub, resp};

/// A shared-state server as the router sees it. Cheap to clone (one `Arc`); the connection
/// task ends when the last clone is dropped.
#[derive(Clone)]
pub struct Backend {
    inner: Arc<Inner>,
    _owner: Arc<Owner>,
}

/// What the connection task and subscriptions share with the handles.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) connector: Connector,
    pub(crate) counters: Counters,
    /// The current connection; `None` while down, so callers fail at once.
    link: Mutex<Option<Arc<Link>>>,
    up: watch::Sender<bool>,
    in_flight: AtomicUsize,
    last_error: Mutex<Option<Error>>,
}

/// Dropped with the last [`Backend`] clone: the connection task sees its channel close and ends.
#[derive(Debug)]
struct Owner {
    _stop: watch::Sender<()>,
}

/// A slot in the in-flight budget, given back on drop (answer, error, timeout or cancellation).
struct InFlight<'a> {
    count: &'a AtomicUsize,
    n: usize,
}

// === impl Backend ===

impl Backend {
    /// Spawns the connection task on the current tokio runtime and returns at once, never
    /// waiting for the connection.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn start(target: Target, opts: Options) -> Backend {
        let (stop_tx, stop_rx) = watch::channel(());
        let inner = Arc::new(Inner {
            connector: Connector::new(target, opts),
            counters: Counters::default(),
            link: Mutex::new(None),
            up: watch::Sender::new(false),
            in_flight: AtomicUsize::new(0),
            last_error: Mutex::new(None),
        });
        tokio::spawn(run(inner.clone(), stop_rx));
        Backend { inner, _owner: Arc::new(Owner { _stop: stop_tx }) }
    }

    /// Sends one command (binary-safe arguments) and returns its reply; a refusal by the server
    /// is `Ok(Reply::Error(..))`. Commands share one pipelined connection.
    ///
    /// Fails at once with [`Error::Down`] while disconnected, [`Error::Busy`] when
    /// `max_in_flight` commands are waiting, [`Error::Invalid`] for an empty command or one
    /// that would change the shared connection's state; with [`Error::Timeout`] after
    /// `command_timeout` (the connection is then dropped and remade); with [`Error::Protocol`]
    /// or [`Error::Io`] when the connection breaks while the command waits.
    pub async fn cmd(&self, args: &[&[u8]]) -> Result<Reply, Error> {
        link::check(&[args])?;
        let mut wire = Vec::new();
        resp::encode(args, &mut wire);
        let mut replies = self.inner.send(wire, 1).await?;
        Ok(replies.pop().unwrap_or(Reply::Nil))
    }

    /// Sends several commands in one write, under one deadline, and returns their replies in
    /// order (no `MULTI`/`EXEC` implied; a `MULTI` must be closed in the same pipeline). The
    /// errors are [`cmd`](Self::cmd)'s; a pipeline longer than `max_in_flight` is always
    /// [`Error::Busy`].
    pub async fn pipeline(&self, cmds: &[Vec<Vec<u8>>]) -> Result<Vec<Reply>, Error> {
        if cmds.is_empty() {
            return Ok(Vec::new());
        }
        link::check(&cmds.iter().map(Vec::as_slice).collect::<Vec<_>>())?;
        let mut wire = Vec::new();
        for cmd in cmds {
            resp::encode(cmd, &mut wire);
        }
        self.inner.send(wire, cmds.len()).await
    }

    /// Whether a command connection is up now.
    pub fn is_up(&self) -> bool {
        *self.inner.up.borrow()
    }

    /// The counters and the up flag.
    pub fn stats(&self) -> Stats {
        self.inner.counters.snapshot(self.is_up())
    }

    /// Why the backend is down: the error of the last failed connection attempt or of the
    /// lost connection (an [`Error::Auth`] for a wrong password, say); `None` while up.
    pub fn last_error(&self) -> Option<Error> {
        self.inner.last_error.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Subscribes to `channels` on a connection of its own, resubscribing after every reconnect.
    /// Messages arrive in order on a queue of `capacity` (at least 1); when it is full a message
    /// is dropped and counted (`Stats::pubsub_dropped`), the reader never waits. The
    /// subscription ends when the receiver is dropped; with no channels the receiver is closed.
    pub fn subscribe(&self, channels: Vec<Vec<u8>>, capacity: usize) -> mpsc::Receiver<Message> {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        if !channels.is_empty() {
            tokio::spawn(pubsub::run(self.inner.clone(), channels, tx));
        }
        rx
    }

    /// Resolves `true` once a connection is up (at once if it is), or `false` after `deadline`.
    pub async fn wait_up(&self, deadline: Duration) -> bool {
        let mut up = self.inner.up.subscribe();
        matches!(tokio::time::timeout(deadline, up.wait_for(|up| *up)).await, Ok(Ok(_)))
    }
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend").field("target", &self.inner.connector.target).field("up", &self.is_up()).finish()
    }
}

// === impl Inner ===

impl Inner {
    async fn send(&self, wire: Vec<u8>, count: usize) -> Result<Vec<Reply>, Error> {
        let result = self.try_send(wire, count).await;
        if let Err(e) = &result {
            self.counters.error(e);
        }
        result
    }

    async fn try_send(&self, wire: Vec<u8>, count: usize) -> Result<Vec<Reply>, Error> {
        let opts = &self.connector.opts;
        let _slot = InFlight::acquire(&self.in_flight, count, opts.max_in_flight).ok_or(Error::Busy)?;
        let link = self.link.lock().unwrap_or_else(PoisonError::into_inner).clone().ok_or(Error::Down)?;
        let (tx, rx) = oneshot::channel();
        link.tx.try_send(Request { wire, count, reply: tx }).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => Error::Busy,
            mpsc::error::TrySendError::Closed(_) => Error::Down,
        })?;
        bump(&self.counters.commands, count as u64);
        match tokio::time::timeout(opts.command_timeout, rx).await {
            Ok(Ok(replies)) => replies,
            // The connection ended without answering (only when the backend is dropped).
            Ok(Err(_)) => Err(Error::Down),
            Err(_) => {
                link.broken();
                Err(Error::Timeout)
            }
        }
    }

    fn set_link(&self, link: Option<Arc<Link>>) {
        let up = link.is_some();
        *self.link.lock().unwrap_or_else(PoisonError::into_inner) = link;
        self.up.send_replace(up);
    }

    fn set_last_error(&self, e: Option<Error>) {
        *self.last_error.lock().unwrap_or_else(PoisonError::into_inner) = e;
    }
}

/// Keeps one command connection up until the last [`Backend`] is dropped. Logs transitions,
/// not attempts: once when the backend goes down (or first fails), again only if the reason's
/// kind changes, and once when it is up again.
async fn run(inner: Arc<Inner>, mut stop: watch::Receiver<()>) {
    let target = &inner.connector.target;
    let mut backoff = Backoff::new(&inner.connector.opts);
    let (mut ever_up, mut reported) = (false, None::<&'static str>);
    loop {
        let attempt = tokio::select! {
            biased;
            _ = stop.changed() => break,
            r = inner.connector.connect() => r,
        };
        match attempt {
            Ok(conn) => {
                backoff.reset();
                let (link, mut rx) = Link::new(inner.connector.opts.max_in_flight);
                inner.set_link(Some(link.clone()));
                inner.set_last_error(None);
                bump(&inner.counters.connects, 1);
                if reported.take().is_some() {
                    warn!(%target, "shared-state backend up again");
                } else if !ever_up {
                    info!(%target, "shared-state backend up");
                }
                ever_up = true;
                let end = link::serve(conn, &link, &mut rx, async {
                    let _ = stop.changed().await;
                })
                .await;
                inner.set_link(None);
                let Err(e) = end else { break };
                warn!(%target, error = %e, kind = e.kind(), "shared-state backend down");
                reported = Some(e.kind());
                inner.set_last_error(Some(e));
                bump(&inner.counters.disconnects, 1);
            }
            Err(e) => {
                bump(&inner.counters.connect_failures, 1);
                if reported != Some(e.kind()) {
                    warn!(%target, error = %e, kind = e.kind(), "shared-state backend unreachable; retrying");
                    reported = Some(e.kind());
                } else {
                    debug!(%target, error = %e, "shared-state connect attempt failed");
                }
                inner.set_last_error(Some(e));
            }
        }
        tokio::select! {
            biased;
            _ = stop.changed() => break,
            () = tokio::time::sleep(backoff.next()) => {}
        }
    }
    inner.set_link(None);
    debug!(%target, "shared-state connection task ended: the backend was dropped");
}

// === impl InFlight ===

impl<'a> InFlight<'a> {
    fn acquire(count: &'a AtomicUsize, n: usize, max: usize) -> Option<Self> {
        let before = count.fetch_add(n, Ordering::AcqRel);
        if before + n > max {
            count.fetch_sub(n, Ordering::AcqRel);
            return None;
        }
        Some(Self { count, n })
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(self.n, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests;
