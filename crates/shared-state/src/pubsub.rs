//! One subscription: its own connection, `SUBSCRIBE` to its channels (again after every
//! reconnect), messages handed to a bounded queue without ever waiting on it, and a `PING`
//! when idle so a server gone silent is noticed. Ends when the receiver is dropped.

use std::sync::Arc;

use tokio::sync::mpsc::{self, error::TrySendError};
use tokio::time::{Instant, sleep_until, timeout};
use tracing::{debug, info, warn};

use crate::backend::Inner;
use crate::conn::{Backoff, Conn, Stream};
use crate::stats::bump;
use crate::{Error, Message, Reply};

/// How a subscription's session ended.
enum End {
    /// The receiver was dropped: the subscription is over.
    Gone,
    Failed(Error),
}

/// What woke the session up.
enum Event {
    Gone,
    Reply(Result<Reply, Error>),
    Idle,
}

/// What a reply on a subscribed connection is.
enum Push {
    Message(Message),
    Subscribed,
    Pong,
}

/// Keeps the subscription alive until `tx`'s receiver is dropped.
pub(crate) async fn run(inner: Arc<Inner>, channels: Vec<Vec<u8>>, tx: mpsc::Sender<Message>) {
    let target = &inner.connector.target;
    let mut backoff = Backoff::new(&inner.connector.opts);
    let (mut ever_up, mut reported) = (false, None::<&'static str>);
    loop {
        let attempt = tokio::select! {
            biased;
            () = tx.closed() => break,
            r = inner.connector.connect() => r,
        };
        let end = match attempt {
            Ok(conn) => {
                // The pause resets once subscribed (a refused SUBSCRIBE keeps backing off).
                session(&inner, conn, &channels, &tx, &mut || {
                    backoff.reset();
                    if reported.take().is_some() {
                        warn!(%target, channels = channels.len(), "shared-state subscription restored");
                    } else if !ever_up {
                        info!(%target, channels = channels.len(), "shared-state subscription up");
                    }
                    ever_up = true;
                })
                .await
            }
            Err(e) => End::Failed(e),
        };
        match end {
            End::Gone => break,
            End::Failed(e) => {
                if reported != Some(e.kind()) {
                    warn!(%target, error = %e, kind = e.kind(), "shared-state subscription down; retrying");
                    reported = Some(e.kind());
                }
            }
        }
        tokio::select! {
            biased;
            () = tx.closed() => break,
            () = tokio::time::sleep(backoff.next()) => {}
        }
    }
    debug!(%target, "shared-state subscription ended: its receiver was dropped");
}

/// Subscribes on `conn` and delivers messages until the connection fails or the receiver goes.
async fn session(
    inner: &Inner,
    mut conn: Conn<Stream>,
    channels: &[Vec<u8>],
    tx: &mpsc::Sender<Message>,
    on_up: &mut impl FnMut(),
) -> End {
    let opts = &inner.connector.opts;
    let mut args = vec![b"SUBSCRIBE".as_slice()];
    args.extend(channels.iter().map(Vec::as_slice));
    if let Err(e) = send(&mut conn, &args, opts.command_timeout).await {
        return End::Failed(e);
    }
    let mut confirmed = 0;
    let mut idle_at = Instant::now() + opts.ping_interval;
    let mut pinged = false;
    loop {
        let event = tokio::select! {
            biased;
            () = tx.closed() => Event::Gone,
            r = conn.reader.read(&mut conn.stream) => Event::Reply(r),
            () = sleep_until(idle_at) => Event::Idle,
        };
        let reply = match event {
            Event::Gone => return End::Gone,
            Event::Reply(Ok(reply)) => reply,
            Event::Reply(Err(e)) => return End::Failed(e),
            // Nothing since the PING, not even its answer: the server is gone without a FIN.
            Event::Idle if pinged => return End::Failed(Error::Timeout),
            Event::Idle => {
                if let Err(e) = send(&mut conn, &[b"PING"], opts.command_timeout).await {
                    return End::Failed(e);
                }
                pinged = true;
                idle_at = Instant::now() + opts.command_timeout;
                continue;
            }
        };
        pinged = false;
        idle_at = Instant::now() + opts.ping_interval;
        match classify(reply) {
            Ok(Push::Message(m)) => match tx.try_send(m) {
                Ok(()) => bump(&inner.counters.pubsub_messages, 1),
                Err(TrySendError::Full(_)) => bump(&inner.counters.pubsub_dropped, 1),
                Err(TrySendError::Closed(_)) => return End::Gone,
            },
            Ok(Push::Subscribed) => {
                confirmed += 1;
                if confirmed == channels.len() {
                    bump(&inner.counters.pubsub_connects, 1);
                    on_up();
                }
            }
            Ok(Push::Pong) => {}
            Err(e) => return End::Failed(e),
        }
    }
}

async fn send(conn: &mut Conn<Stream>, args: &[&[u8]], deadline: std::time::Duration) -> Result<(), Error> {
    timeout(deadline, conn.send(args)).await.unwrap_or(Err(Error::Timeout))
}

/// A reply on a subscribed connection: `message`, `subscribe` or `pong` pushes; a refusal
/// (`-NOPERM`, ...) or anything else ends the session.
fn classify(reply: Reply) -> Result<Push, Error> {
    let items = match reply {
        Reply::Array(items) => items,
        Reply::Error(e) => return Err(Error::Setup(format!("SUBSCRIBE: {e}"))),
        other => return Err(Error::Protocol(format!("unexpected reply on a subscription: {other:?}"))),
    };
    let kind = items.first().and_then(Reply::as_bytes).map(<[u8]>::to_ascii_lowercase);
    match (kind.as_deref(), items.as_slice()) {
        (Some(b"message"), [_, Reply::Bulk(channel), Reply::Bulk(payload)]) => {
            Ok(Push::Message(Message { channel: channel.clone(), payload: payload.clone() }))
        }
        (Some(b"subscribe"), [_, _, _]) => Ok(Push::Subscribed),
        (Some(b"pong"), _) => Ok(Push::Pong),
        _ => Err(Error::Protocol(format!("unexpected push on a subscription: {items:?}"))),
    }
}

#[cfg(test)]
mod tests;
