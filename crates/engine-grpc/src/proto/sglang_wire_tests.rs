//! SGLang's scheduler service messages against the bytes Google's protobuf runtime wrote from
//! smg-grpc-proto's own generated classes (`tests/fixtures/grpc_sglang/gen_sglang_wire.py`):
//! each read exactly, and written back as protobuf wrote it.

use prost::Message;

use super::scheduler::*;
use super::wire_fixture::{bytes, cases, read, u32s};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/grpc_sglang/sglang_wire.json");

#[test]
fn sglangs_messages_read_and_write_as_the_protocols_own_code() {
    let case = cases(FIXTURE);

    let c = case("generate_request");
    let (r, v): (GenerateRequest, _) = (read(&c), &c["values"]);
    let s = r.sampling_params.clone().unwrap();
    assert_eq!(r.request_id, v["request_id"].as_str().unwrap());
    assert_eq!(r.tokenized.as_ref().unwrap().input_ids, u32s(&v["input_ids"]));
    assert_eq!((s.top_k, s.max_new_tokens, s.min_new_tokens, s.n), (-1, Some(64), 2, 2));
    assert_eq!((s.stop.clone(), s.stop_token_ids.clone()), (vec!["routing".into(), "\n\n".into()], vec![7, 9]));
    assert_eq!(s.constraint, Some(Constraint::JsonSchema(v["json_schema"].as_str().unwrap().into())));
    assert_eq!((s.no_stop_trim, s.stream_interval, s.logit_bias.get("17")), (true, Some(4), Some(&-5.0)));
    assert_eq!((r.return_logprob, r.logprob_start_len, r.top_logprobs_num), (true, -1, 3));
    let d = r.disaggregated_params.clone().unwrap();
    assert_eq!((d.bootstrap_host.as_str(), d.bootstrap_port, d.bootstrap_room), ("10.0.0.7", 8998, 2_147_483_646));
    // A pin to rank 0 is told from no pin (explicit presence).
    assert_eq!(
        (r.lora_id.as_str(), r.data_parallel_rank, r.stream, r.require_reasoning),
        ("adapter-a", Some(0), true, true)
    );

    let c = case("generate_chunk");
    let m = read::<GenerateResponse>(&c);
    let Some(Generated::Chunk(k)) = m.response else { panic!("a chunk") };
    assert_eq!(m.request_id, "req-1");
    assert_eq!(
        (k.token_ids.clone(), k.prompt_tokens, k.completion_tokens, k.cached_tokens, k.reasoning_tokens, k.index),
        (vec![5, 6], 10, 2, 8, 1, 1)
    );
    let lp = k.output_logprobs.unwrap();
    assert_eq!((lp.token_logprobs, lp.top_logprobs[0].token_ids.clone()), (vec![-0.5, -0.25], vec![5]));

    let c = case("generate_complete");
    let Some(Generated::Complete(d)) = read::<GenerateResponse>(&c).response else { panic!("a completion") };
    assert_eq!((d.output_ids.clone(), d.finish_reason.as_str(), d.index), (vec![5, 6, 7], "stop", 1));
    assert_eq!((d.cached_tokens, d.reasoning_tokens, d.matched_stop), (8, 2, Some(MatchedStop::TokenId(7))));

    let abort = read::<AbortRequest>(&case("abort_request"));
    assert_eq!((abort.request_id.as_str(), abort.reason.as_str()), ("req-1", "the client left"));

    let info = read::<GetModelInfoResponse>(&case("model_info"));
    assert_eq!((info.served_model_name.as_str(), info.max_context_length, info.vocab_size), ("qwen3", 40960, 151936));
    assert_eq!((info.eos_token_ids, info.max_req_input_len), (vec![151645, 151643], 40000));

    // The server's arguments, a Struct: read (a map's entries may be written in another order).
    let c = case("server_info");
    let server = GetServerInfoResponse::decode(bytes(&c).as_slice()).unwrap();
    let args = server.server_args.unwrap().fields;
    let num = |k: &str| args.get(k).and_then(|v| v.as_f64());
    assert_eq!(
        (num("page_size"), num("dp_size"), num("disaggregation_bootstrap_port")),
        (Some(16.0), Some(2.0), Some(8998.0))
    );
    assert_eq!(args.get("disaggregation_mode").and_then(|v| v.as_str()), Some("prefill"));
    assert_eq!((server.active_requests, server.sglang_version.as_str()), (4, "0.5.23"));

    let loads = read::<GetLoadsResponse>(&case("loads"));
    let l = &loads.loads[0];
    assert_eq!((loads.dp_rank_count, l.dp_rank, l.num_running_reqs, l.num_waiting_reqs), (2, 1, 3, 2));
    assert_eq!((l.num_used_tokens, l.max_total_num_tokens, l.num_waiting_uncached_tokens), (4096, 65536, 700));
}
