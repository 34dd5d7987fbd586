//! Events over real ZMQ sockets on 127.0.0.1 into the index: publisher →
//! subscriber → pump → `KvIndex`, checked with the block hashes a request for
//! the same tokens produces. SGLang-style streams (engine hash = router hash)
//! and vLLM-style streams (opaque unsigned engine hashes) both index by content.

use std::num::NonZeroUsize;
use std::sync::Arc;

use kv_events::{EventMetrics, Publisher, PublisherConfig, StreamEndpoints, SubscriberConfig, spawn_subscriber};
use kv_index::{IndexConfig, KvIndex, MatchOptions, SystemClock};
use kv_ingest::{Pump, PumpMetrics, StreamHashing};
use renderer::{HashMode, PageHasher};
use router_types::{BlockHash, DpRank, EngineBlockHash, EventBatch, KvEvent, StoredBlocks, Tier, WorkerKey, WorkerUrl};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const PAGE: usize = 4;

fn hasher() -> PageHasher {
    PageHasher::new(NonZeroUsize::new(PAGE).unwrap(), HashMode::Unigram)
}

fn router_hashes(tokens: &[u32]) -> Vec<BlockHash> {
    hasher().block_hashes(tokens, None).unwrap()
}

/// A `BlockStored` as SGLang publishes it for `tokens[from..]` under the block before `from`.
fn sglang_store(tokens: &[u32], from_block: usize) -> KvEvent {
    let hashes: Vec<EngineBlockHash> = router_hashes(tokens).iter().map(|h| EngineBlockHash::I64(h.0)).collect();
    stored(tokens, from_block, hashes[from_block..].to_vec(), from_block.checked_sub(1).map(|p| hashes[p].clone()))
}

/// `tokens[from_block..]` stored on the device under `parent`, with these engine hashes.
fn stored(
    tokens: &[u32],
    from_block: usize,
    block_hashes: Vec<EngineBlockHash>,
    parent: Option<EngineBlockHash>,
) -> KvEvent {
    KvEvent::Stored(StoredBlocks::plain(
        block_hashes,
        parent,
        tokens[from_block * PAGE..].iter().map(|t| u64::from(*t)).collect(),
        PAGE as u32,
    ))
}

/// The same as vLLM would: opaque unsigned hashes above i64::MAX.
fn vllm_store(tokens: &[u32], from_block: usize, salt: u64) -> KvEvent {
    let opaque = |i: usize| EngineBlockHash::U64(u64::MAX - salt - i as u64);
    let blocks = tokens.len() / PAGE;
    stored(tokens, from_block, (from_block..blocks).map(opaque).collect(), from_block.checked_sub(1).map(opaque))
}

fn batch(events: Vec<KvEvent>) -> EventBatch {
    let ts = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    EventBatch { ts, events, dp_rank: None }
}

struct World {
    index: Arc<KvIndex>,
    pumps: Arc<PumpMetrics>,
    events: Arc<EventMetrics>,
    publishers: Vec<Publisher>,
    cancel: CancellationToken,
}

