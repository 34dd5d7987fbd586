//! The real binary on SIGTERM: stops accepting, lets a request in flight
//! finish (a long stream), and exits 0.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests_and_exits_zero() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sgl-router"))
        .args(["--mock-workers", "1", "--port", "0", "--shutdown-grace-secs", "20"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let url = first.strip_prefix("sgl-router listening on ").expect("the listening line").to_string();

    // Ready first (its mock worker probed healthy), within a deadline.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !reqwest::get(format!("{url}/readiness")).await.is_ok_and(|r| r.status() == 200) {
        assert!(std::time::Instant::now() < deadline, "the router never became ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A stream of 1,500 tokens: about 1.5 s with the demo engine's timing. In flight once its
    // first bytes came.
    let body =
        serde_json::json!({"messages": [{"role": "user", "content": "long"}], "stream": true, "max_tokens": 1500});
    let chat = format!("{url}/v1/chat/completions");
    let mut answer = reqwest::Client::new().post(chat).json(&body).send().await.unwrap();
    assert_eq!(answer.status(), 200);
    let first_bytes = answer.chunk().await.unwrap().expect("the stream's first bytes");
    let stream = tokio::spawn(async move {
        let mut text = String::from_utf8_lossy(&first_bytes).into_owned();
        while let Some(chunk) = answer.chunk().await? {
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
        Ok::<String, reqwest::Error>(text)
    });
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    // Draining: not ready any more (or already refusing connections), within a deadline.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while let Ok(r) = reqwest::get(format!("{url}/readiness")).await {
        if r.status() == 503 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still ready after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = tokio::time::timeout(Duration::from_secs(20), stream).await.unwrap().unwrap().unwrap();
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "the in-flight stream finished: {}",
        &text[text.len().saturating_sub(200)..]
    );
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap()).await.unwrap();
    assert!(status.success(), "exit status {status}");
}
