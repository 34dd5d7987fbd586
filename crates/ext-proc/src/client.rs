//! A gRPC client over one HTTP/2 connection: a call's messages sent as they
//! are ready, its answers and status read back. For the tests (a gateway's
//! side of `ext_proc`, a health check) and tools; the router serves, it does
//! not call.

use std::net::SocketAddr;

use http::{HeaderMap, HeaderValue, Request};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::grpc::{Messages, Replies, ReplyBody, Status};

/// One HTTP/2 connection to a gRPC server.
#[derive(Debug, Clone)]
pub struct Channel {
    send: SendRequest<ReplyBody>,
}

/// A call in progress: what to send, what comes back, the answer's head.
#[derive(Debug)]
pub struct Call {
    /// The messages sent (dropped: the client's side ends).
    pub requests: Replies,
    /// The answers, then the status in the trailers.
    pub answers: Messages,
    /// The answer's head (a trailers-only answer carries its status here).
    pub head: HeaderMap,
}

impl Call {
    /// The call's status: the trailers', else the head's (a trailers-only answer).
    pub fn status(&self) -> Option<Status> {
        self.answers.status().or_else(|| Status::from_headers(&self.head))
    }
}

impl Channel {
    /// Connects to `addr` (HTTP/2 with prior knowledge, as gRPC does).
    pub async fn connect(addr: SocketAddr) -> std::io::Result<Self> {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let _ = tcp.set_nodelay(true);
        let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .map_err(std::io::Error::other)?;
        tokio::spawn(conn);
        Ok(Self { send })
    }

    /// Starts a call of `path` (`/package.Service/Method`); answers up to `max` bytes each.
    /// Returns once the server answered its head (a streaming server answers at once).
    pub async fn call(&mut self, path: &str, max: usize) -> Result<Call, hyper::Error> {
        let (requests, body) = Replies::channel(16);
        self.send.ready().await?;
        let answer = self.send.send_request(request(path, body)).await?;
        let (parts, body) = answer.into_parts();
        Ok(Call { requests, answers: Messages::new(body, max), head: parts.headers })
    }

    /// A unary call of `path` with `message`: the request sent whole first (a unary server
    /// answers its head only once it has it), then the answer's head; its message and status
    /// are read from the call's `answers`.
    pub async fn unary<M: prost::Message>(
        &mut self,
        path: &str,
        message: &M,
        max: usize,
    ) -> Result<(HeaderMap, Messages), hyper::Error> {
        let (requests, body) = Replies::channel(1);
        // Queued before the call starts (room for one), then the request's body ends.
        let _ = requests.send(message).await;
        drop(requests);
        self.send.ready().await?;
        let answer = self.send.send_request(request(path, body)).await?;
        let (parts, body) = answer.into_parts();
        Ok((parts.headers, Messages::new(body, max)))
    }
}

/// A gRPC call's request with `body`.
fn request(path: &str, body: ReplyBody) -> Request<ReplyBody> {
    let mut req = Request::post(format!("http://epp{path}")).body(body).expect("a valid request");
    req.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    req.headers_mut().insert("te", HeaderValue::from_static("trailers"));
    req
}
