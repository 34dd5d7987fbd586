//! `sgl-router-bench soak`: a router process (`--router-bin`, cache_aware,
//! following KV events) in front of simulated engines for a long time, with
//! mixed streamed and whole traffic, worker churn (removed, added back,
//! replaced by a new engine on a new port) and KV-event faults (publisher
//! restarts and crashes, dropped, corrupted and lost batches, cache flushes,
//! failing requests). Every `--sample-secs` the router's own `/metrics`
//! (resident memory, open descriptors, threads, tokio tasks, index blocks and
//! bytes) is sampled; the samples are printed, written as CSV and plotted as
//! an SVG. With `--check`, each resource must level off: the second half's
//! peak within 10 % (plus a small absolute slack) of the first half's.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use mock_engine::{Faults, MockEngine, MockEngineConfig};
use router_types::SplitMix;
use serde_json::json;
use tokio::sync::Mutex;

use crate::router_proc::RouterProc;

const KEY: &str = "soak-control-plane-key";
/// The resources sampled, plotted and checked.
const PANELS: usize = 6;

/// The command's arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct SoakArgs {
    /// The router binary.
    #[arg(long, default_value = "target/release/sgl-router")]
    router_bin: PathBuf,
    /// How long to run, seconds.
    #[arg(long, default_value_t = 3600)]
    duration_secs: u64,
    /// Time between two samples, seconds.
    #[arg(long, default_value_t = 60)]
    sample_secs: u64,
    /// Time between two churn or fault actions, seconds.
    #[arg(long, default_value_t = 10)]
    churn_secs: u64,
    /// Simulated engines (at least 3: churn keeps 2 in the fleet).
    #[arg(long, default_value_t = 4)]
    engines: usize,
    /// Requests per second, all clients together.
    #[arg(long, default_value_t = 40.0)]
    rate: f64,
    /// Clients sending at once.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Each engine's KV capacity, tokens (small, so that its cache evicts).
    #[arg(long, default_value_t = 32_768)]
    capacity_tokens: usize,
    /// Batches each engine's publisher keeps for replay.
    #[arg(long, default_value_t = 64)]
    replay_steps: usize,
    /// More router flags, after the soak's own (e.g. `--router-arg=--page-hash-memo-pages=65536`).
    #[arg(long = "router-arg", allow_hyphen_values = true)]
    router_args: Vec<String>,
    /// Samples as CSV.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// The curves as an SVG.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Exit non-zero unless every resource levels off and the router answered every request.
    #[arg(long)]
    check: bool,
}

/// One sample of the router's resources.
#[derive(Debug, Clone, Default)]
struct Sample {
    secs: f64,
    rss_mib: f64,
    /// Anonymous resident memory: RSS without the executable's pages (which
    /// fault in as code paths first run, up to its text size).
    anon_mib: f64,
    fds: f64,
    threads: f64,
    tasks: f64,
    index_blocks: f64,
    /// (block, engine) pairs in the index: what `engine_blocks` counts.
    index_holdings: f64,
    index_mib: f64,
    /// Page digests in the router's page-hash memo (bounded by `--page-hash-memo-pages`).
    memo_pages: f64,
    /// Blocks the engines of the fleet hold (the index's ground truth).
    engine_blocks: f64,
    /// What the tokenizer's caches hold (segment text bytes and the word cache's budgeted bytes;
    /// each bounded, 64 MiB and 16 MiB by default): filling, they grow the heap.
    tokenizer_cache_mib: f64,
    requests: u64,
    workers: f64,
}

