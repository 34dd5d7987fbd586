//! Learning from outcomes at run time: the route ids routed answers carry
//! (`x-route-id`; bounded in number and age), the verdicts and preferences
//! `POST /v1/route/feedback` brings back for them (each route judged once),
//! applied to [`model_select::Outcomes`]; Thompson sampling for decisions
//! whose algorithm is `bandit`; the state saved to a file and loaded at start.
//! Kept across reloads (decisions and pools are named, not numbered). With
//! `--shared-state`, shared with the other replicas ([`sharing`]): a route id
//! is taken by any of them, judged once by all, and every arm's evidence is
//! theirs together; with the backend out of reach each decides alone.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use model_select::{Arm, Outcomes, Rng};
use serde::Deserialize;
use serde_json::{Value, json};

use super::callers::{Caller, Callers, Limits, Refusal};
use crate::GatewayError;
use crate::metrics::LabeledCounter;
use crate::shared::feedback::Route;

mod sharing;

/// The response header naming a routed answer for feedback.
pub const ROUTE_ID_HEADER: &str = "x-route-id";
/// Largest feedback body read.
pub const MAX_FEEDBACK_BYTES: usize = 4096;
/// Largest state file loaded.
const MAX_STATE_BYTES: u64 = 64 << 20;

/// How much is remembered, for how long, and where it is kept.
#[derive(Debug, Clone)]
pub struct FeedbackConfig {
    /// Route ids remembered at most (the oldest forgotten first; `--route-feedback-routes`).
    pub max_routes: usize,
    /// How long a route id takes feedback (`--route-feedback-ttl-secs`; sharing state, also how
    /// long its record lives in the backend).
    pub ttl: Duration,
    /// (decision, pool) pairs with evidence kept at most (the least recently updated out first;
    /// sharing state, also in the backend, and read back).
    pub max_arms: usize,
    /// How many verdicts a pool's configured quality weighs as.
    pub prior_strength: f64,
    /// Loaded at start, saved every `save_interval` when changed and at shutdown (`--route-feedback-state`).
    pub state_file: Option<PathBuf>,
    /// Time between two saves (`--route-feedback-save-secs`).
    pub save_interval: Duration,
    /// Feedback bodies one caller sends a minute (`--route-feedback-per-minute`; 0: no bound).
    pub per_caller_per_minute: u32,
    /// Verdicts and preferences one caller moves one (decision, pool) arm by in an hour
    /// (`--route-feedback-caller-weight`; 0: no bound).
    pub caller_weight: u32,
    /// Callers whose rate and weight are remembered at most, the least recently seen out first.
    pub max_callers: usize,
}

impl Default for FeedbackConfig {
    fn default() -> Self {
        FeedbackConfig {
            max_routes: 100_000,
            ttl: Duration::from_secs(3600),
            max_arms: 10_000,
            prior_strength: 10.0,
            state_file: None,
            save_interval: Duration::from_secs(60),
            per_caller_per_minute: 120,
            caller_weight: 100,
            max_callers: 10_000,
        }
    }
}

/// What a route id stands for.
#[derive(Debug, Clone)]
struct Issued {
    decision: String,
    pool: String,
    /// The pool's configured quality when it was routed (the arm's prior).
    quality: Option<f64>,
    at: Instant,
    judged: bool,
    /// Who got the answer (a digest of its credentials; `None`: anonymous): only they judge it.
    caller: Option<[u8; 32]>,
}

/// The route ids given out, oldest first.
#[derive(Debug, Default)]
struct Routes {
    map: HashMap<u64, Issued>,
    order: VecDeque<u64>,
    /// Ids given out so far (what the next one is hashed from).
    issued: u64,
}

/// A feedback body read and admitted.
#[derive(Debug)]
enum Asked {
    Verdict { id: String, verdict: Verdict },
    Preference { winner: String, loser: String },
}

/// The feedback a client sends.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    route_id: Option<String>,
    verdict: Option<Verdict>,
    winner: Option<String>,
    loser: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Verdict {
    Good,
    Bad,
}

