//! A model pool: its served model, policy, renderer, chain memo, context
//! window, disaggregation (its workers are the fleet's, tagged with its id).
//! What a plan reads to choose a worker; which pool serves a request is the
//! gateway's select phase's choice.

use std::sync::Arc;

use policy::Policy;
use renderer::Renderer;
use router_types::PoolId;

/// One model pool.
pub struct Pool {
    /// Its name (`x-route-pool`), the fleet's tag on its workers.
    pub id: PoolId,
    /// The model its engines serve: a routed body's `model` becomes this.
    pub served_model: String,
    /// Chooses the worker among the pool's.
    pub policy: Arc<dyn Policy>,
    /// Its template and tokenizer.
    pub renderer: Arc<Renderer>,
    /// Recent page-hash chains of its prompts.
    pub chain_memo: renderer::ChainMemo,
    /// Tokens a request may hold in all (prompt and `max_tokens`), when known.
    pub context_window: Option<u64>,
    /// Prompt tokens one worker prefills per second (the TTFT estimate's rate).
    pub prefill_tokens_per_s: f64,
    /// Prefill/decode disaggregation (a routing config's `disaggregation:`): its requests go
    /// to a pair of its prefill and decode workers, `policy` choosing the prefill worker.
    pub pd: Option<Arc<crate::PdConfig>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("id", &self.id).field("served_model", &self.served_model).finish()
    }
}

impl Pool {
    /// A pool with its own chain memo of up to `chain_memo_pages` page digests.
    pub fn new(
        id: PoolId,
        served_model: String,
        policy: Arc<dyn Policy>,
        renderer: Arc<Renderer>,
        context_window: Option<u64>,
        chain_memo_pages: usize,
    ) -> Self {
        let chain_memo = renderer::ChainMemo::new(chain_memo_pages);
        let prefill_tokens_per_s = router_types::DEFAULT_PREFILL_TOKENS_PER_S;
        Pool { id, served_model, policy, renderer, chain_memo, context_window, prefill_tokens_per_s, pd: None }
    }

    /// Whether `worker` serves this pool's requests: a regular worker in it, or a disaggregated
    /// pool's prefill worker (the one whose cache and queue a request meets first).
    pub fn serves(&self, worker: &fleet::Worker) -> bool {
        let role = match self.pd {
            None => worker.role == router_types::Role::Regular,
            Some(_) => matches!(worker.role, router_types::Role::Prefill { .. }),
        };
        role && worker.pool == self.id
    }
}
