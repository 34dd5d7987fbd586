//! Request heads on both front ends: the fast path's parse and the fallback guard's check.
//! Differential against httparse (the tokenizer both use; the framing rules on top are ours):
//! whatever either accepts httparse parses whole, at the same length, and the body length
//! each finds is the one the headers state. The fast path never takes a head the guard refuses.
#![no_main]

use h1_codec::fuzzing::{Body, FastHead, fallback_head, fast_head};
use libfuzzer_sys::fuzz_target;

fn parsed(data: &[u8]) -> Option<(usize, Vec<(String, Vec<u8>)>, Option<String>)> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(data) {
        Ok(httparse::Status::Complete(n)) => Some((
            n,
            req.headers.iter().map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec())).collect(),
            req.method.map(str::to_owned),
        )),
        _ => None,
    }
}

fuzz_target!(|data: &[u8]| {
    let fast = fast_head(data);
    let guard = fallback_head(data);
    if let FastHead::Fast { head_len, body_len } = fast {
        let (n, headers, method) = parsed(data).expect("the fast path took a head httparse does not parse");
        assert_eq!(n, head_len);
        assert_eq!(method.as_deref(), Some("POST"));
        let lengths: Vec<&[u8]> =
            headers.iter().filter(|(k, _)| k == "content-length").map(|(_, v)| v.as_slice()).collect();
        assert_eq!(lengths.len(), 1, "the fast path framed a body without exactly one length");
        let stated: usize = std::str::from_utf8(lengths[0]).unwrap().trim().parse().unwrap();
        assert_eq!(stated, body_len);
        assert!(!headers.iter().any(|(k, _)| k == "transfer-encoding"));
        match &guard {
            Ok(Some((len, body))) => {
                assert_eq!(*len, head_len);
                let expected = if body_len == 0 { Body::Empty } else { Body::Length(body_len as u64) };
                assert_eq!(*body, expected, "the two front ends disagree on where the body ends");
            }
            // The guard is stricter on request targets hyper's Uri refuses.
            Err(why) => assert!(why.contains("target") || why.contains("authorization"), "{why}"),
            Ok(None) => panic!("the guard waits for more of a head the fast path took"),
        }
    }
    if let Ok(Some((len, body))) = guard {
        let (n, headers, _) = parsed(data).expect("the guard took a head httparse does not parse");
        assert_eq!(n, len);
        let te = headers.iter().any(|(k, _)| k == "transfer-encoding");
        let cl = headers.iter().any(|(k, _)| k == "content-length");
        assert!(!(te && cl), "a head with both framings was taken");
        if body == Body::Chunked {
            assert!(te);
        }
    }
});