/// Route ids, outcomes and the bandit's generator.
#[derive(Debug)]
pub struct Learning {
    config: FeedbackConfig,
    routes: Mutex<Routes>,
    /// What each caller may still send and move.
    callers: Mutex<Callers>,
    outcomes: Mutex<Outcomes>,
    rng: Mutex<Rng>,
    /// Keyed at start: ids are neither sequential nor guessable.
    ids: RandomState,
    /// Changed since the last save.
    dirty: AtomicBool,
    /// The other replicas' side, once the gateway shares state ([`Learning::share`]).
    sharing: OnceLock<sharing::Sharing>,
    /// Feedback by `kind` (`verdict`, `preference`) and `outcome` (`accepted`, `unknown_route`,
    /// `already_judged`, `invalid`, `rate_limited`, `over_weight`).
    pub counts: LabeledCounter,
}

// === impl Learning ===

impl Learning {
    /// Nothing learned yet, or what `config.state_file` holds (an unreadable or invalid file is
    /// an error: the router does not start and forget silently).
    pub fn new(config: FeedbackConfig) -> Result<Self, String> {
        let outcomes = match &config.state_file {
            Some(path) => load(path, &config)?,
            None => Outcomes::new(config.prior_strength, config.max_arms),
        };
        let seed = RandomState::new().hash_one(0u64);
        let limits = Limits {
            per_minute: config.per_caller_per_minute,
            weight: config.caller_weight,
            max_callers: config.max_callers,
        };
        Ok(Learning {
            routes: Mutex::new(Routes::default()),
            callers: Mutex::new(Callers::new(limits)),
            outcomes: Mutex::new(outcomes),
            rng: Mutex::new(Rng::new(seed)),
            ids: RandomState::new(),
            dirty: AtomicBool::new(false),
            sharing: OnceLock::new(),
            counts: LabeledCounter::default(),
            config,
        })
    }

    /// Its configuration.
    pub fn config(&self) -> &FeedbackConfig {
        &self.config
    }

    /// A new route id for an answer `pool` gives under `decision` (the pool's configured quality
    /// seeds its arm), remembered until it is judged, expires or is pushed out.
    pub fn issue(&self, decision: &str, pool: &str, quality: Option<f64>) -> u64 {
        self.issue_for(decision, pool, quality, None)
    }

    /// [`Learning::issue`] for an answer `caller` gets: only `caller` may give its feedback.
    pub fn issue_for(&self, decision: &str, pool: &str, quality: Option<f64>, caller: Option<[u8; 32]>) -> u64 {
        let now = Instant::now();
        let mut routes = lock(&self.routes);
        let id = loop {
            routes.issued += 1;
            let id = self.ids.hash_one(routes.issued);
            if id != 0 && !routes.map.contains_key(&id) {
                break id;
            }
        };
        while routes.map.len() >= self.config.max_routes.max(1) || routes.expired_first(now, self.config.ttl) {
            let Some(old) = routes.order.pop_front() else { break };
            routes.map.remove(&old);
        }
        let (decision, pool) = (decision.to_owned(), pool.to_owned());
        let issued = Issued { decision, pool, quality, at: now, judged: false, caller };
        let route = self.sharing.get().map(|_| issued.route());
        routes.map.insert(id, issued);
        routes.order.push_back(id);
        drop(routes);
        if let Some(route) = route {
            self.publish(id, &route);
        }
        id
    }

    /// Forgets route `id` (an answer the client never got); unknown ids are ignored.
    pub fn forget(&self, id: u64) {
        // Its place in the order is dropped when it reaches the front.
        lock(&self.routes).map.remove(&id);
    }

    /// Route ids remembered now.
    pub fn routes_held(&self) -> usize {
        lock(&self.routes).map.len()
    }

    /// (decision, pool) pairs with evidence now.
    pub fn arms_held(&self) -> usize {
        lock(&self.outcomes).len()
    }

