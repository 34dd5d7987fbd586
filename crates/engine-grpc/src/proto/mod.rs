//! The messages, as prost structs written from smg-grpc-proto 0.4.28's
//! `sglang_scheduler.proto` ([`scheduler`]), `vllm_engine.proto` ([`vllm`]: the messages that
//! differ from SGLang's, and the conversions) and `common.proto` ([`common`]):
//! the fields a router sends and reads and a simulated engine answers with.
//! Fields left out are skipped on decode (protobuf's unknown fields) and
//! never sent. The field numbers are the wire contract: each is the
//! `.proto`'s, checked against the real peer (`smg` 1.13 as a client of the
//! simulated engine) in the router's tests.

pub mod common;
pub mod scheduler;
#[cfg(test)]
mod sglang_wire_tests;
pub mod vllm;
#[cfg(test)]
mod wire_fixture;

pub use common::*;
pub use scheduler::*;
