//! The plan phase: a request's prompt rendered by its pool's renderer, its
//! page hashes matched against the KV index, and the pool's policy choosing
//! among the routable workers ([`Plan`]). Synchronous and side-effect free
//! but for the pending credit of the chosen worker (with `credit_pending`).
//! Used by the data plane, the PD pairing, stickiness and the explain routes.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;

use policy::{Candidate, Decision, RequestInfo};
use renderer::{ChatRequest, PageHasher, Prompt};
use router_types::DpRank;
use serde_json::{Value, json};

use crate::request::Route;
use crate::{Gateway, GatewayError};
use fleet::Worker;

/// A routing decision and what it was based on.
#[derive(Debug)]
pub(crate) struct Plan {
    /// The pool it chose in (its index in the gateway's pools).
    pub(crate) pool: usize,
    /// The routable workers, in the order of `candidates`.
    pub(crate) workers: Vec<Arc<Worker>>,
    pub(crate) candidates: Vec<Candidate>,
    pub(crate) decision: Decision,
    /// The position of the chosen worker in `workers` and `candidates`.
    pub(crate) chosen: usize,
    pub(crate) input_tokens: u64,
    /// The prompt's text, when the policy reads it.
    pub(crate) text: Option<String>,
    pub(crate) rank: Option<DpRank>,
}

impl Plan {
    pub(crate) fn chosen(&self) -> &Arc<Worker> {
        &self.workers[self.chosen]
    }

    /// The candidates as an explain shows them.
    pub(crate) fn candidates_json(&self) -> Vec<Value> {
        self.candidates
            .iter()
            .zip(&self.workers)
            .map(|(c, w)| json!({"worker": w.url, "id": w.id, "matched_tokens": c.matched_tokens, "in_flight": c.load.in_flight}))
            .collect()
    }

    /// What the policy saw of the request.
    pub(crate) fn request(&self) -> RequestInfo<'_> {
        RequestInfo { input_tokens: self.input_tokens, text: self.text.as_deref() }
    }

    /// Tells the policy the request really goes where it decided (never for an explain).
    pub(crate) fn commit(&self, gw: &Gateway) {
        self.commit_to(&*gw.pools[self.pool].policy);
    }

    /// Tells `policy` (the one that decided) the request really goes where it decided.
    pub(crate) fn commit_to(&self, policy: &dyn policy::Policy) {
        policy.commit(&self.decision, &self.candidates, &self.request());
    }
}

/// A prompt's tokens (empty when not needed) and text.
pub(crate) type Rendered = (Vec<u32>, Option<String>);

/// Tokens and text of the request, by `pool`'s renderer (the tokens only
/// when the index or the pool's policy reads them).
pub(crate) fn prompt(
    gw: &Gateway,
    pool: &crate::pool::Pool,
    route: Route,
    v: &Value,
) -> Result<(Vec<u32>, Option<String>), GatewayError> {
    let need_tokens = gw.index.is_some() || pool.policy.needs_tokens();
    render_prompt(gw, &pool.renderer, route, v, need_tokens)
}

/// A request's prompt rendered at most once per renderer (template and tokenizer): the
/// signals, each candidate pool's window, stickiness and the plan read the same render.
/// Forgotten when a plugin rewrites the prompt. One per request, used on one thread.
#[derive(Debug, Default)]
pub(crate) struct Renders(std::cell::RefCell<Vec<(Arc<renderer::Renderer>, Rendered)>>);

impl Renders {
    /// The request's tokens and text by `renderer`, rendered now if not before.
    pub(crate) fn tokens(
        &self,
        gw: &Gateway,
        renderer: &Arc<renderer::Renderer>,
        route: Route,
        v: &Value,
    ) -> Result<Rendered, GatewayError> {
        if let Some((_, r)) = self.0.borrow().iter().find(|(k, _)| Arc::ptr_eq(k, renderer)) {
            return Ok(r.clone());
        }
        let r = render_prompt(gw, renderer, route, v, true)?;
        self.0.borrow_mut().push((renderer.clone(), r.clone()));
        Ok(r)
    }

