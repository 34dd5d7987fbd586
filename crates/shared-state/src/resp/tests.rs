//! The decoder on every RESP2 type, on replies split at every byte, and on hostile input
//! (bad markers, bad lengths, claims beyond the limits); the encoder's framing.

use super::*;

fn decoder(max: usize) -> Decoder {
    Decoder::new(Limits { max_reply_bytes: max })
}

/// Every reply in `wire`, fed whole.
fn all(wire: &[u8]) -> Result<Vec<Reply>, Error> {
    let mut d = decoder(1 << 20);
    let mut buf = BytesMut::from(wire);
    let mut out = Vec::new();
    while let Some(r) = d.decode(&mut buf)? {
        out.push(r);
    }
    assert!(buf.is_empty(), "left over: {buf:?}");
    Ok(out)
}

fn one(wire: &[u8]) -> Reply {
    let mut replies = all(wire).unwrap();
    assert_eq!(replies.len(), 1, "{replies:?}");
    replies.pop().unwrap()
}

fn err(wire: &[u8], max: usize) -> String {
    let mut d = decoder(max);
    let mut buf = BytesMut::from(wire);
    loop {
        match d.decode(&mut buf) {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("no error for {wire:?}"),
            Err(Error::Protocol(why)) => return why,
            Err(e) => panic!("not a protocol error: {e}"),
        }
    }
}

fn bulk(b: &[u8]) -> Reply {
    Reply::Bulk(Bytes::copy_from_slice(b))
}

#[test]
fn every_type_decodes() {
    assert_eq!(one(b"+OK\r\n"), Reply::Simple("OK".into()));
    assert_eq!(one(b"+\r\n"), Reply::Simple(String::new()));
    assert_eq!(one(b"-ERR wrong type\r\n"), Reply::Error("ERR wrong type".into()));
    assert_eq!(one(b":0\r\n"), Reply::Int(0));
    assert_eq!(one(b":-42\r\n"), Reply::Int(-42));
    assert_eq!(one(b":9223372036854775807\r\n"), Reply::Int(i64::MAX));
    assert_eq!(one(b":-9223372036854775808\r\n"), Reply::Int(i64::MIN));
    assert_eq!(one(b"$5\r\nhello\r\n"), bulk(b"hello"));
    assert_eq!(one(b"$0\r\n\r\n"), bulk(b""));
    assert_eq!(one(b"$4\r\na\r\nb\r\n"), bulk(b"a\r\nb"));
    assert_eq!(one(b"$-1\r\n"), Reply::Nil);
    assert_eq!(one(b"*-1\r\n"), Reply::Nil);
    assert_eq!(one(b"*0\r\n"), Reply::Array(vec![]));
    assert_eq!(
        one(b"*3\r\n:1\r\n$-1\r\n+x\r\n"),
        Reply::Array(vec![Reply::Int(1), Reply::Nil, Reply::Simple("x".into())])
    );
}

#[test]
fn nested_arrays_and_several_replies_in_one_buffer() {
    let wire = b"*2\r\n*2\r\n:1\r\n*0\r\n*1\r\n*1\r\n$1\r\nz\r\n:7\r\n";
    let replies = all(wire).unwrap();
    assert_eq!(
        replies,
        vec![
            Reply::Array(vec![
                Reply::Array(vec![Reply::Int(1), Reply::Array(vec![])]),
                Reply::Array(vec![Reply::Array(vec![bulk(b"z")])]),
            ]),
            Reply::Int(7),
        ]
    );
}

#[test]
fn a_reply_split_at_every_byte_decodes_the_same() {
    let wire: &[u8] = b"*4\r\n$6\r\nab\r\ncd\r\n*2\r\n:-3\r\n-ERR x\r\n$-1\r\n+OK\r\n:5\r\n";
    let expected = all(wire).unwrap();
    for step in 1..=3 {
        let mut d = decoder(1 << 20);
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for chunk in wire.chunks(step) {
            buf.extend_from_slice(chunk);
            while let Some(r) = d.decode(&mut buf).unwrap() {
                got.push(r);
            }
        }
        assert_eq!(got, expected, "step {step}");
        assert!(buf.is_empty());
    }
}

#[test]
fn an_incomplete_reply_waits_and_consumes_only_whole_elements() {
    let mut d = decoder(1 << 20);
    let mut buf = BytesMut::from(&b"*2\r\n:1\r\n$5\r\nhel"[..]);
    assert_eq!(d.decode(&mut buf).unwrap(), None);
    // The array header and its first element are consumed; the partial bulk is kept.
    assert_eq!(&buf[..], b"$5\r\nhel");
    buf.extend_from_slice(b"lo\r");
    assert_eq!(d.decode(&mut buf).unwrap(), None);
    buf.extend_from_slice(b"\n");
    assert_eq!(d.decode(&mut buf).unwrap(), Some(Reply::Array(vec![Reply::Int(1), bulk(b"hello")])));
}

