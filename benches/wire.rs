//! KV-event ingestion: msgpack decode alone, and decode + apply (router page
//! hashes of the tokens, parent lookup, index store) through the real pump;
//! the index's removal of a chain.
//!
//! Run: `cargo bench -p sgl-router-benches --bench wire`. Throughput is in
//! blocks (16 tokens each); target ≥ 1 M blocks/s on one core.
//! Last result: docs/benchmarks.md.

use std::hint::black_box;
use std::num::NonZeroUsize;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kv_events::{EventForm, Limits, StreamMessage, StreamUpdate, decode_batch, encode_batch};
use kv_index::{IndexConfig, KvIndex, StoredBlock, SystemClock};
use kv_ingest::{Pump, PumpMetrics, StreamHashing};
use renderer::{HashMode, PageHasher};
use router_types::{BlockHash, DpRank, EngineBlockHash, EventBatch, KvEvent, StoredBlocks, Tier, WorkerKey, WorkerUrl};

const PAGE: usize = 16;
const BLOCKS_PER_BATCH: usize = 32;

/// Batches as SGLang publishes them: one chain of 32 blocks per batch, fresh tokens each.
fn batches(n: usize) -> Vec<Vec<u8>> {
    (0..n).map(batch).collect()
}

/// A store of `tokens`' blocks (their `hashes`, as SGLang publishes them) under `parent`.
fn stored(tokens: &[u32], hashes: &[BlockHash], parent: Option<BlockHash>) -> KvEvent {
    KvEvent::Stored(StoredBlocks::plain(
        hashes.iter().map(|h| EngineBlockHash::I64(h.0)).collect(),
        parent.map(|h| EngineBlockHash::I64(h.0)),
        tokens.iter().map(|t| u64::from(*t)).collect(),
        PAGE as u32,
    ))
}

/// Batch number `b`: distinct tokens for every `b`.
fn batch(b: usize) -> Vec<u8> {
    let hasher = PageHasher::new(NonZeroUsize::new(PAGE).unwrap(), HashMode::Unigram);
    std::iter::once(b)
        .map(|b| {
            let tokens: Vec<u32> = (0..BLOCKS_PER_BATCH * PAGE)
                .map(|i| ((b * 7919 + i * 31) % 151_000) as u32 ^ ((b as u32) << 18))
                .collect();
            let hashes = hasher.block_hashes(&tokens, None).unwrap();
            let event = stored(&tokens, &hashes, None);
            encode_batch(&EventBatch { ts: 0.0, events: vec![event], dp_rank: Some(DpRank(0)) }, EventForm::Map)
        })
        .next()
        .unwrap_or_default()
}

fn bench(c: &mut Criterion) {
    let payloads = batches(4096);
    let limits = Limits::default();
    let mut g = c.benchmark_group("kv_events");
    g.throughput(Throughput::Elements(BLOCKS_PER_BATCH as u64));

    let mut i = 0usize;
    g.bench_function("decode_32_blocks", |b| {
        b.iter(|| {
            i += 1;
            black_box(decode_batch(&payloads[i % payloads.len()], &limits).unwrap())
        })
    });

    // Decode + apply into an index bounded at 1 M nodes (so it stays full and evicts).
    let config = IndexConfig { max_nodes: NonZeroUsize::new(1_000_000), ..IndexConfig::default() };
    let index = Arc::new(KvIndex::new(config, Arc::new(SystemClock::new())));
    let mut pump = Pump::new(index.clone(), Arc::new(PumpMetrics::default()));
    let key = WorkerKey::new(WorkerUrl::new("http://w:30000"), DpRank(0));
    let hashing = StreamHashing {
        page_size: NonZeroUsize::new(PAGE).unwrap(),
        mode: HashMode::Unigram,
        engine_hash_is_router_hash: true,
    };
    pump.add_stream(key.clone(), hashing).unwrap();
    // Every iteration a batch never seen before (made outside the timed part).
    let mut seq = 0u64;
    g.bench_function("decode_and_apply_32_blocks", |b| {
        b.iter_batched(
            || {
                seq += 1;
                (seq, batch(seq as usize + 10_000))
            },
            |(seq, payload)| {
                let decoded = decode_batch(&payload, &limits).unwrap();
                pump.apply(StreamMessage { key: key.clone(), seq, update: StreamUpdate::Batch(decoded) });
            },
            criterion::BatchSize::SmallInput,
        )
    });
    eprintln!("kv_events: index after the run: {:?}", index.stats());
    g.finish();
    remove(c);
    steady(c);
}

