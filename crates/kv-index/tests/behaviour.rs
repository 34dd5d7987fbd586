//! Bounded memory with LRU tails first, pending prefixes on an injected clock,
//! namespaces, ranks, stale engine hashes, readers under concurrent writers, and hybrid
//! models' KV-cache groups (`behaviour/hybrid.rs`: against vLLM's own hit finder).

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use kv_index::{IndexConfig, IndexError, KvIndex, ManualClock, MatchOptions, StoredBlock};
use renderer::hash::{chain_prior, namespace_seed};
use renderer::{HashMode, PageHasher};
use router_types::{BlockHash, DpRank, Tier, WorkerKey, WorkerUrl};

#[path = "behaviour/hybrid.rs"]
mod hybrid;

fn hasher() -> PageHasher {
    PageHasher::new(NonZeroUsize::new(4).unwrap(), HashMode::Unigram)
}

/// The stored blocks of `tokens` (engine hash = router hash, as SGLang publishes).
fn blocks(tokens: &[u32], salt: Option<&str>) -> Vec<StoredBlock> {
    let mut digests = Vec::new();
    hasher().digests(tokens, chain_prior(salt).as_ref(), &mut digests).unwrap();
    digests
        .iter()
        .map(|d| {
            let hash = BlockHash::from_digest(d);
            StoredBlock { engine: hash.0 as u64, digest: *d }
        })
        .collect()
}

fn hashes(b: &[StoredBlock]) -> Vec<BlockHash> {
    b.iter().map(StoredBlock::hash).collect()
}

fn key(w: &str, rank: u32) -> WorkerKey {
    WorkerKey::new(WorkerUrl::new(w), DpRank(rank))
}

fn depth_of(index: &KvIndex, worker: &str, q: &[BlockHash]) -> u32 {
    let id = index.worker_id(&WorkerUrl::new(worker));
    index.prefix_depths(q, &MatchOptions::default()).iter().find(|m| m.worker == id).map_or(0, |m| m.blocks)
}

#[test]
fn bounded_index_evicts_lru_tails_first() {
    let config =
        IndexConfig { max_nodes: NonZeroUsize::new(256), shards: NonZeroUsize::new(4).unwrap(), ..Default::default() };
    let index = KvIndex::new(config, Arc::new(ManualClock::default()));
    let s = index.stream(&key("http://a:1", 0)).unwrap();
    let hot: Vec<u32> = (0..32).map(|i| 1_000_000 + i).collect();
    let hot_blocks = blocks(&hot, None);
    index.store(s, None, &hot_blocks, Tier::Device).unwrap();
    for i in 0..2000u32 {
        let tokens: Vec<u32> = (0..32).map(|t| i * 100 + t).collect();
        index.store(s, None, &blocks(&tokens, None), Tier::Device).unwrap();
        // Keep the hot chain in use.
        assert_eq!(depth_of(&index, "http://a:1", &hashes(&hot_blocks)), 8, "hot chain kept at step {i}");
        let stats = index.stats();
        assert!(stats.nodes <= 256, "bound holds: {}", stats.nodes);
    }
    let stats = index.stats();
    assert!(stats.evicted_nodes > 10_000, "{stats:?}");
    // The oldest chains lost their tails first: what remains of any chain is a prefix.
    let old: Vec<u32> = (0..32).collect();
    assert!(depth_of(&index, "http://a:1", &hashes(&blocks(&old, None))) < 8);
    // Evicted blocks are no longer parents; storing under a stale parent is refused.
    let last: Vec<u32> = (0..32).map(|t| 1999 * 100 + t).collect();
    let last_blocks = blocks(&last, None);
    let parent = index.parent(s, last_blocks[7].engine).expect("newest chain's tail is indexed");
    for i in 0..400u32 {
        let tokens: Vec<u32> = (0..32).map(|t| 5_000_000 + i * 100 + t).collect();
        index.store(s, None, &blocks(&tokens, None), Tier::Device).unwrap();
    }
    if index.parent(s, last_blocks[7].engine).is_none() {
        let more = StoredBlock { engine: 7, digest: [7; 32] };
        assert_eq!(index.store(s, Some(&parent), &[more], Tier::Device), Err(IndexError::ParentGone));
    }
    // Memory is bounded too: engine maps were swept of evicted entries.
    assert!(index.stats().memory_bytes < 1 << 20, "{:?}", index.stats());
}

