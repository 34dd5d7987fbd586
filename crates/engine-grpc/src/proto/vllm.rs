//! `vllm.grpc.engine` (smg-grpc-proto 0.4.28's `vllm_engine.proto`, what vLLM's `--grpc`
//! servicer serves): the messages whose fields differ from SGLang's scheduler service, and the
//! conversions between the two. A router speaks SGLang's shapes ([`super::scheduler`]) to every
//! engine; the client converts at the wire for a vLLM engine, and the simulated engine converts
//! a vLLM caller's messages to the same engine. `HealthCheck`, `GetLoads` and the common
//! service's messages (`GetTokenizer`, `SubscribeKvEvents`, `FlushCache`) are the same messages
//! in both services.

use std::collections::HashMap;

use grpc_wire::wkt::{Struct, Value};

use super::scheduler;

/// `SamplingParams` (vLLM's numbering; `temperature` optional: vLLM's default when unset).
#[derive(Clone, PartialEq, prost::Message)]
pub struct SamplingParams {
    #[prost(float, optional, tag = "1")]
    pub temperature: Option<f32>,
    #[prost(float, tag = "2")]
    pub top_p: f32,
    #[prost(uint32, tag = "3")]
    pub top_k: u32,
    #[prost(float, tag = "4")]
    pub min_p: f32,
    #[prost(float, tag = "5")]
    pub frequency_penalty: f32,
    #[prost(float, tag = "6")]
    pub presence_penalty: f32,
    #[prost(float, tag = "7")]
    pub repetition_penalty: f32,
    #[prost(uint32, optional, tag = "8")]
    pub max_tokens: Option<u32>,
    #[prost(uint32, tag = "9")]
    pub min_tokens: u32,
    #[prost(string, repeated, tag = "10")]
    pub stop: Vec<String>,
    #[prost(uint32, repeated, tag = "11")]
    pub stop_token_ids: Vec<u32>,
    #[prost(bool, tag = "12")]
    pub skip_special_tokens: bool,
    #[prost(bool, tag = "13")]
    pub spaces_between_special_tokens: bool,
    #[prost(bool, tag = "14")]
    pub ignore_eos: bool,
    #[prost(uint32, tag = "15")]
    pub n: u32,
    #[prost(oneof = "Constraint", tags = "16, 17, 18, 19, 20")]
    pub constraint: Option<Constraint>,
    /// Log probabilities per output token (the chosen one's, and this many alternatives).
    #[prost(int32, optional, tag = "22")]
    pub logprobs: Option<i32>,
    #[prost(int32, optional, tag = "24")]
    pub seed: Option<i32>,
    #[prost(bool, tag = "25")]
    pub include_stop_str_in_output: bool,
    #[prost(map = "int32, float", tag = "26")]
    pub logit_bias: HashMap<i32, f32>,
}

/// `SamplingParams.constraint` (vLLM's `StructuredOutputsParams`; `choice` is not sent here).
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Constraint {
    #[prost(string, tag = "16")]
    JsonSchema(String),
    #[prost(string, tag = "17")]
    Regex(String),
    #[prost(string, tag = "18")]
    Grammar(String),
    #[prost(string, tag = "19")]
    StructuralTag(String),
    #[prost(bool, tag = "20")]
    JsonObject(bool),
}

/// `GenerateRequest` (the prompt as token ids: the router tokenized it).
#[derive(Clone, PartialEq, prost::Message)]
pub struct GenerateRequest {
    #[prost(string, tag = "1")]
    pub request_id: String,
    #[prost(message, optional, tag = "2")]
    pub tokenized: Option<scheduler::TokenizedInput>,
    #[prost(message, optional, tag = "4")]
    pub sampling_params: Option<SamplingParams>,
    #[prost(bool, tag = "5")]
    pub stream: bool,
    /// The KV connector's parameters as a JSON object (a disaggregated leg's), verbatim.
    #[prost(string, optional, tag = "8")]
    pub kv_transfer_params_json: Option<String>,
    #[prost(int32, optional, tag = "9")]
    pub data_parallel_rank: Option<i32>,
}

