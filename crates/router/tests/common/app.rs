//! A router `App` on 127.0.0.1 in front of simulated engines, for the end-to-end tests.
#![allow(dead_code)] // not every test binary uses all of it

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use fleet::EventsConfig;
use mock_engine::{MockEngine, MockEngineConfig};
use router_types::WorkerUrl;
use serde_json::{Value, json};
use sgl_router::app::{App, AppConfig, PolicyConfig, PoolSetup, RoutingSetup};

/// The control-plane key of the test routers.
pub(crate) const ADMIN_KEY: &str = "test-admin-key";

/// A client that presents the control-plane key.
pub(crate) fn admin_client() -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {ADMIN_KEY}").parse().unwrap());
    reqwest::Client::builder().default_headers(headers).build().unwrap()
}

pub(crate) fn engine_config() -> MockEngineConfig {
    MockEngineConfig { fast: true, default_max_tokens: 4, ..MockEngineConfig::default() }
}

pub(crate) fn config(workers: &[&MockEngine], policy: PolicyConfig, kv: bool) -> AppConfig {
    AppConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        workers: workers.iter().map(|m| WorkerUrl::parse(&m.url()).unwrap()).collect(),
        mock_workers: 0,
        pd: None,
        policy,
        routing: None,
        embedding: None,
        igw: false,
        kv_events: kv.then(|| EventsConfig {
            explicit: Default::default(),
            default_block_size: std::num::NonZeroUsize::new(16).unwrap(),
            topic: String::new(),
            discovery_deadline: Duration::from_secs(5),
            rediscover_after: Duration::from_millis(300),
            subscriber: Default::default(),
        }),
        tokenizer_path: None,
        chat_template: None,
        backend: Default::default(),
        model_id: "default".into(),
        pending_ttl: Duration::ZERO,
        max_index_nodes: None,
        chain_memo_pages: renderer::DEFAULT_CHAIN_MEMO_PAGES,
        tokenizer_caches: renderer::CacheBounds::default(),
        feedback: Default::default(),
        max_body_bytes: 64 * 1024,
        request_timeout: Duration::from_secs(5),
        max_concurrent: 64,
        health: fleet::HealthConfig {
            interval: Duration::from_secs(3600),
            failure_threshold: 1,
            success_threshold: 1,
            ..Default::default()
        },
        breaker: fleet::BreakerConfig::default(),
        retry: gateway::RetryConfig { initial_backoff: Duration::from_millis(1), ..Default::default() },
        queue_size: 0,
        queue_timeout: Duration::from_secs(1),
        duration_buckets: gateway::metrics::LATENCY_BUCKETS.to_vec(),
        rate_limit: None,
        request_id_headers: gateway::pipeline::context::DEFAULT_REQUEST_ID_HEADERS
            .iter()
            .map(|h| h.to_string())
            .collect(),
        cors: Default::default(),
        metrics_listen: None,
        probe_listen: None,
        epp_listen: None,
        epp: Default::default(),
        dp_aware: false,
        rank_header: fleet::RankHeader::Auto,
        tls: None,
        worker_tls: fleet::WorkerTls::default(),
        load_poll: Duration::from_millis(50),
        liveness: fleet::liveness::LivenessConfig::default(),
        scheduler: None,
        tenants: Default::default(),
        tenant_limits: None,
        jwt: None,
        audit: false,
        upstream_pool_idle: gateway::DEFAULT_UPSTREAM_POOL_IDLE,
        upstream_http2: false,
        cache_trace: Default::default(),
        reasoning_parser: None,
        tool_call_parser: None,
        index_retention: Duration::from_secs(300),
        trace: None,
        routing_key_headers: Vec::new(),
        shared_state: None,
        shutdown_grace: Duration::from_secs(1),
        serve_threads: 2,
        fast_proxy: true,
        worker_api_key: None,
        limits: gateway::ClientLimits::default(),
        control_plane_keys: vec![ADMIN_KEY.into()],
        client_keys: Vec::new(),
        admin_listen: None,
        max_request_memory: 1 << 30,
        render_threads: 2,
        discovery: None,
        index_peers: None,
        index_snapshot: Default::default(),
    }
}

