//! The `hash` and `render` tools: read JSON, call the renderer, print JSON.

use std::io::{Read, Write};
use std::path::Path;

use anyhow::{Context, Result, bail};
use renderer::{ChatRequest, HashMode, PageDigest, PageHasher, Renderer, hash::chain_prior};
use router_types::BlockHash;
use serde::Serialize;
use serde_json::Value;

use crate::cli::{HashArgs, HashOptions, KvEventFlags, KvEventsArgs, RenderArgs};

#[derive(Serialize)]
struct RenderOutput<'a> {
    text: &'a str,
    token_ids: &'a [u32],
    #[serde(skip_serializing_if = "Option::is_none")]
    block_hashes: Option<Vec<i64>>,
}

/// `sgl-router hash`.
pub(crate) fn hash(args: &HashArgs) -> Result<()> {
    let input = read_input(args.tokens_file.as_deref(), "token ids")?;
    let json: Value = serde_json::from_slice(&input).context("token ids are not valid JSON")?;
    let Value::Array(items) = json else { bail!("expected a JSON array of token ids") };
    let tokens = items
        .iter()
        .enumerate()
        .map(|(i, v)| match v.as_u64() {
            Some(t) if t <= i64::MAX as u64 => Ok(t),
            _ => bail!("token at position {i} is not an integer in 0..=9223372036854775807: {v}"),
        })
        .collect::<Result<Vec<u64>>>()?;
    let hashes = block_hashes(&tokens, args.page_size, &args.hash)?;
    print_json(&hashes.iter().map(|h| h.0).collect::<Vec<_>>())
}

/// `sgl-router render`.
pub(crate) fn render(args: &RenderArgs) -> Result<()> {
    let renderer = Renderer::from_dir(&args.tokenizer, args.chat_template.as_deref())?;
    let body = read_input(args.request.as_deref(), "request")?;
    let request = ChatRequest::from_json(&body)?;
    let rendered = renderer.render_chat(&request)?;
    let block_hashes = match args.page_size {
        Some(size) => Some(block_hashes(&rendered.token_ids, size, &args.hash)?.into_iter().map(|h| h.0).collect()),
        None => None,
    };
    print_json(&RenderOutput { text: &rendered.text, token_ids: &rendered.token_ids, block_hashes })
}

fn block_hashes<T: renderer::hash::TokenId>(
    tokens: &[T],
    page_size: std::num::NonZeroUsize,
    opts: &HashOptions,
) -> Result<Vec<BlockHash>> {
    let mode = if opts.bigram { HashMode::Bigram } else { HashMode::Unigram };
    let prior: Option<PageDigest> = chain_prior(opts.cache_salt.as_deref());
    Ok(PageHasher::new(page_size, mode).block_hashes(tokens, prior.as_ref())?)
}

fn read_input(path: Option<&Path>, what: &str) -> Result<Vec<u8>> {
    match path {
        Some(p) => std::fs::read(p).with_context(|| format!("cannot read {what} from {}", p.display())),
        None => {
            let mut buf = Vec::new();
            std::io::stdin().read_to_end(&mut buf).with_context(|| format!("cannot read {what} from stdin"))?;
            Ok(buf)
        }
    }
}

fn print_json<T: Serialize>(value: &T) -> Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}

/// The explicit endpoint flags, parsed.
pub(crate) fn explicit(flags: &KvEventFlags) -> Result<kv_events::ExplicitEndpoints> {
    let mut out = kv_events::ExplicitEndpoints::default();
    // The worker as the fleet spells it (normalized), so the flag finds its worker.
    let flag = |v: &str| -> Result<(router_types::WorkerUrl, String)> {
        let (worker, value) = kv_events::parse_worker_flag(v)?;
        let worker = router_types::WorkerUrl::parse(worker.as_str()).map_err(|e| anyhow::anyhow!("{v}: {e}"))?;
        Ok((worker, value))
    };
    for v in &flags.endpoints {
        let (worker, ep) = flag(v)?;
        out.endpoints.insert(worker, ep);
    }
    for v in &flags.replay_endpoints {
        let (worker, ep) = flag(v)?;
        out.replay_endpoints.insert(worker, ep);
    }
    for v in &flags.dp_sizes {
        let (worker, n) = flag(v)?;
        let n: usize = n.parse().with_context(|| format!("--kv-events-dp-size {v}: not a number"))?;
        if n == 0 {
            bail!("--kv-events-dp-size {v}: must be at least 1");
        }
        out.dp_sizes.insert(worker, n);
    }
    for worker in out.replay_endpoints.keys().chain(out.dp_sizes.keys()) {
        if !out.endpoints.contains_key(worker) {
            bail!("{worker} has a replay endpoint or dp size but no --kv-events-endpoint");
        }
    }
    Ok(out)
}

