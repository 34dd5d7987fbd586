//! The router's integration tests, one binary for all but the few that must run
//! alone (`chaos`, `overload`, `fd_limit`: timing or process limits) or with
//! other features (`embedding_signals`): one link instead of twenty, which
//! took most of CI's test build. Each module was its own test binary; run one
//! with `cargo test -p sgl-router --test suite MODULE::`.

#[path = "../common/mod.rs"]
mod common;

mod anthropic;
mod cache_trace;
mod cascade;
mod cli;
mod control_plane;
mod drop_in;
mod dynamo;
mod epp;
mod fleet;
mod gateway_e2e;
mod grpc_pd;
mod grpc_workers;
mod http_front;
mod index_peers;
mod jwt;
mod k8s_discovery;
mod k8s_resources;
mod kv_events_cli;
mod liveness;
mod manifests;
mod model_pools;
mod pd;
mod pd_engine_classes;
mod pd_pools;
mod pd_skip;
mod priority;
mod real_publishers;
mod regret;
mod response_cache;
mod response_guard;
mod route_feedback;
mod routing_demo;
mod shared_feedback;
mod shared_state;
mod shutdown;
mod smg_compat;
mod tls;
mod trace;
mod upstream_http2;
