//! `sgl-router-bench`: measure routing quality on request traces.
//!
//! `sim` replays a Mooncake-format trace through the real policies and index
//! over simulated workers and prints hit rate, TTFT and balance per policy;
//! `live` replays one as real HTTP requests against routers in front of
//! simulated engines; `overhead` measures what a router adds; `model-routing`
//! prices and grades `model: "auto"` against always-small, always-large and
//! the true labels; `replica` measures a router replica started late, cold
//! and from a peer's index snapshot, against the one that ran all along;
//! `overload` and `soak` measure the router under too much load and over
//! time (docs/reliability.md).

mod corpus;
mod direct_pd;
mod fidelity;
mod live;
mod model_routing;
mod overhead;
mod overload;
mod plot;
mod presets_eval;
mod replica;
mod router_proc;
mod signal_quality;
mod sim;
mod soak;
mod stats;
mod tfidf_sparse;
mod trace;
mod train_presets;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// Routing-quality benchmarks for sgl-router.
#[derive(Debug, Parser)]
#[command(name = "sgl-router-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Simulate a fleet on a trace, for each policy (and the oracle bounds).
    Sim(SimArgs),
    /// Latency and throughput straight to an engine and through routers, in one run.
    Overhead(OverheadArgs),
    /// Replay a trace as real HTTP requests against routers in front of simulated engines.
    Live(LiveArgs),
    /// Cost and expected quality of model routing against a small and a large model.
    ModelRouting(model_routing::ModelRoutingArgs),
    /// A router replica started late, cold and from a peer's index snapshot, against the one
    /// that ran all along: hit rates on the same requests.
    Replica(replica::ReplicaArgs),
    /// Ten times the admitted concurrency against slow engines: the admitted requests' latency,
    /// how fast the rest are refused, the router's memory, and clients hanging up mid-stream.
    Overload(overload::OverloadArgs),
    /// An hour (by default) of mixed traffic, worker churn and KV-event faults: the router's
    /// memory, descriptors, threads, tasks and index size sampled every minute, plotted.
    Soak(soak::SoakArgs),
    /// The embedding signals' quality (domain accuracy on MT-Bench, jailbreak AUC on
    /// bastioncorpus) against TF-IDF, leave-one-out, with 95 % intervals.
    SignalQuality(signal_quality::SignalQualityArgs),
    /// Train the shipped detectors (`preset: default`) on `tools/presets/build_data.py`'s texts.
    TrainPresets(train_presets::TrainPresetsArgs),
}

