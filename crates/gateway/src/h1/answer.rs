//! A worker's answer read by the router's own HTTP/1.1 client (`upstream`), as
//! the body of an axum response: what lets the axum front end (chunked and
//! HTTP/1.0 requests, TLS, cascades) send with the same client as the fast
//! path, so that it too reads a worker's early answer (a 413 before the
//! whole body was written) instead of taking it for the worker's failure.
//! The body ends at its framing's end; the connection goes back to this
//! thread's pool when the answer was whole and it may carry another request.

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use futures_util::StreamExt;
use http_body_util::BodyExt;

use std::sync::Arc;

use fleet::Worker;
use router_types::DpRank;

use h1_codec::Framing;
use h1_codec::chunked::Decoder;

use super::upstream::{self, Answer};
use crate::Gateway;
use crate::pipeline::request::{RANK_HEADER, Route, push_header};
use crate::relay::{BoxError, UpstreamBody};
use crate::send::SendError;

/// What the router's own client sends besides the body: the headers the worker gets (`headers`,
/// made the worker's already; the rank hint apart: the router's wins over it), and TLS towards
/// `https://` workers.
pub(crate) fn extra(gw: &Gateway, headers: &HeaderMap) -> upstream::Extra {
    let mut lines = Vec::with_capacity(512);
    for (name, value) in headers {
        if name.as_str() != RANK_HEADER {
            push_header(&mut lines, name.as_str().as_bytes(), value.as_bytes());
        }
    }
    let rank = headers.get(RANK_HEADER).map(|v| Bytes::copy_from_slice(v.as_bytes()));
    upstream::Extra::new(gw, Bytes::from(lines), rank)
}

/// One request to `worker` on `route` with the router's own client (it reads a worker's early
/// answer), its answer as a response: how the disaggregated legs are sent.
pub(crate) async fn send(
    extra: upstream::Extra,
    worker: &Arc<Worker>,
    route: Route,
    body: Bytes,
    rank: Option<DpRank>,
) -> Result<Response<UpstreamBody>, SendError> {
    upstream::send(worker.clone(), route, body, rank, extra).await.map(into_response)
}

/// Where reading the body stands.
struct Reading {
    answer: Option<Answer>,
    decoder: Decoder,
    /// Bytes left of a sized body.
    left: u64,
}

/// The fast path's answers, judged by a cascade as the axum front end's are.
impl crate::judge::Judgeable for Answer {
    fn declared_len(&self) -> Option<u64> {
        match self.head.framing {
            h1_codec::Framing::Length(n) => Some(n),
            _ => None,
        }
    }

    fn into_response(self) -> Response<UpstreamBody> {
        into_response(self)
    }
}

/// `answer` as a response: its status, its end-to-end headers, its length when it has one,
/// and its body read as the relay polls it.
pub(crate) fn into_response(answer: Answer) -> Response<UpstreamBody> {
    let mut headers = HeaderMap::new();
    for (name, value) in crate::pipeline::request::header_lines(&answer.head.headers) {
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            headers.append(name, value);
        }
    }
    let left = match answer.head.framing {
        Framing::Length(n) => {
            headers.insert(axum::http::header::CONTENT_LENGTH, HeaderValue::from(n));
            n
        }
        _ => 0,
    };
    if !answer.head.codings.is_empty()
        && let Ok(codings) = HeaderValue::from_str(&answer.head.codings)
    {
        headers.insert(axum::http::header::TRANSFER_ENCODING, codings);
    }
    let status = StatusCode::from_u16(answer.head.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let framing = answer.head.framing;
    let reading = Reading { answer: Some(answer), decoder: Decoder::default(), left };
    let frames = futures_util::stream::unfold(reading, |mut r| async move {
        let next = r.next().await?;
        Some((next.map(http_body::Frame::data), r))
    });
    let length = matches!(framing, Framing::Length(_) | Framing::Empty).then_some(left);
    let body = Framed { frames: frames.boxed(), left: length }.boxed_unsync();
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// The body's frames, with its exact length when it has one (the relay keeps it: a sized answer
/// goes out sized, not chunked).
struct Framed {
    frames: futures_util::stream::BoxStream<'static, Result<http_body::Frame<Bytes>, BoxError>>,
    /// Bytes to go of a sized body.
    left: Option<u64>,
}

impl http_body::Body for Framed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let polled = self.frames.poll_next_unpin(cx);
        if let (std::task::Poll::Ready(Some(Ok(frame))), Some(left)) = (&polled, self.left.as_mut())
            && let Some(data) = frame.data_ref()
        {
            *left = left.saturating_sub(data.len() as u64);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.left == Some(0)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.left.map_or_else(http_body::SizeHint::default, http_body::SizeHint::with_exact)
    }
}

