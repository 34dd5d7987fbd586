//! Helpers shared by the router's integration tests.

use std::time::Duration;

pub(crate) mod app;
pub(crate) mod dynamo;
pub(crate) mod envoy;
pub(crate) mod pd;
pub(crate) mod shared;
pub(crate) mod smg;

/// A port free now on 127.0.0.1, for a server the test starts later on it (a peer that binds
/// the port it is given). Below the kernel's ephemeral range: a port from `bind(":0")`, once
/// let go, could be handed to any other socket of the parallel tests (a listener on port 0, or
/// a connection's own end) before the server binds it ("Address already in use", seen in
/// CI); ports below the range are only ever taken by name. A counter shared by the process,
/// from an offset by its id, keeps two tests of one run apart.
#[allow(dead_code)] // not every test binary uses it
pub(crate) fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 10_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let high = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768)
        .clamp(LOW + 1_000, 65_535);
    let span = high - LOW;
    let start = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span {
        let port = LOW + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        if std::net::TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
            return port as u16;
        }
    }
    panic!("no free port below the ephemeral range");
}

/// Polls `cond` every 25 ms for up to 10 s; panics naming `what` if it never holds.
#[allow(dead_code)] // not every test binary uses it
pub(crate) async fn eventually(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    for _ in 0..400 {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

/// An HTTP server on 127.0.0.1 answering every request with 200 and `body`
/// (a worker whose `/server_info` and `/health` are all we need). Returns its URL.
#[allow(dead_code)] // not every test binary uses it
pub(crate) async fn http_answering(body: String) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else { return };
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let _ = socket.read(&mut buf).await;
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
            });
        }
    });
    url
}

/// The python of the venv of `tests/kv_events/setup_venv.sh`: `SGL_ROUTER_KV_PYTHON` (set by
/// `.ci/run`, then required), else `/tmp/sgl-router-kv-venv/bin/python`; `None` (with a line
/// saying `what` is skipped) when neither exists.
#[allow(dead_code)] // not every test binary uses it
pub(crate) fn venv_python(what: &str) -> Option<std::path::PathBuf> {
    use std::io::Write;
    if let Ok(p) = std::env::var("SGL_ROUTER_KV_PYTHON") {
        let p = std::path::PathBuf::from(p);
        assert!(p.exists(), "SGL_ROUTER_KV_PYTHON={} does not exist", p.display());
        return Some(p);
    }
    let default = std::path::PathBuf::from("/tmp/sgl-router-kv-venv/bin/python");
    if default.exists() {
        return Some(default);
    }
    // Written to the stream directly: libtest captures `eprintln!` of passing tests.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {what} need the venv of tests/kv_events/setup_venv.sh \
         (set SGL_ROUTER_KV_PYTHON or create /tmp/sgl-router-kv-venv)"
    );
    None
}