#[derive(Debug, clap::Args)]
struct LiveArgs {
    /// Mooncake-format JSONL trace.
    #[arg(long)]
    trace: PathBuf,
    /// Routers to measure, as NAME=URL, comma separated (run one at a time against fresh engines
    /// for a fair comparison: the engines' caches carry over).
    #[arg(long, value_delimiter = ',', required = true)]
    router: Vec<String>,
    /// Replay only the first N requests of the trace.
    #[arg(long)]
    limit: Option<usize>,
    /// Trace time is divided by this.
    #[arg(long, default_value_t = 10.0)]
    speedup: f64,
    /// Most requests in flight; later arrivals wait, and the wait counts in their TTFT.
    #[arg(long, default_value_t = 256)]
    max_in_flight: usize,
    /// Prompts as token ids or as text.
    #[arg(long, value_enum, default_value = "tokens")]
    prompt: live::PromptForm,
    /// Per-request timeout, seconds.
    #[arg(long, default_value_t = 120)]
    timeout_secs: u64,
    /// Generate each request's trace output length, capped at N tokens (0: one token each).
    #[arg(long, default_value_t = 0, value_name = "N")]
    max_output: u64,
    /// Stream the answers (TTFT is then the first event).
    #[arg(long)]
    stream: bool,
    /// The router's Prometheus endpoint (`sgl-router --prometheus-port`), read after the run for
    /// its routing regret and predicted cached tokens (one router per run).
    #[arg(long, value_name = "URL")]
    metrics: Option<String>,
    /// Print a JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct OverheadArgs {
    /// The engine, measured directly (the baseline).
    #[arg(long)]
    engine_url: String,
    /// Routers in front of it, as NAME=URL, comma separated.
    #[arg(long, value_delimiter = ',')]
    router: Vec<String>,
    /// Prefill/decode pairs driven by this client itself, no router between (the baseline of a
    /// PD router: the second engine and the rendezvous), as NAME=FLAVOR:PREFILL_URL|DECODE_URL,
    /// comma separated (FLAVOR: sglang or vllm). A router target X is compared with a
    /// `direct_X` target when there is one, else with `direct`.
    #[arg(long, value_delimiter = ',')]
    direct_pd: Vec<String>,
    /// Requests per measurement.
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    /// Concurrencies to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    concurrency: Vec<usize>,
    /// Request body sizes to measure.
    #[arg(long, value_delimiter = ',', default_value = "200,16384")]
    body_bytes: Vec<usize>,
    /// Rounds each measurement is split into, the targets taking turns in
    /// each, so a machine that speeds up or slows down during the run weighs
    /// on every target alike.
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// Also, all along, this many clients sending `model: "auto"` chats with unique texts to
    /// `--background-url` (a router whose decisions embed them): the measured requests' latency
    /// while embeddings run.
    #[arg(long, default_value_t = 0)]
    background_clients: usize,
    /// The router the background clients send to.
    #[arg(long)]
    background_url: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Stream this many tokens per request (`stream: true`) and measure the time to the
    /// first of them (TTFT) instead of to the whole answer; 0: one token, not streamed.
    #[arg(long, default_value_t = 0)]
    stream_tokens: usize,
}

#[derive(Debug, clap::Args)]
struct SimArgs {
    /// Mooncake-format JSONL trace.
    #[arg(long)]
    trace: PathBuf,
    /// Comma-separated policies: round_robin, random, power_of_two, least_load, approx_tree,
    /// cache_aware, min_ttft, oracle_pooled_lru, oracle_belady, oracle_infinite.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "round_robin,power_of_two,least_load,approx_tree,cache_aware,min_ttft,oracle_pooled_lru,oracle_belady,oracle_infinite"
    )]
    policy: Vec<String>,
    /// Workers.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// KV capacity per worker, tokens (an 8B model on one 80 GB GPU holds about 400 k).
    #[arg(long, default_value_t = 400_000)]
    capacity_tokens: u64,
    /// Prefill speed, uncached tokens per second per worker.
    #[arg(long, default_value_t = 20_000.0)]
    speed: f64,
    /// Fixed prefill cost, seconds.
    #[arg(long, default_value_t = 0.02)]
    prefill_fixed_s: f64,
    /// Decode time per output token, seconds.
    #[arg(long, default_value_t = 0.02)]
    decode_s_per_token: f64,
    /// Router replicas splitting the traffic, each with its own view.
    #[arg(long, default_value_t = 1)]
    routers: usize,
    /// Delay before routers see a cache change, milliseconds.
    #[arg(long, default_value_t = 0)]
    event_lag_ms: u64,
    /// Routers also see each engine's report of its queued prefill (SGLang's `/v1/loads`, which
    /// sgl-router polls every 100 ms); by default they see only their own requests.
    #[arg(long)]
    engine_load: bool,
    /// Seed of the random policies.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print a JSON array instead of a table.
    #[arg(long)]
    json: bool,
    /// Also draw hit rate and TTFT by policy into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sgl-router-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let a = match cli.command {
        Command::Sim(a) => a,
        Command::Overhead(o) => return overhead(o),
        Command::Live(l) => return live(l),
        Command::Replica(r) => return replica::run(&r),
        Command::Overload(o) => return overload::run(&o),
        Command::Soak(s) => return soak::run(&s),
        Command::SignalQuality(q) => return signal_quality::run(&q),
        Command::TrainPresets(t) => return train_presets::run(&t),
        Command::ModelRouting(m) => {
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            return runtime.block_on(model_routing::run(&m));
        }
    };
    let trace = trace::load(&a.trace)?;
    let cfg = sim::SimConfig {
        workers: a.workers.max(1),
        capacity_tokens: a.capacity_tokens,
        routers: a.routers.max(1),
        event_lag_s: a.event_lag_ms as f64 / 1000.0,
        prefill_fixed_s: a.prefill_fixed_s,
        prefill_tokens_per_s: a.speed,
        decode_s_per_token: a.decode_s_per_token,
        seed: a.seed,
        engine_load: a.engine_load,
    };
    let _ = sim::page_size();
    let results = a.policy.iter().map(|p| sim::run(&trace, p, &cfg)).collect::<Result<Vec<_>>>()?;
    if let Some(path) = &a.plot {
        let name = a.trace.file_stem().map_or_else(String::new, |s| s.to_string_lossy().into_owned());
        let title = format!(
            "{name}: {} requests, {} workers x {} tokens, prefill {} tok/s, {} router(s), event lag {} ms",
            trace.len(),
            cfg.workers,
            cfg.capacity_tokens,
            a.speed,
            cfg.routers,
            a.event_lag_ms
        );
        std::fs::write(path, plot::svg(&title, &results))
            .map_err(|e| anyhow::anyhow!("--plot {}: {e}", path.display()))?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
        return Ok(());
    }
    println!(
        "{} requests, {} workers x {} tokens, {} router(s), event lag {} ms, prefill {} tok/s, load seen: {}",
        trace.len(),
        cfg.workers,
        cfg.capacity_tokens,
        cfg.routers,
        a.event_lag_ms,
        a.speed,
        if cfg.engine_load { "own + engine reports" } else { "own requests only" }
    );
    println!(
        "{:<18} {:>9} {:>11} {:>10} {:>10} {:>12} {:>8} {:>13}",
        "policy", "hit rate", "TTFT mean", "TTFT p50", "TTFT p99", "work max/mean", "regret", "oracle regret"
    );
    for r in &results {
        println!(
            "{:<18} {:>9.3} {:>10.3}s {:>9.3}s {:>9.3}s {:>12.2} {:>8.3} {:>13.3}",
            r.policy,
            r.hit_rate,
            r.ttft_mean_s,
            r.ttft_p50_s,
            r.ttft_p99_s,
            r.prefill_work_max_over_mean,
            r.regret,
            r.oracle_regret
        );
    }
    Ok(())
}

