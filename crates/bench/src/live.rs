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
    pub(crate) wall_s: f64,
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

fn body(r: &TraceRequest, form: PromptForm) -> Value {
    let bytes = prompt_bytes(r);
    let prompt = match form {
        PromptForm::Tokens => json!(bytes.iter().map(|b| u32::from(*b)).collect::<Vec<_>>()),
        PromptForm::Text => json!(String::from_utf8_lossy(&bytes)),
    };
    json!({"model": "default", "prompt": prompt, "max_tokens": 1})
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
        let (client, url, body) = (client.clone(), url.clone(), serde_json::to_vec(&body(r, cfg.form))?);
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            let resp = client.post(&url).header("content-type", "application/json").body(body).send().await.ok()?;
            if !resp.status().is_success() {
                return None;
            }
            let v: Value = serde_json::from_slice(&resp.bytes().await.ok()?).ok()?;
            let usage = v.get("usage")?;
            let prompt = usage.get("prompt_tokens")?.as_u64()?;
            let cached = usage.pointer("/prompt_tokens_details/cached_tokens").and_then(Value::as_u64).unwrap_or(0);
            Some((arrived.elapsed(), prompt, cached))
        }));
    }
    let (mut lat, mut prompt, mut cached, mut errors) = (Vec::new(), 0u64, 0u64, 0usize);
    for t in tasks {
        match t.await? {
            Some((l, p, c)) => {
                lat.push(l.as_secs_f64());
                prompt += p;
                cached += c;
            }
            None => errors += 1,
        }
    }
    let wall_s = start.elapsed().as_secs_f64();
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
        wall_s,
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
