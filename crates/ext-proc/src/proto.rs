//! The protocol's messages, as prost structs written from the `.proto` files
//! (`envoy/service/ext_proc/v3/external_processor.proto`,
//! `envoy/config/core/v3/base.proto`, `google/protobuf/struct.proto`,
//! `grpc/health/v1/health.proto`): only the fields an endpoint picker reads or
//! writes. Fields left out are skipped on decode (protobuf's unknown fields)
//! and never sent. The field numbers are the wire contract: each is the
//! `.proto`'s, and the router's tests run a real Envoy against them.

use std::collections::HashMap;

use bytes::Bytes;

// ---- envoy.config.core.v3 ----

/// One header (`HeaderValue`): Envoy sends the value in `raw_value`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct HeaderValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
    #[prost(bytes = "vec", tag = "3")]
    pub raw_value: Vec<u8>,
}

impl HeaderValue {
    /// The value's bytes, wherever the sender put them.
    pub fn bytes(&self) -> &[u8] {
        if self.raw_value.is_empty() { self.value.as_bytes() } else { &self.raw_value }
    }
}

/// `HeaderMap`: the headers of a request, an answer or trailers.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct HeaderMap {
    #[prost(message, repeated, tag = "1")]
    pub headers: Vec<HeaderValue>,
}

impl HeaderMap {
    /// The first value of header `name` (lower case, as Envoy sends them).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|h| h.key == name).map(HeaderValue::bytes)
    }
}

/// `HeaderValueOption.HeaderAppendAction`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum HeaderAppendAction {
    AppendIfExistsOrAdd = 0,
    AddIfAbsent = 1,
    OverwriteIfExistsOrAdd = 2,
    OverwriteIfExists = 3,
}

/// `HeaderValueOption`: a header to set, and how.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct HeaderValueOption {
    #[prost(message, optional, tag = "1")]
    pub header: Option<HeaderValue>,
    #[prost(enumeration = "HeaderAppendAction", tag = "3")]
    pub append_action: i32,
}

impl HeaderValueOption {
    /// Sets `name` to `value`, replacing what the request carried.
    pub fn overwrite(name: &str, value: impl Into<Vec<u8>>) -> Self {
        let header = HeaderValue { key: name.to_owned(), value: String::new(), raw_value: value.into() };
        Self { header: Some(header), append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32 }
    }
}

/// `Metadata`: dynamic metadata by filter namespace.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Metadata {
    #[prost(map = "string, message", tag = "1")]
    pub filter_metadata: HashMap<String, Struct>,
}

// ---- google.protobuf (grpc-wire's) ----

pub use grpc_wire::wkt::{Kind, ListValue, Struct, Value};

// ---- envoy.service.ext_proc.v3 ----

/// `ProcessingMode.BodySendMode`.
pub mod body_mode {
    pub const NONE: i32 = 0;
    pub const STREAMED: i32 = 1;
    pub const BUFFERED: i32 = 2;
    pub const BUFFERED_PARTIAL: i32 = 3;
    pub const FULL_DUPLEX_STREAMED: i32 = 4;
    pub const GRPC: i32 = 5;
}

/// `ProtocolConfiguration`: the filter's body modes, sent on a stream's first message.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct ProtocolConfiguration {
    #[prost(int32, tag = "1")]
    pub request_body_mode: i32,
    #[prost(int32, tag = "2")]
    pub response_body_mode: i32,
    #[prost(bool, tag = "3")]
    pub send_body_without_waiting_for_header_response: bool,
}

/// `ProcessingRequest`: what the data plane sends.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProcessingRequest {
    #[prost(oneof = "Phase", tags = "2, 3, 4, 5, 6, 7")]
    pub request: Option<Phase>,
    #[prost(message, optional, tag = "8")]
    pub metadata_context: Option<Metadata>,
    #[prost(bool, tag = "10")]
    pub observability_mode: bool,
    #[prost(message, optional, tag = "11")]
    pub protocol_config: Option<ProtocolConfiguration>,
}

/// `ProcessingRequest.request`: which part of the exchange a message carries.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Phase {
    #[prost(message, tag = "2")]
    RequestHeaders(HttpHeaders),
    #[prost(message, tag = "3")]
    ResponseHeaders(HttpHeaders),
    #[prost(message, tag = "4")]
    RequestBody(HttpBody),
    #[prost(message, tag = "5")]
    ResponseBody(HttpBody),
    #[prost(message, tag = "6")]
    RequestTrailers(HttpTrailers),
    #[prost(message, tag = "7")]
    ResponseTrailers(HttpTrailers),
}

