//! A worker's answer head as the relay reads it. Differential against httparse: an accepted
//! head parses whole at the same length (after any interim 1xx answers); its framing is what
//! its headers state, and a head whose framing two hops could read differently is refused.
#![no_main]

use h1_codec::fuzzing::{AnswerFraming, answer_head};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(Some(answer)) = answer_head(data) else { return };
    // Walk httparse over the interim answers to the final one.
    let mut at = 0;
    let (headers, status) = loop {
        let mut headers = [httparse::EMPTY_HEADER; 96];
        let mut resp = httparse::Response::new(&mut headers);
        let n = match resp.parse(&data[at..]) {
            Ok(httparse::Status::Complete(n)) => n,
            other => panic!("the relay took an answer httparse does not parse: {other:?}"),
        };
        let code = resp.code.unwrap();
        let list: Vec<(String, Vec<u8>)> =
            resp.headers.iter().map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec())).collect();
        at += n;
        if !(100..200).contains(&code) || code == 101 {
            break (list, code);
        }
    };
    assert_eq!(at, answer.len);
    assert_eq!(status, answer.status);
    let lengths: Vec<&[u8]> =
        headers.iter().filter(|(k, _)| k == "content-length").map(|(_, v)| v.as_slice()).collect();
    let te = headers.iter().any(|(k, _)| k == "transfer-encoding");
    assert!(lengths.len() <= 1, "several lengths accepted");
    assert!(!(te && !lengths.is_empty()), "a length with a transfer coding accepted");
    match answer.framing {
        AnswerFraming::Length(n) => {
            assert_eq!(std::str::from_utf8(lengths[0]).unwrap().trim().parse::<u64>().unwrap(), n);
        }
        AnswerFraming::Chunked => assert!(te),
        AnswerFraming::Empty => assert!(status == 204 || status == 304),
        AnswerFraming::Close => assert!(!answer.reusable),
    }
    // The relayed headers never carry hop-by-hop framing.
    let relayed = String::from_utf8_lossy(&answer.headers).to_ascii_lowercase();
    for line in relayed.split("\r\n") {
        let name = line.split(':').next().unwrap_or_default();
        assert!(!["transfer-encoding", "connection", "content-length"].contains(&name), "{relayed}");
    }
});
