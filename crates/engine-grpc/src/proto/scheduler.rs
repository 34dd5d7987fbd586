//! `sglang.grpc.scheduler`: generation (`Generate`, `Abort`), the engine's
//! health, model, server and load reports.

use std::collections::HashMap;

use grpc_wire::wkt::Struct;

/// `SamplingParams`. Proto3's zero defaults are not SGLang's (temperature 1, top_p 1,
/// top_k -1, repetition_penalty 1): a sender sets every field ([`SamplingParams::engine_defaults`]).
#[derive(Clone, PartialEq, prost::Message)]
pub struct SamplingParams {
    #[prost(float, tag = "1")]
    pub temperature: f32,
    #[prost(float, tag = "2")]
    pub top_p: f32,
    #[prost(int32, tag = "3")]
    pub top_k: i32,
    #[prost(float, tag = "4")]
    pub min_p: f32,
    #[prost(float, tag = "5")]
    pub frequency_penalty: f32,
    #[prost(float, tag = "6")]
    pub presence_penalty: f32,
    #[prost(float, tag = "7")]
    pub repetition_penalty: f32,
    #[prost(uint32, optional, tag = "8")]
    pub max_new_tokens: Option<u32>,
    #[prost(string, repeated, tag = "9")]
    pub stop: Vec<String>,
    #[prost(uint32, repeated, tag = "10")]
    pub stop_token_ids: Vec<u32>,
    #[prost(bool, tag = "11")]
    pub skip_special_tokens: bool,
    #[prost(bool, tag = "12")]
    pub spaces_between_special_tokens: bool,
    #[prost(oneof = "Constraint", tags = "13, 14, 15, 16")]
    pub constraint: Option<Constraint>,
    #[prost(uint32, tag = "17")]
    pub n: u32,
    #[prost(uint32, tag = "18")]
    pub min_new_tokens: u32,
    #[prost(bool, tag = "19")]
    pub ignore_eos: bool,
    #[prost(bool, tag = "20")]
    pub no_stop_trim: bool,
    #[prost(int32, optional, tag = "21")]
    pub stream_interval: Option<i32>,
    #[prost(map = "string, float", tag = "22")]
    pub logit_bias: HashMap<String, f32>,
}

impl SamplingParams {
    /// SGLang's defaults, every field set.
    pub fn engine_defaults() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            repetition_penalty: 1.0,
            skip_special_tokens: true,
            spaces_between_special_tokens: true,
            n: 1,
            ..Default::default()
        }
    }
}

/// `SamplingParams.constraint`: structured generation.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Constraint {
    #[prost(string, tag = "13")]
    Regex(String),
    #[prost(string, tag = "14")]
    JsonSchema(String),
    #[prost(string, tag = "15")]
    EbnfGrammar(String),
    #[prost(string, tag = "16")]
    StructuralTag(String),
}

/// `DisaggregatedParams`: where a decode engine meets its prefill engine.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DisaggregatedParams {
    #[prost(string, tag = "1")]
    pub bootstrap_host: String,
    #[prost(int32, tag = "2")]
    pub bootstrap_port: i32,
    #[prost(int32, tag = "3")]
    pub bootstrap_room: i32,
}

/// `GenerateRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GenerateRequest {
    #[prost(string, tag = "1")]
    pub request_id: String,
    #[prost(message, optional, tag = "2")]
    pub tokenized: Option<TokenizedInput>,
    #[prost(message, optional, tag = "4")]
    pub sampling_params: Option<SamplingParams>,
    #[prost(bool, tag = "5")]
    pub return_logprob: bool,
    #[prost(int32, tag = "6")]
    pub logprob_start_len: i32,
    #[prost(int32, tag = "7")]
    pub top_logprobs_num: i32,
    #[prost(message, optional, tag = "10")]
    pub disaggregated_params: Option<DisaggregatedParams>,
    #[prost(string, tag = "15")]
    pub lora_id: String,
    #[prost(int32, optional, tag = "16")]
    pub data_parallel_rank: Option<i32>,
    #[prost(bool, tag = "17")]
    pub stream: bool,
    #[prost(bool, tag = "18")]
    pub require_reasoning: bool,
}

/// `TokenizedInput`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TokenizedInput {
    #[prost(string, tag = "1")]
    pub original_text: String,
    #[prost(uint32, repeated, tag = "2")]
    pub input_ids: Vec<u32>,
}

/// `GenerateResponse`: a chunk of a stream, or the end of one sequence.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GenerateResponse {
    #[prost(string, tag = "1")]
    pub request_id: String,
    #[prost(oneof = "Generated", tags = "2, 3")]
    pub response: Option<Generated>,
}

/// `GenerateResponse.response`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Generated {
    #[prost(message, tag = "2")]
    Chunk(GenerateStreamChunk),
    #[prost(message, tag = "3")]
    Complete(GenerateComplete),
}

/// `GenerateStreamChunk`: new tokens of sequence `index`, counts so far.
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
    pub output_logprobs: Option<OutputLogProbs>,
    #[prost(uint32, tag = "8")]
    pub index: u32,
    #[prost(uint32, tag = "9")]
    pub reasoning_tokens: u32,
}

/// `GenerateComplete`: the end of sequence `index`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GenerateComplete {
    /// Every token of the sequence (a stream's chunks carried them already).
    #[prost(uint32, repeated, tag = "1")]
    pub output_ids: Vec<u32>,
    /// "stop", "length" or "abort".
    #[prost(string, tag = "2")]
    pub finish_reason: String,
    #[prost(uint32, tag = "3")]
    pub prompt_tokens: u32,
    #[prost(uint32, tag = "4")]
    pub completion_tokens: u32,
    #[prost(uint32, tag = "5")]
    pub cached_tokens: u32,
    #[prost(message, optional, tag = "6")]
    pub output_logprobs: Option<OutputLogProbs>,
    #[prost(oneof = "MatchedStop", tags = "8, 9")]
    pub matched_stop: Option<MatchedStop>,
    #[prost(uint32, tag = "11")]
    pub index: u32,
    #[prost(uint32, tag = "12")]
    pub reasoning_tokens: u32,
}

