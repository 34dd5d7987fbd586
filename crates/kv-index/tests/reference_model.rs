//! Seeded randomized conformance: thousands of random interleavings of stores
//! (with and without parents), removals per tier, clears, worker removals and
//! queries, on a tiny token alphabet so chains share prefixes, compared with a
//! naive model (per stream: a map of held block hash → tier set).

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroUsize;
use std::sync::Arc;

use kv_index::{IndexConfig, KvIndex, ManualClock, MatchOptions, StoredBlock};
use renderer::{HashMode, PageDigest, PageHasher};
use router_types::{BlockHash, DpRank, Tier, WorkerKey, WorkerUrl};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A token sequence's chain: router hashes and digests, page size 2, alphabet {0, 1, 2}.
fn chain(rng: &mut Rng, max_blocks: usize) -> Vec<(BlockHash, PageDigest)> {
    let hasher = PageHasher::new(NonZeroUsize::new(2).unwrap(), HashMode::Unigram);
    let blocks = 1 + rng.below(max_blocks);
    let tokens: Vec<u32> = (0..blocks * 2).map(|_| rng.below(3) as u32).collect();
    let mut digests = Vec::new();
    hasher.digests(&tokens, None, &mut digests).unwrap();
    digests.iter().map(|d| (BlockHash::from_digest(d), *d)).collect()
}

/// The naive model: per stream, held hash → tier bits.
#[derive(Default)]
struct Model {
    held: HashMap<WorkerKey, HashMap<BlockHash, u8>>,
}

impl Model {
    fn depths(
        &self,
        hashes: &[BlockHash],
        mask: u8,
        weights: [f32; 4],
    ) -> BTreeMap<WorkerUrl, Vec<(DpRank, u32, f32)>> {
        let mut out: BTreeMap<WorkerUrl, Vec<(DpRank, u32, f32)>> = BTreeMap::new();
        for (key, held) in &self.held {
            let mut depth = 0;
            let mut weighted = 0.0;
            for h in hashes {
                match held.get(h).map(|t| t & mask) {
                    Some(t) if t != 0 => {
                        depth += 1;
                        weighted += weights[t.trailing_zeros() as usize];
                    }
                    _ => break,
                }
            }
            if depth > 0 {
                out.entry(key.worker.clone()).or_default().push((key.rank, depth, weighted));
            }
        }
        out
    }
}

/// Engine hashes: SGLang-like streams publish the router hash, vLLM-like ones another value.
fn engine(key: &WorkerKey, hash: BlockHash) -> u64 {
    if key.rank.0 == 0 { hash.0 as u64 } else { (hash.0 as u64) ^ 0xA5A5_0000_0000_0001 ^ u64::from(key.rank.0) << 40 }
}

const TIERS: [Tier; 4] = [Tier::Device, Tier::Host, Tier::Disk, Tier::External];

