//! The endpoint picker's flags (the Gateway API Inference Extension's EPP: a
//! gateway such as Envoy asks the router over `ext_proc` where each request
//! goes): a flag group of [`super::ServeArgs`].

use clap::Args;

/// Serve as an endpoint picker too.
#[derive(Debug, Args)]
pub(crate) struct EppFlags {
    /// Serve Envoy's `ext_proc` (`envoy.service.ext_proc.v3.ExternalProcessor`) and
    /// `grpc.health.v1` on this port (on --host), as a Gateway API Inference Extension
    /// endpoint picker: each request is selected and planned as a proxied one, and the chosen
    /// worker named in `x-gateway-destination-endpoint` and the `envoy.lb` metadata.
    #[arg(long, env = "SGL_ROUTER_EPP_PORT", value_name = "PORT")]
    pub(crate) epp_port: Option<u16>,
    /// Pick the endpoint a request names in `test-epp-endpoint-selection` (the GIE conformance
    /// suite's test picker does): for conformance runs only, never in production.
    #[arg(long, env = "SGL_ROUTER_EPP_TEST_ENDPOINT_HEADER", default_value_t = false)]
    pub(crate) epp_test_endpoint_header: bool,
}
