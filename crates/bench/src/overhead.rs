//! Router overhead: the same requests sent straight to an engine and through
//! each router, at several concurrencies and body sizes; latency percentiles,
//! throughput, and what the router adds, measured in one run.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde::Serialize;
use serde_json::json;

use crate::direct_pd::DirectPd;

/// One (target, concurrency, body size) measurement.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Row {
    pub(crate) target: String,
    pub(crate) concurrency: usize,
    pub(crate) body_bytes: usize,
    pub(crate) requests: usize,
    pub(crate) errors: usize,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) throughput_rps: f64,
}

/// A chat body of about `bytes` bytes: a fixed system prompt (repeated across
/// requests, as in production) and a unique question; one token asked for, or
/// `stream_tokens` streamed.
fn body(bytes: usize, i: usize, stream_tokens: usize) -> serde_json::Value {
    let question = format!("question number {i}");
    let system = "You are a helpful assistant. ".repeat((bytes.saturating_sub(question.len() + 120)) / 28 + 1);
    let messages = json!([{"role": "system", "content": system}, {"role": "user", "content": question}]);
    match stream_tokens {
        0 => json!({"model": "default", "max_tokens": 1, "messages": messages}),
        n => json!({"model": "default", "max_tokens": n, "stream": true, "messages": messages}),
    }
}

/// The latencies and errors of some requests to one target, and the time they took.
#[derive(Debug, Default)]
pub(crate) struct Sample {
    lat: Vec<Duration>,
    errors: usize,
    wall: Duration,
}

impl Sample {
    /// Adds another round's requests.
    pub(crate) fn merge(&mut self, other: Sample) {
        self.lat.extend(other.lat);
        self.errors += other.errors;
        self.wall += other.wall;
    }

    /// The measurement's row.
    pub(crate) fn row(mut self, target: &str, concurrency: usize, body_bytes: usize) -> Row {
        self.lat.sort();
        let lat = &self.lat;
        let pct =
            |p: f64| lat.get(((lat.len() as f64 - 1.0) * p).round() as usize).map_or(0.0, |d| d.as_secs_f64() * 1e3);
        Row {
            target: target.to_string(),
            concurrency,
            body_bytes,
            requests: lat.len(),
            errors: self.errors,
            p50_ms: pct(0.5),
            p99_ms: pct(0.99),
            throughput_rps: lat.len() as f64 / self.wall.as_secs_f64().max(1e-9),
        }
    }
}

/// Where a measurement sends.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// An engine or a router, at this base URL.
    Url(String),
    /// Both legs of a prefill/decode pair, driven by the client itself (`direct_pd`).
    DirectPd(std::sync::Arc<DirectPd>),
}

/// One request as the target takes it, built before the clock starts.
#[derive(Debug)]
enum Prepared {
    Bytes(Vec<u8>),
    Legs(crate::direct_pd::Legs),
}

impl Target {
    /// Chat body `v` as this target takes it (`room`: a PD pair's bootstrap room).
    fn prepare(&self, v: &serde_json::Value, room: u64) -> Prepared {
        match self {
            Target::Url(_) => Prepared::Bytes(serde_json::to_vec(v).unwrap_or_default()),
            Target::DirectPd(pd) => Prepared::Legs(pd.prepare(v, room)),
        }
    }

    /// Sends one prepared request, read whole; when it was answered 2xx, the time to its
    /// first body bytes (a stream's first token) if `first`, else to its end.
    async fn one(&self, client: &reqwest::Client, url: &str, p: &Prepared, first: bool) -> Option<Duration> {
        let t0 = Instant::now();
        match (self, p) {
            (Target::DirectPd(pd), Prepared::Legs(legs)) => pd.one(client, legs).await.then(|| t0.elapsed()),
            (_, Prepared::Bytes(body)) => {
                let sent = client.post(url).header("content-type", "application/json").body(body.clone()).send().await;
                let mut r = sent.ok().filter(|r| r.status().is_success())?;
                let mut at = None;
                while let Some(chunk) = r.chunk().await.ok()? {
                    if at.is_none() && !chunk.is_empty() {
                        at = Some(t0.elapsed());
                    }
                }
                if first { at } else { Some(t0.elapsed()) }
            }
            (Target::Url(_), Prepared::Legs(_)) => None,
        }
    }
}

