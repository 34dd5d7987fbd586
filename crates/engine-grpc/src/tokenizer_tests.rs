//! `GetTokenizer` as the client takes it: the chunks joined and checked against the SHA-256 on
//! the last, bounded in size; an engine that breaks the protocol gets a precise error.

use std::sync::Arc;
use std::time::Duration;

use crate::proto::GetTokenizerChunk;
use crate::{Engine, EngineError, path};
use grpc_wire::{Handler, Messages, Replies, Started, Status};

/// An engine whose `GetTokenizer` streams these chunks.
struct Streams(Vec<GetTokenizerChunk>);

impl Handler for Streams {
    fn call(self: Arc<Self>, p: &str, _calls: Messages, replies: Replies) -> Option<Started> {
        (p == path::GET_TOKENIZER).then(|| -> Started {
            Box::pin(async move {
                for chunk in &self.0 {
                    if replies.send(chunk).await.is_err() {
                        return Status::new(Status::CANCELLED, "left");
                    }
                }
                Status::ok()
            })
        })
    }
}

async fn serve(chunks: Vec<GetTokenizerChunk>) -> Engine {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = listener.local_addr().unwrap();
    let handler = Arc::new(Streams(chunks));
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let never = std::future::pending::<()>();
            tokio::spawn(grpc_wire::serve_connection(tcp, handler.clone(), grpc_wire::Limits::default(), never));
        }
    });
    Engine::new(at.to_string(), Duration::from_secs(5))
}

fn hex(data: &[u8]) -> String {
    crate::fingerprint(data)
}

fn chunk(data: &[u8], sha256: &str) -> GetTokenizerChunk {
    GetTokenizerChunk { data: data.to_vec(), sha256: sha256.into() }
}

const DEADLINE: Duration = Duration::from_secs(10);

#[tokio::test]
async fn the_chunks_join_into_the_archive_its_fingerprint_names() {
    let archive = b"PK an archive in three chunks".to_vec();
    let digest = hex(&archive);
    let engine = serve(vec![chunk(&archive[..5], ""), chunk(&archive[5..9], ""), chunk(&archive[9..], &digest)]).await;
    let (got, fingerprint) = engine.tokenizer(1 << 20, DEADLINE).await.unwrap();
    assert_eq!((got, fingerprint), (archive, digest));
}

#[tokio::test]
async fn an_engine_that_breaks_the_protocol_is_named_for_it() {
    let archive = b"PK an archive".to_vec();
    let digest = hex(&archive);
    let cases = [
        (vec![chunk(&archive, &hex(b"another"))], "SHA-256"),
        (vec![chunk(&archive, "")], "SHA-256"),
        (vec![chunk(&archive[..4], &digest), chunk(&archive[4..], "")], "after the one with the fingerprint"),
        (vec![chunk(&[0; 600], ""), chunk(&[0; 600], &digest)], "an archive over 1000 bytes"),
        (vec![], "no archive"),
    ];
    for (chunks, why) in cases {
        let engine = serve(chunks).await;
        match engine.tokenizer(1000, DEADLINE).await {
            Err(e @ EngineError::Malformed(..)) => assert!(e.to_string().contains(why), "{e} (expected {why})"),
            other => panic!("expected a malformed answer ({why}), got {other:?}"),
        }
    }
}

#[tokio::test]
async fn an_archive_streams_in_chunks_that_the_client_joins_and_checks() {
    let archive: Vec<u8> = (0..150_000u32).map(|i| (i % 251) as u8).collect();
    let chunks: Vec<GetTokenizerChunk> = crate::tokenizer_chunks(&archive).collect();
    assert_eq!(chunks.iter().map(|c| c.data.len()).collect::<Vec<_>>(), [65_536, 65_536, 18_928]);
    assert!(chunks[..2].iter().all(|c| c.sha256.is_empty()));
    assert_eq!(chunks[2].sha256, hex(&archive));
    let engine = serve(chunks).await;
    assert_eq!(engine.tokenizer(1 << 20, DEADLINE).await.unwrap().0, archive);
    assert_eq!(crate::tokenizer_chunks(&[]).count(), 0);
}