#[test]
fn pending_prefixes_expire_on_the_injected_clock() {
    let clock = ManualClock::default();
    let config = IndexConfig { pending_ttl: Some(Duration::from_millis(500)), ..Default::default() };
    let index = KvIndex::new(config, Arc::new(clock.clone()));
    let w = index.worker_id(&WorkerUrl::new("http://a:1"));
    let q = hashes(&blocks(&(0..40).collect::<Vec<u32>>(), None));
    index.credit_pending(w, &q[..6]);
    let m = index.prefix_depths(&q, &MatchOptions::default());
    assert_eq!((m.len(), m[0].blocks, m[0].pending_blocks, m[0].rank), (1, 6, 6, None));
    let without = MatchOptions { include_pending: false, ..MatchOptions::default() };
    assert!(index.prefix_depths(&q, &without).is_empty());
    clock.advance_ms(499);
    assert_eq!(depth_of(&index, "http://a:1", &q), 6);
    clock.advance_ms(1);
    assert_eq!(depth_of(&index, "http://a:1", &q), 0, "expired at exactly the TTL");
    index.expire_pending();
    assert_eq!(index.stats().pending, 0);

    // Pending and events combine: the larger depth wins.
    let s = index.stream(&key("http://a:1", 1)).unwrap();
    index.store(s, None, &blocks(&(0..12).collect::<Vec<u32>>(), None), Tier::Device).unwrap();
    index.credit_pending(w, &q[..5]);
    let m = index.prefix_depths(&q, &MatchOptions::default());
    assert_eq!((m[0].blocks, m[0].pending_blocks, m[0].rank), (5, 5, Some(DpRank(1))));

    // Off by default: crediting does nothing.
    let off = KvIndex::new(IndexConfig::default(), Arc::new(clock.clone()));
    let w = off.worker_id(&WorkerUrl::new("http://b:1"));
    off.credit_pending(w, &q);
    assert!(off.prefix_depths(&q, &MatchOptions::default()).is_empty());
}

#[test]
fn namespaces_keep_identical_tokens_apart() {
    let index = KvIndex::new(IndexConfig::default(), Arc::new(ManualClock::default()));
    let tokens: Vec<u32> = (0..16).collect();
    let plain = blocks(&tokens, None);
    let salted = blocks(&tokens, Some("tenant-a"));
    // A LoRA chain starts from the namespace seed of its adapter name, so it
    // shares nothing with the base model's chain; its engine hashes are opaque.
    let seed = namespace_seed(Some("my-lora"), None);
    let mut digests = Vec::new();
    hasher().digests(&tokens, seed.as_ref(), &mut digests).unwrap();
    let lora: Vec<StoredBlock> =
        digests.iter().enumerate().map(|(i, d)| StoredBlock { engine: 0xA000 + i as u64, digest: *d }).collect();
    index.store(index.stream(&key("http://plain:1", 0)).unwrap(), None, &plain, Tier::Device).unwrap();
    index.store(index.stream(&key("http://salted:1", 0)).unwrap(), None, &salted, Tier::Device).unwrap();
    index.store(index.stream(&key("http://lora:1", 0)).unwrap(), None, &lora, Tier::Device).unwrap();
    for (q, owner) in [(&plain, "http://plain:1"), (&salted, "http://salted:1"), (&lora, "http://lora:1")] {
        let m = index.prefix_depths(&hashes(q), &MatchOptions::default());
        assert_eq!(m.len(), 1, "only {owner} matches");
        assert_eq!(index.worker_url(m[0].worker).unwrap().as_str(), owner);
        assert_eq!(m[0].blocks, 4);
    }
}

#[test]
fn best_rank_and_tier_filters() {
    let index = KvIndex::new(IndexConfig::default(), Arc::new(ManualClock::default()));
    let b = blocks(&(0..32).collect::<Vec<u32>>(), None);
    let r0 = index.stream(&key("http://a:1", 0)).unwrap();
    let r1 = index.stream(&key("http://a:1", 1)).unwrap();
    index.store(r0, None, &b[..3], Tier::Device).unwrap();
    index.store(r1, None, &b[..2], Tier::Device).unwrap();
    let parent = index.parent(r1, b[1].engine).unwrap();
    index.store(r1, Some(&parent), &b[2..6], Tier::Host).unwrap();
    let m = index.prefix_depths(&hashes(&b), &MatchOptions::default());
    assert_eq!((m[0].blocks, m[0].rank), (6, Some(DpRank(1))));
    let m = index.prefix_depths(&hashes(&b), &MatchOptions::only(&[Tier::Device]));
    assert_eq!((m[0].blocks, m[0].rank), (3, Some(DpRank(0))));
    let weighted = MatchOptions { weights: [1.0, 0.5, 0.0, 0.0], ..MatchOptions::default() };
    let m = index.prefix_depths(&hashes(&b), &weighted);
    assert_eq!(m[0].weighted, 2.0 + 4.0 * 0.5);
    // Storing again is harmless.
    let again = index.store(r0, None, &b[..3], Tier::Device).unwrap();
    assert_eq!((again.new_nodes, again.new_holdings), (0, 0));
}

