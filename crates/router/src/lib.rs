//! The `sgl-router` library: what the binary wires together. Today: the
//! KV-event side (discovery, subscribers, the pump into the index) and its metrics.

pub mod events;
pub mod metrics;
pub mod pump;
