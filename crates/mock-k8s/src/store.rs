//! The mock cluster's state, as etcd plus the watch cache hold it: the pods,
//! the one global resource-version counter, the history of changes watches
//! start from (bounded; what falls off or is compacted away answers 410), the
//! open watches' channels, and consistent snapshots at an older version for
//! `continue` tokens. One mutex serializes every write; it is never held
//! across an `.await`. The JSON form of a pod is `pod.rs`'s, HTTP is `http.rs`'s.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::pod::{Pod, StoredPod, timestamp};
use crate::selector::Selector;

/// The version the store starts at. Not 0: `resourceVersion=0` means "any"
/// in a request, so no real list ever answers it.
const INITIAL_RV: u64 = 1;

/// A pod's identity: namespace, then name (the order lists are sorted in).
pub(crate) type Key = (String, String);

/// Which namespaces a request sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scope {
    All,
    Namespace(String),
}

/// What a change did to its object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One change, as the watch cache keeps it: the object after (for a
/// deletion, its last state at the deletion's version) and before.
#[derive(Debug)]
pub(crate) struct Change {
    pub(crate) rv: u64,
    pub(crate) kind: ChangeKind,
    pub(crate) object: Arc<StoredPod>,
    pub(crate) prev: Option<Arc<StoredPod>>,
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// Synthetic `ADDED` events for the current state, then live.
    Now,
    /// Every change after this version, then live.
    After(u64),
}

/// Why a watch or list cannot be served at the version asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VersionError {
    /// Compacted away: 410 `Expired`. `oldest` is the newest version forgotten.
    TooOld { requested: u64, oldest: u64 },
    /// Not reached yet: 504 `Timeout` (the real server first waits up to 3 s).
    TooLarge { requested: u64, current: u64 },
}

/// An open watch: where it starts, its live changes, and the token that
/// [`Store::drop_watches`] cancels. Dropping it unregisters the watch.
#[derive(Debug)]
pub(crate) struct Subscription {
    pub(crate) initial: Vec<Arc<Change>>,
    pub(crate) rx: mpsc::Receiver<Arc<Change>>,
    /// The current version when it was opened (the first bookmark's).
    pub(crate) rv: u64,
    pub(crate) abort: CancellationToken,
    pub(crate) id: u64,
    store: Arc<Store>,
}

/// One page of a list.
#[derive(Debug)]
pub(crate) struct Page {
    /// The snapshot's version (every page of one list has the same).
    pub(crate) rv: u64,
    pub(crate) items: Vec<Arc<StoredPod>>,
    /// The last key returned, when more items remain.
    pub(crate) next: Option<Key>,
    /// How many selected items remain after this page.
    pub(crate) remaining: usize,
}

/// The whole state (see the module docs).
#[derive(Debug)]
pub(crate) struct Store {
    inner: Mutex<Inner>,
    history_limit: usize,
    channel: usize,
    /// How many watches are open (a channel, so tests can wait for a count).
    open: watch::Sender<usize>,
    shutdown: CancellationToken,
}

#[derive(Debug)]
struct Inner {
    rv: u64,
    /// Every change after this version is in `history`.
    compacted: u64,
    pods: BTreeMap<Key, Arc<StoredPod>>,
    history: VecDeque<Arc<Change>>,
    subscribers: Vec<(u64, mpsc::Sender<Arc<Change>>)>,
    next_id: u64,
    abort: CancellationToken,
}

// === impl Store ===

impl Store {
    /// An empty store keeping `history_limit` changes; each watch buffers up
    /// to `channel` changes before it is closed as too slow (the real watch
    /// cache closes an unresponsive watcher the same way). Watches end when
    /// `shutdown` is cancelled.
    pub(crate) fn new(history_limit: usize, channel: usize, shutdown: CancellationToken) -> Self {
        let inner = Inner {
            rv: INITIAL_RV,
            compacted: INITIAL_RV,
            pods: BTreeMap::new(),
            history: VecDeque::new(),
            subscribers: Vec::new(),
            next_id: 0,
            abort: shutdown.child_token(),
        };
        Self { inner: Mutex::new(inner), history_limit, channel: channel.max(1), open: watch::Sender::new(0), shutdown }
    }

