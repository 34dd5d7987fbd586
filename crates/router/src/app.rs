//! The router as a library `App`: builds everything from a typed config
//! (simulated workers if asked, the renderer, the index and KV-event side,
//! the policy, the gateway), binds the listener, serves until told to stop,
//! then drains in-flight requests within a grace period.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, bail};
use fleet::{Fleet, FleetConfig, Source};
use gateway::pd::{PdConfig, PdMode};
use gateway::{Gateway, GatewayConfig};
use kv_index::{IndexConfig, KvIndex, SystemClock};
use mock_engine::{MockEngine, MockEngineConfig};
use policy::{ApproxTreePolicy, CacheAware, LeastLoad, MinTtft, Policy, PowerOfTwo, Random, RoundRobin};
use renderer::Renderer;
use router_types::{PoolId, Role, WorkerUrl};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use crate::config::{AppConfig, DiscoverySetup, EmbeddingSetup, PdSetup, PolicyConfig, PoolSetup, RoutingSetup};
use crate::peers::Joining;

/// A simulated engine started in-process: its role, its pool (none: the default one), the engine.
type Mock = (mock_engine::PdRole, Option<String>, MockEngine);

/// A built router, bound to its port.
#[derive(Debug)]
pub struct App {
    listener: TcpListener,
    admin: Option<TcpListener>,
    metrics: Option<TcpListener>,
    gateway: Arc<Gateway>,
    cancel: CancellationToken,
    grace: Duration,
    serve_threads: usize,
    fast_proxy: bool,
    _mocks: Vec<Mock>,
    /// Turns true once the catch-up from peers is over and the workers joined.
    caught_up: watch::Receiver<bool>,
    /// The workers.
    pub fleet: Arc<Fleet>,
}

// === impl App ===