/// `GenerateComplete.matched_stop`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum MatchedStop {
    #[prost(uint32, tag = "8")]
    TokenId(u32),
    #[prost(string, tag = "9")]
    Text(String),
}

/// `OutputLogProbs`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OutputLogProbs {
    #[prost(float, repeated, tag = "1")]
    pub token_logprobs: Vec<f32>,
    #[prost(uint32, repeated, tag = "2")]
    pub token_ids: Vec<u32>,
    #[prost(message, repeated, tag = "3")]
    pub top_logprobs: Vec<TopLogProbs>,
}

/// `TopLogProbs`: the most likely tokens at one position.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TopLogProbs {
    #[prost(float, repeated, tag = "1")]
    pub values: Vec<f32>,
    #[prost(uint32, repeated, tag = "2")]
    pub token_ids: Vec<u32>,
}

/// `HealthCheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckRequest {}

/// `HealthCheckResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckResponse {
    #[prost(bool, tag = "1")]
    pub healthy: bool,
    #[prost(string, tag = "2")]
    pub message: String,
}

/// `AbortRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AbortRequest {
    #[prost(string, tag = "1")]
    pub request_id: String,
    #[prost(string, tag = "2")]
    pub reason: String,
}

/// `AbortResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AbortResponse {
    #[prost(bool, tag = "1")]
    pub success: bool,
    #[prost(string, tag = "2")]
    pub message: String,
}

/// `GetModelInfoRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetModelInfoRequest {}

/// `GetModelInfoResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetModelInfoResponse {
    #[prost(string, tag = "1")]
    pub model_path: String,
    #[prost(string, tag = "2")]
    pub tokenizer_path: String,
    #[prost(bool, tag = "3")]
    pub is_generation: bool,
    #[prost(string, tag = "4")]
    pub preferred_sampling_params: String,
    #[prost(string, tag = "5")]
    pub weight_version: String,
    #[prost(string, tag = "6")]
    pub served_model_name: String,
    #[prost(int32, tag = "7")]
    pub max_context_length: i32,
    #[prost(int32, tag = "8")]
    pub vocab_size: i32,
    #[prost(bool, tag = "9")]
    pub supports_vision: bool,
    #[prost(string, tag = "10")]
    pub model_type: String,
    #[prost(int32, repeated, tag = "11")]
    pub eos_token_ids: Vec<i32>,
    #[prost(int32, tag = "12")]
    pub pad_token_id: i32,
    #[prost(int32, tag = "13")]
    pub bos_token_id: i32,
    #[prost(int32, tag = "14")]
    pub max_req_input_len: i32,
    #[prost(string, repeated, tag = "15")]
    pub architectures: Vec<String>,
}

/// `GetServerInfoRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetServerInfoRequest {}

/// `GetServerInfoResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetServerInfoResponse {
    /// The engine's arguments (`page_size`, `dp_size`, `disaggregation_mode`, ...).
    #[prost(message, optional, tag = "1")]
    pub server_args: Option<Struct>,
    #[prost(message, optional, tag = "2")]
    pub scheduler_info: Option<Struct>,
    #[prost(int32, tag = "3")]
    pub active_requests: i32,
    #[prost(bool, tag = "4")]
    pub is_paused: bool,
    #[prost(double, tag = "5")]
    pub last_receive_timestamp: f64,
    #[prost(double, tag = "6")]
    pub uptime_seconds: f64,
    #[prost(string, tag = "7")]
    pub sglang_version: String,
    /// "grpc".
    #[prost(string, tag = "8")]
    pub server_type: String,
    #[prost(int32, tag = "10")]
    pub max_total_num_tokens: i32,
}

/// `GetLoadsRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetLoadsRequest {
    #[prost(int32, optional, tag = "1")]
    pub dp_rank: Option<i32>,
    #[prost(string, repeated, tag = "2")]
    pub include: Vec<String>,
}

/// `GetLoadsResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetLoadsResponse {
    #[prost(string, tag = "1")]
    pub timestamp: String,
    #[prost(string, tag = "2")]
    pub version: String,
    #[prost(int32, tag = "3")]
    pub dp_rank_count: i32,
    #[prost(message, repeated, tag = "4")]
    pub loads: Vec<SchedulerLoad>,
}

/// `SchedulerLoad`: one data-parallel rank's core load.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SchedulerLoad {
    #[prost(int32, tag = "1")]
    pub dp_rank: i32,
    #[prost(int32, tag = "2")]
    pub num_running_reqs: i32,
    #[prost(int32, tag = "3")]
    pub num_waiting_reqs: i32,
    #[prost(int32, tag = "4")]
    pub num_total_reqs: i32,
    #[prost(int32, tag = "5")]
    pub num_used_tokens: i32,
    #[prost(int32, tag = "6")]
    pub max_total_num_tokens: i32,
    #[prost(double, tag = "7")]
    pub token_usage: f64,
    #[prost(double, tag = "8")]
    pub gen_throughput: f64,
    #[prost(double, tag = "9")]
    pub cache_hit_rate: f64,
    #[prost(double, tag = "10")]
    pub utilization: f64,
    #[prost(int32, tag = "11")]
    pub max_running_requests: i32,
    #[prost(int32, tag = "17")]
    pub num_waiting_uncached_tokens: i32,
}
