//! gRPC's framing, both sides: a call's messages read from a body
//! (length-prefixed, each bounded), messages written as they are ready into
//! a body, and the status in its trailers. Owns no state beyond one call's
//! buffers.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue};
use http_body::Frame;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::sync::mpsc;

/// A gRPC status code and message, as sent in the trailers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("gRPC status {code}: {message}")]
pub struct Status {
    pub code: u32,
    pub message: String,
}

impl Status {
    pub const OK: u32 = 0;
    pub const CANCELLED: u32 = 1;
    pub const INVALID_ARGUMENT: u32 = 3;
    pub const DEADLINE_EXCEEDED: u32 = 4;
    pub const RESOURCE_EXHAUSTED: u32 = 8;
    pub const FAILED_PRECONDITION: u32 = 9;
    pub const UNIMPLEMENTED: u32 = 12;
    pub const INTERNAL: u32 = 13;
    pub const UNAVAILABLE: u32 = 14;

    /// A status with `code` and `message`.
    pub fn new(code: u32, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }

    /// Success.
    pub fn ok() -> Self {
        Self::new(Self::OK, "")
    }

    /// The status `headers` carry (trailers, or a trailers-only answer's head), if any.
    pub fn from_headers(headers: &HeaderMap) -> Option<Status> {
        let code = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
        let message = headers.get("grpc-message").and_then(|m| m.to_str().ok()).unwrap_or_default();
        Some(Status::new(code, message))
    }

    /// The trailers (or the head of a trailers-only answer) that carry it.
    pub fn headers(&self) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("grpc-status", HeaderValue::from(self.code));
        if !self.message.is_empty() {
            // grpc-message is percent-encoded; keep what a header can carry as is.
            let safe: String = self
                .message
                .chars()
                .map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' })
                .filter(|c| *c != '%')
                .collect();
            if let Ok(v) = HeaderValue::from_str(&safe) {
                h.insert("grpc-message", v);
            }
        }
        h
    }
}

/// The messages of one call, read from its body (a server's request, a client's answer).
#[derive(Debug)]
pub struct Messages {
    body: Incoming,
    buf: BytesMut,
    /// The largest message accepted.
    max: usize,
    ended: bool,
    /// The trailers, once read (a client reads the call's status there).
    trailers: Option<HeaderMap>,
}

impl Messages {
    /// The messages `body` carries, none larger than `max` bytes.
    pub fn new(body: Incoming, max: usize) -> Self {
        Self { body, buf: BytesMut::new(), max, ended: false, trailers: None }
    }

    /// The status in the trailers, once the body has ended with them.
    pub fn status(&self) -> Option<Status> {
        self.trailers.as_ref().and_then(Status::from_headers)
    }

    /// The next message: `None` when the caller ended its side cleanly.
    /// A message over the bound, a compressed one (none was offered), one cut
    /// short or a broken stream are errors with the status to end the call with.
    pub async fn next<M: prost::Message + Default>(&mut self) -> Result<Option<M>, Status> {
        loop {
            if self.buf.len() >= 5 {
                let compressed = self.buf[0] != 0;
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
                if compressed {
                    return Err(Status::new(Status::UNIMPLEMENTED, "compressed messages are not accepted"));
                }
                if len > self.max {
                    let message = format!("a message of {len} bytes is over this server's {} byte limit", self.max);
                    return Err(Status::new(Status::RESOURCE_EXHAUSTED, message));
                }
                if self.buf.len() >= 5 + len {
                    self.buf.advance(5);
                    let bytes = self.buf.split_to(len).freeze();
                    return M::decode(bytes)
                        .map(Some)
                        .map_err(|e| Status::new(Status::INVALID_ARGUMENT, format!("undecodable message: {e}")));
                }
            }
            if self.ended {
                return match self.buf.is_empty() {
                    true => Ok(None),
                    false => Err(Status::new(Status::INVALID_ARGUMENT, "the stream ended inside a message")),
                };
            }
            match self.body.frame().await {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.buf.extend_from_slice(&data),
                    Err(frame) => self.trailers = frame.into_trailers().ok(),
                },
                Some(Err(e)) => return Err(Status::new(Status::CANCELLED, format!("the call broke: {e}"))),
                None => self.ended = true,
            }
        }
    }
}

/// Where one side's messages go, in order: a server's replies (the answer's body), a
/// client's requests (the request's body).
#[derive(Debug, Clone)]
pub struct Replies {
    tx: mpsc::Sender<Frame<Bytes>>,
}

/// The caller is gone: nothing more can be sent.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the caller is gone")]
pub struct Gone;

impl Replies {
    /// A reply channel and the body that carries its frames (at most `depth` waiting).
    pub fn channel(depth: usize) -> (Self, ReplyBody) {
        let (tx, rx) = mpsc::channel(depth.max(1));
        (Self { tx }, ReplyBody { rx: Some(rx) })
    }

    /// Sends one message (waits while the caller reads slower than we write).
    pub async fn send<M: prost::Message>(&self, message: &M) -> Result<(), Gone> {
        self.tx.send(Frame::data(encode(message))).await.map_err(|_| Gone)
    }

    /// Sends one frame as it is (a test's malformed bytes).
    pub async fn send_frame(&self, frame: Frame<Bytes>) -> Result<(), Gone> {
        self.tx.send(frame).await.map_err(|_| Gone)
    }

    /// Ends the call with `status`.
    pub async fn finish(self, status: &Status) {
        let _ = self.tx.send(Frame::trailers(status.headers())).await;
    }
}

/// One message with its five-byte prefix (not compressed, its length).
pub fn encode<M: prost::Message>(message: &M) -> Bytes {
    let len = message.encoded_len();
    let mut out = BytesMut::with_capacity(5 + len);
    out.put_u8(0);
    out.put_u32(len as u32);
    message.encode(&mut out).unwrap_or_default();
    out.freeze()
}

/// An answer's body: the frames [`Replies`] sends, then its end.
#[derive(Debug)]
pub struct ReplyBody {
    /// None: a body with nothing in it, ended before it began (a trailers-only answer's).
    rx: Option<mpsc::Receiver<Frame<Bytes>>>,
}

impl ReplyBody {
    /// A body that is over at once: the answer is its head alone (HEADERS ending the stream).
    pub fn empty() -> Self {
        Self { rx: None }
    }
}

impl http_body::Body for ReplyBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.rx.as_mut() {
            Some(rx) => rx.poll_recv(cx).map(|f| f.map(Ok)),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rx.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message with a bytes field and a bool, as a service's would be.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Body {
        #[prost(bytes = "bytes", tag = "1")]
        body: Bytes,
        #[prost(bool, tag = "2")]
        end_of_stream: bool,
    }

    #[test]
    fn a_message_is_prefixed_with_its_length_uncompressed() {
        let m = Body { body: Bytes::from_static(b"{}"), end_of_stream: true };
        let framed = encode(&m);
        assert_eq!(framed[0], 0);
        assert_eq!(u32::from_be_bytes(framed[1..5].try_into().unwrap()) as usize, framed.len() - 5);
        // field 1 bytes "{}", field 2 true.
        assert_eq!(&framed[5..], &[0x0a, 0x02, b'{', b'}', 0x10, 0x01]);
    }

    #[test]
    fn a_status_message_that_no_header_can_carry_is_made_safe() {
        let h = Status::new(Status::INVALID_ARGUMENT, "bad\nvalue 100%").headers();
        assert_eq!(h["grpc-status"], "3");
        assert_eq!(h["grpc-message"], "bad?value 100");
    }
}
