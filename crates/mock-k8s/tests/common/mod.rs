//! What the protocol tests share: a client with a deadline on every await,
//! list and `Status` helpers, and a line reader for watch streams that tells
//! a clean end of the response from a cut connection.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use mock_k8s::{MockApiConfig, MockApiServer};
use serde_json::Value;

/// The deadline of every network await in these tests.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// What a watch stream gave next.
#[derive(Debug)]
pub enum Next {
    Event(Value),
    /// The response ended cleanly (the terminating chunk arrived).
    End,
    /// The connection broke mid-response.
    Cut,
}

/// A watch response read line by line.
#[derive(Debug)]
pub struct Watch {
    pub response: reqwest::Response,
    buf: Vec<u8>,
}

pub async fn spawn(config: MockApiConfig) -> MockApiServer {
    MockApiServer::spawn(config).await.expect("mock API server starts")
}

pub async fn get(client: &reqwest::Client, url: String) -> reqwest::Response {
    tokio::time::timeout(DEADLINE, client.get(url).send()).await.expect("answer in time").expect("request sent")
}

/// `GET path_and_query` and its JSON body, asserting the status.
pub async fn get_json(server: &MockApiServer, path_and_query: &str, status: u16) -> Value {
    let response = get(&reqwest::Client::new(), format!("{}{path_and_query}", server.url())).await;
    assert_eq!(response.status().as_u16(), status, "{path_and_query}");
    let ct = response.headers().get("content-type").and_then(|v| v.to_str().ok()).map(str::to_owned);
    assert_eq!(ct.as_deref(), Some("application/json"), "{path_and_query}");
    tokio::time::timeout(DEADLINE, response.json()).await.expect("body in time").expect("JSON body")
}

/// The names in a list's items, in order.
pub fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Asserts `v` is a failure `Status` with `code` and `reason`.
pub fn assert_status(v: &Value, code: u16, reason: &str) {
    assert_eq!(v["kind"], "Status", "{v}");
    assert_eq!(v["apiVersion"], "v1", "{v}");
    assert_eq!(v["status"], "Failure", "{v}");
    assert_eq!(v["code"], code, "{v}");
    assert_eq!(v["reason"], reason, "{v}");
    assert!(v["message"].is_string(), "{v}");
}

/// Opens a watch at `path_and_query` (which includes `watch=1`).
pub async fn watch(server: &MockApiServer, path_and_query: &str) -> Watch {
    watch_with(&reqwest::Client::new(), &server.url(), path_and_query).await
}

pub async fn watch_with(client: &reqwest::Client, base: &str, path_and_query: &str) -> Watch {
    let response = get(client, format!("{base}{path_and_query}")).await;
    assert_eq!(response.status(), 200, "{path_and_query}");
    Watch { response, buf: Vec::new() }
}

// === impl Watch ===

impl Watch {
    /// The next line's JSON, or how the stream ended. Panics past [`DEADLINE`].
    pub async fn next(&mut self) -> Next {
        self.next_within(DEADLINE).await.expect("watch event in time")
    }

    /// As [`Watch::next`], `None` when nothing comes within `within`.
    pub async fn next_within(&mut self, within: Duration) -> Option<Next> {
        let started = tokio::time::Instant::now();
        loop {
            if let Some(at) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=at).collect();
                return Some(Next::Event(serde_json::from_slice(&line).expect("each line is one JSON object")));
            }
            let left = within.checked_sub(started.elapsed())?;
            match tokio::time::timeout(left, self.response.chunk()).await {
                Err(_) => return None,
                Ok(Ok(Some(chunk))) => self.buf.extend_from_slice(&chunk),
                Ok(Ok(None)) => {
                    assert!(self.buf.is_empty(), "a partial line at the end: {:?}", self.buf);
                    return Some(Next::End);
                }
                Ok(Err(_)) => return Some(Next::Cut),
            }
        }
    }

    /// The next event, asserting there is one: `(type, object)`.
    pub async fn event(&mut self) -> (String, Value) {
        match self.next().await {
            Next::Event(v) => (v["type"].as_str().expect("type").to_owned(), v["object"].clone()),
            other => panic!("expected an event, got {other:?}"),
        }
    }

    /// The next event that is not a bookmark.
    pub async fn change(&mut self) -> (String, Value) {
        loop {
            let (kind, object) = self.event().await;
            if kind != "BOOKMARK" {
                return (kind, object);
            }
        }
    }
}

/// `(type, name)` of an event, for compact assertions.
pub fn summary((kind, object): &(String, Value)) -> (String, String) {
    (kind.clone(), object["metadata"]["name"].as_str().unwrap_or_default().to_owned())
}