/// Writers store whole chains and remove them root first; readers must only
/// ever see a chain entirely (8 blocks) or not at all from its root (0): a
/// torn depth would mean a reader saw a half-applied write.
#[test]
fn readers_never_see_torn_writes() {
    let index = Arc::new(KvIndex::new(IndexConfig::default(), Arc::new(ManualClock::default())));
    let chains: Vec<Vec<StoredBlock>> =
        (0..8u32).map(|c| blocks(&(0..32).map(|t| c * 1000 + t).collect::<Vec<u32>>(), None)).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let barrier = Arc::new(Barrier::new(4));
    let mut handles = Vec::new();
    for w in 0..2 {
        let (index, chains, stop, barrier) = (index.clone(), chains.clone(), stop.clone(), barrier.clone());
        handles.push(std::thread::spawn(move || {
            let s = index.stream(&key(&format!("http://w{w}:1"), 0)).unwrap();
            barrier.wait();
            let mut rounds = 0u32;
            while !stop.load(Ordering::Relaxed) || rounds < 200 {
                for c in &chains {
                    index.store(s, None, c, Tier::Device).unwrap();
                }
                for c in &chains {
                    let engines: Vec<u64> = c.iter().map(|b| b.engine).collect();
                    index.remove(s, &engines, Tier::Device).unwrap();
                }
                rounds += 1;
            }
        }));
    }
    let mut readers = Vec::new();
    for _ in 0..2 {
        let (index, chains, barrier) = (index.clone(), chains.clone(), barrier.clone());
        readers.push(std::thread::spawn(move || {
            barrier.wait();
            let mut seen_full = 0;
            for i in 0..20_000 {
                let q = hashes(&chains[i % chains.len()]);
                for m in index.prefix_depths(&q, &MatchOptions::default()) {
                    assert!(m.blocks == 8 || m.blocks == 0, "torn depth {}", m.blocks);
                    seen_full += usize::from(m.blocks == 8);
                }
            }
            seen_full
        }));
    }
    let seen: usize = readers.into_iter().map(|r| r.join().unwrap()).sum();
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    assert!(seen > 0, "readers saw writes land");
    assert_eq!(index.stats().nodes, 0, "every chain was removed in the end");
}

#[test]
fn clear_worker_drops_holdings_but_keeps_streams() {
    let index = KvIndex::new(IndexConfig::default(), Arc::new(ManualClock::default()));
    let tokens: Vec<u32> = (0..32).collect();
    let b = blocks(&tokens, None);
    let a0 = index.stream(&key("http://a:1", 0)).unwrap();
    let a1 = index.stream(&key("http://a:1", 1)).unwrap();
    let other = index.stream(&key("http://b:1", 0)).unwrap();
    index.store(a0, None, &b, Tier::Device).unwrap();
    index.store(a1, None, &b[..4], Tier::Device).unwrap();
    index.store(other, None, &b[..2], Tier::Device).unwrap();

    assert_eq!(index.clear_worker(&WorkerUrl::new("http://a:1")), 12, "8 + 4 holdings of both ranks end");
    assert_eq!(depth_of(&index, "http://a:1", &hashes(&b)), 0);
    assert_eq!(depth_of(&index, "http://b:1", &hashes(&b)), 2, "other workers untouched");
    // The streams are still registered: the same ids, and they accept events again.
    assert_eq!(index.stream(&key("http://a:1", 0)).unwrap(), a0);
    index.store(a0, None, &b[..3], Tier::Device).unwrap();
    assert_eq!(depth_of(&index, "http://a:1", &hashes(&b)), 3);
    assert_eq!(index.clear_worker(&WorkerUrl::new("http://unknown:1")), 0);
}

