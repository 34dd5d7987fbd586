//! One plan: a pool's routable workers made candidates (their load, the
//! prefix of the prompt each holds by the KV index), the pool's policy
//! choosing among them ([`Plan`]). Side-effect free but for the pending
//! credit of the chosen worker (with `credit_pending`).

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;

use fleet::Worker;
use kv_index::KvIndex;
use policy::{Candidate, Decision, RequestInfo};
use renderer::PageHasher;
use renderer::vision::{MmItem, identifiers, keyed_block_hashes};
use router_types::{BlockHash, DpRank};
use serde_json::{Value, json};

use crate::{PlanError, Planner, Pool, Renders, Route};

/// A routing decision and what it was based on.
#[derive(Debug)]
pub struct Plan {
    /// The pool it chose in.
    pub pool: Arc<Pool>,
    /// The routable workers, in the order of `candidates`.
    pub workers: Vec<Arc<Worker>>,
    pub candidates: Vec<Candidate>,
    pub decision: Decision,
    /// The position of the chosen worker in `workers` and `candidates`.
    pub chosen: usize,
    pub input_tokens: u64,
    /// The prompt's text, when the policy reads it.
    pub text: Option<String>,
    pub rank: Option<DpRank>,
    /// The prefix the best eligible worker held against the chosen one's.
    pub regret: crate::Regret,
    /// When it was planned ([`crate::Planner::at_ms`]).
    pub at_ms: u64,
    /// The prompt's heads, when the policy matches by them ([`policy::Policy::heads`]).
    pub heads: Vec<policy::Head>,
    /// The prompt's images: offset, placeholders and vLLM identifier (`None`: not known).
    pub images: Vec<(usize, usize, Option<String>)>,
}

impl Plan {
    pub fn chosen(&self) -> &Arc<Worker> {
        &self.workers[self.chosen]
    }

    /// Prompt tokens the chosen worker holds.
    pub fn matched_tokens(&self) -> u64 {
        self.candidates[self.chosen].matched_tokens
    }

    /// The prompt's images as an explain shows them.
    pub fn images_json(&self) -> Vec<Value> {
        let image = |(offset, length, id): &(usize, usize, Option<String>)| json!({"offset": offset, "placeholders": length, "identifier": id});
        self.images.iter().map(image).collect()
    }

    /// The candidates as an explain shows them.
    pub fn candidates_json(&self) -> Vec<Value> {
        self.candidates
            .iter()
            .zip(&self.workers)
            .map(|(c, w)| json!({"worker": w.url, "id": w.id, "matched_tokens": c.matched_tokens, "in_flight": c.load.in_flight}))
            .collect()
    }

    /// What the policy saw of the request.
    pub fn request(&self) -> RequestInfo<'_> {
        RequestInfo {
            input_tokens: self.input_tokens,
            text: self.text.as_deref(),
            at_ms: self.at_ms,
            heads: &self.heads,
        }
    }

    /// Tells the pool's policy the request really goes where it decided (never for an explain).
    pub fn commit(&self) {
        self.commit_to(&*self.pool.policy);
    }

    /// Tells `policy` (the one that decided) the request really goes where it decided.
    pub fn commit_to(&self, policy: &dyn policy::Policy) {
        policy.commit(&self.decision, &self.candidates, &self.request());
    }
}

/// What a plan knows of the request's prompt.
#[derive(Debug)]
pub struct Prompted<'a> {
    /// The parsed body (`None`: not parsed, nothing to match).
    pub v: Option<&'a Value>,
    pub tokens: &'a [u32],
    pub text: Option<String>,
    /// The prompt's images (their placeholders are in `tokens`).
    pub mm: &'a [renderer::vision::MmItem],
    /// Match the prompt against the index (false: every candidate holds nothing, as a decode
    /// worker's KV comes from its prefill, never from its own cache).
    pub match_prefix: bool,
    /// The request goes where the plan says: with `credit_pending`, the chosen worker is
    /// credited with the prompt's pages before another plan matches (not for a preview).
    pub credit: bool,
}

