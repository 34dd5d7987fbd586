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
use router_types::{DpRank, EngineBlockHash, EventBatch, KvEvent, Namespace, StoredBlocks, Tier, WorkerKey, WorkerUrl};

const PAGE: usize = 16;
const BLOCKS_PER_BATCH: usize = 32;

/// Batches as SGLang publishes them: one chain of 32 blocks per batch, fresh tokens each.
fn batches(n: usize) -> Vec<Vec<u8>> {
    (0..n).map(batch).collect()
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
            let event = KvEvent::Stored(StoredBlocks {
                block_hashes: hashes.iter().map(|h| EngineBlockHash::I64(h.0)).collect(),
                parent: None,
                token_ids: tokens.iter().map(|t| u64::from(*t)).collect(),
                bigram: false,
                block_size: PAGE as u32,
                tier: Tier::Device,
                namespace: Namespace::default(),
                group_idx: None,
                group_kind: None,
                opaque_keys: Vec::new(),
            });
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