/// Sends `requests` chat requests to `target` with `concurrency` in flight
/// (after a warm-up); `first` numbers the first one (each question is new).
pub(crate) async fn measure(
    target: &Target,
    concurrency: usize,
    body_bytes: usize,
    requests: usize,
    first: usize,
    stream_tokens: usize,
) -> Result<Sample> {
    let client =
        reqwest::Client::builder().pool_max_idle_per_host(concurrency * 2).timeout(Duration::from_secs(30)).build()?;
    let url = match target {
        Target::Url(base) => format!("{base}/v1/chat/completions"),
        Target::DirectPd(_) => String::new(),
    };
    // Bootstrap rooms unique across rounds and runs.
    let rooms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    // Warm up: connections, caches.
    for i in 0..concurrency.min(8) {
        let warm = target.prepare(&body(body_bytes, i, stream_tokens), rooms.wrapping_add(i as u64));
        if target.one(&client, &url, &warm, false).await.is_none() {
            anyhow::bail!("warm-up request to {target:?} failed");
        }
    }
    let rooms = rooms.wrapping_add(1 << 20);
    let bodies: Vec<Prepared> = (0..requests)
        .map(|i| target.prepare(&body(body_bytes, 1000 + first + i, stream_tokens), rooms.wrapping_add(i as u64)))
        .collect();
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let bodies = std::sync::Arc::new(bodies);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, url, next, bodies, target) =
            (client.clone(), url.clone(), next.clone(), bodies.clone(), target.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut errors = 0;
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= bodies.len() {
                    break;
                }
                match target.one(&client, &url, &bodies[i], stream_tokens > 0).await {
                    Some(l) => lat.push(l),
                    None => errors += 1,
                }
            }
            (lat, errors)
        }));
    }
    let mut lat: Vec<Duration> = Vec::with_capacity(requests);
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await?;
        lat.extend(l);
        errors += e;
    }
    Ok(Sample { lat, errors, wall: start.elapsed() })
}

/// Clients sending `model: "auto"` chats with unique texts to a router all along a measurement.
pub(crate) struct Background {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<(usize, usize)>>,
    clients: usize,
    start: Instant,
}

/// What the background clients got.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BackgroundTally {
    pub(crate) clients: usize,
    pub(crate) ok: usize,
    pub(crate) failed: usize,
    pub(crate) per_second: f64,
}

impl Background {
    /// Starts `clients` senders on `runtime`.
    pub(crate) fn start(runtime: &tokio::runtime::Runtime, base: &str, clients: usize) -> Background {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let url = format!("{base}/v1/chat/completions");
        let http = reqwest::Client::new();
        let tasks = (0..clients)
            .map(|c| {
                let (stop, url, http) = (stop.clone(), url.clone(), http.clone());
                runtime.spawn(async move {
                    let (mut ok, mut failed) = (0, 0);
                    let mut i = 0usize;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        i += 1;
                        // About 50 tokens, new each time: the router's embedding cache never holds it.
                        let text = format!(
                            "Client {c} asks question {i}: could you explain, in a few short paragraphs, how a \
                             sourdough starter is kept alive over a long holiday, and what to do if it smells \
                             of acetone when I come back after {i} days?"
                        );
                        let body =
                            json!({"model": "auto", "max_tokens": 1, "messages": [{"role": "user", "content": text}]});
                        let sent = http
                            .post(&url)
                            .header("content-type", "application/json")
                            .body(body.to_string())
                            .send()
                            .await;
                        let answered = match sent {
                            Ok(r) => r.status().is_success() && r.bytes().await.is_ok(),
                            Err(_) => false,
                        };
                        if answered {
                            ok += 1;
                        } else {
                            failed += 1;
                        }
                    }
                    (ok, failed)
                })
            })
            .collect();
        Background { stop, tasks, clients, start: Instant::now() }
    }

    /// Stops the senders and counts what they got.
    pub(crate) fn stop(self, runtime: &tokio::runtime::Runtime) -> BackgroundTally {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (mut ok, mut failed) = (0, 0);
        for t in self.tasks {
            if let Ok((o, f)) = runtime.block_on(t) {
                ok += o;
                failed += f;
            }
        }
        let per_second = ok as f64 / self.start.elapsed().as_secs_f64().max(1e-9);
        BackgroundTally { clients: self.clients, ok, failed, per_second }
    }
}
