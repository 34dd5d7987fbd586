//! The server and client over a real socket: calls routed by path, the health service,
//! and each kind of bad stream ended with its precise status while the connection serves on.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use http_body::Frame;

use crate::proto::{HealthCheckRequest, HealthCheckResponse, HttpBody, Phase, ProcessingRequest};
use crate::{HEALTH_CHECK_PATH, Limits, Messages, PROCESS_PATH, Replies, ServingStatus, Status};
use grpc_wire::client::{Call, Channel};

/// Echoes each message's body back as a request body, until the caller ends or breaks the stream.
#[derive(Debug)]
struct Echo;

impl crate::Service for Echo {
    async fn process(self: Arc<Self>, mut calls: Messages, replies: Replies) -> Status {
        loop {
            match calls.next::<ProcessingRequest>().await {
                Ok(Some(m)) => {
                    if replies.send(&m).await.is_err() {
                        return Status::new(Status::CANCELLED, "gone");
                    }
                }
                Ok(None) => return Status::ok(),
                Err(status) => return status,
            }
        }
    }

    fn health(&self, service: &str) -> ServingStatus {
        if service.is_empty() { ServingStatus::Serving } else { ServingStatus::ServiceUnknown }
    }
}

async fn server(limits: Limits) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            tokio::spawn(crate::serve_connection(tcp, Arc::new(Echo), limits, std::future::pending()));
        }
    });
    addr
}

fn body(text: &'static [u8]) -> ProcessingRequest {
    let chunk = HttpBody { body: Bytes::from_static(text), end_of_stream: true };
    ProcessingRequest { request: Some(Phase::RequestBody(chunk)), ..Default::default() }
}

/// Sends raw bytes on the call (a frame no encoder would make).
async fn raw(call: &Call, bytes: Vec<u8>) {
    call.requests.send_frame(Frame::data(Bytes::from(bytes))).await.unwrap();
}

/// Ends the client's side and reads the call to its status.
async fn finish(mut call: Call) -> Status {
    drop(call.requests);
    while let Ok(Some(_)) = call.answers.next::<ProcessingRequest>().await {}
    Status::from_headers(&call.head).or_else(|| call.answers.status()).unwrap_or_else(|| Status::new(99, "no status"))
}

#[tokio::test]
async fn messages_go_both_ways_and_each_bad_stream_gets_its_status() {
    let addr = server(Limits { max_message_bytes: 1024, ..Limits::default() }).await;
    let mut channel = Channel::connect(addr).await.unwrap();
    // A good stream: each message echoed, then OK.
    let mut call = channel.call(PROCESS_PATH, 4096).await.unwrap();
    call.requests.send(&body(b"{}")).await.unwrap();
    assert_eq!(call.answers.next::<ProcessingRequest>().await.unwrap(), Some(body(b"{}")));
    assert_eq!(finish(call).await.code, Status::OK);
    // A message over the bound: RESOURCE_EXHAUSTED, before its bytes are all read.
    let call = channel.call(PROCESS_PATH, 4096).await.unwrap();
    let mut frame = BytesMut::new();
    frame.put_u8(0);
    frame.put_u32(1 << 20);
    raw(&call, frame.to_vec()).await;
    let status = finish(call).await;
    assert_eq!(status.code, Status::RESOURCE_EXHAUSTED, "{status}");
    // Compressed (none was offered): UNIMPLEMENTED.
    let call = channel.call(PROCESS_PATH, 4096).await.unwrap();
    raw(&call, vec![1, 0, 0, 0, 1, 0]).await;
    assert_eq!(finish(call).await.code, Status::UNIMPLEMENTED);
    // Not protobuf: INVALID_ARGUMENT, undecodable.
    let call = channel.call(PROCESS_PATH, 4096).await.unwrap();
    raw(&call, vec![0, 0, 0, 0, 2, 0xff, 0xff]).await;
    let status = finish(call).await;
    assert_eq!(status.code, Status::INVALID_ARGUMENT, "{status}");
    assert!(status.message.contains("undecodable"), "{status}");
    // Cut short inside a message: INVALID_ARGUMENT.
    let call = channel.call(PROCESS_PATH, 4096).await.unwrap();
    raw(&call, vec![0, 0, 0, 0, 9, 1, 2]).await;
    assert_eq!(finish(call).await.code, Status::INVALID_ARGUMENT);
    // An unknown method: UNIMPLEMENTED in a trailers-only answer.
    let call = channel.call("/no.Such/Method", 4096).await.unwrap();
    assert_eq!(Status::from_headers(&call.head).unwrap().code, Status::UNIMPLEMENTED);
    // The connection still serves: the health service, and an unknown service's NOT_FOUND.
    let mut call = channel.call(HEALTH_CHECK_PATH, 4096).await.unwrap();
    call.requests.send(&HealthCheckRequest { service: String::new() }).await.unwrap();
    let answer = call.answers.next::<HealthCheckResponse>().await.unwrap().unwrap();
    assert_eq!(answer.status, ServingStatus::Serving as i32);
    assert_eq!(finish(call).await.code, Status::OK);
    let call = channel.call(HEALTH_CHECK_PATH, 4096).await.unwrap();
    call.requests.send(&HealthCheckRequest { service: "other".into() }).await.unwrap();
    assert_eq!(finish(call).await.code, 5);
}