    /// What `renderer` rendered already, if it did; moved out for the `last` reader (no copy).
    fn get(&self, renderer: &Arc<renderer::Renderer>, last: bool) -> Option<Rendered> {
        let mut memo = self.0.borrow_mut();
        let i = memo.iter().position(|(k, _)| Arc::ptr_eq(k, renderer))?;
        Some(if last { memo.swap_remove(i).1 } else { memo[i].1.clone() })
    }

    /// The prompt changed (a plugin rewrote it): every render is stale.
    pub(crate) fn forget(&self) {
        self.0.borrow_mut().clear();
    }
}

/// Tokens (when `need_tokens`) and text of the request, by `renderer`; counted
/// (`router_prompt_renders_total`).
pub(crate) fn render_prompt(
    gw: &Gateway,
    renderer: &renderer::Renderer,
    route: Route,
    v: &Value,
    need_tokens: bool,
) -> Result<(Vec<u32>, Option<String>), GatewayError> {
    gw.metrics.renders.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let vocab = renderer.tokenizer().vocab_size();
    match route {
        Route::Chat => {
            let req = ChatRequest::from_value(v)?;
            if need_tokens {
                let r = renderer.render_chat(&req)?;
                Ok((r.token_ids, Some(r.text)))
            } else {
                Ok((Vec::new(), Some(renderer.render_text(&req)?)))
            }
        }
        // Never asked: these routes' bodies are not parsed (`parse_body`).
        Route::Embeddings | Route::Rerank | Route::Classify => Ok((Vec::new(), None)),
        Route::Completions | Route::Generate => {
            let p = if route == Route::Completions {
                Prompt::from_completions(v.get("prompt").unwrap_or(&Value::Null), vocab)?
            } else {
                Prompt::from_generate(v, vocab)?
            };
            let text = match &p {
                Prompt::Text(t) => Some(t.clone()),
                Prompt::Tokens(_) => None,
            };
            let tokens = if need_tokens { renderer.prompt_tokens(&p)? } else { Vec::new() };
            Ok((tokens, text))
        }
    }
}

/// Chooses a worker of pool `pool`: candidates with their load and cached
/// prefix, then the pool's policy, unless the client's routing key names the
/// worker. `renders`: the request's prompt as renderers made it already (the routing
/// config's signals, the pools' windows), else rendered here when read. `credit`: the
/// request is sent where the plan says (the chosen worker is credited with its pages).
pub(crate) fn plan(
    gw: &Gateway,
    pool: usize,
    route: Route,
    v: Option<&Value>,
    key: Option<&[u8]>,
    renders: &Renders,
    credit: bool,
) -> Result<Plan, GatewayError> {
    let p = &gw.pools[pool];
    // Rendered only for what reads it (a body parsed for its model alone is not rendered).
    let reads = gw.index.is_some() || p.policy.needs_tokens() || p.policy.needs_text();
    let (tokens, text) = match v {
        // The request's own plan (`credit`) reads the prompt last: it takes the render, and one
        // made here is not kept (no copy of the tokens on the way).
        Some(v) if reads && route.has_prompt() => match renders.get(&p.renderer, credit) {
            Some(r) => r,
            None if !credit && (gw.index.is_some() || p.policy.needs_tokens()) => {
                renders.tokens(gw, &p.renderer, route, v)?
            }
            None => prompt(gw, p, route, v)?,
        },
        _ => (Vec::new(), None),
    };
    let workers = routable(gw, |w| p.serves(w));
    plan_in(gw, pool, &*p.policy, workers, Prompted { v, tokens: &tokens, text, match_prefix: true, credit }, key)
}

/// The routable workers `keep` accepts.
pub(crate) fn routable(gw: &Gateway, keep: impl Fn(&Worker) -> bool) -> Vec<Arc<Worker>> {
    gw.fleet.snapshot().iter().filter(|w| keep(w) && w.is_routable()).cloned().collect()
}

/// What a plan knows of the request's prompt.
pub(crate) struct Prompted<'a> {
    /// The parsed body (`None`: not parsed, nothing to match).
    pub(crate) v: Option<&'a Value>,
    pub(crate) tokens: &'a [u32],
    pub(crate) text: Option<String>,
    /// Match the prompt against the index (false: every candidate holds nothing, as a decode
    /// worker's KV comes from its prefill, never from its own cache).
    pub(crate) match_prefix: bool,
    /// The request goes where the plan says: with `credit_pending`, the chosen worker is
    /// credited with the prompt's pages before another plan matches (not for a preview).
    pub(crate) credit: bool,
}

