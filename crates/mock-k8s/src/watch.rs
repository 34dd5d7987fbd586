//! One watch's event stream: newline-delimited JSON objects
//! `{"type": ..., "object": ...}` in a chunked 200 response. Owns turning
//! the store's changes into what this watcher may see (its namespace, its
//! label selector: a pod that stops matching is `DELETED`, one that starts
//! matching `ADDED`, as the real watch cache does), bookmarks, the
//! `timeoutSeconds` end, and the abrupt end of [`crate::MockApiServer::drop_watches`].
//! Parsing the request is `http.rs`'s; the versions and history are `store.rs`'s.

use std::io;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::{Instant, Interval};
use tracing::debug;

use crate::pod::StoredPod;
use crate::refusal::Refusal;
use crate::selector::Selector;
use crate::store::{Change, ChangeKind, Scope, Subscription};

/// Encoded events buffered between the watch task and the connection.
const BODY_BUFFER: usize = 64;

/// What a watch request asked for, beyond where it starts.
#[derive(Debug, Clone)]
pub(crate) struct WatchSpec {
    pub(crate) scope: Scope,
    pub(crate) selector: Selector,
    /// `allowWatchBookmarks=true` and a non-zero interval.
    pub(crate) bookmarks: Option<Duration>,
    /// `timeoutSeconds`.
    pub(crate) timeout: Option<Duration>,
    /// `sendInitialEvents=true`: end the initial events with a bookmark
    /// annotated `k8s.io/initial-events-end`.
    pub(crate) initial_events_end: bool,
}

/// Why a watch task stopped writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// `timeoutSeconds` elapsed: the response ends cleanly.
    Timeout,
    /// The client went away.
    Gone,
    /// `drop_watches` or shutdown: the connection is cut.
    Aborted,
    /// The store closed the watch (it fell too far behind): the response ends cleanly.
    Closed,
}

struct Watcher {
    spec: WatchSpec,
    sub: Subscription,
    tx: mpsc::Sender<io::Result<Bytes>>,
    /// The version of the newest change this watcher has been through
    /// (shown or not): what a bookmark may claim.
    seen: u64,
}

