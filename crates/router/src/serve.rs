//! `sgl-router` without a subcommand: validate the flags into an
//! `AppConfig`, build the `App`, print where it listens, serve until SIGTERM
//! or Ctrl-C, drain.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use fleet::{BreakerConfig, DEFAULT_DISCOVERY_DEADLINE, EventsConfig, HealthConfig};
use gateway::RetryConfig;
use policy::{ApproxTreeConfig, CacheAwareConfig, HeadHashConfig, MinTtftConfig};
use router_types::WorkerUrl;
use sgl_router::app::{App, AppConfig, PolicyConfig, Unfollowed};

use crate::cli::{CacheIndex, LoadMetricName, LogFormat, PolicyName, ServeArgs};
use crate::usage::UsageError;

/// Reads `--routing-config-resource [NS/]NAME` from the API server (a runtime of its own:
/// the flags are read before the router's starts): its spec's text and the resource to follow.
fn routing_resource(
    a: &ServeArgs,
    named: &str,
) -> Result<(String, sgl_router::routing_resource::Followed), UsageError> {
    use fleet::k8s::api::ApiServer;
    let (namespace, name) = match named.split_once('/') {
        Some((ns, name)) => (ns.to_owned(), name),
        None => (
            a.discovery.service_discovery_namespace.clone().filter(|n| !n.is_empty()).unwrap_or("default".into()),
            named,
        ),
    };
    if name.is_empty() || namespace.is_empty() || name.contains('/') {
        return Err(UsageError(format!("--routing-config-resource {named:?}: expected [NAMESPACE/]NAME")));
    }
    let what = sgl_router::routing_resource::resource(&namespace, name);
    let api = |purpose: &str| {
        ApiServer::infer().map_err(|e| UsageError(format!("--routing-config-resource ({purpose}): {e}")))
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| UsageError(format!("--routing-config-resource: {e}")))?;
    let fetched = runtime
        .block_on(sgl_router::routing_resource::fetch(api("reading it")?, what))
        .map_err(|e| UsageError(format!("--routing-config-resource: {e}")))?;
    // The follower's client is made anew: connections do not outlive the runtime they were made on.
    let followed = sgl_router::routing_resource::Followed { api: api("following it")?, ..fetched.followed };
    Ok((fetched.text, followed))
}

