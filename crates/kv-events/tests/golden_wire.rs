//! Payloads encoded by SGLang 0.5.23's and vLLM's own event classes and
//! encoder (`tests/fixtures/kv_events/wire_cases.json`, made by
//! `tests/fixtures/kv_events/gen_wire_fixtures.py`), plus handmade legacy and
//! malformed payloads: each decodes to exactly the expected events, or fails.

use kv_events::{Limits, decode_batch};
use router_types::{EngineBlockHash, GroupKind, KvEvent};
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize)]
struct Fixture {
    sglang_version: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    engine: String,
    payload_hex: String,
    #[serde(default)]
    expect: Option<Value>,
    #[serde(default)]
    error: bool,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn hash_json(h: &EngineBlockHash) -> Value {
    match h {
        EngineBlockHash::I64(v) => serde_json::json!({"i64": v}),
        EngineBlockHash::U64(v) => serde_json::json!({"u64": v}),
        EngineBlockHash::Bytes(b) => {
            serde_json::json!({"bytes_hex": b.iter().map(|x| format!("{x:02x}")).collect::<String>()})
        }
    }
}

/// Our decoded event in the fixture's vocabulary. The medium is compared as a tier.
fn event_json(e: &KvEvent) -> Value {
    match e {
        KvEvent::Stored(s) => serde_json::json!({
            "type": "BlockStored",
            "block_hashes": s.block_hashes.iter().map(hash_json).collect::<Vec<_>>(),
            "parent": s.parent.as_ref().map(hash_json),
            "token_ids": s.token_ids,
            "bigram": s.bigram,
            "block_size": s.block_size,
            "tier": s.tier.as_str(),
            "lora_name": s.namespace.lora_name,
            "cache_salt": s.namespace.cache_salt,
            "group_idx": s.group_idx,
            "group_kind": s.group_kind.map(|k| match k {
                GroupKind::Full => serde_json::json!({"kind": "full"}),
                GroupKind::SlidingWindow { window } => serde_json::json!({"kind": "sliding_window", "window": window}),
                GroupKind::State => serde_json::json!({"kind": "state"}),
            }),
            "opaque_keys": s.opaque_keys.iter().map(|k| k.as_deref().map(hex)).collect::<Vec<_>>(),
            "lookahead": s.lookahead,
        }),
        KvEvent::Removed { block_hashes, tier, group_idx } => serde_json::json!({
            "type": "BlockRemoved",
            "block_hashes": block_hashes.iter().map(hash_json).collect::<Vec<_>>(),
            "tier": tier.as_str(),
            "group_idx": group_idx,
        }),
        KvEvent::AllCleared => serde_json::json!({"type": "AllBlocksCleared"}),
    }
}

/// The fixture's expected event with `medium` mapped to our tier.
fn expected_json(e: &Value) -> Value {
    let mut e = e.clone();
    let Some(obj) = e.as_object_mut() else { return e };
    if obj.get("type").and_then(Value::as_str) != Some("AllBlocksCleared") {
        let medium = obj.remove("medium").and_then(|m| m.as_str().map(str::to_string));
        let tier = router_types::Tier::from_medium(medium.as_deref()).map(|t| t.as_str().to_string());
        obj.insert("tier".into(), serde_json::json!(tier));
    }
    for k in ["opaque_keys", "lookahead"] {
        if obj.get("type").and_then(Value::as_str) == Some("BlockStored") && !obj.contains_key(k) {
            obj.insert(k.into(), serde_json::json!([]));
        }
    }
    for k in ["lora_name", "cache_salt", "group_idx", "group_kind", "parent"] {
        if obj.get("type").and_then(Value::as_str) == Some("BlockStored") && !obj.contains_key(k) {
            obj.insert(k.into(), Value::Null);
        }
    }
    if obj.get("type").and_then(Value::as_str) == Some("BlockRemoved") && !obj.contains_key("group_idx") {
        obj.insert("group_idx".into(), Value::Null);
    }
    e
}

#[test]
fn every_engine_payload_decodes_exactly() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/kv_events/wire_cases.json");
    let fx: Fixture = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!(fx.sglang_version, "0.5.23");
    let engines: std::collections::BTreeSet<&str> = fx.cases.iter().map(|c| c.engine.as_str()).collect();
    assert!(engines.contains("sglang") && engines.contains("vllm"), "{engines:?}");
    let mut failures = Vec::new();
    for case in &fx.cases {
        let result = decode_batch(&unhex(&case.payload_hex), &Limits::default());
        match (case.error, result) {
            (true, Err(_)) => {}
            (true, Ok(d)) => failures.push(format!("{}: decoded {:?}, expected an error", case.name, d.batch)),
            (false, Err(e)) => failures.push(format!("{}: {e}", case.name)),
            (false, Ok(d)) => {
                let expect = case.expect.as_ref().expect("expect");
                let want_events: Vec<Value> = expect["events"].as_array().unwrap().iter().map(expected_json).collect();
                let got_events: Vec<Value> = d.batch.events.iter().map(event_json).collect();
                if got_events != want_events {
                    failures.push(format!("{}: events\n  want {want_events:?}\n  got  {got_events:?}", case.name));
                }
                if (d.batch.ts - expect["ts"].as_f64().unwrap()).abs() > 1e-9 {
                    failures.push(format!("{}: ts", case.name));
                }
                if d.batch.dp_rank.map(|r| u64::from(r.0)) != expect["dp_rank"].as_u64() {
                    failures.push(format!("{}: dp_rank {:?} vs {}", case.name, d.batch.dp_rank, expect["dp_rank"]));
                }
                if d.unknown_events as u64 != expect["unknown_skipped"].as_u64().unwrap_or(0) {
                    failures
                        .push(format!("{}: unknown {} vs {}", case.name, d.unknown_events, expect["unknown_skipped"]));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} of {} cases fail:\n{}", failures.len(), fx.cases.len(), failures.join("\n"));
}
