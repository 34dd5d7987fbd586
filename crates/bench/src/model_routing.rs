//! `sgl-router-bench model-routing`: the cost and expected quality of
//! answering labelled prompts (MT-Bench's questions and their categories)
//! through a router in front of a small and a large simulated model, for four
//! strategies: always the small model, always the large one, the router's
//! `model: "auto"`, and routing by the true labels. Cost comes from the
//! answers' own token usage and the stated prices; quality from a stated
//! per-category table (an assumption: no registry data set grades answers).
//! Reports "cost saved at equal quality" (against a random mix of the two
//! models reaching the router's quality) and RouteLLM's performance gap
//! recovered, `(Q_router - Q_small) / (Q_large - Q_small)`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use serde_json::{Value, json};

/// The command's arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct ModelRoutingArgs {
    /// The router (with the two pools), e.g. http://127.0.0.1:31100.
    #[arg(long)]
    router: String,
    /// MT-Bench's `question.jsonl` (question_id, category, turns).
    #[arg(long)]
    questions: PathBuf,
    /// The quality and price table (JSON: quality per pool and category, prices, models, label_routes).
    #[arg(long)]
    table: PathBuf,
    /// Tokens each answer generates.
    #[arg(long, default_value_t = 64)]
    max_tokens: u64,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Deserialize)]
struct Question {
    category: String,
    turns: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct Price {
    input_per_1m: f64,
    output_per_1m: f64,
}

#[derive(Debug, Deserialize)]
struct Table {
    quality: BTreeMap<String, BTreeMap<String, f64>>,
    label_routes: BTreeMap<String, String>,
    models: BTreeMap<String, String>,
    prices: BTreeMap<String, Price>,
}

/// One strategy's totals.
#[derive(Debug, Default, Clone)]
struct Outcome {
    cost: f64,
    quality: f64,
    requests: usize,
    /// Requests per pool.
    pools: BTreeMap<String, usize>,
    /// Requests to the large pool per category.
    large_by_category: BTreeMap<String, usize>,
}

impl Outcome {
    fn mean_quality(&self) -> f64 {
        self.quality / self.requests.max(1) as f64
    }
}

/// Runs the four strategies and prints their table.
pub(crate) async fn run(args: &ModelRoutingArgs) -> Result<()> {
    let table: Table = serde_json::from_str(&std::fs::read_to_string(&args.table).context("reading --table")?)
        .context("parsing --table")?;
    let questions: Vec<Question> = std::fs::read_to_string(&args.questions)
        .context("reading --questions")?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .context("parsing --questions")?;
    if questions.is_empty() {
        bail!("no questions");
    }
    let http = reqwest::Client::new();
    let mut results: Vec<(&str, Outcome)> = Vec::new();
    for strategy in ["always_small", "always_large", "router", "true_labels"] {
        let mut out = Outcome::default();
        for q in &questions {
            let pool = match strategy {
                "always_small" => Some("small"),
                "always_large" => Some("large"),
                "true_labels" => Some(
                    table
                        .label_routes
                        .get(&q.category)
                        .or_else(|| table.label_routes.get("_default"))
                        .map_or("small", String::as_str),
                ),
                _ => None,
            };
            let model = pool.map_or("auto", |p| table.models.get(p).map_or(p, String::as_str));
            let body = json!({"model": model, "max_tokens": args.max_tokens,
                              "messages": [{"role": "user", "content": q.turns.first().cloned().unwrap_or_default()}]});
            let r = http
                .post(format!("{}/v1/chat/completions", args.router))
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&body)?)
                .send()
                .await
                .context("sending a question")?;
            let status = r.status();
            let served = r.headers().get("x-route-pool").and_then(|v| v.to_str().ok()).map(str::to_owned);
            let answer: Value = serde_json::from_slice(&r.bytes().await.context("reading an answer")?)?;
            if !status.is_success() {
                bail!("{strategy}: the router answered {status}: {answer}");
            }
            let served = served.or(pool.map(str::to_owned)).context("no x-route-pool on a routed answer")?;
            let usage = &answer["usage"];
            let (input, output) =
                (usage["prompt_tokens"].as_f64().unwrap_or(0.0), usage["completion_tokens"].as_f64().unwrap_or(0.0));
            let price = table.prices.get(&served).with_context(|| format!("no price for pool {served}"))?;
            out.cost += (input * price.input_per_1m + output * price.output_per_1m) / 1e6;
            out.quality += table.quality.get(&served).and_then(|t| t.get(&q.category)).copied().unwrap_or(0.0);
            out.requests += 1;
            *out.pools.entry(served.clone()).or_insert(0) += 1;
            if served == "large" {
                *out.large_by_category.entry(q.category.clone()).or_insert(0) += 1;
            }
        }
        results.push((strategy, out));
    }
    report(&results, questions.len(), args.json);
    Ok(())
}

fn report(results: &[(&str, Outcome)], n: usize, as_json: bool) {
    let get = |name: &str| results.iter().find(|(s, _)| *s == name).map(|(_, o)| o.clone()).unwrap_or_default();
    let (small, large, router) = (get("always_small"), get("always_large"), get("router"));
    let (qs, ql, qr) = (small.mean_quality(), large.mean_quality(), router.mean_quality());
    let gap = ql - qs;
    let pgr = if gap > 0.0 { (qr - qs) / gap } else { 0.0 };
    // A random mix sending a fraction f to the large model reaches qs + f·gap; at the router's quality:
    let f = if gap > 0.0 { ((qr - qs) / gap).clamp(0.0, 1.0) } else { 0.0 };
    let mix_cost = small.cost + f * (large.cost - small.cost);
    let saved = if mix_cost > 0.0 { 1.0 - router.cost / mix_cost } else { 0.0 };
    if as_json {
        let rows: Vec<Value> = results
            .iter()
            .map(
                |(s, o)| json!({"strategy": s, "cost_usd": o.cost, "mean_quality": o.mean_quality(), "pools": o.pools}),
            )
            .collect();
        let v = json!({"questions": n, "strategies": rows, "performance_gap_recovered": pgr,
                       "cost_saved_at_equal_quality": saved, "router_large_by_category": router.large_by_category});
        println!("{v}");
        return;
    }
    println!("{n} questions, first turns\n");
    println!("| strategy | cost (USD) | cost vs always_large | mean quality | to small | to large |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (s, o) in results {
        println!(
            "| {s} | {:.6} | {:.2}x | {:.4} | {} | {} |",
            o.cost,
            o.cost / large.cost.max(f64::MIN_POSITIVE),
            o.mean_quality(),
            o.pools.get("small").copied().unwrap_or(0),
            o.pools.get("large").copied().unwrap_or(0)
        );
    }
    println!();
    println!("performance gap recovered (router): {pgr:.3}");
    println!(
        "cost saved at equal quality (router against a random small/large mix of its quality, {:.0}% large): {:.1}%",
        f * 100.0,
        saved * 100.0
    );
    let by_cat: Vec<String> = router.large_by_category.iter().map(|(c, k)| format!("{c} {k}")).collect();
    println!("router's large-pool picks by category: {}", by_cat.join(", "));
}
