//! How the router's parts are made from its typed configuration
//! (`config::AppConfig`): the simulated engines, the gateway's and the
//! fleet's configurations, the policies, the routing config's pools, and who
//! joins the fleet in what order. `app` puts them together and serves.

use std::sync::Arc;

use anyhow::{Context, bail};
use fleet::{FleetConfig, Source};
use gateway::GatewayConfig;
use gateway::pd::PdMode;
use mock_engine::{MockEngine, MockEngineConfig};
use policy::{ApproxTreePolicy, CacheAware, LeastLoad, MinTtft, Policy, PowerOfTwo, Random, RoundRobin};
use renderer::Renderer;
use router_types::{PoolId, Role, WorkerUrl};

use crate::config::{AppConfig, PolicyConfig, PoolSetup, RoutingSetup, Unfollowed};
use crate::peers::Joining;

/// A simulated engine started in-process: its role, its pool (none: the default one), the engine.
pub(crate) type Mock = (mock_engine::PdRole, Option<String>, MockEngine);

/// The simulated engines `config` asks for (`--mock-workers`, the PD ones), each pool's with a
/// routing config, serving the pool's model strictly as vLLM does.
pub(crate) async fn spawn_mocks(config: &AppConfig) -> anyhow::Result<Vec<Mock>> {
    let mut mocks = Vec::new();
    let (mock_prefill, mock_decode) = config.pd.as_ref().map_or((0, 0), |pd| (pd.mock_prefill, pd.mock_decode));
    let flavor = match config.pd.as_ref().map(|pd| pd.mode) {
        Some(PdMode::Vllm) => mock_engine::Flavor::Vllm,
        _ => mock_engine::Flavor::Sglang,
    };
    let roles = std::iter::repeat_n(mock_engine::PdRole::Regular, config.mock_workers)
        .chain(std::iter::repeat_n(mock_engine::PdRole::Prefill, mock_prefill))
        .chain(std::iter::repeat_n(mock_engine::PdRole::Decode, mock_decode))
        .collect::<Vec<_>>();
    // With pools, `mock_workers` engines for each pool, serving its model (strictly, as vLLM does).
    let pools: Vec<Option<&PoolSetup>> = match &config.routing {
        Some(r) => r.pools.iter().map(Some).collect(),
        None => vec![None],
    };
    for pool in pools {
        // A disaggregated pool: `mock_workers` prefill and as many decode engines of its contract.
        let (roles, flavor, mooncake) = match pool.and_then(|p| p.pd.as_ref()) {
            Some(pd) => {
                let n = config.mock_workers;
                let legs = std::iter::repeat_n(mock_engine::PdRole::Prefill, n)
                    .chain(std::iter::repeat_n(mock_engine::PdRole::Decode, n))
                    .collect();
                let flavor = match pd.mode {
                    PdMode::Vllm => mock_engine::Flavor::Vllm,
                    PdMode::Sglang => mock_engine::Flavor::Sglang,
                };
                (legs, flavor, pd.connector == gateway::pd::KvConnector::Mooncake)
            }
            None => {
                let mooncake = config.pd.as_ref().is_some_and(|pd| pd.connector == gateway::pd::KvConnector::Mooncake);
                (roles.clone(), flavor, mooncake)
            }
        };
        for role in roles {
            let engine_renderer = match pool {
                Some(p) => pool_renderer(p, config)?,
                None => None,
            };
            let engine_renderer = match (engine_renderer, &config.tokenizer_path) {
                (Some(r), _) => r,
                (None, Some(dir)) => Renderer::from_dir(dir, config.chat_template.as_deref())?,
                (None, None) => builtin_renderer(config)?,
            }
            .with_backend(config.backend);
            // The simulated engines take what the router admits (--max-body-bytes), and never
            // less than their default: the router may add a few fields (PD's bootstrap room).
            let mut mock_config = MockEngineConfig {
                speedup: 10.0,
                max_body_bytes: config.max_body_bytes.max(mock_engine::DEFAULT_MAX_BODY_BYTES),
                ..MockEngineConfig::in_role(role, flavor)
            };
            mock_config.pd.mooncake = role == mock_engine::PdRole::Prefill && mooncake;
            if let Some(p) = pool {
                mock_config.model_id.clone_from(&p.served_model);
                mock_config.strict_model = true;
            }
            let engine = MockEngine::spawn_with(mock_config, engine_renderer).await?;
            mocks.push((role, pool.map(|p| p.name.clone()), engine));
        }
    }
    Ok(mocks)
}