/// Chooses one of `workers` with `policy`: candidates with their load and
/// cached prefix, unless the client's routing key names the worker.
pub(crate) fn plan_in(
    gw: &Gateway,
    pool: usize,
    policy: &dyn policy::Policy,
    workers: Vec<Arc<Worker>>,
    prompted: Prompted<'_>,
    key: Option<&[u8]>,
) -> Result<Plan, GatewayError> {
    let Prompted { v, tokens, text, match_prefix, credit } = prompted;
    if workers.is_empty() {
        return Err(GatewayError::NoWorker);
    }
    let v = v.filter(|_| match_prefix);
    let text = text.filter(|_| match_prefix);
    let input_tokens = tokens.len() as u64;
    // The pool's page size, read once: a worker followed meanwhile may fix it.
    let block_size = gw.fleet.block_size_of(&gw.pools[pool].id);
    // A mixed fleet is matched in each mode; a worker's blocks exist in its own mode only.
    let mut chains = Vec::new();
    if let (Some(index), Some(v)) = (&gw.index, v) {
        let page = NonZeroUsize::new(block_size).unwrap_or(NonZeroUsize::MIN);
        // The request's namespace starts its chain, as the engine's does.
        let served = || {
            let mut names: Vec<String> = workers.iter().filter_map(|w| w.info()?.model_id).collect();
            names.push(gw.pools[pool].served_model.clone());
            names
        };
        let ns = crate::namespace::of_request(v, served, Some(index));
        let prior = renderer::hash::namespace_prior(ns.adapter, ns.salt);
        let memo = &gw.pools[pool].chain_memo;
        chains = gw
            .fleet
            .hash_modes()
            .modes()
            .map(|m| memo.block_hashes(&PageHasher::new(page, m), tokens, prior.as_ref()))
            .collect();
    }
    // From the match to the credit, one plan at a time (the pages hashed before): a burst
    // sharing a cold prefix would otherwise be matched before any of it is credited, and
    // spread over the workers.
    let credit = credit && match_prefix && gw.config.credit_pending;
    let _one_at_a_time = credit.then(|| gw.credit_lock.lock().unwrap_or_else(|p| p.into_inner()));
    let mut matched: HashMap<kv_index::WorkerId, (u32, Option<DpRank>)> = HashMap::new();
    if let Some(index) = &gw.index {
        for chain in &chains {
            for m in index.prefix_depths(chain, &kv_index::MatchOptions::default()) {
                let e = matched.entry(m.worker).or_insert((0, None));
                if m.blocks > e.0 {
                    *e = (m.blocks, m.rank);
                }
            }
        }
    }
    let bs = block_size as u64;
    let candidates: Vec<Candidate> = workers
        .iter()
        .map(|w| {
            let blocks = w.index_id.and_then(|id| matched.get(&id)).map_or(0, |m| u64::from(m.0));
            Candidate {
                worker: w.id,
                load: if match_prefix { w.load() } else { w.decode_load() },
                matched_tokens: (blocks * bs).min(input_tokens),
                // Nothing to match is known exactly: no text tree guesses (decode workers).
                followed: w.is_followed() || !match_prefix,
            }
        })
        .collect();
    let by_key = key.and_then(|k| policy::by_key(k, workers.iter().map(|w| (w.id, w.url.as_str()))));
    let decision = match by_key {
        Some(worker) => Decision { worker, reason: policy::Reason::RoutingKey },
        None => policy
            .select(&candidates, &RequestInfo { input_tokens, text: text.as_deref() })
            .map_err(|_| GatewayError::NoWorker)?,
    };
    let chosen = workers.iter().position(|w| w.id == decision.worker).ok_or(GatewayError::NoWorker)?;
    let rank = workers[chosen].index_id.and_then(|id| matched.get(&id)).and_then(|m| m.1);
    if credit && let (Some(index), Some(id), Some(chain)) = (&gw.index, workers[chosen].index_id, chains.first()) {
        index.credit_pending(id, chain);
    }
    Ok(Plan { pool, workers, candidates, decision, chosen, input_tokens, text, rank })
}