/// `HttpHeaders`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct HttpHeaders {
    #[prost(message, optional, tag = "1")]
    pub headers: Option<HeaderMap>,
    #[prost(bool, tag = "3")]
    pub end_of_stream: bool,
}

/// `HttpBody`: a body, or a chunk of one.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct HttpBody {
    #[prost(bytes = "bytes", tag = "1")]
    pub body: Bytes,
    #[prost(bool, tag = "2")]
    pub end_of_stream: bool,
}

/// `HttpTrailers`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct HttpTrailers {
    #[prost(message, optional, tag = "1")]
    pub trailers: Option<HeaderMap>,
}

/// `ProcessingResponse`: what the server sends back.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProcessingResponse {
    #[prost(oneof = "Reply", tags = "1, 2, 3, 4, 5, 6, 7")]
    pub response: Option<Reply>,
    #[prost(message, optional, tag = "8")]
    pub dynamic_metadata: Option<Struct>,
}

/// `ProcessingResponse.response`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Reply {
    #[prost(message, tag = "1")]
    RequestHeaders(HeadersResponse),
    #[prost(message, tag = "2")]
    ResponseHeaders(HeadersResponse),
    #[prost(message, tag = "3")]
    RequestBody(BodyResponse),
    #[prost(message, tag = "4")]
    ResponseBody(BodyResponse),
    #[prost(message, tag = "5")]
    RequestTrailers(TrailersResponse),
    #[prost(message, tag = "6")]
    ResponseTrailers(TrailersResponse),
    #[prost(message, tag = "7")]
    ImmediateResponse(ImmediateResponse),
}

/// `HeadersResponse`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct HeadersResponse {
    #[prost(message, optional, tag = "1")]
    pub response: Option<CommonResponse>,
}

/// `BodyResponse`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct BodyResponse {
    #[prost(message, optional, tag = "1")]
    pub response: Option<CommonResponse>,
}

/// `TrailersResponse`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct TrailersResponse {
    #[prost(message, optional, tag = "1")]
    pub header_mutation: Option<HeaderMutation>,
}

/// `CommonResponse` (status 0: `CONTINUE`).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct CommonResponse {
    #[prost(int32, tag = "1")]
    pub status: i32,
    #[prost(message, optional, tag = "2")]
    pub header_mutation: Option<HeaderMutation>,
    #[prost(message, optional, tag = "3")]
    pub body_mutation: Option<BodyMutation>,
    #[prost(bool, tag = "5")]
    pub clear_route_cache: bool,
}

/// `HeaderMutation`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct HeaderMutation {
    #[prost(message, repeated, tag = "1")]
    pub set_headers: Vec<HeaderValueOption>,
    #[prost(string, repeated, tag = "2")]
    pub remove_headers: Vec<String>,
}

/// `BodyMutation`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct BodyMutation {
    #[prost(oneof = "Mutation", tags = "1, 2, 3")]
    pub mutation: Option<Mutation>,
}

/// `BodyMutation.mutation`.
#[derive(Clone, PartialEq, Eq, prost::Oneof)]
pub enum Mutation {
    /// The whole body, replaced (buffered modes).
    #[prost(bytes = "bytes", tag = "1")]
    Body(Bytes),
    #[prost(bool, tag = "2")]
    ClearBody(bool),
    /// A chunk of the body (`FULL_DUPLEX_STREAMED`).
    #[prost(message, tag = "3")]
    StreamedResponse(StreamedBodyResponse),
}

/// `StreamedBodyResponse`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct StreamedBodyResponse {
    #[prost(bytes = "bytes", tag = "1")]
    pub body: Bytes,
    #[prost(bool, tag = "2")]
    pub end_of_stream: bool,
}

/// `ImmediateResponse`: an answer made by the data plane instead of the upstream's.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ImmediateResponse {
    #[prost(message, optional, tag = "1")]
    pub status: Option<HttpStatus>,
    #[prost(message, optional, tag = "2")]
    pub headers: Option<HeaderMutation>,
    #[prost(bytes = "bytes", tag = "3")]
    pub body: Bytes,
    #[prost(string, tag = "5")]
    pub details: String,
}

/// `envoy.type.v3.HttpStatus` (its code enum's numbers are the HTTP statuses).
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct HttpStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
}

// ---- grpc.health.v1 (grpc-wire's) ----

pub use grpc_wire::health::{HealthCheckRequest, HealthCheckResponse, ServingStatus};
