//! The KV-event batch decoder (hand-written msgpack reader) on arbitrary bytes.
//! Differential against rmpv: a payload it accepts is valid msgpack. Round trip: what it
//! decodes, encoded again in either layout, decodes to the same encoding.
#![no_main]

use kv_events::wire::{EventForm, Limits, decode_batch, encode_batch};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    let Ok(decoded) = decode_batch(data, &limits) else { return };
    assert!(rmpv::decode::read_value(&mut &data[..]).is_ok(), "accepted a payload that is not msgpack");
    for form in [EventForm::Map, EventForm::Positional] {
        let once = encode_batch(&decoded.batch, form);
        let again = decode_batch(&once, &limits).expect("its own encoding decodes");
        assert_eq!(again.unknown_events, 0);
        assert_eq!(encode_batch(&again.batch, form), once, "the round trip changed the batch");
    }
});