/// Turns flags into a config; tuning a policy that is not selected is an error.
pub(crate) fn config(a: &ServeArgs) -> Result<AppConfig, UsageError> {
    let usage = |m: String| Err(UsageError(m));
    a.smg_only.check()?;
    let (routing, origin) = match (&a.routing_config, &a.routing_config_resource) {
        (Some(path), _) => {
            let r = crate::routing::load(path, a.policy).map_err(|p| UsageError(p.join("\n")))?;
            (Some(r), Some(sgl_router::config::RoutingOrigin::File(path.clone())))
        }
        (None, Some(named)) => {
            let (text, followed) = routing_resource(a, named)?;
            let shown = sgl_router::routing_resource::shown(&followed.what);
            let r = crate::routing::load_text(&text, &shown, a.policy).map_err(|p| UsageError(p.join("\n")))?;
            (Some(r), Some(sgl_router::config::RoutingOrigin::Resource(followed)))
        }
        (None, None) => (None, None),
    };
    // Each tuning flag belongs to one policy (the text tree's to two: approx_tree, and
    // cache_aware for workers without KV events); setting it under another is a mistake.
    use PolicyName::{CacheAware, LeastLoad, MinTtft, PowerOfTwo};
    let smg_wait = policy::ExpectedWait::default();
    let policy_flags = [
        ("--cache-affinity-min-matched-tokens", a.cache_affinity_min_matched_tokens.is_some(), Owner(CacheAware)),
        ("--cache-candidates-min", a.cache_candidates_min.is_some(), Owner(CacheAware)),
        ("--cache-candidates-ratio", a.cache_candidates_ratio.is_some(), Owner(CacheAware)),
        ("--cache-candidates-max", a.cache_candidates_max.is_some(), Owner(CacheAware)),
        ("--cache-switch-margin-tokens", a.cache_switch_margin_tokens.is_some(), Owner(CacheAware)),
        ("--cache-pressure-abs-tokens", a.cache_pressure_abs_tokens.is_some(), Owner(CacheAware)),
        ("--cache-pressure-rel", a.cache_pressure_rel.is_some(), Owner(CacheAware)),
        ("--no-cache-pressure-guard", a.no_cache_pressure_guard, Owner(CacheAware)),
        ("--overlap-decay", a.overlap_decay.is_some(), Owner(CacheAware)),
        ("--selection-temperature", a.selection_temperature.is_some(), Owner(CacheAware)),
        ("--balance-token-usage-threshold", a.balance_token_usage_threshold.is_some(), Owner(CacheAware)),
        ("--overload-token-usage-threshold", a.overload_token_usage_threshold.is_some(), Owner(CacheAware)),
        ("--approx-cache-threshold", a.approx_cache_threshold.is_some(), TextTree),
        ("--approx-balance-abs", a.approx_balance_abs.is_some(), TextTree),
        ("--approx-balance-rel", a.approx_balance_rel.is_some(), TextTree),
        ("--approx-eviction-interval-secs", a.approx_eviction_interval_secs.is_some(), TextTree),
        ("--approx-max-tree-bytes", a.approx_max_tree_bytes.is_some(), TextTree),
        // SMG's default is accepted under any policy (an `smg` command line may pass it).
        ("--cache-ttl-secs", a.cache_ttl_secs != 180, TextTree),
        ("--cache-index hash", a.cache_index == CacheIndex::Hash, Owner(CacheAware)),
        ("--cache-boundaries", !a.cache_boundaries.is_empty(), Owner(CacheAware)),
        ("--ttft-hit-weight", a.ttft_hit_weight.is_some(), Owner(MinTtft)),
        // SMG's load-model options: its default values are accepted under any policy (an `smg`
        // command line passes them whatever its policy), others only where they act.
        (
            "--least-load-kv-pressure-weight",
            a.least_load_kv_pressure_weight.is_some_and(|v| v != smg_wait.kv_pressure_weight),
            LoadModel,
        ),
        (
            "--least-load-default-throughput",
            a.least_load_default_throughput.is_some_and(|v| v != smg_wait.default_throughput),
            LoadModel,
        ),
        (
            "--least-load-mean-prefill-tokens",
            a.least_load_mean_prefill_tokens.is_some_and(|v| v != smg_wait.mean_prefill_tokens),
            LoadModel,
        ),
        (
            "--least-load-max-waiting-requests",
            a.least_load_max_waiting_requests.is_some_and(|v| v != smg_wait.max_waiting_requests),
            Owner(LeastLoad),
        ),
        (
            "--power-of-two-load-metric",
            a.power_of_two_load_metric.is_some_and(|m| m != LoadMetricName::ExpectedWait),
            Owner(PowerOfTwo),
        ),
    ];
    let mut selected = vec![a.policy, a.pd.prefill_policy.unwrap_or(a.policy), a.pd.decode_policy.unwrap_or(a.policy)];
    selected.extend(routing.iter().flat_map(|r| r.pools.iter().map(|p| p.policy)));
    selected.extend(routing.iter().flat_map(|r| r.pools.iter().filter_map(|p| Some(p.pd.as_ref()?.decode_policy))));
    if let Some((flag, _, owner)) =
        policy_flags.iter().find(|(_, set, owner)| *set && !selected.iter().any(|p| owner.owns(*p)))
    {
        let owner = match owner {
            Owner(p) => format!("the {} policy", policy_name(*p)),
            TextTree => "the text tree of approx_tree and cache_aware".into(),
            LoadModel => "the expected wait of least_load and power_of_two".into(),
        };
        return usage(format!("{flag} tunes {owner}, but --policy is {}", policy_name(a.policy)));
    }
    let index_flags = [
        ("--cache-pending-prefix-ttl-ms", a.cache_pending_prefix_ttl_ms.is_some()),
        ("--max-index-blocks", a.max_index_blocks.is_some()),
    ];
    // cache_aware follows the events of every worker that advertises them, --kv-events or not.
    let kv_events_on = a.kv_events
        || selected[..2].contains(&PolicyName::CacheAware)
        || routing.iter().any(|r| r.pools.iter().any(|p| p.policy == PolicyName::CacheAware));
    if !kv_events_on && let Some((flag, _)) = index_flags.iter().find(|(_, set)| *set) {
        return usage(format!("{flag} tunes the KV index, which only --kv-events (or --policy cache_aware) builds"));
    }
    let pd_on = a.pd.pd_disaggregation || a.pd.vllm_pd_disaggregation || a.mock_workers.decode.is_some();
    let pd_workers = !a.pd.prefill.is_empty() || !a.pd.decode.is_empty();
    let pool_workers = routing.iter().any(|r| r.pools.iter().any(|p| p.urls().next().is_some()));
    if a.worker_urls.is_empty()
        && a.mock_workers.n == 0
        && a.mock_workers.decode.is_none()
        && !pd_on
        && !pd_workers
        && !pool_workers
        && !a.discovery.service_discovery
        && a.discovery.pool_name.is_none()
    {
        return usage("no workers: give --worker-urls URL,... or --mock-workers N (or --service-discovery)".into());
    }
    if (routing.is_some() || a.enable_igw) && (pd_on || pd_workers) {
        return usage(
            "model pools (--routing-config, --enable-igw) with the disaggregation flags: declare a disaggregated pool in the routing config instead (`disaggregation: sglang|vllm|mooncake`, `prefill:`, `decode:`)".into(),
        );
    }
    if pd_on && !a.worker_urls.is_empty() {
        return usage("--worker-urls with disaggregation: give the workers as --prefill URL and --decode URL".into());
    }
    let mut workers: Vec<WorkerUrl> = Vec::with_capacity(a.worker_urls.len());
    for u in a.worker_urls.iter().filter(|u| !u.trim().is_empty()) {
        match gateway::check_worker_url(u.trim()) {
            // One engine, one worker, however often or however it is spelled.
            Ok(w) if !workers.contains(&w) => workers.push(w),
            Ok(_) => {}
            Err(e) => return usage(format!("--worker-urls: {e}")),
        }
    }
    let listen: SocketAddr = match format!("{}:{}", a.host, a.port).parse() {
        Ok(s) => s,
        Err(e) => return usage(format!("--host {} --port {}: {e}", a.host, a.port)),
    };
    let admin_listen = match a.admin_port {
        None => None,
        Some(port) => {
            let host = a.admin_host.as_deref().unwrap_or(&a.host);
            match format!("{host}:{port}").parse::<SocketAddr>() {
                // One port on overlapping addresses cannot be bound twice.
                Ok(s)
                    if s.port() == listen.port()
                        && (s.ip() == listen.ip() || s.ip().is_unspecified() || listen.ip().is_unspecified()) =>
                {
                    return usage(format!("--admin-port {port} is the client port"));
                }
                Ok(s) => Some(s),
                Err(e) => return usage(format!("--admin-host {host} --admin-port {port}: {e}")),
            }
        }
    };
    if !["off", "error", "warn", "info", "debug", "trace"].contains(&a.log_level.to_ascii_lowercase().as_str()) {
        return usage(format!("--log-level {}: one of off, error, warn, info, debug, trace", a.log_level));
    }
    let health_endpoint = match a.health.health_check_endpoint.trim() {
        p if p.starts_with('/') && !p.contains(char::is_whitespace) => p.to_string(),
        p => return usage(format!("--health-check-endpoint {p:?}: a path starting with '/'")),
    };
    if !(a.retry.retry_backoff_multiplier.is_finite() && a.retry.retry_backoff_multiplier >= 1.0) {
        return usage("--retry-backoff-multiplier: at least 1".into());
    }
    for (flag, value) in [("--overlap-decay", a.overlap_decay), ("--selection-temperature", a.selection_temperature)] {
        if let Some(v) = value.filter(|v| !(v.is_finite() && *v >= 0.0)) {
            return usage(format!("{flag} {v}: a finite number, 0 or more"));
        }
    }
    for (flag, value) in [
        ("--balance-token-usage-threshold", a.balance_token_usage_threshold),
        ("--overload-token-usage-threshold", a.overload_token_usage_threshold),
    ] {
        // SMG's bounds: finite and above 0 (1 or more turns it off).
        if let Some(v) = value.filter(|v| !(v.is_finite() && *v > 0.0)) {
            return usage(format!("{flag} {v}: a finite number above 0 (1 or more: off)"));
        }
    }
    let wait = policy::ExpectedWait {
        kv_pressure_weight: a.least_load_kv_pressure_weight.unwrap_or(smg_wait.kv_pressure_weight),
        default_throughput: a.least_load_default_throughput.unwrap_or(smg_wait.default_throughput),
        mean_prefill_tokens: a.least_load_mean_prefill_tokens.unwrap_or(smg_wait.mean_prefill_tokens),
        max_waiting_requests: a.least_load_max_waiting_requests.unwrap_or(smg_wait.max_waiting_requests),
    };
    wait.check().map_err(|e| UsageError(format!("--least-load-*: {e}")))?;
    let metric = match a.power_of_two_load_metric {
        None | Some(LoadMetricName::ExpectedWait) => policy::LoadMetric::ExpectedWait,
        Some(LoadMetricName::Requests) => policy::LoadMetric::Requests,
        Some(LoadMetricName::LeastRequests) => policy::LoadMetric::LeastRequests,
    };
    if !(0.0..=1.0).contains(&a.retry.retry_jitter_factor) {
        return usage("--retry-jitter-factor: between 0 and 1".into());
    }
    let duration_buckets = if a.prometheus_duration_buckets.is_empty() {
        gateway::metrics::LATENCY_BUCKETS.to_vec()
    } else {
        let b = a.prometheus_duration_buckets.clone();
        if b.iter().any(|x| !x.is_finite() || *x <= 0.0) || b.windows(2).any(|w| w[0] >= w[1]) {
            return usage("--prometheus-duration-buckets: positive seconds in increasing order".into());
        }
        b
    };
    let tls = match (&a.tls_cert_path, &a.tls_key_path) {
        (Some(cert), Some(key)) => Some(
            gateway::tls::server_config(cert, key)
                .map_err(|e| UsageError(format!("--tls-cert-path/--tls-key-path: {e}")))?,
        ),
        _ => None,
    };
    let identity = a.client_cert_path.as_deref().zip(a.client_key_path.as_deref());
    let worker_tls = fleet::WorkerTls::new(&a.ca_cert_paths, identity)
        .map_err(|e| UsageError(format!("--ca-cert-paths/--client-cert-path/--client-key-path: {e}")))?;
    let probe_listen = match a.liveness.health_check_port {
        None => None,
        Some(port) if port == listen.port() && port != 0 => {
            return usage(format!("--health-check-port {port} is the client port"));
        }
        Some(port) => Some(SocketAddr::new(listen.ip(), port)),
    };
    let epp_listen = match a.epp.epp_port {
        None => None,
        Some(port) if port == listen.port() && port != 0 => {
            return usage(format!("--epp-port {port} is the client port"));
        }
        Some(port) => Some(SocketAddr::new(listen.ip(), port)),
    };
    let metrics_listen = match a.prometheus_port {
        None => None,
        Some(port) => match format!("{}:{port}", a.prometheus_host).parse::<SocketAddr>() {
            Ok(s) if s.port() == listen.port() && port != 0 => {
                return usage(format!("--prometheus-port {port} is the client port"));
            }
            Ok(s) => Some(s),
            Err(e) => return usage(format!("--prometheus-host {} --prometheus-port {port}: {e}", a.prometheus_host)),
        },
    };
    if let Some(bad) =
        a.request_id_headers.iter().find(|h| axum::http::HeaderName::from_bytes(h.trim().as_bytes()).is_err())
    {
        return usage(format!("--request-id-headers {bad:?}: not a header name"));
    }
    // SGLang Model Gateway's form `id:name:role:key` is taken for its key; only the admin role exists here.
    let mut control_keys = Vec::with_capacity(a.control_plane_api_keys.len());
    for k in &a.control_plane_api_keys {
        match k.splitn(4, ':').collect::<Vec<_>>()[..] {
            [_, _, "admin", key] => control_keys.push(key.to_string()),
            [_, _, role @ ("user" | "viewer"), _] => {
                return usage(format!(
                    "--control-plane-api-keys: role {role:?} is not supported (every control-plane key is an admin key)"
                ));
            }
            _ => control_keys.push(k.clone()),
        }
    }
    if control_keys.iter().chain(&a.client_api_keys).any(|k| k.trim().is_empty()) {
        return usage("--control-plane-api-keys / --client-api-keys: a key cannot be empty".into());
    }
    let d = CacheAwareConfig::default();
    let t = ApproxTreeConfig::default();
    let tree = ApproxTreeConfig {
        cache_threshold: a.approx_cache_threshold.unwrap_or(t.cache_threshold),
        balance_abs: a.approx_balance_abs.unwrap_or(t.balance_abs),
        balance_rel: a.approx_balance_rel.unwrap_or(t.balance_rel),
        max_tree_bytes: a.approx_max_tree_bytes.unwrap_or(t.max_tree_bytes),
        ttl_ms: a.cache_ttl_secs.saturating_mul(1000),
    };
    if !a.cache_boundaries.is_empty() && a.cache_index != CacheIndex::Hash {
        return usage("--cache-boundaries: read by --cache-index hash only (the text tree matches any prefix)".into());
    }
    if a.cache_boundaries.contains(&0) {
        return usage("--cache-boundaries: a boundary is a token position of at least 1".into());
    }
    let unfollowed = match a.cache_index {
        CacheIndex::Tree => Unfollowed::Tree(tree),
        CacheIndex::Hash => {
            let mut boundaries = a.cache_boundaries.clone();
            boundaries.sort_unstable();
            boundaries.dedup();
            if boundaries.is_empty() {
                let page = u32::try_from(a.events.block_size.get()).unwrap_or(u32::MAX);
                boundaries = HeadHashConfig::powers_of_two(page);
            }
            Unfollowed::Heads(HeadHashConfig { boundaries, ttl_ms: tree.ttl_ms, max_bytes: tree.max_tree_bytes })
        }
    };
    let policy_config = |name: PolicyName| match name {
        PolicyName::RoundRobin => PolicyConfig::RoundRobin,
        PolicyName::Random => PolicyConfig::Random,
        PolicyName::PowerOfTwo => PolicyConfig::PowerOfTwo(metric, wait),
        PolicyName::LeastLoad => PolicyConfig::LeastLoad(wait),
        PolicyName::Manual => PolicyConfig::Manual,
        PolicyName::CacheAware => PolicyConfig::CacheAware(
            CacheAwareConfig {
                min_matched_tokens: a.cache_affinity_min_matched_tokens.unwrap_or(d.min_matched_tokens),
                candidates_min: a.cache_candidates_min.unwrap_or(d.candidates_min),
                candidates_ratio: a.cache_candidates_ratio.unwrap_or(d.candidates_ratio),
                candidates_max: a.cache_candidates_max.unwrap_or(d.candidates_max),
                switch_margin_tokens: a.cache_switch_margin_tokens.unwrap_or(d.switch_margin_tokens),
                pressure_guard: !a.no_cache_pressure_guard,
                pressure_abs_tokens: a.cache_pressure_abs_tokens.unwrap_or(d.pressure_abs_tokens),
                pressure_rel: a.cache_pressure_rel.unwrap_or(d.pressure_rel),
                warmup_share: a.liveness.worker_warmup_share,
                warmup_divert_every: a.liveness.worker_warmup_divert_every,
                overlap_decay: a.overlap_decay.unwrap_or(d.overlap_decay),
                selection_temperature: a.selection_temperature.unwrap_or(d.selection_temperature),
                balance_token_usage: a.balance_token_usage_threshold.unwrap_or(d.balance_token_usage),
                overload_token_usage: a.overload_token_usage_threshold.unwrap_or(d.overload_token_usage),
            },
            unfollowed.clone(),
        ),
        PolicyName::MinTtft => PolicyConfig::MinTtft(MinTtftConfig {
            hit_weight: a.ttft_hit_weight.unwrap_or(MinTtftConfig::default().hit_weight).max(0.0),
        }),
        PolicyName::ApproxTree => PolicyConfig::ApproxTree(tree),
    };
    let policy = policy_config(a.policy);
    let routing = routing.map(|r| sgl_router::app::RoutingSetup {
        pools: r
            .pools
            .into_iter()
            .map(|p| sgl_router::app::PoolSetup {
                name: p.name,
                served_model: p.served_model,
                workers: p.workers,
                policy: policy_config(p.policy),
                tokenizer_path: p.tokenizer_path,
                chat_template: p.chat_template,
                context_window: p.context_window,
                pd: p.pd.map(|pd| sgl_router::app::PoolPd {
                    mode: pd.contract().0,
                    connector: pd.contract().1,
                    prefill: pd.prefill,
                    decode: pd.decode,
                    decode_policy: policy_config(pd.decode_policy),
                }),
            })
            .collect(),
        config: r.config,
        source: origin,
    });
    let pd = crate::pd::setup(a, policy_config)?;
    let discovery = crate::discovery::setup(a)?;
    let index_peers = crate::discovery::peers(a)?;
    let kv_events = if kv_events_on {
        let explicit = crate::tools::explicit(&a.events).map_err(|e| UsageError(e.to_string()))?;
        Some(EventsConfig {
            explicit,
            default_block_size: a.events.block_size,
            topic: a.events.topic.clone(),
            discovery_deadline: DEFAULT_DISCOVERY_DEADLINE,
            rediscover_after: Duration::from_secs(a.events.rediscover_secs.max(1)),
            subscriber: kv_events::SubscriberConfig::default(),
        })
    } else {
        if !a.events.endpoints.is_empty() || !a.events.replay_endpoints.is_empty() || !a.events.dp_sizes.is_empty() {
            return usage("--kv-events-* endpoints given without --kv-events (or --policy cache_aware)".into());
        }
        None
    };
    Ok(AppConfig {
        discovery,
        index_peers,
        index_snapshot: crate::discovery::serving(a),
        listen,
        workers,
        mock_workers: if pd.is_some() { 0 } else { a.mock_workers.n },
        pd,
        policy,
        routing,
        embedding: a.embedding_model_path.as_ref().map(|model| sgl_router::app::EmbeddingSetup {
            model: model.clone(),
            pool: embed::PoolConfig {
                threads: a.embedding_threads.max(1),
                queue: a.embedding_queue.max(1),
                batch: a.embedding_batch.max(1),
                cache_entries: a.embedding_cache_entries,
                timeout: Duration::from_millis(a.embedding_timeout_ms.max(1)),
            },
            precision: a.embedding_precision,
        }),
        igw: a.enable_igw,
        kv_events,
        tokenizer_path: a.tokenizer_path.clone(),
        chat_template: a.chat_template.clone(),
        backend: match a.backend {
            crate::cli::Backend::Sglang => renderer::anthropic::Backend::Sglang,
            crate::cli::Backend::Vllm => renderer::anthropic::Backend::Vllm,
            other => {
                return Err(UsageError(format!(
                    "--backend {}: this router proxies to SGLang and vLLM engines (--backend sglang or vllm); \
                     cloud backends and TokenSpeed's ZMQ workers are not served",
                    format!("{other:?}").to_lowercase()
                )));
            }
        },
        model_id: a.model_id.clone(),
        pending_ttl: Duration::from_millis(a.cache_pending_prefix_ttl_ms.unwrap_or(0)),
        max_index_nodes: a.max_index_blocks,
        chain_memo_pages: a.page_hash_memo_pages,
        feedback: gateway::pools::feedback::FeedbackConfig {
            max_routes: a.route_feedback_routes.max(1),
            ttl: Duration::from_secs(a.route_feedback_ttl_secs),
            max_arms: a.route_feedback_arms.max(1),
            prior_strength: a.route_feedback_prior_strength.max(0.0),
            state_file: a.route_feedback_state.clone(),
            save_interval: Duration::from_secs(a.route_feedback_save_secs.max(1)),
            per_caller_per_minute: a.route_feedback_per_minute,
            caller_weight: a.route_feedback_caller_weight,
            ..gateway::pools::feedback::FeedbackConfig::default()
        },
        tokenizer_caches: renderer::CacheBounds {
            segment_entries: a.tokenizer_cache_segments,
            segment_bytes: a.tokenizer_cache_segment_bytes,
            word_bytes: a.tokenizer_cache_word_bytes,
        },
        max_body_bytes: a.max_body_bytes,
        request_timeout: Duration::from_secs(a.request_timeout_secs.max(1)),
        max_concurrent: usize::try_from(a.max_concurrent_requests).ok().filter(|n| *n > 0).unwrap_or(usize::MAX),
        health: HealthConfig {
            enabled: !a.health.disable_health_check,
            interval: Duration::from_secs(a.health.health_check_interval_secs.max(1)),
            timeout: Duration::from_secs(a.health.health_check_timeout_secs.max(1)),
            endpoint: health_endpoint,
            failure_threshold: a.health.health_failure_threshold.max(1),
            success_threshold: a.health.health_success_threshold.max(1),
            remove_unhealthy: a.health.remove_unhealthy_workers,
            startup: a.liveness.startup(),
            http2: a.liveness.upstream_http2,
        },
        breaker: BreakerConfig {
            enabled: !a.breaker.disable_circuit_breaker,
            failure_threshold: a.breaker.cb_failure_threshold.max(1),
            success_threshold: a.breaker.cb_success_threshold.max(1),
            timeout: Duration::from_secs(a.breaker.cb_timeout_duration_secs),
            window: Duration::from_secs(a.breaker.cb_window_duration_secs.max(1)),
        },
        retry: RetryConfig {
            enabled: !a.retry.disable_retries,
            max_retries: a.retry.retry_max_retries,
            initial_backoff: Duration::from_millis(a.retry.retry_initial_backoff_ms),
            max_backoff: Duration::from_millis(a.retry.retry_max_backoff_ms.max(a.retry.retry_initial_backoff_ms)),
            multiplier: a.retry.retry_backoff_multiplier,
            jitter: a.retry.retry_jitter_factor,
        },
        queue_size: a.queue_size,
        queue_timeout: Duration::from_secs(a.queue_timeout_secs.max(1)),
        duration_buckets,
        rate_limit: a.rate_limit_tokens_per_second.filter(|r| *r > 0),
        request_id_headers: if a.request_id_headers.is_empty() {
            gateway::pipeline::context::DEFAULT_REQUEST_ID_HEADERS.iter().map(|h| h.to_string()).collect()
        } else {
            a.request_id_headers.iter().map(|h| h.trim().to_ascii_lowercase()).filter(|h| !h.is_empty()).collect()
        },
        cors: gateway::pipeline::context::Cors::from_flag(&a.cors_allowed_origins),
        metrics_listen,
        probe_listen,
        epp_listen,
        epp: gateway::epp::EppConfig { test_pick_header: a.epp.epp_test_endpoint_header, objectives: None },
        dp_aware: a.dp_aware,
        rank_header: a.dp_rank_header.into(),
        tls,
        worker_tls,
        load_poll: a.liveness.load_poll(a.worker_load_poll_ms),
        liveness: a.liveness.config()?,
        scheduler: match a.scheduler.scheduler()? {
            Some(_) if a.max_concurrent_requests <= 0 => {
                return usage("--priority-scheduler-enabled needs a --max-concurrent-requests limit: its slots".into());
            }
            s => s,
        },
        tenants: a.scheduler.tenants()?,
        tenant_limits: a.scheduler.tenant_limits()?,
        jwt: a.control.jwt()?,
        audit: a.control.control_plane_audit_enabled,
        // 0: reused until the pools' own sweep.
        upstream_pool_idle: match a.liveness.upstream_pool_idle_timeout_secs {
            0 => Duration::MAX,
            s => Duration::from_secs(s),
        },
        upstream_http2: a.liveness.upstream_http2,
        cache_trace: a.cache_trace.config(),
        index_retention: Duration::from_secs(a.worker_index_retention_secs),
        reasoning_parser: a.reasoning_parser.clone(),
        tool_call_parser: a.tool_call_parser.clone(),
        trace: a.enable_trace.then(|| otlp::ExportConfig::new(a.otlp_traces_endpoint.trim(), "sgl-router")),
        routing_key_headers: a
            .routing_key_headers
            .iter()
            .map(|h| h.trim().to_ascii_lowercase())
            .filter(|h| !h.is_empty() && h != "x-smg-routing-key")
            .collect(),
        shared_state: a.shared.setup().map_err(UsageError)?,
        shutdown_grace: Duration::from_secs(a.shutdown_grace_secs),
        fast_proxy: !a.no_fast_proxy,
        worker_api_key: a.api_key.clone(),
        limits: gateway::ClientLimits {
            header_read_timeout: Duration::from_secs(a.client_header_timeout_secs.max(1)),
            body_read_timeout: Duration::from_secs(a.client_body_timeout_secs.max(1)),
            body_stall_timeout: Duration::from_secs(a.stream_body_stall_timeout_secs),
            idle_timeout: Duration::from_secs(a.client_idle_timeout_secs.max(1)),
            max_connections: a.max_connections.max(1),
            upstream_idle_timeout: Duration::from_secs(a.upstream_idle_timeout_secs.max(1)),
            sse_keepalive: Duration::from_secs(a.sse_keepalive_secs),
        },
        control_plane_keys: control_keys,
        // SGLang Model Gateway's --api-key also locks the data plane: clients present it.
        // A tenant's key (--tenant-api-key) is a client key besides the others.
        client_keys: if a.client_api_keys.is_empty() {
            a.api_key.iter().cloned().collect()
        } else {
            a.client_api_keys.clone()
        }
        .into_iter()
        .chain(a.scheduler.tenant_keys())
        .collect(),
        admin_listen,
        max_request_memory: a.max_request_memory_bytes.max(1),
        render_threads: a
            .render_threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get))
            .max(1),
        serve_threads: a
            .serve_threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)),
    })
}

