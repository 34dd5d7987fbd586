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

/// When a disaggregated request skips its prefill leg and is served by its decode worker
/// alone, which prefills locally (vLLM's engines do; SGLang's decode-mode servers cannot).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SkipPrefill {
    /// Fewer prompt tokens than this not cached on the decode worker (a short prompt, or one
    /// it mostly holds): decode alone (`--pd-skip-prefill-uncached-tokens`; 0: never).
    pub uncached_below: u64,
    /// At least this share of the prompt cached on the decode worker: decode alone
    /// (`--pd-skip-prefill-cached-fraction`; 0: never).
    pub cached_fraction: f64,
}

impl SkipPrefill {
    /// Whether either rule is on.
    pub fn enabled(&self) -> bool {
        self.uncached_below > 0 || self.cached_fraction > 0.0
    }

    /// Whether a prompt of `input` tokens, `held` of them cached on the decode worker, skips
    /// its prefill leg.
    pub fn skips(&self, input: u64, held: u64) -> bool {
        let held = held.min(input);
        let short = input - held < self.uncached_below;
        let cached = self.cached_fraction > 0.0 && input > 0 && held as f64 >= self.cached_fraction * input as f64;
        short || cached
    }
}

/// Disaggregation's setup.
pub struct PdConfig {
    /// The engines' contract.
    pub mode: PdMode,
    /// Chooses the decode worker (`--decode-policy`), by load: decode candidates never hold a prefix.
    pub decode_policy: Arc<dyn Policy>,
    /// vLLM's connector.
    pub connector: KvConnector,
    /// When the decode worker serves a request alone (vLLM only).
    pub skip_prefill: SkipPrefill,
}

impl PdConfig {
    /// Disaggregation following `mode`, the decode worker chosen by `decode_policy`.
    pub fn new(mode: PdMode, decode_policy: Arc<dyn Policy>) -> Self {
        Self { mode, decode_policy, connector: KvConnector::Nixl, skip_prefill: SkipPrefill::default() }
    }

    /// The same, skipping the prefill leg by `skip` (vLLM's engines only: a decode worker
    /// that prefills locally).
    pub fn with_skip_prefill(mut self, skip: SkipPrefill) -> Self {
        self.skip_prefill = skip;
        self
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

#[cfg(test)]
mod tests {
    use super::SkipPrefill;

    #[test]
    fn a_short_or_mostly_held_prompt_skips_its_prefill() {
        let off = SkipPrefill::default();
        assert!(!off.enabled() && !off.skips(10, 10), "off by default");
        let short = SkipPrefill { uncached_below: 256, cached_fraction: 0.0 };
        assert!(short.skips(200, 0), "a short prompt");
        assert!(short.skips(4096, 4000), "a long prompt the decode worker mostly holds");
        assert!(!short.skips(4096, 3840), "256 tokens to prefill: not fewer than 256");
        assert!(!short.skips(4096, 0));
        let held = SkipPrefill { uncached_below: 0, cached_fraction: 0.9 };
        assert!(held.skips(10_000, 9_000) && !held.skips(10_000, 8_999));
        assert!(!held.skips(0, 0), "an empty prompt holds no share");
        assert!(short.skips(100, 1_000), "held is capped by the prompt");
    }
}
