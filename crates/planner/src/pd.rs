//! Disaggregation's setup ([`PdConfig`]): whose contract the workers follow,
//! vLLM's connector, and the decode policy. One per disaggregated pool (the
//! CLI's flags make the default pool's); read by the PD dispatch.

use std::sync::Arc;

use policy::Policy;

/// Whose disaggregation contract the workers follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PdMode {
    /// SGLang (`--pd-disaggregation`): one body to both legs, at once, met by `bootstrap_room`.
    Sglang,
    /// vLLM (`--vllm-pd-disaggregation`) with the NIXL connector: prefill, then decode with its
    /// `kv_transfer_params`.
    Vllm,
}

/// vLLM's KV connector (`--kv-connector`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvConnector {
    /// NixlConnector: pull (prefill, then decode with its params), or push once a prefill says so.
    #[default]
    Nixl,
    /// MooncakeConnector: both legs at once, linked by the router's `transfer_id`, decode told
    /// the prefill's engine id (its bootstrap server's `GET /query`).
    Mooncake,
}

/// Disaggregation's setup.
pub struct PdConfig {
    /// The engines' contract.
    pub mode: PdMode,
    /// Chooses the decode worker (`--decode-policy`), by load: decode candidates never hold a prefix.
    pub decode_policy: Arc<dyn Policy>,
    /// vLLM's connector.
    pub connector: KvConnector,
}

impl PdConfig {
    /// Disaggregation following `mode`, the decode worker chosen by `decode_policy`.
    pub fn new(mode: PdMode, decode_policy: Arc<dyn Policy>) -> Self {
        Self { mode, decode_policy, connector: KvConnector::Nixl }
    }

    /// The same, with vLLM's `connector`.
    pub fn with_connector(mut self, connector: KvConnector) -> Self {
        self.connector = connector;
        self
    }
}

impl std::fmt::Debug for PdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PdConfig").field("mode", &self.mode).field("decode_policy", &self.decode_policy.name()).finish()
    }
}
