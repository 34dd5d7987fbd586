//! Which of a decision's pools serves the request: the hard filters (a
//! routable worker; a context window that holds the prompt, counted by the
//! pool's own tokenizer, plus `max_tokens`), then the decision's algorithm
//! (`static`: the first left; `multi_factor`: scored on the pools' live
//! state and prices). Also the live state itself, which load signals read.

use std::sync::Arc;

use model_select::{Algorithm, Candidate, Choice};
use serde_json::{Value, json};

use super::{Pool, Preview, Routing};
use crate::pipeline::request::Route;
use crate::{Gateway, GatewayError};

/// A pool now: its routable workers' requests in flight, the prefill queued
/// on the least loaded, and this prompt's estimated time to first token there.
#[derive(Debug, Clone, Copy)]
struct Live {
    in_flight: u64,
    /// `None`: no routable worker.
    queued: Option<u64>,
    est_ttft_ms: f64,
}

/// What the algorithm chose.
#[derive(Debug, Clone, Default)]
pub(super) struct Chosen {
    /// The pool (its position in the routing config's).
    pub(super) pool: usize,
    /// The pools that passed the hard filters.
    pub(super) eligible: Vec<usize>,
    /// `multi_factor`'s score of each candidate it scored (pool, score); empty for `static`.
    pub(super) scores: Vec<(usize, f64)>,
}

/// The pool the decision's algorithm picks among the candidates that pass
/// the hard filters. The request (its route, body and renders): each pool's
/// prompt count comes from its renderer's one render.
pub(super) fn pool(
    gw: &Gateway,
    routing: &Routing,
    choice: &Choice<'_>,
    (route, v, ask): (Route, &Value, &super::Asked<'_>),
    mut preview: Option<&mut Preview>,
) -> Result<Chosen, GatewayError> {
    let selector = &routing.selector;
    let max_tokens = max_tokens(v);
    // The request's one view of the fleet, for every candidate.
    let snapshot = ask.planner.workers;
    let mut why_not = Vec::new();
    // Each candidate's prompt tokens by its own tokenizer, rendered once per renderer, only when needed.
    let prompt_of = |p: &Pool| -> Option<u64> {
        ask.renders.tokens(ask.planner, &p.renderer, route, v).ok().map(|r| r.tokens.len() as u64)
    };
    let mut fits = |i: usize| -> bool {
        let p = routing.pool(i);
        let routable = pool_workers(snapshot, p).next().is_some();
        if !routable {
            why_not.push(format!("{}: no healthy worker", p.id));
            return false;
        }
        let Some(window) = p.context_window else { return true };
        match prompt_of(p) {
            Some(n) if n + max_tokens > window => {
                why_not.push(format!("{}: {n} prompt + {max_tokens} max tokens exceed its window of {window}", p.id));
                false
            }
            // Fits, or cannot be rendered here: the pool's own render reports that.
            _ => true,
        }
    };
    let name = choice.name();
    // Every candidate is checked: stickiness may keep the conversation on any that can serve it.
    let mut eligible: Vec<usize> = choice.pools.iter().copied().filter(|&i| fits(i)).collect();
    // `fit_context`: when no pool fits the chat whole, its pools are chosen among as if it did
    // (the chat is then cut for the chosen one).
    if eligible.is_empty() && choice.fits_context() {
        let routable = |&i: &usize| pool_workers(snapshot, routing.pool(i)).next().is_some();
        eligible = choice.pools.iter().copied().filter(routable).collect();
    }
    let (chosen, scores) = match choice.algorithm {
        Algorithm::Static => (eligible.first().copied(), Vec::new()),
        Algorithm::Bandit(bandit) => {
            let config = selector.config();
            let candidates: Vec<(&str, Option<f64>)> =
                eligible.iter().map(|&i| (routing.pool(i).id.0.as_str(), config.pools[i].quality)).collect();
            let (chosen, arms) = match &gw.routing {
                Some(slot) => slot.learning().choose(name, &candidates, bandit),
                None => (None, Vec::new()),
            };
            // The score shown is each posterior's mean (the draw that chose is random).
            if let Some(p) = preview.as_deref_mut() {
                let explain = |(&i, a): (&usize, &model_select::Arm)| json!({"pool": routing.pool(i).id, "mean": a.mean(), "alpha": a.alpha, "beta": a.beta, "elo": a.elo});
                p.scores = eligible.iter().zip(&arms).map(explain).collect();
            }
            (chosen.map(|c| eligible[c]), eligible.iter().zip(&arms).map(|(&i, a)| (i, a.mean())).collect())
        }
        Algorithm::MultiFactor(m) => {
            let config = selector.config();
            let candidates: Vec<Candidate> = eligible
                .iter()
                .map(|&i| {
                    let (p, c) = (routing.pool(i), &config.pools[i]);
                    let prompt = prompt_of(p).unwrap_or(0);
                    let live = live(snapshot, p, prompt);
                    let cost_usd = c.price.map_or(0.0, |price| {
                        (prompt as f64 * price.input_per_1m + max_tokens as f64 * price.output_per_1m) / 1e6
                    });
                    Candidate {
                        pool: i,
                        quality: c.quality.unwrap_or(0.5),
                        est_ttft_ms: live.est_ttft_ms,
                        queued_tokens: live.queued.unwrap_or(0),
                        in_flight: live.in_flight,
                        cost_usd,
                    }
                })
                .collect();
            let (chosen, scored) = m.choose(&candidates, selector.default_pool());
            // Stickiness may keep a conversation on a candidate only within its ceilings.
            let eligible: Vec<usize> = scored.iter().filter(|s| s.over.is_none()).map(|s| s.pool).collect();
            for s in scored.iter().filter_map(|s| Some((s, s.over.as_ref()?))) {
                why_not.push(format!("{}: {}", routing.pool(s.0.pool).id, s.1));
            }
            if let Some(p) = preview {
                p.scores = scored
                    .iter()
                    .map(|s| json!({"pool": routing.pool(s.pool).id, "score": s.score, "over_slo": s.over}))
                    .collect();
                p.passed_over.clone_from(&why_not);
                let pool = chosen.ok_or_else(|| no_pool(name, &why_not))?;
                let scores = scored.iter().map(|s| (s.pool, s.score)).collect();
                return Ok(Chosen { pool, eligible, scores });
            }
            (chosen, scored.iter().map(|s| (s.pool, s.score)).collect())
        }
    };
    if let Some(p) = preview {
        p.passed_over.clone_from(&why_not);
    }
    let pool = chosen.ok_or_else(|| no_pool(name, &why_not))?;
    Ok(Chosen { pool, eligible, scores })
}

/// `pool`'s routable workers in `snapshot`.
fn pool_workers<'a>(
    snapshot: &'a [Arc<fleet::Worker>],
    pool: &'a Pool,
) -> impl Iterator<Item = &'a Arc<fleet::Worker>> {
    snapshot.iter().filter(|w| pool.serves(w) && w.is_routable())
}

