//! The Kubernetes discovery flags (SGLang Model Gateway's `--service-discovery`,
//! `--selector`, ...) and the catch-up flags (`--index-peers`, ...): two flag
//! groups of [`super::ServeArgs`]. Definitions only; `discovery.rs` turns them
//! into the app's setups.

use clap::Args;

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
    /// Find workers by a Gateway API Inference Extension `InferencePool` (as GIE's endpoint
    /// pickers): its selector and first target port pick the pods, followed as the pool changes
    /// (instead of --selector and --service-discovery-port; implies --service-discovery). With
    /// --epp-port, its `InferenceObjective`s give requests their priority class.
    #[arg(long, env = "SGL_ROUTER_POOL_NAME", value_name = "NAME", conflicts_with_all = ["selector", "prefill_selector", "decode_selector"])]
    pub(crate) pool_name: Option<String>,
    /// The InferencePool's namespace [default: --service-discovery-namespace, else `default`].
    #[arg(long, env = "SGL_ROUTER_POOL_NAMESPACE", value_name = "NS", requires = "pool_name")]
    pub(crate) pool_namespace: Option<String>,
    /// The InferencePool's API group: `inference.networking.k8s.io` (v1) or
    /// `inference.networking.x-k8s.io` (v1alpha2).
    #[arg(long, env = "SGL_ROUTER_POOL_GROUP", default_value = fleet::k8s::pool::DEFAULT_POOL_GROUP, value_name = "GROUP")]
    pub(crate) pool_group: String,
}

/// Catching up from peer replicas.
#[derive(Debug, Args)]
pub(crate) struct PeerFlags {
    /// Peer router replicas to start from (their control plane's base URL): once the port is up
    /// and before following any worker, all are asked at once and the first valid KV index
    /// snapshot is used; each stream resumes after the snapshot's seq (needs --kv-events).
    /// Space or comma separated, or repeated.
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
    /// Longest wait for the whole catch-up (every peer asked at once), seconds; the workers are
    /// followed after it.
    #[arg(long, env = "SGL_ROUTER_INDEX_PEER_TIMEOUT_SECS", default_value_t = crate::defaults::INDEX_PEER_TIMEOUT_SECS, value_name = "S")]
    pub(crate) index_peer_timeout_secs: u64,
    /// Most blocks in a snapshot this router serves or accepts (streams beyond are left out).
    #[arg(long, env = "SGL_ROUTER_INDEX_SNAPSHOT_MAX_BLOCKS", default_value_t = fleet::DEFAULT_SNAPSHOT_MAX_BLOCKS, value_name = "N")]
    pub(crate) index_snapshot_max_blocks: usize,
    /// Longest wait, seconds, for this router's pump to take a snapshot a peer asked for (503 after).
    #[arg(long, env = "SGL_ROUTER_INDEX_SNAPSHOT_TIMEOUT_SECS", default_value_t = crate::defaults::INDEX_SNAPSHOT_TIMEOUT_SECS, value_name = "S")]
    pub(crate) index_snapshot_timeout_secs: u64,
}