fn run(seed: u64, ops: usize, shards: usize) {
    let mut rng = Rng(seed);
    let config = IndexConfig { shards: NonZeroUsize::new(shards).unwrap(), ..IndexConfig::default() };
    let index = KvIndex::new(config, Arc::new(ManualClock::default()));
    let mut model = Model::default();
    let workers: Vec<WorkerUrl> = (0..3).map(|w| WorkerUrl::new(format!("http://w{w}:1"))).collect();
    let keys: Vec<WorkerKey> =
        workers.iter().flat_map(|w| (0..2).map(|r| WorkerKey::new(w.clone(), DpRank(r)))).collect();
    let weights = [1.0, 0.5, 0.25, 0.125];
    let (mut stores, mut orphans, mut queries, mut nonzero) = (0, 0, 0, 0);

    for step in 0..ops {
        let key = keys[rng.below(keys.len())].clone();
        let stream = index.stream(&key).unwrap();
        match rng.below(100) {
            // Store a chain, maybe under a parent.
            0..=44 => {
                let c = chain(&mut rng, 6);
                let split = if rng.below(2) == 0 { 0 } else { rng.below(c.len()) };
                let tier = TIERS[[0, 0, 0, 1, 2, 3][rng.below(6)]];
                let held = model.held.entry(key.clone()).or_default();
                let parent = if split > 0 {
                    let p = c[split - 1].0;
                    let found = index.parent(stream, engine(&key, p));
                    assert_eq!(found.is_some(), held.contains_key(&p), "step {step}: parent lookup");
                    match found {
                        Some(f) => {
                            assert_eq!(f.hash, p);
                            assert_eq!(f.digest, c[split - 1].1);
                            Some(f)
                        }
                        None => {
                            orphans += 1;
                            continue;
                        }
                    }
                } else {
                    None
                };
                let blocks: Vec<StoredBlock> =
                    c[split..].iter().map(|(h, d)| StoredBlock { engine: engine(&key, *h), digest: *d }).collect();
                index.store(stream, parent.as_ref(), &blocks, tier).unwrap();
                for (h, _) in &c[split..] {
                    *held.entry(*h).or_default() |= 1 << tier as u8;
                }
                stores += 1;
            }
            // Remove some held blocks (and an unknown one) from one tier.
            45..=64 => {
                let tier = TIERS[rng.below(4)];
                let held = model.held.entry(key.clone()).or_default();
                let mut victims: Vec<BlockHash> = held.keys().copied().filter(|_| rng.below(3) == 0).collect();
                victims.push(BlockHash(rng.next() as i64));
                let engines: Vec<u64> = victims.iter().map(|h| engine(&key, *h)).collect();
                let mut ended = 0;
                for h in &victims {
                    if let Some(t) = held.get_mut(h) {
                        *t &= !(1 << tier as u8);
                        if *t == 0 {
                            held.remove(h);
                            ended += 1;
                        }
                    }
                }
                assert_eq!(index.remove(stream, &engines, tier).unwrap(), ended, "step {step}: removals");
            }
            // Clear a stream (publisher restart).
            65..=67 => {
                let held = model.held.remove(&key).unwrap_or_default();
                assert_eq!(index.clear_stream(stream).unwrap(), held.len(), "step {step}: clear");
            }
            // Remove a whole worker.
            68 => {
                let worker = key.worker.clone();
                model.held.retain(|k, _| k.worker != worker);
                index.remove_worker(&worker);
                assert!(index.store(stream, None, &[], Tier::Device).is_err(), "removed streams refuse writes");
            }
            // Query a chain, with some tier mask.
            _ => {
                let c = chain(&mut rng, 8);
                let hashes: Vec<BlockHash> = c.iter().map(|(h, _)| *h).collect();
                let mask = [0b1111u8, 0b0001, 0b0011, 0b0110][rng.below(4)];
                let opts = MatchOptions { tiers: mask, weights, include_pending: false };
                let want = model.depths(&hashes, mask, weights);
                let got = index.prefix_depths(&hashes, &opts);
                assert_eq!(got.len(), want.len(), "step {step}: workers matched {got:?} vs {want:?}");
                for m in &got {
                    let url = index.worker_url(m.worker).unwrap();
                    let ranks = &want[&url];
                    let best = ranks.iter().map(|r| r.1).max().unwrap();
                    assert_eq!(m.blocks, best, "step {step}: depth of {url}");
                    let rank = m.rank.expect("a rank");
                    let (_, d, w) = ranks.iter().find(|r| r.0 == rank).expect("reported rank holds blocks");
                    assert_eq!(*d, best, "step {step}: reported rank is a best rank");
                    assert!((m.weighted - w).abs() < 1e-4, "step {step}: weighted {} vs {w}", m.weighted);
                    nonzero += usize::from(m.blocks > 0);
                }
                queries += 1;
            }
        }
    }
    let stats = index.stats();
    let model_holdings: usize = model.held.values().map(HashMap::len).sum();
    assert_eq!(stats.holdings, model_holdings, "holdings at the end");
    snapshot_rebuilds_the_same_index(&index, &model, &keys, &mut rng, seed, shards);
    assert!(
        stores > ops / 4 && queries > ops / 5 && nonzero > queries / 10,
        "coverage {stores} {orphans} {queries} {nonzero}"
    );
}

