//! Shepherd Model Gateway 1.13.0 (`smg launch`, PyPI), from the venv of
//! `tests/smg/setup_venv.sh`: the real peer of the gRPC tests.
#![allow(dead_code)] // not every test binary uses all of it

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The `smg` of the venv: `SGL_ROUTER_SMG` (set by `.ci/run`, then required), else
/// `/tmp/sgl-router-smg-venv/bin/smg`; `None` (with a line saying `what` is skipped).
pub(crate) fn smg(what: &str) -> Option<PathBuf> {
    use std::io::Write;
    if let Ok(p) = std::env::var("SGL_ROUTER_SMG") {
        let p = PathBuf::from(p);
        assert!(p.exists(), "SGL_ROUTER_SMG={} does not exist", p.display());
        return Some(p);
    }
    let default = PathBuf::from("/tmp/sgl-router-smg-venv/bin/smg");
    if default.exists() {
        return Some(default);
    }
    assert!(std::env::var("SGL_ROUTER_KV_PYTHON").is_err(), "in CI the smg venv must be there (.ci/run makes it)");
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {what} need the venv of tests/smg/setup_venv.sh \
         (set SGL_ROUTER_SMG or create /tmp/sgl-router-smg-venv)"
    );
    None
}

/// A port free now on 127.0.0.1 (smg binds the ports it is given).
pub(crate) use super::free_port;

/// A running `smg launch`, killed when dropped.
pub(crate) struct Smg {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub(crate) url: String,
    /// Its Prometheus page, `http://127.0.0.1:PORT/metrics`.
    pub(crate) metrics: String,
}

impl Smg {
    /// `smg launch` with `args`, on free ports (serving and metrics), its log in `log`.
    pub(crate) fn launch(smg: &PathBuf, args: &[&str], log: &std::path::Path) -> Self {
        let (port, metrics) = (free_port(), free_port());
        let log = std::fs::File::create(log).unwrap();
        let child = Command::new(smg)
            .arg("launch")
            .args(args)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--prometheus-host", "127.0.0.1", "--prometheus-port", &metrics.to_string()])
            .args(["--log-level", "warn"])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        Self { child, url: format!("http://127.0.0.1:{port}"), metrics: format!("http://127.0.0.1:{metrics}/metrics") }
    }
}

impl Drop for Smg {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
