//! Answers the router made, on the fast path: a disaggregated pool's (the
//! decode leg's stream, merged where asked, or a failed leg's own answer) and
//! a gRPC worker's (the router detokenizes and writes it). An axum `Response`
//! is turned into an answer of the fast path's one writer (`upstream::relay`,
//! which copies a worker's answer too): its head serialized as a worker's would
//! be, sized when its length is known and chunked otherwise, its body read frame
//! by frame with the upstream idle deadline on every wait.

use std::time::Duration;

use axum::response::Response;
use bytes::BytesMut;
use h1_codec::{AnswerHead, Framing};

use super::Peer;
use super::upstream::{self, Answer, Relayed, Source};
use crate::pipeline::request::{push_header, relayed};

/// Writes `answer` on the connection; false when it could not be written whole (the client
/// went, the body broke, or it stalled past `idle`): the connection then closes.
pub(super) async fn write(
    peer: &mut Peer<'_>,
    answer: Response,
    (close, extra, idle): (bool, &[u8], Duration),
) -> bool {
    let to = Relayed { close, idle, keepalive: Duration::ZERO, head: extra };
    upstream::relay(peer, None, made(answer), to).await
}

/// `answer` as the fast path's writer takes a worker's: its end-to-end headers serialized
/// (the request id left to the router's own lines), sized when its body's length is known
/// and re-framed in chunks otherwise.
fn made(answer: Response) -> Answer {
    let (parts, body) = answer.into_parts();
    let sized = http_body::Body::size_hint(&body).exact();
    let connection: Vec<&str> = parts.headers.get_all("connection").iter().filter_map(|v| v.to_str().ok()).collect();
    let connection = connection.join(",");
    let mut headers = Vec::with_capacity(256);
    for (name, value) in &parts.headers {
        // The request id is in the router's own lines, with the CORS and route headers.
        if relayed(name.as_str(), &connection) && name.as_str() != crate::pipeline::context::REQUEST_ID_HEADER {
            push_header(&mut headers, name.as_str().as_bytes(), value.as_bytes());
        }
    }
    let head = AnswerHead {
        status: parts.status.as_u16(),
        headers,
        framing: sized.map_or(Framing::Close, Framing::Length),
        sse: false,
        codings: String::new(),
        reusable: false,
    };
    Answer { from: Source::Made(body), buf: BytesMut::new(), authority: String::new(), head }
}

#[cfg(test)]
mod tests {
    use axum::body::{Body, Bytes};
    use bytes::BytesMut;
    use futures_util::StreamExt;
    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// What a client reads when `answer` is written on a fresh connection: the bytes, and
    /// whether the writer kept the connection.
    async fn written(answer: Response, close: bool) -> (String, bool) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let mut pipelined = BytesMut::new();
        let mut peer = Peer { tcp: &mut server, pipelined: &mut pipelined, open: true };
        let ok = write(&mut peer, answer, (close, b"x-request-id: r1\r\n", Duration::from_secs(5))).await;
        drop(server);
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.unwrap();
        (String::from_utf8(out).unwrap(), ok)
    }

    fn stream(parts: Vec<Result<&'static str, &'static str>>) -> Body {
        let parts =
            parts.into_iter().map(|p| p.map(|s: &str| Bytes::from(s.to_owned())).map_err(std::io::Error::other));
        Body::from_stream(futures_util::stream::iter(parts))
    }

    #[tokio::test]
    async fn a_sized_answer_goes_out_sized_with_the_routers_headers() {
        let answer = Response::builder()
            .status(201)
            .header("content-type", "application/json")
            .header("x-request-id", "the-engines")
            .header("connection", "keep-alive")
            .body(Body::from("{\"ok\":1}"))
            .unwrap();
        let (out, ok) = written(answer, false).await;
        assert!(ok);
        assert_eq!(
            out,
            "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: 8\r\nx-request-id: r1\r\n\r\n{\"ok\":1}"
        );
    }

    #[tokio::test]
    async fn a_stream_goes_out_chunked_and_ends_with_the_last_chunk() {
        let answer = Response::new(stream(vec![Ok("data: a\n\n"), Ok("data: [DONE]\n\n")]));
        let (out, ok) = written(answer, true).await;
        assert!(ok);
        let body = out.split_once("\r\n\r\n").unwrap().1;
        assert!(out.contains("transfer-encoding: chunked\r\nconnection: close\r\n"), "{out}");
        assert_eq!(body, "9\r\ndata: a\n\n\r\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n");
    }

    #[tokio::test]
    async fn a_stream_silent_past_the_idle_deadline_is_cut() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let (mut pipelined, idle) = (BytesMut::new(), Duration::from_millis(50));
        let mut peer = Peer { tcp: &mut server, pipelined: &mut pipelined, open: true };
        let first = futures_util::stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(b"data: a\n\n"))]);
        let answer = Response::new(Body::from_stream(first.chain(futures_util::stream::pending())));
        let at = std::time::Instant::now();
        let written = tokio::time::timeout(Duration::from_secs(10), write(&mut peer, answer, (false, b"", idle)));
        assert!(!written.await.expect("cut at the idle deadline, not waiting on"), "the connection closes");
        assert!(at.elapsed() >= idle, "cut at the idle deadline, not before");
        drop(server);
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(out.ends_with("9\r\ndata: a\n\n\r\n"), "what came went out, then no last chunk: {out:?}");
    }

    #[tokio::test]
    async fn a_broken_stream_is_cut_without_the_last_chunk() {
        let answer = Response::new(stream(vec![Ok("data: a\n\n"), Err("the decode leg broke")]));
        let (out, ok) = written(answer, false).await;
        assert!(!ok, "the connection closes");
        assert!(out.ends_with("9\r\ndata: a\n\n\r\n"), "no last chunk: the client sees it cut: {out:?}");
    }
}
