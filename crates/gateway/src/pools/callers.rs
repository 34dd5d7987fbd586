//! What each caller may still teach the bandit: a token bucket of feedback
//! bodies per caller (`--route-feedback-per-minute`), and how many of its
//! verdicts and preferences each (decision, pool) arm took from it
//! in the last hour (`--route-feedback-caller-weight`): one client cannot drown
//! the others' evidence. Callers are bounded in number, the least recently seen
//! out first.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a caller's weight in its arms counts.
pub(crate) const WEIGHT_WINDOW: Duration = Duration::from_secs(3600);

/// A caller: the digest of its credentials, `None` for every anonymous one together.
pub(crate) type Caller = Option<[u8; 32]>;

/// Why a caller's feedback is refused.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Refusal {
    /// Its bucket is empty: `per_minute` bodies a minute at most.
    Rate { per_minute: u32 },
    /// It moved this arm `weight` times already.
    Weight { decision: String, pool: String, weight: u32 },
}

/// The bounds, from the flags.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Feedback bodies a caller sends a minute, the bucket's size too (0: no bound).
    pub per_minute: u32,
    /// Verdicts and preferences one caller moves one arm by in a [`WEIGHT_WINDOW`], at most (0: no bound).
    pub weight: u32,
    /// Callers remembered at most.
    pub max_callers: usize,
}

#[derive(Debug)]
struct State {
    tokens: f64,
    refilled: Instant,
    seen: u64,
    /// When its weights started counting.
    window: Instant,
    /// (decision, pool) → how many times this caller moved it since `window`.
    arms: HashMap<(String, String), u32>,
}

/// The callers seen, with what they may still do.
#[derive(Debug)]
pub(crate) struct Callers {
    limits: Limits,
    map: HashMap<Caller, State>,
    tick: u64,
}

impl Callers {
    pub(crate) fn new(limits: Limits) -> Self {
        Callers { limits, map: HashMap::new(), tick: 0 }
    }

    /// Takes one token from `caller`'s bucket for a feedback body, or refuses it.
    pub(crate) fn admit(&mut self, caller: Caller, now: Instant) -> Result<(), Refusal> {
        let per_minute = self.limits.per_minute;
        let state = self.state(caller, now);
        if per_minute == 0 {
            return Ok(());
        }
        let cap = f64::from(per_minute);
        let refill = now.saturating_duration_since(state.refilled).as_secs_f64() * cap / 60.0;
        state.tokens = (state.tokens + refill).min(cap);
        state.refilled = now;
        if state.tokens < 1.0 {
            return Err(Refusal::Rate { per_minute });
        }
        state.tokens -= 1.0;
        Ok(())
    }

    /// Whether `caller` may still move every one of `arms`.
    pub(crate) fn weigh(&self, caller: Caller, arms: &[(&str, &str)], now: Instant) -> Result<(), Refusal> {
        let weight = self.limits.weight;
        let counting = |s: &&State| weight > 0 && now.saturating_duration_since(s.window) < WEIGHT_WINDOW;
        let Some(state) = self.map.get(&caller).filter(counting) else { return Ok(()) };
        for (decision, pool) in arms {
            if state.arms.get(&((*decision).to_owned(), (*pool).to_owned())).copied().unwrap_or(0) >= weight {
                let (decision, pool) = ((*decision).to_owned(), (*pool).to_owned());
                return Err(Refusal::Weight { decision, pool, weight });
            }
        }
        Ok(())
    }

    /// Records that `caller` moved `arms`.
    pub(crate) fn charge(&mut self, caller: Caller, arms: &[(&str, &str)], now: Instant) {
        let state = self.state(caller, now);
        if now.saturating_duration_since(state.window) >= WEIGHT_WINDOW {
            state.arms.clear();
            state.window = now;
        }
        for (decision, pool) in arms {
            *state.arms.entry(((*decision).to_owned(), (*pool).to_owned())).or_default() += 1;
        }
    }

    /// Callers remembered now.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// `caller`'s state, made (a full bucket) if new, the least recently seen caller forgotten
    /// to make room.
    fn state(&mut self, caller: Caller, now: Instant) -> &mut State {
        self.tick += 1;
        if !self.map.contains_key(&caller) && self.map.len() >= self.limits.max_callers.max(1) {
            let oldest = self.map.iter().min_by_key(|(_, s)| s.seen).map(|(c, _)| *c);
            if let Some(oldest) = oldest {
                self.map.remove(&oldest);
            }
        }
        let tokens = f64::from(self.limits.per_minute);
        let state = self.map.entry(caller).or_insert_with(|| State {
            tokens,
            refilled: now,
            seen: 0,
            window: now,
            arms: HashMap::new(),
        });
        state.seen = self.tick;
        state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn callers(per_minute: u32, weight: u32, max_callers: usize) -> Callers {
        Callers::new(Limits { per_minute, weight, max_callers })
    }

    #[test]
    fn a_caller_gets_its_bucket_then_one_token_a_minute_over_the_rate() {
        let mut c = callers(3, 0, 10);
        let t0 = Instant::now();
        let (a, b) = (Some([1; 32]), Some([2; 32]));
        for _ in 0..3 {
            c.admit(a, t0).unwrap();
        }
        assert_eq!(c.admit(a, t0), Err(Refusal::Rate { per_minute: 3 }));
        c.admit(b, t0).expect("another caller has its own bucket");
        c.admit(a, t0 + Duration::from_secs(20)).expect("20 s refill one of 3 a minute");
        assert!(c.admit(a, t0 + Duration::from_secs(21)).is_err());
        let mut unbounded = callers(0, 0, 10);
        for _ in 0..1000 {
            unbounded.admit(a, t0).unwrap();
        }
    }

    #[test]
    fn a_callers_weight_in_an_arm_is_bounded_and_others_still_count() {
        let mut c = callers(0, 2, 10);
        let now = Instant::now();
        let (a, b) = (Some([1; 32]), None);
        c.charge(a, &[("d", "large")], now);
        c.weigh(a, &[("d", "large")], now).unwrap();
        c.charge(a, &[("d", "large"), ("d", "small")], now);
        let refused = c.weigh(a, &[("d", "small"), ("d", "large")], now);
        assert_eq!(refused, Err(Refusal::Weight { decision: "d".into(), pool: "large".into(), weight: 2 }));
        c.weigh(a, &[("d", "small")], now).expect("one verdict in `small`");
        c.weigh(b, &[("d", "large")], now).expect("the anonymous callers' own weight");
        let later = now + WEIGHT_WINDOW;
        c.weigh(a, &[("d", "large")], later).expect("an hour later the weight counts afresh");
        c.charge(a, &[("d", "large")], later);
        c.weigh(a, &[("d", "large")], later).expect("one in the new window");
    }

    #[test]
    fn callers_are_bounded_the_least_recently_seen_out() {
        let mut c = callers(1, 0, 2);
        let now = Instant::now();
        let (a, b, d) = (Some([1; 32]), Some([2; 32]), Some([3; 32]));
        c.admit(a, now).unwrap();
        c.admit(b, now).unwrap();
        assert!(c.admit(a, now).is_err(), "a is seen again: b is the oldest");
        c.admit(d, now).unwrap();
        assert_eq!(c.len(), 2);
        assert!(c.admit(a, now).is_err(), "a kept its empty bucket");
        c.admit(b, now).expect("b was forgotten: a full bucket");
    }
}
