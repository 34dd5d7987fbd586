//! Hybrid models: what an engine with full-attention, sliding-window and Mamba groups can
//! reuse, against vLLM's own `HybridKVCacheCoordinator` (`tests/fixtures/kv_hybrid`), and the
//! index keeping each group's holdings apart.

use std::sync::Arc;

use kv_index::{GroupBlocks, IndexConfig, KvIndex, MAX_GROUPS, ManualClock, reusable_prefix};
use router_types::{GroupKind, Tier, WorkerUrl};
use serde_json::Value;

use super::{blocks, depth_of, hashes, key};

fn index() -> KvIndex {
    KvIndex::new(IndexConfig::default(), Arc::new(ManualClock::default()))
}

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/kv_hybrid/hybrid_hits.json");

fn kind(group: &Value) -> GroupKind {
    match group["kind"].as_str() {
        Some("full") => GroupKind::Full,
        Some("sliding_window") => GroupKind::SlidingWindow { window: group["window"].as_u64().unwrap() as u32 },
        Some("mamba") => GroupKind::State,
        other => panic!("unknown kind {other:?}"),
    }
}

#[test]
fn the_reused_prefix_is_vllms_for_every_golden_cache() {
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(FIXTURE).unwrap()).unwrap();
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 400, "{} cases", cases.len());
    let mut differ_from_full_only = 0;
    for (n, case) in cases.iter().enumerate() {
        let block_size = case["block_size"].as_u64().unwrap() as u32;
        let max = case["max_blocks"].as_u64().unwrap() as usize;
        let held: Vec<(GroupBlocks, Vec<usize>)> = case["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                let held = g["held"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
                (GroupBlocks::of(kind(g), block_size), held)
            })
            .collect();
        let groups: Vec<(GroupBlocks, _)> = held.iter().map(|(k, h)| (*k, |i: usize| h.contains(&i))).collect();
        let want = case["hit_blocks"].as_u64().unwrap() as usize;
        assert_eq!(reusable_prefix(max, &groups), want, "case {n}: {case}");
        let full: Vec<_> = groups.iter().filter(|(k, _)| *k == GroupBlocks::Full).collect();
        let full_only =
            if full.is_empty() { max } else { (0..max).take_while(|&i| full.iter().all(|(_, h)| h(i))).count() };
        differ_from_full_only += usize::from(full_only != want);
    }
    // The golden is not what counting full attention alone gives (the index before groups).
    assert!(differ_from_full_only > 100, "{differ_from_full_only}");
}

/// An engine with three groups (full attention, a window of two 4-token blocks, Mamba) that
/// computed a 32-token prompt: every group stored its 8 blocks, then the window let blocks 0-5
/// go and Mamba all but the last state.
fn hybrid_worker(index: &KvIndex, url: &str, chain: &[kv_index::StoredBlock]) {
    let primary = index.stream(&key(url, 0)).unwrap();
    let window = index.group_stream(primary, 1).unwrap();
    let state = index.group_stream(primary, 2).unwrap();
    index.set_group_kind(window, GroupBlocks::of(GroupKind::SlidingWindow { window: 8 }, 4)).unwrap();
    index.set_group_kind(state, GroupBlocks::of(GroupKind::State, 4)).unwrap();
    for stream in [primary, window, state] {
        index.store(stream, None, chain, Tier::Device).unwrap();
    }
    let engines: Vec<u64> = chain.iter().map(|b| b.engine).collect();
    index.remove(window, &engines[..6], Tier::Device).unwrap();
    index.remove(state, &engines[..7], Tier::Device).unwrap();
}

#[test]
fn a_hybrid_worker_is_credited_what_its_engine_can_reuse() {
    let index = index();
    let tokens: Vec<u32> = (0..32).collect();
    let chain = blocks(&tokens, None);
    hybrid_worker(&index, "http://hybrid", &chain);
    // A plain worker holding the same prompt, for comparison.
    let plain = index.stream(&key("http://plain", 0)).unwrap();
    index.store(plain, None, &chain, Tier::Device).unwrap();

    // The whole prompt: every group serves its end.
    assert_eq!(depth_of(&index, "http://hybrid", &hashes(&chain)), 8);
    // A prompt that shares 5 blocks, then differs: full attention holds them, but neither the
    // window (blocks 3-4 gone) nor the state at block 4 is there: nothing is reusable.
    let mut other: Vec<u32> = tokens[..20].to_vec();
    other.extend(100..112);
    let q = hashes(&blocks(&other, None));
    assert_eq!(depth_of(&index, "http://plain", &q), 5);
    assert_eq!(depth_of(&index, "http://hybrid", &q), 0, "the window and the state are gone there");
    // The worker's blocks count once (its full-attention group's).
    let id = index.worker_id(&WorkerUrl::new("http://hybrid"));
    assert_eq!(index.worker_blocks()[&id], 8);
}

#[test]
fn a_groups_removal_leaves_the_other_groups_blocks() {
    let index = index();
    let chain = blocks(&(0..32).collect::<Vec<u32>>(), None);
    hybrid_worker(&index, "http://hybrid", &chain);
    let primary = index.stream(&key("http://hybrid", 0)).unwrap();
    // The window's removals of blocks 0-5 (above) left full attention's: its parent is found.
    assert!(index.parent(primary, chain[2].engine).is_some());
    // A chain the window continues under a block only full attention still holds.
    let window = index.group_stream(primary, 1).unwrap();
    assert!(index.parent(window, chain[2].engine).is_some(), "found in the family");
    // Clearing the primary stream clears its groups; the worker then holds nothing.
    index.clear_stream(primary).unwrap();
    assert_eq!(depth_of(&index, "http://hybrid", &hashes(&chain)), 0);
    assert!(index.parent(window, chain[7].engine).is_none());
}

#[test]
fn a_publisher_cannot_open_groups_without_bound() {
    let index = index();
    let primary = index.stream(&key("http://many", 0)).unwrap();
    for g in 1..MAX_GROUPS as u32 {
        index.group_stream(primary, g).unwrap();
    }
    assert!(matches!(index.group_stream(primary, 999), Err(kv_index::IndexError::TooManyGroups)));
    // Known groups keep their streams; retiring the primary retires them all.
    assert!(index.group_stream(primary, 1).is_ok());
    let before = index.stats().streams;
    index.retire_stream(primary).unwrap();
    assert_eq!(before - index.stats().streams, MAX_GROUPS, "the primary and its groups");
}