/// Engines at capacity, as in issue 29's exact path (`benches/overhead_wrk.sh` with `EXACT`):
/// four streams, each holding 8 shared prefixes of 154 blocks and its last 120 requests' own
/// 206 blocks (some 25,000 blocks); every batch is one request's: its 206 new blocks stored
/// under its group's prefix, and the stream's oldest request's blocks removed deepest first
/// (an LRU engine evicting leaves as it stores). Decode, page hashes and index, per batch.
/// Timed, or counted: `WIRE_STEADY_ITERS=N valgrind --tool=cachegrind --cache-sim=yes
/// <wire bench binary> --bench kv_events_steady`, N = 0 and N = 400, the difference over 400.
fn steady(c: &mut Criterion) {
    const STREAMS: usize = 4;
    const GROUPS: usize = 8;
    const PREFIX: usize = 154;
    const NEW: usize = 206;
    const HELD: usize = 120;
    let hasher = PageHasher::new(NonZeroUsize::new(PAGE).unwrap(), HashMode::Unigram);
    let limits = Limits::default();
    let index = Arc::new(KvIndex::new(IndexConfig::default(), Arc::new(SystemClock::new())));
    let mut pump = Pump::new(index.clone(), Arc::new(PumpMetrics::default()));
    let keys: Vec<WorkerKey> =
        (0..STREAMS).map(|s| WorkerKey::new(WorkerUrl::new(format!("http://w{s}:30000")), DpRank(0))).collect();
    let hashing = StreamHashing {
        page_size: NonZeroUsize::new(PAGE).unwrap(),
        mode: HashMode::Unigram,
        engine_hash_is_router_hash: true,
    };
    for key in &keys {
        pump.add_stream(key.clone(), hashing).unwrap();
    }
    let prefixes: Vec<Vec<u32>> =
        (0..GROUPS).map(|g| (0..PREFIX * PAGE).map(|i| ((g * 104_729 + i * 13) % 151_000) as u32).collect()).collect();
    let payload =
        |events: Vec<KvEvent>| encode_batch(&EventBatch { ts: 0.0, events, dp_rank: Some(DpRank(0)) }, EventForm::Map);
    let mut seqs = vec![0u64; STREAMS];
    let mut held: Vec<std::collections::VecDeque<Vec<BlockHash>>> = vec![Default::default(); STREAMS];
    let apply = |pump: &mut Pump, s: usize, bytes: &[u8], seqs: &mut [u64]| {
        seqs[s] += 1;
        let decoded = decode_batch(bytes, &limits).unwrap();
        pump.apply(StreamMessage { key: keys[s].clone(), seq: seqs[s], update: StreamUpdate::Batch(decoded) });
    };
    // One request of group `g` with fresh tokens `n`, and the removal it forces on stream `s`.
    let request = |s: usize, n: usize, held: &mut Vec<std::collections::VecDeque<Vec<BlockHash>>>| {
        let g = n % GROUPS;
        let mut tokens = prefixes[g].clone();
        tokens.extend((0..NEW * PAGE).map(|i| ((n * 7919 + i * 31) % 151_000) as u32 ^ ((n as u32 & 0x3fff) << 17)));
        let hashes = hasher.block_hashes(&tokens, None).unwrap();
        let mut events = Vec::new();
        if held[s].len() >= HELD {
            let old = held[s].pop_front().unwrap();
            events.push(KvEvent::Removed {
                block_hashes: old.iter().rev().map(|h| EngineBlockHash::I64(h.0)).collect(),
                tier: Tier::Device,
                group_idx: None,
            });
        }
        events.push(stored(&tokens[PREFIX * PAGE..], &hashes[PREFIX..], Some(hashes[PREFIX - 1])));
        held[s].push_back(hashes[PREFIX..].to_vec());
        payload(events)
    };
    // The prefixes everywhere, then every stream full.
    for s in 0..STREAMS {
        for p in &prefixes {
            let hashes = hasher.block_hashes(p, None).unwrap();
            apply(&mut pump, s, &payload(vec![stored(p, &hashes, None)]), &mut seqs);
        }
    }
    // `WIRE_STEADY_ITERS=N`: N batches past the fill and no timing, for counting instructions
    // and cache misses (valgrind), which this noisy machine cannot time (criterion's spread is
    // ±20 %).
    let counted = std::env::var("WIRE_STEADY_ITERS").ok().and_then(|v| v.parse::<usize>().ok());
    let mut n = 0usize;
    for _ in 0..STREAMS * HELD + counted.unwrap_or(0) {
        n += 1;
        let bytes = request(n % STREAMS, n, &mut held);
        apply(&mut pump, n % STREAMS, &bytes, &mut seqs);
    }
    if counted.is_some() {
        return;
    }
    let mut g = c.benchmark_group("kv_events_steady");
    g.throughput(Throughput::Elements(NEW as u64));
    g.bench_function("request_206_stored_206_removed", |b| {
        b.iter_batched(
            || {
                n += 1;
                (n % STREAMS, request(n % STREAMS, n, &mut held))
            },
            |(s, bytes)| apply(&mut pump, s, &bytes, &mut seqs),
            criterion::BatchSize::SmallInput,
        )
    });
    g.finish();
    eprintln!("kv_events_steady: index after the run: {:?}", index.stats());
}