/// The resources that must level off: (name, value, absolute slack).
fn series(s: &Sample) -> [(&'static str, f64, f64); PANELS] {
    [
        ("RSS (MiB)", s.rss_mib, 4.0),
        ("anonymous RSS (MiB)", s.anon_mib, 4.0),
        ("open descriptors", s.fds, 16.0),
        ("threads", s.threads, 2.0),
        ("tokio tasks", s.tasks, 32.0),
        ("index holdings", s.index_holdings, 256.0),
    ]
}

/// What the clients saw.
#[derive(Debug, Default)]
struct Tally {
    by_status: Mutex<BTreeMap<u16, u64>>,
    /// Streams cut before `[DONE]` (an engine told to die mid-stream, or replaced).
    broken: AtomicU64,
    sent: AtomicU64,
}

/// The fleet as the soak sees it: engines by slot, and whether each is in the router.
struct Fleet {
    engines: Vec<MockEngine>,
    member: Vec<bool>,
    config: MockEngineConfig,
}

/// Runs the soak and prints its table.
pub(crate) fn run(args: &SoakArgs) -> Result<()> {
    if !args.router_bin.exists() {
        bail!("--router-bin {}: not found (cargo build --release -p sgl-router)", args.router_bin.display());
    }
    if args.engines < 3 {
        bail!("--engines must be at least 3");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(soak(args))
}

async fn soak(args: &SoakArgs) -> Result<()> {
    let config = MockEngineConfig {
        kv_events: true,
        capacity_tokens: args.capacity_tokens,
        replay_buffer_steps: args.replay_steps,
        decode_per_token: Duration::from_millis(2),
        prefill_fixed: Duration::from_millis(1),
        default_max_tokens: 16,
        ..MockEngineConfig::default()
    };
    let mut engines = Vec::new();
    for _ in 0..args.engines {
        engines.push(MockEngine::spawn(config.clone()).await?);
    }
    let mut flags: Vec<String> = ["--policy", "cache_aware", "--kv-events", "--control-plane-api-keys", KEY]
        .into_iter()
        .map(String::from)
        .collect();
    flags.extend(["--log-level".into(), "error".into(), "--worker-urls".into()]);
    flags.extend(engines.iter().map(MockEngine::url));
    flags.extend(args.router_args.iter().cloned());
    let router = RouterProc::spawn(&args.router_bin, "router", &flags)?;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
    router.wait_ready(&http).await?;
    let fleet = Arc::new(Mutex::new(Fleet { member: vec![true; engines.len()], engines, config }));

    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let mut clients = tokio::task::JoinSet::new();
    let per_client = Duration::from_secs_f64(args.clients as f64 / args.rate.max(0.001));
    for c in 0..args.clients {
        let (http, url, stop, tally) = (http.clone(), router.url.clone(), stop.clone(), tally.clone());
        clients.spawn(async move { client(c, &http, &url, per_client, &stop, &tally).await });
    }

    let started = Instant::now();
    let end = started + Duration::from_secs(args.duration_secs);
    let mut samples = vec![sample(&http, &router, &fleet, &tally, 0.0).await?];
    print_header();
    print_row(&samples[0]);
    let mut next_sample = started + Duration::from_secs(args.sample_secs);
    let mut next_churn = started + Duration::from_secs(args.churn_secs);
    let mut actions: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut step = 0u64;
    while Instant::now() < end {
        let wake = next_sample.min(next_churn).min(end);
        tokio::time::sleep_until(wake.into()).await;
        if Instant::now() >= next_churn {
            let action = churn(&http, &router, &fleet, step).await?;
            *actions.entry(action).or_default() += 1;
            step += 1;
            next_churn += Duration::from_secs(args.churn_secs);
        }
        if Instant::now() >= next_sample {
            let s = sample(&http, &router, &fleet, &tally, started.elapsed().as_secs_f64()).await?;
            print_row(&s);
            samples.push(s);
            next_sample += Duration::from_secs(args.sample_secs);
        }
    }
    stop.store(true, Ordering::Relaxed);
    while clients.join_next().await.is_some() {}

    let statuses = tally.by_status.lock().await.clone();
    println!("\nactions: {actions:?}");
    println!(
        "requests: {} sent, by status {statuses:?} (0: no answer from the router), {} streams cut",
        tally.sent.load(Ordering::Relaxed),
        tally.broken.load(Ordering::Relaxed)
    );
    let verdicts = level_off(&samples);
    for (name, first, second, ok) in &verdicts {
        println!(
            "{name}: first half peak {first:.1}, second half peak {second:.1}: {}",
            if *ok { "level" } else { "GROWING" }
        );
    }
    if let Some(path) = &args.csv {
        std::fs::write(path, csv(&samples)).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        let title = format!(
            "soak: {} min, {} engines, {:.0} req/s, a churn or fault every {} s",
            args.duration_secs / 60,
            args.engines,
            args.rate,
            args.churn_secs
        );
        std::fs::write(path, svg(&title, &samples)).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.check {
        if statuses.get(&0).copied().unwrap_or(0) > 0 {
            bail!("the router left requests unanswered");
        }
        if verdicts.iter().any(|v| !v.3) {
            bail!("a resource kept growing");
        }
    }
    Ok(())
}

/// One client: a request every `every` (streamed every other time), until `stop`.
async fn client(c: usize, http: &reqwest::Client, base: &str, every: Duration, stop: &AtomicBool, tally: &Tally) {
    let url = format!("{base}/v1/chat/completions");
    let mut rng = SplitMix::new((c as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        n += 1;
        let stream = n.is_multiple_of(2);
        let (max_tokens, sys, len) = (8 + rng.below(16), rng.below(24), 4 + rng.below(40));
        let body = json!({"model": "m", "stream": stream, "max_tokens": max_tokens,
            "messages": [{"role": "system", "content": system(sys)},
                         {"role": "user", "content": words(&mut rng, len as usize)}]});
        tally.sent.fetch_add(1, Ordering::Relaxed);
        let (status, whole) =
            match http.post(&url).header("content-type", "application/json").body(body.to_string()).send().await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let text = resp.text().await.unwrap_or_default();
                    // A stream cut upstream ends with the router's error event, then `[DONE]`.
                    (status, !stream || (text.contains("[DONE]") && !text.contains("data: {\"error\"")))
                }
                Err(_) => (0, true),
            };
        *tally.by_status.lock().await.entry(status).or_default() += 1;
        if status == 200 && !whole {
            tally.broken.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The next churn or fault, in a fixed rotation; returns its name.
async fn churn(http: &reqwest::Client, router: &RouterProc, fleet: &Mutex<Fleet>, step: u64) -> Result<&'static str> {
    let mut f = fleet.lock().await;
    let n = f.engines.len();
    let slot = (step as usize * 7 + 3) % n;
    let members = f.member.iter().filter(|m| **m).count();
    let admin = |req: reqwest::RequestBuilder| req.bearer_auth(KEY).timeout(Duration::from_secs(30)).send();
    let engine = f.engines[slot].engine().clone();
    let action = match step % 12 {
        // Worker churn: out (if at least 3 are in), back in, or replaced by a new engine.
        0 | 6 => {
            if let Some(out) = (0..n).map(|i| (slot + i) % n).find(|&i| f.member[i]).filter(|_| members > 2) {
                let url = f.engines[out].url();
                admin(http.delete(format!("{}/workers/{url}", router.url))).await?.error_for_status()?;
                f.member[out] = false;
                "worker removed"
            } else {
                "none (too few workers to remove)"
            }
        }
        3 | 9 => {
            if let Some(back) = (0..n).map(|i| (slot + i) % n).find(|&i| !f.member[i]) {
                let url = f.engines[back].url();
                admin(
                    http.post(format!("{}/workers", router.url))
                        .header("content-type", "application/json")
                        .body(json!({"url": url}).to_string()),
                )
                .await?
                .error_for_status()?;
                f.member[back] = true;
                "worker added back"
            } else {
                "none (every worker in)"
            }
        }
        1 => {
            // An engine replaced (a new pod: new port, empty cache, new publisher).
            let url = f.engines[slot].url();
            if f.member[slot] {
                admin(http.delete(format!("{}/workers/{url}", router.url))).await?.error_for_status()?;
            }
            let config = f.config.clone();
            let fresh = MockEngine::spawn(config).await?;
            // The old engine finishes what it was sending, then stops.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let old = std::mem::replace(&mut f.engines[slot], fresh);
            old.shutdown();
            let url = f.engines[slot].url();
            admin(
                http.post(format!("{}/workers", router.url))
                    .header("content-type", "application/json")
                    .body(json!({"url": url}).to_string()),
            )
            .await?
            .error_for_status()?;
            f.member[slot] = true;
            "engine replaced"
        }
        2 => {
            engine.crash_publishers(Duration::from_millis(300), step % 24 == 2).await;
            "engine crash (publisher down, cache lost)"
        }
        4 => {
            engine.set_faults(Faults { restart_publisher: true, ..Faults::default() }).await;
            "publisher restart"
        }
        5 => {
            engine.publishers()[0].drop_next(3);
            "batches dropped (replayable)"
        }
        7 => {
            engine.publishers()[0].drop_next(f.config.replay_buffer_steps + 8);
            "gap past the replay buffer"
        }
        8 => {
            engine.publishers()[0].corrupt_next(1);
            "corrupted batch"
        }
        10 => {
            engine.flush_cache().await;
            "cache flush"
        }
        _ => {
            engine.set_faults(Faults { fail_next: 2, die_mid_stream_next: 2, ..Faults::default() }).await;
            "requests failed and streams cut"
        }
    };
    Ok(action)
}

async fn sample(
    http: &reqwest::Client,
    router: &RouterProc,
    fleet: &Mutex<Fleet>,
    tally: &Tally,
    secs: f64,
) -> Result<Sample> {
    let text = http
        .get(format!("{}/metrics", router.url))
        .bearer_auth(KEY)
        .send()
        .await
        .context("scraping the router's /metrics")?
        .error_for_status()?
        .text()
        .await?;
    let get = |name: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let f = fleet.lock().await;
    let engine_blocks: usize = f
        .engines
        .iter()
        .zip(&f.member)
        .filter(|(_, m)| **m)
        .map(|(e, _)| e.engine().cached_pages().iter().sum::<usize>())
        .sum();
    Ok(Sample {
        secs,
        rss_mib: get("process_resident_memory_bytes") / (1024.0 * 1024.0),
        anon_mib: router.rss_anon_kib().unwrap_or(0) as f64 / 1024.0,
        fds: get("process_open_fds"),
        threads: get("process_threads"),
        tasks: get("router_runtime_alive_tasks"),
        index_blocks: get("router_index_nodes"),
        index_holdings: get("router_index_holdings"),
        index_mib: get("router_index_memory_bytes") / (1024.0 * 1024.0),
        memo_pages: get("router_page_hash_memo_pages"),
        engine_blocks: engine_blocks as f64,
        // Both caches' series (segment and word) summed.
        tokenizer_cache_mib: get("router_tokenizer_cache_bytes") / (1024.0 * 1024.0),
        requests: tally.sent.load(Ordering::Relaxed),
        workers: f.member.iter().filter(|m| **m).count() as f64,
    })
}

/// Per resource: (name, first half's peak, second half's peak, levelled off).
fn level_off(samples: &[Sample]) -> Vec<(&'static str, f64, f64, bool)> {
    // The first sample is before any traffic: the halves are of the samples after it.
    let run = if samples.len() > 2 { &samples[1..] } else { samples };
    let (first, second) = run.split_at(run.len() / 2);
    let peak = |part: &[Sample], i: usize| part.iter().map(|s| series(s)[i].1).fold(0.0, f64::max);
    (0..PANELS)
        .map(|i| {
            let (name, _, slack) = series(&run[0])[i];
            let (a, b) = (peak(first, i), peak(second, i));
            (name, a, b, b <= a * 1.10 + slack)
        })
        .collect()
}

/// The columns of the table and the CSV: (table heading, CSV name).
const COLUMNS: [(&str, &str); 14] = [
    ("min", "minutes"),
    ("requests", "requests"),
    ("workers", "workers"),
    ("RSS MiB", "rss_mib"),
    ("anon MiB", "anon_mib"),
    ("fds", "fds"),
    ("threads", "threads"),
    ("tasks", "tasks"),
    ("index blocks", "index_blocks"),
    ("index holdings", "index_holdings"),
    ("index MiB", "index_mib"),
    ("memo pages", "memo_pages"),
    ("engine blocks", "engine_blocks"),
    ("tokenizer caches MiB", "tokenizer_cache_mib"),
];

/// A sample's values, in [`COLUMNS`] order.
fn values(s: &Sample) -> [String; 14] {
    [
        format!("{:.1}", s.secs / 60.0),
        s.requests.to_string(),
        s.workers.to_string(),
        format!("{:.1}", s.rss_mib),
        format!("{:.1}", s.anon_mib),
        s.fds.to_string(),
        s.threads.to_string(),
        s.tasks.to_string(),
        s.index_blocks.to_string(),
        s.index_holdings.to_string(),
        format!("{:.2}", s.index_mib),
        s.memo_pages.to_string(),
        s.engine_blocks.to_string(),
        format!("{:.2}", s.tokenizer_cache_mib),
    ]
}

fn print_header() {
    println!("| {} |", COLUMNS.map(|c| c.0).join(" | "));
    println!("|{}", "---:|".repeat(COLUMNS.len()));
}

fn print_row(s: &Sample) {
    println!("| {} |", values(s).join(" | "));
}

fn csv(samples: &[Sample]) -> String {
    let mut out = COLUMNS.map(|c| c.1).join(",") + "\n";
    for s in samples {
        out += &values(s).join(",");
        out.push('\n');
    }
    out
}

/// Five panels, one per resource, minutes on the x axis; each panel's y axis
/// from 0 to its largest value (the engines' blocks drawn light under the index's).
fn svg(title: &str, samples: &[Sample]) -> String {
    const W: f64 = 640.0;
    const H: f64 = 110.0;
    const LEFT: f64 = 150.0;
    const TOP: f64 = 40.0;
    let height = TOP + PANELS as f64 * (H + 30.0) + 20.0;
    let width = LEFT + W + 30.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ =
        writeln!(s, r#"<text x="10" y="22" font-size="14" font-weight="bold">{}</text>"#, crate::plot::escape(title));
    let t_max = samples.iter().map(|x| x.secs).fold(1.0, f64::max);
    for i in 0..PANELS {
        let y0 = TOP + i as f64 * (H + 30.0);
        let name = series(&samples[0])[i].0;
        let values: Vec<f64> = samples.iter().map(|x| series(x)[i].1).collect();
        let truth: Vec<f64> = samples.iter().map(|x| x.engine_blocks).collect();
        let mut v_max = values.iter().copied().fold(0.0, f64::max);
        if i == PANELS - 1 {
            v_max = truth.iter().copied().fold(v_max, f64::max);
        }
        let v_max = if v_max > 0.0 { v_max * 1.1 } else { 1.0 };
        let point = |t: f64, v: f64| (LEFT + t / t_max * W, y0 + H - v / v_max * H);
        let _ = writeln!(s, r#"<text x="{}" y="{}" text-anchor="end">{name}</text>"#, LEFT - 10.0, y0 + H / 2.0);
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" text-anchor="end" fill="#555">{:.0}</text>"##,
            LEFT - 4.0,
            y0 + 10.0,
            v_max
        );
        let _ = writeln!(s, r##"<text x="{}" y="{}" text-anchor="end" fill="#555">0</text>"##, LEFT - 4.0, y0 + H);
        let _ = writeln!(
            s,
            r#"<polyline points="{},{y0} {},{} {},{}" fill="none" stroke="black"/>"#,
            LEFT,
            LEFT,
            y0 + H,
            LEFT + W,
            y0 + H
        );
        let mut line = |vals: &[f64], color: &str| {
            let pts: Vec<String> = samples
                .iter()
                .zip(vals)
                .map(|(x, v)| {
                    let (px, py) = point(x.secs, *v);
                    format!("{px:.1},{py:.1}")
                })
                .collect();
            let _ = writeln!(
                s,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="1.5"/>"#,
                pts.join(" ")
            );
        };
        if i == PANELS - 1 {
            line(&truth, "#a6c8ea");
        }
        line(&values, "#2b6cb0");
    }
    let axis_y = TOP + PANELS as f64 * (H + 30.0) - 12.0;
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{axis_y}" text-anchor="middle">minutes (0 … {:.0}); last panel: (block, engine) pairs in the index (dark) and in the engines' caches (light)</text>"#,
        LEFT + W / 2.0,
        t_max / 60.0
    );
    s.push_str("</svg>\n");
    s
}

const WORDS: &[&str] = &[
    "cache", "route", "engine", "token", "prefix", "page", "block", "replica", "model", "query", "answer", "system",
    "policy", "worker", "stream", "event", "batch", "index", "tensor", "decode",
];

fn words(rng: &mut SplitMix, n: usize) -> String {
    (0..n).map(|_| WORDS[rng.below(WORDS.len() as u64) as usize]).collect::<Vec<_>>().join(" ")
}

/// One of the shared system prompts (about 300 tokens each).
fn system(i: u64) -> String {
    let mut rng = SplitMix::new(1000 + i);
    format!("system prompt {i}: {}", words(&mut rng, 50))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: f64, rss: f64) -> Sample {
        Sample { secs, rss_mib: rss, fds: 30.0, threads: 4.0, tasks: 50.0, index_holdings: 1000.0, ..Sample::default() }
    }

    #[test]
    fn a_resource_that_keeps_growing_is_caught_and_one_that_levels_is_not() {
        let level: Vec<Sample> = (0..10).map(|i| at(i as f64 * 60.0, if i == 0 { 10.0 } else { 20.0 })).collect();
        assert!(level_off(&level).iter().all(|v| v.3), "{:?}", level_off(&level));
        let growing: Vec<Sample> = (0..10).map(|i| at(i as f64 * 60.0, 20.0 + 3.0 * i as f64)).collect();
        let v = level_off(&growing);
        assert!(!v[0].3, "RSS growing 3 MiB a minute: {v:?}");
        assert!(v[1..].iter().all(|v| v.3));
    }

    #[test]
    fn the_plot_has_a_panel_per_resource() {
        let samples: Vec<Sample> = (0..5).map(|i| at(i as f64 * 60.0, 20.0)).collect();
        let out = svg("soak <1h>", &samples);
        assert!(out.starts_with("<svg") && out.trim_end().ends_with("</svg>"));
        assert!(out.contains("soak &lt;1h&gt;"));
        // One line per resource, and the fleet's blocks under the index's.
        assert_eq!(out.matches("<polyline points=").count() - PANELS, PANELS + 1, "{out}");
    }
}
