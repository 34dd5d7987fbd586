//! Wiring of the KV-event side: find every worker's publishers (explicit
//! flags first, then SGLang's `/server_info`), refuse workers whose page size
//! differs from the fleet's, register their streams with the pump, and start
//! one subscriber per (worker, dp rank) plus the pump.
//!
//! ```text
//! workers ──discover──► streams ──spawn_subscriber──► bounded mpsc ──► Pump ──► KvIndex
//! ```

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use gateway::HashModes;
use kv_events::{
    DiscoveryError, EventMetrics, ExplicitEndpoints, StreamEndpoints, SubscriberConfig, discover, explicit_streams,
    spawn_subscriber,
};
use kv_index::KvIndex;
use renderer::HashMode;
use router_types::WorkerUrl;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::pump::{Pump, PumpControl, PumpMetrics, StreamHashing};

/// Capacity of the channel from all subscribers to the pump (the reference router's).
pub const PUMP_CHANNEL_CAPACITY: usize = 1024;
/// Default page size for workers that advertise none (vLLM's default block size).
pub const DEFAULT_KV_EVENTS_BLOCK_SIZE: usize = 16;
/// How long discovery keeps retrying a worker's `/server_info`.
pub const DEFAULT_DISCOVERY_DEADLINE: Duration = Duration::from_secs(30);

/// What the KV-event side needs to start.
#[derive(Debug, Clone)]
pub struct KvEventsConfig {
    /// The workers to follow.
    pub workers: Vec<WorkerUrl>,
    /// Endpoints given on the command line (vLLM); they win over discovery.
    pub explicit: ExplicitEndpoints,
    /// Page size of workers that advertise none.
    pub default_block_size: NonZeroUsize,
    /// Topic to subscribe to on explicitly configured endpoints.
    pub topic: String,
    /// How long to keep retrying `/server_info`.
    pub discovery_deadline: Duration,
    /// Subscriber tuning.
    pub subscriber: SubscriberConfig,
    /// Bearer token for the workers' `/server_info` (engines started with `--api-key`).
    pub api_key: Option<String>,
}

/// Fleet-level counters.
#[derive(Debug, Default)]
pub struct FleetMetrics {
    /// Workers refused because their page size differs from the fleet's.
    pub refused_block_size: AtomicU64,
    /// Workers whose publishers could not be found.
    pub discovery_failures: AtomicU64,
    /// Streams subscribed.
    pub streams: AtomicU64,
}

/// One worker's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerStatus {
    /// Subscribed to these streams.
    Subscribed {
        /// The worker.
        worker: WorkerUrl,
        /// Its dp ranks.
        streams: usize,
        /// Its page size.
        block_size: usize,
    },
    /// Not followed, and why.
    Refused {
        /// The worker.
        worker: WorkerUrl,
        /// Why, in one line.
        reason: String,
    },
}

/// Adds workers to the running KV-event side (`POST /workers`).
#[derive(Debug)]
pub struct WorkerAdder {
    config: KvEventsConfig,
    block_size: usize,
    client: reqwest::Client,
    control: mpsc::Sender<PumpControl>,
    tx: mpsc::Sender<kv_events::StreamMessage>,
    events: Arc<EventMetrics>,
    fleet: Arc<FleetMetrics>,
    hash_modes: Arc<HashModes>,
    cancel: CancellationToken,
}

/// The running KV-event side. Stops when the cancellation token fires.
#[derive(Debug)]
pub struct KvEventsRuntime {
    /// The fleet's page size (what requests must be hashed with).
    pub block_size: usize,
    /// How the followed workers key blocks (shared with the gateway; workers added later add theirs).
    pub hash_modes: Arc<HashModes>,
    /// What happened to each worker.
    pub workers: Vec<WorkerStatus>,
    /// Subscriber counters.
    pub events: Arc<EventMetrics>,
    /// Pump counters.
    pub pump: Arc<PumpMetrics>,
    /// Fleet counters.
    pub fleet: Arc<FleetMetrics>,
    /// The subscriber and pump tasks.
    pub tasks: JoinSet<()>,
    /// Follows workers added later.
    pub adder: WorkerAdder,
}

struct Found {
    worker: WorkerUrl,
    streams: Vec<StreamEndpoints>,
    block_size: Option<usize>,
    bigram: bool,
    sglang: bool,
}

