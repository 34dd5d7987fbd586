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

/// Which engine service a gRPC worker serves: SGLang's scheduler (`--smg-grpc-mode`) or vLLM's
/// engine (`--grpc`). The router speaks SGLang's messages to both; a vLLM engine's are converted
/// at the wire ([`proto::vllm`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    /// `sglang.grpc.scheduler.SglangScheduler`.
    Sglang,
    /// `vllm.grpc.engine.VllmEngine`.
    Vllm,
}

/// A method both services have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Generate,
    HealthCheck,
    Abort,
    GetModelInfo,
    GetServerInfo,
    GetLoads,
    FlushCache,
    GetTokenizer,
    SubscribeKvEvents,
}

impl Service {
    /// The service's full name.
    pub fn name(self) -> &'static str {
        match self {
            Service::Sglang => path::SERVICE,
            Service::Vllm => path::vllm::SERVICE,
        }
    }

    /// `method`'s path on this service.
    pub fn path(self, method: Method) -> &'static str {
        use Method::*;
        match (self, method) {
            (Service::Sglang, Generate) => path::GENERATE,
            (Service::Sglang, HealthCheck) => path::HEALTH_CHECK,
            (Service::Sglang, Abort) => path::ABORT,
            (Service::Sglang, GetModelInfo) => path::GET_MODEL_INFO,
            (Service::Sglang, GetServerInfo) => path::GET_SERVER_INFO,
            (Service::Sglang, GetLoads) => path::GET_LOADS,
            (Service::Sglang, FlushCache) => path::FLUSH_CACHE,
            (Service::Sglang, GetTokenizer) => path::GET_TOKENIZER,
            (Service::Sglang, SubscribeKvEvents) => path::SUBSCRIBE_KV_EVENTS,
            (Service::Vllm, Generate) => path::vllm::GENERATE,
            (Service::Vllm, HealthCheck) => path::vllm::HEALTH_CHECK,
            (Service::Vllm, Abort) => path::vllm::ABORT,
            (Service::Vllm, GetModelInfo) => path::vllm::GET_MODEL_INFO,
            (Service::Vllm, GetServerInfo) => path::vllm::GET_SERVER_INFO,
            (Service::Vllm, GetLoads) => path::vllm::GET_LOADS,
            (Service::Vllm, FlushCache) => path::vllm::FLUSH_CACHE,
            (Service::Vllm, GetTokenizer) => path::vllm::GET_TOKENIZER,
            (Service::Vllm, SubscribeKvEvents) => path::vllm::SUBSCRIBE_KV_EVENTS,
        }
    }

    /// The method `path` names on either service.
    pub fn method_of(path: &str) -> Option<(Service, Method)> {
        use Method::*;
        [Service::Sglang, Service::Vllm].into_iter().find_map(|service| {
            [
                Generate,
                HealthCheck,
                Abort,
                GetModelInfo,
                GetServerInfo,
                GetLoads,
                FlushCache,
                GetTokenizer,
                SubscribeKvEvents,
            ]
            .into_iter()
            .find(|m| service.path(*m) == path)
            .map(|m| (service, m))
        })
    }
}

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

    /// `vllm.grpc.engine.VllmEngine`'s methods.
    pub mod vllm {
        pub const SERVICE: &str = "vllm.grpc.engine.VllmEngine";
        pub const GENERATE: &str = "/vllm.grpc.engine.VllmEngine/Generate";
        pub const HEALTH_CHECK: &str = "/vllm.grpc.engine.VllmEngine/HealthCheck";
        pub const ABORT: &str = "/vllm.grpc.engine.VllmEngine/Abort";
        pub const GET_MODEL_INFO: &str = "/vllm.grpc.engine.VllmEngine/GetModelInfo";
        pub const GET_SERVER_INFO: &str = "/vllm.grpc.engine.VllmEngine/GetServerInfo";
        pub const GET_LOADS: &str = "/vllm.grpc.engine.VllmEngine/GetLoads";
        pub const FLUSH_CACHE: &str = "/vllm.grpc.engine.VllmEngine/FlushCache";
        pub const GET_TOKENIZER: &str = "/vllm.grpc.engine.VllmEngine/GetTokenizer";
        pub const SUBSCRIBE_KV_EVENTS: &str = "/vllm.grpc.engine.VllmEngine/SubscribeKvEvents";
    }
}