/// `GenerateResponse` (no request id: one call is one request).
#[derive(Clone, PartialEq, prost::Message)]
pub struct GenerateResponse {
    #[prost(oneof = "Generated", tags = "1, 2")]
    pub response: Option<Generated>,
}

/// `GenerateResponse.response`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Generated {
    #[prost(message, tag = "1")]
    Chunk(GenerateStreamChunk),
    #[prost(message, tag = "2")]
    Complete(GenerateComplete),
}

/// `GenerateStreamChunk`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GenerateStreamChunk {
    #[prost(uint32, repeated, tag = "1")]
    pub token_ids: Vec<u32>,
    #[prost(uint32, tag = "2")]
    pub prompt_tokens: u32,
    #[prost(uint32, tag = "3")]
    pub completion_tokens: u32,
    #[prost(uint32, tag = "4")]
    pub cached_tokens: u32,
    #[prost(message, optional, tag = "5")]
    pub output_logprobs: Option<scheduler::OutputLogProbs>,
    #[prost(uint32, tag = "7")]
    pub index: u32,
}

/// `GenerateComplete`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GenerateComplete {
    #[prost(uint32, repeated, tag = "1")]
    pub output_ids: Vec<u32>,
    /// "stop", "length", "abort" or "error".
    #[prost(string, tag = "2")]
    pub finish_reason: String,
    #[prost(uint32, tag = "3")]
    pub prompt_tokens: u32,
    #[prost(uint32, tag = "4")]
    pub completion_tokens: u32,
    #[prost(uint32, tag = "5")]
    pub cached_tokens: u32,
    #[prost(message, optional, tag = "6")]
    pub output_logprobs: Option<scheduler::OutputLogProbs>,
    #[prost(uint32, tag = "8")]
    pub index: u32,
    #[prost(oneof = "MatchedStop", tags = "10, 11")]
    pub matched_stop: Option<MatchedStop>,
    /// What the engine's KV connector hands over (a prefill's handoff), a JSON object.
    #[prost(string, optional, tag = "12")]
    pub kv_transfer_params_json: Option<String>,
}

/// `GenerateComplete.matched_stop`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum MatchedStop {
    #[prost(uint32, tag = "10")]
    TokenId(u32),
    #[prost(string, tag = "11")]
    Text(String),
}

/// `AbortRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AbortRequest {
    #[prost(string, repeated, tag = "1")]
    pub request_ids: Vec<String>,
}

/// `AbortResponse` (empty).
#[derive(Clone, PartialEq, prost::Message)]
pub struct AbortResponse {}

/// `GetModelInfoResponse` (vLLM's numbering).
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetModelInfoResponse {
    #[prost(string, tag = "1")]
    pub model_path: String,
    #[prost(bool, tag = "2")]
    pub is_generation: bool,
    #[prost(uint32, tag = "3")]
    pub max_context_length: u32,
    #[prost(uint32, tag = "4")]
    pub vocab_size: u32,
    #[prost(bool, tag = "5")]
    pub supports_vision: bool,
    #[prost(string, tag = "6")]
    pub served_model_name: String,
    #[prost(string, tag = "7")]
    pub tokenizer_path: String,
    #[prost(string, tag = "8")]
    pub model_type: String,
    #[prost(string, repeated, tag = "9")]
    pub architectures: Vec<String>,
    #[prost(int32, repeated, tag = "10")]
    pub eos_token_ids: Vec<i32>,
    #[prost(int32, tag = "11")]
    pub pad_token_id: i32,
    #[prost(int32, tag = "12")]
    pub bos_token_id: i32,
    #[prost(int32, tag = "13")]
    pub max_req_input_len: i32,
}

/// `GetServerInfoResponse` (the fields a router reads).
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetServerInfoResponse {
    #[prost(uint32, tag = "1")]
    pub active_requests: u32,
    #[prost(bool, tag = "2")]
    pub is_paused: bool,
    #[prost(double, tag = "3")]
    pub last_receive_timestamp: f64,
    #[prost(double, tag = "4")]
    pub uptime_seconds: f64,
    /// "vllm-grpc".
    #[prost(string, tag = "5")]
    pub server_type: String,
    #[prost(int32, tag = "9")]
    pub data_parallel_size: i32,
    /// Tokens per KV block (0 until the engine resolved it).
    #[prost(int32, tag = "12")]
    pub block_size: i32,
    #[prost(int32, tag = "20")]
    pub max_num_seqs: i32,
}

