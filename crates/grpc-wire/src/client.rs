//! A gRPC client over one HTTP/2 connection: a call's messages sent as they
//! are ready, its answers and status read back. Calls share the connection
//! (HTTP/2 streams); a broken connection is told by [`Channel::is_closed`],
//! and its owner connects again.

use std::net::SocketAddr;

use http::{HeaderMap, HeaderValue, Request};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::grpc::{Messages, Replies, ReplyBody, Status};

/// One HTTP/2 connection to a gRPC server.
#[derive(Debug, Clone)]
pub struct Channel {
    send: SendRequest<ReplyBody>,
    /// The `:authority` of every call (the server's `host:port`).
    authority: String,
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
        Self::connect_to(&addr.to_string()).await
    }

    /// Connects to `authority` (`host:port`, the host resolved), HTTP/2 with prior knowledge.
    pub async fn connect_to(authority: &str) -> std::io::Result<Self> {
        let tcp = tokio::net::TcpStream::connect(authority).await?;
        let _ = tcp.set_nodelay(true);
        let mut builder = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .timer(hyper_util::rt::TokioTimer::new())
            .initial_stream_window_size(1 << 20)
            .initial_connection_window_size(8 << 20)
            // A server that vanished without a word is found out.
            .keep_alive_interval(Some(std::time::Duration::from_secs(30)))
            .keep_alive_timeout(std::time::Duration::from_secs(20));
        let (send, conn) = builder.handshake(TokioIo::new(tcp)).await.map_err(std::io::Error::other)?;
        tokio::spawn(conn);
        Ok(Self { send, authority: authority.to_owned() })
    }

    /// The connection broke or was closed: calls on it fail; connect again.
    pub fn is_closed(&self) -> bool {
        self.send.is_closed()
    }

    /// Starts a call of `path` (`/package.Service/Method`); answers up to `max` bytes each.
    /// Returns once the server answered its head (a streaming server answers at once).
    pub async fn call(&mut self, path: &str, max: usize) -> Result<Call, hyper::Error> {
        let (requests, body) = Replies::channel(16);
        self.send.ready().await?;
        let answer = self.send.send_request(request(&self.authority, path, body)).await?;
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
        let answer = self.send.send_request(request(&self.authority, path, body)).await?;
        let (parts, body) = answer.into_parts();
        Ok((parts.headers, Messages::new(body, max)))
    }
}

/// A gRPC call's request with `body`.
fn request(authority: &str, path: &str, body: ReplyBody) -> Request<ReplyBody> {
    // An authority no URI can carry (never one a connection was made to) is left out.
    let uri = format!("http://{authority}{path}").parse::<http::Uri>();
    let uri = uri.or_else(|_| format!("http://grpc{path}").parse::<http::Uri>()).unwrap_or_default();
    let mut req = Request::post(uri).body(body).expect("a valid request");
    req.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    req.headers_mut().insert("te", HeaderValue::from_static("trailers"));
    req
}
