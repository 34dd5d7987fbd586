//! The Kubernetes flags (SGLang Model Gateway's `--service-discovery`,
//! `--selector`, `--prefill-selector`, `--decode-selector`,
//! `--service-discovery-namespace`, `--service-discovery-port`,
//! `--bootstrap-port-annotation`, and ours: the pool label) and the
//! catch-up flags (`--index-peers`, `--index-peer-selector`, ...) into the
//! app's [`DiscoverySetup`] and [`PeerSetup`].

use std::time::Duration;

use clap::Args;
use fleet::SnapshotLimits;
use fleet::k8s::api::ApiServer;
use fleet::k8s::{DiscoveryConfig, PodRole, Watched};
use sgl_router::app::DiscoverySetup;
use sgl_router::peers::{PeerSelector, PeerSetup};

use crate::cli::ServeArgs;
use crate::serve::UsageError;

/// Kubernetes discovery of workers.
#[derive(Debug, Args)]
pub(crate) struct DiscoveryFlags {
    /// Find workers by watching pods (Running, Ready, with an IP, not being deleted) of
    /// --selector (or --prefill-selector and --decode-selector with a PD flag). The API server is
    /// found as kubectl finds it: KUBECONFIG, ~/.kube/config, then the pod's service account.
    #[arg(long, env = "SGL_ROUTER_SERVICE_DISCOVERY")]
    pub(crate) service_discovery: bool,
    /// Labels of the worker pods, `key=value` (any Kubernetes label selector): space or comma
    /// separated, or repeated; all must hold.
    #[arg(long, env = "SGL_ROUTER_SELECTOR", num_args = 1.., value_name = "LABEL=VALUE")]
    pub(crate) selector: Vec<String>,
    /// Labels of the prefill pods (disaggregated); their bootstrap port is read from the
    /// --bootstrap-port-annotation (vLLM's `vllm.ai/bootstrap-port` when absent), else from /server_info.
    #[arg(long, env = "SGL_ROUTER_PREFILL_SELECTOR", num_args = 1.., value_name = "LABEL=VALUE")]
    pub(crate) prefill_selector: Vec<String>,
    /// Labels of the decode pods (disaggregated).
    #[arg(long, env = "SGL_ROUTER_DECODE_SELECTOR", num_args = 1.., value_name = "LABEL=VALUE")]
    pub(crate) decode_selector: Vec<String>,
    /// Namespace of the pods [default: every namespace, as SGLang Model Gateway; that needs a
    /// ClusterRole instead of a Role].
    #[arg(long, env = "SGL_ROUTER_SERVICE_DISCOVERY_NAMESPACE", value_name = "NS")]
    pub(crate) service_discovery_namespace: Option<String>,
    /// Port the workers listen on in their pods.
    #[arg(long, env = "SGL_ROUTER_SERVICE_DISCOVERY_PORT", default_value_t = crate::defaults::SERVICE_DISCOVERY_PORT, value_name = "PORT")]
    pub(crate) service_discovery_port: u16,
    /// Annotation holding a prefill pod's bootstrap port.
    #[arg(long, env = "SGL_ROUTER_BOOTSTRAP_PORT_ANNOTATION", default_value = fleet::k8s::DEFAULT_BOOTSTRAP_ANNOTATION, value_name = "KEY")]
    pub(crate) bootstrap_port_annotation: String,
    /// Label whose value names a pod's model pool (--routing-config); pods without it join the
    /// default pool, pods naming a pool the config lacks are skipped (counted).
    #[arg(long, env = "SGL_ROUTER_SERVICE_DISCOVERY_POOL_LABEL", value_name = "KEY")]
    pub(crate) service_discovery_pool_label: Option<String>,
}

/// Catching up from peer replicas.
#[derive(Debug, Args)]
pub(crate) struct PeerFlags {
    /// Peer router replicas to start from (their control plane's base URL): before following any
    /// worker, the first that answers gives its KV index snapshot, and each stream resumes after
    /// the snapshot's seq (needs --kv-events). Space or comma separated, or repeated.
    #[arg(long, env = "SGL_ROUTER_INDEX_PEERS", num_args = 1.., value_delimiter = ',', value_name = "URL")]
    pub(crate) index_peers: Vec<String>,
    /// Labels of the peer router pods (found with the Kubernetes API, this pod excepted), asked
    /// after --index-peers.
    #[arg(long, env = "SGL_ROUTER_INDEX_PEER_SELECTOR", num_args = 1.., value_name = "LABEL=VALUE")]
    pub(crate) index_peer_selector: Vec<String>,
    /// Port of the peer pods' control plane [default: --admin-port, else --port].
    #[arg(long, env = "SGL_ROUTER_INDEX_PEER_PORT", value_name = "PORT")]
    pub(crate) index_peer_port: Option<u16>,
    /// Control-plane key presented to the peers [default: the first --control-plane-api-keys].
    #[arg(long, env = "SGL_ROUTER_INDEX_PEER_API_KEY", hide_env_values = true, value_name = "KEY")]
    pub(crate) index_peer_api_key: Option<String>,
    /// Longest wait for one peer's snapshot, seconds.
    #[arg(long, env = "SGL_ROUTER_INDEX_PEER_TIMEOUT_SECS", default_value_t = crate::defaults::INDEX_PEER_TIMEOUT_SECS, value_name = "S")]
    pub(crate) index_peer_timeout_secs: u64,
    /// Most blocks in a snapshot this router serves or accepts (streams beyond are left out).
    #[arg(long, env = "SGL_ROUTER_INDEX_SNAPSHOT_MAX_BLOCKS", default_value_t = fleet::DEFAULT_SNAPSHOT_MAX_BLOCKS, value_name = "N")]
    pub(crate) index_snapshot_max_blocks: usize,
    /// Longest wait, seconds, for this router's pump to take a snapshot a peer asked for (503 after).
    #[arg(long, env = "SGL_ROUTER_INDEX_SNAPSHOT_TIMEOUT_SECS", default_value_t = crate::defaults::INDEX_SNAPSHOT_TIMEOUT_SECS, value_name = "S")]
    pub(crate) index_snapshot_timeout_secs: u64,
}