    /// The `bandit` algorithm: one of `candidates` ((pool, configured quality), in the
    /// decision's order) by Thompson sampling, with each one's evidence for the explain.
    pub(crate) fn choose(
        &self,
        decision: &str,
        candidates: &[(&str, Option<f64>)],
        bandit: &model_select::Bandit,
    ) -> (Option<usize>, Vec<Arm>) {
        let outcomes = lock(&self.outcomes);
        let arms = candidates.iter().map(|(p, q)| outcomes.arm(decision, p, *q)).collect();
        let chosen = outcomes.choose_satisficing(decision, candidates, bandit.min_quality, &mut lock(&self.rng));
        (chosen, arms)
    }

    /// Applies one feedback body; the answer names what it moved.
    pub fn feedback(&self, bytes: &[u8]) -> Result<Value, GatewayError> {
        self.feedback_from(bytes, None)
    }

    /// [`Learning::feedback`] from `caller`: a route id given to another caller is unknown to it;
    /// each caller's bodies are rate-limited, its weight in an arm bounded.
    /// This replica alone decides (see [`Learning::judge`] for every replica's).
    pub fn feedback_from(&self, bytes: &[u8], caller: Option<[u8; 32]>) -> Result<Value, GatewayError> {
        let asked = self.read(bytes, caller)?;
        self.apply(&asked, caller, &[])
    }

    /// The body's request, if it is one and `caller` may send it now.
    fn read(&self, bytes: &[u8], caller: Caller) -> Result<Asked, GatewayError> {
        let body: Body = serde_json::from_slice(bytes).map_err(|e| {
            self.count("unknown", "invalid");
            GatewayError::BadRequest(format!("feedback: {e}"))
        })?;
        let kind = if body.winner.is_some() { "preference" } else { "verdict" };
        if let Err(refusal) = lock(&self.callers).admit(caller, Instant::now()) {
            return Err(self.refuse(kind, refusal));
        }
        match body {
            Body { route_id: Some(id), verdict: Some(verdict), winner: None, loser: None } => {
                Ok(Asked::Verdict { id, verdict })
            }
            Body { route_id: None, verdict: None, winner: Some(winner), loser: Some(loser) } => {
                Ok(Asked::Preference { winner, loser })
            }
            _ => {
                self.count("unknown", "invalid");
                Err(GatewayError::BadRequest(
                    "feedback: give {\"route_id\", \"verdict\": \"good\" | \"bad\"} or {\"winner\", \"loser\"} (route ids)"
                        .into(),
                ))
            }
        }
    }

    /// Applies `asked` for `caller`; `remote[i]`: route `asked.ids[i]` as the backend had it,
    /// claimed for this feedback (used when this replica does not hold it).
    fn apply(&self, asked: &Asked, caller: Caller, remote: &[Option<Route>]) -> Result<Value, GatewayError> {
        match asked {
            Asked::Verdict { id, verdict } => self.verdict(id, *verdict, caller, remote),
            Asked::Preference { winner, loser } => self.preference(winner, loser, caller, remote),
        }
    }

    fn verdict(
        &self,
        id: &str,
        verdict: Verdict,
        caller: Caller,
        remote: &[Option<Route>],
    ) -> Result<Value, GatewayError> {
        let issued = self.claim(&[id], "verdict", caller, remote)?.remove(0);
        let good = matches!(verdict, Verdict::Good);
        let (before, arm) = {
            let mut outcomes = lock(&self.outcomes);
            let before = outcomes.arm(&issued.decision, &issued.pool, issued.quality);
            outcomes.verdict(&issued.decision, &issued.pool, issued.quality, good);
            (before, outcomes.arm(&issued.decision, &issued.pool, issued.quality))
        };
        self.dirty.store(true, Ordering::Relaxed);
        self.count("verdict", "accepted");
        self.push(&[(&issued, arm.since(&before))]);
        Ok(json!({"decision": issued.decision, "pool": issued.pool, "arm": arm_json(&arm)}))
    }

