//! The disaggregation glue that needs no engine: what is refused, how a
//! batch is counted, how the decode body gets its KV-transfer parameters.

use serde_json::{Value, json};

use super::{PdMode, batch_size, check, with_params};
use crate::GatewayError;
use crate::pipeline::request::Route;

#[test]
fn several_samples_are_refused_with_the_reason_of_each_engine() {
    let n = json!({"prompt": "hi", "n": 2});
    for (mode, why) in [(PdMode::Sglang, "bootstrap room"), (PdMode::Vllm, "one sequence's KV")] {
        let Err(GatewayError::BadRequest(message)) = check(&n, Route::Completions, mode) else { panic!("refused") };
        assert!(message.contains("n = 2") && message.contains(why), "{message}");
    }
    let native = json!({"text": "hi", "sampling_params": {"n": 3}});
    assert!(check(&native, Route::Generate, PdMode::Sglang).is_err(), "SGLang's native sampling_params.n too");
    assert_eq!(check(&json!({"prompt": "hi", "n": 1}), Route::Completions, PdMode::Vllm).unwrap(), None);
}

#[test]
fn batches_are_counted_per_route_and_refused_by_vllm() {
    assert_eq!(batch_size(&json!({"text": ["a", "b", "c"]}), Route::Generate), Some(3));
    assert_eq!(batch_size(&json!({"input_ids": [[1, 2], [3]]}), Route::Generate), Some(2));
    assert_eq!(batch_size(&json!({"input_ids": [1, 2, 3]}), Route::Generate), None, "one prompt of ids");
    assert_eq!(batch_size(&json!({"prompt": ["a", "b"]}), Route::Completions), Some(2));
    assert_eq!(batch_size(&json!({"prompt": [[1, 2], [3]]}), Route::Completions), Some(2));
    assert_eq!(batch_size(&json!({"prompt": [1, 2]}), Route::Completions), None, "one prompt of ids");
    assert_eq!(batch_size(&json!({"messages": []}), Route::Chat), None);
    let batch = json!({"prompt": ["a", "b"]});
    assert_eq!(check(&batch, Route::Completions, PdMode::Sglang).unwrap(), Some(2));
    assert!(matches!(check(&batch, Route::Completions, PdMode::Vllm), Err(GatewayError::BadRequest(_))));
}

#[test]
fn the_decode_body_is_the_clients_with_the_transfer_parameters() {
    let client = json!({"model": "m", "prompt": "hi", "kv_transfer_params": {"from": "client"}, "max_tokens": 4});
    let params = json!({"do_remote_prefill": true, "remote_engine_id": "e1"});
    let body: Value = serde_json::from_slice(&with_params(&client, params.clone())).unwrap();
    assert_eq!(body["kv_transfer_params"], params, "the router's parameters replace the client's");
    assert_eq!((body["model"].as_str(), body["max_tokens"].as_u64()), (Some("m"), Some(4)));
}