fn overhead(a: OverheadArgs) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    use overhead::Target;
    let mut targets = vec![("direct".to_string(), Target::Url(a.engine_url.clone()))];
    for r in &a.router {
        let (name, url) = r.split_once('=').ok_or_else(|| anyhow::anyhow!("--router wants NAME=URL, got {r}"))?;
        targets.push((name.to_string(), Target::Url(url.to_string())));
    }
    for d in &a.direct_pd {
        let (name, spec) = d.split_once('=').ok_or_else(|| anyhow::anyhow!("--direct-pd wants NAME=SPEC, got {d}"))?;
        let pd = runtime.block_on(direct_pd::DirectPd::parse(spec))?;
        targets.push((name.to_string(), Target::DirectPd(std::sync::Arc::new(pd))));
    }
    let background = match (&a.background_url, a.background_clients) {
        (Some(url), n) if n > 0 => Some(overhead::Background::start(&runtime, url, n)),
        (None, n) if n > 0 => anyhow::bail!("--background-clients needs --background-url"),
        _ => None,
    };
    let mut rows = Vec::new();
    let rounds = a.rounds.clamp(1, a.requests.max(1));
    for &c in &a.concurrency {
        for &b in &a.body_bytes {
            let mut samples: Vec<overhead::Sample> = targets.iter().map(|_| overhead::Sample::default()).collect();
            for round in 0..rounds {
                let n = a.requests / rounds + usize::from(round < a.requests % rounds);
                // A different target goes first each round.
                for k in 0..targets.len() {
                    let t = (k + round) % targets.len();
                    let (_, target) = &targets[t];
                    let s =
                        runtime.block_on(overhead::measure(target, c, b, n, round * a.requests, a.stream_tokens))?;
                    samples[t].merge(s);
                }
            }
            for ((name, _), s) in targets.iter().zip(samples) {
                rows.push(s.row(name, c, b));
            }
        }
    }
    let background = background.map(|b| b.stop(&runtime));
    if a.json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({"rows": rows, "background": background}))?);
        return Ok(());
    }
    if let Some(b) = &background {
        println!(
            "background: {} clients, {} auto requests answered 2xx, {} not ({:.1} per second)",
            b.clients, b.ok, b.failed, b.per_second
        );
    }
    println!(
        "{:<22} {:>5} {:>7} {:>9} {:>9} {:>9} {:>10} {:>11}  against",
        "target", "conc", "body", "p50 ms", "p99 ms", "+p50 ms", "req/s", "req/s ratio"
    );
    for r in &rows {
        // A router X against its own baseline `direct_X` (a PD pair driven directly), else `direct`.
        let own = format!("direct_{}", r.target);
        let against = if rows.iter().any(|d| d.target == own) { own.as_str() } else { "direct" };
        let base =
            rows.iter().find(|d| d.target == against && d.concurrency == r.concurrency && d.body_bytes == r.body_bytes);
        let (add, ratio) =
            base.map_or((0.0, 1.0), |d| (r.p50_ms - d.p50_ms, r.throughput_rps / d.throughput_rps.max(1e-9)));
        println!(
            "{:<22} {:>5} {:>7} {:>9.3} {:>9.3} {:>+9.3} {:>10.0} {:>11.2}  {}{}",
            r.target,
            r.concurrency,
            r.body_bytes,
            r.p50_ms,
            r.p99_ms,
            add,
            r.throughput_rps,
            ratio,
            if r.target.starts_with("direct") { "-" } else { against },
            if r.errors > 0 { format!("  ({} errors)", r.errors) } else { String::new() }
        );
    }
    Ok(())
}