impl Reading {
    /// The next piece of the body; `None` at its end (the connection pooled when it may be).
    async fn next(&mut self) -> Option<Result<Bytes, BoxError>> {
        loop {
            let answer = self.answer.as_mut()?;
            let framing = answer.head.framing;
            let (data, done) = match framing {
                Framing::Empty => (Bytes::new(), true),
                Framing::Length(_) => {
                    let take = answer.buf.len().min(usize::try_from(self.left).unwrap_or(usize::MAX));
                    self.left -= take as u64;
                    (answer.buf.split_to(take).freeze(), self.left == 0)
                }
                Framing::Chunked => {
                    let mut out = Vec::new();
                    match self.decoder.decode(&mut answer.buf, &mut out) {
                        Ok(done) => (Bytes::from(out), done),
                        Err(e) => return self.failed(e.into()),
                    }
                }
                Framing::Close => (answer.buf.split().freeze(), false),
            };
            if done {
                self.finish();
            }
            if !data.is_empty() {
                return Some(Ok(data));
            }
            if done {
                return None;
            }
            let answer = self.answer.as_mut()?;
            answer.buf.reserve(16 << 10);
            match answer.from.read_buf(&mut answer.buf).await {
                Ok(0) if framing == Framing::Close => {
                    self.answer = None;
                    return None;
                }
                Ok(0) => return self.failed("connection closed mid-body".into()),
                Ok(_) => {}
                Err(e) => return self.failed(e.into()),
            }
        }
    }

    /// The body ended whole: the connection goes back to the pool if it may carry another request.
    fn finish(&mut self) {
        if let Some(Answer { from, buf, authority, head }) = self.answer.take() {
            from.pool(authority, &head, &buf);
        }
    }

    fn failed(&mut self, e: BoxError) -> Option<Result<Bytes, BoxError>> {
        self.answer = None;
        Some(Err(e))
    }
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use http_body_util::BodyExt;
    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    use super::*;
    use crate::h1::upstream::idle_count;
    use crate::tls::Conn;
    use h1_codec::parse_answer_head;

    /// An answer whose first `first` bytes were read with its head; the worker then writes
    /// `rest` and, with `close`, closes.
    async fn answer(first: &[u8], rest: &'static [u8], close: bool) -> Answer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (mut worker, _) = listener.accept().await.unwrap();
        tokio::spawn(async move {
            worker.write_all(rest).await.unwrap();
            if close {
                drop(worker);
            } else {
                // Keeps the connection open until the test ends.
                let mut hold = [0u8; 1];
                let _ = tokio::io::AsyncReadExt::read(&mut worker, &mut hold).await;
            }
        });
        let (used, head) = parse_answer_head(first).unwrap().unwrap();
        Answer {
            from: upstream::Source::H1(Conn::Plain(tcp)),
            buf: BytesMut::from(&first[used..]),
            authority: addr.to_string(),
            head,
        }
    }

    async fn collect(response: Response<UpstreamBody>) -> Result<Bytes, BoxError> {
        response.into_body().collect().await.map(|b| b.to_bytes())
    }

    #[tokio::test]
    async fn a_sized_answer_keeps_its_length_and_its_connection_is_pooled_after() {
        let before = idle_count();
        let a = answer(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\nhello",
            b" world",
            false,
        )
        .await;
        let response = into_response(a);
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-length"], "11");
        assert_eq!(response.headers()["content-type"], "application/json");
        assert_eq!(http_body::Body::size_hint(response.body()).exact(), Some(11));
        assert_eq!(collect(response).await.unwrap(), "hello world");
        assert_eq!(idle_count(), before + 1, "whole: its connection carries the next request");
    }

    #[tokio::test]
    async fn a_chunked_answer_is_decoded_and_one_until_close_ends_with_the_connection() {
        let a = answer(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel",
            b"lo\r\n6\r\n world\r\n0\r\n\r\n",
            false,
        )
        .await;
        let response = into_response(a);
        assert!(response.headers().get("content-length").is_none());
        assert_eq!(collect(response).await.unwrap(), "hello world");
        let a = answer(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall ", b"until the end", true).await;
        assert_eq!(collect(into_response(a)).await.unwrap(), "all until the end");
    }

    #[tokio::test]
    async fn an_answer_cut_short_or_badly_chunked_is_an_error() {
        let a = answer(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort", b"", true).await;
        let e = collect(into_response(a)).await.unwrap_err();
        assert!(e.to_string().contains("closed mid-body"), "{e}");
        let a = answer(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", b"", false).await;
        assert!(collect(into_response(a)).await.is_err());
    }
}