/// Streams the watch `sub` as a response body, written by a task of its own.
pub(crate) fn body(spec: WatchSpec, sub: Subscription) -> Body {
    let (tx, mut rx) = mpsc::channel(BODY_BUFFER);
    let seen = sub.rv;
    let watcher = Watcher { spec, sub, tx, seen };
    tokio::spawn(watcher.run());
    Body::from_stream(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
}

/// The one `ERROR` event of a watch from a version compacted away.
pub(crate) fn expired_event(requested: u64, oldest: u64) -> Bytes {
    let status = Refusal::Expired { requested, oldest, continued: false }.status();
    line(&json!({"type": "ERROR", "object": status}))
}

// === impl Watcher ===

impl Watcher {
    async fn run(mut self) {
        let id = self.sub.id;
        let end = self.serve().await;
        if end == End::Aborted {
            // An error in the body makes hyper cut the connection: no final chunk.
            let _ = self.tx.try_send(Err(io::Error::new(io::ErrorKind::ConnectionAborted, "watch dropped")));
        }
        debug!(watch = id, end = ?end, "watch ended");
    }

    async fn serve(&mut self) -> End {
        let initial = std::mem::take(&mut self.sub.initial);
        for change in &initial {
            if let Some(event) = self.event(change)
                && let Err(end) = self.emit(event).await
            {
                return end;
            }
        }
        if self.spec.initial_events_end {
            let mut bookmark = self.bookmark();
            bookmark["object"]["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
            if let Err(end) = self.emit(line(&bookmark)).await {
                return end;
            }
        }
        let deadline = self.spec.timeout.map(|t| Instant::now() + t);
        let mut ticker = self.spec.bookmarks.map(|every| {
            let mut t = tokio::time::interval_at(Instant::now() + every, every);
            // A slow client gets one bookmark when it catches up, not a burst.
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
        loop {
            let abort = self.sub.abort.clone();
            let event = tokio::select! {
                biased;
                () = abort.cancelled() => return End::Aborted,
                () = self.tx.closed() => return End::Gone,
                () = until(deadline) => return End::Timeout,
                change = self.sub.rx.recv() => match change {
                    Some(change) => {
                        self.seen = change.rv;
                        match self.event(&change) {
                            Some(event) => event,
                            None => continue,
                        }
                    }
                    None => return End::Closed,
                },
                () = tick(&mut ticker) => line(&self.bookmark()),
            };
            if let Err(end) = self.emit(event).await {
                return end;
            }
        }
    }

    /// Writes one event, unless the watch is aborted or the client gone first.
    async fn emit(&self, event: Bytes) -> Result<(), End> {
        tokio::select! {
            biased;
            () = self.sub.abort.cancelled() => Err(End::Aborted),
            sent = self.tx.send(Ok(event)) => sent.map_err(|_| End::Gone),
        }
    }

    /// What this watcher sees of `change`, if anything (the watch cache's rule).
    fn event(&self, change: &Change) -> Option<Bytes> {
        if !self.spec.scope.contains(&change.object.pod.namespace) {
            return None;
        }
        let now = change.kind != ChangeKind::Deleted && self.spec.selector.matches(&change.object.pod.labels);
        let before = change.prev.as_ref().is_some_and(|p| self.spec.selector.matches(&p.pod.labels));
        let (kind, object) = match (now, before) {
            (true, false) => ("ADDED", change.object.to_json(true)),
            (true, true) => ("MODIFIED", change.object.to_json(true)),
            (false, true) => {
                // The object as this watcher last saw it, at the change's version.
                let prev = change.prev.as_deref().map(|p| StoredPod { rv: change.rv, ..p.clone() });
                ("DELETED", prev.map(|p| p.to_json(true)).unwrap_or(Value::Null))
            }
            (false, false) => return None,
        };
        Some(line(&json!({"type": kind, "object": object})))
    }

    fn bookmark(&self) -> Value {
        let rv = self.seen.to_string();
        json!({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": rv}}})
    }
}

fn line(event: &Value) -> Bytes {
    let mut bytes = serde_json::to_vec(event).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn tick(ticker: &mut Option<Interval>) {
    match ticker {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// The watch filter, checked without a server.
#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::pod::Pod;
    use crate::store::{Start, Store};

    fn parse(bytes: &Bytes) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    #[tokio::test]
    async fn label_changes_are_adds_and_deletes_to_a_selecting_watcher() {
        let store = Arc::new(Store::new(100, 8, CancellationToken::new()));
        let rv = store.upsert(Pod::new("ns", "a").label("app", "x"));
        store.upsert(Pod::new("other", "a").label("app", "x"));
        let key = ("ns".to_string(), "a".to_string());
        store.update(&key, |p| p.label("app", "y"));
        store.update(&key, |p| p.label("app", "x"));
        store.update(&key, |p| p.ready(true));
        store.delete(&key);
        let sub = store.subscribe(Start::After(rv)).unwrap();
        let spec = WatchSpec {
            scope: Scope::Namespace("ns".into()),
            selector: crate::selector::Selector::parse("app=x").unwrap(),
            bookmarks: None,
            timeout: None,
            initial_events_end: false,
        };
        let (tx, _rx) = mpsc::channel(1);
        let changes = sub.initial.clone();
        let w = Watcher { spec, seen: sub.rv, sub, tx };
        let seen: Vec<(String, String)> = changes
            .iter()
            .filter_map(|c| w.event(c))
            .map(|b| parse(&b))
            .map(|v| (v["type"].as_str().unwrap().to_owned(), v["object"]["metadata"]["labels"]["app"].to_string()))
            .collect();
        let want = [("DELETED", "\"x\""), ("ADDED", "\"x\""), ("MODIFIED", "\"x\""), ("DELETED", "\"x\"")];
        assert_eq!(seen, want.map(|(a, b)| (a.to_owned(), b.to_owned())));
    }
}