/// A selector given as several values (`app=sglang role=prefill`, or `app=sglang,role=prefill`).
fn selector(values: &[String]) -> String {
    values.iter().map(|v| v.trim()).filter(|v| !v.is_empty()).collect::<Vec<_>>().join(",")
}

fn api(flag: &str) -> Result<ApiServer, UsageError> {
    ApiServer::infer().map_err(|e| UsageError(format!("{flag}: {e}")))
}

/// The discovery the flags ask for, if any.
pub(crate) fn setup(a: &ServeArgs) -> Result<Option<DiscoverySetup>, UsageError> {
    let f = &a.discovery;
    let (regular, prefill, decode) =
        (selector(&f.selector), selector(&f.prefill_selector), selector(&f.decode_selector));
    if !f.service_discovery {
        if !regular.is_empty() || !prefill.is_empty() || !decode.is_empty() {
            return Err(UsageError("--selector/--prefill-selector/--decode-selector need --service-discovery".into()));
        }
        return Ok(None);
    }
    let pd = a.pd.pd_disaggregation || a.pd.vllm_pd_disaggregation;
    let mut watched = Vec::new();
    if !regular.is_empty() {
        watched.push(Watched { selector: regular, role: PodRole::Regular });
    }
    if !prefill.is_empty() || !decode.is_empty() {
        if !pd {
            return Err(UsageError(
                "--prefill-selector/--decode-selector need --pd-disaggregation or --vllm-pd-disaggregation".into(),
            ));
        }
        if prefill.is_empty() || decode.is_empty() {
            return Err(UsageError(
                "disaggregated discovery needs both --prefill-selector and --decode-selector".into(),
            ));
        }
        watched.push(Watched { selector: prefill, role: PodRole::Prefill });
        watched.push(Watched { selector: decode, role: PodRole::Decode });
    }
    if watched.is_empty() {
        return Err(UsageError(
            "--service-discovery needs --selector (or --prefill-selector and --decode-selector)".into(),
        ));
    }
    let pool_label = f.service_discovery_pool_label.clone().filter(|l| !l.is_empty());
    if pool_label.is_some() && a.routing_config.is_none() {
        return Err(UsageError("--service-discovery-pool-label names model pools: it needs --routing-config".into()));
    }
    if f.service_discovery_port == 0 {
        return Err(UsageError("--service-discovery-port: 1..=65535".into()));
    }
    Ok(Some(DiscoverySetup {
        api: api("--service-discovery")?,
        config: DiscoveryConfig {
            namespace: f.service_discovery_namespace.clone().filter(|n| !n.is_empty()),
            port: f.service_discovery_port,
            watched,
            bootstrap_annotation: f.bootstrap_port_annotation.clone(),
            pool_label,
            // Set by the app, which knows the pools.
            default_pool: router_types::PoolId::default_pool(),
            pools: None,
        },
    }))
}

/// The peers the flags name, if any.
pub(crate) fn peers(a: &ServeArgs) -> Result<Option<PeerSetup>, UsageError> {
    let f = &a.peers;
    let urls: Vec<String> = f.index_peers.iter().map(|u| u.trim().to_owned()).filter(|u| !u.is_empty()).collect();
    for u in &urls {
        if !(u.starts_with("http://") || u.starts_with("https://")) {
            return Err(UsageError(format!("--index-peers {u}: an http:// or https:// URL")));
        }
    }
    let sel = selector(&f.index_peer_selector);
    if urls.is_empty() && sel.is_empty() {
        return Ok(None);
    }
    let selector = if sel.is_empty() {
        None
    } else {
        Some(PeerSelector {
            api: api("--index-peer-selector")?,
            namespace: a.discovery.service_discovery_namespace.clone().filter(|n| !n.is_empty()),
            selector: sel,
            port: f.index_peer_port.or(a.admin_port).unwrap_or(a.port),
        })
    };
    Ok(Some(PeerSetup {
        urls,
        selector,
        api_key: f.index_peer_api_key.clone().or_else(|| a.control_plane_api_keys.first().cloned()),
        timeout: Duration::from_secs(f.index_peer_timeout_secs.max(1)),
        limits: SnapshotLimits {
            max_blocks: f.index_snapshot_max_blocks,
            // A block takes at most 46 bytes; streams' headers fit in the megabyte.
            max_bytes: f.index_snapshot_max_blocks.saturating_mul(46).saturating_add(1 << 20),
        },
    }))
}

/// How this router serves its own snapshot.
pub(crate) fn serving(a: &ServeArgs) -> gateway::SnapshotServing {
    gateway::SnapshotServing {
        max_blocks: a.peers.index_snapshot_max_blocks,
        timeout: Duration::from_secs(a.peers.index_snapshot_timeout_secs.max(1)),
    }
}
