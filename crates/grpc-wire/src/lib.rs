//! gRPC over HTTP/2 with hand-written prost messages: the framing ([`grpc`]),
//! a server routing one connection's calls by method path ([`server`]), and a
//! client over one connection ([`client`]). What a call means is its service's.

pub mod client;
pub mod grpc;
pub mod health;
pub mod server;
pub mod wkt;

pub use client::{Call, Channel};
pub use grpc::{Gone, Messages, Replies, ReplyBody, Status, encode};
pub use server::{Handler, Limits, Started, serve_connection};
