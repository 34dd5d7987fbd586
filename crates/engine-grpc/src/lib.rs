//! The engines' gRPC services as Shepherd Model Gateway defines them
//! (smg-grpc-proto 0.4.28): the messages ([`proto`]), the method paths
//! ([`path`]) and a client of one engine ([`client::Engine`]). A server
//! (the simulated engine's) routes [`path`]s with `grpc_wire::Handler`.

pub mod client;
pub mod events;
pub mod proto;
#[cfg(test)]
mod tokenizer_tests;

pub use client::{
    Answers, Engine, EngineError, Generation, KvEvents, MAX_TOKENIZER_BYTES, fingerprint, tokenizer_chunks,
};

/// The methods' paths.
pub mod path {
    /// `sglang.grpc.scheduler.SglangScheduler`'s methods.
    pub const SERVICE: &str = "sglang.grpc.scheduler.SglangScheduler";
    pub const GENERATE: &str = "/sglang.grpc.scheduler.SglangScheduler/Generate";
    pub const HEALTH_CHECK: &str = "/sglang.grpc.scheduler.SglangScheduler/HealthCheck";
    pub const ABORT: &str = "/sglang.grpc.scheduler.SglangScheduler/Abort";
    pub const GET_MODEL_INFO: &str = "/sglang.grpc.scheduler.SglangScheduler/GetModelInfo";
    pub const GET_SERVER_INFO: &str = "/sglang.grpc.scheduler.SglangScheduler/GetServerInfo";
    pub const GET_LOADS: &str = "/sglang.grpc.scheduler.SglangScheduler/GetLoads";
    pub const FLUSH_CACHE: &str = "/sglang.grpc.scheduler.SglangScheduler/FlushCache";
    pub const GET_TOKENIZER: &str = "/sglang.grpc.scheduler.SglangScheduler/GetTokenizer";
    pub const SUBSCRIBE_KV_EVENTS: &str = "/sglang.grpc.scheduler.SglangScheduler/SubscribeKvEvents";
}
