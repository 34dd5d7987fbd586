//! Reads the Kubernetes flags (SGLang Model Gateway's `--service-discovery`,
//! `--selector`, `--prefill-selector`, `--decode-selector`,
//! `--service-discovery-namespace`, `--service-discovery-port`,
//! `--bootstrap-port-annotation`, and ours: the pool label) and the
//! catch-up flags (`--index-peers`, `--index-peer-selector`, ...) into the
//! app's [`DiscoverySetup`] and [`PeerSetup`].

use std::time::Duration;

use fleet::SnapshotLimits;
use fleet::k8s::api::ApiServer;
use fleet::k8s::{DiscoveryConfig, PodRole, Watched};
use sgl_router::app::DiscoverySetup;
use sgl_router::peers::{PeerSelector, PeerSetup, SharedPeers};

use crate::cli::ServeArgs;
use crate::usage::UsageError;

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
    if let Some(name) = f.pool_name.as_deref() {
        return inference_pool(a, name).map(Some);
    }
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
    if pool_label.is_some() && a.routing_config.is_none() && a.routing_config_resource.is_none() {
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
            inference_pool: None,
        },
    }))
}

/// Discovery by the `InferencePool` `name` (`--pool-name`).
fn inference_pool(a: &ServeArgs, name: &str) -> Result<DiscoverySetup, UsageError> {
    let f = &a.discovery;
    if a.pd.pd_disaggregation || a.pd.vllm_pd_disaggregation {
        return Err(UsageError("--pool-name: an InferencePool is one set of endpoints, not prefill and decode".into()));
    }
    let group = f.pool_group.trim();
    if ![fleet::k8s::pool::DEFAULT_POOL_GROUP, fleet::k8s::pool::ALPHA_POOL_GROUP].contains(&group) {
        return Err(UsageError(format!(
            "--pool-group {group:?}: {} or {}",
            fleet::k8s::pool::DEFAULT_POOL_GROUP,
            fleet::k8s::pool::ALPHA_POOL_GROUP
        )));
    }
    let namespace = f
        .pool_namespace
        .clone()
        .or_else(|| f.service_discovery_namespace.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".into());
    if name.is_empty() {
        return Err(UsageError("--pool-name: a name".into()));
    }
    let pool_label = f.service_discovery_pool_label.clone().filter(|l| !l.is_empty());
    if pool_label.is_some() && a.routing_config.is_none() && a.routing_config_resource.is_none() {
        return Err(UsageError("--service-discovery-pool-label names model pools: it needs --routing-config".into()));
    }
    Ok(DiscoverySetup {
        api: api("--pool-name")?,
        config: DiscoveryConfig {
            inference_pool: Some(fleet::k8s::pool::pool_ref(group, &namespace, name)),
            namespace: Some(namespace),
            port: f.service_discovery_port,
            watched: Vec::new(),
            bootstrap_annotation: f.bootstrap_port_annotation.clone(),
            pool_label,
            default_pool: router_types::PoolId::default_pool(),
            pools: None,
        },
    })
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
    // Replicas announced in the shared-state backend are peers too.
    let shared = a.shared.setup().map_err(UsageError)?.map(|s| SharedPeers {
        target: s.target,
        options: s.options,
        prefix: s.prefix,
        me: s.advertise,
    });
    if urls.is_empty() && sel.is_empty() && shared.is_none() {
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
        shared,
    }))
}

/// How this router serves its own snapshot.
pub(crate) fn serving(a: &ServeArgs) -> gateway::SnapshotServing {
    gateway::SnapshotServing {
        max_blocks: a.peers.index_snapshot_max_blocks,
        timeout: Duration::from_secs(a.peers.index_snapshot_timeout_secs.max(1)),
    }
}
