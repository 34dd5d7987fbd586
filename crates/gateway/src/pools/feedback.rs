//! Learning from outcomes at run time: the route ids routed answers carry
//! (`x-route-id`; bounded in number and age), the verdicts and preferences
//! `POST /v1/route/feedback` brings back for them (each route judged once),
//! applied to [`model_select::Outcomes`]; Thompson sampling for decisions
//! whose algorithm is `bandit`; the state saved to a file and loaded at start.
//! Kept across reloads (decisions and pools are named, not numbered). Per
//! router replica: replicas learn apart.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use model_select::{Arm, Outcomes, Rng};
use serde::Deserialize;
use serde_json::{Value, json};

use super::callers::{Caller, Callers, Limits, Refusal};
use crate::GatewayError;
use crate::metrics::LabeledCounter;

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
    /// How long a route id takes feedback (`--route-feedback-ttl-secs`).
    pub ttl: Duration,
    /// (decision, pool) pairs with evidence kept at most (the least recently updated out first).
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
        routes.map.insert(id, issued);
        routes.order.push_back(id);
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
    pub fn feedback_from(&self, bytes: &[u8], caller: Option<[u8; 32]>) -> Result<Value, GatewayError> {
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
                self.verdict(&id, verdict, caller)
            }
            Body { route_id: None, verdict: None, winner: Some(w), loser: Some(l) } => self.preference(&w, &l, caller),
            _ => {
                self.count("unknown", "invalid");
                Err(GatewayError::BadRequest(
                    "feedback: give {\"route_id\", \"verdict\": \"good\" | \"bad\"} or {\"winner\", \"loser\"} (route ids)"
                        .into(),
                ))
            }
        }
    }

    fn verdict(&self, id: &str, verdict: Verdict, caller: Caller) -> Result<Value, GatewayError> {
        let issued = self.claim(&[id], "verdict", caller)?.remove(0);
        let good = matches!(verdict, Verdict::Good);
        let arm = {
            let mut outcomes = lock(&self.outcomes);
            outcomes.verdict(&issued.decision, &issued.pool, issued.quality, good);
            outcomes.arm(&issued.decision, &issued.pool, issued.quality)
        };
        self.dirty.store(true, Ordering::Relaxed);
        self.count("verdict", "accepted");
        Ok(json!({"decision": issued.decision, "pool": issued.pool, "arm": arm_json(&arm)}))
    }

    fn preference(&self, winner: &str, loser: &str, caller: Caller) -> Result<Value, GatewayError> {
        let pair = self.claim(&[winner, loser], "preference", caller)?;
        let (w, l) = (&pair[0], &pair[1]);
        let (wa, la) = {
            let mut outcomes = lock(&self.outcomes);
            outcomes.preference(&w.decision, (&w.pool, w.quality), (&l.pool, l.quality));
            (outcomes.arm(&w.decision, &w.pool, w.quality), outcomes.arm(&l.decision, &l.pool, l.quality))
        };
        self.dirty.store(true, Ordering::Relaxed);
        self.count("preference", "accepted");
        Ok(json!({
            "decision": w.decision,
            "winner": {"pool": w.pool, "arm": arm_json(&wa)},
            "loser": {"pool": l.pool, "arm": arm_json(&la)},
        }))
    }

    /// The routes `ids` name, marked judged; all or none (unknown, expired, given to another
    /// caller, judged, or, for a pair, not two pools of one decision: refused, nothing marked).
    fn claim(&self, ids: &[&str], kind: &str, caller: Caller) -> Result<Vec<Issued>, GatewayError> {
        let now = Instant::now();
        let mut routes = lock(&self.routes);
        let mut found = Vec::with_capacity(ids.len());
        for text in ids {
            let key = parse_id(text);
            // Another caller's route is as unknown as one never given out (nothing tells them apart).
            let issued = key
                .and_then(|k| routes.map.get(&k))
                .filter(|i| now.duration_since(i.at) <= self.config.ttl && i.caller == caller);
            let Some(issued) = issued else {
                self.count(kind, "unknown_route");
                return Err(GatewayError::NotFound(format!(
                    "route id `{text}` (unknown, or older than the {} s it takes feedback)",
                    self.config.ttl.as_secs()
                )));
            };
            if issued.judged {
                self.count(kind, "already_judged");
                return Err(GatewayError::Unprocessable(format!("route `{text}` was judged already")));
            }
            found.push((key.unwrap_or_default(), issued.clone()));
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

// === impl Routes ===

impl Routes {
    /// Whether the oldest id is past `ttl`, or forgotten.
    fn expired_first(&self, now: Instant, ttl: Duration) -> bool {
        self.order.front().is_some_and(|id| self.map.get(id).is_none_or(|i| now.duration_since(i.at) > ttl))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No bound on one caller's rate or weight: these tests send everything as one caller.
    fn learning(max_routes: usize) -> Learning {
        let unbounded = FeedbackConfig { per_caller_per_minute: 0, caller_weight: 0, ..FeedbackConfig::default() };
        Learning::new(FeedbackConfig { max_routes, ..unbounded }).unwrap()
    }

    fn verdict(l: &Learning, id: u64, v: &str) -> Result<Value, GatewayError> {
        l.feedback(json!({"route_id": format_id(id), "verdict": v}).to_string().as_bytes())
    }

    #[test]
    fn a_route_is_judged_once_and_moves_its_arm() {
        let l = learning(10);
        let id = l.issue("hard", "large", Some(0.8));
        let out = verdict(&l, id, "bad").unwrap();
        let close = |v: &Value, x: f64| (v.as_f64().unwrap() - x).abs() < 1e-9;
        assert!(close(&out["arm"]["alpha"], 9.0), "prior 1 + 0.8 x 10, no good verdict: {out}");
        assert!(close(&out["arm"]["beta"], 4.0), "prior 1 + 0.2 x 10, one bad verdict: {out}");
        assert!(matches!(verdict(&l, id, "good"), Err(GatewayError::Unprocessable(_))), "judged once");
        assert!(matches!(verdict(&l, id ^ 1, "good"), Err(GatewayError::NotFound(_))));
        for bad in [&b"{"[..], br#"{"route_id": "x"}"#, br#"{"route_id": "x", "verdict": "meh"}"#, br#"{"extra": 1}"#] {
            assert!(matches!(l.feedback(bad), Err(GatewayError::BadRequest(_))), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn route_ids_are_bounded_and_expire() {
        let l = learning(3);
        let ids: Vec<u64> = (0..5).map(|_| l.issue("d", "p", None)).collect();
        assert_eq!(l.routes_held(), 3);
        assert!(matches!(verdict(&l, ids[0], "good"), Err(GatewayError::NotFound(_))), "pushed out");
        assert!(verdict(&l, ids[4], "good").is_ok());
        let short = Learning::new(FeedbackConfig { ttl: Duration::ZERO, ..FeedbackConfig::default() }).unwrap();
        let id = short.issue("d", "p", None);
        std::thread::sleep(Duration::from_millis(2));
        assert!(matches!(verdict(&short, id, "good"), Err(GatewayError::NotFound(_))), "expired");
        short.issue("d", "p", None);
        assert_eq!(short.routes_held(), 1, "the expired one made room");
    }

    #[test]
    fn a_forgotten_route_id_takes_no_room() {
        let l = learning(2);
        let (a, b) = (l.issue("d", "p", None), l.issue("d", "p", None));
        l.forget(b);
        assert_eq!(l.routes_held(), 1);
        assert!(matches!(verdict(&l, b, "good"), Err(GatewayError::NotFound(_))), "forgotten");
        l.issue("d", "p", None);
        assert!(verdict(&l, a, "good").is_ok(), "not pushed out: the forgotten one made room");
        l.forget(a ^ 1); // unknown: ignored
        assert_eq!(l.routes_held(), 2);
        // A forgotten oldest id holds back no expiry behind it.
        let ttl = Duration::from_millis(200);
        let short = Learning::new(FeedbackConfig { ttl, ..FeedbackConfig::default() }).unwrap();
        let first = short.issue("d", "p", None);
        short.issue("d", "p", None);
        short.forget(first);
        std::thread::sleep(ttl + Duration::from_millis(10));
        short.issue("d", "p", None);
        assert_eq!(short.routes_held(), 1, "the expired one behind the forgotten one made room");
    }

    #[test]
    fn a_preference_needs_two_pools_of_one_decision() {
        let l = learning(10);
        let (a, b, c) = (l.issue("d", "small", None), l.issue("d", "large", None), l.issue("e", "large", None));
        let pref = |w: u64, lo: u64| {
            l.feedback(json!({"winner": format_id(w), "loser": format_id(lo)}).to_string().as_bytes())
        };
        assert!(matches!(pref(a, c), Err(GatewayError::Unprocessable(_))), "two decisions");
        assert!(matches!(pref(a, a), Err(GatewayError::Unprocessable(_))), "one answer");
        let out = pref(b, a).unwrap();
        assert!(out["winner"]["arm"]["elo"].as_f64().unwrap() > model_select::ELO_START, "{out}");
        assert!(matches!(pref(b, a), Err(GatewayError::Unprocessable(_))), "both judged");
        assert!(verdict(&l, c, "good").is_ok(), "a refused pair marked nothing");
    }

    #[test]
    fn the_state_file_round_trips_and_a_bad_one_stops_the_start() {
        let dir = std::env::temp_dir().join(format!("sgl-feedback-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.json");
        let _ = std::fs::remove_file(&path);
        let config = FeedbackConfig { state_file: Some(path.clone()), ..FeedbackConfig::default() };
        let l = Learning::new(config.clone()).unwrap();
        assert!(!l.save().unwrap(), "nothing changed: nothing written");
        let id = l.issue("d", "p", None);
        verdict(&l, id, "good").unwrap();
        assert!(l.save().unwrap());
        let again = Learning::new(config.clone()).unwrap();
        assert_eq!(again.snapshot(), l.snapshot());
        assert_eq!(again.arms_held(), 1);
        std::fs::write(&path, b"{not json").unwrap();
        assert!(Learning::new(config).unwrap_err().contains("not a feedback state file"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_bandit_moves_to_the_pool_feedback_favours() {
        let l = learning(10_000);
        let candidates = [("small", Some(0.5)), ("large", Some(0.5))];
        for _ in 0..200 {
            let (chosen, _) = l.choose("d", &candidates, &model_select::Bandit::default());
            let pool = candidates[chosen.unwrap()].0;
            let id = l.issue("d", pool, Some(0.5));
            verdict(&l, id, if pool == "large" { "good" } else { "bad" }).unwrap();
        }
        let large =
            (0..1000).filter(|_| l.choose("d", &candidates, &model_select::Bandit::default()).0 == Some(1)).count();
        assert!(large > 950, "{large} of 1000 to the pool with good verdicts");
    }

    #[test]
    fn only_the_caller_who_got_an_answer_judges_it() {
        let l = Learning::new(FeedbackConfig::default()).unwrap();
        let (a, b) = (Some([1u8; 32]), Some([2u8; 32]));
        let id = l.issue_for("d", "p", None, a);
        let body = json!({"route_id": format_id(id), "verdict": "good"}).to_string();
        assert!(matches!(l.feedback_from(body.as_bytes(), b), Err(GatewayError::NotFound(_))), "another tenant");
        assert!(matches!(l.feedback_from(body.as_bytes(), None), Err(GatewayError::NotFound(_))), "anonymous");
        assert!(l.feedback_from(body.as_bytes(), a).is_ok(), "its own caller");
        let (x, y) = (l.issue_for("d", "small", None, a), l.issue_for("d", "large", None, b));
        let pair = json!({"winner": format_id(x), "loser": format_id(y)}).to_string();
        assert!(matches!(l.feedback_from(pair.as_bytes(), a), Err(GatewayError::NotFound(_))), "half another's");
    }

    #[test]
    fn one_callers_weight_in_an_arm_and_its_rate_are_bounded() {
        let config = FeedbackConfig { caller_weight: 5, per_caller_per_minute: 0, ..FeedbackConfig::default() };
        let l = Learning::new(config).unwrap();
        let (attacker, tenant) = (Some([1u8; 32]), Some([2u8; 32]));
        let say = |caller, pool: &str| {
            let id = l.issue_for("d", pool, None, caller);
            l.feedback_from(json!({"route_id": format_id(id), "verdict": "good"}).to_string().as_bytes(), caller)
        };
        let moved = (0..50).filter(|_| say(attacker, "large").is_ok()).count();
        assert_eq!(moved, 5, "the attacker's 50 verdicts weigh 5");
        assert_eq!(lock(&l.outcomes).arm("d", "large", None).alpha, 6.0 + 5.0, "prior 1 + 10·0.5, then 5 good");
        assert!(matches!(say(attacker, "large"), Err(GatewayError::FeedbackLimited(_))));
        say(attacker, "small").expect("another arm has its own bound");
        say(tenant, "large").expect("another caller's verdicts still count");
        assert_eq!(l.counts.get("kind=\"verdict\",outcome=\"over_weight\""), 46);
        // A refused verdict leaves the route open: once the bound is lifted it counts.
        let id = l.issue_for("d", "large", None, attacker);
        let body = json!({"route_id": format_id(id), "verdict": "bad"}).to_string();
        assert!(l.feedback_from(body.as_bytes(), attacker).is_err());
        *lock(&l.callers) = Callers::new(Limits { per_minute: 0, weight: 0, max_callers: 1 });
        l.feedback_from(body.as_bytes(), attacker).expect("not judged by the refusal");

        let config = FeedbackConfig { per_caller_per_minute: 3, caller_weight: 0, ..FeedbackConfig::default() };
        let l = Learning::new(config).unwrap();
        for _ in 0..3 {
            assert!(matches!(l.feedback_from(b"{}", attacker), Err(GatewayError::BadRequest(_))));
        }
        let id = l.issue_for("d", "large", None, attacker);
        let body = json!({"route_id": format_id(id), "verdict": "good"}).to_string();
        assert!(matches!(l.feedback_from(body.as_bytes(), attacker), Err(GatewayError::FeedbackLimited(_))));
        let other = l.feedback_from(body.as_bytes(), tenant);
        assert!(matches!(other, Err(GatewayError::NotFound(_))), "not its route, and not rate-limited either");
        assert_eq!(l.callers_held(), 2);
    }
}