impl Drop for World {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

async fn world(engines: &[bool]) -> World {
    let index = Arc::new(KvIndex::new(IndexConfig::default(), Arc::new(SystemClock::new())));
    let pumps = Arc::new(PumpMetrics::default());
    let events = Arc::new(EventMetrics::default());
    let cancel = CancellationToken::new();
    let (tx, rx) = mpsc::channel(64);
    let mut pump = Pump::new(index.clone(), pumps.clone());
    let mut publishers = Vec::new();
    for (w, sglang) in engines.iter().enumerate() {
        let publisher = Publisher::bind(PublisherConfig::loopback()).await.unwrap();
        let key = WorkerKey::new(WorkerUrl::new(format!("http://worker-{w}:30000")), DpRank(0));
        let hashing = StreamHashing {
            page_size: NonZeroUsize::new(PAGE).unwrap(),
            mode: HashMode::Unigram,
            engine_hash_is_router_hash: *sglang,
        };
        pump.add_stream(key.clone(), hashing).unwrap();
        let stream = StreamEndpoints {
            key,
            endpoint: publisher.endpoint().into(),
            replay_endpoint: publisher.replay_endpoint().map(Into::into),
            topic: String::new(),
        };
        spawn_subscriber(stream, SubscriberConfig::default(), tx.clone(), events.clone(), cancel.clone());
        publishers.push(publisher);
    }
    tokio::spawn(pump.run(rx, cancel.clone()));
    World { index, pumps, events, publishers, cancel }
}

fn depth(w: &World, worker: usize, q: &[BlockHash]) -> u32 {
    let id = w.index.worker_id(&WorkerUrl::new(format!("http://worker-{worker}:30000")));
    w.index.prefix_depths(q, &MatchOptions::default()).iter().find(|m| m.worker == id).map_or(0, |m| m.blocks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_and_vllm_streams_index_by_content() {
    let w = world(&[true, false]).await;
    let prompt: Vec<u32> = (0..40).map(|i| 1000 + i).collect(); // 10 blocks
    let q = router_hashes(&prompt);
    // SGLang worker 0: the first 6 blocks, then 2 more under block 5.
    w.publishers[0].publish(&batch(vec![sglang_store(&prompt[..24], 0)])).await.unwrap();
    w.publishers[0].publish(&batch(vec![sglang_store(&prompt[..32], 6)])).await.unwrap();
    // vLLM worker 1: the first 3 blocks.
    w.publishers[1].publish(&batch(vec![vllm_store(&prompt[..12], 0, 7)])).await.unwrap();
    eventually("both workers indexed", async || depth(&w, 0, &q) == 8 && depth(&w, 1, &q) == 3).await;
    assert_eq!(EventMetrics::get(&w.pumps.hash_mismatches), 0, "router hashes equal SGLang's");

    // vLLM continues under its opaque parent hash; SGLang removes its tail.
    w.publishers[1].publish(&batch(vec![vllm_store(&prompt[..20], 3, 7)])).await.unwrap();
    let tail: Vec<EngineBlockHash> = q[6..8].iter().map(|h| EngineBlockHash::I64(h.0)).collect();
    w.publishers[0]
        .publish(&batch(vec![KvEvent::Removed { block_hashes: tail, tier: Tier::Device, group_idx: None }]))
        .await
        .unwrap();
    eventually("continuation and removal applied", async || depth(&w, 0, &q) == 6 && depth(&w, 1, &q) == 5).await;

    // A batch lost on the live stream is repaired by replay, then applied in order.
    w.publishers[0].drop_next(1);
    w.publishers[0].publish(&batch(vec![sglang_store(&prompt[..28], 6)])).await.unwrap();
    w.publishers[0].publish(&batch(vec![sglang_store(&prompt[..40], 7)])).await.unwrap();
    eventually("gap repaired", async || depth(&w, 0, &q) == 10).await;
    assert!(EventMetrics::get(&w.events.replay_repaired) >= 1);

    // A publisher restart clears that worker only.
    w.publishers[0].restart().await;
    w.publishers[0].publish(&batch(vec![sglang_store(&prompt[..8], 0)])).await.unwrap();
    eventually("restart reset worker 0", async || depth(&w, 0, &q) == 2).await;
    assert_eq!(depth(&w, 1, &q), 5);
    assert!(EventMetrics::get(&w.pumps.resets) >= 1);

    // AllBlocksCleared.
    w.publishers[1].publish(&batch(vec![KvEvent::AllCleared])).await.unwrap();
    eventually("vLLM worker cleared", async || depth(&w, 1, &q) == 0).await;
    assert_eq!(EventMetrics::get(&w.pumps.hash_mismatches), 0);
    assert!(w.pumps.lag_seconds.count() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_page_size_shows_as_hash_mismatches() {
    let w = world(&[true]).await;
    let prompt: Vec<u32> = (0..16).collect();
    // The engine hashed with page 2, but says block_size 4: hashes cannot match.
    let engine = PageHasher::new(NonZeroUsize::new(2).unwrap(), HashMode::Unigram).block_hashes(&prompt, None).unwrap();
    let event = KvEvent::Stored(StoredBlocks::plain(
        engine[..4].iter().map(|h| EngineBlockHash::I64(h.0)).collect(),
        None,
        prompt.iter().map(|t| u64::from(*t)).collect(),
        4,
    ));
    w.publishers[0].publish(&batch(vec![event])).await.unwrap();
    // A second (empty) batch: if the subscription joined too late for the first (ZeroMQ drops
    // what a PUB sends before it has the SUB's subscription), its seq shows the gap and the
    // replay fetches the first. Alone, the first could be lost without trace (a flake once).
    w.publishers[0].publish(&batch(vec![])).await.unwrap();
    eventually("mismatches counted", async || EventMetrics::get(&w.pumps.hash_mismatches) == 4).await;
}

/// Polls `cond` every 25 ms for up to 10 s; panics naming `what` if it never holds.
async fn eventually(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    for _ in 0..400 {
        if cond().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}
