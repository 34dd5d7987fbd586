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

/// A service's name and its methods' paths (`/package.Service/Method`).
macro_rules! service_paths {
    ($service:literal) => {
        pub const SERVICE: &str = $service;
        pub const GENERATE: &str = concat!("/", $service, "/Generate");
        pub const HEALTH_CHECK: &str = concat!("/", $service, "/HealthCheck");
        pub const ABORT: &str = concat!("/", $service, "/Abort");
        pub const GET_MODEL_INFO: &str = concat!("/", $service, "/GetModelInfo");
        pub const GET_SERVER_INFO: &str = concat!("/", $service, "/GetServerInfo");
        pub const GET_LOADS: &str = concat!("/", $service, "/GetLoads");
        pub const FLUSH_CACHE: &str = concat!("/", $service, "/FlushCache");
        pub const GET_TOKENIZER: &str = concat!("/", $service, "/GetTokenizer");
        pub const SUBSCRIBE_KV_EVENTS: &str = concat!("/", $service, "/SubscribeKvEvents");
    };
}

/// The methods' paths: `sglang.grpc.scheduler.SglangScheduler`'s, and in [`path::vllm`]
/// `vllm.grpc.engine.VllmEngine`'s.
pub mod path {
    service_paths!("sglang.grpc.scheduler.SglangScheduler");

    /// `vllm.grpc.engine.VllmEngine`'s methods.
    pub mod vllm {
        service_paths!("vllm.grpc.engine.VllmEngine");
    }
}
