//! `--enable-igw` (SGLang Model Gateway's inference-gateway mode): model
//! pools without a routing config, one per model the workers serve, each
//! worker's model read from its own `GET /v1/models` at start. A request's
//! `model` then picks the pool; there is no auto name and no decision.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, bail};
use model_select::{Config, PoolConfig};
use router_types::WorkerUrl;
use serde_json::Value;

use crate::config::{PolicyConfig, PoolSetup, RoutingSetup};

/// How long a worker's `/v1/models` may stay unreadable at start.
const DISCOVERY_DEADLINE: Duration = Duration::from_secs(30);

/// Reads each worker's model and groups the workers into pools (the pool
/// serving `model_id` is the default one, else the first found).
pub(crate) async fn discover(
    workers: &[WorkerUrl],
    client: &reqwest::Client,
    policy: &PolicyConfig,
    model_id: &str,
) -> anyhow::Result<RoutingSetup> {
    if workers.is_empty() {
        bail!("--enable-igw: no workers to read models from (give --worker-urls)");
    }
    // Every worker at once: one slow to start delays the others by nothing.
    let reads: Vec<_> = workers
        .iter()
        .map(|w| {
            let (client, w) = (client.clone(), w.clone());
            tokio::spawn(async move { model_of(&client, &w).await })
        })
        .collect();
    let mut models = Vec::with_capacity(reads.len());
    for r in reads {
        models.push(r.await.map_err(|e| anyhow::anyhow!("a model read failed: {e}"))?);
    }
    let mut by_model: BTreeMap<String, Vec<WorkerUrl>> = BTreeMap::new();
    let mut order = Vec::new();
    for (w, model) in workers.iter().zip(models) {
        let model = model.with_context(|| format!("--enable-igw: the model of worker {w}"))?;
        if !by_model.contains_key(&model) {
            order.push(model.clone());
        }
        by_model.entry(model).or_default().push(w.clone());
    }
    let pools: Vec<PoolSetup> = order
        .iter()
        .map(|m| PoolSetup {
            name: m.clone(),
            served_model: m.clone(),
            workers: by_model[m].clone(),
            policy: policy.clone(),
            tokenizer_path: None,
            chat_template: None,
            context_window: None,
            pd: None,
        })
        .collect();
    let default_pool = order.iter().find(|m| *m == model_id).unwrap_or(&order[0]).clone();
    let config = Config {
        auto_model_names: Vec::new(),
        default_pool: Some(default_pool),
        pools: pools
            .iter()
            .map(|p| PoolConfig {
                name: p.name.clone(),
                served_model: p.served_model.clone(),
                workers: p.workers.iter().map(ToString::to_string).collect(),
                policy: None,
                tokenizer_path: None,
                chat_template: None,
                context_window: None,
                price: None,
                quality: None,
                prefill_tokens_per_s: None,
                disaggregation: None,
                prefill: Vec::new(),
                decode: Vec::new(),
                decode_policy: None,
            })
            .collect(),
        ..Config::default()
    };
    model_select::validate(&config).map_err(|problems| {
        let problems: Vec<String> = problems.iter().map(ToString::to_string).collect();
        anyhow::anyhow!("--enable-igw: the workers' models make no valid pools: {}", problems.join("; "))
    })?;
    Ok(RoutingSetup { config, pools, source: None })
}

/// The first model `worker` lists in `/v1/models`, retried until the deadline.
async fn model_of(client: &reqwest::Client, worker: &WorkerUrl) -> anyhow::Result<String> {
    let deadline = tokio::time::Instant::now() + DISCOVERY_DEADLINE;
    let url = format!("{}/v1/models", worker.as_str().trim_end_matches('/'));
    loop {
        let answer = async {
            let r = client.get(&url).send().await?.error_for_status()?;
            let bytes = fleet::read_capped(r)
                .await
                .ok_or_else(|| anyhow::anyhow!("{url}: no answer of at most {} bytes", fleet::MAX_ANSWER_BYTES))?;
            let v: Value = serde_json::from_slice(&bytes)?;
            let id = v["data"].as_array().and_then(|d| d.first()).and_then(|m| m["id"].as_str());
            id.map(str::to_owned).ok_or_else(|| anyhow::anyhow!("{url} lists no model"))
        };
        match answer.await {
            Ok(model) => return Ok(model),
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(e.context(format!("reading {url}"))),
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}
