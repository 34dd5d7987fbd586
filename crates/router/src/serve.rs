//! `sgl-router` without a subcommand: validate the flags into an
//! `AppConfig`, build the `App`, print where it listens, serve until SIGTERM
//! or Ctrl-C, drain.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Result, bail};
use fleet::{DEFAULT_DISCOVERY_DEADLINE, EventsConfig};
use policy::{ApproxTreeConfig, CacheAwareConfig, MinTtftConfig};
use router_types::WorkerUrl;
use sgl_router::app::{App, AppConfig, PolicyConfig};

use crate::cli::{LogFormat, PolicyName, ServeArgs};

/// A command-line mistake: reported with exit status 64.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct UsageError(pub(crate) String);

/// Turns flags into a config; tuning a policy that is not selected is an error.
pub(crate) fn config(a: &ServeArgs) -> Result<AppConfig, UsageError> {
    let usage = |m: String| Err(UsageError(m));
    // Each tuning flag belongs to one policy; setting it under another is a mistake.
    use PolicyName::{ApproxTree, CacheAware, MinTtft};
    let policy_flags = [
        ("--cache-affinity-min-matched-tokens", a.cache_affinity_min_matched_tokens.is_some(), CacheAware),
        ("--cache-candidates-min", a.cache_candidates_min.is_some(), CacheAware),
        ("--cache-candidates-ratio", a.cache_candidates_ratio.is_some(), CacheAware),
        ("--cache-candidates-max", a.cache_candidates_max.is_some(), CacheAware),
        ("--cache-switch-margin-tokens", a.cache_switch_margin_tokens.is_some(), CacheAware),
        ("--cache-pressure-abs-tokens", a.cache_pressure_abs_tokens.is_some(), CacheAware),
        ("--cache-pressure-rel", a.cache_pressure_rel.is_some(), CacheAware),
        ("--no-cache-pressure-guard", a.no_cache_pressure_guard, CacheAware),
        ("--approx-cache-threshold", a.approx_cache_threshold.is_some(), ApproxTree),
        ("--approx-balance-abs", a.approx_balance_abs.is_some(), ApproxTree),
        ("--approx-balance-rel", a.approx_balance_rel.is_some(), ApproxTree),
        ("--approx-eviction-interval-secs", a.approx_eviction_interval_secs.is_some(), ApproxTree),
        ("--approx-max-tree-bytes", a.approx_max_tree_bytes.is_some(), ApproxTree),
        ("--ttft-hit-weight", a.ttft_hit_weight.is_some(), MinTtft),
    ];
    if let Some((flag, _, owner)) = policy_flags.iter().find(|(_, set, owner)| *set && *owner != a.policy) {
        return usage(format!(
            "{flag} tunes the {} policy, but --policy is {}",
            policy_name(*owner),
            policy_name(a.policy)
        ));
    }
    let index_flags = [
        ("--cache-pending-prefix-ttl-ms", a.cache_pending_prefix_ttl_ms.is_some()),
        ("--max-index-blocks", a.max_index_blocks.is_some()),
    ];
    if !a.kv_events
        && let Some((flag, _)) = index_flags.iter().find(|(_, set)| *set)
    {
        return usage(format!("{flag} tunes the KV index, which only --kv-events builds"));
    }
    if a.policy == PolicyName::CacheAware && !a.kv_events {
        return usage("--policy cache_aware routes by the engines' KV events: add --kv-events".into());
    }
    if a.worker_urls.is_empty() && a.mock_workers == 0 {
        return usage("no workers: give --worker-urls URL,... or --mock-workers N".into());
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
    if a.control_plane_api_keys.iter().chain(&a.client_api_keys).any(|k| k.trim().is_empty()) {
        return usage("--control-plane-api-keys / --client-api-keys: a key cannot be empty".into());
    }
    let d = CacheAwareConfig::default();
    let policy = match a.policy {
        PolicyName::RoundRobin => PolicyConfig::RoundRobin,
        PolicyName::Random => PolicyConfig::Random,
        PolicyName::PowerOfTwo => PolicyConfig::PowerOfTwo,
        PolicyName::LeastLoad => PolicyConfig::LeastLoad,
        PolicyName::CacheAware => PolicyConfig::CacheAware(CacheAwareConfig {
            min_matched_tokens: a.cache_affinity_min_matched_tokens.unwrap_or(d.min_matched_tokens),
            candidates_min: a.cache_candidates_min.unwrap_or(d.candidates_min),
            candidates_ratio: a.cache_candidates_ratio.unwrap_or(d.candidates_ratio),
            candidates_max: a.cache_candidates_max.unwrap_or(d.candidates_max),
            switch_margin_tokens: a.cache_switch_margin_tokens.unwrap_or(d.switch_margin_tokens),
            pressure_guard: !a.no_cache_pressure_guard,
            pressure_abs_tokens: a.cache_pressure_abs_tokens.unwrap_or(d.pressure_abs_tokens),
            pressure_rel: a.cache_pressure_rel.unwrap_or(d.pressure_rel),
        }),
        PolicyName::MinTtft => PolicyConfig::MinTtft(MinTtftConfig {
            hit_weight: a.ttft_hit_weight.unwrap_or(MinTtftConfig::default().hit_weight).max(0.0),
        }),
        PolicyName::ApproxTree => {
            let t = ApproxTreeConfig::default();
            PolicyConfig::ApproxTree(
                ApproxTreeConfig {
                    cache_threshold: a.approx_cache_threshold.unwrap_or(t.cache_threshold),
                    balance_abs: a.approx_balance_abs.unwrap_or(t.balance_abs),
                    balance_rel: a.approx_balance_rel.unwrap_or(t.balance_rel),
                    max_tree_bytes: a.approx_max_tree_bytes.unwrap_or(t.max_tree_bytes),
                },
                Duration::from_secs(
                    a.approx_eviction_interval_secs.unwrap_or(crate::defaults::APPROX_EVICTION_INTERVAL_SECS).max(1),
                ),
            )
        }
    };
    let kv_events = if a.kv_events {
        let explicit = crate::tools::explicit(&a.events).map_err(|e| UsageError(e.to_string()))?;
        Some(EventsConfig {
            explicit,
            default_block_size: a.events.block_size,
            topic: a.events.topic.clone(),
            discovery_deadline: DEFAULT_DISCOVERY_DEADLINE,
            subscriber: kv_events::SubscriberConfig::default(),
        })
    } else {
        if !a.events.endpoints.is_empty() || !a.events.replay_endpoints.is_empty() || !a.events.dp_sizes.is_empty() {
            return usage("--kv-events-* endpoints given without --kv-events".into());
        }
        None
    };
    Ok(AppConfig {
        listen,
        workers,
        mock_workers: a.mock_workers,
        policy,
        kv_events,
        tokenizer_path: a.tokenizer_path.clone(),
        chat_template: a.chat_template.clone(),
        model_id: a.model_id.clone(),
        pending_ttl: Duration::from_millis(a.cache_pending_prefix_ttl_ms.unwrap_or(0)),
        max_index_nodes: a.max_index_blocks,
        max_body_bytes: a.max_body_bytes,
        request_timeout: Duration::from_secs(a.request_timeout_secs.max(1)),
        max_concurrent: a.max_concurrent_requests.max(1),
        health_interval: Duration::from_secs(a.health_check_interval_secs.max(1)),
        load_poll: Duration::from_millis(a.worker_load_poll_ms),
        index_retention: Duration::from_secs(a.worker_index_retention_secs),
        shutdown_grace: Duration::from_secs(a.shutdown_grace_secs),
        fast_proxy: !a.no_fast_proxy,
        worker_api_key: a.api_key.clone(),
        limits: gateway::ClientLimits {
            header_read_timeout: Duration::from_secs(a.client_header_timeout_secs.max(1)),
            body_read_timeout: Duration::from_secs(a.client_body_timeout_secs.max(1)),
            idle_timeout: Duration::from_secs(a.client_idle_timeout_secs.max(1)),
            max_connections: a.max_connections.max(1),
            upstream_idle_timeout: Duration::from_secs(a.upstream_idle_timeout_secs.max(1)),
        },
        control_plane_keys: a.control_plane_api_keys.clone(),
        client_keys: a.client_api_keys.clone(),
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

fn policy_name(p: PolicyName) -> String {
    clap::ValueEnum::to_possible_value(&p).map_or_else(String::new, |v| v.get_name().to_string())
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    // Colour only on a terminal: log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(filter).with_ansi(ansi);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Runs the router until SIGTERM or Ctrl-C.
pub(crate) fn serve(config: AppConfig, log_format: LogFormat) -> Result<()> {
    init_tracing(log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let control_plane_open = !config.control_plane_keys.is_empty();
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
        for w in app.worker_urls() {
            println!("  worker {w}");
        }
        println!(
            "try: curl -s http://{addr}/v1/chat/completions -H 'content-type: application/json' \\\n       -d '{{\"model\": \"default\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}]}}'"
        );
        if app.worker_urls().is_empty() {
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
