//! A gRPC server's side of one HTTP/2 connection: each call routed by its
//! method path to a [`Handler`], which runs it on a task of its own; an
//! unknown path answered `UNIMPLEMENTED` at once. Owns the connection's
//! bounds ([`Limits`]), nothing else.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::grpc::{Messages, Replies, ReplyBody, Status};

/// A call under way: the status it ends with.
pub type Started = Pin<Box<dyn Future<Output = Status> + Send>>;

/// What serves a connection's calls.
pub trait Handler: Send + Sync + 'static {
    /// Starts the call of `path` (`/package.Service/Method`) with its messages (`calls`,
    /// none larger than the connection's bound) and where its answers go; `None`: no
    /// such method. The future runs on its own task; its status ends the call.
    fn call(self: Arc<Self>, path: &str, calls: Messages, replies: Replies) -> Option<Started>;
}

/// Bounds on one connection.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The largest message a caller may send.
    pub max_message_bytes: usize,
    /// Streams open at once on one connection.
    pub max_streams: u32,
    /// Answers queued for a caller that reads slowly, per stream.
    pub reply_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_message_bytes: 4 << 20, max_streams: 1024, reply_depth: 16 }
    }
}

/// Serves one HTTP/2 connection's calls with `handler` until the caller
/// closes it, or `shutdown` resolves (open streams are finished first).
pub async fn serve_connection<H, I>(io: I, handler: Arc<H>, limits: Limits, shutdown: impl Future<Output = ()>)
where
    H: Handler,
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let handle = move |req: http::Request<Incoming>| {
        let handler = handler.clone();
        async move { Ok::<_, Infallible>(call(handler, req, limits)) }
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
                tracing::debug!(error = %e, "gRPC connection ended");
            }
            return;
        }
        () = &mut shutdown => conn.as_mut().graceful_shutdown(),
    }
    let _ = conn.await;
}

/// One call: routed by its path.
fn call<H: Handler>(handler: Arc<H>, req: http::Request<Incoming>, limits: Limits) -> Response<ReplyBody> {
    let (replies, body) = Replies::channel(limits.reply_depth);
    let path = req.uri().path().to_owned();
    let calls = Messages::new(req.into_body(), limits.max_message_bytes);
    let mut answer = match handler.call(&path, calls, replies.clone()) {
        Some(started) => {
            tokio::spawn(async move {
                let status = started.await;
                replies.finish(&status).await;
            });
            Response::new(body)
        }
        None => {
            // Trailers-only: the status in a head that ends the stream (its body is over at once).
            let status = Status::new(Status::UNIMPLEMENTED, format!("no method {path}"));
            let mut answer = Response::new(ReplyBody::empty());
            answer.headers_mut().extend(status.headers());
            answer
        }
    };
    answer.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    answer
}
