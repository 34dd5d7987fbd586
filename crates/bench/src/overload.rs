//! `sgl-router-bench overload`: ten times the admitted concurrency against
//! slow simulated engines. The router (`--router-bin`, a process) admits
//! `--admitted` requests at once and queues none (`--max-concurrent-requests
//! N --queue-size 0`); every client sends one streamed chat at the same
//! moment. Measured: the admitted requests' latency against the same number
//! sent alone (the baseline, same run), how fast the others are refused and
//! with what status, the router's resident memory and open descriptors
//! before, at the peak and after; then the same wave with clients that hang
//! up after the first chunk, and how many of those requests the engines saw
//! cancelled.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use mock_engine::{MockEngine, MockEngineConfig};
use serde::Serialize;
use serde_json::json;

use crate::router_proc::RouterProc;

/// The command's arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct OverloadArgs {
    /// The router binary.
    #[arg(long, default_value = "target/release/sgl-router")]
    router_bin: std::path::PathBuf,
    /// Simulated engines.
    #[arg(long, default_value_t = 2)]
    engines: usize,
    /// Requests the router admits at once (`--max-concurrent-requests`).
    #[arg(long, default_value_t = 16)]
    admitted: usize,
    /// Clients at once, as a multiple of `--admitted`.
    #[arg(long, default_value_t = 10)]
    factor: usize,
    /// Tokens each answer streams.
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// The engines' time per generated token, milliseconds.
    #[arg(long, default_value_t = 10)]
    decode_ms: u64,
    /// Exit non-zero unless every admitted request succeeded, every other was refused with
    /// 429 or 503 within this many milliseconds, and every hung-up request was cancelled.
    #[arg(long)]
    check_refusal_ms: Option<u64>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// One client's request.
#[derive(Debug, Clone, Copy)]
struct Outcome {
    status: u16,
    /// Until the status line.
    head: Duration,
    /// Until the end of the stream (or the hang-up).
    total: Duration,
    /// The stream ended with `[DONE]`.
    whole: bool,
}

/// A wave's figures.
#[derive(Debug, Default, Serialize)]
struct Wave {
    name: String,
    clients: usize,
    ok: usize,
    refused_429: usize,
    refused_503: usize,
    other: usize,
    /// 200s whose stream did not end whole (must be 0 unless hung up on).
    broken: usize,
    ok_p50_ms: f64,
    ok_p99_ms: f64,
    refused_p50_ms: f64,
    refused_p99_ms: f64,
    rss_peak_kib: u64,
    fds_peak: usize,
    /// Streams the engines saw cancelled during the wave.
    engine_cancelled: u64,
}

/// Runs the benchmark and prints its table.
pub(crate) fn run(args: &OverloadArgs) -> Result<()> {
    if !args.router_bin.exists() {
        bail!("--router-bin {}: not found (cargo build --release -p sgl-router)", args.router_bin.display());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(bench(args))
}

async fn bench(args: &OverloadArgs) -> Result<()> {
    let mut engines = Vec::new();
    for _ in 0..args.engines {
        let cfg = MockEngineConfig {
            kv_events: false,
            decode_per_token: Duration::from_millis(args.decode_ms),
            prefill_fixed: Duration::from_millis(2),
            default_max_tokens: args.max_tokens,
            ..MockEngineConfig::default()
        };
        engines.push(MockEngine::spawn(cfg).await?);
    }
    let mut flags: Vec<String> = vec![
        "--policy".into(),
        "round_robin".into(),
        "--max-concurrent-requests".into(),
        args.admitted.to_string(),
        "--queue-size".into(),
        "0".into(),
        "--log-level".into(),
        "error".into(),
        "--worker-urls".into(),
    ];
    flags.extend(engines.iter().map(MockEngine::url));
    let router = RouterProc::spawn(&args.router_bin, "router", &flags)?;
    let http = reqwest::Client::builder().pool_max_idle_per_host(0).build()?;
    router.wait_ready(&http).await?;
    let rss_before = router.rss_kib().unwrap_or(0);
    let fds_before = router.open_fds().unwrap_or(0);
    let cancelled = || engines.iter().map(|e| e.engine().cancelled_streams.load(Ordering::Relaxed)).sum::<u64>();

    let baseline = wave(&http, &router, "alone: the admitted number", args.admitted, false, &cancelled).await;
    let over = wave(&http, &router, "overload", args.admitted * args.factor, false, &cancelled).await;
    let hangup = wave(&http, &router, "overload, clients hang up", args.admitted * args.factor, true, &cancelled).await;
    // Every hung-up stream's cancellation reaches its engine shortly.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut hangup = hangup;
    let wanted = hangup.ok as u64;
    let start = cancelled() - hangup.engine_cancelled;
    while cancelled() - start < wanted && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    hangup.engine_cancelled = cancelled() - start;
    // Settled: in-flight gone, memory and descriptors back.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = wave(&http, &router, "after: the admitted number", args.admitted, false, &cancelled).await;
    let (rss_after, fds_after) = (router.rss_kib().unwrap_or(0), router.open_fds().unwrap_or(0));

    let waves = [baseline, over, hangup, after];
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"waves": waves, "rss_before_kib": rss_before, "rss_after_kib": rss_after, "fds_before": fds_before, "fds_after": fds_after})
            )?
        );
    } else {
        print_table(args, &waves, (rss_before, rss_after), (fds_before, fds_after));
    }
    if let Some(limit) = args.check_refusal_ms {
        let [base, over, hangup, after] = &waves;
        let refused = over.refused_429 + over.refused_503;
        if base.ok != args.admitted || after.ok != args.admitted || base.broken + over.broken + after.broken > 0 {
            bail!("an admitted request failed");
        }
        if over.other > 0 || refused + over.ok != over.clients || over.refused_p99_ms > limit as f64 {
            bail!("not every request past the limit was refused fast with 429/503");
        }
        if hangup.engine_cancelled < hangup.ok as u64 {
            bail!("{} hung-up streams, {} cancelled at the engines", hangup.ok, hangup.engine_cancelled);
        }
    }
    Ok(())
}