// === conversions: the router's (SGLang's) shapes to vLLM's and back ===

impl GenerateRequest {
    /// SGLang's request as vLLM's: the same prompt ids, rank and streaming; the sampling
    /// parameters renamed (`max_new_tokens` → `max_tokens`, ...), top-k -1 (off) as 0, the
    /// logprobs asked as vLLM asks them (the chosen token's and `top_logprobs_num` others).
    pub fn from_sglang(r: &scheduler::GenerateRequest) -> GenerateRequest {
        let s = r.sampling_params.clone().unwrap_or_else(scheduler::SamplingParams::engine_defaults);
        let constraint = s.constraint.map(|c| match c {
            scheduler::Constraint::Regex(v) => Constraint::Regex(v),
            scheduler::Constraint::JsonSchema(v) => Constraint::JsonSchema(v),
            scheduler::Constraint::EbnfGrammar(v) => Constraint::Grammar(v),
            scheduler::Constraint::StructuralTag(v) => Constraint::StructuralTag(v),
        });
        let logit_bias = s.logit_bias.iter().filter_map(|(k, v)| Some((k.parse::<i32>().ok()?, *v))).collect();
        let sampling = SamplingParams {
            temperature: Some(s.temperature),
            top_p: s.top_p,
            top_k: u32::try_from(s.top_k).unwrap_or(0),
            min_p: s.min_p,
            frequency_penalty: s.frequency_penalty,
            presence_penalty: s.presence_penalty,
            repetition_penalty: s.repetition_penalty,
            max_tokens: s.max_new_tokens,
            min_tokens: s.min_new_tokens,
            stop: s.stop,
            stop_token_ids: s.stop_token_ids,
            skip_special_tokens: s.skip_special_tokens,
            spaces_between_special_tokens: s.spaces_between_special_tokens,
            ignore_eos: s.ignore_eos,
            n: s.n,
            constraint,
            logprobs: r.return_logprob.then_some(r.top_logprobs_num.max(0)),
            seed: None,
            include_stop_str_in_output: s.no_stop_trim,
            logit_bias,
        };
        GenerateRequest {
            request_id: r.request_id.clone(),
            tokenized: r.tokenized.clone(),
            sampling_params: Some(sampling),
            stream: r.stream,
            kv_transfer_params_json: None,
            data_parallel_rank: r.data_parallel_rank,
        }
    }

    /// vLLM's request as SGLang's (the simulated engine serves both).
    pub fn to_sglang(&self) -> scheduler::GenerateRequest {
        let v = self.sampling_params.clone().unwrap_or_default();
        let constraint = v.constraint.and_then(|c| match c {
            Constraint::Regex(x) => Some(scheduler::Constraint::Regex(x)),
            Constraint::JsonSchema(x) => Some(scheduler::Constraint::JsonSchema(x)),
            Constraint::Grammar(x) => Some(scheduler::Constraint::EbnfGrammar(x)),
            Constraint::StructuralTag(x) => Some(scheduler::Constraint::StructuralTag(x)),
            Constraint::JsonObject(_) => None,
        });
        let sampling = scheduler::SamplingParams {
            temperature: v.temperature.unwrap_or(1.0),
            top_p: if v.top_p == 0.0 { 1.0 } else { v.top_p },
            top_k: if v.top_k == 0 { -1 } else { i32::try_from(v.top_k).unwrap_or(-1) },
            min_p: v.min_p,
            frequency_penalty: v.frequency_penalty,
            presence_penalty: v.presence_penalty,
            repetition_penalty: if v.repetition_penalty == 0.0 { 1.0 } else { v.repetition_penalty },
            max_new_tokens: v.max_tokens,
            stop: v.stop,
            stop_token_ids: v.stop_token_ids,
            skip_special_tokens: v.skip_special_tokens,
            spaces_between_special_tokens: v.spaces_between_special_tokens,
            constraint,
            n: v.n.max(1),
            min_new_tokens: v.min_tokens,
            ignore_eos: v.ignore_eos,
            no_stop_trim: v.include_stop_str_in_output,
            stream_interval: None,
            logit_bias: v.logit_bias.iter().map(|(k, b)| (k.to_string(), *b)).collect(),
        };
        scheduler::GenerateRequest {
            request_id: self.request_id.clone(),
            tokenized: self.tokenized.clone(),
            sampling_params: Some(sampling),
            return_logprob: v.logprobs.is_some(),
            logprob_start_len: -1,
            top_logprobs_num: v.logprobs.unwrap_or(0).max(0),
            stream: self.stream,
            data_parallel_rank: self.data_parallel_rank,
            ..Default::default()
        }
    }
}

