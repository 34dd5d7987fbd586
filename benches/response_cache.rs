//! The response cache's lookup with 10,000 answers stored (`gateway::cache`): an exact hit, an
//! exact miss, and a semantic lookup (384-dimensional vectors, all-MiniLM-L6-v2's size), both
//! when every entry shares the request's partition (one system prompt for all: the scan
//! compares all 10,000 vectors, the worst case) and when none does (requests with different
//! histories). Also what preparing a request's ticket costs (its canonical form and hashes),
//! and what giving an answer its `x-route-id` costs with 100,000 route ids held (the bound:
//! each new one pushes the oldest out).
//!   cargo bench -p sgl-router-benches --bench response_cache

use std::sync::Arc;

use axum::body::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use gateway::cache::{Answer, Asker, Outcome, Store};
use router_types::SplitMix;
use serde_json::{Value, json};

const ENTRIES: usize = 10_000;
/// An anonymous caller's chat under the decision `faq`, pool `small`.
const AT: Asker<'static> =
    Asker { caller: None, route: "/v1/chat/completions", decision: "faq", pool: "small", shared: None };

/// A complete answer of about 512 bytes (only complete answers are kept).
fn answer_body() -> Vec<u8> {
    json!({"choices": [{"index": 0, "message": {"content": "x".repeat(440)}, "finish_reason": "stop"}]})
        .to_string()
        .into_bytes()
}
const DIM: usize = 384;

fn request(system: &str, question: &str) -> Value {
    json!({"model": "auto", "temperature": 0, "max_tokens": 64,
           "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]})
}

fn unit(rng: &mut SplitMix) -> Arc<[f32]> {
    let v: Vec<f32> = (0..DIM).map(|_| rng.uniform() as f32 - 0.5).collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter().map(|x| x / norm).collect()
}

/// A store of `ENTRIES` answers; with `shared`, one system prompt for all.
fn filled(shared: bool, rng: &mut SplitMix) -> Arc<Store> {
    let config = model_select::ResponseCache {
        semantic: true,
        threshold: 0.95,
        ttl_secs: 3600,
        max_entries: ENTRIES,
        max_answer_bytes: 1 << 20,
        max_bytes: 64 << 20,
        allow_sampling: false,
    };
    let store = Arc::new(Store::new(&config, "faq", Arc::new(gateway::pools::RoutingMetrics::new())));
    for i in 0..ENTRIES {
        let system = if shared { "You answer questions about our product.".to_owned() } else { format!("Tenant {i}.") };
        let v = request(&system, &format!("question number {}", words(i)));
        let ticket = store.ticket(&v, AT, Some(unit(rng))).expect("cacheable");
        ticket.store(Answer { status: 200, content_type: None, body: Bytes::from(answer_body()) });
    }
    assert_eq!(store.len(), ENTRIES);
    store
}

/// `i` spelled with letters (a question with digits is never looked up semantically).
fn words(i: usize) -> String {
    format!("{i}").bytes().map(|b| (b'a' + (b - b'0')) as char).collect()
}

fn bench(c: &mut Criterion) {
    let mut rng = SplitMix::new(7);
    let mut g = c.benchmark_group("response_cache_10k");
    for (name, shared) in [("one_partition", true), ("own_partitions", false)] {
        let store = filled(shared, &mut rng);
        let system = if shared { "You answer questions about our product.".to_owned() } else { "Tenant 5.".to_owned() };
        let hit = request(&system, &format!("question number {}", words(5)));
        let miss = request(&system, "a question nobody asked");
        let hit_ticket = store.ticket(&hit, AT, None).unwrap();
        assert!(matches!(hit_ticket.lookup(), Outcome::Exact(_)));
        g.bench_function(format!("{name}/exact_hit"), |b| b.iter(|| hit_ticket.lookup()));
        let semantic = store.ticket(&miss, AT, Some(unit(&mut rng))).unwrap();
        assert!(matches!(semantic.lookup(), Outcome::Miss), "random vectors are not similar");
        g.bench_function(format!("{name}/semantic_miss"), |b| b.iter(|| semantic.lookup()));
        g.bench_function(format!("{name}/ticket"), |b| {
            b.iter(|| store.ticket(std::hint::black_box(&miss), AT, None).is_ok())
        });
    }
    g.finish();
    let learning = gateway::pools::feedback::Learning::new(Default::default()).expect("no state file");
    for _ in 0..100_000 {
        learning.issue("chat", "small", Some(0.7));
    }
    c.bench_function("route_id/issue_with_100k_held", |b| b.iter(|| learning.issue("chat", "small", Some(0.7))));
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = bench
}
criterion_main!(benches);