/// `clients` streamed chats at once; `hang_up`: each client drops its
/// stream after the first chunk. Samples the router's memory meanwhile.
async fn wave(
    http: &reqwest::Client,
    router: &RouterProc,
    name: &str,
    clients: usize,
    hang_up: bool,
    cancelled: &dyn Fn() -> u64,
) -> Wave {
    let cancelled_before = cancelled();
    let url = Arc::new(format!("{}/v1/chat/completions", router.url));
    let start = Arc::new(tokio::sync::Barrier::new(clients));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..clients {
        let (http, url, start) = (http.clone(), url.clone(), start.clone());
        tasks.spawn(async move {
            let body = json!({"model": "m", "stream": true,
                "messages": [{"role": "user", "content": format!("client {i}: tell me a story")}]});
            start.wait().await;
            one(&http, &url, &body, hang_up).await
        });
    }
    let (mut rss_peak, mut fds_peak) = (0, 0);
    let mut outcomes = Vec::with_capacity(clients);
    loop {
        tokio::select! {
            done = tasks.join_next() => match done {
                Some(Ok(o)) => outcomes.push(o),
                Some(Err(_)) => {}
                None => break,
            },
            _ = tokio::time::sleep(Duration::from_millis(10)) => {
                rss_peak = rss_peak.max(router.rss_kib().unwrap_or(0));
                fds_peak = fds_peak.max(router.open_fds().unwrap_or(0));
            }
        }
    }
    let ok: Vec<&Outcome> = outcomes.iter().filter(|o| o.status == 200).collect();
    let refused: Vec<&Outcome> = outcomes.iter().filter(|o| o.status == 429 || o.status == 503).collect();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let ok_ms: Vec<f64> = ok.iter().map(|o| ms(o.total)).collect();
    let refused_ms: Vec<f64> = refused.iter().map(|o| ms(o.head)).collect();
    Wave {
        name: name.to_owned(),
        clients,
        ok: ok.len(),
        refused_429: outcomes.iter().filter(|o| o.status == 429).count(),
        refused_503: outcomes.iter().filter(|o| o.status == 503).count(),
        other: outcomes.len() - ok.len() - refused.len() + (clients - outcomes.len()),
        broken: if hang_up { 0 } else { ok.iter().filter(|o| !o.whole).count() },
        ok_p50_ms: percentile(&ok_ms, 0.50),
        ok_p99_ms: percentile(&ok_ms, 0.99),
        refused_p50_ms: percentile(&refused_ms, 0.50),
        refused_p99_ms: percentile(&refused_ms, 0.99),
        rss_peak_kib: rss_peak,
        fds_peak,
        engine_cancelled: cancelled() - cancelled_before,
    }
}

/// One streamed chat; status 0 when the request failed outright.
async fn one(http: &reqwest::Client, url: &str, body: &serde_json::Value, hang_up: bool) -> Outcome {
    let t = Instant::now();
    let request = http
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .timeout(Duration::from_secs(60));
    let Ok(mut resp) = request.send().await else {
        return Outcome { status: 0, head: t.elapsed(), total: t.elapsed(), whole: false };
    };
    let (status, head) = (resp.status().as_u16(), t.elapsed());
    let mut tail = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        if hang_up && status == 200 {
            break; // dropping `resp` closes the connection mid-stream
        }
        tail.extend_from_slice(&chunk);
        if tail.len() > 64 {
            tail.drain(..tail.len() - 64);
        }
    }
    drop(resp);
    let whole = String::from_utf8_lossy(&tail).contains("[DONE]");
    Outcome { status, head, total: t.elapsed(), whole }
}

fn percentile(sorted_or_not: &[f64], q: f64) -> f64 {
    if sorted_or_not.is_empty() {
        return 0.0;
    }
    let mut v = sorted_or_not.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn print_table(args: &OverloadArgs, waves: &[Wave], rss: (u64, u64), fds: (usize, usize)) {
    println!(
        "overload: {} engines ({} ms per token, {} tokens per answer), router admits {} at once, no queue; {}x clients\n",
        args.engines, args.decode_ms, args.max_tokens, args.admitted, args.factor
    );
    println!(
        "| wave | clients | 200 | 429 | 503 | other | broken 200s | 200 p50 / p99 (ms) | refused p50 / p99 (ms) | router RSS peak (MiB) | fds peak | cancelled at engines |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for w in waves {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.0} / {:.0} | {:.1} / {:.1} | {:.1} | {} | {} |",
            w.name,
            w.clients,
            w.ok,
            w.refused_429,
            w.refused_503,
            w.other,
            w.broken,
            w.ok_p50_ms,
            w.ok_p99_ms,
            w.refused_p50_ms,
            w.refused_p99_ms,
            w.rss_peak_kib as f64 / 1024.0,
            w.fds_peak,
            w.engine_cancelled
        );
    }
    println!(
        "\nrouter RSS {:.1} MiB before, {:.1} MiB after; open descriptors {} before, {} after",
        rss.0 as f64 / 1024.0,
        rss.1 as f64 / 1024.0,
        fds.0,
        fds.1
    );
}