    fn preference(
        &self,
        winner: &str,
        loser: &str,
        caller: Caller,
        remote: &[Option<Route>],
    ) -> Result<Value, GatewayError> {
        let pair = self.claim(&[winner, loser], "preference", caller, remote)?;
        let (w, l) = (&pair[0], &pair[1]);
        let (wb, lb, wa, la) = {
            let mut outcomes = lock(&self.outcomes);
            let wb = outcomes.arm(&w.decision, &w.pool, w.quality);
            let lb = outcomes.arm(&l.decision, &l.pool, l.quality);
            outcomes.preference(&w.decision, (&w.pool, w.quality), (&l.pool, l.quality));
            (wb, lb, outcomes.arm(&w.decision, &w.pool, w.quality), outcomes.arm(&l.decision, &l.pool, l.quality))
        };
        self.dirty.store(true, Ordering::Relaxed);
        self.count("preference", "accepted");
        self.push(&[(w, wa.since(&wb)), (l, la.since(&lb))]);
        Ok(json!({
            "decision": w.decision,
            "winner": {"pool": w.pool, "arm": arm_json(&wa)},
            "loser": {"pool": l.pool, "arm": arm_json(&la)},
        }))
    }

    /// The routes `ids` name, marked judged; all or none (unknown, expired, given to another
    /// caller, judged, or, for a pair, not two pools of one decision: refused, nothing marked).
    /// `remote[i]`: `ids[i]`'s route claimed from the backend, for one this replica does not hold.
    fn claim(
        &self,
        ids: &[&str],
        kind: &str,
        caller: Caller,
        remote: &[Option<Route>],
    ) -> Result<Vec<Issued>, GatewayError> {
        let now = Instant::now();
        let mut routes = lock(&self.routes);
        let mut found = Vec::with_capacity(ids.len());
        for (i, text) in ids.iter().enumerate() {
            let key = parse_id(text);
            let local = key.and_then(|k| routes.map.get(&k)).cloned();
            let claimed = || remote.get(i).cloned().flatten().map(|r| Issued::claimed(r, now));
            // Another caller's route is as unknown as one never given out (nothing tells them apart).
            let issued =
                local.or_else(claimed).filter(|i| now.duration_since(i.at) <= self.config.ttl && i.caller == caller);
            let Some(issued) = issued else { return Err(self.unknown(kind, text)) };
            if issued.judged {
                return Err(self.judged(kind, text));
            }
            found.push((key.unwrap_or_default(), issued));
        }
        if let [(a, w), (b, l)] = found.as_slice()
            && (a == b || w.decision != l.decision || w.pool == l.pool)
        {
            self.count(kind, "invalid");
            return Err(GatewayError::Unprocessable(format!(
                "a preference compares two answers of one decision from two pools (here {}/{} and {}/{})",
                w.decision, w.pool, l.decision, l.pool
            )));
        }
        let arms: Vec<(&str, &str)> = found.iter().map(|(_, i)| (i.decision.as_str(), i.pool.as_str())).collect();
        let mut callers = lock(&self.callers);
        if let Err(refusal) = callers.weigh(caller, &arms, now) {
            return Err(self.refuse(kind, refusal));
        }
        callers.charge(caller, &arms, now);
        drop(callers);
        for (key, _) in &found {
            if let Some(i) = routes.map.get_mut(key) {
                i.judged = true;
            }
        }
        Ok(found.into_iter().map(|(_, i)| i).collect())
    }

    /// Counts an unknown route id and says it.
    fn unknown(&self, kind: &str, text: &str) -> GatewayError {
        self.count(kind, "unknown_route");
        GatewayError::NotFound(format!(
            "route id `{text}` (unknown, or older than the {} s it takes feedback)",
            self.config.ttl.as_secs()
        ))
    }

    /// Counts a route judged already and says it.
    fn judged(&self, kind: &str, text: &str) -> GatewayError {
        self.count(kind, "already_judged");
        GatewayError::Unprocessable(format!("route `{text}` was judged already"))
    }

    /// Counts `refusal` and says it (429: the route stays open for a later try).
    fn refuse(&self, kind: &str, refusal: Refusal) -> GatewayError {
        match refusal {
            Refusal::Rate { per_minute } => {
                self.count(kind, "rate_limited");
                GatewayError::FeedbackLimited(format!(
                    "feedback: over {per_minute} bodies a minute from this caller (--route-feedback-per-minute)"
                ))
            }
            Refusal::Weight { decision, pool, weight } => {
                self.count(kind, "over_weight");
                GatewayError::FeedbackLimited(format!(
                    "feedback: this caller moved {decision}/{pool} {weight} times in the last hour \
                     (--route-feedback-caller-weight)"
                ))
            }
        }
    }

