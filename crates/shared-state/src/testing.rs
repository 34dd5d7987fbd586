//! A throwaway `redis-server` for tests: started on a free port of
//! 127.0.0.1 with persistence off, waited for by its own "ready" line and a `PING`, killed on
//! drop. Not for production use.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The server binary when `SGL_ROUTER_REDIS_SERVER` is not set.
pub const DEFAULT_REDIS_SERVER: &str = "/usr/bin/redis-server";

/// How long a server may take to start.
const READY_DEADLINE: Duration = Duration::from_secs(10);

/// Fresh ports tried when the chosen one is taken between probing and binding.
const PORT_ATTEMPTS: usize = 5;

/// A running `redis-server`, killed when dropped.
#[derive(Debug)]
pub struct RedisServer {
    bin: PathBuf,
    port: u16,
    extra: Vec<String>,
    tls: Option<Tls>,
    child: Option<Child>,
}

/// PEM files for a server that speaks only TLS (clients need no certificate).
#[derive(Debug, Clone)]
pub struct Tls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// How one start attempt ended.
enum Started {
    Ready(Child),
    PortTaken,
}

// === impl RedisServer ===

impl RedisServer {
    /// A server with the default configuration (no password).
    pub fn start() -> io::Result<Self> {
        Self::start_with(&[])
    }

    /// A server with extra arguments, e.g. `["--requirepass", "secret"]`.
    pub fn start_with(extra: &[&str]) -> io::Result<Self> {
        Self::launch(extra, None)
    }

    /// A server that speaks only TLS, with this certificate (for `localhost`).
    pub fn start_tls(tls: Tls, extra: &[&str]) -> io::Result<Self> {
        Self::launch(extra, Some(tls))
    }

    fn launch(extra: &[&str], tls: Option<Tls>) -> io::Result<Self> {
        let bin =
            std::env::var_os("SGL_ROUTER_REDIS_SERVER").map_or_else(|| DEFAULT_REDIS_SERVER.into(), PathBuf::from);
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port()?;
            let mut server =
                RedisServer { bin: bin.clone(), port, extra: extra.clone(), tls: tls.clone(), child: None };
            match server.spawn()? {
                Started::Ready(child) => {
                    server.child = Some(child);
                    return Ok(server);
                }
                Started::PortTaken => continue,
            }
        }
        Err(io::Error::other(format!("no free port for redis-server after {PORT_ATTEMPTS} attempts")))
    }

    /// `redis://127.0.0.1:PORT`, or `rediss://localhost:PORT` for a TLS server.
    pub fn url(&self) -> String {
        match self.tls {
            None => format!("redis://127.0.0.1:{}", self.port),
            Some(_) => format!("rediss://localhost:{}", self.port),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server and waits for it to exit (idempotent).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server and starts a new, empty one on the same port.
    pub fn restart(&mut self) -> io::Result<()> {
        self.stop();
        match self.spawn()? {
            Started::Ready(child) => {
                self.child = Some(child);
                Ok(())
            }
            Started::PortTaken => Err(io::Error::other(format!("port {} was taken during the restart", self.port))),
        }
    }

    /// Starts the process and waits for "Ready to accept connections" (or its exit), then PING
    /// (plain-text servers).
    fn spawn(&self) -> io::Result<Started> {
        let port = self.port.to_string();
        let mut command = Command::new(&self.bin);
        match &self.tls {
            None => command.args(["--port", &port]),
            Some(tls) => command
                .args(["--port", "0", "--tls-port", &port, "--tls-auth-clients", "no"])
                .arg("--tls-cert-file")
                .arg(&tls.cert)
                .arg("--tls-key-file")
                .arg(&tls.key)
                .arg("--tls-ca-cert-file")
                .arg(&tls.ca),
        };
        let mut child = command
            .args(["--save", "", "--appendonly", "no"])
            .args(["--bind", "127.0.0.1", "--protected-mode", "no"])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", self.bin.display())))?;
        let stdout = child.stdout.take().ok_or_else(|| io::Error::other("no stdout"))?;
        // The log is read to its end on a thread (a full pipe would stall the server).
        let (lines_tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = lines_tx.send(line);
            }
        });
        let deadline = Instant::now() + READY_DEADLINE;
        let mut log = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) if line.contains("Ready to accept connections") => break,
                Ok(line) => log.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = child.wait()?;
                    if log.iter().any(|l| l.contains("Address already in use")) {
                        return Ok(Started::PortTaken);
                    }
                    return Err(io::Error::other(format!("redis-server exited ({status}): {}", log.join("\n"))));
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(io::Error::other(format!("redis-server not ready in {READY_DEADLINE:?}")));
                }
            }
        }
        // A plain-text PING cannot reach a TLS port; its "ready" line is the event there.
        let pinged = if self.tls.is_some() { Ok(()) } else { ping(self.port, deadline) };
        if let Err(e) = pinged {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
        Ok(Started::Ready(child))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// `PING` answered (`+PONG`, or `-NOAUTH` from a server with a password) before `deadline`.
fn ping(port: u16, deadline: Instant) -> io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    let mut s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), left)?;
    s.set_read_timeout(Some(left))?;
    s.write_all(b"PING\r\n")?;
    let mut answer = [0u8; 64];
    let n = s.read(&mut answer)?;
    match &answer[..n] {
        a if a.starts_with(b"+PONG") || a.starts_with(b"-NOAUTH") => Ok(()),
        a => Err(io::Error::other(format!("unexpected answer to PING: {:?}", String::from_utf8_lossy(a)))),
    }
}

/// Polls `check` every few milliseconds until it is true (`true`) or `deadline` passes
/// (`false`): for waiting on a state change that has no event of its own.
pub async fn eventually(deadline: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let end = tokio::time::Instant::now() + deadline;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
