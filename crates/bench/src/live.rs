//! `live`: replays a Mooncake trace as real HTTP requests, time-compressed,
//! against any OpenAI-compatible router URL (ours or a peer) in front of
//! simulated engines, and reads `usage.prompt_tokens_details.cached_tokens`
//! from each response. The same harness measures every router.
//!
//! Each trace block id becomes the same 512 bytes of lowercase text every time
//! it appears, so equal ids give equal prefixes; with the engines' built-in
//! byte-level tokenizer one byte is one token, and token-id prompts (the
//! default) are exactly those bytes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::trace::{TRACE_BLOCK, TraceRequest};

/// How prompts are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum PromptForm {
    /// `/v1/completions` with `prompt` as token ids.
    Tokens,
    /// `/v1/completions` with `prompt` as text.
    Text,
}

/// How a replay runs.
#[derive(Debug, Clone)]
pub(crate) struct LiveConfig {
    /// Trace time is divided by this.
    pub(crate) speedup: f64,
    /// Most requests in flight (later arrivals wait, and their wait counts).
    pub(crate) max_in_flight: usize,
    /// Prompt form.
    pub(crate) form: PromptForm,
    /// Per-request timeout.
    pub(crate) timeout: Duration,
    /// Generate the trace's output lengths, capped at this (0: one token, TTFT is the whole answer).
    pub(crate) max_output: u64,
    /// Stream answers: TTFT is the first event; throughput counts every token.
    pub(crate) stream: bool,
    /// The router's `/metrics` base URL, read after the run (sgl-router only).
    pub(crate) metrics: Option<String>,
}

/// One router's result.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LiveResult {
    pub(crate) target: String,
    pub(crate) requests: usize,
    pub(crate) errors: usize,
    /// Cached prompt tokens over all prompt tokens, as the engines reported them.
    pub(crate) hit_rate: f64,
    /// Latency of a one-token completion, from the scheduled arrival.
    pub(crate) ttft_mean_s: f64,
    pub(crate) ttft_p50_s: f64,
    pub(crate) ttft_p99_s: f64,
    /// Whole-answer latency, from the scheduled arrival.
    pub(crate) e2e_mean_s: f64,
    /// Generated tokens per second of wall time.
    pub(crate) output_tokens_per_s: f64,
    pub(crate) wall_s: f64,
    /// The router's routing regret (`/metrics`, sgl-router only): prompt tokens the best
    /// eligible worker held more than the chosen one, over the prompt tokens sent.
    pub(crate) regret: Option<f64>,
    /// Cached tokens the router predicted over those the engines reported (sgl-router only).
    pub(crate) predicted_over_observed: Option<f64>,
}