/// Found by the soak run: every worker removed and added again (or replaced by a new pod)
/// registered new streams whose ids were never reused; after 65,535 the router could follow
/// no new worker, and each retired stream kept its engine map's memory.
#[test]
fn retired_streams_give_their_ids_and_memory_back() {
    let index = KvIndex::new(IndexConfig::default(), Arc::new(ManualClock::default()));
    let first = index.stream(&key("http://w0:1", 0)).unwrap();
    let tokens: Vec<u32> = (0..64).collect();
    index.store(first, None, &blocks(&tokens, None), Tier::Device).unwrap();
    index.remove_worker(&WorkerUrl::new("http://w0:1"));
    assert_eq!(index.retire_stream(first).unwrap(), 0, "remove_worker ended its holdings already");
    assert_eq!(index.retire_stream(first).unwrap(), 0, "twice: nothing");
    // Memory once every shard has held a chain (each keeps its first slab chunk).
    let mut baseline = 0;
    for i in 1..66_000u32 {
        if i == 1_000 {
            baseline = index.stats().memory_bytes;
        }
        let w = format!("http://w{i}:1");
        let s = index.stream(&key(&w, 0)).unwrap_or_else(|e| panic!("registration {i}: {e}"));
        let tokens: Vec<u32> = (0..64).map(|t| i * 64 + t).collect();
        index.store(s, None, &blocks(&tokens, None), Tier::Device).unwrap();
        assert_eq!(depth_of(&index, &w, &hashes(&blocks(&tokens, None))), 16);
        index.remove_worker(&WorkerUrl::new(&w));
        index.retire_stream(s).unwrap();
    }
    let stats = index.stats();
    assert_eq!((stats.nodes, stats.holdings, stats.streams), (0, 0, 0));
    // One stream slot (its id reused 69,999 times) and no engine map left behind.
    assert!(stats.memory_bytes <= baseline + 4096, "{} bytes after, {baseline} before", stats.memory_bytes);
}

#[test]
fn a_reused_stream_id_inherits_nothing_of_the_retired_stream() {
    let index = KvIndex::new(IndexConfig::default(), Arc::new(ManualClock::default()));
    let old = index.stream(&key("http://old:1", 0)).unwrap();
    let tokens: Vec<u32> = (0..32).collect();
    let b = blocks(&tokens, None);
    index.store(old, None, &b, Tier::Device).unwrap();
    // Retired by its writer without remove_worker first: the holdings end here.
    assert_eq!(index.retire_stream(old).unwrap(), 8);
    let new = index.stream(&key("http://new:1", 0)).unwrap();
    assert_eq!(new, old, "the id is reused");
    assert_eq!(depth_of(&index, "http://new:1", &hashes(&b)), 0, "no holding carried over");
    assert_eq!(depth_of(&index, "http://old:1", &hashes(&b)), 0);
    assert!(index.store(old, None, &b, Tier::Device).is_ok(), "the id now writes the new stream");
    assert_eq!(depth_of(&index, "http://new:1", &hashes(&b)), 8);
    // The old key registers afresh, under another id.
    let again = index.stream(&key("http://old:1", 0)).unwrap();
    assert_ne!(again, new);
    assert_eq!(depth_of(&index, "http://old:1", &hashes(&b)), 0);
}

#[test]
fn retiring_ends_holdings_the_engine_map_lost_track_of() {
    let index = KvIndex::new(IndexConfig::default(), Arc::new(ManualClock::default()));
    let old = index.stream(&key("http://old:1", 0)).unwrap();
    let a = blocks(&(0..32).collect::<Vec<u32>>(), None);
    // An engine that publishes the same engine hashes for other blocks: the map follows the
    // second chain, the first one's holdings are no longer in it.
    let b: Vec<StoredBlock> = blocks(&(100..132).collect::<Vec<u32>>(), None)
        .into_iter()
        .zip(&a)
        .map(|(mut s, first)| {
            s.engine = first.engine;
            s
        })
        .collect();
    index.store(old, None, &a, Tier::Device).unwrap();
    index.store(old, None, &b, Tier::Device).unwrap();
    assert_eq!(depth_of(&index, "http://old:1", &hashes(&a)), 8);
    assert_eq!(index.retire_stream(old).unwrap(), 16, "both chains' holdings end");
    let new = index.stream(&key("http://new:1", 0)).unwrap();
    assert_eq!(new, old);
    assert_eq!(depth_of(&index, "http://new:1", &hashes(&a)), 0, "the orphaned chain is not the new stream's");
    assert_eq!(index.stats().holdings, 0);
}
