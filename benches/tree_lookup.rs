//! The index's hot paths, with the reference router's grid and names.
//!
//! Run: `cargo bench -p sgl-router-benches --bench tree_lookup`.
//! - `hashtree_insert/{8,32,128,512}`: store a new chain of N blocks into an
//!   index of 64 k blocks over 16 workers.
//! - `hashtree_insert_evicting/{8,...}`: the same into an index kept full at
//!   1 M nodes, so each insert also evicts N least recently used tails.
//! - `hashtree_match_prefix/{w4_bpw32_q8,...}`: w workers each holding its own
//!   chain of bpw blocks, a q-block probe that hits one of them; `_miss` probes
//!   an unknown chain; `_shared` makes half of every chain a prefix all share.
//! - `hashtree_match_under_writes/w16_bpw64_q32`: the same probe while another
//!   thread stores and removes chains continuously.
//! - `hashtree_large/match_q64` on 1 M blocks over 16 workers; prints bytes per
//!   (block, worker) of the index to stderr.
//! - `pending_credit_and_match/{64,256}`: what `--cache-pending-prefix-ttl-ms`
//!   adds per request of a warm prefix of N pages: its match (pending included)
//!   and its credit again to the worker chosen, with a 500 ms TTL.
//!
//! Last result: docs/benchmarks.md.

use std::hint::black_box;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kv_index::{IndexConfig, KvIndex, MatchOptions, StoredBlock, SystemClock};
use router_types::{BlockHash, DpRank, Tier, WorkerKey, WorkerUrl};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// A chain of `n` blocks with random hashes (the index trusts the caller's chaining).
fn chain(rng: &mut Rng, n: usize) -> Vec<StoredBlock> {
    (0..n)
        .map(|_| {
            let h = rng.next();
            let mut digest = [0u8; 32];
            digest[..8].copy_from_slice(&h.to_be_bytes());
            StoredBlock { engine: h, digest }
        })
        .collect()
}

fn key(w: usize) -> WorkerKey {
    WorkerKey::new(WorkerUrl::new(format!("http://worker-{w}:30000")), DpRank(0))
}

fn index(max_nodes: Option<usize>) -> KvIndex {
    let config = IndexConfig { max_nodes: max_nodes.and_then(NonZeroUsize::new), ..IndexConfig::default() };
    KvIndex::new(config, Arc::new(SystemClock::new()))
}

/// w workers, each holding its own chain of `bpw` blocks, the first `shared`
/// of which are common to all (a shared system prompt).
fn populated(workers: usize, bpw: usize, shared: usize, rng: &mut Rng) -> (KvIndex, Vec<Vec<StoredBlock>>) {
    let idx = index(None);
    let common = chain(rng, shared);
    let mut chains = Vec::new();
    for w in 0..workers {
        let s = idx.stream(&key(w)).unwrap();
        let mut c = common.clone();
        c.extend(chain(rng, bpw - shared));
        idx.store(s, None, &c, Tier::Device).unwrap();
        chains.push(c);
    }
    (idx, chains)
}

fn bench_insert(c: &mut Criterion) {
    // Into an index of 64k blocks over 16 workers; every 256 inserts the
    // inserting stream is cleared outside the timed section to bound growth.
    let mut g = c.benchmark_group("hashtree_insert");
    let mut rng = Rng(0x1234_5678);
    for n in [8usize, 32, 128, 512] {
        let idx = index(None);
        let streams: Vec<_> = (0..16).map(|w| idx.stream(&key(w)).unwrap()).collect();
        for i in 0..1024 {
            idx.store(streams[i % 16], None, &chain(&mut rng, 64), Tier::Device).unwrap();
        }
        let writer = idx.stream(&key(99)).unwrap();
        let chains: Vec<Vec<StoredBlock>> = (0..256).map(|_| chain(&mut rng, n)).collect();
        g.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter_custom(|iters| {
                let mut total = std::time::Duration::ZERO;
                let mut done = 0u64;
                while done < iters {
                    let batch = (iters - done).min(chains.len() as u64) as usize;
                    let start = std::time::Instant::now();
                    for c in &chains[..batch] {
                        black_box(idx.store(writer, None, c, Tier::Device).unwrap());
                    }
                    total += start.elapsed();
                    idx.clear_stream(writer).unwrap();
                    done += batch as u64;
                }
                total
            })
        });
    }
    g.finish();

    // Steady state of a bounded index: full at 1 M nodes, each insert evicts N LRU tails.
    let mut g = c.benchmark_group("hashtree_insert_evicting");
    let idx = index(Some(1_000_000));
    let streams: Vec<_> = (0..16).map(|w| idx.stream(&key(w)).unwrap()).collect();
    for i in 0..(1_000_000 / 64) {
        idx.store(streams[i % 16], None, &chain(&mut rng, 64), Tier::Device).unwrap();
    }
    for n in [8usize, 32, 128, 512] {
        let pool: Vec<Vec<StoredBlock>> = (0..256).map(|_| chain(&mut rng, n)).collect();
        let mut i = 0usize;
        g.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| {
                // A fresh root every time, so every block is new.
                i += 1;
                let mut c = pool[i % pool.len()].clone();
                c[0].digest[8..16].copy_from_slice(&(i as u64).to_le_bytes());
                c[0].digest[0] ^= i as u8;
                c[0].digest[1..5].copy_from_slice(&(i as u32).to_be_bytes());
                idx.store(streams[i % 16], None, black_box(&c), Tier::Device).unwrap()
            })
        });
    }
    eprintln!("hashtree_insert_evicting: index at {:?}", idx.stats());
    g.finish();
}

