//! The router as a library `App`: builds everything from a typed config in
//! order (the renderer, simulated engines if asked, the index, the policies,
//! the listeners, the fleet, the pools, the gateway: each part made by
//! `wiring`), binds the listener, serves until told to stop, then drains
//! in-flight requests within a grace period.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, bail};
use fleet::Fleet;
use gateway::Gateway;
use gateway::pd::PdConfig;
use kv_index::{IndexConfig, KvIndex, SystemClock};
use policy::Policy;
use renderer::Renderer;
use router_types::WorkerUrl;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use crate::config::{
    AppConfig, DiscoverySetup, EmbeddingSetup, PdSetup, PolicyConfig, PoolPd, PoolSetup, RoutingSetup, Unfollowed,
};

/// A built router, bound to its port.
#[derive(Debug)]
pub struct App {
    listener: TcpListener,
    admin: Option<TcpListener>,
    metrics: Option<TcpListener>,
    /// The dedicated probe listener (`--health-check-port`), served from a thread of its own.
    probes: Option<std::net::TcpListener>,
    /// The endpoint picker's listener (`--epp-port`) and settings, served from a thread of its own.
    epp: Option<(std::net::TcpListener, gateway::epp::EppConfig)>,
    gateway: Arc<Gateway>,
    cancel: CancellationToken,
    grace: Duration,
    serve_threads: usize,
    fast_proxy: bool,
    _mocks: Vec<crate::wiring::Mock>,
    /// Turns true once the catch-up from peers is over and the workers joined.
    caught_up: watch::Receiver<bool>,
    /// The workers.
    pub fleet: Arc<Fleet>,
}

// === impl App ===