/// Who a policy tuning flag belongs to.
#[derive(Debug, Clone, Copy)]
enum FlagOwner {
    /// One policy.
    Owner(PolicyName),
    /// The text tree: approx_tree's, and cache_aware's for workers without events.
    TextTree,
    /// The expected-wait model: least_load's, and power_of_two's.
    LoadModel,
}
use FlagOwner::{LoadModel, Owner, TextTree};

impl FlagOwner {
    fn owns(self, p: PolicyName) -> bool {
        match self {
            Owner(o) => o == p,
            TextTree => matches!(p, PolicyName::ApproxTree | PolicyName::CacheAware),
            LoadModel => matches!(p, PolicyName::LeastLoad | PolicyName::PowerOfTwo),
        }
    }
}

fn policy_name(p: PolicyName) -> String {
    clap::ValueEnum::to_possible_value(&p).map_or_else(String::new, |v| v.get_name().to_string())
}

fn init_tracing(format: LogFormat, level: &str, dir: Option<&std::path::Path>) -> Result<()> {
    use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| level.into());
    // Colour only on a terminal: log files and collectors get plain text.
    let ansi = dir.is_none() && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let writer = match dir {
        Some(dir) => {
            let file = crate::logfile::DailyFile::new(dir)
                .with_context(|| format!("--log-dir {}: cannot write there", dir.display()))?;
            BoxMakeWriter::new(std::io::stderr.and(file))
        }
        None => BoxMakeWriter::new(std::io::stderr),
    };
    let builder = tracing_subscriber::fmt().with_writer(writer).with_env_filter(filter).with_ansi(ansi);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    Ok(())
}