/// A worker's standing load report as the load policies read it, with what was sent since
/// (`None` while it has none).
fn reported(w: &Worker) -> Option<policy::Reported> {
    w.liveness.kv_usage_permille()?;
    let sent = w.since_poll.get();
    Some(policy::Reported {
        queued_tokens: w.reported_uncached_tokens(),
        waiting: w.liveness.waiting(),
        throughput: sent.throughput,
        sent: sent.requests,
        sent_tokens: sent.tokens,
        sent_unknown: sent.unknown,
    })
}

/// A request's page hashes as the fleet's workers key them: one chain per hash mode (unigram
/// first), then one per lookahead (`lookaheads`, in order). A worker's blocks are in its own
/// chain only, so its deepest match over all of them is its match.
#[derive(Debug, Default)]
struct Chains {
    all: Vec<Vec<BlockHash>>,
    lookaheads: Vec<usize>,
}

impl Chains {
    /// The chain of a worker hashing with a lookahead of `lookahead` tokens (0: none).
    fn of(&self, lookahead: usize) -> Option<&[BlockHash]> {
        let at = match lookahead {
            0 => 0,
            l => self.all.len() - self.lookaheads.len() + self.lookaheads.iter().position(|x| *x == l)?,
        };
        self.all.get(at).map(Vec::as_slice)
    }
}

/// Each index worker's deepest match over `chains` (one per hash mode): blocks and the rank
/// holding them.
pub fn match_chains(index: &KvIndex, chains: &[Vec<BlockHash>]) -> HashMap<kv_index::WorkerId, (u32, Option<DpRank>)> {
    let mut matched: HashMap<kv_index::WorkerId, (u32, Option<DpRank>)> = HashMap::new();
    for chain in chains {
        for m in index.prefix_depths(chain, &kv_index::MatchOptions::default()) {
            let e = matched.entry(m.worker).or_insert((0, None));
            if m.blocks > e.0 {
                *e = (m.blocks, m.rank);
            }
        }
    }
    matched
}

