//! `sgl-router-bench model-routing`: the cost and expected quality of
//! answering labelled prompts (MT-Bench's questions and their categories)
//! through a router in front of a small and a large simulated model, for four
//! strategies and more: always the small model, always the large one, each
//! router's `model: "auto"`, and routing by the true labels. Cost comes from the
//! answers' own token usage and the stated prices; quality from a stated
//! per-category table (an assumption: no registry data set grades answers).
//! Reports "cost saved at equal quality" (against a random mix of the two
//! models reaching the router's quality) and RouteLLM's performance gap
//! recovered, `(Q_router - Q_small) / (Q_large - Q_small)`. Several routers
//! (routing configs) side by side; with `--feedback-passes`, a simulated user
//! judges each answer first (good with the table's quality as probability),
//! which a `bandit` decision learns from, and the measured pass comes after.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use router_types::SplitMix;
use serde::Deserialize;
use serde_json::{Value, json};

/// The command's arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct ModelRoutingArgs {
    /// A router with the two pools, `LABEL=URL` (a bare URL is labelled `router`); repeat to
    /// compare routing configs, e.g. `--router keywords=http://127.0.0.1:31100`.
    #[arg(long, required = true)]
    router: Vec<String>,
    /// MT-Bench's `question.jsonl` (question_id, category, turns).
    #[arg(long)]
    questions: PathBuf,
    /// The quality and price table (JSON: quality per pool and category, prices, models, label_routes).
    #[arg(long)]
    table: PathBuf,
    /// Tokens each answer generates.
    #[arg(long, default_value_t = 64)]
    max_tokens: u64,
    /// Passes over the questions (shuffled) before the measured one, for the routers named by
    /// `--learn`: each answer judged by a simulated user (good with the table's quality as
    /// probability) through `POST /v1/route/feedback`, what a `bandit` decision learns from.
    #[arg(long, default_value_t = 10)]
    feedback_passes: usize,
    /// The label of a router that gets the feedback passes (repeat for several).
    #[arg(long)]
    learn: Vec<String>,
    /// Seed of the shuffles and the simulated verdicts.
    #[arg(long, default_value_t = 1)]
    seed: u64,
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

/// Runs the strategies (the two fixed ones, each router, the true labels) and prints their table.
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
    let routers: Vec<(String, String)> = args
        .router
        .iter()
        .map(|r| match r.split_once('=') {
            Some((label, url)) => (label.to_owned(), url.to_owned()),
            None => ("router".to_owned(), r.clone()),
        })
        .collect();
    let ask = Ask { http: reqwest::Client::new(), table: &table, max_tokens: args.max_tokens };
    let mut rng = SplitMix::new(args.seed);
    let mut results: Vec<Row> = Vec::new();
    let first = &routers[0].1;
    for (label, pool) in [("always_small", Some("small")), ("always_large", Some("large"))] {
        let mut out = Outcome::default();
        for q in &questions {
            ask.one(first, q, pool, &mut out, None).await?;
        }
        results.push(Row { label: label.into(), measured: out, learning: None });
    }
    for (label, url) in &routers {
        let learning = if args.feedback_passes > 0 && args.learn.contains(label) {
            let mut out = Outcome::default();
            for _ in 0..args.feedback_passes {
                for i in shuffled(questions.len(), &mut rng) {
                    ask.one(url, &questions[i], None, &mut out, Some(&mut rng)).await?;
                }
            }
            Some(out)
        } else {
            None
        };
        let mut out = Outcome::default();
        for q in &questions {
            ask.one(url, q, None, &mut out, None).await?;
        }
        results.push(Row { label: label.clone(), measured: out, learning });
    }
    let mut out = Outcome::default();
    for q in &questions {
        let pool = table.label_routes.get(&q.category).or_else(|| table.label_routes.get("_default"));
        ask.one(first, q, Some(pool.map_or("small", String::as_str)), &mut out, None).await?;
    }
    results.push(Row { label: "true_labels".into(), measured: out, learning: None });
    report(&results, questions.len(), args);
    Ok(())
}

/// One strategy's row: the measured pass, and the learning passes' totals.
#[derive(Debug, Clone)]
struct Row {
    label: String,
    measured: Outcome,
    learning: Option<Outcome>,
}

/// What sending a question needs.
struct Ask<'a> {
    http: reqwest::Client,
    table: &'a Table,
    max_tokens: u64,
}

