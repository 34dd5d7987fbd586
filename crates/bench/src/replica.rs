//! `sgl-router-bench replica`: does a router replica that starts late route
//! as well as the one that has run all along? Simulated engines (in this
//! process, real ZMQ publishers with a small replay buffer) serve the first
//! part of a trace through router A; once their replay buffers have rolled
//! over, two more routers start: B cold (it learns only what the publishers
//! still hold) and B from A's index snapshot (`--index-peers A`). Over the
//! next part of the trace each request is explained by all three routers
//! (`POST /debug/route`: the worker each would choose, nothing committed) and
//! then sent through one of them in turn, as a Service spreads requests over
//! its replicas. A router's hit rate is the prompt tokens the worker it chose
//! really holds (read from the engine's cache at that moment, touching
//! nothing), over all prompt tokens: the three are measured on the same
//! requests against the same caches.
//!
//! The routers are `sgl-router` processes (`--router-bin`); the requests go
//! one at a time, with a short pause for the events to arrive, so arrival
//! times in the trace are not used.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use mock_engine::{MockEngine, MockEngineConfig};
use serde::Serialize;
use serde_json::{Value, json};

use crate::live::prompt_bytes;
use crate::router_proc::RouterProc;
use crate::trace::{self, TraceRequest};

/// Control-plane key of the routers started here.
const KEY: &str = "replica-bench-key";

/// The command's arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct ReplicaArgs {
    /// Mooncake-format JSONL trace.
    #[arg(long)]
    trace: PathBuf,
    /// Requests served through A alone before the late routers start.
    #[arg(long, default_value_t = 1500)]
    warmup: usize,
    /// Requests measured after they start.
    #[arg(long, default_value_t = 1000)]
    measure: usize,
    /// Simulated engines.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// KV capacity per engine, tokens.
    #[arg(long, default_value_t = 1_000_000)]
    capacity_tokens: usize,
    /// Batches each engine's publisher keeps for replay (SGLang's buffer_steps; small, so that
    /// the warmup rolls it over).
    #[arg(long, default_value_t = 64)]
    replay_buffer_steps: usize,
    /// The router binary.
    #[arg(long, default_value = "target/release/sgl-router")]
    router_bin: PathBuf,
    /// Routing policy of every router.
    #[arg(long, default_value = "cache_aware")]
    policy: String,
    /// Pause after each answer, milliseconds, for its KV events to reach the routers.
    #[arg(long, default_value_t = 5)]
    pace_ms: u64,
    /// Exit non-zero unless B from a snapshot is within this fraction of A's hit rate.
    #[arg(long)]
    check: Option<f64>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// One router's result over the measured requests.
#[derive(Debug, Clone, Default, Serialize)]
struct Row {
    router: String,
    /// Prompt tokens the chosen workers really held, over all prompt tokens.
    hit_rate: f64,
    /// Prompt tokens the router believed its chosen workers held (its index).
    believed_rate: f64,
    /// Requests for which it chose A's worker.
    same_choice_as_a: f64,
    /// Stream history it never saw (batches, from `/workers`).
    missed_batches: u64,
    /// Streams it resumed from a snapshot.
    resumed_streams: u64,
    /// Prompt tokens its own answers reported cached (the requests it served).
    served_hit_rate: f64,
    served: usize,
}