impl App {
    /// Builds everything and binds the listener.
    pub async fn build(config: AppConfig) -> anyhow::Result<Self> {
        let renderer = match &config.tokenizer_path {
            Some(dir) => Renderer::from_dir_with(dir, config.chat_template.as_deref(), config.tokenizer_caches)
                .with_context(|| format!("loading the model at {}", dir.display()))?,
            None => Renderer::builtin_with(config.tokenizer_caches)?,
        };
        let renderer = Arc::new(renderer);
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
            let roles = roles.clone();
            for role in roles {
                let engine_renderer = match pool {
                    Some(p) => pool_renderer(p, &config)?,
                    None => None,
                };
                let engine_renderer = match (engine_renderer, &config.tokenizer_path) {
                    (Some(r), _) => r,
                    (None, Some(dir)) => Renderer::from_dir(dir, config.chat_template.as_deref())?,
                    (None, None) => Renderer::builtin()?,
                };
                // The simulated engines take what the router admits (--max-body-bytes), and never
                // less than their default: the router may add a few fields (PD's bootstrap room).
                let mut mock_config = MockEngineConfig {
                    speedup: 10.0,
                    max_body_bytes: config.max_body_bytes.max(mock_engine::DEFAULT_MAX_BODY_BYTES),
                    ..MockEngineConfig::in_role(role, flavor)
                };
                mock_config.pd.mooncake = role == mock_engine::PdRole::Prefill
                    && config.pd.as_ref().is_some_and(|pd| pd.connector == gateway::pd::KvConnector::Mooncake);
                if let Some(p) = pool {
                    mock_config.model_id.clone_from(&p.served_model);
                    mock_config.strict_model = true;
                }
                let engine = MockEngine::spawn_with(mock_config, engine_renderer).await?;
                mocks.push((role, pool.map(|p| p.name.clone()), engine));
            }
        }
        let pd_workers = config.pd.as_ref().is_some_and(|pd| !pd.prefill.is_empty() || !pd.decode.is_empty());
        // --enable-igw: the pools come from the workers' own models.
        let routing = match (&config.routing, config.igw) {
            (Some(r), _) => Some(r.clone()),
            (None, true) => {
                let mut all = config.workers.clone();
                all.extend(mocks.iter().filter_map(|(_, _, m)| WorkerUrl::parse(&m.url()).ok()));
                let client = fleet::worker_client(
                    config.worker_api_key.as_deref(),
                    Some(Duration::from_secs(5)),
                    &config.worker_tls,
                );
                Some(crate::igw::discover(&all, &client, &config.policy, &config.model_id).await?)
            }
            (None, false) => None,
        };
        let pool_workers = routing.as_ref().is_some_and(|r| r.pools.iter().any(|p| !p.workers.is_empty()));
        if config.workers.is_empty() && mocks.is_empty() && !pd_workers && !pool_workers && config.discovery.is_none() {
            bail!("no workers: give --worker-urls, --mock-workers or --service-discovery");
        }
        let cancel = CancellationToken::new();
        let index = config.kv_events.as_ref().map(|_| {
            Arc::new(KvIndex::new(
                IndexConfig {
                    max_nodes: config.max_index_nodes,
                    pending_ttl: (!config.pending_ttl.is_zero()).then_some(config.pending_ttl),
                    ..IndexConfig::default()
                },
                Arc::new(SystemClock::new()),
            ))
        });
        // With disaggregation, the gateway's policy chooses the prefill worker.
        let policy = build_policy(config.pd.as_ref().map_or(&config.policy, |pd| &pd.prefill_policy), &cancel);
        let pd = config
            .pd
            .as_ref()
            .map(|pd| PdConfig::new(pd.mode, build_policy(&pd.decode_policy, &cancel)).with_connector(pd.connector));
        let gw_config = GatewayConfig {
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
        };
        // Bind first: discovery runs in the background, after the port is up.
        let listener = TcpListener::bind(config.listen).await.with_context(|| format!("binding {}", config.listen))?;
        let admin = match config.admin_listen {
            Some(a) => Some(TcpListener::bind(a).await.with_context(|| format!("binding the admin port {a}"))?),
            None => None,
        };
        let metrics = match config.metrics_listen {
            Some(a) => Some(TcpListener::bind(a).await.with_context(|| format!("binding the Prometheus port {a}"))?),
            None => None,
        };
        let fleet_config = FleetConfig {
            health: config.health.clone(),
            breaker: config.breaker,
            index_retention: config.index_retention,
            load_poll: config.load_poll,
            api_key: config.worker_api_key.clone(),
            events: config.kv_events.clone(),
            proxied_paths: gateway::PROXIED_PATHS,
            dp_aware: config.dp_aware,
            tls: config.worker_tls.clone(),
        };
        let fleet = Fleet::start(fleet_config, index.clone(), &[], cancel.clone());
        let embedder = match &config.embedding {
            Some(e) => {
                let encoder = embed::Encoder::load(&e.model)?;
                tracing::info!(model = %e.model.display(), dim = encoder.dim(), max_tokens = encoder.max_tokens(), "embedding model loaded");
                Some(embed::EmbedPool::new(Arc::new(encoder), e.pool)?)
            }
            None => None,
        };
        let built = match &routing {
            Some(r) => Some(build_pools(r, &renderer, &config, &cancel, embedder.as_ref())?),
            None => None,
        };
        // A peer's snapshot first, so that every stream it covers resumes from it: the workers
        // join once the catch-up is over, in the background (the listener is bound already).
        let peers = match (&config.index_peers, &config.kv_events) {
            (Some(peers), Some(_)) => Some(peers.clone()),
            (Some(_), None) => {
                warn!("--index-peers without --kv-events: there is no index to catch up");
                None
            }
            _ => None,
        };
        let joining = joining(&config, routing.as_ref(), &mocks);
        let caught_up = crate::peers::join_after_catch_up(peers, &fleet, joining, cancel.clone());
        // The policies forget a worker that left for good.
        let mut policies = vec![policy.clone()];
        policies.extend(pd.as_ref().map(|pd| pd.decode_policy.clone()));
        policies.extend(built.iter().flat_map(|(pools, _)| pools.iter().map(|p| p.policy.clone())));
        let (notices, stop) = (fleet.subscribe(), cancel.clone());
        tokio::spawn(forget_departed(notices, policies, fleet.clone(), stop));
        let gateway = Gateway::new(gw_config, fleet.clone(), policy, index.clone(), renderer);
        let gateway = match pd {
            Some(pd) => gateway.with_pd(pd),
            None => gateway,
        };
        let gateway = match built {
            Some((pools, routing)) => {
                let source = config.routing.as_ref().and_then(|r| r.source.clone());
                let learning = gateway::pools::feedback::Learning::new(config.feedback.clone())
                    .map_err(|e| anyhow::anyhow!("--route-feedback-state: {e}"))?;
                gateway.with_routing(pools, routing, source, embedder, Arc::new(learning))
            }
            None => gateway,
        };
        Ok(Self {
            listener,
            admin,
            metrics,
            gateway: Arc::new(gateway),
            cancel,
            grace: config.shutdown_grace,
            serve_threads: config.serve_threads,
            fast_proxy: config.fast_proxy,
            _mocks: mocks,
            caught_up,
            fleet,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// The Prometheus listener's address, when there is one (`--prometheus-port`).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The control plane's own address, when it has one (`--admin-port`).
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The gateway (tests inspect it).
    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.gateway
    }

    /// Resolves once the catch-up from `index_peers` is over (a snapshot
    /// applied, or none within the deadline) and the workers joined the fleet;
    /// at once without peers. The router serves (`/health`) meanwhile.
    pub fn caught_up(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut caught_up = self.caught_up.clone();
        async move {
            // Closed: the catch-up was stopped by a shutdown; nothing more will happen.
            let _ = caught_up.wait_for(|done| *done).await;
        }
    }

    /// True while the catch-up from `index_peers` runs (no worker has joined yet).
    pub fn catching_up(&self) -> bool {
        !*self.caught_up.borrow()
    }

    /// The workers routed to (the simulated ones included).
    pub fn worker_urls(&self) -> Vec<WorkerUrl> {
        self.fleet.all().iter().map(|w| w.url.clone()).collect()
    }

    /// Serves until `shutdown` resolves, then stops accepting, waits for
    /// in-flight requests up to the grace period, and stops every task.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
        let gateway = self.gateway.clone();
        let drain = CancellationToken::new();
        let drain_signal = drain.clone();
        let gw = gateway.clone();
        tokio::spawn(async move {
            shutdown.await;
            info!("shutting down: draining in-flight requests");
            gw.draining.store(true, Ordering::Relaxed);
            drain_signal.cancel();
        });
        let grace = self.grace;
        #[cfg(unix)]
        if gateway.routing.is_some() {
            let (gw, stop) = (gateway.clone(), self.cancel.clone());
            tokio::spawn(reload_on_hangup(gw, stop));
        }
        if let Some(admin) = self.admin {
            let (gw, drain) = (gateway.clone(), drain.clone());
            tokio::spawn(async move {
                if let Err(e) = gateway::serve_admin(admin, gw, drain).await {
                    warn!(error = %e, "admin listener stopped");
                }
            });
        }
        if let Some(metrics) = self.metrics {
            let (gw, drain) = (gateway.clone(), drain.clone());
            tokio::spawn(async move {
                if let Err(e) = gateway::serve_metrics(metrics, gw, drain).await {
                    warn!(error = %e, "Prometheus listener stopped");
                }
            });
        }
        if let Some(slot) = &gateway.routing
            && slot.learning().config().state_file.is_some()
        {
            tokio::spawn(save_feedback(slot.learning().clone(), self.cancel.clone()));
        }
        let front = Front { gw: gateway.clone(), fast: self.fast_proxy };
        let serve = serve_all(self.listener, front, self.serve_threads, drain.clone());
        let result = tokio::select! {
            r = serve => r,
            _ = async { drain.cancelled().await; tokio::time::sleep(grace).await } => {
                warn!(in_flight = gateway.in_flight(), "grace period over, closing remaining requests");
                Ok(())
            }
        };
        self.cancel.cancel();
        // The fleet's tasks (pump, probes, subscribers) see the cancellation at their next await.
        if tokio::time::timeout(Duration::from_secs(2), self.fleet.stopped()).await.is_err() {
            warn!("some background tasks were still stopping");
        }
        if let Some(slot) = &gateway.routing {
            save_now(slot.learning());
        }
        info!("router stopped");
        result
    }
}

