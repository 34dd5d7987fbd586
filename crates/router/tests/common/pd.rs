//! Routers in front of simulated engines in prefill and decode roles, for the disaggregation tests.
#![allow(dead_code)] // not every test binary uses all of it

use std::time::Duration;

use gateway::pd::PdMode;
use mock_engine::{Flavor, MockEngine, MockEngineConfig, PdRole};
use router_types::{Bootstrap, WorkerUrl};
use sgl_router::app::{AppConfig, PdSetup, PolicyConfig};

/// A fast simulated engine in `role`, waiting up to 10 s for its peer.
pub(crate) fn role_config(role: PdRole, flavor: Flavor, dp_size: usize) -> MockEngineConfig {
    let mut c =
        MockEngineConfig { fast: true, default_max_tokens: 4, dp_size, ..MockEngineConfig::in_role(role, flavor) };
    c.pd.bootstrap_timeout = Duration::from_secs(10);
    c
}

/// `n` such engines.
pub(crate) async fn engines(role: PdRole, flavor: Flavor, n: usize, dp_size: usize) -> Vec<MockEngine> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(MockEngine::spawn(role_config(role, flavor, dp_size)).await.unwrap());
    }
    out
}

pub(crate) fn url(m: &MockEngine) -> WorkerUrl {
    WorkerUrl::parse(&m.url()).unwrap()
}

/// A router over `prefill` and `decode` (bootstrap ports from their `/server_info`), prefill
/// chosen by `policy` with KV events, decode by `decode_policy`.
pub(crate) fn pd_config(
    mode: PdMode,
    prefill: &[MockEngine],
    decode: &[MockEngine],
    policy: PolicyConfig,
    decode_policy: PolicyConfig,
) -> AppConfig {
    let mut c = super::app::config(&[], policy.clone(), true);
    c.pd = Some(PdSetup {
        mode,
        prefill: prefill.iter().map(|m| (url(m), Bootstrap::Discover)).collect(),
        decode: decode.iter().map(url).collect(),
        prefill_policy: policy,
        decode_policy,
        mock_prefill: 0,
        mock_decode: 0,
        connector: gateway::pd::KvConnector::Nixl,
        skip_prefill: gateway::pd::SkipPrefill::default(),
    });
    c
}
