//! The encoder and decoder agree for every event shape, in both layouts; and
//! random or truncated bytes give a typed error, never a panic.

use kv_events::{EventForm, Limits, WireError, decode_batch, encode_batch};
use router_types::{DpRank, EngineBlockHash, EventBatch, KvEvent, Namespace, StoredBlocks, Tier};

fn sample() -> EventBatch {
    EventBatch {
        ts: 1_764_000_000.25,
        dp_rank: Some(DpRank(3)),
        events: vec![
            KvEvent::Stored(StoredBlocks::plain(
                vec![EngineBlockHash::I64(-5), EngineBlockHash::I64(i64::MAX)],
                Some(EngineBlockHash::I64(i64::MIN)),
                (0..32).collect(),
                16,
            )),
            KvEvent::Stored(StoredBlocks {
                block_hashes: vec![EngineBlockHash::U64(u64::MAX - 7)],
                parent: None,
                token_ids: vec![1, 2, 3, 4, 5],
                bigram: true,
                block_size: 4,
                tier: Tier::Host,
                namespace: Namespace { lora_name: Some("sql-lora".into()), cache_salt: Some("tenant".into()) },
                group_idx: Some(1),
                group_kind: Some(router_types::GroupKind::SlidingWindow { window: 128 }),
                opaque_keys: Vec::new(),
                lookahead: Vec::new(),
            }),
            KvEvent::Stored(StoredBlocks {
                tier: Tier::Disk,
                lookahead: vec![vec![151_001, 7].into()],
                ..StoredBlocks::plain(
                    vec![EngineBlockHash::Bytes(vec![0xab; 32].into())],
                    Some(EngineBlockHash::Bytes(vec![0xcd; 32].into())),
                    vec![151_000; 16],
                    16,
                )
            }),
            KvEvent::Removed { block_hashes: vec![EngineBlockHash::I64(-5)], tier: Tier::External, group_idx: Some(2) },
            KvEvent::AllCleared,
        ],
    }
}

#[test]
fn map_form_round_trips() {
    let batch = sample();
    let decoded = decode_batch(&encode_batch(&batch, EventForm::Map), &Limits::default()).unwrap();
    assert_eq!(decoded.batch, batch);
    assert_eq!(decoded.unknown_events, 0);
}

#[test]
fn positional_form_round_trips_what_it_carries() {
    let mut batch = sample();
    // The positional layout has no cache_salt, group_idx, group kind or lookahead.
    for e in &mut batch.events {
        match e {
            KvEvent::Stored(s) => {
                s.namespace.cache_salt = None;
                s.group_idx = None;
                s.group_kind = None;
                s.lookahead.clear();
            }
            KvEvent::Removed { group_idx, .. } => *group_idx = None,
            KvEvent::AllCleared => {}
        }
    }
    let decoded = decode_batch(&encode_batch(&batch, EventForm::Positional), &Limits::default()).unwrap();
    assert_eq!(decoded.batch, batch);
}

#[test]
fn limits_are_enforced_before_allocation() {
    let batch = sample();
    let bytes = encode_batch(&batch, EventForm::Map);
    let tight = Limits { max_hashes: 1, max_tokens: 1_000, ..Limits::default() };
    match decode_batch(&bytes, &tight) {
        Err(WireError::InEvent { index: 0, source }) => {
            assert!(matches!(*source, WireError::TooLong { what: "block_hashes", len: 2, limit: 1 }))
        }
        other => panic!("unexpected {other:?}"),
    }
    let tight = Limits { max_hashes: 10, max_tokens: 8, ..Limits::default() };
    assert_eq!(decode_batch(&bytes, &tight).unwrap_err().kind(), "too_long");
}

/// A payload over the byte limit is refused whole, before any of it is parsed.
#[test]
fn payload_over_the_byte_limit_is_refused() {
    let bytes = encode_batch(&sample(), EventForm::Map);
    let exact = Limits { max_payload_bytes: bytes.len(), ..Limits::default() };
    assert!(decode_batch(&bytes, &exact).is_ok(), "a payload at the limit decodes");
    let tight = Limits { max_payload_bytes: bytes.len() - 1, ..Limits::default() };
    match decode_batch(&bytes, &tight) {
        Err(WireError::TooLong { what: "payload bytes", len, limit }) => {
            assert_eq!((len, limit), (bytes.len(), bytes.len() - 1))
        }
        other => panic!("unexpected {other:?}"),
    }
    // Refused before parsing: even bytes that are not msgpack at all say "too long".
    let junk = vec![0xc1; 64];
    let small = Limits { max_payload_bytes: 63, ..Limits::default() };
    assert_eq!(decode_batch(&junk, &small).unwrap_err().kind(), "too_long");
    assert!(
        Limits::default().max_payload_bytes >= 11 * Limits::default().max_tokens,
        "one event at the token limit fits"
    );
}