/// Saves what feedback taught every `save_interval` while it changes, until `stop`.
async fn save_feedback(learning: Arc<gateway::pools::feedback::Learning>, stop: CancellationToken) {
    let every = learning.config().save_interval.max(Duration::from_secs(1));
    loop {
        tokio::select! { biased; () = stop.cancelled() => return, () = tokio::time::sleep(every) => {} }
        let l = learning.clone();
        let _ = tokio::task::spawn_blocking(move || save_now(&l)).await;
    }
}

/// Writes the feedback state file if it changed (a failure is logged; the next save tries again).
fn save_now(learning: &gateway::pools::feedback::Learning) {
    match learning.save() {
        Ok(true) => debug!(arms = learning.arms_held(), "feedback state saved"),
        Ok(false) => {}
        Err(e) => warn!(error = %e, file = ?learning.config().state_file, "feedback state not saved"),
    }
}

/// Who joins the fleet, in order: the flags' workers (the default pool's with
/// a routing config), the disaggregated ones, each pool's, the simulated
/// engines; then the Kubernetes discovery.
fn joining(config: &AppConfig, routing: Option<&RoutingSetup>, mocks: &[Mock]) -> Joining {
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
            workers.extend(p.workers.iter().map(|u| flag(u, Role::Regular, PoolId(p.name.clone()))));
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

/// Reloads the routing config on every SIGHUP until `stop` (a bad file keeps the config in force).
#[cfg(unix)]
async fn reload_on_hangup(gw: Arc<Gateway>, stop: CancellationToken) {
    let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
        warn!("SIGHUP cannot be handled: reload the routing config with POST /routing/reload");
        return;
    };
    loop {
        tokio::select! { biased; () = stop.cancelled() => return, _ = hup.recv() => {} }
        match gateway::pools::reload(&gw).await {
            Ok(r) => info!(decisions = r.decisions, signals = r.signals, "SIGHUP: routing config reloaded"),
            Err(problems) => {
                warn!(problems = %problems.join("; "), "SIGHUP: routing config not reloaded, the config in force is kept")
            }
        }
    }
}

