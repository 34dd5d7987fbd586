//! Envoy's external processing protocol (`envoy.service.ext_proc.v3`) served
//! over gRPC, with `grpc.health.v1`: the messages ([`proto`]), the framing
//! ([`grpc`]), and one HTTP/2 connection's calls routed to a [`Service`]
//! ([`serve_connection`]). What a stream means is the service's; this crate
//! knows nothing of routing.

pub mod client;
pub mod grpc;
pub mod proto;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};

pub use grpc::{Gone, Messages, Replies, ReplyBody, Status};
pub use proto::ServingStatus;

/// The ext_proc stream's method path.
pub const PROCESS_PATH: &str = "/envoy.service.ext_proc.v3.ExternalProcessor/Process";
/// The health service's unary check.
pub const HEALTH_CHECK_PATH: &str = "/grpc.health.v1.Health/Check";
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

/// Bounds on one connection.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The largest message a caller may send (a buffered body comes whole in one).
    pub max_message_bytes: usize,
    /// Streams open at once on one connection.
    pub max_streams: u32,
    /// Replies queued for a caller that reads slowly, per stream.
    pub reply_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_message_bytes: 4 << 20, max_streams: 1024, reply_depth: 16 }
    }
}

/// Serves one HTTP/2 connection's calls with `service` until the caller
/// closes it, or `shutdown` resolves (open streams are finished first).
pub async fn serve_connection<S, I>(io: I, service: Arc<S>, limits: Limits, shutdown: impl Future<Output = ()>)
where
    S: Service,
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let handle = move |req: http::Request<Incoming>| {
        let service = service.clone();
        async move { Ok::<_, Infallible>(call(service, req, limits).await) }
    };
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams)
        .initial_stream_window_size(1 << 20)
        .initial_connection_window_size(8 << 20)
        // A caller that vanished without a word is found out.
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(20));
    let conn = builder.serve_connection(TokioIo::new(io), hyper::service::service_fn(handle));
    tokio::pin!(conn);
    tokio::pin!(shutdown);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(error = %e, "ext_proc connection ended");
            }
            return;
        }
        () = &mut shutdown => conn.as_mut().graceful_shutdown(),
    }
    let _ = conn.await;
}

/// One call: routed by its path.
async fn call<S: Service>(service: Arc<S>, req: http::Request<Incoming>, limits: Limits) -> Response<ReplyBody> {
    let (replies, body) = Replies::channel(limits.reply_depth);
    let mut answer = Response::new(body);
    answer.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    match req.uri().path() {
        PROCESS_PATH => {
            let calls = Messages::new(req.into_body(), limits.max_message_bytes);
            tokio::spawn(async move {
                let status = service.process(calls, replies.clone()).await;
                replies.finish(&status).await;
            });
        }
        HEALTH_CHECK_PATH => {
            let mut calls = Messages::new(req.into_body(), 64 << 10);
            tokio::spawn(async move {
                let asked = tokio::time::timeout(HEALTH_READ_TIMEOUT, calls.next::<proto::HealthCheckRequest>());
                let status = match asked
                    .await
                    .unwrap_or_else(|_| Err(Status::new(Status::DEADLINE_EXCEEDED, "no request")))
                {
                    Ok(Some(asked)) => match service.health(&asked.service) {
                        ServingStatus::ServiceUnknown => Status::new(5, format!("unknown service {}", asked.service)),
                        serving => {
                            let _ = replies.send(&proto::HealthCheckResponse { status: serving as i32 }).await;
                            Status::ok()
                        }
                    },
                    Ok(None) => Status::new(Status::INVALID_ARGUMENT, "no request"),
                    Err(status) => status,
                };
                replies.finish(&status).await;
            });
        }
        path => {
            // Trailers-only: the status in the head, no body.
            let status = Status::new(Status::UNIMPLEMENTED, format!("no method {path}"));
            answer.headers_mut().extend(status.headers());
        }
    }
    answer
}

#[cfg(test)]
mod tests;