impl Planner<'_> {
    /// The routable workers `keep` accepts, less those the liveness vetoes
    /// leave out now ([`fleet::liveness::screen`]).
    pub fn routable(&self, keep: impl Fn(&Worker) -> bool) -> Result<Vec<Arc<Worker>>, PlanError> {
        let allowed = |w: &Worker| self.only.is_none_or(|only| only.allows(w));
        let all = self.workers.iter().filter(|w| keep(w) && allowed(w) && w.is_routable()).cloned().collect();
        match self.fleet.screen(all) {
            fleet::liveness::Screened::Workers(workers) => Ok(workers),
            fleet::liveness::Screened::Shed => Err(PlanError::Overloaded),
        }
    }

    /// Chooses a worker of `pool`: candidates with their load and cached prefix, then the
    /// pool's policy, unless the client's routing key names the worker. `renders`: the
    /// request's prompt as renderers made it already (the routing config's signals, the pools'
    /// windows), else rendered here when read. `credit`: the request is sent where the plan
    /// says (the chosen worker is credited with its pages).
    pub fn plan(
        &self,
        pool: &Arc<Pool>,
        route: Route,
        v: Option<&Value>,
        key: Option<&[u8]>,
        renders: &Renders,
        credit: bool,
    ) -> Result<Plan, PlanError> {
        // Rendered only for what reads it (a body parsed for its model alone is not rendered).
        let reads = self.index.is_some() || pool.policy.needs_tokens() || pool.policy.needs_text();
        let crate::Rendered { tokens, text, mm } = match v {
            // The request's own plan (`credit`) reads the prompt last: it takes the render, and
            // one made here is not kept (no copy of the tokens on the way).
            Some(v) if reads && route.has_prompt() => match renders.get(&pool.renderer, credit) {
                Some(r) => r,
                None if !credit && (self.index.is_some() || pool.policy.needs_tokens()) => {
                    renders.tokens(*self, &pool.renderer, route, v)?
                }
                None => self.prompt(pool, route, v)?,
            },
            _ => crate::Rendered::default(),
        };
        let workers = self.routable(|w| pool.serves(w))?;
        let prompted = Prompted { v, tokens: &tokens, text, mm: &mm, match_prefix: true, credit };
        self.plan_in(pool, &*pool.policy, workers, prompted, key)
    }

    /// Chooses one of `workers` (of `pool`) with `policy`: candidates with their load and
    /// cached prefix, unless the client's routing key names the worker.
    pub fn plan_in(
        &self,
        pool: &Arc<Pool>,
        policy: &dyn policy::Policy,
        workers: Vec<Arc<Worker>>,
        prompted: Prompted<'_>,
        key: Option<&[u8]>,
    ) -> Result<Plan, PlanError> {
        let Prompted { v, tokens, text, mm, match_prefix, credit } = prompted;
        if workers.is_empty() {
            return Err(PlanError::NoWorker);
        }
        let v = v.filter(|_| match_prefix);
        let text = text.filter(|_| match_prefix);
        let input_tokens = tokens.len() as u64;
        // The pool's page size, read once: a worker followed meanwhile may fix it.
        let block_size = self.fleet.block_size_of(&pool.id);
        // A mixed fleet is matched in each mode; a worker's blocks exist in its own mode only.
        // Exact matches count only for followed workers when the policy judges the others by
        // its text tree: with none of them followed (no KV events, or not yet), the prompt's
        // pages are not hashed at all (a 16 KiB prompt without a tokenizer is 16,384 tokens).
        let exact = !policy.needs_text() || workers.iter().any(|w| w.is_followed());
        // vLLM keys an image by the model its engine was started with: each identifier made once.
        let ids = if mm.is_empty() { Vec::new() } else { identifiers(mm, &mm_model_id(pool, &workers)) };
        let chains = match v {
            Some(v) if exact => self.chains(pool, &workers, v, (tokens, mm, &ids), block_size),
            _ => Chains::default(),
        };
        // From the match to the credit, one plan at a time (the pages hashed before): a burst
        // sharing a cold prefix would otherwise be matched before any of it is credited, and
        // spread over the workers.
        // A request on its way (not an explain's dry run): its placement is shared.
        let placing = credit;
        let credit = credit && match_prefix && self.credit_pending;
        let _one_at_a_time = credit.then(|| self.credit_lock.lock().unwrap_or_else(|p| p.into_inner()));
        let matched = self.index.map(|index| match_chains(index, &chains.all)).unwrap_or_default();
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
                    // Decode legs hold no prefix: no warm-up slice for them.
                    warmup: if match_prefix { w.warmup() } else { Default::default() },
                    kv_usage: w.liveness.kv_usage_permille(),
                    report: reported(w),
                }
            })
            .collect();
        let heads = if match_prefix { policy.heads(tokens) } else { Vec::new() };
        let by_key = key.and_then(|k| policy::by_key(k, workers.iter().map(|w| (w.id, w.url.as_str()))));
        let decision = match by_key {
            Some(worker) => Decision { worker, reason: policy::Reason::RoutingKey },
            None => policy
                .select(
                    &candidates,
                    &RequestInfo { input_tokens, text: text.as_deref(), at_ms: self.at_ms, heads: &heads },
                )
                .map_err(|e| match e {
                    policy::PolicyError::AllAtWaitingCap => PlanError::AtWaitingCap,
                    policy::PolicyError::NoCandidates => PlanError::NoWorker,
                })?,
        };
        let chosen = workers.iter().position(|w| w.id == decision.worker).ok_or(PlanError::NoWorker)?;
        let rank = workers[chosen].index_id.and_then(|id| matched.get(&id)).and_then(|m| m.1);
        let regret = self.regret(pool, &workers, &matched, chosen, decision.reason);
        let regret = crate::Regret { block_size: bs.max(1), input_tokens, ..regret };
        let mut credited: &[BlockHash] = &[];
        if credit
            && let (Some(index), Some(id)) = (self.index, workers[chosen].index_id)
            && let Some(chain) = chains.of(index.lookahead_of(id))
        {
            index.credit_pending(id, chain);
            credited = chain;
        }
        if let Some(placements) = self.placements.filter(|_| placing) {
            let uncached = input_tokens.saturating_sub(candidates[chosen].matched_tokens);
            placements.placed(&workers[chosen], credited, uncached);
        }
        let at_ms = self.at_ms;
        Ok(Plan {
            pool: pool.clone(),
            workers,
            candidates,
            decision,
            chosen,
            input_tokens,
            text,
            rank,
            regret,
            at_ms,
            heads,
            images: mm.iter().zip(ids).map(|(i, id)| (i.offset, i.length, id)).collect(),
        })
    }

    /// The prompt's page hashes in each of the fleet's hash modes and each lookahead some worker
    /// hashes with, in the request's namespace (as the engine chains them), with `block_size`
    /// tokens a page; none without an index.
    fn chains(
        &self,
        pool: &Pool,
        workers: &[Arc<Worker>],
        v: &Value,
        (tokens, mm, ids): (&[u32], &[MmItem], &[Option<String>]),
        block_size: usize,
    ) -> Chains {
        let Some(index) = self.index else { return Chains::default() };
        let page = NonZeroUsize::new(block_size).unwrap_or(NonZeroUsize::MIN);
        // The request's namespace starts its chain, as the engine's does.
        let served = || {
            let mut names: Vec<String> = workers.iter().filter_map(|w| w.info()?.model_id).collect();
            names.push(pool.served_model.clone());
            names
        };
        let ns = crate::namespace::of_request(v, served, Some(index));
        let prior = renderer::hash::namespace_prior(ns.adapter, ns.salt);
        // A vision model's images: vLLM keys each block holding an image's placeholders by the
        // image's identifier too.
        let mut all: Vec<Vec<BlockHash>> = self
            .fleet
            .hash_modes()
            .modes()
            .map(|m| match mm {
                [] => pool.chain_memo.block_hashes(&PageHasher::new(page, m), tokens, prior.as_ref()),
                _ => keyed_block_hashes(&PageHasher::new(page, m), tokens, prior.as_ref(), mm, ids),
            })
            .collect();
        // vLLM's lookahead hashing (EAGLE, MTP): its workers key a block by the tokens after it too.
        let lookaheads: Vec<usize> = index.lookaheads().collect();
        for &l in &lookaheads {
            all.push(pool.chain_memo.lookahead_block_hashes(page, tokens, l, prior.as_ref()));
        }
        Chains { all, lookaheads }
    }

    /// The regret of choosing `workers[chosen]` for `reason`: the deepest match of any
    /// eligible worker (the pool's routable ones of the candidates' role, vetoed or not)
    /// and of any candidate, against the chosen one's.
    fn regret(
        &self,
        pool: &Pool,
        workers: &[Arc<Worker>],
        matched: &HashMap<kv_index::WorkerId, (u32, Option<DpRank>)>,
        chosen: usize,
        reason: policy::Reason,
    ) -> crate::Regret {
        let blocks = |w: &Worker| w.index_id.and_then(|id| matched.get(&id)).map_or(0, |m| u64::from(m.0));
        let best_candidate = workers.iter().map(|w| blocks(w)).max().unwrap_or(0);
        // Nothing matched: nothing to lose (and no second walk over the fleet).
        let reachable = if matched.is_empty() {
            0
        } else {
            let role = workers[chosen].role;
            let allowed = |w: &Worker| self.only.is_none_or(|only| only.allows(w));
            let eligible = |w: &&Arc<Worker>| w.role == role && pool.serves(w) && allowed(w) && w.is_routable();
            self.workers.iter().filter(eligible).map(|w| blocks(w)).max().unwrap_or(0)
        };
        crate::Regret::new(reachable, best_candidate, blocks(&workers[chosen]), reason)
    }
}

/// The model a pool's engines were started with (`--model`), which vLLM keys images' identifiers
/// by: the first worker reporting it (`/v1/models` `root`, `/server_info` `model_path`), else
/// its served name, else the pool's served model.
fn mm_model_id(pool: &Pool, workers: &[Arc<Worker>]) -> String {
    let info = workers.iter().find_map(|w| w.info().filter(|i| i.model_path.is_some() || i.model_id.is_some()));
    info.and_then(|i| i.model_path.or(i.model_id)).unwrap_or_else(|| pool.served_model.clone())
}
