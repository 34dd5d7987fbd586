//! `sgl-router` processes started by a benchmark: on a free loopback port,
//! killed when dropped.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};

/// A router process, killed when dropped.
pub(crate) struct RouterProc {
    pub(crate) name: &'static str,
    pub(crate) url: String,
    child: Child,
}

impl RouterProc {
    /// Starts `bin` on a free port of 127.0.0.1 with `args` (no `--host`/`--port`).
    pub(crate) fn spawn(bin: &Path, name: &'static str, args: &[String]) -> Result<Self> {
        let port = free_port()?;
        let child = Command::new(bin)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Self { name, url: format!("http://127.0.0.1:{port}"), child })
    }

    /// Waits until it answers `/readiness` (30 s at most).
    pub(crate) async fn wait_ready(&self, http: &reqwest::Client) -> Result<()> {
        for _ in 0..300 {
            if http.get(format!("{}/readiness", self.url)).send().await.is_ok_and(|x| x.status().is_success()) {
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        anyhow::bail!("router {} not ready after 30 s", self.name)
    }

    /// Its resident memory now, KiB (Linux), `None` elsewhere.
    pub(crate) fn rss_kib(&self) -> Option<u64> {
        self.status_kib("VmRSS:")
    }

    /// Its anonymous resident memory (the heap and stacks, not the pages of
    /// its executable), KiB (Linux), `None` elsewhere.
    pub(crate) fn rss_anon_kib(&self) -> Option<u64> {
        self.status_kib("RssAnon:")
    }

    fn status_kib(&self, field: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = status.lines().find(|l| l.starts_with(field))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// Its open file descriptors now (Linux), `None` elsewhere.
    pub(crate) fn open_fds(&self) -> Option<usize> {
        Some(std::fs::read_dir(format!("/proc/{}/fd", self.child.id())).ok()?.count())
    }
}

impl Drop for RouterProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port free on 127.0.0.1 now.
pub(crate) fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