/// What each serving thread runs: the gateway's HTTP/1.1 front end.
#[derive(Clone)]
struct Front {
    gw: Arc<Gateway>,
    fast: bool,
}

/// Serves on `listener` until `drain` is cancelled and the open
/// requests are done: on the caller's runtime (`threads` 0), or on `threads`
/// threads each running its own single-threaded runtime and accepting on the
/// same socket. A request then stays on one thread from accept to answer,
/// which on a small machine halves the latency the router adds (see
/// docs/benchmarks.md, "Router overhead").
async fn serve_all(
    listener: TcpListener,
    front: Front,
    threads: usize,
    drain: CancellationToken,
) -> anyhow::Result<()> {
    if threads == 0 {
        return serve_one(listener, front, drain).await;
    }
    let std_listener = listener.into_std().context("detaching the listener")?;
    let mut joins = Vec::with_capacity(threads);
    for i in 0..threads {
        let (socket, front, drain) =
            (std_listener.try_clone().context("sharing the listener")?, front.clone(), drain.clone());
        let (done, joined) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name(format!("sgl-serve-{i}"))
            .spawn(move || {
                let result = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(anyhow::Error::from)
                    .and_then(|rt| {
                        rt.block_on(async move {
                            let listener = TcpListener::from_std(socket)?;
                            serve_one(listener, front, drain).await
                        })
                    });
                let _ = done.send(result);
            })
            .context("starting a serving thread")?;
        joins.push(joined);
    }
    for joined in joins {
        joined.await.unwrap_or_else(|_| Err(anyhow::anyhow!("a serving thread panicked")))?;
    }
    Ok(())
}

/// One accept loop.
async fn serve_one(listener: TcpListener, front: Front, drain: CancellationToken) -> anyhow::Result<()> {
    gateway::serve(listener, front.gw, front.fast, drain).await.map_err(anyhow::Error::from)
}

