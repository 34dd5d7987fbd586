//! Answers the router made, on the fast path: a disaggregated pool's (the
//! decode leg's stream, merged where asked, or a failed leg's own answer) and
//! a gRPC worker's (the router detokenizes and writes it), as an axum
//! `Response` written on the connection, sized when its length is known and
//! chunked otherwise, with the upstream idle deadline on every wait. A
//! worker's own HTTP answer is copied by `upstream::relay` instead.

use std::time::Duration;

use axum::response::Response;
use h1_codec::chunked;
use http_body_util::BodyExt;
use tokio::io::AsyncWriteExt;

use super::Peer;
use crate::pipeline::request::{push_header, relayed};

/// Writes `answer` on the connection; false when it could not be written whole (the client
/// went, the body broke, or it stalled past `idle`): the connection then closes.
pub(super) async fn write(
    peer: &mut Peer<'_>,
    answer: Response,
    (close, extra, idle): (bool, &[u8], Duration),
) -> bool {
    let (parts, mut body) = answer.into_parts();
    let sized = http_body::Body::size_hint(&body).exact();
    let mut out = Vec::with_capacity(512);
    let status = parts.status;
    out.extend_from_slice(
        format!("HTTP/1.1 {} {}\r\n", status.as_u16(), status.canonical_reason().unwrap_or("")).as_bytes(),
    );
    let connection: Vec<&str> = parts.headers.get_all("connection").iter().filter_map(|v| v.to_str().ok()).collect();
    let connection = connection.join(",");
    for (name, value) in &parts.headers {
        // The request id is in `extra`, with the CORS and route headers.
        if relayed(name.as_str(), &connection) && name.as_str() != crate::pipeline::context::REQUEST_ID_HEADER {
            push_header(&mut out, name.as_str().as_bytes(), value.as_bytes());
        }
    }
    match sized {
        Some(n) => push_header(&mut out, b"content-length", n.to_string().as_bytes()),
        None => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(extra);
    out.extend_from_slice(b"\r\n");
    loop {
        let frame = tokio::select! {
            frame = tokio::time::timeout(idle, body.frame()) => frame,
            gone = peer.watch(false) => match gone {
                Ok(()) => continue,
                Err(_) => return false,
            },
        };
        match frame {
            Ok(Some(Ok(frame))) => {
                let Ok(data) = frame.into_data() else { continue };
                if sized.is_some() {
                    out.extend_from_slice(&data);
                } else {
                    chunked::encode(&data, &mut out);
                }
                if peer.tcp.write_all(&out).await.is_err() {
                    return false;
                }
                out.clear();
            }
            Ok(None) => break,
            // A broken or stalled stream: the client sees the answer cut (no last chunk).
            Ok(Some(Err(_))) | Err(_) => {
                let _ = peer.tcp.write_all(&out).await;
                return false;
            }
        }
    }
    if sized.is_none() {
        out.extend_from_slice(chunked::LAST_CHUNK);
    }
    out.is_empty() || peer.tcp.write_all(&out).await.is_ok()
}

#[cfg(test)]
mod tests {
    use axum::body::{Body, Bytes};
    use bytes::BytesMut;
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
    async fn a_broken_stream_is_cut_without_the_last_chunk() {
        let answer = Response::new(stream(vec![Ok("data: a\n\n"), Err("the decode leg broke")]));
        let (out, ok) = written(answer, false).await;
        assert!(!ok, "the connection closes");
        assert!(out.ends_with("9\r\ndata: a\n\n\r\n"), "no last chunk: the client sees it cut: {out:?}");
    }
}
