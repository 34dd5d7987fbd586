//! One routed request per iteration (`select`, then `commit`, as the gateway
//! does) over n healthy workers, with the reference router's names:
//! `policy_select::{round_robin,random,power_of_two}/{4,16,64,256}`, plus
//! `least_load`, `cache_aware` and `min_ttft` (a third of the workers hold
//! part of the prompt, loads vary) and `approx_tree` (a 2 KiB prompt sharing a system
//! prompt with earlier requests; includes the tree match and, in `commit`, the insert),
//! and `cache_aware_head_hash_16k` (`--cache-index hash`: a 16,384-token prompt's heads hashed,
//! matched and placed).
//!
//! Run: `cargo bench -p sgl-router-benches --bench policy_select`.
//! Last result: docs/benchmarks.md.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use policy::{
    ApproxTreeConfig, ApproxTreePolicy, CacheAware, CacheAwareConfig, Candidate, Decision, ExpectedWait,
    HeadHashConfig, LeastLoad, Load, LoadMetric, MinTtft, MinTtftConfig, Policy, PowerOfTwo, Random, RequestInfo,
    RoundRobin,
};
use router_types::WorkerId;

fn candidates(n: usize) -> Vec<Candidate> {
    (0..n)
        .map(|i| Candidate {
            worker: WorkerId(i as u32),
            load: Load { in_flight: (i * 7 % 13) as u32, uncached_tokens: (i * 1543 % 9000) as u64 },
            matched_tokens: if i % 3 == 0 { ((i * 911) % 8000) as u64 + 1024 } else { 0 },
            followed: true,
            warmup: Default::default(),
            kv_usage: None,
            report: None,
        })
        .collect()
}

/// What the gateway does for a request it sends: select, then commit.
fn route(p: &dyn Policy, cs: &[Candidate], req: &RequestInfo<'_>) -> Decision {
    let d = p.select(cs, req).unwrap();
    p.commit(&d, cs, req);
    d
}

fn bench(c: &mut Criterion) {
    let policies: Vec<Box<dyn Policy>> = vec![
        Box::new(RoundRobin::default()),
        Box::new(Random::new(1)),
        Box::new(PowerOfTwo::new(2, LoadMetric::default(), ExpectedWait::default())),
        Box::new(LeastLoad::default()),
        Box::new(CacheAware::new(CacheAwareConfig::default(), 3)),
        Box::new(MinTtft::new(MinTtftConfig::default())),
    ];
    let mut g = c.benchmark_group("policy_select");
    for p in &policies {
        for n in [4usize, 16, 64, 256] {
            let cs = candidates(n);
            let req = RequestInfo { input_tokens: 8192, text: None, at_ms: 0, heads: &[] };
            g.bench_with_input(BenchmarkId::new(p.name(), n), &cs, |b, cs| b.iter(|| route(&**p, black_box(cs), &req)));
        }
    }
    let system = "You are a helpful assistant for the serving team. ".repeat(20);
    for n in [4usize, 16, 64, 256] {
        let p = ApproxTreePolicy::new(ApproxTreeConfig::default());
        let cs = candidates(n);
        for i in 0..n * 4 {
            let text = format!("{system} earlier question {i}");
            route(&p, &cs, &RequestInfo { input_tokens: 0, text: Some(&text), at_ms: 0, heads: &[] });
        }
        let mut i = 0u64;
        g.bench_with_input(BenchmarkId::new("approx_tree", n), &cs, |b, cs| {
            b.iter(|| {
                i += 1;
                let text = format!("{system} question {}", i % 512);
                route(&p, black_box(cs), &RequestInfo { input_tokens: 0, text: Some(&text), at_ms: 0, heads: &[] })
            })
        });
    }
    // cache_aware's head map (`--cache-index hash`) over workers without KV events: a 16 KiB
    // prompt of the built-in tokenizer (16,384 tokens, 80 % shared by one of 8 groups), its
    // heads hashed, then select and commit.
    for n in [4usize, 16, 64] {
        let config =
            HeadHashConfig { boundaries: HeadHashConfig::powers_of_two(16), ttl_ms: 180_000, max_bytes: 32 << 20 };
        let p = CacheAware::new(CacheAwareConfig::default(), 3).with_head_hashes(config);
        let cs: Vec<Candidate> = candidates(n).into_iter().map(|c| Candidate { followed: false, ..c }).collect();
        let prompts: Vec<Vec<u32>> = (0..64u32)
            .map(|i| {
                (0..16_384u32).map(|t| if t < 13_107 { (i % 8) * 100_000 + t } else { i * 1_000_000 + t }).collect()
            })
            .collect();
        let mut i = 0usize;
        g.bench_with_input(BenchmarkId::new("cache_aware_head_hash_16k", n), &cs, |b, cs| {
            b.iter(|| {
                i += 1;
                let heads = p.heads(black_box(&prompts[i % 64]));
                route(&p, black_box(cs), &RequestInfo { input_tokens: 16_384, text: None, at_ms: 0, heads: &heads })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
