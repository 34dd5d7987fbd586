//! The pump without sockets: bigram stores, salted and LoRA namespaces,
//! orphans, duplicates, unknown streams and malformed stores, each counted; vLLM's lookahead
//! hashing against vLLM's own code (`lookahead_golden`).

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use kv_events::{Decoded, StreamMessage, StreamUpdate};
use kv_index::{IndexConfig, KvIndex, MatchOptions, SystemClock};
use kv_ingest::{Pump, PumpMetrics, StreamHashing};
use renderer::hash::namespace_prior;
use renderer::{HashMode, PageHasher};
use router_types::{DpRank, EngineBlockHash, EventBatch, KvEvent, Namespace, StoredBlocks, Tier, WorkerKey, WorkerUrl};

#[path = "pump_apply/lookahead_golden.rs"]
mod lookahead_golden;
#[path = "pump_apply/multimodal_golden.rs"]
mod multimodal_golden;

const PAGE: usize = 4;

fn key() -> WorkerKey {
    WorkerKey::new(WorkerUrl::new("http://w:1"), DpRank(0))
}

/// An empty index and a pump over it, no stream registered; how streams of `page`-token blocks
/// in `mode` are hashed (`sglang`: their engine hash is the router's; else vLLM's).
fn empty(page: usize, mode: HashMode, sglang: bool) -> (Arc<KvIndex>, Pump, Arc<PumpMetrics>, StreamHashing) {
    let index = Arc::new(KvIndex::new(IndexConfig::default(), Arc::new(SystemClock::new())));
    let metrics = Arc::new(PumpMetrics::default());
    let pump = Pump::new(index.clone(), metrics.clone());
    let hashing =
        StreamHashing { page_size: NonZeroUsize::new(page).unwrap(), mode, engine_hash_is_router_hash: sglang };
    (index, pump, metrics, hashing)
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// A vLLM stream of `page`-token blocks fed `payloads` (hex msgpack batches, in seq order, as
/// a golden's generator wrote vLLM's) through the real decoder and pump; `name` says which in a
/// failure. Every store is applied (none malformed, orphaned or rejected).
fn vllm_applied(
    page: usize,
    payloads: &[serde_json::Value],
    name: &str,
) -> (Arc<KvIndex>, Pump, Arc<PumpMetrics>, StreamHashing) {
    let (index, mut pump, metrics, hashing) = empty(page, HashMode::Unigram, false);
    pump.add_stream(key(), hashing).unwrap();
    for (seq, payload) in payloads.iter().enumerate() {
        let bytes = unhex(payload.as_str().unwrap());
        let decoded = kv_events::decode_batch(&bytes, &kv_events::Limits::default()).unwrap();
        pump.apply(StreamMessage { key: key(), seq: seq as u64, update: StreamUpdate::Batch(decoded) });
    }
    for c in [&metrics.malformed_stores, &metrics.orphan_stores, &metrics.rejected_stores] {
        assert_eq!(get(c), 0, "{name}: every store applied");
    }
    (index, pump, metrics, hashing)
}

fn setup(mode: HashMode) -> (Arc<KvIndex>, Pump, Arc<PumpMetrics>) {
    let (index, mut pump, metrics, hashing) = empty(PAGE, mode, true);
    pump.add_stream(key(), hashing).unwrap();
    (index, pump, metrics)
}

fn message(seq: u64, events: Vec<KvEvent>) -> StreamMessage {
    StreamMessage {
        key: key(),
        seq,
        update: StreamUpdate::Batch(Decoded {
            batch: EventBatch { ts: 0.0, events, dp_rank: None },
            unknown_events: 0,
        }),
    }
}

fn stored(
    hashes: Vec<EngineBlockHash>,
    parent: Option<EngineBlockHash>,
    tokens: &[u32],
    bigram: bool,
    ns: Namespace,
) -> KvEvent {
    KvEvent::Stored(StoredBlocks {
        bigram,
        namespace: ns,
        ..StoredBlocks::plain(hashes, parent, tokens.iter().map(|t| u64::from(*t)).collect(), PAGE as u32)
    })
}

fn get(c: &std::sync::atomic::AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

#[test]
fn bigram_stores_match_bigram_requests() {
    let (index, mut pump, metrics) = setup(HashMode::Bigram);
    let raw: Vec<u32> = (0..13).collect(); // 12 bigram positions = 3 pages
    let hasher = PageHasher::new(NonZeroUsize::new(PAGE).unwrap(), HashMode::Bigram);
    let hashes = hasher.block_hashes(&raw, None).unwrap();
    let engine: Vec<EngineBlockHash> = hashes.iter().map(|h| EngineBlockHash::I64(h.0)).collect();
    pump.apply(message(0, vec![stored(engine, None, &raw, true, Namespace::default())]));
    let m = index.prefix_depths(&hashes, &MatchOptions::default());
    assert_eq!(m[0].blocks, 3);
    assert_eq!(get(&metrics.hash_mismatches), 0, "bigram hashes equal SGLang's");
}

#[test]
fn namespaces_orphans_duplicates_and_bad_stores_are_handled() {
    let (index, mut pump, metrics) = setup(HashMode::Unigram);
    let tokens: Vec<u32> = (0..8).collect();
    let hasher = PageHasher::new(NonZeroUsize::new(PAGE).unwrap(), HashMode::Unigram);

    // A salted store: SGLang's own salted chain, so no mismatch; a request without the salt does not match.
    let salted = hasher.block_hashes(&tokens, namespace_prior(None, Some("tenant")).as_ref()).unwrap();
    let ns = Namespace { lora_name: None, cache_salt: Some("tenant".into()) };
    let engine: Vec<EngineBlockHash> = salted.iter().map(|h| EngineBlockHash::I64(h.0)).collect();
    pump.apply(message(0, vec![stored(engine, None, &tokens, false, ns)]));
    assert_eq!(index.prefix_depths(&salted, &MatchOptions::default())[0].blocks, 2);
    let plain = hasher.block_hashes(&tokens, None).unwrap();
    assert!(index.prefix_depths(&plain, &MatchOptions::default()).is_empty());
    assert_eq!(get(&metrics.hash_mismatches), 0);

    // A LoRA store: opaque engine hashes, indexed under the router's LoRA chain, never a mismatch.
    let lora_ns = Namespace { lora_name: Some("sql".into()), cache_salt: None };
    pump.apply(message(
        1,
        vec![stored(vec![EngineBlockHash::I64(11), EngineBlockHash::I64(12)], None, &tokens, false, lora_ns)],
    ));
    let lora = hasher.block_hashes(&tokens, namespace_prior(Some("sql"), None).as_ref()).unwrap();
    assert_eq!(index.prefix_depths(&lora, &MatchOptions::default())[0].blocks, 2);
    assert_eq!(get(&metrics.hash_mismatches), 0);

    // A store under a parent this stream never stored: skipped and counted.
    pump.apply(message(
        2,
        vec![stored(
            vec![EngineBlockHash::I64(5)],
            Some(EngineBlockHash::I64(99)),
            &tokens[..4],
            false,
            Namespace::default(),
        )],
    ));
    assert_eq!(get(&metrics.orphan_stores), 1);

    // Tokens that do not fit the hashes: skipped and counted.
    pump.apply(message(3, vec![stored(vec![EngineBlockHash::I64(5)], None, &tokens, false, Namespace::default())]));
    assert_eq!(get(&metrics.malformed_stores), 1);

    // A batch at an old seq is never applied twice.
    pump.apply(message(3, vec![KvEvent::AllCleared]));
    assert_eq!(get(&metrics.duplicates), 1);
    assert_eq!(
        index.prefix_depths(&salted, &MatchOptions::default())[0].blocks,
        2,
        "the duplicate clear was not applied"
    );

    // A stream nobody registered.
    let mut stray = message(9, vec![KvEvent::AllCleared]);
    stray.key = WorkerKey::new(WorkerUrl::new("http://other:1"), DpRank(0));
    pump.apply(stray);
    assert_eq!(get(&metrics.unknown_streams), 1);

    // A reset forgets everything, and the next batch may start at seq 0 again.
    pump.apply(StreamMessage { key: key(), seq: 0, update: StreamUpdate::Reset });
    assert!(index.prefix_depths(&salted, &MatchOptions::default()).is_empty());
    let engine: Vec<EngineBlockHash> = plain.iter().map(|h| EngineBlockHash::I64(h.0)).collect();
    pump.apply(message(0, vec![stored(engine, None, &tokens, false, Namespace::default())]));
    assert_eq!(index.prefix_depths(&plain, &MatchOptions::default())[0].blocks, 2);
}

/// What vLLM publishes for a hybrid model (full attention in group 0, a 16-token window in
/// group 1, Mamba in group 2): each group stores the prompt's blocks, the window lets the old
/// ones go, Mamba keeps the last state; the router credits what the engine can reuse, and a
/// group's removals leave the other groups' blocks. Encoded and decoded as vLLM's msgpack.
#[test]
fn a_hybrid_models_groups_are_kept_apart_and_read_together() {
    let (index, mut pump, metrics) = setup(HashMode::Unigram);
    let hasher = PageHasher::new(NonZeroUsize::new(PAGE).unwrap(), HashMode::Unigram);
    let tokens: Vec<u32> = (0..40).collect(); // 10 blocks
    let hashes = hasher.block_hashes(&tokens, None).unwrap();
    let engine: Vec<EngineBlockHash> = hashes.iter().map(|h| EngineBlockHash::I64(h.0)).collect();
    let group = |idx, kind| {
        let KvEvent::Stored(mut s) = stored(engine.clone(), None, &tokens, false, Namespace::default()) else {
            unreachable!()
        };
        (s.group_idx, s.group_kind) = (Some(idx), Some(kind));
        KvEvent::Stored(s)
    };
    let removed = |idx, range: std::ops::Range<usize>| KvEvent::Removed {
        block_hashes: engine[range].to_vec(),
        tier: Tier::Device,
        group_idx: Some(idx),
    };
    let events = vec![
        group(0, router_types::GroupKind::Full),
        group(1, router_types::GroupKind::SlidingWindow { window: 16 }),
        group(2, router_types::GroupKind::State),
        removed(1, 0..6),
        removed(2, 0..9),
    ];
    // Through vLLM's wire form and back.
    let batch = EventBatch { ts: 0.0, events, dp_rank: Some(DpRank(0)) };
    let bytes = kv_events::encode_batch(&batch, kv_events::EventForm::Map);
    let decoded = kv_events::decode_batch(&bytes, &kv_events::Limits::default()).unwrap();
    pump.apply(StreamMessage { key: key(), seq: 0, update: StreamUpdate::Batch(decoded) });
    assert_eq!(get(&metrics.orphan_stores) + get(&metrics.rejected_stores), 0);
    let depth = |q: &[router_types::BlockHash]| {
        index.prefix_depths(q, &MatchOptions::default()).first().map_or(0, |m| m.blocks)
    };
    // The whole prompt: full attention holds it, the window its last 4 blocks, Mamba its end.
    assert_eq!(depth(&hashes), 10);
    // Its first 8 blocks then another text: of the 4 blocks a 16-token window needs before the
    // end (cdiv(15, 4): blocks 4-7) the window holds 6-7, so only its run from the start counts:
    // none; Mamba holds no state before block 9 either. Full attention alone would say 8.
    let mut other = tokens[..32].to_vec();
    other.extend(500..508);
    let q = hasher.block_hashes(&other, None).unwrap();
    assert_eq!(depth(&q), 0);
    // A replica that starts late takes the stream from a peer's snapshot, groups and kinds with
    // it (through the wire form): it reads the prompts as this one does.
    let taken = pump.snapshot(1 << 20).snapshot;
    assert_eq!(taken.streams[0].groups.len(), 2, "groups 1 and 2 beside group 0");
    let limits = kv_ingest::SnapshotLimits { max_blocks: 1 << 20, max_bytes: 1 << 24 };
    let wire = kv_ingest::IndexSnapshot::decode(&taken.encode(), &limits).unwrap();
    assert_eq!(wire, taken);
    let (copy, mut seeded, _) = setup_seeded(wire.streams[0].clone());
    let copied =
        |q: &[router_types::BlockHash]| copy.prefix_depths(q, &MatchOptions::default()).first().map_or(0, |m| m.blocks);
    assert_eq!((copied(&hashes), copied(&q)), (10, 0), "the groups read together, as on the peer");
    // The seeded replica knows the groups as its own: a later removal in group 1 (its stream's,
    // not group 0's) shortens the window's hit, as on the peer.
    let tail = vec![removed(1, 6..10)];
    seeded.apply(StreamMessage {
        key: key(),
        seq: 1,
        update: StreamUpdate::Batch(Decoded {
            batch: EventBatch { ts: 0.0, events: tail.clone(), dp_rank: None },
            unknown_events: 0,
        }),
    });
    pump.apply(message(1, tail));
    assert_eq!(copied(&hashes), depth(&hashes));
    assert_eq!(depth(&hashes), 0, "no window blocks left before the end");
    // AllBlocksCleared clears the engine's cache: every group's.
    pump.apply(message(2, vec![KvEvent::AllCleared]));
    assert_eq!(depth(&hashes), 0);
}

/// A second index and pump, the stream seeded from `seed`.
fn setup_seeded(seed: kv_ingest::StreamSnapshot) -> (Arc<KvIndex>, Pump, Arc<PumpMetrics>) {
    let (index, mut pump, metrics, hashing) = empty(PAGE, HashMode::Unigram, true);
    assert_eq!(pump.add_seeded(key(), hashing, Some(seed)).unwrap(), Some(0), "resumes after the peer's seq");
    (index, pump, metrics)
}

/// Two prompts with the same token ids and different images: vLLM's block hash covers the
/// image (`extra_keys`), the router cannot compute it from a request, so the blocks from the
/// image on are never credited to a request by its token ids alone.
#[test]
fn blocks_keyed_by_inputs_a_request_cannot_show_are_not_credited_by_tokens() {
    let (index, mut pump, metrics) = setup(HashMode::Unigram);
    let hasher = PageHasher::new(NonZeroUsize::new(PAGE).unwrap(), HashMode::Unigram);
    let tokens: Vec<u32> = (0..12).collect(); // 3 blocks; an image's placeholders in block 1
    let hashes = hasher.block_hashes(&tokens, None).unwrap();
    let engine: Vec<EngineBlockHash> = (0..3).map(|i| EngineBlockHash::U64(1 << 63 | i)).collect();
    let store = |keys: Vec<Option<Box<[u8]>>>| {
        let KvEvent::Stored(mut s) = stored(engine.clone(), None, &tokens, false, Namespace::default()) else {
            unreachable!()
        };
        s.opaque_keys = keys;
        KvEvent::Stored(s)
    };
    let image: Box<[u8]> = Box::from(&b"\x01\x02image-a"[..]);
    pump.apply(message(0, vec![store(vec![None, Some(image), None])]));
    let depth = |q: &[router_types::BlockHash]| {
        index.prefix_depths(q, &MatchOptions::default()).first().map_or(0, |m| m.blocks)
    };
    assert_eq!(depth(&hashes), 1, "the text before the image only");
    // A store whose keys do not name each block is refused, and counted.
    let before = get(&metrics.malformed_stores);
    pump.apply(message(1, vec![store(vec![None, None])]));
    assert_eq!(get(&metrics.malformed_stores), before + 1);
}

/// A vLLM stream's published hashes are checked against vLLM's own (its default `sha256`): the
/// first chain-starting store that hashes as vLLM's makes the stream checked, and every later
/// block that differs is a mismatch; a stream whose first one does not (another algorithm or
/// seed) is counted unchecked and never counted against.
#[test]
fn vllm_hashes_are_checked_once_a_stream_shows_vllms_default_ones() {
    use renderer::vllm_hash::{block_hash, none_hash, published};

    let (_index, mut pump, metrics, hashing) = empty(PAGE, HashMode::Unigram, false);
    let (checked, other) = (key(), WorkerKey::new(WorkerUrl::new("http://v2:1"), DpRank(0)));
    pump.add_stream(checked.clone(), hashing).unwrap();
    pump.add_stream(other.clone(), hashing).unwrap();
    // vLLM's hashes of a chain of `tokens`, as published (the last eight bytes).
    let vllm = |tokens: &[u64]| {
        let mut parent = none_hash();
        tokens
            .chunks(PAGE)
            .map(|page| {
                parent = block_hash(&parent, page, &[], &[]);
                EngineBlockHash::U64(published(&parent))
            })
            .collect::<Vec<_>>()
    };
    let send = |pump: &mut Pump, key: &WorkerKey, seq, hashes: Vec<EngineBlockHash>, tokens: &[u64]| {
        let s = StoredBlocks::plain(hashes, None, tokens.to_vec(), PAGE as u32);
        let update = StreamUpdate::Batch(Decoded {
            batch: EventBatch { ts: 0.0, events: vec![KvEvent::Stored(s)], dp_rank: None },
            unknown_events: 0,
        });
        pump.apply(StreamMessage { key: key.clone(), seq, update });
    };
    let a: Vec<u64> = (1..=12).collect();
    send(&mut pump, &checked, 0, vllm(&a), &a);
    assert_eq!((get(&metrics.hashes_checked), get(&metrics.hash_mismatches)), (3, 0));
    // A later store whose second block's hash is not vLLM's of its tokens.
    let b: Vec<u64> = (20..28).collect();
    let mut wrong = vllm(&b);
    wrong[1] = EngineBlockHash::U64(7);
    send(&mut pump, &checked, 1, wrong, &b);
    assert_eq!((get(&metrics.hashes_checked), get(&metrics.hash_mismatches)), (5, 1));
    // A store under an integer parent cannot be checked (the parent's full hash is not sent).
    let mut child =
        StoredBlocks::plain(vec![EngineBlockHash::U64(99)], Some(vllm(&a)[2].clone()), vec![5; PAGE], PAGE as u32);
    child.block_size = PAGE as u32;
    let update = StreamUpdate::Batch(Decoded {
        batch: EventBatch { ts: 0.0, events: vec![KvEvent::Stored(child)], dp_rank: None },
        unknown_events: 0,
    });
    pump.apply(StreamMessage { key: checked.clone(), seq: 2, update });
    assert_eq!((get(&metrics.hashes_checked), get(&metrics.hash_mismatches)), (5, 1));
    assert_eq!(get(&metrics.stored), 3, "every store is applied, checked or not");

    // Another worker hashing otherwise: unchecked from its first store on.
    send(&mut pump, &other, 0, vec![EngineBlockHash::U64(1), EngineBlockHash::U64(2)], &b);
    send(&mut pump, &other, 1, vec![EngineBlockHash::U64(3), EngineBlockHash::U64(4)], &b);
    assert_eq!(get(&metrics.hash_unchecked_streams), 1);
    assert_eq!(get(&metrics.hash_mismatches), 1, "its hashes are not counted against it");
    assert_eq!(get(&metrics.hashes_checked), 7, "its first store was checked, to tell");
}

/// vLLM publishes a request's cache salt only inside its first block's extra keys (its own
/// `hash_block_tokens` input, `gen_wire_fixtures.py`'s `vllm_salt_alone_in_extra_keys`): the
/// blocks are credited to requests with that salt, never to unsalted ones.
#[test]
fn a_salted_vllm_chain_matches_requests_with_its_salt_only() {
    let doc: serde_json::Value =
        serde_json::from_str(include_str!("../../../tests/fixtures/kv_events/wire_cases.json")).unwrap();
    let case = doc["cases"].as_array().unwrap().iter().find(|c| c["name"] == "vllm_salt_alone_in_extra_keys").unwrap();
    let (index, mut pump, metrics, hashing) = empty(16, HashMode::Unigram, false);
    pump.add_stream(key(), hashing).unwrap();
    let decoded =
        kv_events::decode_batch(&unhex(case["payload_hex"].as_str().unwrap()), &kv_events::Limits::default()).unwrap();
    pump.apply(StreamMessage { key: key(), seq: 0, update: StreamUpdate::Batch(decoded) });
    assert_eq!(get(&metrics.stored), 2);
    let tokens: Vec<u32> = (840..888).collect();
    let hasher = PageHasher::new(hashing.page_size, HashMode::Unigram);
    let depth = |salt: Option<&str>| {
        let chain = hasher.block_hashes(&tokens, namespace_prior(None, salt).as_ref()).unwrap();
        index.prefix_depths(&chain, &MatchOptions::default()).first().map_or(0, |m| m.blocks)
    };
    assert_eq!(depth(Some("tenant-b")), 3, "the salted chain and the store continuing it");
    assert_eq!(depth(None), 0);
    assert_eq!(depth(Some("tenant-a")), 0);
    assert_eq!(
        (get(&metrics.hashes_checked), get(&metrics.hash_mismatches)),
        (2, 0),
        "the salt is vLLM's hash input too"
    );
}
