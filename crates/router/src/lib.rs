//! The `sgl-router` library: what the binary wires together. `App` builds the
//! router (simulated workers, renderer, KV-event side, policy, gateway) and
//! runs it; the KV-event side (discovery, subscribers, the pump into the
//! index) and the metrics exposition live beside it.

pub mod app;
pub mod events;
pub mod metrics;
pub mod pump;