impl GenerateResponse {
    /// vLLM's answer as SGLang's, for the call of `request_id` (vLLM's carry no id).
    pub fn to_sglang(self, request_id: &str) -> scheduler::GenerateResponse {
        let response = self.response.map(|g| match g {
            Generated::Chunk(c) => scheduler::Generated::Chunk(scheduler::GenerateStreamChunk {
                token_ids: c.token_ids,
                prompt_tokens: c.prompt_tokens,
                completion_tokens: c.completion_tokens,
                cached_tokens: c.cached_tokens,
                output_logprobs: c.output_logprobs,
                index: c.index,
                reasoning_tokens: 0,
            }),
            Generated::Complete(c) => scheduler::Generated::Complete(scheduler::GenerateComplete {
                output_ids: c.output_ids,
                finish_reason: c.finish_reason,
                prompt_tokens: c.prompt_tokens,
                completion_tokens: c.completion_tokens,
                cached_tokens: c.cached_tokens,
                output_logprobs: c.output_logprobs,
                matched_stop: c.matched_stop.map(|m| match m {
                    MatchedStop::TokenId(t) => scheduler::MatchedStop::TokenId(t),
                    MatchedStop::Text(t) => scheduler::MatchedStop::Text(t),
                }),
                index: c.index,
                reasoning_tokens: 0,
            }),
        });
        scheduler::GenerateResponse { request_id: request_id.to_owned(), response }
    }

    /// SGLang's answer as vLLM's (the simulated engine's side).
    pub fn from_sglang(r: scheduler::GenerateResponse) -> GenerateResponse {
        let response = r.response.map(|g| match g {
            scheduler::Generated::Chunk(c) => Generated::Chunk(GenerateStreamChunk {
                token_ids: c.token_ids,
                prompt_tokens: c.prompt_tokens,
                completion_tokens: c.completion_tokens,
                cached_tokens: c.cached_tokens,
                output_logprobs: c.output_logprobs,
                index: c.index,
            }),
            scheduler::Generated::Complete(c) => Generated::Complete(GenerateComplete {
                output_ids: c.output_ids,
                finish_reason: c.finish_reason,
                prompt_tokens: c.prompt_tokens,
                completion_tokens: c.completion_tokens,
                cached_tokens: c.cached_tokens,
                output_logprobs: c.output_logprobs,
                index: c.index,
                matched_stop: c.matched_stop.map(|m| match m {
                    scheduler::MatchedStop::TokenId(t) => MatchedStop::TokenId(t),
                    scheduler::MatchedStop::Text(t) => MatchedStop::Text(t),
                }),
                kv_transfer_params_json: None,
            }),
        });
        GenerateResponse { response }
    }
}

impl GetModelInfoResponse {
    /// As SGLang's.
    pub fn to_sglang(self) -> scheduler::GetModelInfoResponse {
        scheduler::GetModelInfoResponse {
            model_path: self.model_path,
            tokenizer_path: self.tokenizer_path,
            is_generation: self.is_generation,
            served_model_name: self.served_model_name,
            max_context_length: i32::try_from(self.max_context_length).unwrap_or(i32::MAX),
            vocab_size: i32::try_from(self.vocab_size).unwrap_or(i32::MAX),
            supports_vision: self.supports_vision,
            model_type: self.model_type,
            eos_token_ids: self.eos_token_ids,
            pad_token_id: self.pad_token_id,
            bos_token_id: self.bos_token_id,
            max_req_input_len: self.max_req_input_len,
            architectures: self.architectures,
            ..Default::default()
        }
    }

