//! The routing config in force, and replacing it while serving (SIGHUP, or
//! `POST /routing/reload` on the control plane, or a change of the
//! `RoutingConfig` resource it came from: [`apply`]): the new text is read and
//! validated first, and must keep the pools as they are (their workers,
//! models, policies and tokenizers were built at start); a bad file keeps
//! the config in force and says why. Requests in flight finish on the config
//! they started with.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use model_select::Selector;

use super::Routing;
use crate::Gateway;
use crate::metrics::LabeledCounter;

/// Longest a reload may take to read and check the file (a stalled file system is refused).
const RELOAD_TIMEOUT: Duration = Duration::from_secs(10);

/// Reloads `gw`'s routing config off the serving threads (reading a file
/// blocks), within [`RELOAD_TIMEOUT`]: SIGHUP and `POST /routing/reload`.
/// A reload given up on past the timeout never takes effect later, and one
/// that took effect is reported as such however long it took.
pub async fn reload(gw: &Arc<Gateway>) -> Result<Reloaded, Vec<String>> {
    run(gw, |slot, claim| slot.reload_claimed(claim)).await
}

/// Puts `text` (YAML or JSON: a `RoutingConfig` resource's spec), read from
/// `shown`, in force as a reload does (the same checks, the same timeout, the
/// same `outcome` counts): a resource's change.
pub async fn apply(gw: &Arc<Gateway>, text: String, shown: String) -> Result<Reloaded, Vec<String>> {
    run(gw, move |slot, claim| slot.counted(slot.install(&text, &shown, claim))).await
}

async fn run(
    gw: &Arc<Gateway>,
    f: impl FnOnce(&RoutingSlot, &Claim) -> Result<Reloaded, Vec<String>> + Send + 'static,
) -> Result<Reloaded, Vec<String>> {
    let gw2 = gw.clone();
    let claim = Arc::new(Claim::default());
    let claim2 = claim.clone();
    let mut work = tokio::task::spawn_blocking(move || match &gw2.routing {
        Some(slot) => f(slot, &claim2),
        None => Err(vec!["no routing config".to_owned()]),
    });
    let joined = match tokio::time::timeout(RELOAD_TIMEOUT, &mut work).await {
        Ok(joined) => joined,
        Err(_) if claim.abandon() => {
            return Err(vec![format!(
                "the reload took over {RELOAD_TIMEOUT:?} (reading the file, or embedding its examples): the config in force stays"
            )]);
        }
        // It is taking effect right now: its outcome is the answer.
        Err(_) => work.await,
    };
    joined.unwrap_or_else(|e| Err(vec![format!("the reload failed: {e}")]))
}

/// Where the routing config comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoutingSource {
    /// A file (`--routing-config`): reloads read it again.
    File(PathBuf),
    /// A `RoutingConfig` resource (shown as its kind and name): its changes are applied as they
    /// come ([`apply`]), a reload has nothing to read.
    Resource(String),
}

/// Who decides a slow reload's fate: the reload installing its config, or the
/// waiter giving up on it; whichever comes first.
#[derive(Debug, Default)]
struct Claim(AtomicU8);

impl Claim {
    const OPEN: u8 = 0;
    const INSTALLED: u8 = 1;
    const ABANDONED: u8 = 2;