    /// Callers whose rate and weight are remembered now.
    pub fn callers_held(&self) -> usize {
        lock(&self.callers).len()
    }

    fn count(&self, kind: &str, outcome: &str) {
        self.counts.inc(format_args!("kind=\"{kind}\",outcome=\"{outcome}\""));
    }

    /// Everything learned, as the state file holds it.
    pub fn snapshot(&self) -> Value {
        serde_json::to_value(&*lock(&self.outcomes)).unwrap_or(Value::Null)
    }

    /// Writes the state file if anything changed since the last write (a new file renamed over
    /// the old: a crash mid-write leaves the old one).
    pub fn save(&self) -> std::io::Result<bool> {
        let Some(path) = &self.config.state_file else { return Ok(false) };
        if !self.dirty.swap(false, Ordering::Relaxed) {
            return Ok(false);
        }
        let text = serde_json::to_vec(&*lock(&self.outcomes)).map_err(std::io::Error::other)?;
        let tmp = path.with_extension("tmp");
        let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path));
        if written.is_err() {
            self.dirty.store(true, Ordering::Relaxed);
        }
        written.map(|()| true)
    }
}

/// The id as the header shows it: 16 hex digits.
pub(crate) fn format_id(id: u64) -> String {
    format!("{id:016x}")
}

fn parse_id(text: &str) -> Option<u64> {
    (text.len() == 16).then(|| u64::from_str_radix(text, 16).ok()).flatten()
}

fn arm_json(arm: &Arm) -> Value {
    json!({"alpha": arm.alpha, "beta": arm.beta, "mean": arm.mean(), "elo": arm.elo, "updates": arm.updates})
}

fn load(path: &Path, config: &FeedbackConfig) -> Result<Outcomes, String> {
    use std::io::Read;
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        // The first start: the file comes with the first save.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Outcomes::new(config.prior_strength, config.max_arms));
        }
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut text = Vec::new();
    file.take(MAX_STATE_BYTES + 1).read_to_end(&mut text).map_err(|e| format!("{}: {e}", path.display()))?;
    if text.len() as u64 > MAX_STATE_BYTES {
        return Err(format!("{}: larger than {MAX_STATE_BYTES} bytes", path.display()));
    }
    let mut outcomes: Outcomes =
        serde_json::from_slice(&text).map_err(|e| format!("{}: not a feedback state file: {e}", path.display()))?;
    // The flags in force bound it, not the file's.
    outcomes.max_arms = config.max_arms.max(1);
    outcomes.prior_strength = config.prior_strength.max(0.0);
    Ok(outcomes)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// === impl Asked ===

impl Asked {
    /// Its `kind` label.
    fn kind(&self) -> &'static str {
        match self {
            Asked::Verdict { .. } => "verdict",
            Asked::Preference { .. } => "preference",
        }
    }

    /// The route ids it names (a preference's winner first).
    fn ids(&self) -> Vec<&str> {
        match self {
            Asked::Verdict { id, .. } => vec![id],
            Asked::Preference { winner, loser } => vec![winner, loser],
        }
    }
}

// === impl Issued ===

impl Issued {
    /// As the backend keeps it.
    fn route(&self) -> Route {
        Route { decision: self.decision.clone(), pool: self.pool.clone(), quality: self.quality, caller: self.caller }
    }

    /// A route claimed from the backend now (its own expiry was the backend's).
    fn claimed(route: Route, now: Instant) -> Self {
        let Route { decision, pool, quality, caller } = route;
        Issued { decision, pool, quality, at: now, judged: false, caller }
    }
}

// === impl Routes ===

impl Routes {
    /// Whether the oldest id is past `ttl`, or forgotten.
    fn expired_first(&self, now: Instant, ttl: Duration) -> bool {
        self.order.front().is_some_and(|id| self.map.get(id).is_none_or(|i| now.duration_since(i.at) > ttl))
    }
}

#[cfg(test)]
mod tests;