/// The pools of a routing config (each with its policy, and its own renderer
/// when it names a model directory), and the selector over them.
fn build_pools(
    r: &RoutingSetup,
    renderer: &Arc<Renderer>,
    config: &AppConfig,
    cancel: &CancellationToken,
    embedder: Option<&embed::EmbedPool>,
) -> anyhow::Result<(Vec<gateway::pools::Pool>, gateway::pools::Routing)> {
    let mut pools = Vec::with_capacity(r.pools.len());
    for p in &r.pools {
        let renderer = match pool_renderer(p, config)? {
            Some(own) => Arc::new(own),
            None => renderer.clone(),
        };
        let policy = build_policy(&p.policy, cancel);
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
        pools.push(pool);
    }
    let examples = embedder.map(gateway::pools::Examples);
    let examples = examples.as_ref().map(|e| e as &dyn model_select::Embedder);
    let selector = model_select::Selector::with_embedder(r.config.clone(), examples).map_err(|problems| {
        let problems: Vec<String> = problems.iter().map(ToString::to_string).collect();
        anyhow::anyhow!("the routing config: {}", problems.join("; "))
    })?;
    Ok((pools, gateway::pools::Routing::new(selector)))
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
    Ok(Some(r))
}

/// The policy `config` names (a text tree is trimmed until `cancel`).
fn build_policy(config: &PolicyConfig, cancel: &CancellationToken) -> Arc<dyn Policy> {
    match config {
        PolicyConfig::RoundRobin => Arc::new(RoundRobin::default()),
        PolicyConfig::Random => Arc::new(Random::new(seed())),
        PolicyConfig::PowerOfTwo => Arc::new(PowerOfTwo::new(seed())),
        PolicyConfig::LeastLoad => Arc::new(LeastLoad::default()),
        PolicyConfig::Manual => Arc::new(policy::Manual::new(seed())),
        PolicyConfig::CacheAware(c, tree, interval) => {
            let p = Arc::new(CacheAware::new(*c, seed()).with_text_tree(*tree));
            let trim = p.clone();
            spawn_trim(move || trim.trim(), *interval, cancel.clone());
            p
        }
        PolicyConfig::MinTtft(c) => Arc::new(MinTtft::new(*c)),
        PolicyConfig::ApproxTree(c, interval) => {
            let p = Arc::new(ApproxTreePolicy::new(*c));
            let trim = p.clone();
            spawn_trim(move || trim.trim(), *interval, cancel.clone());
            p
        }
    }
}

/// Trims a policy's text tree every `every` until `stop`.
fn spawn_trim(trim: impl Fn() -> usize + Send + 'static, every: Duration, stop: CancellationToken) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tokio::select! { biased; _ = stop.cancelled() => break, _ = tick.tick() => { trim(); } }
        }
    });
}

/// Tells the policy of every worker that left the fleet; a subscriber that
/// fell behind the notices resyncs from the fleet's snapshot.
async fn forget_departed(
    mut notices: tokio::sync::broadcast::Receiver<fleet::Notice>,
    policies: Vec<Arc<dyn Policy>>,
    fleet: Arc<Fleet>,
    cancel: CancellationToken,
) {
    use tokio::sync::broadcast::error::RecvError;
    let mut known: std::collections::HashSet<router_types::WorkerId> = fleet.snapshot().iter().map(|w| w.id).collect();
    loop {
        let notice = tokio::select! { biased; () = cancel.cancelled() => return, n = notices.recv() => n };
        match notice {
            Ok(fleet::Notice::Added(id)) => {
                known.insert(id);
            }
            Ok(fleet::Notice::Removed(id)) => {
                known.remove(&id);
                policies.iter().for_each(|p| p.remove_worker(id));
            }
            Err(RecvError::Lagged(_)) => {
                let live: std::collections::HashSet<_> = fleet.snapshot().iter().map(|w| w.id).collect();
                for gone in known.difference(&live) {
                    policies.iter().for_each(|p| p.remove_worker(*gone));
                }
                known = live;
            }
            Err(RecvError::Closed) => return,
        }
    }
}

fn seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(7, |d| d.as_nanos() as u64)
}
