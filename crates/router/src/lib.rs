//! The `sgl-router` library: what the binary wires together. `App` builds the
//! router (simulated workers, renderer, index, the fleet, policy, gateway)
//! and runs it.

pub mod app;
pub mod config;
mod igw;
pub mod members;
pub mod peers;
mod remote_tokenizer;
pub mod routing_resource;
mod wiring;