fn live(a: LiveArgs) -> Result<()> {
    let mut trace = trace::load(&a.trace)?;
    if let Some(n) = a.limit {
        trace.truncate(n);
    }
    let cfg = live::LiveConfig {
        speedup: a.speedup,
        max_in_flight: a.max_in_flight,
        form: a.prompt,
        timeout: std::time::Duration::from_secs(a.timeout_secs.max(1)),
        max_output: a.max_output,
        stream: a.stream,
        metrics: a.metrics.clone(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut results = Vec::new();
    for r in &a.router {
        let (name, url) = r.split_once('=').ok_or_else(|| anyhow::anyhow!("--router wants NAME=URL, got {r}"))?;
        results.push(runtime.block_on(live::replay(name, url, &trace, &cfg))?);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
        return Ok(());
    }
    println!(
        "{} requests, speedup {}x, prompts as {:?}, output {}{}",
        trace.len(),
        a.speedup,
        a.prompt,
        if a.max_output == 0 { "1 token".to_string() } else { format!("trace lengths up to {}", a.max_output) },
        if a.stream { ", streamed" } else { "" }
    );
    println!(
        "{:<18} {:>8} {:>7} {:>9} {:>11} {:>10} {:>10} {:>10} {:>9} {:>8} {:>7} {:>9}",
        "target",
        "requests",
        "errors",
        "hit rate",
        "TTFT mean",
        "TTFT p50",
        "TTFT p99",
        "e2e mean",
        "tok/s",
        "wall",
        "regret",
        "pred/obs"
    );
    let or_dash = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
    for r in &results {
        println!(
            "{:<18} {:>8} {:>7} {:>9.3} {:>10.3}s {:>9.3}s {:>9.3}s {:>9.3}s {:>9.0} {:>7.1}s {:>7} {:>9}",
            r.target,
            r.requests,
            r.errors,
            r.hit_rate,
            r.ttft_mean_s,
            r.ttft_p50_s,
            r.ttft_p99_s,
            r.e2e_mean_s,
            r.output_tokens_per_s,
            r.wall_s,
            or_dash(r.regret),
            or_dash(r.predicted_over_observed)
        );
    }
    Ok(())
}
