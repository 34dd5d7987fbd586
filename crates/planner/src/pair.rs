//! A prefill/decode pair of a disaggregated pool ([`Pair`]): the prefill
//! worker by the pool's policy (prefix and load), the decode worker by the
//! pool's decode policy over load only.

use std::sync::Arc;

use fleet::LoadGuard;
use router_types::{DpRank, Role, WorkerId};
use serde_json::{Value, json};

use crate::{PdConfig, PdMode, Plan, PlanError, Planner, Pool, Prompted};

/// The two choices of one attempt.
#[derive(Debug)]
pub struct Pair {
    pub prefill: Plan,
    pub decode: Plan,
    /// The decode worker serves the request alone, prefilling it locally ([`crate::SkipPrefill`]).
    pub decode_alone: bool,
}

impl Pair {
    /// The prefill rank a vLLM leg is hinted to (the rank holding the prefix, else the least
    /// loaded one), on a data-parallel prefill only.
    pub fn vllm_rank(&self) -> Option<DpRank> {
        let p = self.prefill.chosen();
        let dp = p.dp_size();
        self.prefill.rank.or_else(|| p.least_loaded_rank()).filter(|r| r.0 < dp && dp > 1)
    }

    /// Charges the prefill worker (on `rank`) with the prompt tokens it does not hold, and the
    /// decode worker with the request: the loads held until each leg ends.
    pub fn charge(&self, rank: Option<DpRank>) -> (LoadGuard, LoadGuard) {
        let uncached = self.prefill.input_tokens.saturating_sub(self.prefill.matched_tokens());
        // The decode leg prefills nothing: a request, no tokens.
        let counted = (self.prefill.input_tokens > 0).then_some(uncached);
        (self.prefill.chosen().charge_on(counted, rank), self.decode.chosen().charge(0))
    }

    /// The policies learn where the request goes (the prefill worker was credited with the
    /// prompt's pages when it was chosen).
    pub fn commit(&self, pd: &PdConfig) {
        self.prefill.commit();
        self.decode.commit_to(&*pd.decode_policy);
    }
}

/// Chooses a pair among `pool`'s workers: the prefill worker by the pool's policy (prefix and
/// load), the decode worker by `pd`'s decode policy over load only; workers in `avoid` are left
/// out where others remain. `prompt`: the prompt's tokens and text by the pool's renderer.
/// `credit`: the request goes to this pair (with `credit_pending` the prefill worker is credited
/// with the prompt's pages; never for an explain).
#[allow(clippy::too_many_arguments)]
pub fn pair(
    p: Planner<'_>,
    (pool, pd): (&Arc<Pool>, &PdConfig),
    v: &Value,
    prompt: &crate::Rendered,
    key: Option<&[u8]>,
    avoid: &[WorkerId],
    credit: bool,
) -> Result<Pair, PlanError> {
    let pick = |role: fn(Role) -> bool| {
        let all = p.routable(|w| role(w.role) && w.pool == pool.id)?;
        let fresh: Vec<_> = all.iter().filter(|w| !avoid.contains(&w.id)).cloned().collect();
        Ok::<_, PlanError>(if fresh.is_empty() { all } else { fresh })
    };
    let prefills = pick(|r| matches!(r, Role::Prefill { .. }))?;
    let decodes = pick(|r| r == Role::Decode)?;
    if prefills.is_empty() || decodes.is_empty() {
        return Err(PlanError::NoWorker);
    }
    let crate::Rendered { tokens, text, mm } = prompt;
    let prompted = Prompted { v: Some(v), tokens, text: text.clone(), mm, match_prefix: true, credit };
    let prefill = p.plan_in(pool, &*pool.policy, prefills, prompted, key)?;
    // Conditional disaggregation (vLLM): the decode workers are matched against the index too
    // (what they pulled or prefilled themselves), so the decode policy may choose by prefix,
    // and a prompt the chosen one would prefill little of itself skips the prefill leg.
    let skip = &pd.skip_prefill;
    let conditional = skip.enabled() && pd.mode == PdMode::Vllm;
    let decode_prompt = match conditional {
        true => Prompted { v: Some(v), tokens, text: None, mm, match_prefix: true, credit: false },
        false => Prompted { v: None, tokens: &[], text: None, mm: &[], match_prefix: false, credit: false },
    };
    let decode = p.plan_in(pool, &*pd.decode_policy, decodes, decode_prompt, None)?;
    // Matched only with a rule on: otherwise the decode plan holds nothing.
    let decode_alone = conditional && skip.skips(prefill.input_tokens, decode.matched_tokens());
    Ok(Pair { prefill, decode, decode_alone })
}

/// A decided pair as an explain (`/debug/route`) shows it.
pub fn pair_json(pd: &PdConfig, pair: &Pair) -> Value {
    let leg = |plan: &Plan, policy: &str| {
        json!({
            "worker": plan.chosen().url,
            "dp_rank": plan.rank.map(|r| r.0),
            "policy": policy,
            "reason": plan.decision.reason.as_str(),
            "regret": plan.regret.to_json(),
            "candidates": plan.candidates_json(),
        })
    };
    json!({
        "pool": pair.prefill.pool.id,
        "mode": match pd.mode { PdMode::Sglang => "sglang", PdMode::Vllm => "vllm" },
        "input_tokens": pair.prefill.input_tokens,
        "prefill": leg(&pair.prefill, pair.prefill.pool.policy.name()),
        "decode": leg(&pair.decode, pd.decode_policy.name()),
        "decode_held_tokens": pair.decode.matched_tokens(),
        "decode_alone": pair.decode_alone,
    })
}