/// `sgl-router kv-events`: the fleet's own following of events, without a gateway.
pub(crate) fn kv_events(args: &KvEventsArgs) -> Result<()> {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use fleet::{Events, EventsConfig, Fleet, FleetConfig};
    use kv_index::{IndexConfig, KvIndex, SystemClock};
    use router_types::WorkerUrl;

    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .try_init();
    let mut workers = Vec::new();
    for u in &args.worker_urls {
        workers.push(WorkerUrl::parse(u.trim()).map_err(|e| anyhow::anyhow!("--worker-urls: {e}"))?);
    }
    let config = FleetConfig {
        health: fleet::HealthConfig {
            interval: Duration::from_secs(crate::defaults::HEALTH_CHECK_INTERVAL_SECS),
            ..Default::default()
        },
        breaker: fleet::BreakerConfig::default(),
        index_retention: Duration::from_secs(crate::defaults::WORKER_INDEX_RETENTION_SECS),
        load_poll: Duration::ZERO,
        api_key: args.api_key.clone(),
        events: Some(EventsConfig {
            explicit: explicit(&args.events)?,
            default_block_size: args.events.block_size,
            topic: args.events.topic.clone(),
            discovery_deadline: fleet::DEFAULT_DISCOVERY_DEADLINE,
            rediscover_after: std::time::Duration::from_secs(args.events.rediscover_secs.max(1)),
            subscriber: kv_events::SubscriberConfig::default(),
        }),
        proxied_paths: &[],
        dp_aware: false,
        rank_header: fleet::RankHeader::Auto,
        tls: fleet::WorkerTls::default(),
        liveness: fleet::liveness::LivenessConfig::off(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async {
        let index = Arc::new(KvIndex::new(IndexConfig::default(), Arc::new(SystemClock::new())));
        let cancel = tokio_util::sync::CancellationToken::new();
        let fleet = Fleet::start(config, Some(index.clone()), &workers, cancel.clone());
        // Discovery runs in the background: report each worker once it is found (or not).
        let mut statuses = Vec::new();
        for w in fleet.snapshot().iter() {
            let status = match fleet.wait_discovered(w, fleet::DEFAULT_DISCOVERY_DEADLINE).await {
                Events::Followed { streams } => {
                    serde_json::json!({"worker": w.url, "status": "subscribed", "streams": streams, "block_size": fleet.block_size()})
                }
                Events::NotFollowed(reason) | Events::Refused(reason) => {
                    serde_json::json!({"worker": w.url, "status": "refused", "reason": reason})
                }
                Events::Discovering | Events::Off => {
                    serde_json::json!({"worker": w.url, "status": "discovering"})
                }
            };
            statuses.push(status);
        }
        print_json(&serde_json::json!({"block_size": fleet.block_size(), "workers": statuses}))?;
        let (Some(events), Some(pump)) = (fleet.event_metrics().cloned(), fleet.pump_metrics().cloned()) else {
            bail!("the fleet follows no events");
        };
        let start = Instant::now();
        let deadline = args.duration_secs.map(|s| start + Duration::from_secs(s));
        let mut tick = tokio::time::interval(Duration::from_millis(args.interval_ms.max(10)));
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = tokio::signal::ctrl_c() => break,
            }
            let get = kv_events::EventMetrics::get;
            let stats = index.stats();
            let connected = events.connected().iter().filter(|(_, up)| *up).count();
            print_json(&serde_json::json!({
                "elapsed_s": start.elapsed().as_secs_f64(),
                "connected_streams": connected,
                "batches": get(&events.batches),
                "resets": get(&events.resets),
                "replays_repaired": get(&events.replay_repaired),
                "decode_errors": get(&events.decode_errors),
                "stores": get(&pump.stored),
                "removals": get(&pump.removed),
                "hash_mismatches": get(&pump.hash_mismatches),
                "vllm_hashes_checked": get(&pump.hashes_checked),
                "nodes": stats.nodes,
                "holdings": stats.holdings,
                "memory_bytes": stats.memory_bytes,
            }))?;
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
        }
        if args.metrics {
            let mut out = String::new();
            fleet.render_metrics(&mut out);
            print!("{out}");
        }
        cancel.cancel();
        Ok(())
    })
}
