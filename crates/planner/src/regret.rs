//! Routing regret: how much of the prompt the best eligible worker held at decision time
//! against what the chosen one held, and what the difference was lost to: the load balance
//! (a policy trading cache for load), a guard (a liveness veto, the warm-up slice), or the
//! policy itself (a cache-blind rule, a client's routing key). Exact for workers whose KV
//! events are followed; a worker known only by a text tree counts as holding nothing.

use policy::Reason;
use serde_json::{Value, json};

/// What a lost prefix was lost to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// The policy chose a less loaded worker over a better cache hit.
    LoadBalance,
    /// A guard kept the request off the worker holding more: a liveness veto, the warm-up slice.
    Guard,
    /// The policy does not choose by cache (round robin, random, a text tree, a routing key).
    Policy,
}

impl Cause {
    /// Every cause, in label order.
    pub const ALL: [Cause; 3] = [Cause::LoadBalance, Cause::Guard, Cause::Policy];

    /// Its metric label.
    pub fn label(self) -> &'static str {
        match self {
            Cause::LoadBalance => "load_balance",
            Cause::Guard => "guard",
            Cause::Policy => "policy",
        }
    }

    /// What a decision for `reason` lost among its candidates is lost to.
    pub fn of(reason: Reason) -> Cause {
        match reason {
            Reason::LeastLoad
            | Reason::PowerOfTwo
            | Reason::CacheHitLessLoaded
            | Reason::NoCacheCandidate
            | Reason::Imbalanced => Cause::LoadBalance,
            Reason::Warmup | Reason::WarmupDivert => Cause::Guard,
            Reason::RoundRobin
            | Reason::Random
            | Reason::CacheHit
            | Reason::CacheHitSampled
            | Reason::TextTreeHit
            | Reason::HeadHashHit
            | Reason::TreeMatch
            | Reason::TreeMiss
            | Reason::RoutingKey => Cause::Policy,
        }
    }
}

/// One decision's regret, in KV blocks (pages) of the pool's page size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Regret {
    /// The deepest prefix any eligible worker held: the pool's routable workers of the
    /// candidates' role, those a liveness veto left out included.
    pub reachable: u64,
    /// The deepest prefix a candidate held (what the vetoes left).
    pub best_candidate: u64,
    /// What the chosen worker held.
    pub chosen: u64,
    /// Why the chosen worker held less than the best candidate.
    pub cause: Cause,
    /// Tokens per block.
    pub block_size: u64,
    /// Prompt tokens (a block count times the page size is capped by it).
    pub input_tokens: u64,
}

impl Regret {
    /// The regret of choosing a worker holding `chosen` blocks for `reason`.
    pub fn new(reachable: u64, best_candidate: u64, chosen: u64, reason: Reason) -> Self {
        let best_candidate = best_candidate.max(chosen);
        Regret {
            reachable: reachable.max(best_candidate),
            best_candidate,
            chosen,
            cause: Cause::of(reason),
            block_size: 1,
            input_tokens: u64::MAX,
        }
    }

    /// Blocks lost to each cause (the vetoes' share is the guard's).
    pub fn blocks_by_cause(&self) -> [(Cause, u64); 3] {
        let vetoed = self.reachable - self.best_candidate;
        let among = self.best_candidate - self.chosen;
        Cause::ALL.map(|c| {
            let lost = if c == self.cause { among } else { 0 } + if c == Cause::Guard { vetoed } else { 0 };
            (c, lost)
        })
    }

    /// Blocks lost in all.
    pub fn blocks(&self) -> u64 {
        self.reachable - self.chosen
    }

    /// Prompt tokens `blocks` stand for.
    pub fn tokens(&self, blocks: u64) -> u64 {
        blocks.saturating_mul(self.block_size).min(self.input_tokens)
    }

    /// Prompt tokens lost in all: what the best eligible worker held less what the chosen one did.
    pub fn lost_tokens(&self) -> u64 {
        self.tokens(self.reachable) - self.tokens(self.chosen)
    }

    /// As a decision trace shows it.
    pub fn to_json(&self) -> Value {
        let by_cause: serde_json::Map<String, Value> =
            self.blocks_by_cause().iter().map(|(c, b)| (c.label().to_string(), json!(b))).collect();
        json!({
            "blocks": self.blocks(),
            "tokens": self.lost_tokens(),
            "reachable_blocks": self.reachable,
            "best_candidate_blocks": self.best_candidate,
            "chosen_blocks": self.chosen,
            "blocks_by_cause": by_cause,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lost_prefix_is_split_between_the_vetoes_and_the_choice() {
        // A vetoed worker held 10 blocks, the best candidate 6; the policy chose one holding 2 for load.
        let r = Regret { block_size: 16, input_tokens: 150, ..Regret::new(10, 6, 2, Reason::CacheHitLessLoaded) };
        assert_eq!(r.blocks(), 8);
        assert_eq!(r.blocks_by_cause(), [(Cause::LoadBalance, 4), (Cause::Guard, 4), (Cause::Policy, 0)]);
        assert_eq!(r.lost_tokens(), 150 - 32, "the reachable prefix is capped by the prompt");
        let warm = Regret::new(6, 6, 0, Reason::Warmup);
        assert_eq!(warm.blocks_by_cause(), [(Cause::LoadBalance, 0), (Cause::Guard, 6), (Cause::Policy, 0)]);
        let rr = Regret::new(3, 3, 3, Reason::RoundRobin);
        assert_eq!((rr.blocks(), rr.lost_tokens()), (0, 0), "the best was chosen");
        assert_eq!(Regret::new(0, 0, 4, Reason::CacheHit).blocks(), 0, "never negative");
    }
}