/// The index's side of an engine evicting a chain: a stream holding a 32-block chain (stored
/// outside the timed part) removes it whole, as a `BlockRemoved` of those blocks is applied
/// (each block released and its node pruned, its engine hash forgotten). Another stream holds
/// a shared chain the whole time, so the index is not empty.
fn remove(c: &mut Criterion) {
    let index = KvIndex::new(IndexConfig::default(), Arc::new(SystemClock::new()));
    let stream = index.stream(&WorkerKey::new(WorkerUrl::new("http://w:30000"), DpRank(0))).unwrap();
    let other = index.stream(&WorkerKey::new(WorkerUrl::new("http://v:30000"), DpRank(0))).unwrap();
    let chain = |n: u64| -> Vec<StoredBlock> {
        (0..BLOCKS_PER_BATCH as u64)
            .map(|i| {
                let mut digest = [0u8; 32];
                digest[..8].copy_from_slice(&(n * 1_000 + i + 1).to_be_bytes());
                StoredBlock { engine: n * 1_000 + i + 1, digest }
            })
            .collect()
    };
    index.store(other, None, &chain(0), Tier::Device).unwrap();
    let mut g = c.benchmark_group("kv_index");
    g.throughput(Throughput::Elements(BLOCKS_PER_BATCH as u64));
    let mut n = 0u64;
    g.bench_function("remove_32_blocks", |b| {
        b.iter_batched(
            || {
                n += 1;
                let blocks = chain(n);
                index.store(stream, None, &blocks, Tier::Device).unwrap();
                blocks.iter().map(|b| b.engine).collect::<Vec<u64>>()
            },
            |engines| assert_eq!(index.remove(stream, &engines, Tier::Device).unwrap(), BLOCKS_PER_BATCH),
            criterion::BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
