//! A gateway for the crate's own unit tests: workers in rotation without
//! probes (no sockets), round robin, the built-in model, quick retries.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::{Gateway, GatewayConfig};

/// A gateway over `workers` (URLs nothing listens on: the tests send through their own closure),
/// every one in rotation once the fleet has taken it in.
pub(crate) async fn gateway(workers: &[&str], retry: crate::RetryConfig) -> Arc<Gateway> {
    let (gw, fleet) = unstarted(workers, retry);
    let gw = Arc::new(gw);
    routable(&fleet, workers.len()).await;
    gw
}

/// A gateway with a routing config (`yaml`) over `pools` (name, served model; in this order,
/// whatever the config's), each with the workers `workers` lists (URL, pool), in rotation.
pub(crate) async fn routed(yaml: &str, pools: &[(&str, &str)], workers: &[(&str, &str)]) -> Arc<Gateway> {
    let pools: Vec<(&str, &str, Option<u64>)> = pools.iter().map(|(name, model)| (*name, *model, None)).collect();
    routed_with_windows(yaml, &pools, workers).await
}

/// [`routed`] with each pool's context window (name, served model, window).
pub(crate) async fn routed_with_windows(
    yaml: &str,
    pools: &[(&str, &str, Option<u64>)],
    workers: &[(&str, &str)],
) -> Arc<Gateway> {
    let (gw, fleet) = unstarted(&[], crate::RetryConfig::default());
    let renderer = Arc::new(renderer::Renderer::builtin().unwrap());
    let pools = pools
        .iter()
        .map(|(name, model, window)| {
            let (id, policy) = (router_types::PoolId((*name).into()), Arc::new(policy::RoundRobin::default()));
            crate::pools::Pool::new(id, (*model).into(), policy, renderer.clone(), *window, 64)
        })
        .collect();
    let selector = model_select::Selector::new(model_select::parse_yaml(yaml).unwrap()).unwrap();
    let learning = Arc::new(crate::pools::feedback::Learning::new(Default::default()).unwrap());
    let gw = Arc::new(gw.with_routing(pools, selector, None, None, learning).unwrap());
    for (url, pool) in workers {
        let url = router_types::WorkerUrl::parse(url).unwrap();
        let pool = router_types::PoolId((*pool).into());
        fleet.add_in(url, router_types::Role::Regular, pool, fleet::Source::Admin);
    }
    routable(&fleet, workers.len()).await;
    gw
}

/// A gateway over `workers` in the default pool, and its fleet, before any worker is in rotation.
fn unstarted(workers: &[&str], retry: crate::RetryConfig) -> (Gateway, Arc<fleet::Fleet>) {
    let urls: Vec<router_types::WorkerUrl> =
        workers.iter().map(|u| router_types::WorkerUrl::parse(u).unwrap()).collect();
    let fleet_config = fleet::FleetConfig::unprobed(crate::PROXIED_PATHS);
    let fleet = fleet::Fleet::start(fleet_config, None, &urls, CancellationToken::new());
    let config = GatewayConfig {
        max_body_bytes: crate::DEFAULT_MAX_BODY_BYTES,
        request_timeout: Duration::from_secs(10),
        max_concurrent: 64,
        credit_pending: false,
        model_id: "default".into(),
        worker_api_key: None,
        limits: Default::default(),
        control_plane_keys: Vec::new(),
        client_keys: Vec::new(),
        max_request_memory: 1 << 30,
        render_threads: 1,
        chain_memo_pages: renderer::DEFAULT_CHAIN_MEMO_PAGES,
        scheduler: None,
        tenants: Default::default(),
        tenant_limits: None,
        jwt: None,
        audit: false,
        upstream_pool_idle: crate::DEFAULT_UPSTREAM_POOL_IDLE,
        upstream_http2: false,
        cache_trace: Default::default(),
        reasoning_parser: None,
        tool_call_parser: None,
        tracer: None,
        routing_key_headers: Vec::new(),
        shared_state: None,
        admin_listener: false,
        retry,
        queue_size: 0,
        queue_timeout: Duration::from_secs(1),
        duration_buckets: crate::metrics::LATENCY_BUCKETS.to_vec(),
        rate_limit: None,
        request_id_headers: Vec::new(),
        cors: Default::default(),
        tls: None,
        index_snapshot: Default::default(),
    };
    let renderer = Arc::new(renderer::Renderer::builtin().unwrap());
    let gw = Gateway::new(config, fleet.clone(), Arc::new(policy::RoundRobin::default()), None, renderer);
    (gw, fleet)
}

/// Waits until the fleet holds `n` workers, every one in rotation (without probes the fleet puts
/// each in rotation as it takes it in).
async fn routable(fleet: &fleet::Fleet, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !fleet.all().iter().all(|w| w.is_routable()) || fleet.all().len() < n {
        assert!(tokio::time::Instant::now() < deadline, "the workers entered rotation");
        tokio::task::yield_now().await;
    }
}