fn no_pool(decision: &str, why_not: &[String]) -> GatewayError {
    GatewayError::NoPool(format!("decision `{decision}`: no pool can serve it ({})", why_not.join("; ")))
}

/// `pool` now, for a prompt of `prompt_tokens`: requests in flight on its
/// routable workers (the router's count, or the worker's own report when
/// larger), the least queued prefill among them, and the estimated time to
/// the first token there (that queue and this prompt over the pool's rate;
/// infinite without a routable worker).
fn live(snapshot: &[Arc<fleet::Worker>], pool: &Pool, prompt_tokens: u64) -> Live {
    let workers = pool_workers(snapshot, pool);
    let (mut in_flight, mut queued) = (0u64, None::<u64>);
    for w in workers {
        in_flight += u64::from(w.decode_load().in_flight);
        let q = w.load().uncached_tokens;
        queued = Some(queued.map_or(q, |m| m.min(q)));
    }
    let est_ttft_ms = queued.map_or(f64::INFINITY, |q| (q + prompt_tokens) as f64 / pool.prefill_tokens_per_s * 1e3);
    Live { in_flight, queued, est_ttft_ms }
}

/// Every pool's live state, as load signals read it.
pub(super) fn pool_states<'r>(
    snapshot: &[Arc<fleet::Worker>],
    routing: &'r Routing,
    prompt_tokens: u64,
) -> Vec<model_select::PoolState<'r>> {
    routing
        .pools
        .iter()
        .map(|p| {
            let l = live(snapshot, p, prompt_tokens);
            model_select::PoolState { name: &p.id.0, in_flight: l.in_flight, est_ttft_ms: l.est_ttft_ms }
        })
        .collect()
}

/// The tokens the request may generate: `max_completion_tokens`,
/// `max_tokens`, or SGLang's `sampling_params.max_new_tokens` (0 when unset:
/// the engine's default is unknown here).
pub(super) fn max_tokens(v: &Value) -> u64 {
    ["max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|k| v.get(*k).and_then(Value::as_u64))
        .or_else(|| v.get("sampling_params")?.get("max_new_tokens")?.as_u64())
        .unwrap_or(0)
}