/// The gateway's configuration.
pub(crate) fn gateway_config(config: &AppConfig) -> GatewayConfig {
    GatewayConfig {
        max_body_bytes: config.max_body_bytes,
        request_timeout: config.request_timeout,
        max_concurrent: config.max_concurrent,
        credit_pending: !config.pending_ttl.is_zero(),
        model_id: config.model_id.clone(),
        worker_api_key: config.worker_api_key.clone(),
        limits: config.limits,
        control_plane_keys: config.control_plane_keys.clone(),
        client_keys: config.client_keys.clone(),
        admin_listener: config.admin_listen.is_some(),
        max_request_memory: config.max_request_memory,
        render_threads: config.render_threads,
        retry: config.retry,
        queue_size: config.queue_size,
        queue_timeout: config.queue_timeout,
        duration_buckets: config.duration_buckets.clone(),
        rate_limit: config.rate_limit,
        request_id_headers: config.request_id_headers.clone(),
        cors: config.cors.clone(),
        tls: config.tls.clone(),
        index_snapshot: config.index_snapshot,
        chain_memo_pages: config.chain_memo_pages,
        scheduler: config.scheduler.clone(),
        tenants: config.tenants.clone(),
        tenant_limits: config.tenant_limits.clone(),
        jwt: config.jwt.clone(),
        audit: config.audit,
        upstream_pool_idle: config.upstream_pool_idle,
        upstream_http2: config.upstream_http2,
        cache_trace: config.cache_trace,
        reasoning_parser: config.reasoning_parser.clone(),
        tool_call_parser: config.tool_call_parser.clone(),
        tracer: config.trace.clone().map(otlp::Tracer::start),
        routing_key_headers: config.routing_key_headers.clone(),
        shared_state: config.shared_state.as_ref().map(|s| gateway::shared::SharedConfig {
            target: s.target.clone(),
            options: s.options.clone(),
            prefix: s.prefix.clone(),
        }),
    }
}

/// The fleet's configuration.
pub(crate) fn fleet_config(config: &AppConfig) -> FleetConfig {
    FleetConfig {
        health: fleet::HealthConfig { http2: config.upstream_http2, ..config.health.clone() },
        breaker: config.breaker,
        index_retention: config.index_retention,
        load_poll: config.load_poll,
        api_key: config.worker_api_key.clone(),
        events: config.kv_events.clone(),
        proxied_paths: gateway::PROXIED_PATHS,
        dp_aware: config.dp_aware,
        rank_header: config.rank_header,
        tls: config.worker_tls.clone(),
        liveness: config.liveness.clone(),
    }
}

/// Who joins the fleet, in order: the flags' workers (the default pool's with
/// a routing config), the disaggregated ones, each pool's, the simulated
/// engines; then the Kubernetes discovery.
pub(crate) fn joining(config: &AppConfig, routing: Option<&RoutingSetup>, mocks: &[Mock]) -> Joining {
    // Without a pool of its own, a worker serves the default pool (`--worker-urls` with a routing config).
    let default_pool = match routing {
        Some(r) => PoolId(r.config.default_pool_name().unwrap_or_default().to_owned()),
        None => PoolId::default_pool(),
    };
    let flag = |url: &WorkerUrl, role: Role, pool: PoolId| (url.clone(), role, pool, Source::Flag);
    let mut workers = Vec::new();
    if routing.is_none() {
        workers.extend(config.workers.iter().map(|u| flag(u, Role::Regular, PoolId::default_pool())));
    }
    if let Some(pd) = &config.pd {
        let prefill = pd.prefill.iter().map(|(u, b)| flag(u, Role::Prefill { bootstrap: *b }, PoolId::default_pool()));
        workers.extend(prefill);
        workers.extend(pd.decode.iter().map(|u| flag(u, Role::Decode, PoolId::default_pool())));
    }
    if let Some(r) = routing {
        for p in &r.pools {
            let id = || PoolId(p.name.clone());
            workers.extend(p.workers.iter().map(|u| flag(u, Role::Regular, id())));
            if let Some(pd) = &p.pd {
                workers.extend(pd.prefill.iter().map(|(u, b)| flag(u, Role::Prefill { bootstrap: *b }, id())));
                workers.extend(pd.decode.iter().map(|u| flag(u, Role::Decode, id())));
            }
        }
        workers.extend(config.workers.iter().map(|u| flag(u, Role::Regular, default_pool.clone())));
    }
    for (role, pool, mock) in mocks {
        let url = WorkerUrl::parse(&mock.url()).unwrap_or_else(|_| WorkerUrl::new(mock.url()));
        let role = match role {
            mock_engine::PdRole::Regular => Role::Regular,
            mock_engine::PdRole::Prefill => Role::PREFILL,
            mock_engine::PdRole::Decode => Role::Decode,
        };
        let pool = pool.clone().map_or_else(|| default_pool.clone(), PoolId);
        workers.push((url, role, pool, Source::Mock));
    }
    let discovery = config.discovery.as_ref().map(|d| {
        let mut dc = d.config.clone();
        // A pod naming no pool joins the default one; one naming a pool no one routes to is refused.
        dc.default_pool = default_pool.clone();
        dc.pools = Some(match routing {
            Some(r) => r.pools.iter().map(|p| PoolId(p.name.clone())).collect(),
            None => vec![default_pool.clone()],
        });
        (d.api.clone(), dc)
    });
    Joining { workers, discovery }
}