    /// The current version.
    pub(crate) fn rv(&self) -> u64 {
        self.lock().rv
    }

    /// A pod's current description.
    pub(crate) fn get(&self, key: &Key) -> Option<Pod> {
        self.lock().pods.get(key).map(|p| p.pod.clone())
    }

    /// Creates or replaces a pod; the version of the change (the pod's own
    /// when nothing changed: a no-op update bumps nothing, as on the real server).
    pub(crate) fn upsert(&self, pod: Pod) -> u64 {
        let mut inner = self.lock();
        let key = pod.key();
        let next = match inner.pods.get(&key) {
            Some(prev) => StoredPod { pod, ..StoredPod::clone(prev) },
            None => StoredPod { pod, rv: 0, created: timestamp(SystemTime::now()), deleting: None },
        };
        self.commit(&mut inner, key, Some(next))
    }

    /// Changes a pod with `f` (which may not rename it); `None` when absent.
    pub(crate) fn update(&self, key: &Key, f: impl FnOnce(Pod) -> Pod) -> Option<u64> {
        let mut inner = self.lock();
        let prev = inner.pods.get(key)?;
        let mut pod = f(prev.pod.clone());
        (pod.namespace, pod.name) = key.clone();
        let next = StoredPod { pod, ..StoredPod::clone(prev) };
        Some(self.commit(&mut inner, key.clone(), Some(next)))
    }

    /// Sets `metadata.deletionTimestamp` (once); `None` when absent.
    pub(crate) fn start_deleting(&self, key: &Key) -> Option<u64> {
        let mut inner = self.lock();
        let prev = inner.pods.get(key)?;
        let deleting = prev.deleting.clone().or_else(|| Some(timestamp(SystemTime::now())));
        let next = StoredPod { deleting, ..StoredPod::clone(prev) };
        Some(self.commit(&mut inner, key.clone(), Some(next)))
    }

    /// Removes a pod; `None` when absent.
    pub(crate) fn delete(&self, key: &Key) -> Option<u64> {
        let mut inner = self.lock();
        inner.pods.contains_key(key).then(|| self.commit(&mut inner, key.clone(), None))
    }

    /// Forgets the whole history: a watch or `continue` from before now gets 410.
    pub(crate) fn compact(&self) {
        let mut inner = self.lock();
        inner.compacted = inner.rv;
        inner.history.clear();
    }

    /// Ends every open watch abruptly.
    pub(crate) fn drop_watches(&self) {
        let mut inner = self.lock();
        let fresh = self.shutdown.child_token();
        std::mem::replace(&mut inner.abort, fresh).cancel();
    }

    /// How many watches are open.
    pub(crate) fn watches_open(&self) -> usize {
        *self.open.borrow()
    }

    /// The number of open watches, as it changes.
    pub(crate) fn open_watches(&self) -> watch::Receiver<usize> {
        self.open.subscribe()
    }

    /// Opens a watch from `start`: its first events and its live channel,
    /// taken together under the lock so that nothing is missed or repeated.
    pub(crate) fn subscribe(self: &Arc<Self>, start: Start) -> Result<Subscription, VersionError> {
        let mut inner = self.lock();
        let initial = match start {
            Start::Now => inner
                .pods
                .values()
                .map(|p| Arc::new(Change { rv: p.rv, kind: ChangeKind::Added, object: p.clone(), prev: None }))
                .collect(),
            Start::After(requested) => {
                inner.check(requested)?;
                inner.history.iter().filter(|c| c.rv > requested).cloned().collect()
            }
        };
        let (tx, rx) = mpsc::channel(self.channel);
        let id = inner.next_id;
        inner.next_id += 1;
        inner.subscribers.push((id, tx));
        self.open.send_modify(|n| *n += 1);
        let abort = inner.abort.clone();
        Ok(Subscription { initial, rx, rv: inner.rv, abort, id, store: self.clone() })
    }

