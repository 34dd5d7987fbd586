//! gRPC's standard health service (`grpc/health/v1/health.proto`): its
//! messages and its unary check's path.

/// The unary check's path.
pub const CHECK_PATH: &str = "/grpc.health.v1.Health/Check";

/// `HealthCheckRequest`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    pub service: String,
}

/// `HealthCheckResponse.ServingStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum ServingStatus {
    Unknown = 0,
    Serving = 1,
    NotServing = 2,
    ServiceUnknown = 3,
}

/// `HealthCheckResponse`.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct HealthCheckResponse {
    #[prost(enumeration = "ServingStatus", tag = "1")]
    pub status: i32,
}