/// A counter's value in a Prometheus text exposition (`series` with its labels as written).
fn series(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The routing regret (tokens) and the predicted and observed cached tokens the router at
/// `base` counted, when it counts them.
async fn router_counts(client: &reqwest::Client, base: &str) -> Option<(f64, f64, f64)> {
    let text = client.get(format!("{base}/metrics")).send().await.ok()?.text().await.ok()?;
    let reachable = series(&text, "router_routing_prefix_tokens_total{held=\"reachable\"}")?;
    let chosen = series(&text, "router_routing_prefix_tokens_total{held=\"chosen\"}")?;
    let predicted = series(&text, "router_cached_tokens_total{source=\"predicted\"}")?;
    let observed = series(&text, "router_cached_tokens_total{source=\"observed\"}")?;
    Some((reachable - chosen, predicted, observed))
}

/// The prompt of a trace request: one 512-byte block of text per hash id, the
/// last one cut to the request's length.
pub(crate) fn prompt_bytes(r: &TraceRequest) -> Vec<u8> {
    let mut out = Vec::with_capacity(r.input_length as usize);
    for &id in &r.hash_ids {
        let mut x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for _ in 0..TRACE_BLOCK {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.push(b'a' + (x % 26) as u8);
        }
    }
    out.truncate(r.input_length.max(1) as usize);
    out
}

fn body(r: &TraceRequest, cfg: &LiveConfig) -> Value {
    let bytes = prompt_bytes(r);
    let prompt = match cfg.form {
        PromptForm::Tokens => json!(bytes.iter().map(|b| u32::from(*b)).collect::<Vec<_>>()),
        PromptForm::Text => json!(String::from_utf8_lossy(&bytes)),
    };
    let max_tokens = if cfg.max_output == 0 { 1 } else { r.output_length.clamp(1, cfg.max_output) };
    let mut v = json!({"model": "default", "prompt": prompt, "max_tokens": max_tokens});
    if cfg.stream {
        v["stream"] = json!(true);
        v["stream_options"] = json!({"include_usage": true});
    }
    v
}

/// One answer: time to its first byte (first event when streamed), to its
/// end, prompt, cached and generated tokens; `None` for a failed one.
async fn one(
    client: &reqwest::Client,
    url: &str,
    body: Vec<u8>,
    arrived: Instant,
) -> Option<(Duration, Duration, u64, u64, u64)> {
    let mut resp = client.post(url).header("content-type", "application/json").body(body).send().await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let mut first = None;
    let mut bytes = Vec::new();
    while let Some(chunk) = resp.chunk().await.ok()? {
        first.get_or_insert_with(|| arrived.elapsed());
        bytes.extend_from_slice(&chunk);
    }
    let end = arrived.elapsed();
    // The usage: the body's, or the last event's that has one.
    let text = String::from_utf8_lossy(&bytes);
    let usage = if text.trim_start().starts_with("data:") {
        text.split("\n\n")
            .filter_map(|e| e.trim().strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .filter_map(|v| v.get("usage").filter(|u| u.is_object()).cloned())
            .last()?
    } else {
        serde_json::from_str::<Value>(&text).ok()?.get("usage")?.clone()
    };
    let prompt = usage.get("prompt_tokens")?.as_u64()?;
    let cached = usage.pointer("/prompt_tokens_details/cached_tokens").and_then(Value::as_u64).unwrap_or(0);
    let generated = usage.get("completion_tokens").and_then(Value::as_u64).unwrap_or(0);
    Some((first?, end, prompt, cached, generated))
}

/// Replays `trace` against `base` (a router URL).
pub(crate) async fn replay(target: &str, base: &str, trace: &[TraceRequest], cfg: &LiveConfig) -> Result<LiveResult> {
    if trace.is_empty() {
        bail!("empty trace");
    }
    let client = reqwest::Client::builder().timeout(cfg.timeout).build()?;
    let url = format!("{base}/v1/completions");
    let limit = Arc::new(Semaphore::new(cfg.max_in_flight.max(1)));
    let t0 = trace[0].timestamp;
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(trace.len());
    for r in trace {
        let at = start + Duration::from_secs_f64((r.timestamp - t0) as f64 / 1000.0 / cfg.speedup.max(1e-9));
        tokio::time::sleep_until(at).await;
        let arrived = Instant::now();
        let permit = limit.clone().acquire_owned().await?;
        let (client, url, body) = (client.clone(), url.clone(), serde_json::to_vec(&body(r, cfg))?);
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            one(&client, &url, body, arrived).await
        }));
    }
    let (mut lat, mut e2e, mut prompt, mut cached, mut generated, mut errors) =
        (Vec::new(), 0f64, 0u64, 0u64, 0u64, 0usize);
    for t in tasks {
        match t.await? {
            Some((first, end, p, c, g)) => {
                // Without streaming the first byte is the whole answer: one token, or all of them.
                lat.push(first.as_secs_f64());
                e2e += end.as_secs_f64();
                prompt += p;
                cached += c;
                generated += g;
            }
            None => errors += 1,
        }
    }
    let wall_s = start.elapsed().as_secs_f64();
    let counts = match &cfg.metrics {
        Some(m) => router_counts(&client, m).await,
        None => None,
    };
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| lat.get(((lat.len() as f64 - 1.0).max(0.0) * p).round() as usize).copied().unwrap_or(0.0);
    Ok(LiveResult {
        target: target.to_string(),
        requests: lat.len(),
        errors,
        hit_rate: cached as f64 / prompt.max(1) as f64,
        ttft_mean_s: lat.iter().sum::<f64>() / lat.len().max(1) as f64,
        ttft_p50_s: pct(0.5),
        ttft_p99_s: pct(0.99),
        e2e_mean_s: e2e / lat.len().max(1) as f64,
        output_tokens_per_s: generated as f64 / wall_s.max(1e-9),
        wall_s,
        regret: counts.map(|(lost, _, _)| lost / prompt.max(1) as f64),
        predicted_over_observed: counts.filter(|c| c.2 > 0.0).map(|(_, p, o)| p / o),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(ids: Vec<u64>, len: u64) -> TraceRequest {
        TraceRequest { timestamp: 0, input_length: len, output_length: 1, hash_ids: ids }
    }

    #[test]
    fn equal_ids_give_equal_prefixes() {
        let a = prompt_bytes(&req(vec![1, 2, 3], 1300));
        let b = prompt_bytes(&req(vec![1, 2, 9], 1400));
        assert_eq!((a.len(), b.len()), (1300, 1400));
        assert_eq!(a[..1024], b[..1024], "blocks 1 and 2 shared");
        assert_ne!(a[1024..1100], b[1024..1100], "block 3 differs");
        assert!(a.iter().all(u8::is_ascii_lowercase));
        assert_ne!(prompt_bytes(&req(vec![1], 512)), prompt_bytes(&req(vec![2], 512)));
    }
}