/// Runs the benchmark and prints its table.
pub(crate) fn run(args: &ReplicaArgs) -> Result<()> {
    let trace = trace::load(&args.trace)?;
    if trace.len() < args.warmup + args.measure {
        bail!("the trace has {} requests, fewer than --warmup + --measure", trace.len());
    }
    if !args.router_bin.exists() {
        bail!("--router-bin {}: not found (cargo build --release -p sgl-router)", args.router_bin.display());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(bench(args, &trace))
}

async fn bench(args: &ReplicaArgs, trace: &[TraceRequest]) -> Result<()> {
    let mut engines = Vec::with_capacity(args.workers);
    for _ in 0..args.workers.max(1) {
        let config = MockEngineConfig {
            fast: true,
            capacity_tokens: args.capacity_tokens,
            replay_buffer_steps: args.replay_buffer_steps.max(1),
            ..MockEngineConfig::default()
        };
        engines.push(MockEngine::spawn(config).await?);
    }
    let urls: Vec<String> = engines.iter().map(MockEngine::url).collect();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?;
    let pace = Duration::from_millis(args.pace_ms);

    let a = spawn_router(args, "A", &urls, None)?;
    wait_following(&http, &a, urls.len()).await?;
    for r in &trace[..args.warmup] {
        send(&http, &a.url, r).await.with_context(|| format!("warmup through {}", a.name))?;
        tokio::time::sleep(pace).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let batches_published: u64 =
        engines.iter().map(|e| e.engine().requests.load(std::sync::atomic::Ordering::Relaxed)).sum();

    let cold = spawn_router(args, "B cold", &urls, None)?;
    let snap = spawn_router(args, "B snapshot", &urls, Some(&a.url))?;
    wait_following(&http, &cold, urls.len()).await?;
    wait_following(&http, &snap, urls.len()).await?;
    let routers = [&a, &cold, &snap];

    let by_url: BTreeMap<&str, &MockEngine> = urls.iter().map(String::as_str).zip(engines.iter()).collect();
    let mut acc = [Acc::default(), Acc::default(), Acc::default()];
    let mut prompt_tokens = 0u64;
    for (i, r) in trace[args.warmup..args.warmup + args.measure].iter().enumerate() {
        let tokens: Vec<u32> = prompt_bytes(r).into_iter().map(u32::from).collect();
        prompt_tokens += tokens.len() as u64;
        let mut chosen = Vec::with_capacity(3);
        for (k, router) in routers.iter().enumerate() {
            let (worker, rank, believed) = explain(&http, &router.url, r).await?;
            let engine =
                by_url.get(worker.as_str()).with_context(|| format!("{} chose unknown {worker}", router.name))?;
            let held = engine.engine().cached_prefix_tokens(&tokens);
            let truth =
                rank.map_or_else(|| held.iter().copied().max().unwrap_or(0), |k| held.get(k).copied().unwrap_or(0));
            acc[k].held += truth as u64;
            acc[k].believed += believed;
            chosen.push(worker);
        }
        for k in 0..3 {
            acc[k].same += u64::from(chosen[k] == chosen[0]);
        }
        let k = i % 3;
        let (prompt, cached) = send(&http, &routers[k].url, r).await?;
        acc[k].served_prompt += prompt;
        acc[k].served_cached += cached;
        acc[k].served += 1;
        tokio::time::sleep(pace).await;
    }

    let n = args.measure.max(1) as f64;
    let mut rows = Vec::with_capacity(3);
    for (k, router) in routers.iter().enumerate() {
        let (missed, resumed) = history(&http, &router.url).await?;
        rows.push(Row {
            router: router.name.to_string(),
            hit_rate: acc[k].held as f64 / prompt_tokens.max(1) as f64,
            believed_rate: acc[k].believed as f64 / prompt_tokens.max(1) as f64,
            same_choice_as_a: acc[k].same as f64 / n,
            missed_batches: missed,
            resumed_streams: resumed,
            served_hit_rate: acc[k].served_cached as f64 / acc[k].served_prompt.max(1) as f64,
            served: acc[k].served,
        });
    }
    let ratio = rows[2].hit_rate / rows[0].hit_rate.max(f64::MIN_POSITIVE);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json!({"rows": rows, "snapshot_over_a": ratio}))?);
    } else {
        print_table(args, trace, batches_published, &rows, ratio);
    }
    if let Some(tol) = args.check
        && (ratio - 1.0).abs() > tol
    {
        bail!("B from a snapshot: hit rate {:.4} against A's {:.4}, outside {tol}", rows[2].hit_rate, rows[0].hit_rate);
    }
    Ok(())
}

#[derive(Debug, Default)]
struct Acc {
    held: u64,
    believed: u64,
    same: u64,
    served_prompt: u64,
    served_cached: u64,
    served: usize,
}

