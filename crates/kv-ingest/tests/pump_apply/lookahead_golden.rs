//! vLLM's lookahead hashing against vLLM's own code: the batches a vLLM 0.33 block pool published
//! (`tests/fixtures/kv_lookahead/gen_lookahead_hits.py`: its `get_request_block_hasher` and
//! `cache_full_blocks`, lookahead 0 to 3, evictions), decoded and applied by the real pump;
//! every probe prompt's match, chained as the request path chains it for such a worker, is the
//! prefix vLLM's cache would reuse (on a replica seeded from its snapshot too), and every
//! published hash the pump can check is vLLM's own.

use std::num::NonZeroUsize;

use kv_index::{KvIndex, MatchOptions};
use renderer::lookahead::lookahead_block_hashes;
use renderer::{HashMode, PageHasher};
use serde_json::Value;

use super::{empty, get, key, vllm_applied};

const FIXTURE: &str = include_str!("../../../../tests/fixtures/kv_lookahead/lookahead_hits.json");

#[test]
fn a_lookahead_workers_match_is_the_prefix_vllm_would_reuse() {
    let doc: Value = serde_json::from_str(FIXTURE).unwrap();
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.iter().any(|c| c["lookahead"] == 0) && cases.iter().any(|c| c["lookahead"].as_u64() > Some(1)));
    for case in cases {
        let lookahead = case["lookahead"].as_u64().unwrap() as usize;
        let page = NonZeroUsize::new(case["block_size"].as_u64().unwrap() as usize).unwrap();
        let name = format!("lookahead {lookahead}, block size {page}");
        let (index, pump, metrics, hashing) = vllm_applied(page.get(), case["payloads_hex"].as_array().unwrap(), &name);
        assert!(get(&metrics.stored) > 20 && get(&metrics.removed) > 5, "{name}: stores and evictions");
        // Every chain-starting store is checked against vLLM's hash (lookahead included): all agree.
        assert!(get(&metrics.hashes_checked) > 10, "{name}: {} checked", get(&metrics.hashes_checked));
        assert_eq!((get(&metrics.hash_mismatches), get(&metrics.hash_unchecked_streams)), (0, 0), "{name}");
        let expected: Vec<usize> = (lookahead > 0).then_some(lookahead).into_iter().collect();
        assert_eq!(index.lookaheads().collect::<Vec<_>>(), expected, "{name}: the lookahead learned from the events");
        // A replica seeded from this one's snapshot (through its wire form) reads alike at once.
        let taken = pump.snapshot(1 << 20).snapshot;
        let limits = kv_ingest::SnapshotLimits { max_blocks: 1 << 20, max_bytes: 1 << 24 };
        let wire = kv_ingest::IndexSnapshot::decode(&taken.encode(), &limits).unwrap();
        let (replica, mut seeded, _, _) = empty(page.get(), HashMode::Unigram, false);
        seeded.add_seeded(key(), hashing, wire.streams.into_iter().next()).unwrap();
        assert_eq!(replica.lookaheads().collect::<Vec<_>>(), expected, "{name}: the replica's");
        let (mut hits, mut probes) = (0, 0);
        for probe in case["probes"].as_array().unwrap() {
            let tokens: Vec<u32> =
                probe["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
            let chain = match lookahead {
                0 => PageHasher::new(page, HashMode::Unigram).block_hashes(&tokens, None).unwrap(),
                l => lookahead_block_hashes(page, &tokens, l, None).unwrap(),
            };
            let depth =
                |index: &KvIndex| index.prefix_depths(&chain, &MatchOptions::default()).first().map_or(0, |m| m.blocks);
            let vllm = probe["hit_blocks"].as_u64().unwrap();
            assert_eq!(u64::from(depth(&index)), vllm, "{name}: probe {tokens:?}");
            assert_eq!(u64::from(depth(&replica)), vllm, "{name}, the replica: probe {tokens:?}");
            hits += usize::from(vllm > 0);
            probes += 1;
        }
        assert!(hits >= 30 && probes - hits >= 30, "{name}: {hits} of {probes} probes hit");
    }
}
