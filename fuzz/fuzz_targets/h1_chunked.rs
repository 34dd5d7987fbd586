//! The chunked decoder, on arbitrary bytes arriving in arbitrary reads. The payload, the end
//! and the bytes consumed do not depend on the read boundaries; `skip` (the guard's walk)
//! agrees with `decode`; every size it accepts httparse reads as the same size; and what it
//! decodes, encoded again, decodes to the same payload.
#![no_main]

use h1_codec::fuzzing::{chunked_decode, chunked_encode, chunked_skip};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (Vec<u8>, Vec<u8>)| {
    let (body, cuts) = input;
    let pieces: Vec<usize> = cuts.iter().map(|c| usize::from(*c % 17) + 1).collect();
    let whole = chunked_decode(&body, &[]);
    let cut = chunked_decode(&body, &pieces);
    match (&whole, &cut) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "the read boundaries changed the decoding"),
        (Err(_), Err(_)) => {}
        // Cut short, an error may lie past the last read that ended the body: only an
        // ended body must agree.
        (Ok((_, done, _)), Err(_)) | (Err(_), Ok((_, done, _))) => assert!(!done),
    }
    let skip = chunked_skip(&body);
    match (&whole, &skip) {
        (Ok((_, done, used)), Ok((skipped, ended))) => {
            assert_eq!(done, ended);
            assert_eq!(used, skipped);
        }
        (Err(_), Err(_)) => {}
        _ => panic!("decode {whole:?} and skip {skip:?} disagree"),
    }
    if let Ok((payload, true, used)) = &whole {
        // Each chunk-size line it accepted is a size httparse reads too.
        let mut at = 0;
        while at < *used {
            let rest = &body[at..];
            match httparse::parse_chunk_size(rest) {
                Ok(httparse::Status::Complete((n, size))) => {
                    at += n;
                    if size == 0 {
                        break;
                    }
                    at += size as usize + 2;
                }
                other => panic!("httparse refuses a chunk size it took: {other:?}"),
            }
        }
        let mut again = chunked_encode(payload);
        again.extend_from_slice(b"0\r\n\r\n");
        let (decoded, done, _) = chunked_decode(&again, &[]).expect("its own encoding decodes");
        assert!(done);
        assert_eq!(&decoded, payload);
    }
});