/// `--max-connections` capped to what the open-file limit leaves (said when
/// that lowers it: a warning for a value asked for, information for the default): the client listener and the `--admin-port` one each
/// hold up to the cap.
fn fit_open_file_limit(flag: usize, admin_listener: bool) -> usize {
    let soft_limit = crate::fdlimit::nofile_soft_limit();
    let cap = crate::fdlimit::connection_cap(flag, soft_limit, if admin_listener { 2 } else { 1 });
    // Said at info for the default (most machines' limits are below it), at warn for a value asked for.
    macro_rules! lowered {
        ($level:ident) => {
            tracing::$level!(
                max_connections = flag,
                effective = cap,
                nofile_soft_limit = soft_limit,
                admin_listener,
                "--max-connections lowered to fit the open-file limit (a quarter of it, at least 64, kept \
                 for upstream connections and subscribers); raise `ulimit -n` to allow more"
            )
        };
    }
    if cap < flag && flag != crate::defaults::MAX_CONNECTIONS {
        lowered!(warn);
    } else if cap < flag {
        lowered!(info);
    }
    cap
}

/// Runs the router until SIGTERM or Ctrl-C.
pub(crate) fn serve(mut config: AppConfig, a: &ServeArgs) -> Result<()> {
    let log_format = if a.log_json { crate::cli::LogFormat::Json } else { a.log_format };
    init_tracing(log_format, &a.log_level, a.log_dir.as_deref())?;
    for note in a.smg_only.check().unwrap_or_default() {
        tracing::warn!("{note}");
    }
    config.limits.max_connections = fit_open_file_limit(config.limits.max_connections, config.admin_listen.is_some());
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let control_plane_open = !config.control_plane_keys.is_empty();
    if matches!(config.policy, PolicyConfig::CacheAware(..)) && !a.kv_events {
        tracing::info!(
            "cache_aware: following the KV events of the workers that advertise them; the others are routed by a text tree of what this router sent them"
        );
    }
    if a.client_api_keys.is_empty() && a.api_key.is_some() {
        tracing::info!(
            "--api-key without --client-api-keys: clients must present the --api-key key (as SGLang Model Gateway requires)"
        );
    }
    runtime.block_on(async move {
        let app = App::build(config).await?;
        let addr = app.local_addr();
        println!("sgl-router listening on http://{addr}");
        match app.admin_addr() {
            Some(admin) => println!("  control plane on http://{admin}"),
            None if !control_plane_open => {
                println!("  control plane closed (/workers, /debug/route, /metrics): start with --control-plane-api-keys KEY")
            }
            None => {}
        }
        if let Some(p) = app.probe_addr() {
            println!("  probes on http://{p} (/health, /liveness, /readiness)");
        }
        if let Some(m) = app.metrics_addr() {
            println!("  metrics on http://{m}/metrics");
        }
        // Read first: once the catch-up is over, the workers have joined.
        let catching_up = app.catching_up();
        if catching_up {
            println!("  catching up from the index peers: the workers join once it is over");
        }
        for w in app.worker_urls() {
            println!("  worker {w}");
        }
        let model = if a.routing_config.is_some() || a.routing_config_resource.is_some() { "auto" } else { "default" };
        println!(
            "try: curl -s http://{addr}/v1/chat/completions -H 'content-type: application/json' \\\n       -d '{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}]}}'"
        );
        let discovered = a.discovery.service_discovery || a.discovery.pool_name.is_some();
        if !catching_up && app.worker_urls().is_empty() && !discovered {
            bail!("no workers");
        }
        app.run(shutdown_signal()).await
    })
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