fn bench_match(c: &mut Criterion) {
    let mut g = c.benchmark_group("hashtree_match_prefix");
    let opts = MatchOptions::default();
    for (w, bpw, q) in [(4usize, 32usize, 8usize), (16, 64, 32), (64, 128, 64), (128, 256, 128)] {
        // The reference grid: every worker its own chain; the probe is one worker's prefix.
        let mut rng = Rng(0xABCD ^ w as u64);
        let (idx, chains) = populated(w, bpw, 0, &mut rng);
        let hit: Vec<BlockHash> = chains[w / 2][..q].iter().map(StoredBlock::hash).collect();
        let miss: Vec<BlockHash> = chain(&mut rng, q).iter().map(StoredBlock::hash).collect();
        assert_eq!(idx.prefix_depths(&hit, &opts)[0].blocks as usize, q);
        g.bench_function(format!("w{w}_bpw{bpw}_q{q}"), |b| b.iter(|| idx.prefix_depths(black_box(&hit), &opts)));
        g.bench_function(format!("w{w}_bpw{bpw}_q{q}_miss"), |b| b.iter(|| idx.prefix_depths(black_box(&miss), &opts)));
        // Harder: half of every chain is a prefix all workers share, so every
        // shared block has w holders.
        let (idx, chains) = populated(w, bpw, bpw / 2, &mut rng);
        let hit: Vec<BlockHash> = chains[w / 2][..q].iter().map(StoredBlock::hash).collect();
        assert_eq!(idx.prefix_depths(&hit, &opts).len(), w, "every worker holds the shared half");
        g.bench_function(format!("w{w}_bpw{bpw}_q{q}_shared"), |b| {
            b.iter(|| idx.prefix_depths(black_box(&hit), &opts))
        });
    }
    g.finish();
}

fn bench_match_under_writes(c: &mut Criterion) {
    let mut g = c.benchmark_group("hashtree_match_under_writes");
    let mut rng = Rng(77);
    let (idx, chains) = populated(16, 64, 0, &mut rng);
    let idx = Arc::new(idx);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (idx, stop) = (idx.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rng = Rng(99);
            let s = idx.stream(&key(1000)).unwrap();
            let mut writes = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // Writes land in random shards, sometimes the probe's own.
                let c = chain(&mut rng, 32);
                idx.store(s, None, &c, Tier::Device).unwrap();
                let engines: Vec<u64> = c.iter().map(|b| b.engine).collect();
                idx.remove(s, &engines, Tier::Device).unwrap();
                writes += 1;
            }
            writes
        })
    };
    let probe: Vec<BlockHash> = chains[3][..32].iter().map(StoredBlock::hash).collect();
    let opts = MatchOptions::default();
    g.bench_function("w16_bpw64_q32", |b| b.iter(|| idx.prefix_depths(black_box(&probe), &opts)));
    stop.store(true, Ordering::Relaxed);
    let writes = writer.join().unwrap();
    eprintln!("hashtree_match_under_writes: {writes} store+remove pairs of 32 blocks ran alongside");
    g.finish();
}

fn bench_large(c: &mut Criterion) {
    let mut g = c.benchmark_group("hashtree_large");
    g.sample_size(30);
    let mut rng = Rng(4242);
    let idx = index(None);
    let streams: Vec<_> = (0..16).map(|w| idx.stream(&key(w)).unwrap()).collect();
    let mut chains = Vec::new();
    for i in 0..(1_000_000 / 64) {
        let c = chain(&mut rng, 64);
        idx.store(streams[i % 16], None, &c, Tier::Device).unwrap();
        if i % 1000 == 0 {
            chains.push(c);
        }
    }
    let stats = idx.stats();
    eprintln!(
        "hashtree_large: {} nodes, {} holdings, {} bytes = {:.1} bytes per (block, worker)",
        stats.nodes,
        stats.holdings,
        stats.memory_bytes,
        stats.memory_bytes as f64 / stats.holdings as f64
    );
    let probe: Vec<BlockHash> = chains[7].iter().map(StoredBlock::hash).collect();
    let opts = MatchOptions::default();
    g.bench_function("match_q64", |b| b.iter(|| idx.prefix_depths(black_box(&probe), &opts)));
    g.finish();
}

fn bench_pending(c: &mut Criterion) {
    let mut g = c.benchmark_group("pending_credit_and_match");
    let opts = MatchOptions::default();
    for n in [64usize, 256] {
        let config = IndexConfig { pending_ttl: Some(std::time::Duration::from_millis(500)), ..IndexConfig::default() };
        let idx = KvIndex::new(config, Arc::new(SystemClock::new()));
        let w = idx.worker_id(&WorkerUrl::new("http://worker-3:30000"));
        let prompt: Vec<BlockHash> = chain(&mut Rng(9 + n as u64), n).iter().map(StoredBlock::hash).collect();
        idx.credit_pending(w, &prompt);
        assert_eq!(idx.prefix_depths(&prompt, &opts)[0].blocks as usize, n);
        g.bench_function(format!("{n}"), |b| {
            b.iter(|| {
                let m = idx.prefix_depths(black_box(&prompt), &opts);
                idx.credit_pending(w, black_box(&prompt));
                m
            })
        });
        eprintln!("pending_credit_and_match/{n}: {} credits held", idx.stats().pending);
    }
    g.finish();
}

criterion_group!(benches, bench_insert, bench_match, bench_match_under_writes, bench_large, bench_pending);
criterion_main!(benches);