    /// The reload may install its config (it was not given up on).
    fn install(&self) -> bool {
        self.0.compare_exchange(Self::OPEN, Self::INSTALLED, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// The waiter gives up (the reload has not installed its config).
    fn abandon(&self) -> bool {
        self.0.compare_exchange(Self::OPEN, Self::ABANDONED, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }
}

/// The routing config in force.
#[derive(Debug)]
pub struct RoutingSlot {
    current: RwLock<Arc<Routing>>,
    /// Where it came from (reloads read a file again).
    source: Option<RoutingSource>,
    /// Reloads by `outcome` (`ok`, `invalid`, `unreadable`).
    pub reloads: LabeledCounter,
    /// The embedding model, for embedding signals (kept across reloads).
    embedder: Option<embed::EmbedPool>,
    /// Route ids and what feedback taught (kept across reloads).
    learning: Arc<super::feedback::Learning>,
}

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// Decisions in the new config.
    pub decisions: usize,
    /// Signals defined in it.
    pub signals: usize,
}

// === impl RoutingSlot ===

impl RoutingSlot {
    /// `routing` in force, read from `source` (reloads need one), its
    /// embedding signals computed by `embedder`.
    pub fn new(
        routing: Routing,
        source: Option<RoutingSource>,
        embedder: Option<embed::EmbedPool>,
        learning: Arc<super::feedback::Learning>,
    ) -> Self {
        let current = RwLock::new(Arc::new(routing));
        RoutingSlot { current, source, reloads: LabeledCounter::default(), embedder, learning }
    }

    /// Route ids and what feedback taught.
    pub fn learning(&self) -> &Arc<super::feedback::Learning> {
        &self.learning
    }

    /// The embedding model's pool, if the router has one.
    pub fn embedder(&self) -> Option<&embed::EmbedPool> {
        self.embedder.as_ref()
    }

    /// The config in force now.
    pub fn current(&self) -> Arc<Routing> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Reads the source file again and puts it in force if it is valid and
    /// keeps the pools; `Err` holds every problem (`FILE:LINE: message`).
    pub fn reload(&self) -> Result<Reloaded, Vec<String>> {
        self.reload_claimed(&Claim::default())
    }

    /// [`reload`](Self::reload), installing only if `claim` was not given up on.
    fn reload_claimed(&self, claim: &Claim) -> Result<Reloaded, Vec<String>> {
        self.counted(self.try_reload(claim))
    }

    /// Counts a reload's outcome; `Err` keeps its problems.
    fn counted(&self, result: Result<Reloaded, (bool, Vec<String>)>) -> Result<Reloaded, Vec<String>> {
        let outcome = match &result {
            Ok(_) => "ok",
            Err((unreadable, _)) if *unreadable => "unreadable",
            Err(_) => "invalid",
        };
        self.reloads.inc(format_args!("outcome=\"{outcome}\""));
        result.map_err(|(_, problems)| problems)
    }

    fn try_reload(&self, claim: &Claim) -> Result<Reloaded, (bool, Vec<String>)> {
        let path = match &self.source {
            Some(RoutingSource::File(path)) => path,
            Some(RoutingSource::Resource(shown)) => {
                let why = format!(
                    "the routing config comes from the {shown} resource: its changes are applied as they come, there is no file to reload"
                );
                return Err((true, vec![why]));
            }
            None => return Err((true, vec!["the routing config was not read from a file: nothing to reload".into()])),
        };
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| (true, vec![format!("{shown}: cannot read it: {e}")]))?;
        self.install(&text, &shown, claim)
    }

    /// Checks `text` (read from `shown`) and puts it in force if it is valid and keeps the pools.
    fn install(&self, text: &str, shown: &str, claim: &Claim) -> Result<Reloaded, (bool, Vec<String>)> {
        let config = model_select::parse_yaml(text).map_err(|problems| {
            let at = |line: Option<usize>| line.map_or_else(|| shown.to_string(), |l| format!("{shown}:{l}"));
            (false, problems.iter().map(|p| format!("{}: {}", at(p.line), p.message)).collect::<Vec<_>>())
        })?;
        let old = self.current();
        if config.pools != old.selector.config().pools {
            let message = format!(
                "{shown}: the pools section changed; pools (their workers, models, policies, tokenizers) are built at start: restart the router to change them"
            );
            return Err((false, vec![message]));
        }
        let s = &config.signals;
        let signals = s.keywords.len()
            + s.regex.len()
            + s.pii.len()
            + s.context.len()
            + s.language.len()
            + s.conversation.len()
            + s.headers.len()
            + s.load.len()
            + s.embedding.len()
            + s.domain.as_ref().map_or(0, |d| d.labels.len() + 1)
            + s.jailbreak.len()
            + s.complexity.len()
            + s.reask.len();
        let decisions = config.decisions.len();
        let examples = self.embedder.as_ref().map(super::Examples);
        let selector = Selector::with_embedder(config, examples.as_ref().map(|e| e as &dyn model_select::Embedder))
            .map_err(|p| (false, p.iter().map(|e| format!("{shown}: {e}")).collect()))?;
        let next = Routing::succeeding(selector, &old).map_err(|e| (false, vec![format!("{shown}: {e}")]))?;
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        if !claim.install() {
            return Err((false, vec![format!("{shown}: given up on past {RELOAD_TIMEOUT:?}: not put in force")]));
        }
        *current = Arc::new(next);
        Ok(Reloaded { decisions, signals })
    }
}

#[cfg(test)]
mod tests {
    use super::Claim;

    #[test]
    fn a_slow_reload_is_either_installed_or_abandoned_never_both() {
        let c = Claim::default();
        assert!(c.install());
        assert!(!c.abandon(), "installed: the waiter reports its outcome");
        let c = Claim::default();
        assert!(c.abandon());
        assert!(!c.install(), "abandoned: it never takes effect");
    }
}