/// Every stream exported from `index` and imported into an empty index
/// (another shard count) gives the same holdings, parents and answers.
fn snapshot_rebuilds_the_same_index(
    index: &KvIndex,
    model: &Model,
    keys: &[WorkerKey],
    rng: &mut Rng,
    seed: u64,
    shards: usize,
) {
    let other = NonZeroUsize::new(1 + (shards + 4) % 32).unwrap();
    let copy = KvIndex::new(IndexConfig { shards: other, ..IndexConfig::default() }, Arc::new(ManualClock::default()));
    let mut exported = 0;
    for key in keys {
        let blocks = index.export_stream(index.stream(key).unwrap()).unwrap();
        KvIndex::check_export(&blocks).unwrap();
        let held = blocks.iter().filter(|b| b.tiers != 0).count();
        assert_eq!(held, model.held.get(key).map_or(0, HashMap::len), "seed {seed}: {key} exports what it holds");
        exported += blocks.len();
        let imported = copy.import_stream(copy.stream(key).unwrap(), &blocks).unwrap();
        assert_eq!(imported, held, "seed {seed}: {key} imports what it held");
    }
    assert_eq!(copy.stats().holdings, index.stats().holdings, "seed {seed}: holdings");
    for (key, held) in &model.held {
        let (a, b) = (index.stream(key).unwrap(), copy.stream(key).unwrap());
        for h in held.keys() {
            let (pa, pb) = (index.parent(a, engine(key, *h)), copy.parent(b, engine(key, *h)));
            assert_eq!(pa.map(|p| (p.hash, p.digest)), pb.map(|p| (p.hash, p.digest)), "seed {seed}: parent {h:?}");
        }
    }
    let by_url = |i: &KvIndex, m: Vec<kv_index::WorkerMatch>| {
        let mut v: Vec<_> =
            m.iter().map(|m| (i.worker_url(m.worker).unwrap(), m.blocks, m.rank, (m.weighted * 1e4) as i64)).collect();
        v.sort();
        v
    };
    for _ in 0..300 {
        let c = chain(rng, 8);
        let hashes: Vec<BlockHash> = c.iter().map(|(h, _)| *h).collect();
        let opts = MatchOptions { include_pending: false, weights: [1.0, 0.5, 0.25, 0.125], ..MatchOptions::default() };
        assert_eq!(
            by_url(index, index.prefix_depths(&hashes, &opts)),
            by_url(&copy, copy.prefix_depths(&hashes, &opts)),
            "seed {seed}: answers after the snapshot"
        );
    }
    assert!(exported > 0 || model.held.is_empty(), "seed {seed}: something was exported");
}

#[test]
fn random_interleavings_match_the_reference_model() {
    for seed in 1..=12u64 {
        run(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15), 4000, [1, 2, 32][seed as usize % 3]);
    }
}

/// Clearing or removing everything leaves no node behind.
#[test]
fn clears_leave_nothing_behind() {
    let index = KvIndex::new(IndexConfig::default(), Arc::new(ManualClock::default()));
    let mut rng = Rng(42);
    let key = WorkerKey::new(WorkerUrl::new("http://a:1"), DpRank(0));
    let stream = index.stream(&key).unwrap();
    for _ in 0..500 {
        let c = chain(&mut rng, 6);
        let blocks: Vec<StoredBlock> = c.iter().map(|(h, d)| StoredBlock { engine: h.0 as u64, digest: *d }).collect();
        index.store(stream, None, &blocks, Tier::Device).unwrap();
    }
    assert!(index.stats().nodes > 0);
    index.clear_stream(stream).unwrap();
    let stats = index.stats();
    assert_eq!((stats.nodes, stats.holdings), (0, 0));
}
