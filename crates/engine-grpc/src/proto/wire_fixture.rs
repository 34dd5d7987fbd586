//! The wire goldens' fixture form (`tests/fixtures/grpc_*/gen_*_wire.py`): each case's bytes
//! as protobuf's own runtime wrote them, read and written back.

use prost::Message;
use serde_json::Value;

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// The cases of the fixture at `path`, by name.
pub(super) fn cases(path: &str) -> impl Fn(&str) -> Value {
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    move |name: &str| doc["cases"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap().clone()
}

/// `case`'s bytes.
pub(super) fn bytes(case: &Value) -> Vec<u8> {
    unhex(case["hex"].as_str().unwrap())
}

/// Decodes `case`'s bytes as `M` and checks the bytes written back are protobuf's own.
pub(super) fn read<M: Message + Default>(case: &Value) -> M {
    let bytes = bytes(case);
    let m = M::decode(bytes.as_slice()).unwrap();
    assert_eq!(m.encode_to_vec(), bytes, "{}: written back as protobuf wrote it", case["name"]);
    m
}

/// A JSON list of numbers as `u32`s.
pub(super) fn u32s(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}
