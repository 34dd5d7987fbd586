//! Envoy's external processing protocol (`envoy.service.ext_proc.v3`) served
//! over gRPC, with `grpc.health.v1`: the messages ([`proto`]) and one HTTP/2
//! connection's calls routed to a [`Service`] ([`serve_connection`], over
//! `grpc-wire`'s framing). What a stream means is the service's; this crate
//! knows nothing of routing.

pub mod proto;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};

pub use grpc_wire::{Gone, Limits, Messages, Replies, ReplyBody, Status};
pub use proto::ServingStatus;

/// The ext_proc stream's method path.
pub const PROCESS_PATH: &str = "/envoy.service.ext_proc.v3.ExternalProcessor/Process";
/// The health service's unary check.
pub const HEALTH_CHECK_PATH: &str = grpc_wire::health::CHECK_PATH;
/// Longest a health check may take to send its request.
pub const HEALTH_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The ext_proc service's name, as a health check asks for it.
pub const PROCESSOR_SERVICE: &str = "envoy.service.ext_proc.v3.ExternalProcessor";

/// What serves the calls of a connection.
pub trait Service: Send + Sync + 'static {
    /// One `Process` stream: its messages read from `calls`, replies sent to
    /// `replies`; returns the status the stream ends with.
    fn process(self: Arc<Self>, calls: Messages, replies: Replies) -> impl Future<Output = Status> + Send;

    /// The health of `service` (`""`: the server as a whole).
    fn health(&self, service: &str) -> ServingStatus;
}

/// Serves one HTTP/2 connection's calls with `service` until the caller
/// closes it, or `shutdown` resolves (open streams are finished first).
pub async fn serve_connection<S, I>(io: I, service: Arc<S>, limits: Limits, shutdown: impl Future<Output = ()>)
where
    S: Service,
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    grpc_wire::serve_connection(io, Arc::new(Calls(service)), limits, shutdown).await;
}

/// A [`Service`]'s two methods routed by path.
struct Calls<S>(Arc<S>);

impl<S: Service> grpc_wire::Handler for Calls<S> {
    fn call(self: Arc<Self>, path: &str, mut calls: Messages, replies: Replies) -> Option<grpc_wire::Started> {
        let service = self.0.clone();
        match path {
            PROCESS_PATH => Some(Box::pin(service.process(calls, replies))),
            HEALTH_CHECK_PATH => Some(Box::pin(async move {
                let asked = tokio::time::timeout(HEALTH_READ_TIMEOUT, calls.next::<proto::HealthCheckRequest>());
                match asked.await.unwrap_or_else(|_| Err(Status::new(Status::DEADLINE_EXCEEDED, "no request"))) {
                    Ok(Some(asked)) => match service.health(&asked.service) {
                        ServingStatus::ServiceUnknown => Status::new(5, format!("unknown service {}", asked.service)),
                        serving => {
                            let _ = replies.send(&proto::HealthCheckResponse { status: serving as i32 }).await;
                            Status::ok()
                        }
                    },
                    Ok(None) => Status::new(Status::INVALID_ARGUMENT, "no request"),
                    Err(status) => status,
                }
            })),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