impl App {
    /// Builds everything and binds the listener.
    pub async fn build(mut config: AppConfig) -> anyhow::Result<Self> {
        // gRPC workers with no model directory given: their own tokenizer (GetTokenizer).
        crate::remote_tokenizer::resolve(&mut config).await?;
        let renderer = match &config.tokenizer_path {
            Some(dir) => Renderer::from_dir_with(dir, config.chat_template.as_deref(), config.tokenizer_caches)
                .with_context(|| format!("loading the model at {}", dir.display()))?,
            None => crate::wiring::builtin_renderer(&config)?,
        };
        let renderer = Arc::new(renderer.with_backend(config.backend));
        let mocks = crate::wiring::spawn_mocks(&config).await?;
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
        let policy = crate::wiring::build_policy(config.pd.as_ref().map_or(&config.policy, |pd| &pd.prefill_policy));
        let pd = config.pd.as_ref().map(|pd| {
            PdConfig::new(pd.mode, crate::wiring::build_policy(&pd.decode_policy))
                .with_connector(pd.connector)
                .with_skip_prefill(pd.skip_prefill)
        });
        let gw_config = crate::wiring::gateway_config(&config);
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
        let epp = match config.epp_listen {
            Some(a) => {
                let l = std::net::TcpListener::bind(a)
                    .with_context(|| format!("binding the endpoint picker's port {a}"))?;
                l.set_nonblocking(true)?;
                Some(l)
            }
            None => None,
        };
        let probes = match config.probe_listen {
            Some(a) => {
                let l = std::net::TcpListener::bind(a).with_context(|| format!("binding the probe port {a}"))?;
                l.set_nonblocking(true)?;
                Some(l)
            }
            None => None,
        };
        let fleet_config = crate::wiring::fleet_config(&config);
        let fleet = Fleet::start(fleet_config, index.clone(), &[], cancel.clone());
        let embedder = match &config.embedding {
            Some(e) => {
                let encoder = embed::Encoder::load_with(&e.model, e.precision)?;
                tracing::info!(
                    model = %e.model.display(),
                    dim = encoder.dim(),
                    max_tokens = encoder.max_tokens(),
                    precision = encoder.precision().as_str(),
                    "embedding model loaded"
                );
                Some(embed::EmbedPool::new(Arc::new(encoder), e.pool)?)
            }
            None => None,
        };
        let built = match &routing {
            Some(r) => Some(crate::wiring::build_pools(r, &renderer, &config, embedder.as_ref())?),
            None => None,
        };
        // A peer's snapshot first, so that every stream it covers resumes from it: the workers
        // join once the catch-up is over, in the background (the listener is bound already).
        let peers = match (&config.index_peers, &config.kv_events) {
            (Some(peers), Some(_)) => Some(peers.clone()),
            // Peers found only through the shared state: nothing to say without an index.
            (Some(p), None) if p.urls.is_empty() && p.selector.is_none() => None,
            (Some(_), None) => {
                warn!("--index-peers without --kv-events: there is no index to catch up");
                None
            }
            _ => None,
        };
        let joining = crate::wiring::joining(&config, routing.as_ref(), &mocks);
        let caught_up = crate::peers::join_after_catch_up(peers, &fleet, joining, cancel.clone());
        // Announced for later replicas' catch-up once caught up itself (it has an index to give).
        if let (Some(s), Some(_)) = (&config.shared_state, &config.kv_events)
            && let Some(url) = s.advertise.clone()
        {
            let backend = shared_state::Backend::start(s.target.clone(), s.options.clone());
            let (prefix, mut done, stop) = (s.prefix.clone(), caught_up.clone(), cancel.clone());
            tokio::spawn(async move {
                if done.wait_for(|d| *d).await.is_ok() {
                    crate::members::announce(backend, prefix, url, stop).await;
                }
            });
        }
        // The policies forget a worker that left for good.
        let mut policies = vec![policy.clone()];
        policies.extend(pd.as_ref().map(|pd| pd.decode_policy.clone()));
        policies.extend(built.iter().flat_map(|(pools, _)| pools.iter().map(|p| p.policy.clone())));
        let decode_policies = built.iter().flat_map(|(pools, _)| pools.iter().filter_map(|p| p.pd.as_ref()));
        policies.extend(decode_policies.map(|pd| pd.decode_policy.clone()));
        let (notices, stop) = (fleet.subscribe(), cancel.clone());
        tokio::spawn(forget_departed(notices, policies, fleet.clone(), stop));
        let gateway = Gateway::new(gw_config, fleet.clone(), policy, index.clone(), renderer);
        let gateway = match pd {
            Some(pd) => gateway.with_pd(pd),
            None => gateway,
        };
        let gateway = match built {
            Some((pools, selector)) => {
                let source = config.routing.as_ref().and_then(|r| r.source.as_ref()).map(|s| match s {
                    crate::config::RoutingOrigin::File(path) => gateway::pools::RoutingSource::File(path.clone()),
                    crate::config::RoutingOrigin::Resource(f) => {
                        gateway::pools::RoutingSource::Resource(crate::routing_resource::shown(&f.what))
                    }
                });
                let learning = gateway::pools::feedback::Learning::new(config.feedback.clone())
                    .map_err(|e| anyhow::anyhow!("--route-feedback-state: {e}"))?;
                gateway
                    .with_routing(pools, selector, source, embedder, Arc::new(learning))
                    .map_err(|e| anyhow::anyhow!("the routing config: {e}"))?
            }
            None => gateway,
        };
        // The control plane's routes, served by the gateway behind its keys.
        control::install(&gateway);
        let gateway = Arc::new(gateway);
        // With an InferencePool, the picker gives requests its objectives' priorities.
        let mut epp_config = config.epp.clone();
        if let Some(d) = config.discovery.as_ref().filter(|_| epp.is_some())
            && let Some(pool) = &d.config.inference_pool
        {
            epp_config.objectives = Some(fleet::k8s::pool::objectives(&fleet, d.api.clone(), pool));
        }
        // A routing config read from a resource is followed: its changes are applied as they come.
        if let Some(crate::config::RoutingOrigin::Resource(followed)) =
            config.routing.as_ref().and_then(|r| r.source.clone())
        {
            crate::routing_resource::spawn(gateway.clone(), &fleet, followed);
        }
        Ok(Self {
            listener,
            admin,
            metrics,
            probes,
            epp: epp.map(|l| (l, epp_config)),
            gateway,
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

    /// The endpoint picker's address (`--epp-port`).
    pub fn epp_addr(&self) -> Option<SocketAddr> {
        self.epp.as_ref().and_then(|(l, _)| l.local_addr().ok())
    }

    /// The dedicated probe listener's address (`--health-check-port`).
    pub fn probe_addr(&self) -> Option<SocketAddr> {
        self.probes.as_ref().and_then(|l| l.local_addr().ok())
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
        // The runtimes /metrics reports on: this one (the background tasks, the admin and
        // metrics listeners, and the serving with --serve-threads 0), and each thread's below.
        let _watch = gateway.runtimes.watch("main");
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
        if let Some((epp, config)) = self.epp {
            serve_epp_apart(epp, gateway.clone(), config, drain.clone())?;
        }
        if let Some(probes) = self.probes {
            serve_probes_apart(probes, gateway.clone(), drain.clone())?;
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
                            let _watch = front.gw.runtimes.watch(&format!("serve-{i}"));
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

/// Serves the endpoint picker on `listener` from a thread and single-threaded runtime of its own
/// until `drain`: a stream's messages, its task and the HTTP/2 connection stay on one thread (a
/// round trip with the gateway crosses no thread).
fn serve_epp_apart(
    listener: std::net::TcpListener,
    gw: Arc<Gateway>,
    config: gateway::epp::EppConfig,
    drain: CancellationToken,
) -> anyhow::Result<()> {
    let runtimes = gw.runtimes.clone();
    serve_apart("endpoint picker", "epp", runtimes, listener, move |l| gateway::epp::serve_epp(l, gw, config, drain))
}

/// Serves the probes on `listener` from a thread and single-threaded runtime of their own until
/// `drain`, so an orchestrator's probes are answered whatever the serving threads are doing.
fn serve_probes_apart(
    listener: std::net::TcpListener,
    gw: Arc<Gateway>,
    drain: CancellationToken,
) -> anyhow::Result<()> {
    let runtimes = gw.runtimes.clone();
    serve_apart("probe listener", "probes", runtimes, listener, move |l| gateway::serve_probes(l, gw, drain))
}

/// Runs `serve` on `listener` in a thread (`what`) with a single-threaded runtime of its own,
/// watched in `runtimes` as `name`.
fn serve_apart<F, Fut>(
    what: &'static str,
    name: &'static str,
    runtimes: Arc<gateway::runtimes::Runtimes>,
    listener: std::net::TcpListener,
    serve: F,
) -> anyhow::Result<()>
where
    F: FnOnce(TcpListener) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = std::io::Result<()>>,
{
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    std::thread::Builder::new().name(format!("sgl-router {what}")).spawn(move || {
        runtime.block_on(async move {
            let _watch = runtimes.watch(name);
            let served = match TcpListener::from_std(listener) {
                Ok(l) => serve(l).await,
                Err(e) => Err(e),
            };
            if let Err(e) = served {
                warn!(error = %e, "{what} stopped");
            }
        });
    })?;
    Ok(())
}