pub(crate) struct Running {
    pub(crate) url: String,
    pub(crate) gateway: std::sync::Arc<gateway::Gateway>,
    pub(crate) stop: tokio::sync::oneshot::Sender<()>,
    /// The dedicated probe listener's URL (`probe_listen`).
    pub(crate) probes: Option<String>,
    /// The endpoint picker's address (`epp_listen`).
    pub(crate) epp: Option<SocketAddr>,
}

pub(crate) async fn start(config: AppConfig) -> Running {
    let app = App::build(config).await.unwrap();
    let url = format!("http://{}", app.local_addr());
    let gateway = app.gateway().clone();
    let probes = app.probe_addr().map(|a| format!("http://{a}"));
    let epp = app.epp_addr();
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(app.run(async move {
        let _ = rx.await;
    }));
    // Discovery and the first probes run in the background after the port is bound: let the
    // reachable workers be found and probed (a dead one is not waited for past a few seconds).
    for _ in 0..200 {
        if gateway.fleet.all().iter().all(|w| matches!(w.state(), fleet::State::Healthy | fleet::State::Down)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Running { url, gateway, stop, probes, epp }
}

pub(crate) fn chat(system: &str, user: &str) -> Value {
    json!({"model": "default", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]})
}

pub(crate) async fn post(url: &str, body: &Value) -> reqwest::Response {
    post_within(url, body, Duration::from_secs(10)).await
}

/// [`post`] with its own deadline: a multi-megabyte prompt is tokenized by a debug build, which
/// takes seconds, more on a loaded machine.
pub(crate) async fn post_within(url: &str, body: &Value, deadline: Duration) -> reqwest::Response {
    reqwest::Client::new().post(url).json(body).timeout(deadline).send().await.unwrap()
}

/// `GET` with the control-plane key.
pub(crate) async fn admin_get(url: &str) -> reqwest::Response {
    admin_client().get(url).timeout(Duration::from_secs(10)).send().await.unwrap()
}

/// The value of one series (its name with labels, as printed) on the router at `url`'s `/metrics`.
pub(crate) async fn metric(url: &str, series: &str) -> f64 {
    let text = admin_get(&format!("{url}/metrics")).await.text().await.unwrap();
    let line = text.lines().find(|l| l.split(' ').next() == Some(series)).unwrap_or_else(|| panic!("{series}: {text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// `POST` of JSON with the control-plane key.
pub(crate) async fn admin_post(url: &str, body: &Value) -> reqwest::Response {
    admin_client().post(url).json(body).timeout(Duration::from_secs(10)).send().await.unwrap()
}

/// A path in the repository.
pub(crate) fn repo(path: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join(path)
}

/// The pools of `file` with one engine each (returned in pool order).
pub(crate) async fn pools(file: &str) -> (RoutingSetup, Vec<MockEngine>) {
    let text = std::fs::read_to_string(repo(file)).unwrap();
    let config = model_select::parse_yaml(&text).unwrap();
    let mut engines = Vec::new();
    let mut pools = Vec::new();
    for p in &config.pools {
        let engine_config = MockEngineConfig {
            model_id: p.served_model.clone(),
            strict_model: true,
            record_requests: true,
            ..engine_config()
        };
        let engine = MockEngine::spawn(engine_config).await.unwrap();
        let policy = match p.policy.as_deref() {
            Some("cache_aware") => PolicyConfig::cache_aware(),
            _ => PolicyConfig::RoundRobin,
        };
        pools.push(PoolSetup {
            name: p.name.clone(),
            served_model: p.served_model.clone(),
            workers: vec![router_types::WorkerUrl::parse(&engine.url()).unwrap()],
            policy,
            tokenizer_path: None,
            chat_template: None,
            context_window: p.context_window,
            pd: None,
        });
        engines.push(engine);
    }
    (RoutingSetup { config, pools, source: Some(sgl_router::config::RoutingOrigin::File(repo(file))) }, engines)
}