#[test]
fn garbage_is_a_protocol_error() {
    let max = 1 << 20;
    assert!(err(b"?what\r\n", max).contains("type byte 0x3f"));
    assert!(err(b"\r\n", max).contains("type byte"));
    assert!(err(b"%1\r\n", max).contains("type byte"), "RESP3 maps are not RESP2");
    assert!(err(b":12a\r\n", max).contains("decimal"));
    assert!(err(b":\r\n", max).contains("decimal"));
    assert!(err(b":+1\r\n", max).contains("decimal"));
    assert!(err(b":99999999999999999999\r\n", max).contains("range"));
    assert!(err(b"$abc\r\n", max).contains("decimal"));
    assert!(err(b"$-2\r\n", max).contains("negative length -2"));
    assert!(err(b"*-5\r\n", max).contains("negative length -5"));
    assert!(err(b"$3\r\nabcde\r\n", max).contains("CRLF"));
    assert!(err(b"+caf\xc3\r\n", max).contains("UTF-8"));
    assert!(err(b":1111111111111111111111111111111111", max).contains("too long"));
}

#[test]
fn error_messages_that_are_not_utf8_are_kept_lossily() {
    assert_eq!(one(b"-ERR \xff\r\n"), Reply::Error("ERR \u{fffd}".into()));
}

#[test]
fn claimed_lengths_beyond_the_limit_are_refused_before_the_bytes_arrive() {
    let max = 1024;
    // 4 GiB claimed with nothing behind it: refused from the header alone.
    assert!(err(b"$4294967296\r\n", max).contains("bulk string of 4294967296 bytes"));
    assert!(err(b"$1025\r\n", max).contains("1025"));
    assert!(err(b"*129\r\n", max).contains("array of 129 elements"));
    assert!(err(b"*9223372036854775807\r\n", max).contains("elements"));
    // Exactly at the limit is fine.
    let mut wire = b"$1024\r\n".to_vec();
    wire.extend_from_slice(&[b'x'; 1024]);
    wire.extend_from_slice(b"\r\n");
    let mut d = decoder(max);
    let mut buf = BytesMut::from(&wire[..]);
    assert!(matches!(d.decode(&mut buf), Ok(Some(Reply::Bulk(b))) if b.len() == 1024));
    let mut buf = BytesMut::from(&b"*128\r\n"[..]);
    assert_eq!(d.decode(&mut buf).unwrap(), None);
}

#[test]
fn a_reply_whose_parts_add_up_beyond_the_limit_is_refused() {
    let max = 64;
    // Two 30-byte bulks plus two element slots: 76 > 64.
    let mut wire = b"*2\r\n".to_vec();
    for _ in 0..2 {
        wire.extend_from_slice(b"$30\r\n");
        wire.extend_from_slice(&[b'a'; 30]);
        wire.extend_from_slice(b"\r\n");
    }
    assert!(err(&wire, max).contains("reply exceeds"));
    // A long simple string with no CRLF in sight: refused once it passes the budget.
    let mut wire = b"+".to_vec();
    wire.extend_from_slice(&[b'a'; 100]);
    assert!(err(&wire, max).contains("too long"));
    // The budget is per reply: many small replies in a row are fine.
    let mut d = decoder(max);
    let mut buf = BytesMut::new();
    for _ in 0..100 {
        buf.extend_from_slice(b"$30\r\naaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
    }
    let mut n = 0;
    while d.decode(&mut buf).unwrap().is_some() {
        n += 1;
    }
    assert_eq!(n, 100);
}

#[test]
fn nesting_deeper_than_the_limit_is_refused() {
    let ok = format!("{}:1\r\n", "*1\r\n".repeat(MAX_DEPTH));
    let mut expected = Reply::Int(1);
    for _ in 0..MAX_DEPTH {
        expected = Reply::Array(vec![expected]);
    }
    assert_eq!(one(ok.as_bytes()), expected);
    let deep = format!("{}:1\r\n", "*1\r\n".repeat(MAX_DEPTH + 1));
    assert!(err(deep.as_bytes(), 1 << 20).contains("nested deeper than 8"));
}

#[test]
fn a_huge_array_claim_reserves_only_a_bounded_vec() {
    let mut d = decoder(usize::MAX / 2);
    let mut buf = BytesMut::from(&b"*100000000000\r\n"[..]);
    assert_eq!(d.decode(&mut buf).unwrap(), None);
    assert_eq!(d.stack[0].1.capacity(), PREALLOC_ITEMS);
}

#[test]
fn commands_are_arrays_of_bulk_strings() {
    let mut out = Vec::new();
    encode(&[&b"SET"[..], b"k", b"a\r\nb"], &mut out);
    assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$4\r\na\r\nb\r\n");
    out.clear();
    encode(&[b""], &mut out);
    assert_eq!(out, b"*1\r\n$0\r\n\r\n");
}