/// Finds every worker's publishers, then starts subscribers and the pump.
pub async fn start_kv_events(
    config: KvEventsConfig,
    index: Arc<KvIndex>,
    cancel: CancellationToken,
) -> KvEventsRuntime {
    let fleet = Arc::new(FleetMetrics::default());
    let client = gateway::worker_client(config.api_key.as_deref(), Some(Duration::from_secs(5)));
    let mut found = Vec::new();
    let mut statuses = Vec::new();
    for worker in &config.workers {
        match find(&client, worker, &config).await {
            Ok(f) => found.push(f),
            Err(e) => {
                error!(%worker, error = %e, kind = e.kind(), "kv events: worker not followed");
                fleet.discovery_failures.fetch_add(1, Ordering::Relaxed);
                statuses.push(WorkerStatus::Refused { worker: worker.clone(), reason: e.to_string() });
            }
        }
    }
    // The fleet's page size: the first advertised one, else the configured default.
    let block_size = found.iter().find_map(|f| f.block_size).unwrap_or(config.default_block_size.get());
    let events = Arc::new(EventMetrics::default());
    let pump_metrics = Arc::new(PumpMetrics::default());
    let config_for_adder = config.clone();
    let mut pump = Pump::new(index, pump_metrics.clone());
    let (tx, rx) = mpsc::channel(PUMP_CHANNEL_CAPACITY);
    let mut tasks = JoinSet::new();
    let hash_modes = Arc::new(HashModes::default());
    for f in found {
        let worker_block = f.block_size.unwrap_or(block_size);
        if worker_block != block_size {
            let reason = format!(
                "page size {worker_block} differs from the fleet's {block_size}: its block hashes could never match a request's"
            );
            error!(worker = %f.worker, worker_block, block_size, "kv events: worker refused: {reason}");
            fleet.refused_block_size.fetch_add(1, Ordering::Relaxed);
            statuses.push(WorkerStatus::Refused { worker: f.worker, reason });
            continue;
        }
        let hashing = StreamHashing {
            page_size: NonZeroUsize::new(block_size).unwrap_or(NonZeroUsize::MIN),
            mode: if f.bigram { HashMode::Bigram } else { HashMode::Unigram },
            engine_hash_is_router_hash: f.sglang,
        };
        let mut subscribed = 0;
        for stream in f.streams {
            if let Err(e) = pump.add_stream(stream.key.clone(), hashing) {
                warn!(stream = %stream.key, error = %e, "kv events: stream not registered");
                continue;
            }
            tasks.spawn(spawn_subscriber_task(stream, config.subscriber, tx.clone(), events.clone(), cancel.clone()));
            subscribed += 1;
        }
        fleet.streams.fetch_add(subscribed as u64, Ordering::Relaxed);
        info!(worker = %f.worker, streams = subscribed, block_size, bigram = f.bigram, "kv events: following worker");
        hash_modes.add(if f.bigram { HashMode::Bigram } else { HashMode::Unigram });
        statuses.push(WorkerStatus::Subscribed { worker: f.worker, streams: subscribed, block_size });
    }
    let (control, control_rx) = mpsc::channel(16);
    tasks.spawn(pump.run_with_control(rx, control_rx, cancel.clone()));
    let adder = WorkerAdder {
        config: config_for_adder,
        block_size,
        client,
        control,
        tx,
        events: events.clone(),
        fleet: fleet.clone(),
        hash_modes: hash_modes.clone(),
        cancel,
    };
    KvEventsRuntime { block_size, hash_modes, workers: statuses, events, pump: pump_metrics, fleet, tasks, adder }
}

// === impl WorkerAdder ===

impl WorkerAdder {
    /// Finds a new worker's publishers, checks its page size against the
    /// fleet's, registers its streams and starts their subscribers.
    pub async fn add_worker(&self, worker: &WorkerUrl) -> WorkerStatus {
        let refuse = |reason: String| WorkerStatus::Refused { worker: worker.clone(), reason };
        let found = match find(&self.client, worker, &self.config).await {
            Ok(f) => f,
            Err(e) => {
                self.fleet.discovery_failures.fetch_add(1, Ordering::Relaxed);
                return refuse(e.to_string());
            }
        };
        let worker_block = found.block_size.unwrap_or(self.block_size);
        if worker_block != self.block_size {
            self.fleet.refused_block_size.fetch_add(1, Ordering::Relaxed);
            return refuse(format!("page size {worker_block} differs from the fleet's {}", self.block_size));
        }
        let hashing = StreamHashing {
            page_size: NonZeroUsize::new(self.block_size).unwrap_or(NonZeroUsize::MIN),
            mode: if found.bigram { HashMode::Bigram } else { HashMode::Unigram },
            engine_hash_is_router_hash: found.sglang,
        };
        let mut subscribed = 0;
        for stream in found.streams {
            let (done, registered) = tokio::sync::oneshot::channel();
            if self.control.send(PumpControl::AddStream(stream.key.clone(), hashing, done)).await.is_err() {
                return refuse("the KV-event pump stopped".into());
            }
            match registered.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return refuse(e),
                Err(_) => return refuse("the KV-event pump stopped".into()),
            }
            // Detached: it stops with the cancellation token.
            drop(spawn_subscriber(
                stream,
                self.config.subscriber,
                self.tx.clone(),
                self.events.clone(),
                self.cancel.clone(),
            ));
            subscribed += 1;
        }
        self.fleet.streams.fetch_add(subscribed as u64, Ordering::Relaxed);
        self.hash_modes.add(hashing.mode);
        info!(%worker, streams = subscribed, "kv events: following added worker");
        WorkerStatus::Subscribed { worker: worker.clone(), streams: subscribed, block_size: self.block_size }
    }
}

async fn spawn_subscriber_task(
    stream: StreamEndpoints,
    config: SubscriberConfig,
    tx: mpsc::Sender<kv_events::StreamMessage>,
    metrics: Arc<EventMetrics>,
    cancel: CancellationToken,
) {
    let _ = spawn_subscriber(stream, config, tx, metrics, cancel).await;
}

async fn find(client: &reqwest::Client, worker: &WorkerUrl, config: &KvEventsConfig) -> Result<Found, DiscoveryError> {
    if let Some(streams) = explicit_streams(worker, &config.explicit, &config.topic)? {
        // Explicit endpoints: an engine that advertises nothing (vLLM). Page size from the flag.
        return Ok(Found { worker: worker.clone(), streams, block_size: None, bigram: false, sglang: false });
    }
    match discover(client, worker, Duration::from_millis(50), config.discovery_deadline).await? {
        Some(ev) => Ok(Found {
            worker: ev.worker,
            streams: ev.streams,
            block_size: Some(ev.block_size),
            bigram: ev.bigram,
            sglang: true,
        }),
        None => Err(DiscoveryError::NotPublishing(worker.clone())),
    }
}
