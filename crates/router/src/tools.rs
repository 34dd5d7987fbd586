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
    for v in &flags.endpoints {
        let (worker, ep) = kv_events::parse_worker_flag(v)?;
        out.endpoints.insert(worker, ep);
    }
    for v in &flags.replay_endpoints {
        let (worker, ep) = kv_events::parse_worker_flag(v)?;
        out.replay_endpoints.insert(worker, ep);
    }
    for v in &flags.dp_sizes {
        let (worker, n) = kv_events::parse_worker_flag(v)?;
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

/// `sgl-router kv-events`.
pub(crate) fn kv_events(args: &KvEventsArgs) -> Result<()> {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use kv_index::{IndexConfig, KvIndex, SystemClock};
    use router_types::WorkerUrl;
    use sgl_router::events::{KvEventsConfig, WorkerStatus, start_kv_events};

    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .try_init();
    let config = KvEventsConfig {
        workers: args.worker_urls.iter().map(|u| WorkerUrl::new(u.as_str())).collect(),
        explicit: explicit(&args.events)?,
        default_block_size: args.events.block_size,
        topic: args.events.topic.clone(),
        discovery_deadline: sgl_router::events::DEFAULT_DISCOVERY_DEADLINE,
        subscriber: kv_events::SubscriberConfig::default(),
        api_key: args.api_key.clone(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async {
        let index = Arc::new(KvIndex::new(IndexConfig::default(), Arc::new(SystemClock::new())));
        let cancel = tokio_util::sync::CancellationToken::new();
        let rt = start_kv_events(config, index.clone(), cancel.clone()).await;
        let workers: Vec<serde_json::Value> = rt
            .workers
            .iter()
            .map(|w| match w {
                WorkerStatus::Subscribed { worker, streams, block_size } => {
                    serde_json::json!({"worker": worker, "status": "subscribed", "streams": streams, "block_size": block_size})
                }
                WorkerStatus::Refused { worker, reason } => {
                    serde_json::json!({"worker": worker, "status": "refused", "reason": reason})
                }
            })
            .collect();
        print_json(&serde_json::json!({"block_size": rt.block_size, "workers": workers}))?;
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
            let connected = rt.events.connected().iter().filter(|(_, up)| *up).count();
            print_json(&serde_json::json!({
                "elapsed_s": start.elapsed().as_secs_f64(),
                "connected_streams": connected,
                "batches": get(&rt.events.batches),
                "resets": get(&rt.events.resets),
                "replays_repaired": get(&rt.events.replay_repaired),
                "decode_errors": get(&rt.events.decode_errors),
                "stores": get(&rt.pump.stored),
                "removals": get(&rt.pump.removed),
                "hash_mismatches": get(&rt.pump.hash_mismatches),
                "nodes": stats.nodes,
                "holdings": stats.holdings,
                "memory_bytes": stats.memory_bytes,
            }))?;
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
        }
        cancel.cancel();
        if args.metrics {
            let mut out = String::new();
            sgl_router::metrics::prometheus::render_kv_events(&mut out, &rt.events, &rt.pump, &rt.fleet, &index.stats());
            print!("{out}");
        }
        Ok(())
    })
}