impl Ask<'_> {
    /// Sends `q`'s first turn to `pool` (`None`: `model: "auto"`), adds its cost and quality to
    /// `out`, and with `judge` sends the simulated user's verdict on the answer.
    async fn one(
        &self,
        router: &str,
        q: &Question,
        pool: Option<&str>,
        out: &mut Outcome,
        judge: Option<&mut SplitMix>,
    ) -> Result<()> {
        let model = pool.map_or("auto", |p| self.table.models.get(p).map_or(p, String::as_str));
        let body = json!({"model": model, "max_tokens": self.max_tokens,
                          "messages": [{"role": "user", "content": q.turns.first().cloned().unwrap_or_default()}]});
        let r = self
            .http
            .post(format!("{router}/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body)?)
            .send()
            .await
            .context("sending a question")?;
        let status = r.status();
        let header = |n: &str| r.headers().get(n).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let (served, route_id) = (header("x-route-pool"), header("x-route-id"));
        let answer: Value = serde_json::from_slice(&r.bytes().await.context("reading an answer")?)?;
        if !status.is_success() {
            bail!("the router answered {status}: {answer}");
        }
        let served = served.or(pool.map(str::to_owned)).context("no x-route-pool on a routed answer")?;
        let usage = &answer["usage"];
        let (input, output) =
            (usage["prompt_tokens"].as_f64().unwrap_or(0.0), usage["completion_tokens"].as_f64().unwrap_or(0.0));
        let price = self.table.prices.get(&served).with_context(|| format!("no price for pool {served}"))?;
        let quality = self.table.quality.get(&served).and_then(|t| t.get(&q.category)).copied().unwrap_or(0.0);
        out.cost += (input * price.input_per_1m + output * price.output_per_1m) / 1e6;
        out.quality += quality;
        out.requests += 1;
        *out.pools.entry(served.clone()).or_insert(0) += 1;
        if served == "large" {
            *out.large_by_category.entry(q.category.clone()).or_insert(0) += 1;
        }
        if let Some(rng) = judge {
            let id = route_id.context("no x-route-id on a routed answer")?;
            let verdict = if rng.uniform() < quality { "good" } else { "bad" };
            let r = self
                .http
                .post(format!("{router}/v1/route/feedback"))
                .header("content-type", "application/json")
                .body(json!({"route_id": id, "verdict": verdict}).to_string())
                .send()
                .await
                .context("sending feedback")?;
            if !r.status().is_success() {
                bail!("feedback refused: {} {}", r.status(), r.text().await.unwrap_or_default());
            }
        }
        Ok(())
    }
}

/// 0..n in a seeded random order (Fisher-Yates).
fn shuffled(n: usize, rng: &mut SplitMix) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    order
}

/// (performance gap recovered, the random mix's large share at that quality, cost saved against that mix).
fn against_mix(small: &Outcome, large: &Outcome, o: &Outcome) -> (f64, f64, f64) {
    let (qs, ql, q) = (small.mean_quality(), large.mean_quality(), o.mean_quality());
    let gap = ql - qs;
    let pgr = if gap > 0.0 { (q - qs) / gap } else { 0.0 };
    // A random mix sending a fraction f to the large model reaches qs + f·gap; at this quality:
    let f = pgr.clamp(0.0, 1.0);
    let per = |x: &Outcome| x.cost / x.requests.max(1) as f64;
    let mix_cost = per(small) + f * (per(large) - per(small));
    let saved = if mix_cost > 0.0 { 1.0 - per(o) / mix_cost } else { 0.0 };
    (pgr, f, saved)
}

fn report(rows: &[Row], n: usize, args: &ModelRoutingArgs) {
    let get = |name: &str| rows.iter().find(|r| r.label == name).map(|r| r.measured.clone()).unwrap_or_default();
    let (small, large) = (get("always_small"), get("always_large"));
    if args.json {
        let out: Vec<Value> = rows
            .iter()
            .map(|r| {
                let (pgr, f, saved) = against_mix(&small, &large, &r.measured);
                let learning = r.learning.as_ref().map(|l| {
                    json!({"requests": l.requests, "cost_usd": l.cost, "mean_quality": l.mean_quality(), "pools": l.pools})
                });
                json!({"strategy": r.label, "cost_usd": r.measured.cost, "mean_quality": r.measured.mean_quality(),
                       "pools": r.measured.pools, "large_by_category": r.measured.large_by_category,
                       "performance_gap_recovered": pgr, "equal_quality_mix_large_share": f,
                       "cost_saved_at_equal_quality": saved, "learning": learning})
            })
            .collect();
        println!(
            "{}",
            json!({"questions": n, "feedback_passes": args.feedback_passes, "learn": args.learn, "strategies": out})
        );
        return;
    }
    let learners = if args.learn.is_empty() { "none".to_owned() } else { args.learn.join(", ") };
    println!(
        "{n} questions, first turns; {} feedback passes before the measured one for: {learners}\n",
        args.feedback_passes
    );
    println!(
        "| strategy | cost (USD) | cost vs always_large | mean quality | PGR | cost saved at equal quality | to small | to large |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let o = &r.measured;
        let (pgr, _, saved) = against_mix(&small, &large, o);
        println!(
            "| {} | {:.6} | {:.2}x | {:.4} | {pgr:.3} | {:.1}% | {} | {} |",
            r.label,
            o.cost,
            o.cost / large.cost.max(f64::MIN_POSITIVE),
            o.mean_quality(),
            saved * 100.0,
            o.pools.get("small").copied().unwrap_or(0),
            o.pools.get("large").copied().unwrap_or(0)
        );
    }
    println!();
    for r in rows.iter().filter(|r| !["always_small", "always_large"].contains(&r.label.as_str())) {
        let by_cat: Vec<String> = r.measured.large_by_category.iter().map(|(c, k)| format!("{c} {k}")).collect();
        println!("{}: large-pool picks by category: {}", r.label, by_cat.join(", "));
        if let Some(l) = &r.learning {
            let (pgr, _, saved) = against_mix(&small, &large, l);
            println!(
                "{}: while learning ({} requests): mean quality {:.4}, PGR {pgr:.3}, cost saved at equal quality {:.1}%, to large {}",
                r.label,
                l.requests,
                l.mean_quality(),
                saved * 100.0,
                l.pools.get("large").copied().unwrap_or(0)
            );
        }
    }
}
