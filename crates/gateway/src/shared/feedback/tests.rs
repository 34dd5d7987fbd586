use super::*;

fn route(caller: Option<[u8; 32]>, quality: Option<f64>) -> Route {
    Route { decision: "chat".into(), pool: "large".into(), quality, caller }
}

#[test]
fn a_record_round_trips_and_names_its_caller_first() {
    for caller in [None, Some([0xab; 32]), Some([0; 32])] {
        for quality in [None, Some(0.0), Some(0.75), Some(1.0), Some(0.1 + 0.2)] {
            let r = route(caller, quality);
            let bytes = encode(&r).unwrap();
            assert_eq!(decode(&bytes), Some(r), "{}", String::from_utf8_lossy(&bytes));
            // The claim script compares this head: 70 bytes, the caller at a fixed place.
            let head = head(caller.as_ref());
            assert_eq!(head.len(), 70);
            assert!(bytes.starts_with(&head));
        }
    }
    let (a, b) = (head(Some(&[1; 32])), head(Some(&[2; 32])));
    assert_ne!(a, b);
    assert_ne!(a, head(None), "anonymous is not a caller");
}

#[test]
fn a_record_is_bounded_and_an_unsound_one_is_refused() {
    let long = "x".repeat(MAX_NAME + 1);
    for bad in [
        Route { decision: long.clone(), ..route(None, None) },
        Route { pool: long, ..route(None, None) },
        Route { pool: "a\nb".into(), ..route(None, None) },
        Route { decision: String::new(), ..route(None, None) },
        route(None, Some(1.5)),
        route(None, Some(f64::NAN)),
    ] {
        assert_eq!(encode(&bad), None, "{bad:?}");
    }
    let most =
        Route { decision: "d".repeat(MAX_NAME), pool: "p".repeat(MAX_NAME), ..route(Some([9; 32]), Some(0.123)) };
    let bytes = encode(&most).unwrap();
    assert!(bytes.len() <= MAX_RECORD);
    assert_eq!(decode(&bytes), Some(most));

    let good = encode(&route(Some([0x5c; 32]), Some(0.5))).unwrap();
    // Cut before its pool's line: never a record.
    let pool_at = good.len() - "large".len();
    for n in 0..pool_at {
        assert_eq!(decode(&good[..n]), None, "cut at {n}");
    }
    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = good.clone();
        f(&mut b);
        decode(&b)
    };
    assert_eq!(with(&|b| b[0] = b'X'), None, "magic");
    assert_eq!(with(&|b| b[5] = b'A'), None, "uppercase hex is not how callers are written");
    assert_eq!(with(&|b| b[5] = b'-'), None, "half anonymous");
    assert_eq!(with(&|b| b[69] = b' '), None, "the head's end");
    assert_eq!(with(&|b| b.extend_from_slice(b"\nmore")), None, "a fourth line");
    assert_eq!(with(&|b| b.extend_from_slice(&[b'x'; MAX_RECORD])), None, "too long");
    assert_eq!(with(&|b| b[70] = b'7'), None, "a quality of 7.5");
    assert_eq!(with(&|b| b.push(0xff)), None, "not UTF-8");
}

#[test]
fn a_claims_answer_is_read_strictly() {
    let bulk = |b: &[u8]| Reply::Bulk(bytes::Bytes::copy_from_slice(b));
    let rec = encode(&route(None, Some(0.5))).unwrap();
    assert_eq!(claimed(&[bulk(b"judged"), Reply::Int(2)], 2), Claim::Judged(1));
    assert_eq!(claimed(&[bulk(b"unknown"), Reply::Int(1)], 1), Claim::Unknown(0));
    assert_eq!(claimed(&[bulk(b"unknown"), Reply::Int(2)], 1), Claim::Unavailable, "no second id");
    assert_eq!(claimed(&[bulk(b"judged"), Reply::Int(0)], 1), Claim::Unavailable);
    assert_eq!(claimed(&[bulk(b"claimed"), bulk(&rec), bulk(b"")], 2), {
        Claim::Claimed(vec![Some(route(None, Some(0.5))), None])
    });
    assert_eq!(claimed(&[bulk(b"claimed"), bulk(b"SGR1 garbage")], 1), Claim::Unknown(0), "taken and unreadable");
    assert_eq!(claimed(&[bulk(b"claimed"), bulk(&rec)], 2), Claim::Unavailable, "one record short");
    assert_eq!(claimed(&[bulk(b"claimed"), Reply::Int(3)], 1), Claim::Unavailable);
    assert_eq!(claimed(&[], 1), Claim::Unavailable);
}

#[test]
fn an_arms_totals_are_believed_only_when_sound() {
    let bulk = |b: &str| Reply::Bulk(bytes::Bytes::copy_from_slice(b.as_bytes()));
    let fields =
        |q: &str, a: &str, n: Reply| vec![bulk("chat"), bulk("large"), bulk(q), bulk(a), bulk("2"), bulk("-16.5"), n];
    let t = totals(&fields("0.5", "3.5", Reply::Int(4))).unwrap();
    assert_eq!((t.decision.as_str(), t.pool.as_str(), t.quality), ("chat", "large", Some(0.5)));
    assert_eq!(t.evidence, Evidence { alpha: 3.5, beta: 2.0, elo: -16.5, updates: 4 });
    assert_eq!(totals(&fields("", "1.5e+2", bulk("4"))).unwrap().evidence.alpha, 150.0, "as Redis writes floats");
    assert_eq!(totals(&fields("", "1", bulk("4"))).unwrap().quality, None);
    for bad in [
        fields("2", "1", Reply::Int(1)),
        fields("", "inf", Reply::Int(1)),
        fields("", "nan", Reply::Int(1)),
        fields("", "1e13", Reply::Int(1)),
        fields("", "1", Reply::Int(-1)),
        fields("", "1", bulk("1.5")),
        fields("", "1", Reply::Nil),
        vec![Reply::Nil; 7],
        fields("", "1", Reply::Int(1))[..6].to_vec(),
    ] {
        assert_eq!(totals(&bad), None, "{bad:?}");
    }
    let mut too_long = fields("", "1", Reply::Int(1));
    too_long[0] = bulk(&"d".repeat(MAX_NAME + 1));
    assert_eq!(totals(&too_long), None);
}

#[test]
fn an_arms_key_is_bounded_and_its_own() {
    let id = arm_id("chat", "large");
    assert_eq!((id.len(), id.bytes().all(|b| b.is_ascii_hexdigit())), (32, true));
    assert_eq!(arm_id(&"d".repeat(10_000), "p").len(), 32);
    assert_ne!(arm_id("ab", "c"), arm_id("a", "bc"), "the names' boundary counts");
    assert_ne!(id, arm_id("large", "chat"));
}