    /// One page of the pods `scope` and `selector` select, in key order
    /// after `after`, at most `limit` (`None`: all), as of version `at`
    /// (`None`: now). An older version is rebuilt from the history.
    pub(crate) fn list(
        &self,
        scope: &Scope,
        selector: &Selector,
        at: Option<u64>,
        after: Option<&Key>,
        limit: Option<usize>,
    ) -> Result<Page, VersionError> {
        let inner = self.lock();
        let rv = at.unwrap_or(inner.rv);
        inner.check(rv)?;
        let snapshot = inner.snapshot(rv);
        let selected = |(key, pod): &(&Key, &Arc<StoredPod>)| {
            scope.contains(&key.0) && after.is_none_or(|a| *key > a) && selector.matches(&pod.pod.labels)
        };
        let mut rest = snapshot.iter().filter(selected);
        let limit = limit.unwrap_or(usize::MAX);
        let items: Vec<Arc<StoredPod>> = rest.by_ref().take(limit).map(|(_, p)| p.clone()).collect();
        let remaining = rest.count();
        let next = (remaining > 0).then(|| items.last().map(|p| p.pod.key())).flatten();
        Ok(Page { rv, items, next, remaining })
    }

    /// Records a change of `key` to `next` (`None`: deleted) and tells every watch.
    fn commit(&self, inner: &mut Inner, key: Key, next: Option<StoredPod>) -> u64 {
        let prev = inner.pods.get(&key).cloned();
        if let (Some(p), Some(n)) = (&prev, &next)
            && p.pod == n.pod
            && p.deleting == n.deleting
        {
            return p.rv;
        }
        inner.rv += 1;
        let rv = inner.rv;
        let (kind, object) = match (next, &prev) {
            (Some(n), p) => {
                let object = Arc::new(StoredPod { rv, ..n });
                inner.pods.insert(key, object.clone());
                (if p.is_some() { ChangeKind::Modified } else { ChangeKind::Added }, object)
            }
            (None, Some(p)) => {
                inner.pods.remove(&key);
                (ChangeKind::Deleted, Arc::new(StoredPod { rv, ..StoredPod::clone(p) }))
            }
            (None, None) => unreachable!("delete checks presence"),
        };
        let change = Arc::new(Change { rv, kind, object, prev });
        inner.history.push_back(change.clone());
        while inner.history.len() > self.history_limit {
            if let Some(old) = inner.history.pop_front() {
                inner.compacted = old.rv;
            }
        }
        inner.subscribers.retain(|(id, tx)| match tx.try_send(change.clone()) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                warn!(watch = id, rv, "watch too slow: closing it");
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        });
        rv
    }

    fn unsubscribe(&self, id: u64) {
        self.lock().subscribers.retain(|(i, _)| *i != id);
        self.open.send_modify(|n| *n -= 1);
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent data (each write is one step).
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

// === impl Inner ===

impl Inner {
    /// Whether the state at `rv` can still be served (watched from, listed at).
    fn check(&self, requested: u64) -> Result<(), VersionError> {
        if requested < self.compacted {
            return Err(VersionError::TooOld { requested, oldest: self.compacted });
        }
        if requested > self.rv {
            return Err(VersionError::TooLarge { requested, current: self.rv });
        }
        Ok(())
    }

    /// The pods as they were at `rv` (checked): the current ones with every
    /// later change undone, newest first.
    fn snapshot(&self, rv: u64) -> BTreeMap<Key, Arc<StoredPod>> {
        let mut pods = self.pods.clone();
        for change in self.history.iter().rev().take_while(|c| c.rv > rv) {
            let key = change.object.pod.key();
            match &change.prev {
                Some(prev) => pods.insert(key, prev.clone()),
                None => pods.remove(&key),
            };
        }
        pods
    }
}

// === impl Scope ===

impl Scope {
    pub(crate) fn contains(&self, namespace: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Namespace(ns) => ns == namespace,
        }
    }
}

// === impl Subscription ===

