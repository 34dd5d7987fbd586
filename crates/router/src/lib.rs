//! The `sgl-router` library: what the binary wires together. Today: the pump
//! from KV-event subscribers into the index, and its metrics.

pub mod metrics;
pub mod pump;