/// Length prefixes claiming 2^32 - 1 items in a short payload: an error from
/// the length check, not a 2^32-entry allocation (which would abort the test).
#[test]
fn huge_length_prefixes_in_short_payloads_do_not_allocate() {
    let ts = [0xcb, 0, 0, 0, 0, 0, 0, 0, 0];
    let u32_max = [0xff, 0xff, 0xff, 0xff];
    let limits = Limits { max_hashes: usize::MAX, max_tokens: usize::MAX, ..Limits::default() };
    // The batch array, the events array, an event map, block_hashes, token_ids, a bin hash.
    let mut cases: Vec<Vec<u8>> =
        vec![[&[0xdd][..], &u32_max].concat(), [&[0x93][..], &ts, &[0xdd], &u32_max].concat()];
    cases.push([&[0x93][..], &ts, &[0x91, 0xdf], &u32_max].concat());
    let event_with = |key: &str, tail: &[u8]| {
        let mut e = vec![0x93];
        e.extend_from_slice(&ts);
        e.extend_from_slice(&[0x91, 0x82, 0xa4]);
        e.extend_from_slice(b"type");
        e.push(0xab);
        e.extend_from_slice(b"BlockStored");
        e.push(0xa0 | key.len() as u8);
        e.extend_from_slice(key.as_bytes());
        e.extend_from_slice(tail);
        e
    };
    cases.push(event_with("block_hashes", &[&[0xdd][..], &u32_max, &[1, 2, 3]].concat()));
    cases.push(event_with("token_ids", &[&[0xdd][..], &u32_max, &[1, 2, 3]].concat()));
    cases.push(event_with("block_hashes", &[&[0x91, 0xc6][..], &u32_max, &[1, 2, 3]].concat()));
    for (i, payload) in cases.iter().enumerate() {
        let err = decode_batch(payload, &limits).unwrap_err();
        assert_eq!(err.kind(), "truncated", "case {i}: {err}");
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Every strict prefix of a valid payload is an error; so is every random byte string.
#[test]
fn truncated_and_random_input_never_panics() {
    let limits = Limits::default();
    for form in [EventForm::Map, EventForm::Positional] {
        let bytes = encode_batch(&sample(), form);
        for cut in 0..bytes.len() {
            assert!(decode_batch(&bytes[..cut], &limits).is_err(), "prefix of {cut} bytes decoded");
        }
    }
    let mut rng = Rng(0xC0FFEE);
    let valid = encode_batch(&sample(), EventForm::Map);
    let mut ok = 0;
    for round in 0..20_000 {
        let bytes: Vec<u8> = if round % 2 == 0 {
            (0..rng.next() % 64).map(|_| rng.next() as u8).collect()
        } else {
            // Flip a few bytes of a valid payload.
            let mut b = valid.clone();
            for _ in 0..1 + rng.next() % 4 {
                let i = (rng.next() % b.len() as u64) as usize;
                b[i] = rng.next() as u8;
            }
            b
        };
        if decode_batch(&bytes, &limits).is_ok() {
            ok += 1;
        }
    }
    assert!(ok < 20_000, "some mutations must fail");
}

#[test]
fn unknown_events_keys_and_trailing_fields_are_tolerated() {
    // [ts, [{"type": "Future", "x": [1, 2]}, {"type": "AllBlocksCleared", "new": {"a": 1}}], nil, "extra", 7]
    let mut b = vec![0x95, 0xcb];
    b.extend_from_slice(&1.0f64.to_be_bytes());
    b.push(0x92);
    b.extend_from_slice(&[0x82, 0xa4]);
    b.extend_from_slice(b"type");
    b.push(0xa6);
    b.extend_from_slice(b"Future");
    b.push(0xa1);
    b.extend_from_slice(b"x");
    b.extend_from_slice(&[0x92, 0x01, 0x02]);
    b.extend_from_slice(&[0x82, 0xa4]);
    b.extend_from_slice(b"type");
    b.push(0xb0);
    b.extend_from_slice(b"AllBlocksCleared");
    b.push(0xa3);
    b.extend_from_slice(b"new");
    b.extend_from_slice(&[0x81, 0xa1, b'a', 0x01]);
    b.push(0xc0);
    b.push(0xa5);
    b.extend_from_slice(b"extra");
    b.push(0x07);
    let d = decode_batch(&b, &Limits::default()).unwrap();
    assert_eq!(d.batch.events, vec![KvEvent::AllCleared]);
    assert_eq!(d.unknown_events, 1);
    assert_eq!(d.batch.dp_rank, None);
}