impl Drop for Subscription {
    fn drop(&mut self) {
        self.store.unsubscribe(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Key {
        ("ns".into(), name.into())
    }

    fn names(page: &Page) -> Vec<&str> {
        page.items.iter().map(|p| p.pod.name.as_str()).collect()
    }

    #[test]
    fn versions_history_and_snapshots() {
        let store = Arc::new(Store::new(100, 8, CancellationToken::new()));
        let all = Selector::default();
        let first = store.upsert(Pod::new("ns", "a"));
        assert_eq!(first, INITIAL_RV + 1);
        assert_eq!(store.upsert(Pod::new("ns", "a")), first, "a no-op update bumps nothing");
        let b = store.upsert(Pod::new("ns", "b").label("x", "1"));
        let modified = store.update(&key("a"), |p| p.ready(true)).unwrap();
        let deleted = store.delete(&key("b")).unwrap();
        assert_eq!((b, modified, deleted), (first + 1, first + 2, first + 3));
        assert!(store.delete(&key("b")).is_none() && store.update(&key("b"), |p| p).is_none());
        let then = store.list(&Scope::All, &all, Some(b), None, None).unwrap();
        assert_eq!(names(&then), ["a", "b"]);
        assert!(!then.items[0].pod.ready, "a as it was at b's version");
        assert_eq!(names(&store.list(&Scope::All, &all, None, None, None).unwrap()), ["a"]);
        let sub = store.subscribe(Start::After(first)).unwrap();
        let kinds: Vec<_> = sub.initial.iter().map(|c| (c.rv, c.kind)).collect();
        assert_eq!(kinds, [(b, ChangeKind::Added), (modified, ChangeKind::Modified), (deleted, ChangeKind::Deleted)]);
        assert_eq!(sub.initial[2].object.rv, deleted, "a deletion carries the last state at its own version");
        assert_eq!(store.watches_open(), 1);
        drop(sub);
        assert_eq!(store.watches_open(), 0);
        store.compact();
        assert_eq!(
            store.subscribe(Start::After(first)).unwrap_err(),
            VersionError::TooOld { requested: first, oldest: deleted }
        );
        assert!(store.subscribe(Start::After(deleted)).is_ok());
        assert!(matches!(store.subscribe(Start::After(deleted + 1)), Err(VersionError::TooLarge { .. })));
        assert!(matches!(store.list(&Scope::All, &all, Some(b), None, None), Err(VersionError::TooOld { .. })));
    }

    #[test]
    fn history_is_bounded_and_slow_watches_are_closed() {
        let store = Arc::new(Store::new(2, 1, CancellationToken::new()));
        let mut sub = store.subscribe(Start::Now).unwrap();
        let first = store.upsert(Pod::new("ns", "a"));
        store.upsert(Pod::new("ns", "b"));
        store.upsert(Pod::new("ns", "c"));
        assert!(store.subscribe(Start::After(first - 1)).is_err(), "fell off the history");
        assert!(store.subscribe(Start::After(first)).is_ok());
        assert_eq!(sub.rx.try_recv().unwrap().rv, first);
        assert!(sub.rx.try_recv().is_err(), "closed when its buffer was full");
    }

    #[test]
    fn pages_in_key_order() {
        let store = Store::new(100, 8, CancellationToken::new());
        for (ns, name) in [("b", "x"), ("a", "z"), ("a", "y"), ("a-b", "w")] {
            store.upsert(Pod::new(ns, name));
        }
        let all = Selector::default();
        let page = store.list(&Scope::All, &all, None, None, Some(2)).unwrap();
        assert_eq!(names(&page), ["y", "z"]);
        assert_eq!((page.next.clone(), page.remaining), (Some(("a".into(), "z".into())), 2));
        let rest = store.list(&Scope::All, &all, Some(page.rv), page.next.as_ref(), Some(2)).unwrap();
        assert_eq!((names(&rest), rest.next.clone(), rest.remaining), (vec!["w", "x"], None, 0));
        let ns = store.list(&Scope::Namespace("a".into()), &all, None, None, None).unwrap();
        assert_eq!(names(&ns), ["y", "z"]);
    }
}
