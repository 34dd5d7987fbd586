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

impl Method {
    /// Every method.
    pub const ALL: [Method; 9] = [
        Method::Generate,
        Method::HealthCheck,
        Method::Abort,
        Method::GetModelInfo,
        Method::GetServerInfo,
        Method::GetLoads,
        Method::FlushCache,
        Method::GetTokenizer,
        Method::SubscribeKvEvents,
    ];
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
        match self {
            Service::Sglang => path::of(method),
            Service::Vllm => path::vllm::of(method),
        }
    }

    /// The method `path` names on either service.
    pub fn method_of(path: &str) -> Option<(Service, Method)> {
        [Service::Sglang, Service::Vllm]
            .into_iter()
            .find_map(|service| Method::ALL.into_iter().find(|m| service.path(*m) == path).map(|m| (service, m)))
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

        /// `method`'s path on this service.
        pub fn of(method: crate::Method) -> &'static str {
            use crate::Method::*;
            match method {
                Generate => GENERATE,
                HealthCheck => HEALTH_CHECK,
                Abort => ABORT,
                GetModelInfo => GET_MODEL_INFO,
                GetServerInfo => GET_SERVER_INFO,
                GetLoads => GET_LOADS,
                FlushCache => FLUSH_CACHE,
                GetTokenizer => GET_TOKENIZER,
                SubscribeKvEvents => SUBSCRIBE_KV_EVENTS,
            }
        }
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