fn print_table(args: &ReplicaArgs, trace: &[TraceRequest], published: u64, rows: &[Row], ratio: f64) {
    let name = args.trace.file_stem().map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    println!(
        "{name}: {} requests through A, then {} measured ({} in the trace); {} engines x {} tokens, \
         replay buffer {} batches, {} requests served before B started, policy {}",
        args.warmup,
        args.measure,
        trace.len(),
        args.workers,
        args.capacity_tokens,
        args.replay_buffer_steps,
        published,
        args.policy
    );
    println!();
    println!(
        "| router | hit rate | vs A | index's belief | same worker as A | missed batches | resumed streams | served: hit rate (n) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let a = rows[0].hit_rate.max(f64::MIN_POSITIVE);
    for r in rows {
        println!(
            "| {} | {:.4} | {:.3}x | {:.4} | {:.1}% | {} | {} | {:.4} ({}) |",
            r.router,
            r.hit_rate,
            r.hit_rate / a,
            r.believed_rate,
            r.same_choice_as_a * 100.0,
            r.missed_batches,
            r.resumed_streams,
            r.served_hit_rate,
            r.served
        );
    }
    println!();
    println!("B from a snapshot / A: {ratio:.4} (|1 - ratio| = {:.2}%)", (1.0 - ratio).abs() * 100.0);
}

fn spawn_router(args: &ReplicaArgs, name: &'static str, workers: &[String], peer: Option<&str>) -> Result<RouterProc> {
    let mut flags: Vec<String> = ["--policy", &args.policy, "--kv-events", "--control-plane-api-keys", KEY]
        .iter()
        .map(|s| s.to_string())
        .collect();
    flags.extend(["--log-level", "warn", "--worker-urls"].map(String::from));
    flags.extend(workers.iter().cloned());
    if let Some(peer) = peer {
        flags.extend(["--index-peers", peer, "--index-peer-api-key", KEY].map(String::from));
    }
    RouterProc::spawn(&args.router_bin, name, &flags)
}

/// Waits (up to 60 s) until the router follows the KV events of all `n` workers.
async fn wait_following(http: &reqwest::Client, r: &RouterProc, n: usize) -> Result<()> {
    for _ in 0..600 {
        if let Ok(resp) = http.get(format!("{}/workers", r.url)).bearer_auth(KEY).send().await
            && let Ok(v) =
                resp.bytes().await.map_err(anyhow::Error::from).and_then(|b| Ok(serde_json::from_slice::<Value>(&b)?))
        {
            let followed =
                v["workers"].as_array().map_or(0, |ws| ws.iter().filter(|w| w["kv_events"] == "followed").count());
            if followed == n {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("router {} does not follow its {n} workers after 60 s", r.name)
}

fn body(r: &TraceRequest) -> Vec<u8> {
    let prompt: Vec<u32> = prompt_bytes(r).into_iter().map(u32::from).collect();
    json!({"model": "default", "prompt": prompt, "max_tokens": 1}).to_string().into_bytes()
}

/// Sends one request; its prompt and cached tokens as the engine reported them.
async fn send(http: &reqwest::Client, base: &str, r: &TraceRequest) -> Result<(u64, u64)> {
    let resp = http
        .post(format!("{base}/v1/completions"))
        .header("content-type", "application/json")
        .body(body(r))
        .send()
        .await?;
    let status = resp.status();
    let v: Value = serde_json::from_slice(&resp.bytes().await?)?;
    if !status.is_success() {
        bail!("{base} answered {status}: {v}");
    }
    let usage = &v["usage"];
    Ok((
        usage["prompt_tokens"].as_u64().unwrap_or(0),
        usage.pointer("/prompt_tokens_details/cached_tokens").and_then(Value::as_u64).unwrap_or(0),
    ))
}

/// The worker (and rank) a router would choose, and the tokens it believes that worker holds.
async fn explain(http: &reqwest::Client, base: &str, r: &TraceRequest) -> Result<(String, Option<usize>, u64)> {
    let resp = http
        .post(format!("{base}/debug/route?route=completions"))
        .bearer_auth(KEY)
        .header("content-type", "application/json")
        .body(body(r))
        .send()
        .await?;
    let status = resp.status();
    let v: Value = serde_json::from_slice(&resp.bytes().await?)?;
    if !status.is_success() {
        bail!("{base}/debug/route answered {status}: {v}");
    }
    let worker = v["worker"].as_str().context("no worker in the explain")?.to_string();
    let rank = v["dp_rank"].as_u64().map(|r| r as usize);
    let believed = v["candidates"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["worker"] == worker.as_str()))
        .and_then(|c| c["matched_tokens"].as_u64())
        .unwrap_or(0);
    Ok((worker, rank, believed))
}

/// Batches of history the router never saw, and streams it resumed from a snapshot.
async fn history(http: &reqwest::Client, base: &str) -> Result<(u64, u64)> {
    let v: Value =
        serde_json::from_slice(&http.get(format!("{base}/workers")).bearer_auth(KEY).send().await?.bytes().await?)?;
    let streams = v["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|w| w["kv_history"].as_array().cloned().unwrap_or_default());
    let (mut missed, mut resumed) = (0, 0);
    for h in streams {
        missed += h["missed_batches"].as_u64().unwrap_or(0);
        resumed += u64::from(h.get("resumed_after_seq").is_some());
    }
    Ok((missed, resumed))
}