    /// SGLang's as vLLM's.
    pub fn from_sglang(r: scheduler::GetModelInfoResponse) -> GetModelInfoResponse {
        GetModelInfoResponse {
            model_path: r.model_path,
            is_generation: r.is_generation,
            max_context_length: u32::try_from(r.max_context_length).unwrap_or(0),
            vocab_size: u32::try_from(r.vocab_size).unwrap_or(0),
            supports_vision: r.supports_vision,
            served_model_name: r.served_model_name,
            tokenizer_path: r.tokenizer_path,
            model_type: r.model_type,
            architectures: r.architectures,
            eos_token_ids: r.eos_token_ids,
            pad_token_id: r.pad_token_id,
            bos_token_id: r.bos_token_id,
            max_req_input_len: r.max_req_input_len,
        }
    }
}

impl GetServerInfoResponse {
    /// As SGLang's: the block size and data-parallel size as its server arguments
    /// (`page_size`, `dp_size`), which is where the router reads them.
    pub fn to_sglang(self) -> scheduler::GetServerInfoResponse {
        let number = |n: i32| Value::number(f64::from(n));
        let mut fields = std::collections::BTreeMap::new();
        if self.block_size > 0 {
            fields.insert("page_size".to_owned(), number(self.block_size));
        }
        fields.insert("dp_size".to_owned(), number(self.data_parallel_size.max(1)));
        scheduler::GetServerInfoResponse {
            server_args: Some(Struct { fields }),
            active_requests: i32::try_from(self.active_requests).unwrap_or(i32::MAX),
            is_paused: self.is_paused,
            last_receive_timestamp: self.last_receive_timestamp,
            uptime_seconds: self.uptime_seconds,
            server_type: self.server_type,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::wire_fixture::{cases, read, u32s};
    use super::*;

    const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/grpc_vllm/vllm_wire.json");

    /// Every message against the bytes Google's protobuf runtime wrote from smg-grpc-proto's own
    /// generated classes (`tests/fixtures/grpc_vllm/gen_vllm_wire.py`).
    #[test]
    fn vllms_messages_read_and_write_as_the_protocols_own_code() {
        let case = cases(FIXTURE);

        let c = case("generate_request");
        let (r, v): (GenerateRequest, _) = (read(&c), &c["values"]);
        let s = r.sampling_params.clone().unwrap();
        assert_eq!(r.request_id, v["request_id"].as_str().unwrap());
        assert_eq!(r.tokenized.as_ref().unwrap().input_ids, u32s(&v["input_ids"]));
        assert_eq!((s.temperature, s.top_k, s.max_tokens, s.min_tokens), (Some(0.7), 40, Some(64), 2));
        assert_eq!(
            (s.stop.clone(), s.stop_token_ids.clone(), s.n, s.logprobs),
            (vec!["routing".into(), "\n\n".into()], vec![7, 9], 2, Some(3))
        );
        assert!(s.include_stop_str_in_output && s.skip_special_tokens);
        assert_eq!(s.constraint, Some(Constraint::Regex("[a-z]+".into())));
        assert_eq!(s.logit_bias.get(&17), Some(&-5.0));
        assert_eq!((r.stream, r.data_parallel_rank), (true, Some(3)));
        // Through SGLang's shape and back: what the router means is what vLLM reads.
        let sglang = r.to_sglang();
        assert_eq!((sglang.return_logprob, sglang.top_logprobs_num), (true, 3));
        let again = GenerateRequest::from_sglang(&sglang);
        assert_eq!(again.sampling_params.as_ref().unwrap().max_tokens, Some(64));
        assert_eq!(again.sampling_params.as_ref().unwrap().stop_token_ids, vec![7, 9]);
        assert_eq!(again.sampling_params.as_ref().unwrap().logit_bias.get(&17), Some(&-5.0));

        let c = case("generate_chunk");
        let Some(Generated::Chunk(k)) = read::<GenerateResponse>(&c).response else { panic!("a chunk") };
        assert_eq!(
            (k.token_ids.clone(), k.prompt_tokens, k.completion_tokens, k.cached_tokens, k.index),
            (vec![5, 6], 10, 2, 8, 1)
        );
        assert_eq!(k.output_logprobs.as_ref().unwrap().token_logprobs, vec![-0.5, -0.25]);

        let c = case("generate_complete");
        let m = read::<GenerateResponse>(&c);
        let Some(Generated::Complete(d)) = m.response.clone() else { panic!("a completion") };
        assert_eq!((d.output_ids.clone(), d.finish_reason.as_str(), d.index), (vec![5, 6, 7], "stop", 1));
        assert_eq!(d.matched_stop, Some(MatchedStop::Text("routing".into())));
        let sglang = m.to_sglang("req-1");
        let Some(scheduler::Generated::Complete(s)) = sglang.response else { panic!("a completion") };
        assert_eq!((sglang.request_id.as_str(), s.cached_tokens, s.index), ("req-1", 8, 1));
        assert_eq!(s.matched_stop, Some(scheduler::MatchedStop::Text("routing".into())));

        let info = read::<GetModelInfoResponse>(&case("model_info")).to_sglang();
        assert_eq!(
            (info.served_model_name.as_str(), info.max_context_length, info.vocab_size),
            ("qwen3", 40960, 151936)
        );
        assert_eq!((info.eos_token_ids, info.architectures), (vec![151645], vec!["Qwen3ForCausalLM".to_string()]));

        let server = read::<GetServerInfoResponse>(&case("server_info"));
        assert_eq!((server.block_size, server.data_parallel_size, server.max_num_seqs), (16, 2, 256));
        let args = server.to_sglang().server_args.unwrap();
        assert_eq!(args.fields.get("page_size"), Some(&Value_::number(16.0)));
        assert_eq!(args.fields.get("dp_size"), Some(&Value_::number(2.0)));

        let abort = read::<AbortRequest>(&case("abort_request"));
        assert_eq!(abort.request_ids, vec!["req-1", "req-2"]);

        // A disaggregated prefill leg's KV-transfer parameters, and its completion's handoff.
        let c = case("prefill_leg");
        let leg = read::<GenerateRequest>(&c);
        assert_eq!(leg.kv_transfer_params_json.as_deref(), c["values"]["kv_transfer_params_json"].as_str());
        let c = case("prefill_handoff");
        let Some(Generated::Complete(d)) = read::<GenerateResponse>(&c).response else { panic!("a completion") };
        assert_eq!(d.kv_transfer_params_json.as_deref(), c["values"]["kv_transfer_params_json"].as_str());
    }

    /// KV events as vLLM's servicer streams them (made by the proto's own classes): the bytes
    /// written back as protobuf wrote them, and every field the router reads: a hybrid group's
    /// kind, vLLM's extra keys (never credited by tokens alone), the LoRA name and the salt.
    #[test]
    fn vllms_kv_events_read_as_the_protocols_own_code() {
        use router_types::opaque::{OpaqueKey, Part, opaque_keys};
        use router_types::{GroupKind, KvEvent};

        let c = cases(FIXTURE)("kv_event_batch");
        let (batch, v) = (read::<crate::proto::KvEventBatch>(&c), &c["values"]);
        let (router, skipped) = crate::events::to_router(&batch).unwrap();
        assert_eq!((skipped, router.events.len()), (0, 1));
        let KvEvent::Stored(s) = &router.events[0] else { panic!("{router:?}") };
        assert_eq!(s.namespace.lora_name.as_deref(), v["lora_name"].as_str());
        assert_eq!(s.namespace.cache_salt.as_deref(), v["salt"].as_str(), "the first block's text after the LoRA name");
        assert_eq!(s.group_idx, Some(1));
        assert_eq!(s.group_kind, Some(GroupKind::SlidingWindow { window: 64 }));
        let blob: Vec<u8> = (0..32).collect();
        assert_eq!(
            opaque_keys(s.opaque_keys[0].as_deref().unwrap()).unwrap(),
            [OpaqueKey::Tuple(vec![Part::Str("img-1"), Part::Int(2)])]
        );
        assert_eq!(
            opaque_keys(s.opaque_keys[1].as_deref().unwrap()).unwrap(),
            [OpaqueKey::Tuple(vec![Part::Str("img-1"), Part::Int(-2)]), OpaqueKey::Bytes(&blob)]
        );
    }

    use grpc_wire::wkt::Value as Value_;
}
