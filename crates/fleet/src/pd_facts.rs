//! What the disaggregation layer learns of a worker while it serves, kept on
//! the worker so that it goes with it: a vLLM prefill worker's push-mode
//! identity (what its decode peers are told), a Mooncake prefill worker's
//! engine ids by data-parallel rank (from its bootstrap server). A worker
//! removed and added again is a new worker, and learns them anew.

use std::collections::HashMap;

/// A worker's disaggregation facts; empty until learned.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PdFacts {
    /// A vLLM NIXL prefill worker seen pushing: the `kv_transfer_params` a decode leg gets for it
    /// (its legs then go at once).
    pub push_identity: Option<serde_json::Value>,
    /// A Mooncake prefill worker's engine ids by rank, from its bootstrap server's `GET /query`.
    pub engine_ids: Option<HashMap<u32, String>>,
}