/// The pools of a routing config (each with its policy, and its own renderer
/// when it names a model directory), and the selector over them.
pub(crate) fn build_pools(
    r: &RoutingSetup,
    renderer: &Arc<Renderer>,
    config: &AppConfig,
    embedder: Option<&embed::EmbedPool>,
) -> anyhow::Result<(Vec<gateway::pools::Pool>, model_select::Selector)> {
    let mut pools = Vec::with_capacity(r.pools.len());
    for p in &r.pools {
        let renderer = match pool_renderer(p, config)? {
            Some(own) => Arc::new(own),
            None => renderer.clone(),
        };
        let policy = build_policy(&p.policy);
        let mut pool = gateway::pools::Pool::new(
            PoolId(p.name.clone()),
            p.served_model.clone(),
            policy,
            renderer,
            p.context_window,
            config.chain_memo_pages,
        );
        if let Some(rate) = r.config.pools.iter().find(|c| c.name == p.name).and_then(|c| c.prefill_tokens_per_s) {
            pool.prefill_tokens_per_s = rate;
        }
        // Its policy chooses the prefill worker; the decode policy, by load, the decode worker.
        pool.pd = p.pd.as_ref().map(|pd| {
            let decode = build_policy(&pd.decode_policy);
            Arc::new(gateway::pd::PdConfig::new(pd.mode, decode).with_connector(pd.connector))
        });
        pools.push(pool);
    }
    let examples = embedder.map(gateway::pools::Examples);
    let examples = examples.as_ref().map(|e| e as &dyn model_select::Embedder);
    let selector = model_select::Selector::with_embedder(r.config.clone(), examples).map_err(|problems| {
        let problems: Vec<String> = problems.iter().map(ToString::to_string).collect();
        anyhow::anyhow!("the routing config: {}", problems.join("; "))
    })?;
    Ok((pools, selector))
}

/// A pool's own renderer, when it names a model directory or a chat template
/// (the router's for what it leaves out); `None`: the router's renderer.
fn pool_renderer(p: &PoolSetup, config: &AppConfig) -> anyhow::Result<Option<Renderer>> {
    if p.tokenizer_path.is_none() && p.chat_template.is_none() {
        return Ok(None);
    }
    let Some(dir) = p.tokenizer_path.as_ref().or(config.tokenizer_path.as_ref()) else {
        bail!("pool {}: chat_template needs a model directory (its tokenizer_path, or --tokenizer-path)", p.name);
    };
    let template = p.chat_template.as_deref().or(config.chat_template.as_deref());
    let r = Renderer::from_dir_with(dir, template, config.tokenizer_caches)
        .with_context(|| format!("pool {}: loading the model at {}", p.name, dir.display()))?;
    Ok(Some(r.with_backend(config.backend)))
}

/// The policy `config` names.
pub(crate) fn build_policy(config: &PolicyConfig) -> Arc<dyn Policy> {
    match config {
        PolicyConfig::RoundRobin => Arc::new(RoundRobin::default()),
        PolicyConfig::Random => Arc::new(Random::new(seed())),
        PolicyConfig::PowerOfTwo(metric, wait) => Arc::new(PowerOfTwo::new(seed(), *metric, *wait)),
        PolicyConfig::LeastLoad(wait) => Arc::new(LeastLoad::new(*wait)),
        PolicyConfig::Manual => Arc::new(policy::Manual::new(seed())),
        PolicyConfig::CacheAware(c, Unfollowed::Tree(tree)) => {
            Arc::new(CacheAware::new(*c, seed()).with_text_tree(*tree))
        }
        PolicyConfig::CacheAware(c, Unfollowed::Heads(heads)) => {
            Arc::new(CacheAware::new(*c, seed()).with_head_hashes(heads.clone()))
        }
        PolicyConfig::MinTtft(c) => Arc::new(MinTtft::new(*c)),
        PolicyConfig::ApproxTree(c) => Arc::new(ApproxTreePolicy::new(*c)),
    }
}

fn seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(7, |d| d.as_nanos() as u64)
}

/// The built-in model's renderer (no `--tokenizer-path`), with `--chat-template` if given.
pub(crate) fn builtin_renderer(config: &AppConfig) -> anyhow::Result<Renderer> {
    let r = Renderer::builtin_with(config.tokenizer_caches)?;
    Ok(match &config.chat_template {
        Some(t) => r.with_chat_template(t).with_context(|| format!("loading the chat template {}", t.display()))?,
        None => r,
    })
}
